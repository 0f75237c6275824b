//! What the agent serves over HTTP: `/healthz` and `/livez` on the health address,
//! Prometheus metrics and `/audit` on the metrics address ([`metrics`]; the
//! addresses as kube-proxy's flags give them, [`bind`]), the health rule behind
//! them ([`health`]), and the per-Service health checks on `healthCheckNodePort`s
//! ([`healthcheck`]).

pub mod bind;
pub mod health;
pub mod healthcheck;
pub mod metrics;

//! What the agent serves over HTTP: Prometheus metrics, `/healthz`, `/livez` and
//! `/audit` ([`metrics`]), the health rule behind them ([`health`]), and the
//! per-Service health checks on `healthCheckNodePort`s ([`healthcheck`]).

pub mod health;
pub mod healthcheck;
pub mod metrics;

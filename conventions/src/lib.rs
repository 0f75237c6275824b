//! What both sliceway binaries, the agent and the controller, must agree on with
//! Kubernetes and with each other: the well-known labels and annotations
//! ([`labels`]), how a directory of manifests is read ([`manifests`]), the API
//! server's rules an object read from a file must pass ([`validate`]), and the
//! `/metrics` and `/healthz` endpoint ([`http`]) and what it serves, read back
//! ([`exposition`]), logging as Kubernetes components log ([`logging`]), and the
//! completions and man pages generated from each binary's CLI ([`clidoc`]).

pub mod clidoc;
pub mod exposition;
pub mod http;
pub mod labels;
pub mod lean;
pub mod logging;
pub mod manifests;
pub mod validate;

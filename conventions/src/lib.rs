//! What both sliceway binaries, the agent and the controller, must agree on with
//! Kubernetes and with each other: the well-known labels and annotations
//! ([`labels`]).

pub mod labels;

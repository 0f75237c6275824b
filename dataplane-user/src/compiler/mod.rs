//! The compiler: Services, EndpointSlices and this node's identity in, the desired
//! frontends with their backends out. Pure: no kernel, no clock, no I/O.
//!
//! [`compile`] does it all at once ([`full`]). [`Incremental`] holds the objects
//! between syncs and recompiles only the Services whose Service object or
//! EndpointSlices (by their `kubernetes.io/service-name` label) changed, with the
//! same result: both share the per-slice ([`slices`]) and per-Service ([`service`])
//! steps, and a frontend asked for by two Services goes to the same one either way
//! ([`claims`]). [`output`] is what comes out; [`format`] prints frontends and
//! backends for messages, dumps and the CLI.
//!
//! Semantics follow kube-proxy where it defines them:
//! - which objects are used: kube-proxy's informer selectors skip objects labelled
//!   `service.kubernetes.io/service-proxy-name` and headless Services
//!   (<https://github.com/kubernetes/kubernetes/blob/master/cmd/kube-proxy/app/server.go>);
//! - how slices merge: `pkg/proxy/endpointslicecache.go`
//!   (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointslicecache.go>:
//!   several slices per Service, only `addresses[0]`, parsed sloppily, one copy per
//!   address where a later non-terminating copy wins, ports without a name field or
//!   without a number or with number 0 ignored, nil conditions defaulted: ready ⇒
//!   true, serving ⇒ true, terminating ⇒ false; zone and node hints kept);
//! - which endpoints serve: [`crate::categorize`] (`CategorizeEndpoints`: traffic
//!   policies, topology hints against this node's zone, the serving-terminating
//!   fallback), and what a frontend without them does (reject, or drop when only
//!   other nodes have endpoints and the policy is `Local`);
//! - session affinity: `pkg/proxy/serviceport.go` (`ClientIP` with its timeout).

mod claims;
pub mod format;
mod full;
mod incremental;
pub mod output;
mod service;
mod slices;

pub use format::{backend_addr, frontend_addr, is_clusterip_marker, proto_name};
pub use full::{compile, compile_model};
pub use incremental::Incremental;
pub use output::{
    Compiled, Frontend, FrontendPolicy, HealthCheck, Ignored, ObjectRef, ServicePortName, Skipped,
    DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT,
};

/// What the compiler needs to know besides the objects.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// This node's name: `internalTrafficPolicy: Local` keeps endpoints on it.
    pub node_name: Option<String>,
    /// The `service-proxy-name` value that means "sliceway", if any.
    pub proxy_name: Option<String>,
    /// This node's `topology.kubernetes.io/zone` label: topology hints are read
    /// against it. `None` when the node has none (or is not known yet).
    pub zone: Option<String>,
}

/// Whether a `service-proxy-name` label hands the object to another proxy.
fn is_other_proxys(label: Option<&String>, opts: &Options) -> bool {
    match label {
        None => false,
        Some(v) => opts.proxy_name.as_deref() != Some(v.as_str()),
    }
}

//! Where the agent's objects come from. Two sources, one shape: a source hands the
//! Services and EndpointSlices it sees change, the ServiceCIDRs, and its own Node's
//! zone, to a [`Sink`] (the incremental compiler is one); the agent then drives the
//! compile.
//!
//! - [`local`]: a directory of ordinary Kubernetes YAML (local mode), rescanned;
//! - [`kube`]: the API server through kube-rs reflector stores, with kube-proxy's
//!   selectors.

pub mod apiserver;
pub mod events;
pub mod kube;
pub mod local;

use crate::{
    compiler::Incremental,
    model::{Origin, ServiceCidrInfo, ServiceId, ServiceInfo, SliceId, SliceInfo},
};

/// What a source hands its objects to. Each call says whether anything changed.
pub trait Sink {
    /// Adds or replaces a Service.
    fn put_service(&mut self, origin: Origin, svc: ServiceInfo) -> bool;
    /// Removes a Service.
    fn remove_service(&mut self, id: &ServiceId) -> bool;
    /// Adds or replaces an EndpointSlice.
    fn put_slice(&mut self, origin: Origin, slice: SliceInfo) -> bool;
    /// Removes an EndpointSlice.
    fn remove_slice(&mut self, id: &SliceId) -> bool;
    /// Sets this node's zone (from its Node object; `None` without one).
    fn set_zone(&mut self, zone: Option<String>) -> bool;
    /// Sets this node's primary address (from its Node object; `None` without one).
    fn set_node_ip(&mut self, ip: Option<std::net::Ipv4Addr>) -> bool;
    /// Sets this node's primary IPv6 address (from its Node object; `None` without
    /// one).
    fn set_node_ip6(&mut self, ip: Option<std::net::Ipv6Addr>) -> bool;
    /// Sets this node's pod CIDRs (its Node object's `spec.podCIDRs`, each family's
    /// first; empty without one), for `--detect-local-mode NodeCIDR`.
    fn set_pod_cidrs(&mut self, cidrs: crate::model::PodCidrs) -> bool;
    /// Sets the cluster's ServiceCIDRs, every object of the kind at once. Whether
    /// they changed.
    fn set_service_cidrs(&mut self, cidrs: Vec<ServiceCidrInfo>) -> bool;
    /// The Services held: a source that lists everything anew removes the others.
    fn services_held(&self) -> Vec<ServiceId>;
    /// The EndpointSlices held, as [`services_held`](Self::services_held).
    fn slices_held(&self) -> Vec<SliceId>;
}

impl Sink for Incremental {
    fn put_service(&mut self, origin: Origin, svc: ServiceInfo) -> bool {
        Incremental::put_service(self, origin, svc)
    }
    fn remove_service(&mut self, id: &ServiceId) -> bool {
        Incremental::remove_service(self, id)
    }
    fn put_slice(&mut self, origin: Origin, slice: SliceInfo) -> bool {
        Incremental::put_slice(self, origin, slice)
    }
    fn remove_slice(&mut self, id: &SliceId) -> bool {
        Incremental::remove_slice(self, id)
    }
    fn set_zone(&mut self, zone: Option<String>) -> bool {
        Incremental::set_zone(self, zone)
    }
    fn set_node_ip(&mut self, ip: Option<std::net::Ipv4Addr>) -> bool {
        Incremental::set_node_ip(self, ip)
    }
    fn set_node_ip6(&mut self, ip: Option<std::net::Ipv6Addr>) -> bool {
        Incremental::set_node_ip6(self, ip)
    }
    fn set_pod_cidrs(&mut self, cidrs: crate::model::PodCidrs) -> bool {
        Incremental::set_pod_cidrs(self, cidrs)
    }
    fn set_service_cidrs(&mut self, cidrs: Vec<ServiceCidrInfo>) -> bool {
        Incremental::set_service_cidrs(self, cidrs)
    }
    fn services_held(&self) -> Vec<ServiceId> {
        self.service_ids().cloned().collect()
    }
    fn slices_held(&self) -> Vec<SliceId> {
        self.slice_ids().cloned().collect()
    }
}

/// What one [`Source::feed`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fed {
    /// Objects were handed over: some may have changed.
    Changed,
    /// Nothing changed since the last feed.
    Unchanged,
    /// The source could not be read this time and handed nothing; what the sink
    /// holds stays as it was (said in the log).
    Failed,
}

/// A source as the agent drives it: wait until there is something, then hand it
/// over. Both sources have this shape, so the agent has one loop.
pub trait Source {
    /// Why the source cannot go on.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Waits until there is something to hand over: the first time until the source
    /// has everything once (nothing may be written from a partial view), then until
    /// changes come. Not cancel-safe: poll it to completion.
    fn wait(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>>;

    /// Hands to `sink` what changed since the last feed (everything, the first time).
    fn feed(&mut self, sink: &mut dyn Sink) -> Fed;

    /// Problems the agent met with objects of this source, each once (the log has
    /// them already): the API source records them as Events on the objects; a
    /// directory has nowhere to put them.
    fn report(&mut self, problems: &[events::Problem]) {
        let _ = problems;
    }

    /// What the source's reader refuses now (files, documents, objects), counted by
    /// reason, for `sliceway_objects_skipped{kind="manifest"}`.
    fn skipped_by_reason(&self) -> std::collections::BTreeMap<String, i64> {
        Default::default()
    }

    /// Whether the own Node is eligible for load balancers
    /// ([`crate::model::NodeInfo::eligible`]) as last fed; `None` without a Node
    /// object.
    fn node_eligible(&self) -> Option<bool> {
        None
    }
}

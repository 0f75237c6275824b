//! Which endpoints of a Service port this node uses, by traffic policy and topology:
//! kube-proxy's `CategorizeEndpoints`, `topologyModeFromHints` and
//! `availableForTopology`
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/topology.go>),
//! and the verdict for a frontend without usable endpoints, as the nftables proxier
//! decides it
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go>,
//! `internalTrafficFilterVerdict`).
//!
//! Pure, over the facts of each endpoint ([`EndpointFacts`]: conditions, locality,
//! hints), owned or borrowed. Results are indices into the slice given, in its order.

use std::borrow::Borrow;

use crate::model::Hints;

/// What categorizing needs to know of an endpoint (after kube-proxy's defaulting of
/// nil conditions, see `endpointslicecache.go`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointFacts {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// On this node.
    pub local: bool,
    /// `hints.forZones` and `hints.forNodes` names.
    pub hints: Hints,
}

/// What a Service port asks of categorizing (kube-proxy's `ServicePort`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local`.
    pub external_local: bool,
    /// A NodePort, a load-balancer IP or an external IP (`ExternallyAccessible`).
    pub externally_accessible: bool,
}

impl PortPolicy {
    /// `UsesClusterEndpoints`: internal traffic uses them, and external traffic always
    /// does (short-circuiting from inside the cluster even with `Local`).
    pub fn uses_cluster(&self) -> bool {
        !self.internal_local || self.externally_accessible
    }

    /// `UsesLocalEndpoints`.
    pub fn uses_local(&self) -> bool {
        self.internal_local || (self.external_local && self.externally_accessible)
    }
}

/// This node, as categorizing sees it.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeFacts<'a> {
    pub name: &'a str,
    /// The node's `topology.kubernetes.io/zone` label; empty when unset.
    pub zone: &'a str,
}

/// Which hints filter the cluster endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopologyMode {
    /// No filtering.
    None,
    PreferSameZone,
    PreferSameNode,
}

/// The result of [`categorize`], as indices into the endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// Usable endpoints for `Cluster` policy; `None` when the port never uses them.
    pub cluster: Option<Vec<usize>>,
    /// Usable endpoints for `Local` policy; `None` when the port never uses them.
    pub local: Option<Vec<usize>>,
    /// Every endpoint reachable from this node: the union of the two, sorted.
    pub all_reachable: Vec<usize>,
    /// Whether the Service has usable endpoints anywhere in the cluster (true also
    /// when only remote endpoints exist and the policy is `Local`).
    pub has_any: bool,
}

impl Categorized {
    /// The endpoints of traffic to a ClusterIP (`internalPolicyChain`).
    pub fn internal(&self, policy: &PortPolicy) -> &[usize] {
        let set = if policy.internal_local {
            &self.local
        } else {
            &self.cluster
        };
        set.as_deref().unwrap_or_default()
    }

    /// What a ClusterIP frontend does with a new flow when [`internal`](Self::internal)
    /// is empty: no usable endpoints anywhere ⇒ reject; only remote ones while the
    /// policy is `Local` ⇒ drop.
    pub fn internal_empty_verdict(&self) -> EmptyVerdict {
        if self.has_any {
            EmptyVerdict::Drop
        } else {
            EmptyVerdict::Reject
        }
    }
}

/// What a frontend without usable endpoints does with a new flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum EmptyVerdict {
    /// TCP reset or ICMP port unreachable to the client (the Service has no
    /// endpoints at all).
    #[default]
    Reject,
    /// Silently dropped (the policy is `Local` and only other nodes have endpoints).
    Drop,
}

/// `topologyModeFromHints`: same-node when every ready endpoint has a node hint and
/// one is for this node; else same-zone when every ready endpoint has a zone hint and
/// one is for this node's zone; else none. Node hints always count: the
/// PreferSameTrafficDistribution gate is GA and locked on since Kubernetes 1.35.
pub fn topology_mode<E: Borrow<EndpointFacts>>(endpoints: &[E], node: &NodeFacts) -> TopologyMode {
    let mut any_ready = false;
    let (mut all_node_hints, mut for_node) = (true, false);
    let (mut all_zone_hints, mut for_zone) = (true, false);
    for ep in endpoints.iter().map(Borrow::borrow).filter(|e| e.ready) {
        any_ready = true;
        if ep.hints.nodes().is_empty() {
            all_node_hints = false;
        } else if ep.hints.nodes().iter().any(|n| &**n == node.name) {
            for_node = true;
        }
        if ep.hints.zones().is_empty() {
            all_zone_hints = false;
        } else if ep.hints.zones().iter().any(|z| &**z == node.zone) {
            for_zone = true;
        }
    }
    if !any_ready {
        TopologyMode::None
    } else if all_node_hints && for_node {
        TopologyMode::PreferSameNode
    } else if all_zone_hints && for_zone {
        TopologyMode::PreferSameZone
    } else {
        TopologyMode::None
    }
}

/// `availableForTopology`.
fn available(ep: &EndpointFacts, mode: TopologyMode, node: &NodeFacts) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::PreferSameNode => ep.hints.nodes().iter().any(|n| &**n == node.name),
        TopologyMode::PreferSameZone => ep.hints.zones().iter().any(|z| &**z == node.zone),
    }
}

fn indices<E: Borrow<EndpointFacts>>(
    endpoints: &[E],
    keep: impl Fn(&EndpointFacts) -> bool,
) -> Vec<usize> {
    endpoints
        .iter()
        .enumerate()
        .filter(|(_, e)| keep((*e).borrow()))
        .map(|(i, _)| i)
        .collect()
}

/// `CategorizeEndpoints`: the cluster, local and all-reachable sets of one Service
/// port, each falling back to serving-and-terminating endpoints on its own when it
/// has no ready ones (KEP-1669), and whether there are usable endpoints anywhere.
pub fn categorize<E: Borrow<EndpointFacts>>(
    endpoints: &[E],
    policy: &PortPolicy,
    node: &NodeFacts,
) -> Categorized {
    let mut out = Categorized::default();
    if endpoints.is_empty() {
        return out;
    }
    let serving_terminating = |e: &EndpointFacts| e.serving && e.terminating;
    let mut mode = TopologyMode::None;
    if policy.uses_cluster() {
        mode = topology_mode(endpoints, node);
        let mut cluster = indices(endpoints, |e| e.ready && available(e, mode, node));
        if cluster.is_empty() {
            // Topology was already ignored if no ready endpoint fits it, so none is
            // ready anywhere: fall back to the terminating ones that still serve.
            cluster = indices(endpoints, serving_terminating);
        }
        out.has_any = !cluster.is_empty();
        out.cluster = Some(cluster);
    }
    if !policy.uses_local() {
        out.all_reachable = out.cluster.clone().unwrap_or_default();
        return out;
    }
    let (mut local_ready, mut local_serving_terminating) = (false, false);
    for ep in endpoints.iter().map(Borrow::borrow) {
        if ep.ready {
            out.has_any = true;
            local_ready |= ep.local;
        } else if serving_terminating(ep) {
            out.has_any = true;
            local_serving_terminating |= ep.local;
        }
    }
    let local = if local_ready {
        indices(endpoints, |e| e.local && e.ready)
    } else if local_serving_terminating {
        indices(endpoints, |e| e.local && serving_terminating(e))
    } else {
        Vec::new()
    };
    out.all_reachable = match &out.cluster {
        None => local.clone(),
        // Every ready endpoint is in the cluster set, the local set holds only ready
        // ones: the cluster set is the union.
        Some(cluster)
            if mode == TopologyMode::None && (local_ready || !local_serving_terminating) =>
        {
            cluster.clone()
        }
        Some(cluster) => {
            let mut all: Vec<usize> = cluster.iter().chain(&local).copied().collect();
            all.sort_unstable();
            all.dedup();
            all
        }
    };
    out.local = Some(local);
    out
}

#[cfg(test)]
mod tests {
    //! Every case of upstream's `TestCategorizeEndpoints`
    //! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/topology_test.go>),
    //! written again as data: endpoints by address, with conditions, locality and
    //! hints; the expected sets by address.

    use std::sync::Arc;

    use super::*;

    include!("../../tests/data/categorize_cases.rs");

    /// What categorizing reads of a case's endpoint.
    fn facts(e: &Ep) -> EndpointFacts {
        EndpointFacts {
            ready: e.ready,
            serving: e.serving,
            terminating: e.terminating,
            local: e.local,
            hints: Hints::new(e.zones.clone().into(), e.nodes.clone().into()),
        }
    }

    fn addrs(eps: &[Ep], idx: &[usize]) -> Vec<&'static str> {
        let mut v: Vec<_> = idx.iter().map(|&i| eps[i].addr).collect();
        v.sort_unstable();
        v
    }

    fn sorted(v: &[&'static str]) -> Vec<&'static str> {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    }

    #[test]
    fn every_case_of_upstream_test_categorize_endpoints() {
        let cases = cases();
        assert_eq!(cases.len(), 32, "upstream's table has 32 cases");
        for c in cases {
            let node = NodeFacts {
                name: c.node,
                zone: c.zone,
            };
            let facts: Vec<EndpointFacts> = c.endpoints.iter().map(facts).collect();
            let got = categorize(&facts, &c.policy, &node);
            // Upstream's checks: an expected empty set (nil or empty) means none.
            let want_cluster = sorted(c.cluster.unwrap_or_default());
            let want_local = sorted(c.local.unwrap_or_default());
            assert_eq!(
                addrs(&c.endpoints, got.cluster.as_deref().unwrap_or_default()),
                want_cluster,
                "{}: cluster",
                c.name
            );
            assert_eq!(
                addrs(&c.endpoints, got.local.as_deref().unwrap_or_default()),
                want_local,
                "{}: local",
                c.name
            );
            let want_all = if !want_cluster.is_empty() && want_local.is_empty() {
                want_cluster.clone()
            } else if !want_local.is_empty() && want_cluster.is_empty() {
                want_local.clone()
            } else {
                sorted(c.all.unwrap_or_default())
            };
            assert_eq!(
                addrs(&c.endpoints, &got.all_reachable),
                want_all,
                "{}: all reachable",
                c.name
            );
            assert_eq!(
                got.has_any,
                !want_all.is_empty() || c.only_remote,
                "{}: hasAnyEndpoints",
                c.name
            );
            // Stricter than upstream: whether a set is used at all.
            assert_eq!(
                got.cluster.is_some(),
                c.policy.uses_cluster() && !c.endpoints.is_empty(),
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn a_clusterip_without_local_endpoints_drops_when_others_have_some_and_rejects_when_none_do() {
        let itp_local = policy(true, false, false);
        let remote = [facts(&ready("10.0.0.1:80"))];
        let got = categorize(&remote, &itp_local, &NodeFacts::default());
        assert!(got.internal(&itp_local).is_empty());
        assert_eq!(got.internal_empty_verdict(), EmptyVerdict::Drop);

        let none: [EndpointFacts; 0] = [];
        let got = categorize(&none, &itp_local, &NodeFacts::default());
        assert_eq!(got.internal_empty_verdict(), EmptyVerdict::Reject);

        let not_serving = [facts(&unready(ready("10.0.0.1:80")))];
        let got = categorize(&not_serving, &CLUSTER, &NodeFacts::default());
        assert!(got.internal(&CLUSTER).is_empty());
        assert_eq!(got.internal_empty_verdict(), EmptyVerdict::Reject);
    }
}

//! The agent's own model of Services and EndpointSlices: only the fields the compiler
//! reads, nothing else of the API objects.
//!
//! Sources convert each object as soon as it arrives (a document of a manifest file,
//! an object of a reflector store), so the agent keeps this lean copy and not the full
//! API objects. Values are kept as the API gives them (strings, optional conditions):
//! the compiler validates them and says what was wrong. Endpoints, by far the most
//! numerous, are kept compact: an address that is an IP (either family) is stored
//! parsed, and a slice's endpoints share one copy of each node name.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    sync::Arc,
};

use k8s_openapi::api::{
    core::v1::Service,
    discovery::v1::{Endpoint, EndpointSlice},
};

use conventions::labels::{
    ANNOTATION_TRIGGER_TIME, LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME,
    LABEL_ZONE,
};

/// What the agent reads of a Node: its name, zone and primary address of each family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The `topology.kubernetes.io/zone` label, when set and not empty.
    pub zone: Option<String>,
    /// The node's primary IPv4 address, as kube-proxy finds it
    /// (pkg/util/node `GetNodeHostIPs`): its first `InternalIP` of the family, else
    /// its first `ExternalIP`. NodePorts are served there by default.
    pub primary_ipv4: Option<std::net::Ipv4Addr>,
    /// The node's primary IPv6 address, found the same way among its IPv6
    /// addresses: where IPv6 NodePorts are served by default, and the address IPv6
    /// connections from outside are masqueraded to.
    pub primary_ipv6: Option<std::net::Ipv6Addr>,
    /// Whether load balancers may send to this node: not being deleted and not
    /// tainted `ToBeDeletedByClusterAutoscaler`, kube-proxy's `NodeEligible`
    /// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/healthcheck/proxy_health.go>,
    /// KEP-3836); `/healthz` fails while it is false.
    pub eligible: bool,
    /// `spec.podCIDRs` as kube-proxy's `NodeCIDR` detector takes them
    /// ([`pod_cidrs`]).
    pub pod_cidrs: PodCidrs,
}

/// A Node's pod CIDRs: the first valid CIDR of each family of `spec.podCIDRs`,
/// masked to its network, and the entries that are no CIDR (left out, said in the
/// log).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCidrs {
    pub cidrs: Vec<(std::net::IpAddr, u8)>,
    pub bad: Vec<String>,
}

/// The taint the cluster autoscaler puts on a node it is about to delete
/// (kube-proxy's `ToBeDeletedTaint`).
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// What the agent reads of a ServiceCIDR (`networking.k8s.io/v1`): its name and
/// its `spec.cidrs` as written (the compiler parses them and says what is wrong).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceCidrInfo {
    pub name: String,
    pub cidrs: Vec<String>,
}

impl From<&k8s_openapi::api::networking::v1::ServiceCIDR> for ServiceCidrInfo {
    fn from(o: &k8s_openapi::api::networking::v1::ServiceCIDR) -> Self {
        Self {
            name: o.metadata.name.clone().unwrap_or_default(),
            cidrs: o
                .spec
                .as_ref()
                .and_then(|s| s.cidrs.clone())
                .unwrap_or_default(),
        }
    }
}

impl From<&k8s_openapi::api::core::v1::Node> for NodeInfo {
    fn from(node: &k8s_openapi::api::core::v1::Node) -> Self {
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            zone: node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_ZONE))
                .filter(|z| !z.is_empty())
                .cloned(),
            primary_ipv4: primary_ip(node),
            primary_ipv6: primary_ip(node),
            pod_cidrs: pod_cidrs(node),
            eligible: node.metadata.deletion_timestamp.is_none()
                && !node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT)),
        }
    }
}

/// A Node's `spec.podCIDRs` as kube-proxy reads them for `--detect-local-mode
/// NodeCIDR`: each entry trimmed and parsed as `ParseCIDRSloppy` parses it (leading
/// zeros in IPv4 allowed), masked to its network; an entry that is no CIDR is left
/// out (and named), an empty one silently; the first CIDR of each family
/// is the detector's (`MapCIDRsByIPFamily`, then `cidrs[0]` in `getLocalDetectors`:
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/util/utils.go>,
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server_linux.go>).
pub fn pod_cidrs(node: &k8s_openapi::api::core::v1::Node) -> PodCidrs {
    use std::net::IpAddr;
    let (mut v4, mut v6, mut bad) = (None, None, Vec::new());
    let entries = node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.as_deref())
        .unwrap_or_default();
    for raw in entries {
        let text = raw.trim();
        if text.is_empty() {
            continue;
        }
        let parsed = text.split_once('/').and_then(|(addr, len)| {
            let addr = conventions::validate::parse_ip_sloppy(addr)?;
            let len: u8 = len.parse().ok()?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            (len <= max).then_some((addr, len))
        });
        match parsed {
            Some((IpAddr::V4(a), len)) => {
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                v4.get_or_insert((IpAddr::V4((u32::from(a) & mask).into()), len));
            }
            Some((IpAddr::V6(a), len)) => {
                let mask = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                v6.get_or_insert((IpAddr::V6((u128::from(a) & mask).into()), len));
            }
            None => bad.push(raw.clone()),
        }
    }
    PodCidrs {
        cidrs: v4.into_iter().chain(v6).collect(),
        bad,
    }
}

/// kube-proxy's primary address of a Node in one family (`A`, IPv4 or IPv6): the
/// first `InternalIP` of the family, else the first such `ExternalIP`
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/util/node/node.go>
/// `GetNodeHostIPs`: each family's first address, `InternalIP` before `ExternalIP`).
fn primary_ip<A: std::str::FromStr>(node: &k8s_openapi::api::core::v1::Node) -> Option<A> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    let of = |kind: &str| {
        addresses
            .iter()
            .filter(|a| a.type_ == kind)
            .find_map(|a| a.address.parse::<A>().ok())
    };
    of("InternalIP").or_else(|| of("ExternalIP"))
}

/// What the compiler reads of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The `service.kubernetes.io/service-proxy-name` label.
    pub proxy_name: Option<String>,
    /// `metadata.creationTimestamp` (RFC 3339), which orders Services claiming one
    /// frontend.
    pub created: Option<String>,
    pub spec: Option<ServiceSpecInfo>,
}

/// What the compiler reads of a Service's spec (and status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpecInfo {
    /// `type: ExternalName`.
    pub external_name: bool,
    /// `clusterIPs` if set and not empty, else `clusterIP` if set: one per family,
    /// the primary family's first (two for a dual-stack Service).
    pub cluster_ips: Vec<String>,
    /// `ipFamilies`, as written (`IPv4`, `IPv6`), in the order of `clusterIPs`.
    pub ip_families: Vec<String>,
    /// `ipFamilyPolicy`, as written (`SingleStack`, `PreferDualStack`,
    /// `RequireDualStack`).
    pub ip_family_policy: Option<String>,
    /// `externalIPs`.
    pub external_ips: Vec<String>,
    /// The load-balancer ingress IPs of the status (VIP mode only).
    pub load_balancer_ips: Vec<String>,
    /// `loadBalancerSourceRanges`, as written.
    pub load_balancer_source_ranges: Vec<String>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local`.
    pub external_local: bool,
    /// `sessionAffinity`, as written (`None` and `ClientIP` are the API's values).
    pub session_affinity: Option<String>,
    /// `sessionAffinityConfig.clientIP.timeoutSeconds`, as written.
    pub affinity_timeout: Option<i32>,
    pub ports: Vec<ServicePortInfo>,
    /// `healthCheckNodePort`, for a Service that needs one (`type: LoadBalancer` with
    /// `externalTrafficPolicy: Local`: kube-proxy's `NeedsHealthCheck`), as written.
    pub health_check_node_port: Option<i32>,
}

/// A port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortInfo {
    /// The port's name; empty when unnamed.
    pub name: String,
    pub protocol: Option<String>,
    pub port: i32,
    /// `nodePort`, when set (not 0).
    pub node_port: Option<i32>,
}

/// What the compiler reads of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceInfo {
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The `service.kubernetes.io/service-proxy-name` label.
    pub proxy_name: Option<String>,
    /// Whether the `service.kubernetes.io/headless` label is present.
    pub headless: bool,
    /// The `kubernetes.io/service-name` label.
    pub service_name: Option<String>,
    pub address_type: String,
    pub ports: Vec<SlicePortInfo>,
    pub endpoints: Vec<EndpointInfo>,
    /// The `endpoints.kubernetes.io/last-change-trigger-time` annotation.
    pub trigger_time: Option<String>,
}

/// A port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePortInfo {
    /// The port's name: `Some("")` when unnamed, `None` when the field is absent
    /// (kube-proxy ignores such a port).
    pub name: Option<String>,
    pub protocol: Option<String>,
    pub port: Option<i32>,
}

/// An endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// The first address (the only one kube-proxy uses).
    pub address: Option<Address>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<Arc<str>>,
    pub hints: Hints,
}

/// An endpoint's topology hints: `hints.forZones` and `hints.forNodes` names. Most
/// endpoints have none, which costs the room of a pointer; the merged endpoints share
/// the slice's copy. (Two boxed lists took 32 bytes of each of the 100,000 endpoints
/// of 10,000 Services, twice.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints(Option<Arc<HintNames>>);

#[derive(Debug, PartialEq, Eq)]
struct HintNames {
    zones: Box<[Arc<str>]>,
    nodes: Box<[Arc<str>]>,
}

impl Hints {
    /// The hints of these zones and nodes; none when both are empty.
    pub fn new(zones: Box<[Arc<str>]>, nodes: Box<[Arc<str>]>) -> Self {
        if zones.is_empty() && nodes.is_empty() {
            return Self(None);
        }
        Self(Some(Arc::new(HintNames { zones, nodes })))
    }

    /// `hints.forZones` names (empty when none).
    pub fn zones(&self) -> &[Arc<str>] {
        self.0.as_deref().map_or(&[], |h| &h.zones)
    }

    /// `hints.forNodes` names (empty when none).
    pub fn nodes(&self) -> &[Arc<str>] {
        self.0.as_deref().map_or(&[], |h| &h.nodes)
    }
}

/// An endpoint address: IPv4, IPv6, or anything else as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Other(Box<str>),
}

impl Address {
    /// An address as kube-proxy reads it (`netutils.ParseIPSloppy`: IPv4 parts may
    /// have leading zeros, read as decimal, which older API servers stored).
    pub fn new(written: &str) -> Self {
        match conventions::validate::parse_ip_sloppy(written) {
            Some(std::net::IpAddr::V4(ip)) => Self::V4(ip),
            Some(std::net::IpAddr::V6(ip)) => Self::V6(ip),
            None => Self::Other(written.into()),
        }
    }
}

/// One shared copy of each name: a few nodes and zones for many endpoints.
fn interned(name: &str, seen: &mut Vec<Arc<str>>) -> Arc<str> {
    match seen.iter().find(|s| &***s == name) {
        Some(s) => s.clone(),
        None => {
            let new: Arc<str> = Arc::from(name);
            seen.push(new.clone());
            new
        }
    }
}

impl EndpointInfo {
    /// The endpoint, its node name shared with the endpoints before it in `nodes`.
    fn new(ep: &Endpoint, names: &mut Vec<Arc<str>>) -> Self {
        let cond = ep.conditions.as_ref();
        let node_name = ep.node_name.as_deref().map(|n| interned(n, names));
        let hints = ep.hints.as_ref();
        let zone_hints = hints
            .and_then(|h| h.for_zones.as_ref())
            .into_iter()
            .flatten()
            .map(|z| interned(&z.name, names))
            .collect();
        let node_hints = hints
            .and_then(|h| h.for_nodes.as_ref())
            .into_iter()
            .flatten()
            .map(|n| interned(&n.name, names))
            .collect();
        Self {
            address: ep.addresses.first().map(|a| Address::new(a)),
            ready: cond.and_then(|c| c.ready),
            serving: cond.and_then(|c| c.serving),
            terminating: cond.and_then(|c| c.terminating),
            node_name,
            hints: Hints::new(zone_hints, node_hints),
        }
    }
}

impl From<&Service> for ServiceInfo {
    fn from(svc: &Service) -> Self {
        let labels = svc.metadata.labels.as_ref();
        let spec = svc.spec.as_ref().map(|spec| {
            let cluster_ips = match (&spec.cluster_ips, &spec.cluster_ip) {
                (Some(ips), _) if !ips.is_empty() => ips.clone(),
                (_, Some(ip)) => vec![ip.clone()],
                _ => vec![],
            };
            let external_ips = spec.external_ips.clone().unwrap_or_default();
            let load_balancer_ips = svc
                .status
                .iter()
                .filter_map(|s| s.load_balancer.as_ref())
                .flat_map(|lb| lb.ingress.iter().flatten())
                // Only VIP-style load balancers: an ingress with `ipMode: Proxy` gets
                // its traffic from a proxy, not at this IP (kube-proxy's
                // `IsVIPMode`, pkg/proxy/serviceport.go).
                .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
                .filter_map(|i| i.ip.clone())
                .collect();
            ServiceSpecInfo {
                external_name: spec.type_.as_deref() == Some("ExternalName"),
                cluster_ips,
                ip_families: spec.ip_families.clone().unwrap_or_default(),
                ip_family_policy: spec.ip_family_policy.clone(),
                external_ips,
                load_balancer_ips,
                load_balancer_source_ranges: spec
                    .load_balancer_source_ranges
                    .clone()
                    .unwrap_or_default(),
                internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
                external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
                session_affinity: spec.session_affinity.clone(),
                affinity_timeout: spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds),
                ports: spec
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| ServicePortInfo {
                        name: p.name.clone().unwrap_or_default(),
                        protocol: p.protocol.clone(),
                        port: p.port,
                        node_port: p.node_port.filter(|n| *n != 0),
                    })
                    .collect(),
                health_check_node_port: (spec.type_.as_deref() == Some("LoadBalancer")
                    && spec.external_traffic_policy.as_deref() == Some("Local"))
                .then_some(spec.health_check_node_port)
                .flatten(),
            }
        });
        Self {
            namespace: svc.metadata.namespace.clone(),
            name: svc.metadata.name.clone(),
            proxy_name: labels
                .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME))
                .cloned(),
            created: svc
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
            spec,
        }
    }
}

impl From<&EndpointSlice> for SliceInfo {
    fn from(slice: &EndpointSlice) -> Self {
        let labels = slice.metadata.labels.as_ref();
        Self {
            namespace: slice.metadata.namespace.clone(),
            name: slice.metadata.name.clone(),
            proxy_name: labels
                .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME))
                .cloned(),
            headless: labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)),
            service_name: labels.and_then(|l| l.get(LABEL_SERVICE_NAME)).cloned(),
            address_type: slice.address_type.clone(),
            ports: slice
                .ports
                .iter()
                .flatten()
                .map(|p| SlicePortInfo {
                    name: p.name.clone(),
                    protocol: p.protocol.clone(),
                    port: p.port,
                })
                .collect(),
            endpoints: {
                // A few nodes for many endpoints: one copy of each name.
                let mut nodes = Vec::new();
                slice
                    .endpoints
                    .iter()
                    .map(|ep| EndpointInfo::new(ep, &mut nodes))
                    .collect()
            },
            trigger_time: slice
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_TRIGGER_TIME))
                .cloned(),
        }
    }
}

/// Where an object came from, to tell apart objects of the same namespace and name
/// (possible in a manifest directory) and to order them as they were read: the file,
/// then the how-manieth object of that namespace and name in the file. Objects of the
/// API server are unique by namespace and name and have the default origin.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    pub file: Option<Arc<Path>>,
    pub occurrence: u32,
}

/// Identity and compile order of a Service: namespace and name (empty when unset),
/// then origin.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId {
    pub namespace: String,
    pub name: String,
    pub origin: Origin,
}

impl ServiceId {
    pub fn of(svc: &ServiceInfo, origin: Origin) -> Self {
        Self {
            namespace: svc.namespace.clone().unwrap_or_default(),
            name: svc.name.clone().unwrap_or_default(),
            origin,
        }
    }
}

/// Identity and merge order of an EndpointSlice: namespace and name (unset first),
/// then origin.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SliceId {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub origin: Origin,
}

impl SliceId {
    pub fn of(slice: &SliceInfo, origin: Origin) -> Self {
        Self {
            namespace: slice.namespace.clone(),
            name: slice.name.clone(),
            origin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> NodeInfo {
        NodeInfo::from(&serde_json::from_value::<k8s_openapi::api::core::v1::Node>(json).unwrap())
    }

    /// kube-proxy's `NodeEligible`: not deleted, not tainted by the autoscaler (any
    /// effect); other taints do not count.
    #[test]
    fn a_node_is_eligible_unless_deleted_or_tainted_to_be_deleted() {
        let name = serde_json::json!({"name": "node-1"});
        assert!(node(serde_json::json!({"metadata": name})).eligible);
        assert!(
            node(serde_json::json!({"metadata": name, "spec": {"taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}))
            .eligible
        );
        assert!(
            !node(serde_json::json!({"metadata": name, "spec": {"taints": [
                {"key": TO_BE_DELETED_TAINT, "value": "1733100000", "effect": "NoSchedule"}]}}))
            .eligible
        );
        assert!(
            !node(serde_json::json!({"metadata":
                {"name": "node-1", "deletionTimestamp": "2026-12-02T01:00:00Z"}}))
            .eligible
        );
    }

    /// `--detect-local-mode NodeCIDR`: the node pod CIDRs of upstream's
    /// `TestGetLocalDetectors` cases
    /// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server_linux_test.go)
    /// give each family's first CIDR, whichever family comes first; none gives
    /// none. Beside them, as `MapCIDRsByIPFamily` reads entries: trimmed, leading
    /// zeros read as decimal, host bits masked, an invalid entry left out and named,
    /// an empty one ignored.
    #[test]
    fn pod_cidrs_are_read_as_kube_proxys_node_cidr_detector_reads_them() {
        let cidrs = |list: serde_json::Value| {
            let n = node(serde_json::json!({"metadata": {"name": "node-1"},
                "spec": {"podCIDRs": list}}));
            let text: Vec<String> = n
                .pod_cidrs
                .cidrs
                .iter()
                .map(|(a, l)| format!("{a}/{l}"))
                .collect();
            (text, n.pod_cidrs.bad)
        };
        let ok = |v: &[&str]| (v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), vec![]);
        let v6 = "2002::1234:abcd:ffff:0:0/96";
        assert_eq!(
            cidrs(serde_json::json!(["10.0.0.0/24"])),
            ok(&["10.0.0.0/24"])
        );
        assert_eq!(cidrs(serde_json::json!([v6])), ok(&[v6]));
        assert_eq!(
            cidrs(serde_json::json!(["10.0.0.0/24", v6])),
            ok(&["10.0.0.0/24", v6])
        );
        assert_eq!(
            cidrs(serde_json::json!([v6, "10.0.0.0/24"])),
            ok(&["10.0.0.0/24", v6])
        );
        assert_eq!(cidrs(serde_json::json!([])), ok(&[]));
        assert_eq!(
            node(serde_json::json!({"metadata": {"name": "node-1"}})).pod_cidrs,
            PodCidrs::default()
        );
        assert_eq!(
            cidrs(serde_json::json!([" 010.000.001.007/24 ", "10.9.0.0/16"])),
            ok(&["10.0.1.0/24"])
        );
        assert_eq!(
            cidrs(serde_json::json!([
                "",
                "10.0.0.0/33",
                "not-a-cidr",
                "fd00::/200",
                "fd00:1::5/64"
            ])),
            (
                vec!["fd00:1::/64".to_string()],
                vec![
                    "10.0.0.0/33".into(),
                    "not-a-cidr".into(),
                    "fd00::/200".into()
                ]
            )
        );
    }
}

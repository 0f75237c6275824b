//! Helpers shared by the reconcilers: well-known labels and annotations, Pod
//! readiness and port resolution, endpoint identity (the upstream endpoint hash),
//! port-map keys, ownership and the last-change trigger time tracker.
//!
//! Upstream: <https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/endpointslice/util/controller_utils.go>
//! and <https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/util/endpoint/controller_utils.go>.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// `kubernetes.io/service-name` (discovery.LabelServiceName).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// `endpointslice.kubernetes.io/managed-by` (discovery.LabelManagedBy).
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// `service.kubernetes.io/headless` (v1.IsHeadlessService).
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// `endpointslice.kubernetes.io/skip-mirror` (discovery.LabelSkipMirror).
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// `topology.kubernetes.io/zone` (v1.LabelTopologyZone).
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// `endpoints.kubernetes.io/last-change-trigger-time` (v1.EndpointsLastChangeTriggerTime).
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// `endpoints.kubernetes.io/over-capacity` (v1.EndpointsOverCapacity).
pub const ANNOTATION_OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// Leader-election record kept on old-style Endpoints locks; such Endpoints are left alone.
pub const ANNOTATION_LEADER: &str = "control-plane.alpha.kubernetes.io/leader";
/// `kubectl.kubernetes.io/last-applied-configuration` (v1.LastAppliedConfigAnnotation).
pub const ANNOTATION_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// The name upstream's EndpointSlice controller writes into the managed-by label.
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The name upstream's mirroring controller writes into the managed-by label.
pub const MIRRORING_CONTROLLER_NAME: &str = "endpointslicemirroring-controller.k8s.io";
/// EndpointSlice address type for IPv4.
pub const IPV4: &str = "IPv4";
/// EndpointSlice address type for IPv6.
pub const IPV6: &str = "IPv6";

/// Whether the Pod's `Ready` condition is `True` (podutil.IsPodReady).
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The last transition time of the Pod's `Ready` condition (getPodTriggerTime).
pub fn pod_ready_transition(pod: &Pod) -> Option<Time> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.clone())
}

/// Whether the Pod is in phase Failed or Succeeded (podutil.IsPodTerminal).
pub fn is_pod_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

/// The Pod's IPs: `status.podIPs`, or `status.podIP` when the list is empty (the API
/// server keeps the two in step; hand-written manifests often give only `podIP`).
pub fn pod_ips(pod: &Pod) -> Vec<String> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<String> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    status
        .pod_ip
        .iter()
        .filter(|ip| !ip.is_empty())
        .cloned()
        .collect()
}

/// Whether the Pod belongs in endpoints at all (endpointsliceutil.ShouldPodBeInEndpoints).
pub fn should_pod_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    if is_pod_terminal(pod) {
        return false;
    }
    if pod_ips(pod).is_empty() {
        return false;
    }
    if !include_terminating && pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    true
}

/// The Service port's protocol, defaulted to TCP as the API server does.
pub fn port_protocol(port: &ServicePort) -> String {
    port.protocol.clone().unwrap_or_else(|| "TCP".to_string())
}

/// Resolves a Service port's target port on a Pod (podutil.FindPort): a number is
/// taken as is (an unset target port is the port itself); a name is looked up among
/// the containers' ports of the same protocol, then among restartable init containers.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            // The API server turns a numeric string into an int; be as lenient.
            if let Ok(n) = name.parse::<i32>() {
                return Some(n);
            }
            let proto = port_protocol(port);
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == proto
                })
                .map(|p| p.container_port)
        }
    }
}

/// Parses an IP the way Go's net.ParseIP does for our purposes; `None` if invalid.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>().ok()
}

/// Whether the string is an IPv6 address (utilnet.IsIPv6String); IPv4-mapped IPv6
/// addresses count as IPv4, as in Go.
pub fn is_ipv6(s: &str) -> bool {
    match parse_ip(s) {
        Some(IpAddr::V6(v6)) => v6.to_ipv4_mapped().is_none(),
        _ => false,
    }
}

/// The EndpointSlice address type of an IP, `None` when it is not an IP.
pub fn address_type_of(s: &str) -> Option<&'static str> {
    parse_ip(s).map(|_| if is_ipv6(s) { IPV6 } else { IPV4 })
}

/// Whether every key and value of the selector is among the labels.
pub fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// `helper.IsServiceIPSet`: a cluster IP that is neither empty nor `None`.
pub fn service_ip_set(svc: &Service) -> bool {
    let ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or("");
    !ip.is_empty() && ip != "None"
}

/// `publishNotReadyAddresses`, false when unset.
pub fn publish_not_ready(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

/// `endpointutil.ShouldSetHostname`.
pub fn should_set_hostname(pod: &Pod, svc: &Service) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let hostname = spec.hostname.as_deref().unwrap_or("");
    !hostname.is_empty()
        && spec.subdomain.as_deref() == svc.metadata.name.as_deref()
        && pod.metadata.namespace == svc.metadata.namespace
}

/// An object reference to a Pod, as targetRef.
pub fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The identity of an endpoint inside a set (upstream's hashEndpoint): its sorted
/// addresses, hostname and the namespace and name of its target.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointKey {
    addresses: Vec<String>,
    hostname: String,
    namespace: String,
    name: String,
}

impl EndpointKey {
    /// The key of an endpoint.
    pub fn of(ep: &Endpoint) -> Self {
        let mut addresses = ep.addresses.clone();
        addresses.sort();
        let (namespace, name) = ep
            .target_ref
            .as_ref()
            .map(|r| {
                (
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default(),
                )
            })
            .unwrap_or_default();
        EndpointKey {
            addresses,
            hostname: ep.hostname.clone().unwrap_or_default(),
            namespace,
            name,
        }
    }
}

/// `EndpointsEqualBeyondHash`: the fields the hash leaves out (node, zone, conditions,
/// target reference) are equal.
pub fn endpoints_equal_beyond_hash(a: &Endpoint, b: &Endpoint) -> bool {
    let ca = a.conditions.clone().unwrap_or_default();
    let cb = b.conditions.clone().unwrap_or_default();
    a.node_name == b.node_name
        && a.zone == b.zone
        && ca.ready == cb.ready
        && ca.serving == cb.serving
        && ca.terminating == cb.terminating
        && a.target_ref == b.target_ref
}

/// An insertion-ordered set of endpoints keyed by [`EndpointKey`] (upstream's
/// EndpointSet). `pop_any` pops in insertion order, so results are deterministic
/// where upstream's map order is random.
#[derive(Debug, Default, Clone)]
pub struct EndpointSet {
    items: Vec<Option<Endpoint>>,
    index: HashMap<EndpointKey, usize>,
    next: usize,
}

impl EndpointSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }
    /// Inserts or replaces (same key) an endpoint.
    pub fn insert(&mut self, ep: Endpoint) {
        let key = EndpointKey::of(&ep);
        match self.index.get(&key) {
            Some(&i) => self.items[i] = Some(ep),
            None => {
                self.index.insert(key, self.items.len());
                self.items.push(Some(ep));
            }
        }
    }
    /// The endpoint with the same key.
    pub fn get(&self, ep: &Endpoint) -> Option<&Endpoint> {
        self.index
            .get(&EndpointKey::of(ep))
            .and_then(|&i| self.items[i].as_ref())
    }
    /// Removes the endpoint with the same key.
    pub fn delete(&mut self, ep: &Endpoint) {
        if let Some(i) = self.index.remove(&EndpointKey::of(ep)) {
            self.items[i] = None;
        }
    }
    /// Removes and returns the oldest endpoint.
    pub fn pop_any(&mut self) -> Option<Endpoint> {
        while self.next < self.items.len() {
            let i = self.next;
            self.next += 1;
            if let Some(ep) = self.items[i].take() {
                self.index.remove(&EndpointKey::of(&ep));
                return Some(ep);
            }
        }
        None
    }
    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.index.len()
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

/// A key for a set of ports independent of their order (upstream's PortMapKey).
pub type PortMapKey = Vec<(String, i32, String, String)>;

/// The key of a list of EndpointSlice ports.
pub fn port_map_key(ports: &[EndpointPort]) -> PortMapKey {
    let mut key: PortMapKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or(0),
                p.protocol.clone().unwrap_or_default(),
                p.app_protocol.clone().unwrap_or_default(),
            )
        })
        .collect();
    key.sort();
    key
}

/// Whether the slice has an owner reference to the object with this UID and kind
/// (apiVersion v1), as upstream's ownedBy.
pub fn owned_by(slice: &EndpointSlice, kind: &str, uid: &str) -> bool {
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.kind == kind && o.api_version == "v1")
}

/// A controller owner reference (metav1.NewControllerRef) to a v1 object.
pub fn controller_ref(kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The generateName prefix of a slice (getEndpointSlicePrefix): `<name>-`, or
/// `endpointslice-` when that is not a valid DNS subdomain prefix.
pub fn slice_prefix(name: &str) -> String {
    let prefix = format!("{name}-");
    // NameIsDNSSubdomain with prefix=true: room for the 5-char suffix, lowercase
    // alphanumerics, '-' and '.'.
    let valid = !prefix.is_empty()
        && prefix.len() <= 253 - 5
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && prefix
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if valid {
        prefix
    } else {
        "endpointslice-".into()
    }
}

/// FNV-1a, 64 bits: a stable hash for generated names and synthesized UIDs.
pub fn fnv64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The alphabet of the API server's generateName suffixes (utilrand.String).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A deterministic 5-character suffix in the API server's alphabet.
pub fn name_suffix(seed: &str) -> String {
    let mut h = fnv64(seed.as_bytes());
    (0..5)
        .map(|_| {
            let c = NAME_ALPHABET[(h % NAME_ALPHABET.len() as u64) as usize] as char;
            h /= NAME_ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// A deterministic UID (UUID-shaped) for objects read from files without one.
pub fn synthetic_uid(kind: &str, namespace: &str, name: &str) -> String {
    let a = fnv64(format!("{kind}/{namespace}/{name}").as_bytes());
    let b = fnv64(format!("{name}/{namespace}/{kind}").as_bytes());
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// Formats a trigger time as upstream does (RFC 3339 with nanoseconds, UTC).
pub fn format_time(t: &Time) -> String {
    // jiff prints RFC 3339 in UTC with only the significant fractional digits,
    // as Go's time.RFC3339Nano does.
    t.0.to_string()
}

/// Per-Service state of the last-change trigger time (upstream's TriggerTimeTracker):
/// the annotation says when the change that caused this write happened.
/// <https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/util/endpoint/trigger_time_tracker.go>
#[derive(Debug, Default, Clone)]
pub struct TriggerTimeTracker {
    states: HashMap<String, TriggerState>,
}

#[derive(Debug, Default, Clone)]
struct TriggerState {
    pods: HashMap<String, Time>,
    service: Option<Time>,
}

impl TriggerTimeTracker {
    /// The earliest trigger time among Pods and the Service that changed since the
    /// last call for this Service; `None` for a Service seen the first time.
    pub fn compute(&mut self, svc: &Service, pods: &[&Pod]) -> Option<Time> {
        let key = format!(
            "{}/{}",
            svc.metadata.namespace.as_deref().unwrap_or(""),
            svc.metadata.name.as_deref().unwrap_or("")
        );
        let old = self.states.get(&key);
        let was_known = old.is_some();
        let mut new = TriggerState::default();
        let mut min: Option<Time> = None;
        let consider = |t: &Time, min: &mut Option<Time>| {
            if min.as_ref().is_none_or(|m| t.0 < m.0) {
                *min = Some(t.clone());
            }
        };
        for pod in pods {
            if let Some(t) = pod_ready_transition(pod) {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let before = old.and_then(|o| o.pods.get(&name));
                if before.is_none_or(|b| t.0 > b.0) {
                    consider(&t, &mut min);
                }
                new.pods.insert(name, t);
            }
        }
        let svc_time = svc.metadata.creation_timestamp.clone();
        if let Some(t) = &svc_time {
            if old
                .and_then(|o| o.service.as_ref())
                .is_none_or(|b| t.0 > b.0)
            {
                consider(t, &mut min);
            }
        }
        new.service = svc_time;
        self.states.insert(key, new);
        if was_known {
            min
        } else {
            None
        }
    }

    /// Forgets a deleted Service.
    pub fn delete(&mut self, namespace: &str, name: &str) {
        self.states.remove(&format!("{namespace}/{name}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_detection_matches_go() {
        assert!(is_ipv6("fd00::1"));
        assert!(!is_ipv6("10.0.0.1"));
        assert!(!is_ipv6("::ffff:10.0.0.1"));
        assert!(!is_ipv6("not-an-ip"));
        assert_eq!(address_type_of("bad"), None);
    }

    #[test]
    fn suffix_is_stable_and_in_alphabet() {
        let a = name_suffix("default/web/0");
        assert_eq!(a, name_suffix("default/web/0"));
        assert_eq!(a.len(), 5);
        assert!(a.bytes().all(|b| NAME_ALPHABET.contains(&b)));
    }

    #[test]
    fn slice_prefix_falls_back() {
        assert_eq!(slice_prefix("web"), "web-");
        assert_eq!(slice_prefix("Bad_Name"), "endpointslice-");
    }

    #[test]
    fn endpoint_set_pops_in_insertion_order() {
        let mut set = EndpointSet::new();
        for ip in ["10.0.0.2", "10.0.0.1", "10.0.0.3"] {
            set.insert(Endpoint {
                addresses: vec![ip.into()],
                ..Default::default()
            });
        }
        set.delete(&Endpoint {
            addresses: vec!["10.0.0.1".into()],
            ..Default::default()
        });
        assert_eq!(set.len(), 2);
        assert_eq!(set.pop_any().unwrap().addresses, vec!["10.0.0.2"]);
        assert_eq!(set.pop_any().unwrap().addresses, vec!["10.0.0.3"]);
        assert!(set.pop_any().is_none());
    }
}

//! Helpers shared by the reconcilers: well-known labels and annotations, Pod
//! readiness and port resolution, endpoint identity (the upstream endpoint hash),
//! port-map keys, ownership and the last-change trigger time tracker.
//!
//! Upstream: <https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/endpointslice/util/controller_utils.go>
//! and <https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/util/endpoint/controller_utils.go>.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hasher as _;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
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
    pod_ip_strs(pod).map(str::to_string).collect()
}

/// [`pod_ips`] without copying: the same addresses, borrowed from the Pod.
pub fn pod_ip_strs(pod: &Pod) -> impl Iterator<Item = &str> + Clone {
    let status = pod.status.as_ref();
    let listed = status
        .and_then(|s| s.pod_ips.as_deref())
        .unwrap_or(&[])
        .iter()
        .map(|p| p.ip.as_str())
        .filter(|ip| !ip.is_empty());
    let use_listed = listed.clone().next().is_some();
    let single = status
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !use_listed && !ip.is_empty());
    listed.filter(move |_| use_listed).chain(single)
}

/// Whether the Pod belongs in endpoints at all (endpointsliceutil.ShouldPodBeInEndpoints).
pub fn should_pod_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    if is_pod_terminal(pod) {
        return false;
    }
    if pod_ip_strs(pod).next().is_none() {
        return false;
    }
    if !include_terminating && pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    true
}

/// The Service port's protocol, defaulted to TCP as the API server does.
pub fn port_protocol(port: &ServicePort) -> String {
    port_protocol_str(port).to_string()
}

/// [`port_protocol`], borrowed.
pub fn port_protocol_str(port: &ServicePort) -> &str {
    port.protocol.as_deref().unwrap_or("TCP")
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
            let proto = port_protocol_str(port);
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
    // Every IPv6 form has a colon; most addresses are IPv4, and parsing is not free.
    if !s.contains(':') {
        return false;
    }
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
        let k = ep.key();
        EndpointKey {
            addresses: k.addresses.iter().map(|a| a.to_string()).collect(),
            hostname: k.hostname.into(),
            namespace: k.namespace.into(),
            name: k.name.into(),
        }
    }
}

/// Sorted addresses of an endpoint key, borrowed; allocates only for two or more.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyAddresses<'a> {
    /// No address.
    None,
    /// One address.
    One(&'a str),
    /// Several addresses, sorted.
    Many(Vec<&'a str>),
}

impl<'a> KeyAddresses<'a> {
    /// The sorted key of these addresses.
    pub fn of(addresses: impl Iterator<Item = &'a str>) -> Self {
        let mut it = addresses;
        let Some(first) = it.next() else {
            return KeyAddresses::None;
        };
        let Some(second) = it.next() else {
            return KeyAddresses::One(first);
        };
        let mut all = vec![first, second];
        all.extend(it);
        all.sort_unstable();
        KeyAddresses::Many(all)
    }
    /// The addresses, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &'a str> + '_ {
        let (one, many): (Option<&'a str>, &[&'a str]) = match self {
            KeyAddresses::None => (None, &[]),
            KeyAddresses::One(a) => (Some(*a), &[]),
            KeyAddresses::Many(v) => (None, v.as_slice()),
        };
        one.into_iter().chain(many.iter().copied())
    }
}

/// [`EndpointKey`], borrowed from the endpoint: what two endpoints of a set are
/// compared by. Missing hostname, namespace and name are empty, as in the hash.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointKeyRef<'a> {
    /// Sorted addresses.
    pub addresses: KeyAddresses<'a>,
    /// Hostname or empty.
    pub hostname: &'a str,
    /// Target namespace or empty.
    pub namespace: &'a str,
    /// Target name or empty.
    pub name: &'a str,
}

/// Something with an endpoint identity: an [`Endpoint`], or a desired endpoint that
/// is turned into one only when it is written.
pub trait Keyed {
    /// The identity.
    fn key(&self) -> EndpointKeyRef<'_>;
}

impl Keyed for Endpoint {
    fn key(&self) -> EndpointKeyRef<'_> {
        let r = self.target_ref.as_ref();
        EndpointKeyRef {
            addresses: KeyAddresses::of(self.addresses.iter().map(String::as_str)),
            hostname: self.hostname.as_deref().unwrap_or(""),
            namespace: r.and_then(|r| r.namespace.as_deref()).unwrap_or(""),
            name: r.and_then(|r| r.name.as_deref()).unwrap_or(""),
        }
    }
}

/// `EndpointsEqualBeyondHash`: the fields the hash leaves out (node, zone, conditions,
/// target reference) are equal.
pub fn endpoints_equal_beyond_hash(a: &Endpoint, b: &Endpoint) -> bool {
    let none = EndpointConditions::default();
    let ca = a.conditions.as_ref().unwrap_or(&none);
    let cb = b.conditions.as_ref().unwrap_or(&none);
    a.node_name == b.node_name
        && a.zone == b.zone
        && ca.ready == cb.ready
        && ca.serving == cb.serving
        && ca.terminating == cb.terminating
        && a.target_ref == b.target_ref
}

/// The hash of a key: its addresses and target name, which tell endpoints apart;
/// hostname and namespace are left to the comparison (equal keys still hash alike).
fn key_hash(key: &EndpointKeyRef<'_>) -> u64 {
    let mut h = FastHasher::default();
    for a in key.addresses.iter() {
        h.write(a.as_bytes());
    }
    h.write(key.name.as_bytes());
    h.finish()
}

/// A fast, non-cryptographic hasher (eight bytes at a time, in the manner of rustc's
/// FxHasher) for short in-process keys; collisions are resolved by comparing keys,
/// so this only has to spread. Each `write` also mixes in the length, so adjacent
/// fields cannot run into each other.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::SEED);
    }
}

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // Spread the high bits into the low ones, which the table indexes by.
        let h = self.0;
        h ^ (h >> 29) ^ (h >> 47)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("eight bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(last));
        }
        self.mix(bytes.len() as u64);
    }
    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// A hasher for keys that are hashes already.
#[derive(Default)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const NO_SLOT: usize = usize::MAX;

#[derive(Debug, Clone)]
struct Slot<T> {
    item: Option<T>,
    /// The previous slot with the same key hash, or [`NO_SLOT`].
    chain: usize,
}

/// An insertion-ordered set of endpoints keyed by their [`EndpointKeyRef`] (upstream's
/// EndpointSet). `pop_any` pops in insertion order, so results are deterministic
/// where upstream's map order is random. Lookups do not allocate.
#[derive(Debug, Clone)]
pub struct EndpointSet<T = Endpoint> {
    slots: Vec<Slot<T>>,
    /// Key hash to the newest slot with that hash.
    index: HashMap<u64, usize, std::hash::BuildHasherDefault<PassThrough>>,
    next: usize,
    len: usize,
}

impl<T> Default for EndpointSet<T> {
    fn default() -> Self {
        EndpointSet {
            slots: Vec::new(),
            index: HashMap::default(),
            next: 0,
            len: 0,
        }
    }
}

impl<T: Keyed> EndpointSet<T> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty set with room for `n` endpoints.
    pub fn with_capacity(n: usize) -> Self {
        EndpointSet {
            slots: Vec::with_capacity(n),
            index: HashMap::with_capacity_and_hasher(n, Default::default()),
            next: 0,
            len: 0,
        }
    }
    fn find(&self, key: &EndpointKeyRef<'_>, hash: u64) -> Option<usize> {
        let mut i = self.index.get(&hash).copied().unwrap_or(NO_SLOT);
        while i != NO_SLOT {
            let slot = &self.slots[i];
            if slot.item.as_ref().is_some_and(|it| it.key() == *key) {
                return Some(i);
            }
            i = slot.chain;
        }
        None
    }
    /// Inserts or replaces (same key) an endpoint.
    pub fn insert(&mut self, ep: T) {
        let (hash, found) = {
            let key = ep.key();
            let hash = key_hash(&key);
            (hash, self.find(&key, hash))
        };
        match found {
            Some(i) => self.slots[i].item = Some(ep),
            None => {
                let i = self.slots.len();
                let chain = self.index.insert(hash, i).unwrap_or(NO_SLOT);
                self.slots.push(Slot {
                    item: Some(ep),
                    chain,
                });
                self.len += 1;
            }
        }
    }
    /// The endpoint with the same key.
    pub fn get(&self, ep: &impl Keyed) -> Option<&T> {
        let key = ep.key();
        let i = self.find(&key, key_hash(&key))?;
        self.slots[i].item.as_ref()
    }
    /// Removes and returns the endpoint with the same key.
    pub fn remove(&mut self, ep: &impl Keyed) -> Option<T> {
        let key = ep.key();
        let i = self.find(&key, key_hash(&key))?;
        self.len -= 1;
        self.slots[i].item.take()
    }
    /// Removes the endpoint with the same key.
    pub fn delete(&mut self, ep: &impl Keyed) {
        self.remove(ep);
    }
    /// Removes and returns the oldest endpoint.
    pub fn pop_any(&mut self) -> Option<T> {
        while self.next < self.slots.len() {
            let i = self.next;
            self.next += 1;
            if let Some(ep) = self.slots[i].item.take() {
                self.len -= 1;
                return Some(ep);
            }
        }
        None
    }
    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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

//! The legacy Endpoints (v1) controller: the Endpoints object a selector Service gets,
//! as upstream's `syncService` writes it, with `RepackSubsets` and the 1000-address
//! truncation.
//!
//! Upstream: <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpoint/endpoints_controller.go>
//! and <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/api/v1/endpoints/util.go>.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::util;

/// Most addresses an Endpoints object holds before it is truncated (maxCapacity).
pub const MAX_CAPACITY: usize = 1000;
/// The value of the over-capacity annotation.
pub const TRUNCATED: &str = "truncated";

/// What the Endpoints controller reads for one Service.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The Service (with a selector; callers filter).
    pub service: &'a Service,
    /// The Pods its selector matches.
    pub pods: &'a [&'a Pod],
    /// The Endpoints of the same name, if any.
    pub current: Option<&'a Endpoints>,
    /// When the change that triggered this sync happened, if known.
    pub trigger_time: Option<&'a Time>,
    /// Most addresses written: [`MAX_CAPACITY`], as upstream. Benchmarks raise it to
    /// count what an Endpoints object holding every address costs.
    pub max_capacity: usize,
}

/// What to write.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Create this object.
    Create(Endpoints),
    /// Replace the existing object with this one.
    Update(Endpoints),
}

/// An address of the Endpoints being computed, borrowed from where it comes from:
/// an address of given subsets, or a Pod. Turned into an [`EndpointAddress`] only
/// when written.
#[derive(Debug, Clone, Copy)]
enum Addr<'a> {
    Given(&'a EndpointAddress),
    Pod {
        pod: &'a Pod,
        ip: &'a str,
        hostname: Option<&'a str>,
    },
}

impl<'a> Addr<'a> {
    /// The identity RepackSubsets merges by: IP and target UID.
    fn key(&self) -> (&'a str, &'a str) {
        match *self {
            Addr::Given(a) => address_key_ref(a),
            Addr::Pod { pod, ip, .. } => (ip, pod.metadata.uid.as_deref().unwrap_or("")),
        }
    }

    fn to_address(self) -> EndpointAddress {
        match self {
            Addr::Given(a) => a.clone(),
            Addr::Pod { pod, ip, hostname } => EndpointAddress {
                ip: ip.to_string(),
                node_name: Some(pod_node_name(pod).to_string()),
                target_ref: Some(util::pod_reference(pod)),
                hostname: hostname.map(str::to_string),
            },
        }
    }

    /// Whether `a` is this address once written, target resource versions aside.
    fn same_as(&self, a: &EndpointAddress) -> bool {
        match *self {
            Addr::Given(g) => addresses_equal_ignoring_version(g, a),
            Addr::Pod { pod, ip, hostname } => {
                let m = &pod.metadata;
                a.ip == ip
                    && a.hostname.as_deref() == hostname
                    && a.node_name.as_deref() == Some(pod_node_name(pod))
                    && a.target_ref.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("Pod")
                            && r.namespace == m.namespace
                            && r.name == m.name
                            && r.uid == m.uid
                            && r.api_version.is_none()
                            && r.field_path.is_none()
                    })
            }
        }
    }
}

fn pod_node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

fn addresses_equal_ignoring_version(a: &EndpointAddress, b: &EndpointAddress) -> bool {
    let refs_equal = match (&a.target_ref, &b.target_ref) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            x.api_version == y.api_version
                && x.field_path == y.field_path
                && x.kind == y.kind
                && x.name == y.name
                && x.namespace == y.namespace
                && x.uid == y.uid
        }
        _ => false,
    };
    a.ip == b.ip && a.hostname == b.hostname && a.node_name == b.node_name && refs_equal
}

/// A Pod's address for the Service's primary family (podToEndpointAddressForService).
fn pod_address<'a>(svc: &Service, pod: &'a Pod) -> Option<Addr<'a>> {
    let spec = svc.spec.as_ref();
    let families = spec.and_then(|s| s.ip_families.as_deref()).unwrap_or(&[]);
    let want_v6 = match families.first() {
        Some(f) => f == "IPv6",
        None if util::service_ip_set(svc) => {
            util::is_ipv6(spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or(""))
        }
        // Headless without families: the family of the Pod's primary IP.
        None => util::pod_ip_strs(pod).next().is_some_and(util::is_ipv6),
    };
    let ip = util::pod_ip_strs(pod).find(|ip| util::is_ipv6(ip) == want_v6)?;
    let hostname = if util::should_set_hostname(pod, svc) {
        pod.spec.as_ref().and_then(|s| s.hostname.as_deref())
    } else {
        None
    };
    Some(Addr::Pod { pod, ip, hostname })
}

/// One (port, address, ready) pair as RepackSubsets sees it; no port stands for
/// "no ports".
type Entry<'a> = (Option<&'a EndpointPort>, Addr<'a>, bool);

/// The ports each Pod resolves for a Service, and the pairs they make, in the order
/// upstream builds its subsets (Pod by Pod, port by port). The ports are made once
/// per distinct (Service port, number) into `ports`, which the pairs then borrow.
fn pod_entries<'a>(
    svc: &Service,
    pods: &[&'a Pod],
    ports: &mut Vec<EndpointPort>,
) -> Vec<(Option<usize>, Addr<'a>, bool)> {
    let publish = util::publish_not_ready(svc);
    let spec = svc.spec.as_ref();
    let service_ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or(&[]);
    let headless =
        !util::service_ip_set(svc) && spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None");
    let mut made: HashMap<(usize, i32), usize> = HashMap::new();
    let mut out = Vec::with_capacity(pods.len() * service_ports.len().max(1));
    for &pod in pods {
        if !util::should_pod_be_in_endpoints(pod, publish) {
            continue;
        }
        let Some(addr) = pod_address(svc, pod) else {
            tracing::debug!(pod = ?pod.metadata.name, "failed to find an endpoint address of the service's family");
            continue;
        };
        let ready = publish || util::is_pod_ready(pod);
        if service_ports.is_empty() {
            // Headless Services may have no ports.
            if headless {
                out.push((None, addr, ready));
            }
            continue;
        }
        for (i, sp) in service_ports.iter().enumerate() {
            let Some(num) = util::find_port(pod, sp) else {
                continue;
            };
            let idx = *made.entry((i, num)).or_insert_with(|| {
                ports.push(EndpointPort {
                    name: sp.name.clone(),
                    port: num,
                    protocol: Some(util::port_protocol(sp)),
                    app_protocol: sp.app_protocol.clone(),
                });
                ports.len() - 1
            });
            out.push((Some(idx), addr, ready));
        }
    }
    out
}

/// The subsets a Service's Pods make, repacked.
pub fn desired_subsets(svc: &Service, pods: &[&Pod]) -> Vec<EndpointSubset> {
    let mut ports = Vec::new();
    let rows = pod_entries(svc, pods, &mut ports);
    let entries: Vec<Entry<'_>> = rows
        .into_iter()
        .map(|(p, a, r)| (p.map(|i| &ports[i]), a, r))
        .collect();
    repack(&entries).into_iter().map(Packed::written).collect()
}

type PortKeyRef<'a> = (&'a str, i32, &'a str, &'a str);

fn port_key_ref(p: &EndpointPort) -> PortKeyRef<'_> {
    (
        p.name.as_deref().unwrap_or(""),
        p.port,
        p.protocol.as_deref().unwrap_or(""),
        p.app_protocol.as_deref().unwrap_or(""),
    )
}

fn address_key_ref(a: &EndpointAddress) -> (&str, &str) {
    (
        a.ip.as_str(),
        a.target_ref
            .as_ref()
            .and_then(|r| r.uid.as_deref())
            .unwrap_or(""),
    )
}

/// The "no ports" port of RepackSubsets.
static NO_PORT: EndpointPort = EndpointPort {
    app_protocol: None,
    name: None,
    port: -1,
    protocol: None,
};

/// A repacked subset, borrowed. `*_set` say whether the list is present (it may be
/// present and empty after truncation, as upstream's).
#[derive(Debug, Clone)]
struct Packed<'a> {
    ports: Vec<&'a EndpointPort>,
    ready: Vec<Addr<'a>>,
    ready_set: bool,
    not_ready: Vec<Addr<'a>>,
    not_ready_set: bool,
}

impl Packed<'_> {
    fn written(self) -> EndpointSubset {
        EndpointSubset {
            addresses: self
                .ready_set
                .then(|| self.ready.into_iter().map(Addr::to_address).collect()),
            not_ready_addresses: self
                .not_ready_set
                .then(|| self.not_ready.into_iter().map(Addr::to_address).collect()),
            ports: Some(self.ports.into_iter().cloned().collect())
                .filter(|v: &Vec<_>| !v.is_empty()),
        }
    }

    /// The order of [`sort_subsets`]: ports, then all addresses.
    fn order(&self, other: &Self) -> Ordering {
        self.ports
            .iter()
            .map(|p| port_key_ref(p))
            .cmp(other.ports.iter().map(|p| port_key_ref(p)))
            .then_with(|| {
                self.ready
                    .iter()
                    .chain(&self.not_ready)
                    .map(Addr::key)
                    .cmp(other.ready.iter().chain(&other.not_ready).map(Addr::key))
            })
    }
}

/// The first 16 bytes of a string as a number that orders as the bytes do (zero
/// padded, so a string orders before its extensions, or ties with them).
fn ip_prefix(s: &str) -> u128 {
    let mut b = [0u8; 16];
    let n = s.len().min(16);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    u128::from_be_bytes(b)
}

/// RepackSubsets over borrowed pairs, sorted as [`sort_subsets`] sorts.
fn repack<'a>(entries: &[Entry<'a>]) -> Vec<Packed<'a>> {
    // Addresses by (ip, uid), first seen wins, numbered in key order. The sort
    // compares a prefix of the IP held inline first, and the full key on a tie.
    let mut sorted: Vec<(u128, u32)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (ip_prefix(e.1.key().0), i as u32))
        .collect();
    sorted.sort_unstable_by(|x, y| {
        x.0.cmp(&y.0)
            .then_with(|| {
                entries[x.1 as usize]
                    .1
                    .key()
                    .cmp(&entries[y.1 as usize].1.key())
            })
            .then(x.1.cmp(&y.1))
    });
    let mut rank = vec![0u32; entries.len()];
    let mut addrs: Vec<Addr<'a>> = Vec::new();
    let mut prev: Option<(u128, (&str, &str))> = None;
    for &(prefix, i) in &sorted {
        let key = entries[i as usize].1.key();
        if prev != Some((prefix, key)) {
            addrs.push(entries[i as usize].1);
            prev = Some((prefix, key));
        }
        rank[i as usize] = (addrs.len() - 1) as u32;
    }
    // Port -> (first port seen, [(address rank, ready)]); the same port object
    // usually comes again, so the last one is tried first.
    let mut by_port: BTreeMap<PortKeyRef<'a>, usize> = BTreeMap::new();
    let mut port_pairs: Vec<(&'a EndpointPort, Vec<(u32, bool)>)> = Vec::new();
    let mut last: Option<(&'a EndpointPort, usize)> = None;
    for (i, &(port, _, ready)) in entries.iter().enumerate() {
        let port = port.unwrap_or(&NO_PORT);
        let slot = match last {
            Some((p, slot)) if std::ptr::eq(p, port) => slot,
            _ => {
                let slot = *by_port.entry(port_key_ref(port)).or_insert_with(|| {
                    port_pairs.push((port, Vec::new()));
                    port_pairs.len() - 1
                });
                last = Some((port, slot));
                slot
            }
        };
        port_pairs[slot].1.push((rank[i], ready));
    }
    // Group ports by the exact set of (address, ready) they map to; an address
    // ready on a port stays ready there.
    let mut groups: BTreeMap<Vec<(u32, bool)>, Vec<&'a EndpointPort>> = BTreeMap::new();
    for slot in by_port.into_values() {
        let port = port_pairs[slot].0;
        let mut pairs = std::mem::take(&mut port_pairs[slot].1);
        pairs.sort_by_key(|p| p.0);
        let mut merged: Vec<(u32, bool)> = Vec::with_capacity(pairs.len());
        for (r, ready) in pairs {
            match merged.last_mut() {
                Some(last) if last.0 == r => last.1 |= ready,
                _ => merged.push((r, ready)),
            }
        }
        let ports = groups.entry(merged).or_default();
        if port.port > 0 {
            ports.push(port);
        }
    }
    let mut out: Vec<Packed<'a>> = groups
        .into_iter()
        .map(|(pairs, ports)| {
            let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
            for (r, is_ready) in pairs {
                let a = addrs[r as usize];
                if is_ready {
                    ready.push(a);
                } else {
                    not_ready.push(a);
                }
            }
            Packed {
                ports,
                ready_set: !ready.is_empty(),
                ready,
                not_ready_set: !not_ready.is_empty(),
                not_ready,
            }
        })
        .collect();
    out.sort_by(Packed::order);
    out
}

/// Canonical subsets (RepackSubsets): every set of addresses gets one subset with
/// all the ports it serves; an address ready on a port stays ready there.
pub fn repack_subsets(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    let mut entries: Vec<Entry<'_>> = Vec::new();
    for subset in subsets {
        let ports: &[EndpointPort] = subset.ports.as_deref().unwrap_or(&[]);
        let ports: Vec<Option<&EndpointPort>> = if ports.is_empty() {
            vec![None]
        } else {
            ports.iter().map(Some).collect()
        };
        for port in ports {
            for (addr, ready) in util::subset_addresses(subset) {
                entries.push((port, Addr::Given(addr), ready));
            }
        }
    }
    repack(&entries).into_iter().map(Packed::written).collect()
}

/// Sorts addresses by IP and UID, ports and subsets by content (SortSubsets; upstream
/// orders ports and subsets by a hash, this order is as stable and readable).
pub fn sort_subsets(subsets: &mut [EndpointSubset]) {
    for s in subsets.iter_mut() {
        if let Some(a) = s.addresses.as_mut() {
            a.sort_by(|x, y| address_key_ref(x).cmp(&address_key_ref(y)));
        }
        if let Some(a) = s.not_ready_addresses.as_mut() {
            a.sort_by(|x, y| address_key_ref(x).cmp(&address_key_ref(y)));
        }
        if let Some(p) = s.ports.as_mut() {
            p.sort_by(|x, y| port_key_ref(x).cmp(&port_key_ref(y)));
        }
    }
    subsets.sort_by(|a, b| {
        let ports = |s| subset_port_keys(s);
        let addrs = |s| subset_address_keys(s);
        ports(a).cmp(ports(b)).then_with(|| addrs(a).cmp(addrs(b)))
    });
}

fn subset_port_keys(s: &EndpointSubset) -> impl Iterator<Item = PortKeyRef<'_>> {
    s.ports.iter().flatten().map(port_key_ref)
}

fn subset_address_keys(s: &EndpointSubset) -> impl Iterator<Item = (&str, &str)> {
    s.addresses
        .iter()
        .flatten()
        .chain(s.not_ready_addresses.iter().flatten())
        .map(address_key_ref)
}

fn sorted_addresses(a: &Option<Vec<EndpointAddress>>) -> Vec<&EndpointAddress> {
    let mut v: Vec<&EndpointAddress> = a.iter().flatten().collect();
    v.sort_by(|x, y| address_key_ref(x).cmp(&address_key_ref(y)));
    v
}

/// A subset of an existing object as the comparison sees it (normalized: empty
/// lists absent, sorted as [`sort_subsets`] sorts), borrowed.
struct View<'c> {
    ports: Vec<&'c EndpointPort>,
    ready: Vec<&'c EndpointAddress>,
    not_ready: Vec<&'c EndpointAddress>,
}

fn views(subsets: &[EndpointSubset]) -> Vec<View<'_>> {
    let mut out: Vec<View<'_>> = subsets
        .iter()
        .map(|s| {
            let mut ports: Vec<&EndpointPort> = s.ports.iter().flatten().collect();
            ports.sort_by(|x, y| port_key_ref(x).cmp(&port_key_ref(y)));
            View {
                ports,
                ready: sorted_addresses(&s.addresses),
                not_ready: sorted_addresses(&s.not_ready_addresses),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        a.ports
            .iter()
            .map(|p| port_key_ref(p))
            .cmp(b.ports.iter().map(|p| port_key_ref(p)))
            .then_with(|| {
                a.ready
                    .iter()
                    .chain(&a.not_ready)
                    .map(|x| address_key_ref(x))
                    .cmp(
                        b.ready
                            .iter()
                            .chain(&b.not_ready)
                            .map(|x| address_key_ref(x)),
                    )
            })
    });
    out
}

/// Whether the subsets to write equal the existing ones, order and target resource
/// versions aside (endpointSubsetsEqualIgnoreResourceVersion over sorted subsets).
/// Whether an Endpoints' labels are those its Service's make: upstream's
/// `labelsCorrectForEndpoints`
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpoint/endpoints_controller.go>):
/// labelled managed-by the Endpoints controller, and every other label but the
/// headless one the Service's, with none of the Service's missing.
fn labels_correct(
    endpoints: Option<&std::collections::BTreeMap<String, String>>,
    service: &std::collections::BTreeMap<String, String>,
) -> bool {
    let empty = Default::default();
    let endpoints = endpoints.unwrap_or(&empty);
    if endpoints
        .get(util::LABEL_ENDPOINTS_MANAGED_BY)
        .map(String::as_str)
        != Some(util::ENDPOINTS_CONTROLLER_NAME)
    {
        return false;
    }
    let mut skipped = 0;
    for (k, v) in endpoints {
        if k == util::LABEL_HEADLESS || k == util::LABEL_ENDPOINTS_MANAGED_BY {
            skipped += 1;
        } else if service.get(k) != Some(v) {
            return false;
        }
    }
    service.len() == endpoints.len() - skipped
}

fn same_subsets(desired: &[Packed<'_>], current: &[EndpointSubset]) -> bool {
    let current = views(current);
    let mut desired: Vec<&Packed<'_>> = desired.iter().collect();
    desired.sort_by(|a, b| a.order(b));
    desired.len() == current.len()
        && desired.iter().zip(&current).all(|(d, c)| {
            let same = |want: &[Addr<'_>], have: &[&EndpointAddress]| {
                want.len() == have.len() && want.iter().zip(have).all(|(w, h)| w.same_as(h))
            };
            d.ports.len() == c.ports.len()
                && d.ports.iter().zip(&c.ports).all(|(a, b)| a == b)
                && same(&d.ready, &c.ready)
                && same(&d.not_ready, &c.not_ready)
        })
}

/// Cuts the repacked subsets to `capacity` addresses ([`MAX_CAPACITY`] upstream),
/// not-ready ones first, each subset keeping its share (truncateEndpoints). Returns
/// whether anything was cut.
fn truncate_packed(subsets: &mut [Packed<'_>], capacity: usize) -> bool {
    let ready: usize = subsets.iter().map(|s| s.ready.len()).sum();
    let not_ready: usize = subsets.iter().map(|s| s.not_ready.len()).sum();
    if ready + not_ready <= capacity {
        return false;
    }
    let truncate_ready = ready > capacity;
    let (max, total) = if truncate_ready {
        (capacity, ready)
    } else {
        (capacity - ready, not_ready)
    };
    let mut can_add = max;
    for s in subsets.iter_mut() {
        let n = if truncate_ready {
            s.ready.len()
        } else {
            s.not_ready.len()
        };
        let share = ((n as f64 / total as f64) * max as f64).ceil() as usize;
        let to_add = share.min(can_add);
        if truncate_ready {
            s.ready.truncate(to_add);
            s.not_ready.clear();
            s.not_ready_set = false;
            can_add -= s.ready.len();
        } else {
            s.not_ready.truncate(to_add);
            can_add -= s.not_ready.len();
        }
    }
    true
}

/// Reconciles the Endpoints of one selector Service; `None` when nothing changes.
/// Only the addresses written are copied out of the Pods.
pub fn reconcile(input: &Input<'_>) -> Option<Change> {
    let svc = input.service;
    let mut ports = Vec::new();
    let rows = pod_entries(svc, input.pods, &mut ports);
    let entries: Vec<Entry<'_>> = rows
        .into_iter()
        .map(|(p, a, r)| (p.map(|i| &ports[i]), a, r))
        .collect();
    let mut subsets = repack(&entries);
    let over = truncate_packed(&mut subsets, input.max_capacity);
    let service_labels = svc.metadata.labels.clone().unwrap_or_default();

    if let Some(current) = input.current {
        // Upstream compares against the untruncated subsets (and checks the
        // over-capacity annotation), so it rewrites an over-capacity object on every
        // sync; comparing with what would be written gives the same object without
        // the repeated writes.
        if same_subsets(&subsets, current.subsets.as_deref().unwrap_or(&[]))
            && labels_correct(current.metadata.labels.as_ref(), &service_labels)
            && current
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(util::ANNOTATION_OVER_CAPACITY))
                == over
        {
            return None;
        }
    }

    let mut new = match input.current {
        Some(c) => Endpoints {
            metadata: c.metadata.clone(),
            subsets: None,
        },
        None => Endpoints {
            metadata: ObjectMeta {
                name: svc.metadata.name.clone(),
                namespace: svc.metadata.namespace.clone(),
                ..Default::default()
            },
            subsets: None,
        },
    };
    let mut annotations = new.metadata.annotations.take().unwrap_or_default();
    match input.trigger_time {
        Some(t) => {
            annotations.insert(util::ANNOTATION_TRIGGER_TIME.into(), util::format_time(t));
        }
        None => {
            annotations.remove(util::ANNOTATION_TRIGGER_TIME);
        }
    }
    if over {
        annotations.insert(util::ANNOTATION_OVER_CAPACITY.into(), TRUNCATED.into());
    } else {
        annotations.remove(util::ANNOTATION_OVER_CAPACITY);
    }
    new.metadata.annotations = Some(annotations).filter(|a| !a.is_empty());
    let mut labels = service_labels;
    if util::service_ip_set(svc) {
        labels.remove(util::LABEL_HEADLESS);
    } else {
        labels.insert(util::LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(
        util::LABEL_ENDPOINTS_MANAGED_BY.into(),
        util::ENDPOINTS_CONTROLLER_NAME.into(),
    );
    new.metadata.labels = Some(labels);
    let subsets: Vec<EndpointSubset> = subsets.into_iter().map(Packed::written).collect();
    new.subsets = Some(subsets).filter(|s| !s.is_empty());
    Some(match input.current {
        Some(_) => Change::Update(new),
        None => Change::Create(new),
    })
}

/// Names of Endpoints to delete because their Service is gone (checkLeftoverEndpoints
/// and the Service delete handler); leader-election records are left alone.
pub fn leftovers<'a>(
    endpoints: impl IntoIterator<Item = &'a Endpoints>,
    service_exists: impl Fn(&str, &str) -> bool,
) -> Vec<&'a Endpoints> {
    let mut seen = BTreeSet::new();
    endpoints
        .into_iter()
        .filter(|e| {
            let ns = e.metadata.namespace.as_deref().unwrap_or("default");
            let name = e.metadata.name.as_deref().unwrap_or("");
            !service_exists(ns, name)
                && !e
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(util::ANNOTATION_LEADER))
                && seen.insert((ns.to_string(), name.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests;

//! The legacy Endpoints (v1) controller: the Endpoints object a selector Service gets,
//! as upstream's `syncService` writes it, with `RepackSubsets` and the 1000-address
//! truncation.
//!
//! Upstream: <https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/endpoint/endpoints_controller.go>
//! and <https://github.com/kubernetes/kubernetes/blob/master/pkg/api/v1/endpoints/util.go>.

use std::collections::{BTreeMap, BTreeSet};

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
}

/// What to write.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Create this object.
    Create(Endpoints),
    /// Replace the existing object with this one.
    Update(Endpoints),
}

/// A Pod's address for the Service's primary family (podToEndpointAddressForService).
fn pod_address(svc: &Service, pod: &Pod) -> Option<EndpointAddress> {
    let spec = svc.spec.as_ref();
    let families = spec.and_then(|s| s.ip_families.as_deref()).unwrap_or(&[]);
    let want_v6 = match families.first() {
        Some(f) => f == "IPv6",
        None if util::service_ip_set(svc) => {
            util::is_ipv6(spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or(""))
        }
        // Headless without families: the family of the Pod's primary IP.
        None => util::pod_ips(pod)
            .first()
            .is_some_and(|ip| util::is_ipv6(ip)),
    };
    let ip = util::pod_ips(pod)
        .into_iter()
        .find(|ip| util::is_ipv6(ip) == want_v6)?;
    Some(EndpointAddress {
        ip,
        node_name: Some(
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
        ),
        target_ref: Some(util::pod_reference(pod)),
        hostname: None,
    })
}

/// The subsets a Service's Pods make, repacked.
pub fn desired_subsets(svc: &Service, pods: &[&Pod]) -> Vec<EndpointSubset> {
    let publish = util::publish_not_ready(svc);
    let spec = svc.spec.as_ref();
    let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or(&[]);
    let headless =
        !util::service_ip_set(svc) && spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None");
    let mut subsets = Vec::new();
    for pod in pods {
        if !util::should_pod_be_in_endpoints(pod, publish) {
            continue;
        }
        let Some(mut addr) = pod_address(svc, pod) else {
            tracing::debug!(pod = ?pod.metadata.name, "failed to find an endpoint address of the service's family");
            continue;
        };
        if util::should_set_hostname(pod, svc) {
            addr.hostname = pod.spec.as_ref().and_then(|s| s.hostname.clone());
        }
        let ready = publish || util::is_pod_ready(pod);
        let mut add = |port: Option<EndpointPort>| {
            let (addresses, not_ready) = if ready {
                (Some(vec![addr.clone()]), None)
            } else {
                (None, Some(vec![addr.clone()]))
            };
            subsets.push(EndpointSubset {
                addresses,
                not_ready_addresses: not_ready,
                ports: port.map(|p| vec![p]),
            });
        };
        if ports.is_empty() {
            // Headless Services may have no ports.
            if headless {
                add(None);
            }
            continue;
        }
        for sp in ports {
            let Some(num) = util::find_port(pod, sp) else {
                continue;
            };
            add(Some(EndpointPort {
                name: sp.name.clone(),
                port: num,
                protocol: Some(util::port_protocol(sp)),
                app_protocol: sp.app_protocol.clone(),
            }));
        }
    }
    repack_subsets(&subsets)
}

type PortKey = (String, i32, String, String);
/// An address by (IP, target UID).
type AddressKey = (String, String);
/// Addresses with their readiness, by port.
type AddressesByPort = BTreeMap<PortKey, (EndpointPort, BTreeMap<AddressKey, bool>)>;
/// Ports by the exact set of (address, ready) they serve.
type PortsByAddresses = BTreeMap<Vec<(AddressKey, bool)>, Vec<EndpointPort>>;

fn port_key(p: &EndpointPort) -> PortKey {
    (
        p.name.clone().unwrap_or_default(),
        p.port,
        p.protocol.clone().unwrap_or_default(),
        p.app_protocol.clone().unwrap_or_default(),
    )
}

fn address_key(a: &EndpointAddress) -> (String, String) {
    (
        a.ip.clone(),
        a.target_ref
            .as_ref()
            .and_then(|r| r.uid.clone())
            .unwrap_or_default(),
    )
}

/// Canonical subsets (RepackSubsets): every set of addresses gets one subset with
/// all the ports it serves; an address ready on a port stays ready there.
pub fn repack_subsets(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    // Addresses by (ip, uid), first seen wins.
    let mut all: BTreeMap<(String, String), EndpointAddress> = BTreeMap::new();
    // Port -> address -> ready. The sentinel port -1 stands for "no ports".
    let mut by_port: AddressesByPort = BTreeMap::new();
    let sentinel = EndpointPort {
        port: -1,
        ..Default::default()
    };
    for subset in subsets {
        let ports: Vec<&EndpointPort> = match subset.ports.as_deref() {
            Some(p) if !p.is_empty() => p.iter().collect(),
            _ => vec![&sentinel],
        };
        for port in ports {
            let addrs = subset.addresses.iter().flatten().map(|a| (a, true)).chain(
                subset
                    .not_ready_addresses
                    .iter()
                    .flatten()
                    .map(|a| (a, false)),
            );
            for (addr, ready) in addrs {
                let key = address_key(addr);
                all.entry(key.clone()).or_insert_with(|| addr.clone());
                let entry = by_port
                    .entry(port_key(port))
                    .or_insert_with(|| (port.clone(), BTreeMap::new()));
                let was = entry.1.entry(key).or_insert(ready);
                if !*was {
                    *was = ready;
                }
            }
        }
    }
    // Group ports by the exact set of (address, ready) they map to.
    let mut groups: PortsByAddresses = BTreeMap::new();
    for (port, addrs) in by_port.into_values() {
        let key: Vec<_> = addrs.into_iter().collect();
        let ports = groups.entry(key).or_default();
        if port.port > 0 {
            ports.push(port);
        }
    }
    let mut out: Vec<EndpointSubset> = groups
        .into_iter()
        .map(|(addrs, ports)| {
            let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
            for (key, is_ready) in addrs {
                let a = all[&key].clone();
                if is_ready {
                    ready.push(a);
                } else {
                    not_ready.push(a);
                }
            }
            EndpointSubset {
                addresses: Some(ready).filter(|v| !v.is_empty()),
                not_ready_addresses: Some(not_ready).filter(|v| !v.is_empty()),
                ports: Some(ports).filter(|v| !v.is_empty()),
            }
        })
        .collect();
    sort_subsets(&mut out);
    out
}

/// Sorts addresses by IP and UID, ports and subsets by content (SortSubsets; upstream
/// orders ports and subsets by a hash, this order is as stable and readable).
pub fn sort_subsets(subsets: &mut [EndpointSubset]) {
    for s in subsets.iter_mut() {
        if let Some(a) = s.addresses.as_mut() {
            a.sort_by_key(address_key);
        }
        if let Some(a) = s.not_ready_addresses.as_mut() {
            a.sort_by_key(address_key);
        }
        if let Some(p) = s.ports.as_mut() {
            p.sort_by_key(port_key);
        }
    }
    subsets.sort_by_key(|s| {
        (
            s.ports.iter().flatten().map(port_key).collect::<Vec<_>>(),
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
                .map(address_key)
                .collect::<Vec<_>>(),
        )
    });
}

fn normalized(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    let mut s: Vec<EndpointSubset> = subsets
        .iter()
        .map(|s| EndpointSubset {
            addresses: s.addresses.clone().filter(|v| !v.is_empty()),
            not_ready_addresses: s.not_ready_addresses.clone().filter(|v| !v.is_empty()),
            ports: s.ports.clone().filter(|v| !v.is_empty()),
        })
        .map(|mut s| {
            // Ignore target resource versions (endpointSubsetsEqualIgnoreResourceVersion).
            for a in s
                .addresses
                .iter_mut()
                .flatten()
                .chain(s.not_ready_addresses.iter_mut().flatten())
            {
                if let Some(r) = a.target_ref.as_mut() {
                    r.resource_version = None;
                }
            }
            s
        })
        .collect();
    sort_subsets(&mut s);
    s
}

/// Cuts the subsets to [`MAX_CAPACITY`] addresses, not-ready ones first, each subset
/// keeping its share (truncateEndpoints). Returns whether anything was cut.
pub fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let ready: usize = subsets
        .iter()
        .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
        .sum();
    let not_ready: usize = subsets
        .iter()
        .map(|s| s.not_ready_addresses.as_ref().map_or(0, Vec::len))
        .sum();
    if ready + not_ready <= MAX_CAPACITY {
        return false;
    }
    let truncate_ready = ready > MAX_CAPACITY;
    let (max, total) = if truncate_ready {
        (MAX_CAPACITY, ready)
    } else {
        (MAX_CAPACITY - ready, not_ready)
    };
    let mut can_add = max;
    for s in subsets.iter_mut() {
        let n = if truncate_ready {
            s.addresses.as_ref().map_or(0, Vec::len)
        } else {
            s.not_ready_addresses.as_ref().map_or(0, Vec::len)
        };
        let share = ((n as f64 / total as f64) * max as f64).ceil() as usize;
        let to_add = share.min(can_add);
        if truncate_ready {
            if let Some(a) = s.addresses.as_mut() {
                a.truncate(to_add);
            }
            s.not_ready_addresses = None;
            can_add -= s.addresses.as_ref().map_or(0, Vec::len);
        } else {
            if let Some(a) = s.not_ready_addresses.as_mut() {
                a.truncate(to_add);
            }
            can_add -= s.not_ready_addresses.as_ref().map_or(0, Vec::len);
        }
    }
    true
}

/// Reconciles the Endpoints of one selector Service; `None` when nothing changes.
pub fn reconcile(input: &Input<'_>) -> Option<Change> {
    let svc = input.service;
    let mut subsets = desired_subsets(svc, input.pods);
    let service_labels = svc.metadata.labels.clone().unwrap_or_default();
    let mut truncated_desired = subsets.clone();
    let over = truncate(&mut truncated_desired);

    if let Some(current) = input.current {
        let mut compare_labels = current.metadata.labels.clone().unwrap_or_default();
        compare_labels.remove(util::LABEL_HEADLESS);
        let current_subsets = normalized(current.subsets.as_deref().unwrap_or(&[]));
        // Upstream compares against the untruncated subsets (and checks the
        // over-capacity annotation), so it rewrites an over-capacity object on every
        // sync; comparing with what would be written gives the same object without
        // the repeated writes.
        if current_subsets == normalized(&truncated_desired)
            && compare_labels == service_labels
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
        Some(c) => c.clone(),
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
    if truncate(&mut subsets) {
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
    new.metadata.labels = Some(labels).filter(|l| !l.is_empty());
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

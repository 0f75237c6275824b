//! EndpointSlice mirroring: slices for Services without a selector, copied from the
//! Endpoints written by hand (one slice per subset and address family).
//!
//! Upstream: <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslicemirroring/reconciler.go>,
//! `reconciler_helpers.go` and `utils.go` next to it, and `syncEndpoints` in
//! `endpointslicemirroring_controller.go`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::endpoints::repack_subsets;
use crate::events::Warning;
use crate::util::{self, EndpointSet, PortMapKey};

/// Upstream's default `--mirroring-max-endpoints-per-subset`.
pub const MAX_ENDPOINTS_PER_SUBSET: usize = 1000;

/// Options of the mirroring reconciler.
#[derive(Debug, Clone)]
pub struct Options {
    /// Most addresses mirrored per subset.
    pub max_endpoints_per_subset: usize,
    /// The managed-by label value written on mirrored slices.
    pub controller_name: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_endpoints_per_subset: MAX_ENDPOINTS_PER_SUBSET,
            controller_name: util::MIRRORING_CONTROLLER_NAME.into(),
        }
    }
}

/// The mirrored slices to write for one Endpoints object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MirrorPlan {
    /// Slices to create.
    pub create: Vec<EndpointSlice>,
    /// Slices to update.
    pub update: Vec<EndpointSlice>,
    /// Slices to delete.
    pub delete: Vec<EndpointSlice>,
    /// Warnings (invalid or too many addresses), reported as events.
    pub warnings: Vec<Warning>,
}

/// Whether Endpoints are mirrored at all (shouldMirror): not labelled
/// `endpointslice.kubernetes.io/skip-mirror: "true"`, not a leader-election record.
pub fn should_mirror(endpoints: &Endpoints) -> bool {
    let skip = endpoints
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(util::LABEL_SKIP_MIRROR))
        .is_some_and(|v| v == "true");
    let leader = endpoints
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(util::ANNOTATION_LEADER));
    !skip && !leader
}

/// Reconciles the mirrored slices of one name (syncEndpoints + reconcile). `service`
/// and `endpoints` are those of that name, `existing` the slices labelled for it and
/// managed by the mirroring controller.
pub fn reconcile(
    service: Option<&Service>,
    endpoints: Option<&Endpoints>,
    existing: &[EndpointSlice],
    opts: &Options,
) -> MirrorPlan {
    let delete_all = || MirrorPlan {
        delete: existing.to_vec(),
        ..Default::default()
    };
    let (Some(svc), Some(eps)) = (service, endpoints) else {
        return delete_all();
    };
    if !should_mirror(eps)
        || svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some()
    {
        return delete_all();
    }
    reconcile_endpoints(eps, existing, opts)
}

type Key = (&'static str, PortMapKey);

/// Upstream's reconciler.reconcile for Endpoints that are mirrored.
pub fn reconcile_endpoints(
    eps: &Endpoints,
    existing: &[EndpointSlice],
    opts: &Options,
) -> MirrorPlan {
    let mut warnings = Vec::new();
    let mut desired: BTreeMap<Key, (Vec<EndpointPort>, EndpointSet)> = BTreeMap::new();
    let mut invalid = 0usize;
    let mut skipped = 0usize;
    for subset in repack_subsets(eps.subsets.as_deref().unwrap_or(&[])) {
        let ports: Vec<EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: Some(p.protocol.clone().unwrap_or_default()),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        let pkey = util::port_map_key(&ports);
        for t in [util::IPV4, util::IPV6] {
            desired
                .entry((t, pkey.clone()))
                .or_insert_with(|| (ports.clone(), EndpointSet::new()));
        }
        let total = subset.addresses.as_ref().map_or(0, Vec::len)
            + subset.not_ready_addresses.as_ref().map_or(0, Vec::len);
        let mut added = 0usize;
        for (addr, ready) in util::subset_addresses(&subset) {
            if added >= opts.max_endpoints_per_subset {
                break;
            }
            match util::address_type_of(&addr.ip) {
                Some(t) => {
                    let set = &mut desired.get_mut(&(t, pkey.clone())).expect("initialized").1;
                    set.insert(address_to_endpoint(addr, ready));
                    added += 1;
                }
                None => {
                    invalid += 1;
                    tracing::info!(ip = %addr.ip, endpoints = ?eps.metadata.name, "address in Endpoints is not a valid IP, it will not be mirrored to an EndpointSlice");
                }
            }
        }
        skipped += total - added;
    }
    if invalid > 0 {
        warnings.push(Warning::new(
            "InvalidIPAddress",
            format!("Skipped {invalid} invalid IP addresses when mirroring to EndpointSlices"),
        ));
    }
    if skipped > invalid {
        warnings.push(Warning::new(
            "TooManyAddressesToMirror",
            format!(
                "A max of {} addresses can be mirrored to EndpointSlices per Endpoints subset. {skipped} addresses were skipped",
                opts.max_endpoints_per_subset
            ),
        ));
    }

    let mut existing_by_key: BTreeMap<(String, PortMapKey), Vec<EndpointSlice>> = BTreeMap::new();
    for s in existing {
        existing_by_key
            .entry((
                s.address_type.clone(),
                util::port_map_key(s.ports.as_deref().unwrap_or(&[])),
            ))
            .or_default()
            .push(s.clone());
    }

    let mut plan = MirrorPlan {
        warnings,
        ..Default::default()
    };
    for ((t, pkey), (ports, set)) in desired.iter_mut() {
        let current = existing_by_key
            .get(&(t.to_string(), pkey.clone()))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        by_port_mapping(eps, current, std::mem::take(set), ports, t, opts, &mut plan);
    }
    for ((t, pkey), slices) in &existing_by_key {
        let known = desired.keys().any(|(dt, dk)| dt == t && dk == pkey);
        if !known {
            plan.delete.extend(slices.iter().cloned());
        }
    }
    recycle(&mut plan);
    if eps.metadata.deletion_timestamp.is_some() {
        plan.create.clear();
    }
    plan
}

/// An Endpoints address as an EndpointSlice endpoint, its IP written again in
/// canonical form as upstream's `addressToEndpoint` does (Go's `net.IP.String`:
/// RFC 5952 for IPv6, an IPv4-mapped address as IPv4, leading zeros gone)
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslicemirroring/utils.go>).
fn address_to_endpoint(addr: &EndpointAddress, ready: bool) -> Endpoint {
    let ip = match util::parse_ip(&addr.ip) {
        Some(std::net::IpAddr::V6(v6)) => v6
            .to_ipv4_mapped()
            .map_or_else(|| v6.to_string(), |v4| v4.to_string()),
        Some(ip) => ip.to_string(),
        None => addr.ip.clone(),
    };
    Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            ..Default::default()
        }),
        target_ref: addr.target_ref.clone(),
        node_name: addr.node_name.clone(),
        hostname: addr.hostname.clone().filter(|h| !h.is_empty()),
        ..Default::default()
    }
}

fn mirrored_annotations(eps: &Endpoints) -> BTreeMap<String, String> {
    let mut a = eps.metadata.annotations.clone().unwrap_or_default();
    a.remove(util::ANNOTATION_TRIGGER_TIME);
    a.remove(util::ANNOTATION_LAST_APPLIED);
    a
}

/// A mirrored slice (newEndpointSlice of the mirroring controller): owned by the
/// Endpoints, with its labels and annotations.
pub fn new_slice(
    eps: &Endpoints,
    ports: &[EndpointPort],
    address_type: &str,
    name: Option<String>,
    controller_name: &str,
) -> EndpointSlice {
    let ep_name = eps.metadata.name.clone().unwrap_or_default();
    let mut labels = eps.metadata.labels.clone().unwrap_or_default();
    labels.insert(util::LABEL_SERVICE_NAME.into(), ep_name.clone());
    labels.insert(util::LABEL_MANAGED_BY.into(), controller_name.into());
    let annotations = mirrored_annotations(eps);
    let generate_name = name.is_none().then(|| util::slice_prefix(&ep_name));
    EndpointSlice {
        metadata: ObjectMeta {
            name,
            generate_name,
            namespace: eps.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations).filter(|a| !a.is_empty()),
            owner_references: Some(vec![util::controller_ref(
                "Endpoints",
                &ep_name,
                eps.metadata.uid.as_deref().unwrap_or(""),
            )]),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints: Vec::new(),
        ports: Some(ports.to_vec()),
    }
}

/// One slice per subset and family (reconcileByPortMapping of the mirroring
/// reconciler): the first existing slice is rewritten if anything differs, the rest
/// are deleted.
fn by_port_mapping(
    eps: &Endpoints,
    existing: &[EndpointSlice],
    mut desired: EndpointSet,
    ports: &[EndpointPort],
    address_type: &str,
    opts: &Options,
    plan: &mut MirrorPlan,
) {
    // No endpoints of this family and ports: the existing slices go (upstream's
    // reconcileByPortMapping). An Endpoints that keeps only IPv6 addresses leaves no
    // empty IPv4 slice behind.
    if desired.is_empty() {
        plan.delete.extend(existing.iter().cloned());
        return;
    }
    if let Some(first) = existing.first() {
        plan.delete.extend(existing[1..].iter().cloned());
        let mut compare_labels = first.metadata.labels.clone().unwrap_or_default();
        compare_labels.remove(util::LABEL_MANAGED_BY);
        compare_labels.remove(util::LABEL_SERVICE_NAME);
        let (mut removed, mut updated, mut matches) = (0, 0, 0);
        for ep in &first.endpoints {
            match desired.get(ep) {
                None => removed += 1,
                Some(want) => {
                    matches += 1;
                    if !util::endpoints_equal_beyond_hash(want, ep) {
                        updated += 1;
                    }
                }
            }
        }
        let added = desired.len() - matches;
        if added == 0
            && updated == 0
            && removed == 0
            && eps.metadata.labels.clone().unwrap_or_default() == compare_labels
            && mirrored_annotations(eps) == first.metadata.annotations.clone().unwrap_or_default()
        {
            return;
        }
    }
    let name = existing.first().and_then(|s| s.metadata.name.clone());
    let mut slice = new_slice(eps, ports, address_type, name, &opts.controller_name);
    while slice.endpoints.len() < opts.max_endpoints_per_subset {
        let Some(ep) = desired.pop_any() else { break };
        slice.endpoints.push(ep);
    }
    if slice.metadata.name.is_some() {
        plan.update.push(slice);
    } else {
        plan.create.push(slice);
    }
}

/// Replaces creates by updates of slices of the same address type that would be
/// deleted (recycleSlices).
fn recycle(plan: &mut MirrorPlan) {
    let mut i = plan.delete.len();
    while i > 0 {
        i -= 1;
        let t = plan.delete[i].address_type.clone();
        if let Some(pos) = plan
            .create
            .iter()
            .position(|c| c.address_type == t && c.metadata.name.is_none())
        {
            let old = plan.delete.remove(i);
            let mut slice = plan.create[pos].clone();
            slice.metadata.name = old.metadata.name;
            plan.create[pos].metadata.name = Some(String::new());
            plan.update.push(slice);
        }
    }
    plan.create.retain(|c| c.metadata.name.is_none());
}

#[cfg(test)]
mod tests;

//! The whole compile at once: every Service and EndpointSlice in, every frontend out.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::claims::{conflict_messages, Claim, ClaimOrder};
use super::service::{compile_service, GroupKey, ServiceOut};
use super::slices::{classify_slice, merge_slice, EndpointsKey, PortEndpoints};
use super::{Compiled, FrontendKey, Options};
use crate::model::{ServiceInfo, SliceInfo};

/// Compiles Services and EndpointSlices into frontends.
pub fn compile(services: &[Service], slices: &[EndpointSlice], opts: &Options) -> Compiled {
    let services: Vec<ServiceInfo> = services.iter().map(ServiceInfo::from).collect();
    let slices: Vec<SliceInfo> = slices.iter().map(SliceInfo::from).collect();
    compile_model(&services, &slices, opts)
}

/// [`compile`] over the agent's model of the objects.
pub fn compile_model(services: &[ServiceInfo], slices: &[SliceInfo], opts: &Options) -> Compiled {
    let mut out = Compiled::default();
    let mut slices: Vec<&SliceInfo> = slices.iter().collect();
    slices.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut endpoints: HashMap<EndpointsKey, PortEndpoints> = HashMap::new();
    // A slice defined more than once (a manifest directory may): only its last
    // definition gives endpoints, as `kubectl apply -f` of the directory leaves it (the
    // sort above is stable); each still says what is wrong with it.
    for (i, slice) in slices.iter().enumerate() {
        let last = slices
            .get(i + 1)
            .is_none_or(|next| (&next.namespace, &next.name) != (&slice.namespace, &slice.name));
        if let Some(key) = classify_slice(slice, opts, &mut out.ignored, &mut out.skipped) {
            let mut shadowed = PortEndpoints::default();
            let into = if last {
                endpoints.entry(key).or_default()
            } else {
                &mut shadowed
            };
            merge_slice(slice, opts, into, &mut out.skipped);
        }
    }

    let mut services: Vec<&ServiceInfo> = services.iter().collect();
    services.sort_by(|a, b| group_of(a).cmp(&group_of(b)));
    let mut compiled = ServiceOut::default();
    // Every claim with its place: (order, group, index in the group).
    let mut claims: Vec<(ClaimOrder, GroupKey, u32, Claim)> = Vec::new();
    // The Services of a group are consecutive (sorted above): the index in the group
    // runs on until the group changes.
    let mut place: (GroupKey, u32) = Default::default();
    // A Service defined more than once (a manifest directory may): its last
    // definition, as `kubectl apply -f` of the directory leaves it (the sort above is
    // stable).
    let last = |i: usize| {
        services
            .get(i + 1)
            .is_none_or(|next| group_of(next) != group_of(services[i]))
    };
    let services: Vec<&ServiceInfo> = (0..services.len())
        .filter(|i| last(*i))
        .map(|i| services[i])
        .collect();
    for svc in services {
        let group = (
            svc.namespace.clone().unwrap_or_default(),
            svc.name.clone().unwrap_or_default(),
        );
        if place.0 != group {
            place = (group.clone(), 0);
        }
        compile_service(svc, &endpoints, opts, &mut compiled);
        for (key, hc) in compiled.health_checks.drain(..) {
            out.health_checks.entry(key).or_insert(hc);
        }
        for claim in compiled.claims.drain(..) {
            claims.push((claim.order.clone(), group.clone(), place.1, claim));
            place.1 += 1;
        }
    }
    claims.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
    let mut by_key: BTreeMap<FrontendKey, Vec<&Claim>> = BTreeMap::new();
    for (_, _, _, claim) in &claims {
        by_key.entry(claim.key).or_default().push(claim);
    }
    for (key, who) in by_key {
        out.skipped.extend(conflict_messages(&key, &who));
        out.insert(key, who[0].frontend.clone());
    }
    out.skipped.append(&mut compiled.skipped);
    out.ignored.add(&compiled.ignored);
    out.skipped.sort();
    out
}

/// The compile order of Services: namespace and name, empty when unset.
fn group_of(svc: &ServiceInfo) -> (&str, &str) {
    (
        svc.namespace.as_deref().unwrap_or_default(),
        svc.name.as_deref().unwrap_or_default(),
    )
}

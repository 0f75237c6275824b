//! Topology hints on EndpointSlice endpoints.
//!
//! Two sources, as upstream: `spec.trafficDistribution` (`PreferClose` and
//! `PreferSameZone` hint each endpoint to its own zone, `PreferSameNode` also to its
//! node; anything else removes hints), from
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/endpointslice/trafficdist/trafficdist.go>,
//! and the `service.kubernetes.io/topology-mode: Auto` annotation, which spreads
//! endpoints over zones in proportion to the zones' allocatable CPU, from
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/endpointslice/topologycache/topologycache.go>
//! and `utils.go` next to it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice, ForNode, ForZone};

use conventions::labels::{LABEL_NODE_ROLE_CONTROL_PLANE, LABEL_NODE_ROLE_MASTER};

use crate::events::Warning;

pub use conventions::labels::{ANNOTATION_TOPOLOGY_AWARE_HINTS, ANNOTATION_TOPOLOGY_MODE};
/// A zone may receive up to this fraction more endpoints than its CPU share.
const OVERLOAD_THRESHOLD: f64 = 0.2;

/// Whether the Service asks for `Auto` hints (hintsEnabled).
pub fn hints_enabled(svc: &Service) -> bool {
    let annotations = svc.metadata.annotations.as_ref();
    let value = annotations
        .and_then(|a| a.get(ANNOTATION_TOPOLOGY_MODE))
        .or_else(|| annotations.and_then(|a| a.get(ANNOTATION_TOPOLOGY_AWARE_HINTS)));
    matches!(value.map(String::as_str), Some("Auto" | "auto"))
}

/// The share of allocatable CPU per zone, from ready worker Nodes (SetNodes);
/// `None` when any such Node lacks a zone or CPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopologyInfo {
    /// CPU ratio per zone; `None` when the Node information is insufficient.
    pub cpu_ratios: Option<BTreeMap<String, f64>>,
}

/// Parses a CPU quantity into millicores; `None` when it is not a quantity.
pub fn cpu_millis(q: &str) -> Option<i64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let value: f64 = num.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "n" => 1e-9,
        "u" => 1e-6,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        s if s.starts_with('e') || s.starts_with('E') => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some((value * factor * 1000.0).ceil() as i64)
}

impl TopologyInfo {
    /// Computes zone CPU ratios from the Nodes.
    pub fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Self {
        let mut by_zone: BTreeMap<String, i64> = BTreeMap::new();
        let mut total = 0i64;
        for node in nodes {
            let labels = node.metadata.labels.as_ref();
            if labels.is_some_and(|l| {
                l.contains_key(LABEL_NODE_ROLE_CONTROL_PLANE)
                    || l.contains_key(LABEL_NODE_ROLE_MASTER)
            }) {
                continue;
            }
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            if !ready {
                continue;
            }
            let cpu = node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get("cpu"))
                .and_then(|q| cpu_millis(&q.0))
                .unwrap_or(0);
            let zone = labels
                .and_then(|l| l.get(crate::util::LABEL_ZONE))
                .cloned()
                .unwrap_or_default();
            if zone.is_empty() || cpu == 0 {
                tracing::warn!(node = ?node.metadata.name, "can't get CPU or zone information for node");
                return TopologyInfo { cpu_ratios: None };
            }
            total += cpu;
            *by_zone.entry(zone).or_default() += cpu;
        }
        if total == 0 || by_zone.is_empty() {
            return TopologyInfo { cpu_ratios: None };
        }
        TopologyInfo {
            cpu_ratios: Some(
                by_zone
                    .into_iter()
                    .map(|(z, c)| (z, c as f64 / total as f64))
                    .collect(),
            ),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Allocation {
    minimum: usize,
    maximum: usize,
    desired: f64,
}

fn endpoint_ready(ep: &Endpoint) -> bool {
    ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
}

fn zone_hint(zone: &str) -> EndpointHints {
    EndpointHints {
        for_zones: Some(vec![ForZone { name: zone.into() }]),
        for_nodes: None,
    }
}

/// Which sources of hints are honoured (the reconciler's options say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HintSources {
    /// `service.kubernetes.io/topology-mode: Auto` (upstream: the topology cache
    /// exists).
    pub topology_mode: bool,
    /// `spec.trafficDistribution` (upstream: the ServiceTrafficDistribution gate).
    pub traffic_distribution: bool,
}

/// Sets or removes hints on the slices being written, moving (copies of) unchanged
/// slices whose hints must change into `update`. Returns events to report.
pub fn reconcile_hints(
    svc: &Service,
    topo: Option<&TopologyInfo>,
    opts: HintSources,
    create: &mut [EndpointSlice],
    update: &mut Vec<EndpointSlice>,
    unchanged: Vec<&EndpointSlice>,
) -> Vec<Warning> {
    let annotation = hints_enabled(svc);
    let use_traffic_distribution = opts.traffic_distribution && !annotation;
    let mut events = Vec::new();
    let mut unchanged = unchanged;
    if opts.topology_mode && annotation {
        match add_hints(topo, create, update, &mut unchanged) {
            Ok(()) => {}
            Err(reason) => {
                events.push(Warning::new("TopologyAwareHintsDisabled", reason));
                remove_hints(create, update, &mut unchanged);
            }
        }
    } else if !use_traffic_distribution {
        remove_hints(create, update, &mut unchanged);
    }
    if use_traffic_distribution {
        let td = svc
            .spec
            .as_ref()
            .and_then(|s| s.traffic_distribution.as_deref());
        // As v1.37.2's `trafficdist` `ReconcileHints`
        // (<https://github.com/kubernetes/endpointslice/blob/v0.37.2/trafficdist/trafficdist.go>):
        // under PreferClose, PreferSameZone and PreferSameNode a ready endpoint gets
        // its zone's hint (and its node's under PreferSameNode), or none when it has
        // neither; an endpoint that is not ready (`ready: true` only counts there) is
        // left as it is. Any other value removes every hint. Issue 46.
        let close = matches!(
            td,
            Some("PreferClose" | "PreferSameZone" | "PreferSameNode")
        );
        let node_hints = td == Some("PreferSameNode");
        let skips =
            |ep: &Endpoint| close && ep.conditions.as_ref().and_then(|c| c.ready) != Some(true);
        let want = |ep: &Endpoint| -> Option<EndpointHints> {
            let zones = close
                .then(|| ep.zone.as_ref().map(|z| vec![ForZone { name: z.clone() }]))
                .flatten();
            let nodes = node_hints
                .then(|| {
                    ep.node_name
                        .as_ref()
                        .map(|n| vec![ForNode { name: n.clone() }])
                })
                .flatten();
            (zones.is_some() || nodes.is_some()).then_some(EndpointHints {
                for_zones: zones,
                for_nodes: nodes,
            })
        };
        // Upstream's `needsUpdate`: a hint missing, wrong or stale.
        let stale = |ep: &Endpoint| -> bool {
            if skips(ep) {
                return false;
            }
            let hints = ep.hints.as_ref();
            if !close {
                return hints.is_some();
            }
            let zones = hints.and_then(|h| h.for_zones.as_deref()).unwrap_or(&[]);
            let nodes = hints.and_then(|h| h.for_nodes.as_deref()).unwrap_or(&[]);
            let zone_wrong = match &ep.zone {
                Some(z) => zones.len() != 1 || zones[0].name != *z,
                None => !zones.is_empty(),
            };
            let node_wrong = match ep.node_name.as_ref().filter(|_| node_hints) {
                Some(n) => nodes.len() != 1 || nodes[0].name != *n,
                None => !nodes.is_empty(),
            };
            zone_wrong || node_wrong
        };
        let apply = |slice: &mut EndpointSlice| {
            for ep in &mut slice.endpoints {
                if !skips(ep) {
                    ep.hints = want(ep);
                }
            }
        };
        for slice in create.iter_mut() {
            apply(slice);
        }
        for slice in update.iter_mut() {
            apply(slice);
        }
        for slice in unchanged {
            if slice.endpoints.iter().any(stale) {
                let mut slice = slice.clone();
                apply(&mut slice);
                update.push(slice);
            }
        }
    }
    events
}

/// Removes hints from everything written; unchanged slices carrying hints are
/// updated (RemoveHintsFromSlices).
fn remove_hints(
    create: &mut [EndpointSlice],
    update: &mut Vec<EndpointSlice>,
    unchanged: &mut Vec<&EndpointSlice>,
) {
    for slice in create.iter_mut().chain(update.iter_mut()) {
        for ep in &mut slice.endpoints {
            ep.hints = None;
        }
    }
    for slice in std::mem::take(unchanged) {
        if slice.endpoints.iter().any(|e| e.hints.is_some()) {
            let mut slice = slice.clone();
            for ep in &mut slice.endpoints {
                ep.hints = None;
            }
            update.push(slice);
        } else {
            unchanged.push(slice);
        }
    }
}

fn allocations(
    topo: Option<&TopologyInfo>,
    endpoints: usize,
) -> Result<BTreeMap<String, Allocation>, String> {
    let Some(ratios) = topo.and_then(|t| t.cpu_ratios.as_ref()) else {
        return Err("insufficient Node information: allocatable CPU or zone not specified on one or more nodes".into());
    };
    if ratios.len() < 2 {
        return Err("all nodes are in one zone".into());
    }
    if ratios.len() > endpoints {
        return Err("insufficient number of endpoints".into());
    }
    let mut remaining = endpoints as i64;
    let mut min_total = 0;
    let mut out = BTreeMap::new();
    for (zone, ratio) in ratios {
        let desired = ratio * endpoints as f64;
        let minimum = (desired * (1.0 / (1.0 + OVERLOAD_THRESHOLD))).ceil() as usize;
        out.insert(
            zone.clone(),
            Allocation {
                minimum,
                maximum: 0,
                desired: desired.max(minimum as f64),
            },
        );
        min_total += minimum;
        remaining -= minimum as i64;
        if remaining < 0 {
            return Err("unable to allocate minimum endpoints to each zone without exceeding overload threshold".into());
        }
    }
    for a in out.values_mut() {
        a.maximum = a.minimum + endpoints - min_total;
    }
    Ok(out)
}

/// Hints by zone of an unchanged slice if they are all usable (getHintsByZone).
fn hints_by_zone(
    slice: &EndpointSlice,
    allocated: &BTreeMap<String, usize>,
    allocations: &BTreeMap<String, Allocation>,
) -> Option<BTreeMap<String, usize>> {
    let mut by_zone: BTreeMap<String, usize> = BTreeMap::new();
    for ep in &slice.endpoints {
        if !endpoint_ready(ep) {
            continue;
        }
        let zones = ep.hints.as_ref()?.for_zones.as_ref()?;
        if zones.len() != 1 {
            return None;
        }
        let zone = &zones[0].name;
        allocations.get(zone)?;
        *by_zone.entry(zone.clone()).or_default() += 1;
    }
    for (zone, n) in &by_zone {
        if allocated.get(zone).copied().unwrap_or(0) + n > allocations[zone].maximum {
            return None;
        }
    }
    Some(by_zone)
}

/// The zone with the largest value; ties broken by name.
fn most(map: &BTreeMap<String, f64>) -> Option<(String, f64)> {
    let mut best: Option<(String, f64)> = None;
    for (k, v) in map {
        if best.as_ref().is_none_or(|(_, b)| *v > *b) {
            best = Some((k.clone(), *v));
        }
    }
    best
}

/// Upstream's AddHints for `topology-mode: Auto`.
fn add_hints(
    topo: Option<&TopologyInfo>,
    create: &mut [EndpointSlice],
    update: &mut Vec<EndpointSlice>,
    unchanged: &mut Vec<&EndpointSlice>,
) -> Result<(), String> {
    let ready = create
        .iter()
        .chain(update.iter())
        .chain(unchanged.iter().copied())
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| endpoint_ready(e))
        .count();
    let allocs = allocations(topo, ready)?;

    // Hints already in unchanged slices count; slices whose hints are unusable
    // are rewritten (getAllocatedHintsByZone).
    let mut allocated: BTreeMap<String, usize> = BTreeMap::new();
    let mut keep = Vec::new();
    for slice in std::mem::take(unchanged) {
        match hints_by_zone(slice, &allocated, &allocs) {
            Some(by_zone) => {
                for (z, n) in by_zone {
                    *allocated.entry(z).or_default() += n;
                }
                keep.push(slice);
            }
            None => update.push(slice.clone()),
        }
    }
    *unchanged = keep;

    // 1. Same-zone hints for every ready endpoint.
    for slice in create.iter_mut().chain(update.iter_mut()) {
        for ep in &mut slice.endpoints {
            if !endpoint_ready(ep) {
                ep.hints = None;
                continue;
            }
            let Some(zone) = ep.zone.clone().filter(|z| !z.is_empty()) else {
                return Err("one or more endpoints do not have a zone specified".into());
            };
            *allocated.entry(zone.clone()).or_default() += 1;
            ep.hints = Some(zone_hint(&zone));
        }
    }

    // 2. Which zones give and which receive (getGivingAndReceivingZones).
    let mut giving_desired = BTreeMap::new();
    let mut receiving_desired = BTreeMap::new();
    for (zone, a) in &allocs {
        let have = allocated.get(zone).copied().unwrap_or(0) as f64;
        if have > a.desired {
            giving_desired.insert(zone.clone(), have - a.desired);
        } else if have < a.desired {
            receiving_desired.insert(zone.clone(), a.desired - have);
        }
    }
    let mut giving: BTreeMap<String, usize> = BTreeMap::new();
    let mut receiving: BTreeMap<String, usize> = BTreeMap::new();
    while let (Some((gz, give)), Some((rz, receive))) =
        (most(&giving_desired), most(&receiving_desired))
    {
        if (give < 1.0 && receive < 1.0) || give < 0.5 || receive < 0.5 {
            break;
        }
        *giving.entry(gz.clone()).or_default() += 1;
        *giving_desired.get_mut(&gz).expect("zone") -= 1.0;
        *receiving.entry(rz.clone()).or_default() += 1;
        *receiving_desired.get_mut(&rz).expect("zone") -= 1.0;
    }

    // 3. Redistribute (redistributeHints).
    'outer: for slice in create.iter_mut().chain(update.iter_mut()) {
        for ep in &mut slice.endpoints {
            if !endpoint_ready(ep) {
                continue;
            }
            if giving.is_empty() || receiving.is_empty() {
                break 'outer;
            }
            let Some(zone) = ep.zone.clone() else {
                continue;
            };
            if giving.get(&zone).copied().unwrap_or(0) == 0 {
                continue;
            }
            let Some(target) = receiving
                .iter()
                .find(|(_, n)| **n > 0)
                .map(|(z, _)| z.clone())
            else {
                continue;
            };
            ep.hints = Some(zone_hint(&target));
            let g = giving.get_mut(&zone).expect("zone");
            *g -= 1;
            if *g == 0 {
                giving.remove(&zone);
            }
            let r = receiving.get_mut(&target).expect("zone");
            *r -= 1;
            if *r == 0 {
                receiving.remove(&target);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cases of upstream's `TestReconcileHints`
    /// (<https://github.com/kubernetes/endpointslice/blob/v0.37.2/trafficdist/trafficdist_test.go>),
    /// issue 46.
    mod traffic_distribution {
        use super::super::*;

        fn svc(td: &str) -> Service {
            Service {
                spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                    traffic_distribution: Some(td.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }

        fn ep(
            ip: &str,
            zone: Option<&str>,
            node: &str,
            ready: bool,
            hint: Option<&str>,
        ) -> Endpoint {
            Endpoint {
                addresses: vec![ip.into()],
                zone: zone.map(Into::into),
                node_name: Some(node.into()),
                conditions: Some(k8s_openapi::api::discovery::v1::EndpointConditions {
                    ready: Some(ready),
                    ..Default::default()
                }),
                hints: hint.map(zone_hint),
                ..Default::default()
            }
        }

        fn slice(endpoints: Vec<Endpoint>) -> EndpointSlice {
            EndpointSlice {
                endpoints,
                ..Default::default()
            }
        }

        const OPTS: HintSources = HintSources {
            topology_mode: false,
            traffic_distribution: true,
        };

        /// Reconciles and returns (create, update, how many unchanged slices moved).
        fn run(
            td: &str,
            mut create: Vec<EndpointSlice>,
            mut update: Vec<EndpointSlice>,
            unchanged: &[EndpointSlice],
        ) -> (Vec<EndpointSlice>, Vec<EndpointSlice>) {
            let unchanged = unchanged.iter().collect();
            reconcile_hints(&svc(td), None, OPTS, &mut create, &mut update, unchanged);
            (create, update)
        }

        #[test]
        fn should_correct_incorrect_hints_with_prefer_close() {
            let (_, update) = run(
                "PreferClose",
                vec![],
                vec![slice(vec![ep(
                    "10.0.0.1",
                    Some("zone-a"),
                    "node-1",
                    true,
                    Some("zone-b"),
                )])],
                &[
                    slice(vec![ep(
                        "10.0.0.2",
                        Some("zone-b"),
                        "node-2",
                        true,
                        Some("zone-c"),
                    )]),
                    slice(vec![ep("10.0.0.3", Some("zone-c"), "node-3", true, None)]),
                ],
            );
            let want = vec![
                slice(vec![ep(
                    "10.0.0.1",
                    Some("zone-a"),
                    "node-1",
                    true,
                    Some("zone-a"),
                )]),
                slice(vec![ep(
                    "10.0.0.2",
                    Some("zone-b"),
                    "node-2",
                    true,
                    Some("zone-b"),
                )]),
                slice(vec![ep(
                    "10.0.0.3",
                    Some("zone-c"),
                    "node-3",
                    true,
                    Some("zone-c"),
                )]),
            ];
            assert_eq!(update, want);
        }

        #[test]
        fn unready_endpoints_should_not_trigger_updates() {
            let unready = slice(vec![ep("10.0.0.2", Some("zone-b"), "node-2", false, None)]);
            let (_, update) = run(
                "PreferClose",
                vec![],
                vec![],
                std::slice::from_ref(&unready),
            );
            assert!(update.is_empty(), "{update:?}");
            // Nor are they hinted in a slice being written.
            let (create, _) = run("PreferClose", vec![unready.clone()], vec![], &[]);
            assert_eq!(create, [unready]);
        }

        #[test]
        fn should_not_create_hints_with_prefer_close_if_there_are_no_zones() {
            let zoneless = slice(vec![ep("10.0.0.1", None, "node-1", true, None)]);
            let (create, _) = run("PreferClose", vec![zoneless.clone()], vec![], &[]);
            assert_eq!(create, std::slice::from_ref(&zoneless));
            // A zone hint left on a ready endpoint without a zone is stale: removed.
            let old = slice(vec![ep("10.0.0.1", None, "node-1", true, Some("zone-a"))]);
            let (_, update) = run("PreferClose", vec![], vec![], &[old]);
            assert_eq!(update, [zoneless]);
        }

        #[test]
        fn should_set_zone_and_node_hints_with_prefer_same_node() {
            let (create, _) = run(
                "PreferSameNode",
                vec![slice(vec![ep(
                    "10.0.0.1",
                    Some("zone-a"),
                    "node-1",
                    true,
                    None,
                )])],
                vec![],
                &[],
            );
            let hints = create[0].endpoints[0].hints.clone().unwrap();
            assert_eq!(hints.for_zones.unwrap()[0].name, "zone-a");
            assert_eq!(hints.for_nodes.unwrap()[0].name, "node-1");
        }

        #[test]
        fn should_remove_hints_when_traffic_distribution_is_unrecognized() {
            let hinted = slice(vec![
                ep("10.0.0.1", Some("zone-a"), "node-1", true, Some("zone-a")),
                ep("10.0.0.2", Some("zone-b"), "node-2", false, Some("zone-b")),
            ]);
            let (_, update) = run("Unknown", vec![], vec![], &[hinted]);
            assert_eq!(update.len(), 1);
            assert!(update[0].endpoints.iter().all(|e| e.hints.is_none()));
        }
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(cpu_millis("4"), Some(4000));
        assert_eq!(cpu_millis("3500m"), Some(3500));
        assert_eq!(cpu_millis("1.5"), Some(1500));
        assert_eq!(cpu_millis("x"), None);
    }

    #[test]
    fn allocations_follow_cpu() {
        let topo = TopologyInfo {
            cpu_ratios: Some(BTreeMap::from([("a".into(), 0.5), ("b".into(), 0.5)])),
        };
        let a = allocations(Some(&topo), 10).unwrap();
        assert_eq!(a["a"].minimum, 5);
        assert_eq!(a["a"].maximum, 5);
        assert!(allocations(Some(&topo), 1).is_err());
        assert!(allocations(None, 10).is_err());
    }
}

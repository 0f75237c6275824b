//! Tests of the EndpointSlice reconciler, after upstream's reconciler_test.go
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/endpointslice/reconciler_test.go>).
//! Slice sizes are compared as unordered multisets where upstream's choice is random.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;
use crate::fixtures::*;
use crate::util;

fn run(svc: &Service, pods: &[Pod], existing: &[EndpointSlice], max: usize) -> SlicePlan {
    run_with(svc, pods, &nodes(), existing, max, None)
}

fn run_with(
    svc: &Service,
    pods: &[Pod],
    nodes: &BTreeMap<String, std::sync::Arc<Node>>,
    existing: &[EndpointSlice],
    max: usize,
    trigger: Option<&Time>,
) -> SlicePlan {
    let refs: Vec<&Pod> = pods.iter().collect();
    let existing: Vec<&EndpointSlice> = existing.iter().collect();
    let existing = existing.as_slice();
    let topo = crate::topology::TopologyInfo::from_nodes(nodes.values().map(|n| &**n));
    let input = Input {
        service: svc,
        pods: &refs,
        nodes,
        existing,
        trigger_time: trigger,
        topology: Some(&topo),
    };
    let opts = Options {
        max_endpoints_per_slice: max,
        ..Default::default()
    };
    reconcile(&input, &opts)
}

fn sizes(slices: &[EndpointSlice]) -> Vec<usize> {
    let mut v: Vec<usize> = slices.iter().map(|s| s.endpoints.len()).collect();
    v.sort_unstable();
    v
}

fn pods(n: usize) -> Vec<Pod> {
    (0..n).map(pod).collect()
}

/// Applies a plan to a list of slices, naming creates `new-<i>`.
fn applied(existing: &[EndpointSlice], plan: &SlicePlan) -> Vec<EndpointSlice> {
    let mut by_name: BTreeMap<String, EndpointSlice> = existing
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap(), s.clone()))
        .collect();
    for s in &plan.delete {
        by_name.remove(s.metadata.name.as_deref().unwrap());
    }
    for s in &plan.update {
        by_name.insert(s.metadata.name.clone().unwrap(), s.clone());
    }
    for (i, s) in plan.create.iter().enumerate() {
        let mut s = s.clone();
        s.metadata.name = Some(format!("new-{i}"));
        by_name.insert(format!("new-{i}"), s);
    }
    by_name.into_values().collect()
}

#[test]
fn reconcile_empty_creates_placeholder() {
    // TestReconcileEmpty
    let plan = run(&service(), &[], &[], 100);
    assert_eq!(plan.create.len(), 1);
    let s = &plan.create[0];
    assert!(s.endpoints.is_empty());
    assert_eq!(s.ports.as_deref(), Some(&[][..]));
    assert_eq!(s.address_type, "IPv4");
    assert_eq!(s.metadata.generate_name.as_deref(), Some("foo-"));
    let labels = s.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[util::LABEL_SERVICE_NAME], "foo");
    assert_eq!(labels[util::LABEL_MANAGED_BY], util::CONTROLLER_NAME);
    assert!(!labels.contains_key(util::LABEL_HEADLESS));
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Service", SVC_UID)
    );
    assert_eq!(owner.controller, Some(true));
}

#[test]
fn reconcile_keeps_equal_placeholder() {
    // TestReconcile1EndpointSlice: an existing placeholder is kept as it is.
    let mut existing = slice("foo-abc", []);
    existing.ports = Some(vec![]);
    let plan = run(&service(), &[], &[existing.clone()], 100);
    assert!(plan.is_empty(), "{plan:?}");

    // A placeholder with other labels is replaced, recycled into an update.
    existing
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("foo".into(), "bar".into());
    let plan = run(&service(), &[], &[existing], 100);
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(plan.update.len(), 1);
    assert_eq!(plan.update[0].metadata.name.as_deref(), Some("foo-abc"));
}

#[test]
fn reconcile_one_pod_fields() {
    // TestReconcile1Pod (IPv4 variant).
    let mut svc = service();
    svc.metadata.labels = Some(BTreeMap::from([("team".into(), "a".into())]));
    let plan = run(&svc, &[pod(1)], &[], 100);
    assert_eq!(plan.create.len(), 1);
    let s = &plan.create[0];
    assert_eq!(s.metadata.labels.as_ref().unwrap()["team"], "a");
    let ports = s.ports.as_ref().unwrap();
    assert_eq!(ports[0].port, Some(8080));
    assert_eq!(ports[0].name.as_deref(), Some("http"));
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    let ep = &s.endpoints[0];
    assert_eq!(ep.addresses, vec!["10.0.0.1"]);
    let c = ep.conditions.as_ref().unwrap();
    assert_eq!(
        (c.ready, c.serving, c.terminating),
        (Some(true), Some(true), Some(false))
    );
    assert_eq!(ep.node_name.as_deref(), Some("node-1"));
    assert_eq!(ep.zone.as_deref(), Some("zone-a"));
    let r = ep.target_ref.as_ref().unwrap();
    assert_eq!(
        (r.kind.as_deref(), r.name.as_deref(), r.uid.as_deref()),
        (Some("Pod"), Some("pod1"), Some("pod-uid-1"))
    );
    assert!(ep.hostname.is_none());
}

#[test]
fn reconcile_many_pods() {
    // TestReconcileManyPods: 250 pods -> 100, 100, 50.
    let plan = run(&service(), &pods(250), &[], 100);
    assert_eq!(sizes(&plan.create), vec![50, 100, 100]);
    assert!(plan.update.is_empty() && plan.delete.is_empty());
}

#[test]
fn reconcile_some_preexisting() {
    // TestReconcileEndpointSlicesSomePreexisting: two slices with about a quarter
    // of the endpoints each are kept; the rest fills one new slice and then the
    // unchanged slice it fits best.
    let a = slice("a", (1..246).step_by(4));
    let b = slice("b", (3..246).step_by(4));
    let existing = vec![a, b];
    let plan = run(&service(), &pods(250), &existing, 100);
    assert_eq!(plan.create.len(), 1);
    assert_eq!(plan.update.len(), 1);
    assert!(plan.delete.is_empty());
    assert_eq!(sizes(&applied(&existing, &plan)), vec![61, 89, 100]);
}

#[test]
fn reconcile_updates_fill_first() {
    // Endpoints removed from a slice make it an update; new endpoints fill it
    // before any new slice is made.
    let existing = vec![slice("a", 0..100), slice("b", 100..150)];
    let mut ps = pods(160);
    ps.remove(120); // pod120 gone: slice b is updated
    let plan = run(&service(), &ps, &existing, 100);
    assert!(plan.create.is_empty());
    assert_eq!(plan.update.len(), 1);
    assert_eq!(plan.update[0].metadata.name.as_deref(), Some("b"));
    assert_eq!(plan.update[0].endpoints.len(), 59);
}

#[test]
fn reconcile_recycles_on_port_change() {
    // TestReconcileEndpointSlicesRecycling: 10 slices of 30 for a port that is no
    // longer desired; 3 new slices of 100 recycle 3 of them, 7 are deleted.
    let existing: Vec<EndpointSlice> = (0..10)
        .map(|i| slice(&format!("s{i}"), i * 30..(i + 1) * 30))
        .collect();
    let mut svc = service();
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].target_port =
        Some(IntOrString::Int(8081));
    let plan = run(&svc, &pods(300), &existing, 100);
    assert!(plan.create.is_empty());
    assert_eq!(plan.update.len(), 3);
    assert_eq!(plan.delete.len(), 7);
    assert_eq!(sizes(&plan.update), vec![100, 100, 100]);
}

#[test]
fn reconcile_unchanged_is_noop() {
    let existing = vec![slice("a", 0..100), slice("b", 100..150)];
    let plan = run(&service(), &pods(150), &existing, 100);
    assert!(plan.is_empty(), "{plan:?}");
}

#[test]
fn reconcile_best_fit_unchanged_slice() {
    // getSliceToFill: 5 new endpoints go to the unchanged slice with the least
    // room that still fits them.
    let existing = vec![slice("a", 0..90), slice("b", 90..180), slice("c", 180..275)];
    let plan = run(&service(), &pods(280), &existing, 100);
    assert!(plan.create.is_empty());
    assert_eq!(plan.update.len(), 1);
    assert_eq!(plan.update[0].metadata.name.as_deref(), Some("c"));
    assert_eq!(plan.update[0].endpoints.len(), 100);
}

#[test]
fn reconcile_prefers_new_slice_when_nothing_fits() {
    let existing = vec![slice("a", 0..95), slice("b", 95..190)];
    let plan = run(&service(), &pods(200), &existing, 100);
    assert_eq!(plan.create.len(), 1);
    assert_eq!(plan.create[0].endpoints.len(), 10);
    assert!(plan.update.is_empty());
}

#[test]
fn reconcile_max_endpoints_per_slice() {
    for max in [1usize, 7, 1000] {
        let plan = run(&service(), &pods(20), &[], max);
        let expect: usize = 20usize.div_ceil(max);
        assert_eq!(plan.create.len(), expect, "max {max}");
        assert!(plan.create.iter().all(|s| s.endpoints.len() <= max));
    }
    assert!(Options {
        max_endpoints_per_slice: 0,
        ..Default::default()
    }
    .validate()
    .is_err());
    assert!(Options {
        max_endpoints_per_slice: 1001,
        ..Default::default()
    }
    .validate()
    .is_err());
}

#[test]
fn reconcile_ready_change_updates_in_place() {
    let existing = vec![slice("a", 0..3)];
    let mut ps = pods(3);
    ps[1] = pod_with(1, false, "10.0.0.1");
    let plan = run(&service(), &ps, &existing, 100);
    assert_eq!(plan.update.len(), 1);
    let c = plan.update[0].endpoints[1].conditions.clone().unwrap();
    assert_eq!((c.ready, c.serving), (Some(false), Some(false)));
}

#[test]
fn reconcile_replaces_unsupported_address_type() {
    // Slices of the deprecated `IP` type are deleted, not recycled.
    let mut old = slice("old", 0..3);
    old.address_type = "IP".into();
    // Issue 46: the front door lets such a stored slice through to be replaced.
    assert_eq!(conventions::validate::stored(&old), Ok(()));
    let plan = run(&service(), &pods(3), &[old], 100);
    assert_eq!(plan.create.len(), 1);
    assert_eq!(plan.create[0].address_type, "IPv4");
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].address_type, "IP");
}

#[test]
fn reconcile_dual_stack() {
    let mut svc = service();
    svc.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let ps = vec![
        pod_with(1, true, "10.0.0.1,fd00::1"),
        pod_with(2, true, "10.0.0.2"),
    ];
    let plan = run(&svc, &ps, &[], 100);
    let mut types: Vec<(String, usize)> = plan
        .create
        .iter()
        .map(|s| (s.address_type.clone(), s.endpoints.len()))
        .collect();
    types.sort();
    assert_eq!(types, vec![("IPv4".into(), 2), ("IPv6".into(), 1)]);
}

#[test]
fn reconcile_headless_without_families_uses_both() {
    let mut svc = service();
    let spec = svc.spec.as_mut().unwrap();
    spec.cluster_ip = Some("None".into());
    spec.ip_families = None;
    spec.ports = None;
    let plan = run(&svc, &pods(2), &[], 100);
    let types: Vec<&str> = plan
        .create
        .iter()
        .map(|s| s.address_type.as_str())
        .collect();
    assert_eq!(types, vec!["IPv4", "IPv6"]);
    // IPv6 has no endpoints: a placeholder.
    assert!(plan.create[1].endpoints.is_empty());
    assert_eq!(plan.create[0].endpoints.len(), 2);
    // Headless Services without ports publish endpoints without ports.
    assert_eq!(plan.create[0].ports.as_deref(), Some(&[][..]));
    assert_eq!(
        plan.create[0].metadata.labels.as_ref().unwrap()[util::LABEL_HEADLESS],
        ""
    );
}

#[test]
fn reconcile_named_port_resolving_differently_splits_slices() {
    let mut svc = service();
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].target_port =
        Some(IntOrString::String("http".into()));
    let mut ps = pods(4);
    for p in ps.iter_mut().skip(2) {
        p.spec.as_mut().unwrap().containers[0]
            .ports
            .as_mut()
            .unwrap()[0]
            .container_port = 9090;
    }
    let plan = run(&svc, &ps, &[], 100);
    let mut ports: Vec<(i32, usize)> = plan
        .create
        .iter()
        .map(|s| {
            (
                s.ports.as_ref().unwrap()[0].port.unwrap(),
                s.endpoints.len(),
            )
        })
        .collect();
    ports.sort();
    assert_eq!(ports, vec![(8080, 2), (9090, 2)]);
}

#[test]
fn reconcile_pod_on_unknown_node() {
    // Skipped and retried, unless publishNotReadyAddresses.
    let mut ps = pods(2);
    ps[1].spec.as_mut().unwrap().node_name = Some("ghost".into());
    let plan = run(&service(), &ps, &[], 100);
    assert_eq!(plan.create[0].endpoints.len(), 1);
    assert_eq!(plan.retry.len(), 1);

    let mut svc = service();
    svc.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
    let plan = run(&svc, &ps, &[], 100);
    assert_eq!(plan.create[0].endpoints.len(), 2);
    assert!(plan.retry.is_empty());
    let ghost = &plan.create[0].endpoints[1];
    assert_eq!(ghost.zone, None);
    assert_eq!(ghost.node_name.as_deref(), Some("ghost"));
}

#[test]
fn reconcile_terminating_and_terminal_pods() {
    let mut ps = pods(4);
    ps[1].metadata.deletion_timestamp = Some(time(1));
    ps[2].status.as_mut().unwrap().phase = Some("Failed".into());
    ps[3].status.as_mut().unwrap().pod_ips = None;
    ps[3].status.as_mut().unwrap().pod_ip = None;
    let plan = run(&service(), &ps, &[], 100);
    let eps = &plan.create[0].endpoints;
    assert_eq!(eps.len(), 2);
    let c = eps[1].conditions.clone().unwrap();
    assert_eq!(
        (c.ready, c.serving, c.terminating),
        (Some(false), Some(true), Some(true))
    );

    let mut svc = service();
    svc.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
    let plan = run(&svc, &ps, &[], 100);
    let c = plan.create[0].endpoints[1].conditions.clone().unwrap();
    assert_eq!(c.ready, Some(true));
}

#[test]
fn reconcile_deletes_slices_not_owned() {
    let mut stranger = slice("stranger", 0..2);
    stranger.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
    let plan = run(&service(), &pods(2), &[stranger], 100);
    // Not recycled: it belongs to another Service of the same name.
    assert_eq!(plan.create.len(), 1);
    assert_eq!(plan.delete.len(), 1);
}

#[test]
fn reconcile_label_change_updates() {
    let existing = vec![slice("a", 0..2)];
    let mut svc = service();
    svc.metadata.labels = Some(BTreeMap::from([("tier".into(), "web".into())]));
    let plan = run(&svc, &pods(2), &existing, 100);
    assert_eq!(plan.update.len(), 1);
    assert_eq!(
        plan.update[0].metadata.labels.as_ref().unwrap()["tier"],
        "web"
    );
    assert_eq!(plan.update[0].endpoints.len(), 2);
}

#[test]
fn reconcile_trigger_time_annotation() {
    let t = time(1_700_000_123);
    let plan = run_with(&service(), &pods(1), &nodes(), &[], 100, Some(&t));
    let a = plan.create[0].metadata.annotations.as_ref().unwrap();
    assert_eq!(a[util::ANNOTATION_TRIGGER_TIME], "2023-11-14T22:15:23Z");
    // Without a trigger time the annotation is cleared.
    let mut existing = plan.create[0].clone();
    existing.metadata.name = Some("a".into());
    let mut ps = pods(2);
    ps.truncate(2);
    let plan = run(&service(), &ps, &[existing], 100);
    assert!(plan.update[0].metadata.annotations.is_none());
}

#[test]
fn reconcile_hostname_rules() {
    let mut svc = service();
    svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let mut p = pod(1);
    let spec = p.spec.as_mut().unwrap();
    spec.hostname = Some("h1".into());
    spec.subdomain = Some("foo".into());
    let plan = run(&svc, &[p.clone()], &[], 100);
    assert_eq!(plan.create[0].endpoints[0].hostname.as_deref(), Some("h1"));
    p.spec.as_mut().unwrap().subdomain = Some("bar".into());
    let plan = run(&svc, &[p], &[], 100);
    assert_eq!(plan.create[0].endpoints[0].hostname, None);
}

#[test]
fn reconcile_service_being_deleted_creates_nothing() {
    let mut svc = service();
    svc.metadata.deletion_timestamp = Some(time(5));
    let plan = run(&svc, &pods(3), &[], 100);
    assert!(plan.create.is_empty());
}

#[test]
fn traffic_distribution_prefer_close() {
    let mut svc = service();
    svc.spec.as_mut().unwrap().traffic_distribution = Some("PreferClose".into());
    let plan = run(&svc, &pods(2), &[], 100);
    for ep in &plan.create[0].endpoints {
        let zones = ep.hints.as_ref().unwrap().for_zones.as_ref().unwrap();
        assert_eq!(zones[0].name, "zone-a");
    }
    // Dropping trafficDistribution removes the hints of unchanged slices.
    let mut existing = plan.create[0].clone();
    existing.metadata.name = Some("a".into());
    let plan = run(&service(), &pods(2), &[existing], 100);
    assert_eq!(plan.update.len(), 1);
    assert!(plan.update[0].endpoints.iter().all(|e| e.hints.is_none()));
}

#[test]
fn topology_mode_auto_spreads_by_cpu() {
    let mut svc = service();
    svc.metadata.annotations = Some(BTreeMap::from([(
        crate::topology::ANNOTATION_TOPOLOGY_MODE.into(),
        "Auto".into(),
    )]));
    let nodes = BTreeMap::from([
        ("node-1".to_string(), node("node-1", "zone-a", "4").into()),
        ("node-2".to_string(), node("node-2", "zone-b", "4").into()),
    ]);
    // All 4 endpoints in zone-a; zone-b has half the CPU and gets 2 by hints.
    let plan = run_with(&svc, &pods(4), &nodes, &[], 100, None);
    let mut by_zone: BTreeMap<String, usize> = BTreeMap::new();
    for ep in &plan.create[0].endpoints {
        let z = &ep.hints.as_ref().unwrap().for_zones.as_ref().unwrap()[0].name;
        *by_zone.entry(z.clone()).or_default() += 1;
    }
    assert_eq!(
        by_zone,
        BTreeMap::from([("zone-a".into(), 2), ("zone-b".into(), 2)])
    );

    // One zone only: no hints, and an event says why.
    let plan = run(&svc, &pods(4), &[], 100);
    assert!(plan.create[0].endpoints.iter().all(|e| e.hints.is_none()));
    assert_eq!(plan.events.len(), 1);
}

//! Tests of the Endpoints controller, after upstream's endpoints_controller_test.go
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpoint/endpoints_controller_test.go>)
//! and RepackSubsets' tests in pkg/api/v1/endpoints/util_test.go.

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Pod};

use super::*;
use crate::fixtures::*;

fn run(svc: &Service, pods: &[Pod], current: Option<&Endpoints>) -> Option<Change> {
    let refs: Vec<&Pod> = pods.iter().collect();
    reconcile(&Input {
        service: svc,
        pods: &refs,
        current,
        trigger_time: None,
        max_capacity: MAX_CAPACITY,
    })
}

fn created(c: Option<Change>) -> Endpoints {
    match c {
        Some(Change::Create(e)) => e,
        other => panic!("expected a create, got {other:?}"),
    }
}

fn addr(ip: &str) -> EndpointAddress {
    EndpointAddress {
        ip: ip.into(),
        ..Default::default()
    }
}

fn port(name: &str, p: i32) -> EndpointPort {
    EndpointPort {
        name: Some(name.into()),
        port: p,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

#[test]
fn sync_ready_and_not_ready() {
    // TestSyncEndpointsItemsPreexisting / ...NotReady: ready Pods in addresses,
    // not-ready ones in notReadyAddresses, one subset.
    let ps = vec![pod(1), pod_with(2, false, "10.0.0.2")];
    let e = created(run(&service(), &ps, None));
    assert_eq!(e.metadata.name.as_deref(), Some("foo"));
    let subsets = e.subsets.unwrap();
    assert_eq!(subsets.len(), 1);
    let s = &subsets[0];
    assert_eq!(s.addresses.as_ref().unwrap()[0].ip, "10.0.0.1");
    assert_eq!(s.not_ready_addresses.as_ref().unwrap()[0].ip, "10.0.0.2");
    assert_eq!(s.ports.as_ref().unwrap()[0].port, 8080);
    let a = &s.addresses.as_ref().unwrap()[0];
    assert_eq!(a.node_name.as_deref(), Some("node-1"));
    assert_eq!(a.target_ref.as_ref().unwrap().name.as_deref(), Some("pod1"));
}

#[test]
fn sync_publish_not_ready_and_terminating() {
    let mut ps = vec![pod_with(1, false, "10.0.0.1"), pod(2)];
    ps[1].metadata.deletion_timestamp = Some(time(1));
    // Terminating Pods are left out unless publishNotReadyAddresses.
    let e = created(run(&service(), &ps, None));
    assert_eq!(e.subsets.as_ref().unwrap()[0].addresses, None);
    let mut svc = service();
    svc.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
    let e = created(run(&svc, &ps, None));
    assert_eq!(e.subsets.unwrap()[0].addresses.as_ref().unwrap().len(), 2);
}

#[test]
fn sync_unchanged_is_noop_and_labels_update() {
    let ps = vec![pod(1), pod(2)];
    let e = created(run(&service(), &ps, None));
    assert!(run(&service(), &ps, Some(&e)).is_none());
    let mut svc = service();
    svc.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    match run(&svc, &ps, Some(&e)) {
        Some(Change::Update(u)) => assert_eq!(u.metadata.labels.unwrap()["a"], "b"),
        other => panic!("{other:?}"),
    }
}

/// Upstream v1.37.2's Endpoints carry `endpoints.kubernetes.io/managed-by:
/// endpoint-controller`, and Endpoints without it are written again
/// (`labelsCorrectForEndpoints`; TestSyncEndpointsItemsPreexistingLabelsChange).
#[test]
fn written_endpoints_are_labelled_managed_by_the_endpoints_controller() {
    let ps = vec![pod(1)];
    let mut svc = service();
    svc.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    let e = created(run(&svc, &ps, None));
    let want: std::collections::BTreeMap<String, String> = [
        ("a".to_string(), "b".to_string()),
        (
            "endpoints.kubernetes.io/managed-by".to_string(),
            "endpoint-controller".to_string(),
        ),
    ]
    .into();
    assert_eq!(e.metadata.labels.as_ref(), Some(&want));
    assert!(run(&svc, &ps, Some(&e)).is_none());
    // The same Endpoints without the label (as an older release wrote them), or
    // managed by another: written again with it.
    for managed_by in [None, Some("someone-else")] {
        let mut older = e.clone();
        let labels = older.metadata.labels.as_mut().unwrap();
        match managed_by {
            None => labels.remove("endpoints.kubernetes.io/managed-by"),
            Some(other) => labels.insert("endpoints.kubernetes.io/managed-by".into(), other.into()),
        };
        match run(&svc, &ps, Some(&older)) {
            Some(Change::Update(u)) => assert_eq!(u.metadata.labels.as_ref(), Some(&want)),
            other => panic!("{other:?}"),
        }
    }
    // A label of the Endpoints that the Service does not have: written again.
    let mut extra = e.clone();
    extra
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("stale".into(), "x".into());
    assert!(run(&svc, &ps, Some(&extra)).is_some());
}

#[test]
fn sync_headless_label_and_no_ports() {
    let mut svc = service();
    let spec = svc.spec.as_mut().unwrap();
    spec.cluster_ip = Some("None".into());
    spec.ports = None;
    let e = created(run(&svc, &[pod(1)], None));
    assert_eq!(
        e.metadata.labels.as_ref().unwrap()[crate::util::LABEL_HEADLESS],
        ""
    );
    let s = &e.subsets.unwrap()[0];
    assert_eq!(s.ports, None);
    assert_eq!(s.addresses.as_ref().unwrap().len(), 1);
}

#[test]
fn sync_family_from_ip_families() {
    let mut svc = service();
    svc.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
    let e = created(run(&svc, &[pod_with(1, true, "10.0.0.1,fd00::1")], None));
    assert_eq!(
        e.subsets.unwrap()[0].addresses.as_ref().unwrap()[0].ip,
        "fd00::1"
    );
}

#[test]
fn repack_merges_ports_of_the_same_addresses() {
    // RepackSubsets: two subsets with the same address and different ports become
    // one subset with both ports.
    let subsets = vec![
        EndpointSubset {
            addresses: Some(vec![addr("1.1.1.1")]),
            ports: Some(vec![port("a", 1)]),
            ..Default::default()
        },
        EndpointSubset {
            addresses: Some(vec![addr("1.1.1.1")]),
            ports: Some(vec![port("b", 2)]),
            ..Default::default()
        },
        EndpointSubset {
            addresses: Some(vec![addr("2.2.2.2")]),
            ports: Some(vec![port("c", 3)]),
            ..Default::default()
        },
    ];
    let out = repack_subsets(&subsets);
    assert_eq!(out.len(), 2);
    let both = out
        .iter()
        .find(|s| s.ports.as_ref().unwrap().len() == 2)
        .unwrap();
    assert_eq!(both.addresses.as_ref().unwrap()[0].ip, "1.1.1.1");
    // Ready on one port wins over not ready on the same port.
    let mixed = vec![
        EndpointSubset {
            not_ready_addresses: Some(vec![addr("3.3.3.3")]),
            ports: Some(vec![port("a", 1)]),
            ..Default::default()
        },
        EndpointSubset {
            addresses: Some(vec![addr("3.3.3.3")]),
            ports: Some(vec![port("a", 1)]),
            ..Default::default()
        },
    ];
    let out = repack_subsets(&mixed);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].addresses.as_ref().unwrap().len(), 1);
    assert_eq!(out[0].not_ready_addresses, None);
}

fn many(ready: usize, not_ready: usize) -> Vec<Pod> {
    (0..ready)
        .map(pod)
        .chain(
            (ready..ready + not_ready)
                .map(|i| pod_with(i, false, &format!("10.1.{}.{}", i / 256, i % 256))),
        )
        .collect()
}

#[test]
fn truncation_over_capacity() {
    // TestTruncateEndpoints: 1200 ready -> 1000 ready, annotation set.
    let e = created(run(&service(), &many(1200, 0), None));
    assert_eq!(
        e.metadata.annotations.as_ref().unwrap()[crate::util::ANNOTATION_OVER_CAPACITY],
        "truncated"
    );
    let s = e.subsets.as_ref().unwrap();
    assert_eq!(s[0].addresses.as_ref().unwrap().len(), 1000);
    // 900 ready + 300 not ready: not-ready ones are cut to 100.
    let e2 = created(run(&service(), &many(900, 300), None));
    let s = &e2.subsets.as_ref().unwrap()[0];
    assert_eq!(s.addresses.as_ref().unwrap().len(), 900);
    assert_eq!(s.not_ready_addresses.as_ref().unwrap().len(), 100);
    // Stable while still over capacity.
    assert!(run(&service(), &many(1200, 0), Some(&e)).is_none());
    // Back under capacity: the annotation is removed.
    match run(&service(), &many(10, 0), Some(&e)) {
        Some(Change::Update(u)) => assert!(u.metadata.annotations.is_none()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_raised_capacity_keeps_every_address() {
    let pods = many(1200, 0);
    let refs: Vec<&Pod> = pods.iter().collect();
    let e = created(reconcile(&Input {
        service: &service(),
        pods: &refs,
        current: None,
        trigger_time: None,
        max_capacity: usize::MAX,
    }));
    assert!(e.metadata.annotations.is_none());
    assert_eq!(
        e.subsets.unwrap()[0].addresses.as_ref().unwrap().len(),
        1200
    );
}

#[test]
fn leftover_endpoints_are_deleted_except_leader_records() {
    let mut lock = Endpoints::default();
    lock.metadata.name = Some("lock".into());
    lock.metadata.annotations =
        Some([(crate::util::ANNOTATION_LEADER.to_string(), "{}".to_string())].into());
    let mut orphan = Endpoints::default();
    orphan.metadata.name = Some("gone".into());
    let all = [lock, orphan];
    let out = leftovers(all.iter(), |_, _| false);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].metadata.name.as_deref(), Some("gone"));
}

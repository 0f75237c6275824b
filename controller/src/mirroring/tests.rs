//! Tests of EndpointSlice mirroring, after upstream's reconciler_test.go and
//! endpointslicemirroring_controller_test.go
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslicemirroring/reconciler_test.go>).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints};

use super::*;
use crate::fixtures::service;

fn endpoints(subsets: Vec<EndpointSubset>) -> Endpoints {
    Endpoints {
        metadata: ObjectMeta {
            name: Some("foo".into()),
            namespace: Some("default".into()),
            uid: Some("ep-uid".into()),
            labels: Some(BTreeMap::from([("foo".into(), "bar".into())])),
            annotations: Some(BTreeMap::from([
                ("x".into(), "y".into()),
                (
                    util::ANNOTATION_TRIGGER_TIME.into(),
                    "2024-01-01T00:00:00Z".into(),
                ),
            ])),
            ..Default::default()
        },
        subsets: Some(subsets),
    }
}

fn subset(ips: &[&str], not_ready: &[&str], ports: &[i32]) -> EndpointSubset {
    let a = |ips: &[&str]| {
        Some(
            ips.iter()
                .map(|ip| EndpointAddress {
                    ip: ip.to_string(),
                    ..Default::default()
                })
                .collect(),
        )
        .filter(|v: &Vec<EndpointAddress>| !v.is_empty())
    };
    EndpointSubset {
        addresses: a(ips),
        not_ready_addresses: a(not_ready),
        ports: Some(
            ports
                .iter()
                .map(|p| EndpointPort {
                    name: Some(format!("p{p}")),
                    port: *p,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

fn selectorless() -> Service {
    let mut s = service();
    s.spec.as_mut().unwrap().selector = None;
    s
}

#[test]
fn two_external_servers_one_slice() {
    // The documented case: two web servers outside the cluster behind a ClusterIP.
    let eps = endpoints(vec![subset(&["192.0.2.10", "192.0.2.11"], &[], &[80])]);
    let plan = reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default());
    assert_eq!(plan.create.len(), 1);
    let s = &plan.create[0];
    assert_eq!(s.address_type, "IPv4");
    assert_eq!(s.endpoints.len(), 2);
    let labels = s.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels[util::LABEL_MANAGED_BY],
        util::MIRRORING_CONTROLLER_NAME
    );
    assert_eq!(labels[util::LABEL_SERVICE_NAME], "foo");
    assert_eq!(labels["foo"], "bar");
    // Annotations copied but the trigger time.
    let ann = s.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann.len(), 1);
    assert_eq!(ann["x"], "y");
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Endpoints", "ep-uid")
    );
    assert_eq!(
        s.endpoints[0].conditions.as_ref().unwrap().ready,
        Some(true)
    );
    // Mirroring again changes nothing.
    let mut existing = plan.create[0].clone();
    existing.metadata.name = Some("foo-abcde".into());
    let again = reconcile(
        Some(&selectorless()),
        Some(&eps),
        &[existing],
        &Options::default(),
    );
    assert!(again.create.is_empty() && again.update.is_empty() && again.delete.is_empty());
}

#[test]
fn one_slice_per_subset_and_family() {
    let eps = endpoints(vec![
        subset(&["10.0.0.1", "fd00::1"], &["10.0.0.2"], &[80]),
        subset(&["10.0.0.3"], &[], &[443]),
    ]);
    let plan = reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default());
    let mut got: Vec<(String, usize)> = plan
        .create
        .iter()
        .map(|s| (s.address_type.clone(), s.endpoints.len()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![("IPv4".into(), 1), ("IPv4".into(), 2), ("IPv6".into(), 1)]
    );
}

/// Found by the dual-stack differential run against kube-controller-manager: an
/// Endpoints that keeps only its IPv6 address must lose its IPv4 slice, not keep it
/// empty (upstream's reconcileByPortMapping deletes when no endpoint is desired).
#[test]
fn a_family_without_addresses_loses_its_slice() {
    let both = endpoints(vec![subset(&["10.0.0.1", "fd00::1"], &[], &[80])]);
    let first = reconcile(Some(&selectorless()), Some(&both), &[], &Options::default());
    assert_eq!(first.create.len(), 2);
    let existing: Vec<EndpointSlice> = first
        .create
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = s.clone();
            s.metadata.name = Some(format!("foo-{i}"));
            s
        })
        .collect();
    let v6_only = endpoints(vec![subset(&["fd00::1"], &[], &[80])]);
    let plan = reconcile(
        Some(&selectorless()),
        Some(&v6_only),
        &existing,
        &Options::default(),
    );
    let deleted: Vec<&str> = plan
        .delete
        .iter()
        .map(|s| s.address_type.as_str())
        .collect();
    assert_eq!(deleted, ["IPv4"], "{plan:?}");
    assert!(plan.create.is_empty() && plan.update.is_empty(), "{plan:?}");
}

#[test]
fn invalid_addresses_skipped_with_warning() {
    let eps = endpoints(vec![subset(&["10.0.0.1", "not-an-ip"], &[], &[80])]);
    // Issue 46: the front door lets such a stored object through to be mirrored.
    assert_eq!(conventions::validate::stored(&eps), Ok(()));
    let plan = reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default());
    assert_eq!(plan.create[0].endpoints.len(), 1);
    assert_eq!(plan.warnings[0].reason, "InvalidIPAddress");
}

#[test]
fn max_addresses_per_subset() {
    let ips: Vec<String> = (0..1002)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    let refs: Vec<&str> = ips.iter().map(String::as_str).collect();
    let eps = endpoints(vec![subset(&refs, &[], &[80])]);
    let plan = reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default());
    assert_eq!(plan.create[0].endpoints.len(), 1000);
    assert_eq!(plan.warnings[0].reason, "TooManyAddressesToMirror");
}

#[test]
fn skip_mirror_selector_and_missing_service_delete() {
    let eps = endpoints(vec![subset(&["10.0.0.1"], &[], &[80])]);
    let mut existing =
        reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default()).create;
    existing[0].metadata.name = Some("foo-abcde".into());

    let mut skip = eps.clone();
    skip.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(util::LABEL_SKIP_MIRROR.into(), "true".into());
    let plan = reconcile(
        Some(&selectorless()),
        Some(&skip),
        &existing,
        &Options::default(),
    );
    assert_eq!(plan.delete.len(), 1);

    // A Service with a selector gets slices from the EndpointSlice controller.
    let plan = reconcile(Some(&service()), Some(&eps), &existing, &Options::default());
    assert_eq!(plan.delete.len(), 1);

    let plan = reconcile(None, Some(&eps), &existing, &Options::default());
    assert_eq!(plan.delete.len(), 1);
}

#[test]
fn changed_ports_recycle_slice() {
    let eps = endpoints(vec![subset(&["10.0.0.1"], &[], &[80])]);
    let mut existing =
        reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default()).create;
    existing[0].metadata.name = Some("foo-abcde".into());
    let eps2 = endpoints(vec![subset(&["10.0.0.1"], &[], &[8080])]);
    let plan = reconcile(
        Some(&selectorless()),
        Some(&eps2),
        &existing,
        &Options::default(),
    );
    assert!(plan.create.is_empty() && plan.delete.is_empty());
    assert_eq!(plan.update.len(), 1);
    assert_eq!(plan.update[0].metadata.name.as_deref(), Some("foo-abcde"));
    assert_eq!(plan.update[0].ports.as_ref().unwrap()[0].port, Some(8080));
}

#[test]
fn extra_slices_for_one_subset_are_deleted() {
    let eps = endpoints(vec![subset(&["10.0.0.1"], &[], &[80])]);
    let first = reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default()).create;
    let mut a = first[0].clone();
    a.metadata.name = Some("a".into());
    let mut b = first[0].clone();
    b.metadata.name = Some("b".into());
    let plan = reconcile(
        Some(&selectorless()),
        Some(&eps),
        &[a, b],
        &Options::default(),
    );
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].metadata.name.as_deref(), Some("b"));
    assert!(plan.update.is_empty());
}

/// Issue 46: mirrored IPs are in canonical form, as upstream's `addressToEndpoint`
/// parses and writes them again (`1234::5678:0000:0000:9abc:def0` becomes
/// `1234::5678:0:0:9abc:def0`); IPv4 with leading zeros as an older API server
/// stored it, and IPv4-mapped IPv6, as Go writes them.
#[test]
fn mirrored_addresses_are_canonical() {
    let eps = endpoints(vec![subset(
        &[
            "1234::5678:0000:0000:9abc:def0",
            "010.000.000.001",
            "::ffff:10.0.0.2",
        ],
        &[],
        &[80],
    )]);
    let plan = reconcile(Some(&selectorless()), Some(&eps), &[], &Options::default());
    let mut got: Vec<(&str, &str)> = plan
        .create
        .iter()
        .flat_map(|s| {
            s.endpoints
                .iter()
                .map(move |e| (s.address_type.as_str(), e.addresses[0].as_str()))
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("IPv4", "10.0.0.1"),
            ("IPv4", "10.0.0.2"),
            ("IPv6", "1234::5678:0:0:9abc:def0")
        ],
        "{plan:?}"
    );
}

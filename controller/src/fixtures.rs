//! Builders of Services, Pods, Nodes and slices for the table-driven tests.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, NodeCondition, NodeStatus, Pod, PodCondition, PodIP, PodSpec,
    PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub const NS: &str = "default";
pub const SVC_UID: &str = "svc-uid-1";

/// A ClusterIP IPv4 Service `foo` with selector `app=foo` and port `http` 80 -> 8080.
pub fn service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("foo".into()),
            namespace: Some(NS.into()),
            uid: Some(SVC_UID.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".into(), "foo".into())])),
            cluster_ip: Some("10.96.0.1".into()),
            ip_families: Some(vec!["IPv4".into()]),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(8080)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A ready running Pod `pod<i>` on `node-1` with IP 10.0.<i/256>.<i%256>.
pub fn pod(i: usize) -> Pod {
    pod_with(i, true, &format!("10.0.{}.{}", i / 256, i % 256))
}

/// A Pod with given readiness and IPs (comma-separated).
pub fn pod_with(i: usize, ready: bool, ips: &str) -> Pod {
    let ips: Vec<PodIP> = ips
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|ip| PodIP { ip: ip.into() })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod{i}")),
            namespace: Some(NS.into()),
            uid: Some(format!("pod-uid-{i}")),
            labels: Some(BTreeMap::from([("app".into(), "foo".into())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-1".into()),
            containers: vec![Container {
                name: "c".into(),
                ports: Some(vec![ContainerPort {
                    name: Some("http".into()),
                    container_port: 8080,
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: ips.first().map(|p| p.ip.clone()),
            pod_ips: Some(ips),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                last_transition_time: Some(time(1_700_000_000 + i as i64)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// A timestamp.
pub fn time(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid time"))
}

/// A ready Node with a zone and CPU.
pub fn node(name: &str, zone: &str, cpu: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                crate::util::LABEL_ZONE.into(),
                zone.into(),
            )])),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            allocatable: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Nodes by name: `node-1` in `zone-a`.
pub fn nodes() -> BTreeMap<String, std::sync::Arc<Node>> {
    BTreeMap::from([("node-1".into(), node("node-1", "zone-a", "4").into())])
}

/// Endpoints as a slice with the given name would hold them, the way the
/// reconciler builds them for `pod(i)`.
pub fn endpoint_for(i: usize) -> Endpoint {
    let p = pod(i);
    let n = nodes();
    crate::reconciler::pod_to_endpoint(
        &p,
        n.get("node-1").map(|n| &**n),
        &service(),
        crate::util::IPV4,
    )
}

/// An existing slice named `name` owned by `service()` holding endpoints of pods `ids`.
pub fn slice(name: &str, ids: impl IntoIterator<Item = usize>) -> EndpointSlice {
    let svc = service();
    let ports = crate::reconciler::endpoint_ports(&svc, &pod(0));
    let mut s = crate::reconciler::new_slice(
        &svc,
        &ports,
        crate::util::IPV4,
        crate::util::CONTROLLER_NAME,
    );
    s.metadata.name = Some(name.into());
    s.endpoints = ids.into_iter().map(endpoint_for).collect();
    s
}

//! The controllers' workloads of figure 5, in pure code through the `controller`
//! library (no API server): the rolling update of a large Service, counting writes
//! and bytes for EndpointSlices and for Endpoints, and a cold start of many Services.

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::core::v1::{
    Node, Pod, PodCondition, PodIP, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use controller::plan::{Object, Plan};
use controller::store::{self, Snapshot};

/// Writes and bytes of a rolling update.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RollingUpdateReport {
    /// Pods in the Service.
    pub pods: usize,
    /// API writes (create, update, delete) of EndpointSlices.
    pub slice_writes: u64,
    /// JSON bytes of EndpointSlice writes (deletes count 0).
    pub slice_bytes: u64,
    /// API writes of Endpoints.
    pub endpoints_writes: u64,
    /// JSON bytes of Endpoints writes.
    pub endpoints_bytes: u64,
    /// API writes of Endpoints that hold every address: upstream truncates an
    /// Endpoints object to 1000 addresses, so past that size the counts above leave
    /// most Pods out; these count the object that carries all of them (as before the
    /// cap), the same information as the slices.
    pub endpoints_untruncated_writes: u64,
    /// JSON bytes of those writes.
    pub endpoints_untruncated_bytes: u64,
    /// EndpointSlices at the end.
    pub slices_at_end: usize,
}

/// Timing of a cold start.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ColdStartReport {
    /// Services.
    pub services: usize,
    /// Pods.
    pub pods: usize,
    /// EndpointSlices created.
    pub slices: usize,
    /// Wall time of the reconcile pass, in milliseconds.
    pub millis: f64,
}

fn node(i: usize) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(format!("node-{i}")),
            labels: Some(BTreeMap::from([(
                controller::util::LABEL_ZONE.to_string(),
                format!("zone-{}", i % 3),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn service(ns: &str, name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-{ns}-{name}")),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            cluster_ip: Some("10.96.0.10".into()),
            ip_families: Some(vec!["IPv4".into()]),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod(ns: &str, app: &str, name: &str, ip: u32, node: usize) -> Pod {
    let ip = std::net::Ipv4Addr::from(0x0a00_0000 | (ip & 0x00ff_ffff)).to_string();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            uid: Some(format!("uid-{name}")),
            labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(format!("node-{node}")),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.clone()),
            pod_ips: Some(vec![PodIP { ip }]),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// JSON length of `obj`, without keeping the text.
fn json_len(obj: &Object) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, obj).map_or(0, |()| count.0)
}

fn apply(snap: &mut Snapshot, mut plan: Plan, report: &mut RollingUpdateReport) {
    let taken = snap.slices.keys().cloned().collect();
    plan.assign_names(&taken);
    let writes = plan.create.into_iter().chain(plan.update);
    for obj in writes {
        let bytes = json_len(&obj);
        match obj {
            Object::EndpointSlice(s) => {
                report.slice_writes += 1;
                report.slice_bytes += bytes;
                snap.add_slice(s);
            }
            Object::Endpoints(e) => {
                report.endpoints_writes += 1;
                report.endpoints_bytes += bytes;
                snap.add_endpoints(e);
            }
        }
    }
    for obj in plan.delete {
        let key = obj.key();
        match obj {
            Object::EndpointSlice(_) => {
                report.slice_writes += 1;
                snap.slices.remove(&key);
            }
            Object::Endpoints(_) => {
                report.endpoints_writes += 1;
                snap.endpoints.remove(&key);
            }
        }
    }
}

/// A Service of `pods` Pods replaced one by one (a new Pod is added and ready, then
/// an old one removed), reconciling after each step. Counts only the writes of the
/// update, not of the initial state. Run twice: with upstream's controllers, then
/// with the Endpoints controller alone and no address cap.
/// The two runs share nothing, so they run side by side.
pub fn rolling_update(pods: usize) -> RollingUpdateReport {
    let untruncated = store::Options {
        controllers: store::Controllers {
            endpointslice: false,
            endpoints: true,
            mirroring: false,
        },
        endpoints_max_capacity: Some(usize::MAX),
        ..Default::default()
    };
    let (mut report, full) = std::thread::scope(|scope| {
        let full = scope.spawn(|| rolling_update_with(pods, &untruncated));
        let report = rolling_update_with(pods, &store::Options::default());
        (report, full.join().expect("the untruncated run panicked"))
    });
    report.endpoints_untruncated_writes = full.endpoints_writes;
    report.endpoints_untruncated_bytes = full.endpoints_bytes;
    report
}

fn rolling_update_with(pods: usize, opts: &store::Options) -> RollingUpdateReport {
    let mut snap = Snapshot::default();
    let nodes = 50;
    for i in 0..nodes {
        snap.add_node(node(i));
    }
    snap.add_service(service("default", "web"));
    for i in 0..pods {
        snap.add_pod(pod(
            "default",
            "web",
            &format!("web-old-{i}"),
            i as u32,
            i % nodes,
        ));
    }
    let mut state = store::State::default();
    let mut discard = RollingUpdateReport::default();
    let plan = store::plan_all(&snap, opts, &mut state).plan;
    apply(&mut snap, plan, &mut discard);

    // Each step syncs only the Service whose Pods changed, as upstream does.
    let web = ("default".to_string(), "web".to_string());
    let mut report = RollingUpdateReport {
        pods,
        ..Default::default()
    };
    for i in 0..pods {
        snap.add_pod(pod(
            "default",
            "web",
            &format!("web-new-{i}"),
            (pods + i) as u32,
            i % nodes,
        ));
        let plan = store::plan_service(&snap, &web, opts, &mut state).plan;
        apply(&mut snap, plan, &mut report);
        snap.pods
            .remove(&("default".to_string(), format!("web-old-{i}")));
        let plan = store::plan_service(&snap, &web, opts, &mut state).plan;
        apply(&mut snap, plan, &mut report);
    }
    report.slices_at_end = snap.slices.len();
    report
}

/// One reconcile pass over `services` Services sharing `pods` Pods evenly, from
/// nothing; times the pass.
pub fn cold_start(services: usize, pods: usize) -> ColdStartReport {
    let mut snap = Snapshot::default();
    let nodes = 100;
    for i in 0..nodes {
        snap.add_node(node(i));
    }
    let services = services.max(1);
    for s in 0..services {
        snap.add_service(service("default", &format!("svc-{s}")));
    }
    for p in 0..pods {
        let s = p % services;
        snap.add_pod(pod(
            "default",
            &format!("svc-{s}"),
            &format!("pod-{p}"),
            p as u32,
            p % nodes,
        ));
    }
    let opts = store::Options::default();
    let mut state = store::State::default();
    let start = Instant::now();
    let plan = store::plan_all(&snap, &opts, &mut state).plan;
    let millis = start.elapsed().as_secs_f64() * 1000.0;
    ColdStartReport {
        services,
        pods,
        slices: plan
            .create
            .iter()
            .filter(|o| matches!(o, Object::EndpointSlice(_)))
            .count(),
        millis,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_update_small() {
        let r = rolling_update(150);
        assert_eq!(r.pods, 150);
        assert!(r.slice_writes > 0 && r.endpoints_writes > 0);
        // Never rebalanced: 150 pods fit in two slices of 100 at most, plus churn.
        assert!(r.slices_at_end <= 3, "{r:?}");
        // Under the cap, the Endpoints without a cap are the same writes.
        assert_eq!(
            (
                r.endpoints_untruncated_writes,
                r.endpoints_untruncated_bytes
            ),
            (r.endpoints_writes, r.endpoints_bytes)
        );
    }

    #[test]
    fn cold_start_small() {
        let r = cold_start(10, 1000);
        // One slice per Service (100 Pods each).
        assert_eq!(r.slices, 10);
    }
}

//! The agent with the Kubernetes API source, end to end: the real kube-apiserver (the
//! upstream kit's, on the root namespace's loopback) reached from the lab's node
//! namespace through a forwarder on the node's `127.0.0.1:6443`, the real agent binary
//! with `--kubeconfig` and the identity and RBAC of its DaemonSet (`deploy/`), real
//! traffic through the VIP. Also `/metrics` and `/healthz`. Needs root.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
    time::{Duration, Instant},
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    api::{DeleteParams, Patch, PatchParams, PostParams},
    Api,
};
use serde_json::json;
use sliceway_agent::source::local::parse_file;
use sliceway_lab::{cluster, Agent, Lab};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// The lab's Service and EndpointSlice for `backends`, placed in namespace `ns`.
fn objects(lab: &Lab, ns: &str, backends: &[usize]) -> (Service, EndpointSlice) {
    let yaml = lab.service_yaml("web", VIP, 80, backends);
    let (objects, problems) = parse_file(Path::new("x.yaml"), &yaml);
    assert!(problems.is_empty());
    let mut o = objects.unwrap();
    let (mut svc, mut slice) = (o.services.remove(0), o.slices.remove(0));
    svc.metadata.namespace = Some(ns.into());
    slice.metadata.namespace = Some(ns.into());
    (svc, slice)
}

/// The agent in the lab's node, on the API server through the node's forwarder with
/// its DaemonSet's identity, with `extra` arguments; once it has synced.
fn api_agent(cp: &cluster::Cluster, lab: &Lab, extra: &[&str]) -> Agent {
    let kubeconfig = cp
        .agent_kubeconfig(
            &format!(
                "https://127.0.0.1:{}",
                cluster::kubelet::NODE_APISERVER_PORT
            ),
            &lab.manifests.join("kubeconfig"),
        )
        .unwrap();
    let source = ["--kubeconfig".into(), kubeconfig.into_os_string()];
    let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    let agent = Agent::start_with_args(
        &lab.node.name,
        &source,
        &lab.pod_interfaces(),
        &lab.bpffs,
        &extra,
    )
    .unwrap();
    agent.wait_for_sync(1, sliceway_lab::agent_start()).unwrap();
    agent
}

fn backends_seen(lab: &Lab, n: usize) -> std::collections::BTreeSet<String> {
    (0..n)
        .map(|_| lab.tcp_request(SocketAddrV4::new(VIP, 80)).unwrap().backend)
        .collect()
}

#[test]
fn the_agent_follows_the_api_server() {
    let cp = cluster::shared_control_plane().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(cp.client()).unwrap();
    let ns = rt.block_on(cp.namespace("kube-mode")).unwrap();
    let lab = Lab::new(3).unwrap();
    let _forwarder = cp
        .forwarder(Some(&lab.node.name), cluster::kubelet::NODE_APISERVER_PORT)
        .unwrap();
    let services = Api::<Service>::namespaced(admin.clone(), &ns);
    let slices = Api::<EndpointSlice>::namespaced(admin, &ns);
    let (svc, slice) = objects(&lab, &ns, &[0, 1, 2]);
    let pp = PostParams::default();
    rt.block_on(services.create(&pp, &svc)).unwrap();
    rt.block_on(slices.create(&pp, &slice)).unwrap();

    let agent = api_agent(cp, &lab, &[]);
    assert_eq!(backends_seen(&lab, 30).len(), 3);

    // An endpoint leaves the slice in the API server: new flows stop going there.
    let (_, smaller) = objects(&lab, &ns, &[0, 2]);
    let syncs = agent.syncs().unwrap();
    let patch = json!({
        "metadata": {"annotations": {
            "endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z",
        }},
        "endpoints": smaller.endpoints,
    });
    rt.block_on(slices.patch(
        slice.metadata.name.as_deref().unwrap(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    ))
    .unwrap();
    agent
        .wait_for_sync(syncs + 1, Duration::from_secs(10))
        .unwrap();
    let seen = backends_seen(&lab, 30);
    assert!(!seen.contains(&lab.backends[1].name), "{seen:?}");
    assert_eq!(seen.len(), 2);

    // Health and metrics, from inside the node (localhost only).
    let health = agent.http("/healthz").unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = agent.metrics().unwrap();
    for needle in [
        "sliceway_syncs_total",
        "sliceway_sync_duration_seconds",
        // web's TCP and UDP ports, and the API server's own `kubernetes` Service, and
        // the two ClusterIP markers.
        "sliceway_map_entries{map=\"SERVICES\"} 5",
        "sliceway_datapath_packets{reason=\"dnat_new\"}",
        "sliceway_objects_skipped",
        "sliceway_network_programming_duration_seconds_count 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from\n{metrics}");
    }

    // The Service goes away entirely: the VIP stops answering.
    let deadline = Instant::now() + Duration::from_secs(10);
    rt.block_on(services.delete("web", &DeleteParams::default()))
        .unwrap();
    while lab.tcp_request(SocketAddrV4::new(VIP, 80)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the VIP still answers after the Service was deleted"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 15: health that tells the truth. With the API server cut off (every
/// connection closed, new ones turned away) `/healthz` turns 503 once the watches
/// have failed for `--healthz-timeout-seconds`, naming the watch, while `/livez`
/// stays 200 (a restart would not bring the API server back); when the API server is
/// reachable again, `/healthz` is 200 again.
#[test]
fn healthz_follows_the_api_watch_and_livez_the_process() {
    let cp = cluster::shared_control_plane().unwrap();
    let lab = Lab::new(2).unwrap();
    let forwarder = cp
        .forwarder(Some(&lab.node.name), cluster::kubelet::NODE_APISERVER_PORT)
        .unwrap();
    let agent = api_agent(cp, &lab, &["--healthz-timeout-seconds", "2"]);
    let status = |path: &'static str| agent.http(path).unwrap();
    let wait_for = |path: &'static str, code: &str, what: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = status(path);
            if answer.starts_with(&format!("HTTP/1.1 {code}")) {
                return answer;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {path} still answers {answer}; agent log:\n{}",
                agent.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    assert!(status("/healthz").starts_with("HTTP/1.1 200"));
    assert!(status("/livez").starts_with("HTTP/1.1 200"));

    forwarder.hold();
    let unhealthy = wait_for("/healthz", "503", "the API server cut off");
    assert!(unhealthy.contains("the watch of"), "{unhealthy}");
    let live = status("/livez");
    assert!(live.starts_with("HTTP/1.1 200"), "{live}");

    forwarder.release();
    wait_for("/healthz", "200", "the API server back");
    assert!(status("/livez").starts_with("HTTP/1.1 200"));
}

/// Issue 15: a Service the agent cannot program gets a Kubernetes Event. Service `b`
/// asks, through an external IP, for the frontend that is `a`'s ClusterIP:port: the
/// agent keeps it for `a` and records a `FrontendConflict` warning on `b` (reported
/// by sliceway-agent, with `b`'s uid, so `kubectl describe service b` shows it).
/// The Services carry a service-proxy-name of this test's own, so the agents of the
/// other tests of the shared control plane leave them alone (and this one theirs).
#[test]
fn a_service_the_agent_cannot_program_gets_an_event() {
    use k8s_openapi::api::events::v1::Event;
    const PROXY: &str = "sliceway-events-test";
    let cp = cluster::shared_control_plane().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(cp.client()).unwrap();
    let ns = rt.block_on(cp.namespace("kube-events")).unwrap();
    let lab = Lab::new(1).unwrap();
    let _forwarder = cp
        .forwarder(Some(&lab.node.name), cluster::kubelet::NODE_APISERVER_PORT)
        .unwrap();
    let services = Api::<Service>::namespaced(admin.clone(), &ns);
    let pp = PostParams::default();
    let service = |name: &str, external: Option<String>| -> Service {
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "labels": {"service.kubernetes.io/service-proxy-name": PROXY},
            },
            "spec": {
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
                "externalIPs": external.into_iter().collect::<Vec<_>>(),
            },
        }))
        .unwrap()
    };
    let a = rt
        .block_on(services.create(&pp, &service("a", None)))
        .unwrap();
    let a_ip = a.spec.unwrap().cluster_ip.unwrap();
    let b = rt
        .block_on(services.create(&pp, &service("b", Some(a_ip.clone()))))
        .unwrap();

    let agent = api_agent(cp, &lab, &["--service-proxy-name", PROXY]);

    let events = Api::<Event>::namespaced(admin, &ns);
    let deadline = Instant::now() + Duration::from_secs(20);
    let event = loop {
        let list = rt.block_on(events.list(&Default::default())).unwrap();
        if let Some(e) = list.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("b")
                && e.reason.as_deref() == Some("FrontendConflict")
        }) {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "no FrontendConflict event on b; agent log:\n{}",
            agent.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("sliceway-agent")
    );
    let regarding = event.regarding.unwrap();
    assert_eq!(regarding.uid, b.metadata.uid);
    assert_eq!(regarding.kind.as_deref(), Some("Service"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!("{a_ip}:80/TCP")) && note.contains(&format!("{ns}/a")),
        "{note}"
    );
}

const FAILOVER_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 47);

/// Issue 47: `--apiserver` is a list of the API server's addresses, tried in turn
/// when a connection fails, by address or by a name the node resolves itself
/// (`localhost`, from `/etc/hosts`), each checked by TLS as itself; it overrides the
/// kubeconfig's server (a dead one here), whose credentials and CA it keeps. The
/// first address is dead from the start: the agent syncs through the second. Then
/// the second stops answering (every connection closed, new ones turned away): the
/// agent follows the API server through the third.
#[test]
fn the_agent_fails_over_along_the_api_server_list() {
    let cp = cluster::shared_control_plane().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(cp.client()).unwrap();
    let ns = rt.block_on(cp.namespace("failover")).unwrap();
    let lab = Lab::new(2).unwrap();
    // In the node: nothing on 16444, a way to the API server on 16443 and another on
    // the node's 6443.
    let second = cp.forwarder(Some(&lab.node.name), 16443).unwrap();
    let _third = cp
        .forwarder(Some(&lab.node.name), cluster::kubelet::NODE_APISERVER_PORT)
        .unwrap();
    let slices = Api::<EndpointSlice>::namespaced(admin.clone(), &ns);
    // A ClusterIP of its own, and a service proxy name that keeps it from the
    // other tests' agents: the control plane is shared with them.
    let (mut svc, mut slice) = objects(&lab, &ns, &[0]);
    for labels in [&mut svc.metadata.labels, &mut slice.metadata.labels] {
        labels.get_or_insert_with(Default::default).insert(
            "service.kubernetes.io/service-proxy-name".into(),
            "failover".into(),
        );
    }
    let spec = svc.spec.as_mut().unwrap();
    spec.cluster_ip = Some(FAILOVER_VIP.to_string());
    spec.cluster_ips = Some(vec![FAILOVER_VIP.to_string()]);
    let seen = |lab: &Lab| -> std::collections::BTreeSet<String> {
        (0..10)
            .map(|_| {
                lab.tcp_request(SocketAddrV4::new(FAILOVER_VIP, 80))
                    .unwrap()
                    .backend
            })
            .collect()
    };
    let pp = PostParams::default();
    rt.block_on(Api::<Service>::namespaced(admin, &ns).create(&pp, &svc))
        .unwrap();
    rt.block_on(slices.create(&pp, &slice)).unwrap();

    let kubeconfig = cp
        .agent_kubeconfig("https://127.0.0.1:1", &lab.manifests.join("kubeconfig"))
        .unwrap();
    let source = ["--kubeconfig".into(), kubeconfig.into_os_string()];
    let servers = format!(
        "127.0.0.1:16444,https://127.0.0.1:16443,localhost:{}",
        cluster::kubelet::NODE_APISERVER_PORT
    );
    let agent = Agent::start_with_args(
        &lab.node.name,
        &source,
        &lab.pod_interfaces(),
        &lab.bpffs,
        &[
            "--apiserver".into(),
            servers,
            "--service-proxy-name".into(),
            "failover".into(),
        ],
    )
    .unwrap();
    agent.wait_for_sync(1, sliceway_lab::agent_start()).unwrap();
    assert_eq!(seen(&lab), [lab.backends[0].name.clone()].into());

    // The second address goes away; a change made meanwhile arrives through the
    // third.
    second.hold();
    let syncs = agent.syncs().unwrap();
    let (_, moved) = objects(&lab, &ns, &[1]);
    let patch = json!({ "endpoints": moved.endpoints });
    rt.block_on(slices.patch(
        slice.metadata.name.as_deref().unwrap(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    ))
    .unwrap();
    // A relist after reconnecting may sync before the change is seen: wait for
    // the change itself.
    let want: std::collections::BTreeSet<String> = [lab.backends[1].name.clone()].into();
    let deadline = Instant::now() + sliceway_lab::agent_start();
    loop {
        agent
            .wait_for_sync(syncs + 1, sliceway_lab::agent_start())
            .unwrap();
        if seen(&lab) == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the change never arrived through the third address:\n{}",
            agent.log().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let health = agent.http("/healthz").unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}

//! The agent with the Kubernetes API source, end to end: an API server (the in-memory
//! one of the test harness) inside the lab's node namespace, the real agent binary
//! with `--kubeconfig`, real traffic through the VIP. Also `/metrics` and `/healthz`.
//! Needs root.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    path::Path,
    sync::mpsc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use sliceway_agent::local::parse_file;
use sliceway_lab::{apiserver::ApiServer, in_netns, Agent, Lab};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// Starts the API server on the node namespace's loopback; it runs until dropped.
fn api_server_in(ns: &str) -> ApiServer {
    let (tx, rx) = mpsc::channel();
    let ns = ns.to_string();
    std::thread::spawn(move || {
        in_netns(&ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                tx.send(ApiServer::start().await.unwrap()).unwrap();
                // Drive the server's tasks until the test process ends.
                std::future::pending::<()>().await;
            })
        })
        .unwrap()
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap()
}

fn objects(yaml: &str) -> (Service, EndpointSlice) {
    let (objects, problems) = parse_file(Path::new("x.yaml"), yaml);
    assert!(problems.is_empty());
    let mut o = objects.unwrap();
    (o.services.remove(0), o.slices.remove(0))
}

fn http_get(ns: &str, path: &'static str) -> String {
    in_netns(ns, move || {
        let mut c = TcpStream::connect("127.0.0.1:10256").unwrap();
        write!(c, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
    })
    .unwrap()
}

fn backends_seen(lab: &Lab, n: usize) -> std::collections::BTreeSet<String> {
    (0..n)
        .map(|_| lab.tcp_request(SocketAddrV4::new(VIP, 80)).unwrap().backend)
        .collect()
}

#[test]
fn the_agent_follows_the_api_server() {
    let lab = Lab::new(3).unwrap();
    let api = api_server_in(&lab.node.name);
    let (svc, slice) = objects(&lab.service_yaml("web", VIP, 80, &[0, 1, 2]));
    api.create(&svc).unwrap();
    let stored = api.create(&slice).unwrap();

    let kubeconfig = lab.manifests.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster: {{server: \"{}\"}}\nusers:\n- name: lab\n  user: {{}}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: lab}}\ncurrent-context: lab\n",
            api.url()
        ),
    )
    .unwrap();
    let source = ["--kubeconfig".into(), kubeconfig.into_os_string()];
    let agent = Agent::start(&lab.node.name, &source, &lab.pod_interfaces(), &lab.bpffs).unwrap();
    agent.wait_for_sync(1, Duration::from_secs(20)).unwrap();
    assert_eq!(backends_seen(&lab, 30).len(), 3);

    // An endpoint leaves the slice in the API server: new flows stop going there.
    let (_, mut smaller) = objects(&lab.service_yaml("web", VIP, 80, &[0, 2]));
    smaller.metadata.resource_version = stored.metadata.resource_version.clone();
    smaller.metadata.annotations = Some(
        [(
            "endpoints.kubernetes.io/last-change-trigger-time".to_string(),
            "2026-01-01T00:00:00Z".to_string(),
        )]
        .into(),
    );
    let syncs = agent.syncs();
    api.replace(&smaller).unwrap();
    agent
        .wait_for_sync(syncs + 1, Duration::from_secs(10))
        .unwrap();
    let seen = backends_seen(&lab, 30);
    assert!(!seen.contains(&lab.backends[1].name), "{seen:?}");
    assert_eq!(seen.len(), 2);

    // Health and metrics, from inside the node (localhost only).
    let health = http_get(&lab.node.name, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = http_get(&lab.node.name, "/metrics");
    for needle in [
        "sliceway_syncs_total",
        "sliceway_sync_duration_seconds",
        "sliceway_map_entries{map=\"SERVICES\"} 2",
        "sliceway_datapath_packets{reason=\"dnat_new\"}",
        "sliceway_objects_skipped",
        "sliceway_network_programming_duration_seconds_count 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from\n{metrics}");
    }

    // The Service goes away entirely: the VIP stops answering.
    let deadline = Instant::now() + Duration::from_secs(10);
    api.delete::<Service>(Some("default"), "web").unwrap();
    while lab.tcp_request(SocketAddrV4::new(VIP, 80)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the VIP still answers after the Service was deleted"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

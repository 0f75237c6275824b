//! The agent's Kubernetes API source against the in-memory API server (real HTTP,
//! `kube::Client` and kube-rs watchers in the path), and its store logic fed with
//! scripted watcher events. No root needed.

use std::time::Duration;

use futures::{channel::mpsc, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::runtime::watcher;
use serde_json::json;
use sliceway_agent::{
    kube_source::{Error, KubeSource, KubeSourceConfig},
    local::Objects,
};
use sliceway_lab::apiserver::ApiServer;
use tokio::time::{timeout, Instant};

/// Generous: the watcher's first retry after an error waits about a second.
const WAIT: Duration = Duration::from_secs(20);
const PROXY_LABEL: &str = "service.kubernetes.io/service-proxy-name";
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

fn service(name: &str, ip: &str, labels: &[(&str, &str)]) -> Service {
    let labels: serde_json::Map<_, _> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
        },
    }))
    .unwrap()
}

fn slice(name: &str, service: &str, addrs: &[&str], labels: &[(&str, &str)]) -> EndpointSlice {
    let mut all = serde_json::Map::new();
    all.insert("kubernetes.io/service-name".into(), json!(service));
    for (k, v) in labels {
        all.insert(k.to_string(), json!(v));
    }
    let endpoints: Vec<_> = addrs
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": all},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

fn node(name: &str, zone: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
    }))
    .unwrap()
}

fn cfg(node: Option<&str>, proxy: Option<&str>) -> KubeSourceConfig {
    KubeSourceConfig {
        node_name: node.map(String::from),
        proxy_name: proxy.map(String::from),
    }
}

/// Names in a snapshot: (services, slices, nodes).
fn names(o: &Objects) -> (Vec<String>, Vec<String>, Vec<String>) {
    (
        o.services
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect(),
        o.slices
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect(),
        o.nodes
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect(),
    )
}

fn slice_addrs(o: &Objects, name: &str) -> Vec<String> {
    o.slices
        .iter()
        .filter(|s| s.metadata.name.as_deref() == Some(name))
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect()
}

async fn started(server: &ApiServer, cfg: &KubeSourceConfig) -> KubeSource {
    let (mut source, _task) = KubeSource::start(server.client().unwrap(), cfg).unwrap();
    timeout(WAIT, source.wait_synced())
        .await
        .expect("caches sync in time")
        .expect("source running");
    source
}

/// Waits until the snapshot satisfies `ok`, reading change notifications.
async fn until(source: &mut KubeSource, what: &str, ok: impl Fn(&Objects) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let snapshot = source.snapshot();
        if ok(&snapshot) {
            return;
        }
        match tokio::time::timeout_at(deadline, source.changed()).await {
            Ok(r) => {
                r.expect("source running");
            }
            Err(_) => panic!("timed out waiting for {what}; have {:?}", names(&snapshot)),
        }
    }
}

/// Waits until the server serves `n` watches.
async fn until_watching(server: &ApiServer, n: usize) {
    let deadline = Instant::now() + WAIT;
    while server.open_watches() != n {
        assert!(
            Instant::now() < deadline,
            "{} watches open, want {n}",
            server.open_watches()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// No change arrives within `quiet`.
async fn assert_quiet(source: &mut KubeSource, quiet: Duration) {
    if let Ok(r) = timeout(quiet, source.changed()).await {
        panic!(
            "unexpected change: {r:?}; have {:?}",
            names(&source.snapshot())
        );
    }
}

#[tokio::test]
async fn initial_list_appears_in_snapshot_only_after_sync() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server.create(&service("db", "10.96.0.11", &[])).unwrap();
    for (name, addr) in [
        ("web-a", "10.0.0.1"),
        ("web-b", "10.0.0.2"),
        ("web-c", "10.0.0.3"),
    ] {
        server.create(&slice(name, "web", &[addr], &[])).unwrap();
    }
    server.create(&node("node-1", "a")).unwrap();

    let (mut source, run) =
        KubeSource::new(server.client().unwrap(), &cfg(Some("node-1"), None)).unwrap();
    // Nothing drives the watches yet: nothing is synced, nothing is seen.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!source.is_synced());
    assert_eq!(names(&source.snapshot()), (vec![], vec![], vec![]));
    assert!(server.requests().is_empty());

    tokio::spawn(run);
    timeout(WAIT, source.wait_synced())
        .await
        .expect("caches sync in time")
        .unwrap();
    assert!(source.is_synced());
    // Every slice of the Service is there at once, sorted.
    assert_eq!(
        names(&source.snapshot()),
        (
            vec!["db".into(), "web".into()],
            vec!["web-a".into(), "web-b".into(), "web-c".into()],
            vec!["node-1".into()],
        )
    );
    // Synced state counts as seen: no change is pending.
    assert_quiet(&mut source, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn other_proxys_objects_and_headless_slices_are_not_watched() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server
        .create(&service("theirs", "10.96.0.11", &[(PROXY_LABEL, "other")]))
        .unwrap();
    server.create(&service("headless", "None", &[])).unwrap();
    server
        .create(&slice("web-a", "web", &["10.0.0.1"], &[]))
        .unwrap();
    server
        .create(&slice(
            "theirs-a",
            "theirs",
            &["10.0.0.2"],
            &[(PROXY_LABEL, "other")],
        ))
        .unwrap();
    server
        .create(&slice(
            "headless-a",
            "headless",
            &["10.0.0.3"],
            &[(HEADLESS_LABEL, "")],
        ))
        .unwrap();

    let mut source = started(&server, &cfg(None, None)).await;
    // A headless Service carries no label (the compiler passes it over); its slices do.
    assert_eq!(
        names(&source.snapshot()),
        (
            vec!["headless".into(), "web".into()],
            vec!["web-a".into()],
            vec![]
        )
    );
    // The filter is the server's: kube-proxy's selector on every list and watch.
    until_watching(&server, 2).await;
    let selector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
    let requests = server.requests();
    for path in [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
    ] {
        let mine: Vec<_> = requests.iter().filter(|r| r.path == path).collect();
        assert!(mine.iter().any(|r| !r.is_watch()), "{path} listed");
        assert!(mine.iter().any(|r| r.is_watch()), "{path} watched");
        assert!(
            mine.iter()
                .all(|r| r.param("labelSelector") == Some(selector)),
            "{mine:?}"
        );
    }
    assert!(
        !requests.iter().any(|r| r.path.contains("nodes")),
        "no node name, no Node watch"
    );

    // Handing a Service to another proxy later makes it vanish; taking it back, return.
    server
        .replace(&service("web", "10.96.0.10", &[(PROXY_LABEL, "other")]))
        .unwrap();
    until(&mut source, "web handed over", |o| {
        names(o).0 == vec!["headless".to_string()]
    })
    .await;
    server.replace(&service("web", "10.96.0.10", &[])).unwrap();
    until(&mut source, "web back", |o| o.services.len() == 2).await;
    // Changes to objects outside the selector never wake the source.
    server
        .replace(&slice(
            "theirs-a",
            "theirs",
            &["10.0.0.9"],
            &[(PROXY_LABEL, "other")],
        ))
        .unwrap();
    assert_quiet(&mut source, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn own_proxy_name_selects_only_objects_labelled_with_it() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("plain", "10.96.0.10", &[])).unwrap();
    server
        .create(&service("ours", "10.96.0.11", &[(PROXY_LABEL, "sliceway")]))
        .unwrap();
    server
        .create(&service("theirs", "10.96.0.12", &[(PROXY_LABEL, "other")]))
        .unwrap();
    server
        .create(&slice(
            "ours-a",
            "ours",
            &["10.0.0.1"],
            &[(PROXY_LABEL, "sliceway")],
        ))
        .unwrap();
    server
        .create(&slice("plain-a", "plain", &["10.0.0.2"], &[]))
        .unwrap();

    let source = started(&server, &cfg(None, Some("sliceway"))).await;
    assert_eq!(
        names(&source.snapshot()),
        (vec!["ours".into()], vec!["ours-a".into()], vec![])
    );
    assert!(server.requests().iter().all(|r| r.param("labelSelector")
        == Some(
            "service.kubernetes.io/service-proxy-name=sliceway,!service.kubernetes.io/headless"
        )));
}

#[tokio::test]
async fn adds_modifications_and_deletes_propagate() {
    let server = ApiServer::start().await.unwrap();
    let mut source = started(&server, &cfg(None, None)).await;
    assert_eq!(names(&source.snapshot()), (vec![], vec![], vec![]));

    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server
        .create(&slice("web-a", "web", &["10.0.0.1"], &[]))
        .unwrap();
    until(&mut source, "web and its slice", |o| {
        o.services.len() == 1 && o.slices.len() == 1
    })
    .await;
    let stored = &source.snapshot().slices[0];
    assert_eq!(
        stored.metadata.resource_version.as_deref(),
        Some(server.resource_version().to_string().as_str())
    );

    server
        .replace(&slice("web-a", "web", &["10.0.0.1", "10.0.0.2"], &[]))
        .unwrap();
    until(&mut source, "second endpoint", |o| {
        slice_addrs(o, "web-a") == ["10.0.0.1", "10.0.0.2"]
    })
    .await;

    server
        .delete::<EndpointSlice>(Some("default"), "web-a")
        .unwrap();
    until(&mut source, "slice deleted", |o| o.slices.is_empty()).await;
    server.delete::<Service>(Some("default"), "web").unwrap();
    until(&mut source, "service deleted", |o| o.services.is_empty()).await;
}

#[tokio::test]
async fn a_burst_of_slice_updates_is_one_batch() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server
        .create(&slice("web-a", "web", &["10.0.0.1"], &[]))
        .unwrap();
    let mut source = started(&server, &cfg(None, None)).await;

    for i in 0..50 {
        let addr = format!("10.0.1.{i}");
        server
            .replace(&slice("web-a", "web", &[&addr], &[]))
            .unwrap();
    }
    let mut batches = Vec::new();
    while let Ok(batch) = timeout(
        Duration::from_millis(800),
        source.next_batch(Duration::from_millis(300)),
    )
    .await
    {
        batches.push(batch.unwrap().changes);
    }
    assert_eq!(batches.iter().sum::<u64>(), 50, "{batches:?}");
    assert!(
        batches.len() <= 2,
        "a burst should be one sync: {batches:?}"
    );
    assert_eq!(slice_addrs(&source.snapshot(), "web-a"), ["10.0.1.49"]);
}

#[tokio::test]
async fn a_dropped_watch_resumes_from_its_last_resource_version() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server
        .create(&slice("web-a", "web", &["10.0.0.1"], &[]))
        .unwrap();
    let mut source = started(&server, &cfg(Some("node-1"), None)).await;
    until_watching(&server, 3).await;

    server
        .replace(&slice("web-a", "web", &["10.0.0.2"], &[]))
        .unwrap();
    let last_seen = server.resource_version();
    until(&mut source, "update", |o| {
        slice_addrs(o, "web-a") == ["10.0.0.2"]
    })
    .await;
    let before = server.requests().len();

    server.drop_watches();
    let deadline = Instant::now() + WAIT;
    let after = loop {
        let after = server.requests().split_off(before);
        if after.len() >= 3 {
            break after;
        }
        assert!(Instant::now() < deadline, "no re-watch: {after:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        after.iter().all(|r| r.is_watch()),
        "resumed without relisting: {after:?}"
    );
    let slices_watch = after
        .iter()
        .find(|r| r.path == "/apis/discovery.k8s.io/v1/endpointslices")
        .expect("slices re-watched");
    assert_eq!(
        slices_watch.param("resourceVersion"),
        Some(last_seen.to_string().as_str())
    );

    server
        .create(&slice("web-b", "web", &["10.0.0.3"], &[]))
        .unwrap();
    until(&mut source, "change after the resume", |o| {
        o.slices.len() == 2
    })
    .await;
}

#[tokio::test]
async fn changes_made_while_the_connection_was_cut_are_not_lost() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server
        .create(&slice("web-a", "web", &["10.0.0.1"], &[]))
        .unwrap();
    let mut source = started(&server, &cfg(None, None)).await;
    until_watching(&server, 2).await;

    // No await in between: the source cannot see these before its watches are cut.
    server.abort_watches();
    server
        .replace(&slice("web-a", "web", &["10.0.0.2"], &[]))
        .unwrap();
    server.delete::<Service>(Some("default"), "web").unwrap();

    until(&mut source, "changes from the outage", |o| {
        o.services.is_empty() && slice_addrs(o, "web-a") == ["10.0.0.2"]
    })
    .await;
    let lists = server.requests().iter().filter(|r| !r.is_watch()).count();
    assert_eq!(lists, 2, "history was kept, so no relist");
}

#[tokio::test]
async fn an_expired_resource_version_relists_and_drops_what_vanished() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server
        .create(&slice("web-a", "web", &["10.0.0.1"], &[]))
        .unwrap();
    server
        .create(&slice("web-b", "web", &["10.0.0.2"], &[]))
        .unwrap();
    let mut source = started(&server, &cfg(None, None)).await;
    until_watching(&server, 2).await;

    server.drop_watches();
    server
        .delete::<EndpointSlice>(Some("default"), "web-a")
        .unwrap();
    server
        .create(&slice("web-c", "web", &["10.0.0.3"], &[]))
        .unwrap();
    server.compact();

    until(&mut source, "relisted state", |o| {
        names(o).1 == ["web-b".to_string(), "web-c".to_string()]
    })
    .await;
    let slice_lists = server
        .requests()
        .iter()
        .filter(|r| r.path == "/apis/discovery.k8s.io/v1/endpointslices" && !r.is_watch())
        .count();
    assert_eq!(slice_lists, 2, "410 Gone makes the watcher relist");
}

#[tokio::test]
async fn own_node_is_watched_by_name_only() {
    let server = ApiServer::start().await.unwrap();
    server.create(&node("node-1", "a")).unwrap();
    server.create(&node("node-2", "b")).unwrap();
    let mut source = started(&server, &cfg(Some("node-1"), None)).await;
    assert_eq!(names(&source.snapshot()).2, ["node-1"]);
    let node_requests: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/nodes")
        .collect();
    assert!(!node_requests.is_empty());
    for r in &node_requests {
        assert_eq!(r.param("fieldSelector"), Some("metadata.name=node-1"));
        assert_eq!(r.param("labelSelector"), None);
    }

    server.replace(&node("node-2", "c")).unwrap();
    assert_quiet(&mut source, Duration::from_millis(300)).await;
    server.replace(&node("node-1", "z")).unwrap();
    until(&mut source, "own node's new zone", |o| {
        o.nodes[0].metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"] == "z"
    })
    .await;
}

#[tokio::test]
async fn failing_requests_are_retried_until_the_caches_sync() {
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    // The first list of each of the three kinds fails.
    server.fail_requests(3);
    let source = started(&server, &cfg(Some("node-1"), None)).await;
    assert_eq!(names(&source.snapshot()).0, ["web"]);
    let lists = server.requests().iter().filter(|r| !r.is_watch()).count();
    assert_eq!(lists, 6, "each kind listed twice");
}

#[tokio::test]
async fn the_source_stops_when_its_task_is_aborted() {
    let server = ApiServer::start().await.unwrap();
    let (mut source, task) = KubeSource::start(server.client().unwrap(), &cfg(None, None)).unwrap();
    task.abort();
    let r = timeout(WAIT, source.wait_synced())
        .await
        .expect("does not hang");
    assert!(matches!(r, Err(Error::Stopped)), "{r:?}");
    assert!(matches!(source.changed().await, Err(Error::Stopped)));
}

// Store logic, fed with scripted watcher events (no server).

type Events<K> = mpsc::UnboundedSender<watcher::Result<watcher::Event<K>>>;

struct Script {
    services: Events<Service>,
    slices: Events<EndpointSlice>,
    nodes: Events<Node>,
}

fn scripted() -> (KubeSource, Script) {
    let (services, s_rx) = mpsc::unbounded();
    let (slices, e_rx) = mpsc::unbounded();
    let (nodes, n_rx) = mpsc::unbounded();
    let (source, run) = KubeSource::from_streams(s_rx, e_rx, n_rx);
    tokio::spawn(run);
    (
        source,
        Script {
            services,
            slices,
            nodes,
        },
    )
}

fn send<K>(tx: &Events<K>, events: Vec<watcher::Event<K>>) {
    for e in events {
        tx.unbounded_send(Ok(e)).unwrap();
    }
}

fn listed<K>(objects: Vec<K>) -> Vec<watcher::Event<K>> {
    let mut events = vec![watcher::Event::Init];
    events.extend(objects.into_iter().map(watcher::Event::InitApply));
    events.push(watcher::Event::InitDone);
    events
}

#[tokio::test]
async fn not_synced_until_every_kind_has_listed() {
    let (mut source, script) = scripted();
    send(
        &script.services,
        listed(vec![service("web", "10.96.0.10", &[])]),
    );
    send(&script.nodes, listed(vec![]));
    // Slices are still listing.
    send(
        &script.slices,
        vec![
            watcher::Event::Init,
            watcher::Event::InitApply(slice("web-a", "web", &["10.0.0.1"], &[])),
        ],
    );
    assert!(timeout(Duration::from_millis(200), source.wait_synced())
        .await
        .is_err());
    assert!(!source.is_synced());
    assert!(
        source.snapshot().slices.is_empty(),
        "a partial list is not visible"
    );

    send(
        &script.slices,
        vec![
            watcher::Event::InitApply(slice("web-b", "web", &["10.0.0.2"], &[])),
            watcher::Event::InitDone,
        ],
    );
    timeout(WAIT, source.wait_synced()).await.unwrap().unwrap();
    assert_eq!(
        names(&source.snapshot()),
        (
            vec!["web".into()],
            vec!["web-a".into(), "web-b".into()],
            vec![]
        )
    );
}

#[tokio::test]
async fn a_relist_replaces_the_store_only_when_complete() {
    let (mut source, script) = scripted();
    send(&script.services, listed(vec![]));
    send(&script.nodes, listed(vec![]));
    send(
        &script.slices,
        listed(vec![
            slice("a", "web", &["10.0.0.1"], &[]),
            slice("b", "web", &["10.0.0.2"], &[]),
            slice("c", "web", &["10.0.0.3"], &[]),
        ]),
    );
    timeout(WAIT, source.wait_synced()).await.unwrap().unwrap();

    // The watcher relists (after 410 Gone, say): the old state stays until the end.
    send(
        &script.slices,
        vec![
            watcher::Event::Init,
            watcher::Event::InitApply(slice("a", "web", &["10.0.0.1"], &[])),
        ],
    );
    assert_quiet(&mut source, Duration::from_millis(200)).await;
    assert_eq!(names(&source.snapshot()).1, ["a", "b", "c"]);
    send(&script.slices, vec![watcher::Event::InitDone]);
    let batch = timeout(WAIT, source.changed()).await.unwrap().unwrap();
    assert_eq!(batch.changes, 1);
    assert_eq!(names(&source.snapshot()).1, ["a"]);
}

#[tokio::test]
async fn watcher_errors_do_not_end_the_source() {
    let (mut source, script) = scripted();
    send(&script.services, listed(vec![]));
    send(&script.nodes, listed(vec![]));
    send(&script.slices, listed(vec![]));
    timeout(WAIT, source.wait_synced()).await.unwrap().unwrap();
    script
        .slices
        .unbounded_send(Err(watcher::Error::NoResourceVersion))
        .unwrap();
    send(
        &script.slices,
        vec![watcher::Event::Apply(slice("a", "web", &["10.0.0.1"], &[]))],
    );
    // Delivered after the backoff.
    timeout(WAIT, source.changed()).await.unwrap().unwrap();
    assert_eq!(names(&source.snapshot()).1, ["a"]);
    // Ending every stream stops the source.
    drop(script);
    let stopped = timeout(WAIT, source.changed()).await.unwrap();
    assert!(matches!(stopped, Err(Error::Stopped)), "{stopped:?}");
}

#[tokio::test]
async fn watch_streams_are_served_as_newline_delimited_json() {
    // The server itself, through kube::Api: list, then watch from the list's version.
    use kube::api::{Api, ListParams, WatchEvent, WatchParams};
    let server = ApiServer::start().await.unwrap();
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    let api: Api<Service> = Api::namespaced(server.client().unwrap(), "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();
    let mut events = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    server.create(&service("db", "10.96.0.11", &[])).unwrap();
    server.bookmark();
    match events.next().await.unwrap().unwrap() {
        WatchEvent::Added(s) => assert_eq!(s.metadata.name.as_deref(), Some("db")),
        other => panic!("{other:?}"),
    }
    match events.next().await.unwrap().unwrap() {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata.resource_version,
                server.resource_version().to_string()
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        api.get("db").await.unwrap().metadata.name.as_deref(),
        Some("db")
    );
    assert!(api.get("nope").await.is_err());
}

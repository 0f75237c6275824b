//! The agent's Kubernetes API source against the real kube-apiserver (etcd and
//! kube-apiserver of the upstream kit, one control plane for this test binary, real
//! TLS and RBAC; `kube::Client` and kube-rs watchers in the path), and its store logic
//! fed with scripted watcher events. No root needed.
//!
//! Tests run in parallel on the one control plane: each works in a namespace of its
//! own and names its Nodes after it. A source without a service proxy name sees every
//! test's objects, so such tests look only at their namespace; tests that count
//! changes give their objects a proxy name of their own and watch only that.
//!
//! Faults come from the real thing: a [`Forwarder`] between source and API server
//! cuts connections (watches end mid-stream) or turns them away for a while; etcd
//! compaction expires resourceVersions (410 Gone); an identity without RBAC grants is
//! refused (403) until it gets them. This binary's API server serves EndpointSlice
//! watches straight from etcd (its watch cache is off for that one resource,
//! [`SLICES_FROM_ETCD`]), because the watch cache would otherwise still serve a
//! compacted resourceVersion; Services and Nodes go through the watch cache as usual.

use std::{fmt::Debug, time::Duration};

use futures::channel::mpsc;
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::watcher,
    Api, Client, Resource,
};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::json;
use sliceway_agent::{
    source::kube::{Error, KubeSource, KubeSourceConfig},
    source::local::Objects,
};
use sliceway_lab::cluster::{
    self,
    api::{recording_client, unique, Recorded, Requests},
    Cluster, Forwarder,
};
use tokio::{
    sync::RwLock,
    time::{timeout, Instant},
};

/// Generous: the watcher's first retry after an error waits about a second.
const WAIT: Duration = Duration::from_secs(20);
const PROXY_LABEL: &str = "service.kubernetes.io/service-proxy-name";
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
const SERVICES: &str = "/api/v1/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const NODES: &str = "/api/v1/nodes";
const SERVICE_CIDRS: &str = "/apis/networking.k8s.io/v1/servicecidrs";
/// kube-apiserver flag of this binary's control plane: EndpointSlice watches are
/// served by etcd, so compaction can expire them.
const SLICES_FROM_ETCD: &str = "--watch-cache-sizes=endpointslices.discovery.k8s.io#0";

/// Compacting etcd expires the history every test that cuts its watches resumes
/// from: those tests hold this for reading, the one that compacts for writing.
static HISTORY: RwLock<()> = RwLock::const_new(());

fn service(name: &str, ip: &str, labels: &[(&str, &str)]) -> Service {
    let labels: serde_json::Map<_, _> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut spec = json!({
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
    });
    // Without an address the API server allocates one.
    if !ip.is_empty() {
        spec["clusterIP"] = json!(ip);
        spec["clusterIPs"] = json!([ip]);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }))
    .unwrap()
}

fn slice(name: &str, service: &str, addrs: &[&str], labels: &[(&str, &str)]) -> EndpointSlice {
    let mut all = serde_json::Map::new();
    all.insert("kubernetes.io/service-name".into(), json!(service));
    for (k, v) in labels {
        all.insert(k.to_string(), json!(v));
    }
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": all},
        "addressType": "IPv4",
        "endpoints": endpoints(addrs),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

fn endpoints(addrs: &[&str]) -> serde_json::Value {
    addrs
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect()
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

/// Names of the Services and EndpointSlices of namespace `ns` in a snapshot.
fn names_in(o: &Objects, ns: &str) -> (Vec<String>, Vec<String>) {
    let mine = |m: &kube::api::ObjectMeta| m.namespace.as_deref() == Some(ns);
    (
        o.services
            .iter()
            .filter(|s| mine(&s.metadata))
            .map(|s| s.metadata.name.clone().unwrap())
            .collect(),
        o.slices
            .iter()
            .filter(|s| mine(&s.metadata))
            .map(|s| s.metadata.name.clone().unwrap())
            .collect(),
    )
}

fn slice_addrs(o: &Objects, ns: &str, name: &str) -> Vec<String> {
    o.slices
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
        })
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect()
}

/// A kind the tests write, with the API it is reached through.
trait Kind: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug {
    fn api(client: Client, ns: &str) -> Api<Self>;
}

macro_rules! kinds {
    (namespaced: $($n:ty),*; cluster: $($c:ty),*) => {
        $(impl Kind for $n {
            fn api(client: Client, ns: &str) -> Api<Self> {
                Api::namespaced(client, ns)
            }
        })*
        $(impl Kind for $c {
            fn api(client: Client, _: &str) -> Api<Self> {
                Api::all(client)
            }
        })*
    };
}
kinds!(namespaced: Service, EndpointSlice; cluster: Node, ClusterRole, ClusterRoleBinding);

/// A test's place on the shared control plane: its namespace and an admin client.
struct Env {
    cluster: &'static Cluster,
    ns: String,
    admin: Client,
}

impl Env {
    async fn new(prefix: &str) -> Self {
        let cluster =
            cluster::shared_control_plane_with(&[SLICES_FROM_ETCD]).expect("control plane");
        Self {
            cluster,
            ns: cluster.namespace(prefix).await.expect("namespace"),
            admin: cluster.client().await.expect("admin client"),
        }
    }

    /// The API of kind `K`: in this test's namespace, or cluster-wide for
    /// cluster-scoped kinds.
    fn api<K: Kind>(&self) -> Api<K> {
        K::api(self.admin.clone(), &self.ns)
    }

    async fn create<K>(&self, obj: &K) -> K
    where
        K: Kind,
    {
        self.api::<K>()
            .create(&PostParams::default(), obj)
            .await
            .unwrap_or_else(|e| panic!("creating {obj:?}: {e}"))
    }

    /// A JSON merge patch (lists in it replace the object's).
    async fn patch<K>(&self, name: &str, patch: serde_json::Value) -> K
    where
        K: Kind,
    {
        self.api::<K>()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("patching {} {name}: {e}", K::kind(&())))
    }

    async fn set_endpoints(&self, slice: &str, addrs: &[&str]) -> EndpointSlice {
        self.patch(slice, json!({"endpoints": endpoints(addrs)}))
            .await
    }

    async fn delete<K>(&self, name: &str)
    where
        K: Kind,
    {
        self.api::<K>()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting {} {name}: {e}", K::kind(&())));
    }

    /// The admin's client through `via` (if any) that records its requests.
    async fn recording(&self, via: Option<&Forwarder>) -> (Client, Requests) {
        let config = match via {
            Some(f) => self.cluster.config_via(f).await,
            None => self.cluster.config().await,
        }
        .expect("client configuration");
        recording_client(config).expect("client")
    }

    /// A forwarder to the API server on this process's loopback.
    fn forwarder(&self) -> Forwarder {
        self.cluster.forwarder(None, 0).expect("forwarder")
    }
}

async fn started(client: Client, cfg: &KubeSourceConfig) -> KubeSource {
    let (mut source, _task) = KubeSource::start(client, cfg).unwrap();
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

/// Waits until requests after the first `from` include a watch of every path in
/// `paths`, and returns those requests.
async fn until_watching(requests: &Requests, from: usize, paths: &[&str]) -> Vec<Recorded> {
    let deadline = Instant::now() + WAIT;
    loop {
        let after = requests.since(from);
        if paths
            .iter()
            .all(|p| after.iter().any(|r| r.path == *p && r.is_watch()))
        {
            return after;
        }
        assert!(
            Instant::now() < deadline,
            "no watch of all {paths:?}: {after:?}"
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

/// Lists of `path` that fill the store (the watcher's own): not watches, and not the
/// one-object lists by which a source asks whether a failing watch's kind answers
/// again (`limit=1`, for `/healthz`).
fn lists(requests: &[Recorded], path: &str) -> usize {
    requests
        .iter()
        .filter(|r| r.path == path && !r.is_watch() && r.param("limit") != Some("1"))
        .count()
}

#[tokio::test]
async fn initial_list_appears_in_snapshot_only_after_sync() {
    let env = Env::new("initial").await;
    // A proxy name of the test's own: the source sees nothing but the test's objects.
    let ours = [(PROXY_LABEL, env.ns.as_str())];
    let own_node = format!("{}-node", env.ns);
    env.create(&service("web", "", &ours)).await;
    env.create(&service("db", "", &ours)).await;
    for (name, addr) in [
        ("web-a", "10.0.0.1"),
        ("web-b", "10.0.0.2"),
        ("web-c", "10.0.0.3"),
    ] {
        env.create(&slice(name, "web", &[addr], &ours)).await;
    }
    env.create(&node(&own_node, "a")).await;

    let (client, requests) = env.recording(None).await;
    let (mut source, run) = KubeSource::new(client, &cfg(Some(&own_node), Some(&env.ns))).unwrap();
    // Nothing drives the watches yet: nothing is synced, nothing is seen.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!source.is_synced());
    assert_eq!(names(&source.snapshot()), (vec![], vec![], vec![]));
    assert!(requests.is_empty());

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
            vec![own_node],
        )
    );
    // Synced state counts as seen: no change is pending.
    assert_quiet(&mut source, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn other_proxys_objects_and_headless_slices_are_not_watched() {
    let env = Env::new("selectors").await;
    let ns = env.ns.as_str();
    env.create(&service("web", "", &[])).await;
    env.create(&service("theirs", "", &[(PROXY_LABEL, "other")]))
        .await;
    env.create(&service("headless", "None", &[])).await;
    env.create(&slice("web-a", "web", &["10.0.0.1"], &[])).await;
    env.create(&slice(
        "theirs-a",
        "theirs",
        &["10.0.0.2"],
        &[(PROXY_LABEL, "other")],
    ))
    .await;
    env.create(&slice(
        "headless-a",
        "headless",
        &["10.0.0.3"],
        &[(HEADLESS_LABEL, "")],
    ))
    .await;

    let (client, requests) = env.recording(None).await;
    let mut source = started(client, &cfg(None, None)).await;
    // A headless Service carries no label (the compiler passes it over); its slices do.
    assert_eq!(
        names_in(&source.snapshot(), ns),
        (vec!["headless".into(), "web".into()], vec!["web-a".into()])
    );
    // The filter is the server's: kube-proxy's selector on every list and watch.
    let requests_now = until_watching(&requests, 0, &[SERVICES, SLICES]).await;
    let selector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
    for path in [SERVICES, SLICES] {
        let mine: Vec<_> = requests_now.iter().filter(|r| r.path == path).collect();
        assert!(mine.iter().any(|r| !r.is_watch()), "{path} listed");
        assert!(
            mine.iter()
                .all(|r| r.param("labelSelector") == Some(selector)),
            "{mine:?}"
        );
    }
    assert!(
        !requests.all().iter().any(|r| r.path.contains("nodes")),
        "no node name, no Node watch"
    );

    // Handing a Service to another proxy later makes it vanish; taking it back, return.
    env.patch::<Service>(
        "web",
        json!({"metadata": {"labels": {PROXY_LABEL: "other"}}}),
    )
    .await;
    until(&mut source, "web handed over", |o| {
        names_in(o, ns).0 == ["headless"]
    })
    .await;
    env.patch::<Service>("web", json!({"metadata": {"labels": {PROXY_LABEL: null}}}))
        .await;
    until(&mut source, "web back", |o| names_in(o, ns).0.len() == 2).await;
    // A change to an object outside the selector never reaches the source: the slice
    // watch delivers in order, so once a later change of web-a is in, theirs-a's would
    // have been recorded before it.
    env.set_endpoints("theirs-a", &["10.0.0.9"]).await;
    env.set_endpoints("web-a", &["10.0.0.4"]).await;
    until(&mut source, "web-a's new endpoint", |o| {
        slice_addrs(o, ns, "web-a") == ["10.0.0.4"]
    })
    .await;
    let changes = source.take_changes();
    let key = |name: &str| (Some(ns.to_string()), name.to_string());
    assert!(changes.slices.contains(&key("web-a")), "{changes:?}");
    assert!(!changes.slices.contains(&key("theirs-a")), "{changes:?}");
    assert!(!changes.slices.contains(&key("headless-a")), "{changes:?}");
    assert!(!changes.services.contains(&key("theirs")), "{changes:?}");
}

#[tokio::test]
async fn own_proxy_name_selects_only_objects_labelled_with_it() {
    let env = Env::new("proxy-name").await;
    let ours = [(PROXY_LABEL, env.ns.as_str())];
    env.create(&service("plain", "", &[])).await;
    env.create(&service("ours", "", &ours)).await;
    env.create(&service("theirs", "", &[(PROXY_LABEL, "other")]))
        .await;
    env.create(&slice("ours-a", "ours", &["10.0.0.1"], &ours))
        .await;
    env.create(&slice("plain-a", "plain", &["10.0.0.2"], &[]))
        .await;

    let (client, requests) = env.recording(None).await;
    let source = started(client, &cfg(None, Some(&env.ns))).await;
    // Not only in this namespace: nothing else in the cluster carries the name.
    assert_eq!(
        names(&source.snapshot()),
        (vec!["ours".into()], vec!["ours-a".into()], vec![])
    );
    let selector = format!(
        "service.kubernetes.io/service-proxy-name={},!service.kubernetes.io/headless",
        env.ns
    );
    let requests = requests.all();
    assert!(!requests.is_empty());
    // ServiceCIDRs are watched whole, as kube-proxy's informer without filters
    // watches them; every other request carries the selector.
    let (cidrs, others): (Vec<_>, Vec<_>) = requests.iter().partition(|r| r.path == SERVICE_CIDRS);
    assert!(!cidrs.is_empty(), "{requests:?}");
    assert!(
        cidrs.iter().all(|r| r.param("labelSelector").is_none()),
        "{requests:?}"
    );
    assert!(
        others
            .iter()
            .all(|r| r.param("labelSelector") == Some(selector.as_str())),
        "{requests:?}"
    );
}

#[tokio::test]
async fn adds_modifications_and_deletes_propagate() {
    let env = Env::new("propagate").await;
    let ns = env.ns.as_str();
    let (client, _) = env.recording(None).await;
    let mut source = started(client, &cfg(None, None)).await;
    assert_eq!(names_in(&source.snapshot(), ns), (vec![], vec![]));

    env.create(&service("web", "", &[])).await;
    let created = env.create(&slice("web-a", "web", &["10.0.0.1"], &[])).await;
    until(&mut source, "web and its slice", |o| {
        names_in(o, ns) == (vec!["web".to_string()], vec!["web-a".to_string()])
    })
    .await;
    let snapshot = source.snapshot();
    let stored = snapshot
        .slices
        .iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(ns))
        .unwrap();
    assert_eq!(
        stored.metadata.resource_version,
        created.metadata.resource_version
    );

    env.set_endpoints("web-a", &["10.0.0.1", "10.0.0.2"]).await;
    until(&mut source, "second endpoint", |o| {
        slice_addrs(o, ns, "web-a") == ["10.0.0.1", "10.0.0.2"]
    })
    .await;

    env.delete::<EndpointSlice>("web-a").await;
    until(&mut source, "slice deleted", |o| {
        names_in(o, ns).1.is_empty()
    })
    .await;
    env.delete::<Service>("web").await;
    until(&mut source, "service deleted", |o| {
        names_in(o, ns).0.is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_burst_of_slice_updates_is_one_batch() {
    let _history = HISTORY.read().await;
    let env = Env::new("burst").await;
    let ours = [(PROXY_LABEL, env.ns.as_str())];
    env.create(&service("web", "", &ours)).await;
    env.create(&slice("web-a", "web", &["10.0.0.1"], &ours))
        .await;
    let forwarder = env.forwarder();
    let (client, _) = env.recording(Some(&forwarder)).await;
    let mut source = started(client, &cfg(None, Some(&env.ns))).await;

    // The updates are made while the source cannot reach the server, so that they
    // reach it together, however slowly the server takes them.
    forwarder.hold();
    for i in 0..50 {
        env.set_endpoints("web-a", &[&format!("10.0.1.{i}")]).await;
    }
    forwarder.release();
    let mut batches = Vec::new();
    while let Ok(batch) = timeout(
        Duration::from_secs(3),
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
    assert_eq!(
        slice_addrs(&source.snapshot(), &env.ns, "web-a"),
        ["10.0.1.49"]
    );
}

#[tokio::test]
async fn a_dropped_watch_resumes_from_its_last_resource_version() {
    let _history = HISTORY.read().await;
    let env = Env::new("resume").await;
    let ours = [(PROXY_LABEL, env.ns.as_str())];
    let own_node = format!("{}-node", env.ns);
    env.create(&node(&own_node, "a")).await;
    env.create(&service("web", "", &ours)).await;
    env.create(&slice("web-a", "web", &["10.0.0.1"], &ours))
        .await;
    let forwarder = env.forwarder();
    let (client, requests) = env.recording(Some(&forwarder)).await;
    let mut source = started(client, &cfg(Some(&own_node), Some(&env.ns))).await;
    until_watching(&requests, 0, &[SERVICES, SLICES, NODES]).await;

    let last_seen = env.set_endpoints("web-a", &["10.0.0.2"]).await;
    until(&mut source, "update", |o| {
        slice_addrs(o, &env.ns, "web-a") == ["10.0.0.2"]
    })
    .await;
    let before = requests.len();

    // Every watch connection is cut mid-stream.
    forwarder.cut();
    let after = until_watching(&requests, before, &[SERVICES, SLICES, NODES]).await;
    assert!(
        after
            .iter()
            .all(|r| r.is_watch() || r.param("limit") == Some("1")),
        "resumed without relisting: {after:?}"
    );
    // The slice watch is served by etcd, which sends no bookmarks: it resumes from
    // exactly the last change the source saw.
    let slices_watch = after.iter().find(|r| r.path == SLICES).unwrap();
    assert_eq!(
        slices_watch.param("resourceVersion"),
        last_seen.metadata.resource_version.as_deref()
    );

    env.create(&slice("web-b", "web", &["10.0.0.3"], &ours))
        .await;
    until(&mut source, "change after the resume", |o| {
        o.slices.len() == 2
    })
    .await;
}

#[tokio::test]
async fn changes_made_while_the_connection_was_cut_are_not_lost() {
    let _history = HISTORY.read().await;
    let env = Env::new("outage").await;
    let ours = [(PROXY_LABEL, env.ns.as_str())];
    env.create(&service("web", "", &ours)).await;
    env.create(&slice("web-a", "web", &["10.0.0.1"], &ours))
        .await;
    let forwarder = env.forwarder();
    let (client, requests) = env.recording(Some(&forwarder)).await;
    let mut source = started(client, &cfg(None, Some(&env.ns))).await;
    until_watching(&requests, 0, &[SERVICES, SLICES]).await;

    // The API server is unreachable for the source while these happen.
    forwarder.hold();
    env.set_endpoints("web-a", &["10.0.0.2"]).await;
    env.delete::<Service>("web").await;
    forwarder.release();

    until(&mut source, "changes from the outage", |o| {
        o.services.is_empty() && slice_addrs(o, &env.ns, "web-a") == ["10.0.0.2"]
    })
    .await;
    let requests = requests.all();
    assert_eq!(
        lists(&requests, SERVICES) + lists(&requests, SLICES),
        2,
        "history was kept, so no relist: {requests:?}"
    );
}

#[tokio::test]
async fn an_expired_resource_version_relists_and_drops_what_vanished() {
    let env = Env::new("expired").await;
    let ours = [(PROXY_LABEL, env.ns.as_str())];
    env.create(&service("web", "", &ours)).await;
    env.create(&slice("web-a", "web", &["10.0.0.1"], &ours))
        .await;
    env.create(&slice("web-b", "web", &["10.0.0.2"], &ours))
        .await;
    let forwarder = env.forwarder();
    let (client, requests) = env.recording(Some(&forwarder)).await;
    let mut source = started(client, &cfg(None, Some(&env.ns))).await;
    until_watching(&requests, 0, &[SERVICES, SLICES]).await;
    assert!(source.take_changes().relisted, "the first list");

    // While the source is away, web-a goes, web-c comes, and etcd forgets the history
    // in between: the slice watch cannot resume and gets 410 Gone.
    let history = HISTORY.write().await;
    forwarder.hold();
    env.delete::<EndpointSlice>("web-a").await;
    env.create(&slice("web-c", "web", &["10.0.0.3"], &ours))
        .await;
    env.cluster.compact_etcd().unwrap();
    forwarder.release();
    drop(history);

    until(&mut source, "relisted state", |o| {
        names(o).1 == ["web-b".to_string(), "web-c".to_string()]
    })
    .await;
    assert_eq!(
        lists(&requests.all(), SLICES),
        2,
        "410 Gone makes the watcher relist"
    );
    // The agent learns that the store was read anew, so it recompiles from all of it.
    assert!(source.take_changes().relisted);
}

#[tokio::test]
async fn own_node_is_watched_by_name_only() {
    let env = Env::new("own-node").await;
    let (node_1, node_2) = (format!("{}-node-1", env.ns), format!("{}-node-2", env.ns));
    env.create(&node(&node_1, "a")).await;
    env.create(&node(&node_2, "b")).await;
    let (client, requests) = env.recording(None).await;
    // A proxy name of the test's own: the Node is the only thing that can change.
    let mut source = started(client, &cfg(Some(&node_1), Some(&env.ns))).await;
    assert_eq!(names(&source.snapshot()).2, std::slice::from_ref(&node_1));
    let node_requests: Vec<_> = requests
        .all()
        .into_iter()
        .filter(|r| r.path == NODES)
        .collect();
    assert!(!node_requests.is_empty());
    let field = format!("metadata.name={node_1}");
    for r in &node_requests {
        assert_eq!(r.param("fieldSelector"), Some(field.as_str()));
        assert_eq!(r.param("labelSelector"), None);
    }

    // node-2 changes first, then node-1: one watch, in order, so the one change the
    // source sees before node-1's new zone means node-2's never came.
    env.patch::<Node>(
        &node_2,
        json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "c"}}}),
    )
    .await;
    env.patch::<Node>(
        &node_1,
        json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z"}}}),
    )
    .await;
    let zone = |o: &Objects| {
        o.nodes[0].metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"].clone()
    };
    // Every store change since the sync, read until node-1's is in (it may already be
    // in the store when the loop starts, but its change is still counted once read).
    let mut changes = 0;
    while changes == 0 || zone(&source.snapshot()) != "z" {
        changes += timeout(WAIT, source.changed())
            .await
            .expect("own node's new zone")
            .unwrap()
            .changes;
    }
    assert_eq!(changes, 1);
    assert_eq!(names(&source.snapshot()).2, std::slice::from_ref(&node_1));

    // Fed to the compiler, the Node's zone is what topology hints are read against.
    let mut compiler =
        sliceway_agent::compiler::Incremental::new(sliceway_agent::compiler::Options {
            node_name: Some(node_1),
            ..Default::default()
        });
    source.feed(&source.take_changes(), &mut compiler);
    assert_eq!(compiler.options().zone.as_deref(), Some("z"));
}

/// An agent that starts before its RBAC is in place: every list is refused (403)
/// until the grant comes, then the watches recover and the caches sync.
#[tokio::test]
async fn refused_requests_are_retried_until_the_caches_sync() {
    let env = Env::new("forbidden").await;
    let user = unique("agent");
    let own_node = format!("{}-node", env.ns);
    env.create(&node(&own_node, "a")).await;
    env.create(&service("web", "", &[])).await;
    let mut config = env.cluster.config().await.unwrap();
    config.auth_info.impersonate = Some(user.clone());
    let (client, requests) = recording_client(config).unwrap();
    let (mut source, _task) = KubeSource::start(client, &cfg(Some(&own_node), None)).unwrap();

    // Each kind has been listed (and refused), and listed again after the backoff.
    let deadline = Instant::now() + WAIT;
    while [SERVICES, SLICES, NODES, SERVICE_CIDRS]
        .iter()
        .any(|p| lists(&requests.all(), p) < 2)
    {
        assert!(Instant::now() < deadline, "{:?}", requests.all());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!source.is_synced());

    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": user},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "nodes"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["servicecidrs"], "verbs": ["list", "watch"]},
        ],
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    env.create(&role).await;
    env.create(&binding).await;

    timeout(WAIT, source.wait_synced())
        .await
        .expect("caches sync once the grant is in")
        .unwrap();
    let snapshot = source.snapshot();
    assert_eq!(names_in(&snapshot, &env.ns).0, ["web"]);
    assert_eq!(names(&snapshot).2, [own_node]);
}

#[tokio::test]
async fn the_source_stops_when_its_task_is_aborted() {
    let env = Env::new("abort").await;
    let (mut source, task) = KubeSource::start(env.admin.clone(), &cfg(None, None)).unwrap();
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
    /// Listed empty already; held so that its stream ends with the others.
    _service_cidrs: Events<ServiceCIDR>,
}

/// A scripted source; its ServiceCIDRs listed already (none), the other kinds not.
fn scripted() -> (KubeSource, Script) {
    let (services, s_rx) = mpsc::unbounded();
    let (slices, e_rx) = mpsc::unbounded();
    let (nodes, n_rx) = mpsc::unbounded();
    let (service_cidrs, c_rx) = mpsc::unbounded();
    let (source, run) = KubeSource::from_streams(s_rx, e_rx, n_rx, c_rx);
    tokio::spawn(run);
    send(&service_cidrs, listed(vec![]));
    (
        source,
        Script {
            services,
            slices,
            nodes,
            _service_cidrs: service_cidrs,
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

/// The backends each Service's frontends have in `compiler`, compiled, by Service
/// name (ClusterIP markers left out).
fn compiled_backends(
    compiler: &mut sliceway_agent::compiler::Incremental,
) -> std::collections::BTreeMap<String, Vec<std::net::Ipv4Addr>> {
    compiler.compile();
    compiler
        .frontends()
        .iter()
        .filter(|(k, _)| !sliceway_agent::compiler::is_clusterip_marker(k))
        .map(|(_, f)| {
            let ips = f
                .backends
                .iter()
                .map(|b| std::net::Ipv4Addr::from(u32::from_be(b.addr_be)))
                .collect();
            (f.service.name.to_string(), ips)
        })
        .collect()
}

/// Issue 19: what the watches deliver passes the front door that objects of files
/// pass (`conventions::validate`, with what an API server may hold: leading zeros
/// that older releases stored are read as decimal). A refused object is kept from
/// the compiler (its earlier version removed), named with its field, and the
/// others go on.
#[tokio::test]
async fn objects_the_front_door_refuses_are_skipped_alone() {
    let (mut source, script) = scripted();
    send(
        &script.services,
        listed(vec![
            service("web", "10.96.0.10", &[]),
            service("bad", "10.96.7", &[]),
        ]),
    );
    send(&script.nodes, listed(vec![]));
    send(
        &script.slices,
        listed(vec![
            slice("web-a", "web", &["10.0.0.1", "010.000.000.002"], &[]),
            slice("web-b", "web", &["127.0.0.1"], &[]),
        ]),
    );
    timeout(WAIT, source.wait_synced()).await.unwrap().unwrap();
    let mut compiler = sliceway_agent::compiler::Incremental::default();
    let new = source.feed(&source.take_changes(), &mut compiler);
    assert_eq!(new.len(), 2, "both refusals are new: {new:?}");
    let refused = |source: &KubeSource| -> Vec<(String, String, String)> {
        source
            .refused()
            .into_iter()
            .map(|r| (r.kind.to_string(), r.name, r.field))
            .collect()
    };
    assert_eq!(
        compiled_backends(&mut compiler),
        [(
            "web".to_string(),
            vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()]
        )]
        .into()
    );
    let field = |kind: &str, name: &str, field: &str| (kind.into(), name.into(), field.into());
    assert_eq!(
        refused(&source),
        [
            field("EndpointSlice", "web-b", "endpoints[0].addresses[0]"),
            field("Service", "bad", "spec.clusterIPs[0]"),
        ]
    );
    assert!(source.refused()[0].reason.contains("loopback"));

    // The bad Service is mended; a good slice turns bad: it leaves the compiler.
    send(
        &script.services,
        vec![watcher::Event::Apply(service("bad", "10.96.0.11", &[]))],
    );
    send(
        &script.slices,
        vec![watcher::Event::Apply(slice(
            "web-a",
            "web",
            &["0.0.0.0"],
            &[],
        ))],
    );
    until(&mut source, "both changes", |o| {
        o.services.len() == 2
            && o.services
                .iter()
                .all(|s| s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) != Some("10.96.7"))
            && o.slices.iter().any(|s| {
                s.endpoints
                    .first()
                    .is_some_and(|e| e.addresses == ["0.0.0.0"])
            })
    })
    .await;
    let new = source.feed(&source.take_changes(), &mut compiler);
    assert_eq!(new.len(), 1, "only web-a is newly refused: {new:?}");
    assert_eq!(new[0].name, "web-a");
    assert_eq!(
        compiled_backends(&mut compiler),
        [("bad".to_string(), vec![]), ("web".to_string(), vec![])].into()
    );
    assert_eq!(
        refused(&source),
        [
            field("EndpointSlice", "web-a", "endpoints[0].addresses[0]"),
            field("EndpointSlice", "web-b", "endpoints[0].addresses[0]"),
        ]
    );
    // A refused object deleted is no longer refused.
    send(
        &script.slices,
        vec![watcher::Event::Delete(slice(
            "web-b",
            "web",
            &["127.0.0.1"],
            &[],
        ))],
    );
    until(&mut source, "web-b deleted", |o| o.slices.len() == 1).await;
    source.feed(&source.take_changes(), &mut compiler);
    assert_eq!(
        refused(&source),
        [field("EndpointSlice", "web-a", "endpoints[0].addresses[0]")]
    );
}

fn service_cidr(name: &str, cidrs: &[&str]) -> ServiceCIDR {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"cidrs": cidrs},
    }))
    .unwrap()
}

/// ServiceCIDRs (networking.k8s.io/v1) reach the compiler all together at each feed,
/// as kube-proxy's `ServiceCIDRConfig` hands them: added, changed and deleted; a
/// cidr that is not one is skipped with a message naming its object, the others
/// kept; and the source is not synced before they have listed.
#[tokio::test]
async fn service_cidrs_reach_the_compiler_and_a_bad_one_is_skipped_alone() {
    let (services, s_rx) = mpsc::unbounded();
    let (slices, e_rx) = mpsc::unbounded();
    let (nodes, n_rx) = mpsc::unbounded();
    let (cidrs, c_rx) = mpsc::unbounded();
    let (mut source, run) = KubeSource::from_streams(s_rx, e_rx, n_rx, c_rx);
    tokio::spawn(run);
    send(&services, listed(vec![]));
    send(&slices, listed(vec![]));
    send(&nodes, listed(vec![]));
    assert!(timeout(Duration::from_millis(200), source.wait_synced())
        .await
        .is_err());
    assert!(!source.is_synced(), "ServiceCIDRs have not listed");
    send(
        &cidrs,
        listed(vec![service_cidr(
            "kubernetes",
            &["10.96.0.0/16", "fd00:96::/112"],
        )]),
    );
    timeout(WAIT, source.wait_synced()).await.unwrap().unwrap();
    let mut compiler = sliceway_agent::compiler::Incremental::default();
    source.feed(&source.take_changes(), &mut compiler);
    let v4 = |c: &sliceway_agent::compiler::Incremental| -> Vec<String> {
        c.service_cidrs()
            .v4
            .iter()
            .map(|(a, len)| format!("{a}/{len}"))
            .collect()
    };
    assert_eq!(v4(&compiler), ["10.96.0.0/16"]);
    assert_eq!(compiler.service_cidrs().v6.len(), 1);
    assert!(compiler.skipped().is_empty());

    send(
        &cidrs,
        vec![watcher::Event::Apply(service_cidr(
            "extra",
            &["10.200.0.0/24", "10.201.0.1/24"],
        ))],
    );
    timeout(WAIT, source.changed()).await.unwrap().unwrap();
    source.feed(&source.take_changes(), &mut compiler);
    assert_eq!(v4(&compiler), ["10.96.0.0/16", "10.200.0.0/24"]);
    let skipped = compiler.skipped();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(
        (skipped[0].object.kind, skipped[0].object.name.as_str()),
        ("ServiceCIDR", "extra")
    );
    assert!(
        skipped[0].reason.contains("10.201.0.1/24"),
        "{}",
        skipped[0].reason
    );

    send(
        &cidrs,
        vec![watcher::Event::Delete(service_cidr(
            "kubernetes",
            &["10.96.0.0/16", "fd00:96::/112"],
        ))],
    );
    timeout(WAIT, source.changed()).await.unwrap().unwrap();
    source.feed(&source.take_changes(), &mut compiler);
    assert_eq!(v4(&compiler), ["10.200.0.0/24"]);
    assert!(compiler.service_cidrs().v6.is_empty());
}

/// The API server's own ServiceCIDR (`kubernetes`, made from its
/// `--service-cluster-ip-range`) is listed through the real API and fed to the
/// compiler. Read only: a ServiceCIDR made here would be seen by every other test's
/// source.
#[tokio::test]
async fn the_api_servers_default_service_cidr_is_read() {
    let env = Env::new("cidrs").await;
    let source = started(env.admin.clone(), &cfg(None, Some(&unique("none")))).await;
    let deadline = Instant::now() + WAIT;
    let mut compiler = sliceway_agent::compiler::Incremental::default();
    loop {
        source.feed(&source.take_changes(), &mut compiler);
        if !compiler.service_cidrs().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no ServiceCIDR: {:?}",
            source.snapshot().service_cidrs
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<_> = source
        .snapshot()
        .service_cidrs
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert!(names.iter().any(|n| n == "kubernetes"), "{names:?}");
    assert!(compiler.skipped().is_empty(), "{:?}", compiler.skipped());
}

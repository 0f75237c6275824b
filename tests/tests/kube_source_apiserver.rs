//! The agent's Kubernetes API source against the real kube-apiserver (the cluster
//! lab's shared control plane): the initial list and the sync gate, kube-proxy's
//! label selectors evaluated by the server, adds, modifications and deletes, and the
//! agent's own Node watched by name. Each phase works in a namespace of its own and
//! looks only at it, since the source watches the whole cluster.
//!
//! Faults the real server cannot be made to produce on demand (a request that fails
//! until the caches sync, a watch dropped mid-stream, an expired resourceVersion at a
//! chosen moment) stay in `kube_source.rs`, on the in-memory server.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    api::{DeleteParams, PostParams},
    Api, Client,
};
use serde_json::json;
use sliceway_agent::{
    kube_source::{KubeSource, KubeSourceConfig},
    local::Objects,
};
use sliceway_lab::cluster;
use tokio::time::{timeout, Instant};

const WAIT: Duration = Duration::from_secs(20);
const PROXY_LABEL: &str = "service.kubernetes.io/service-proxy-name";
const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

fn service(ns: &str, name: &str, headless: bool, labels: &[(&str, &str)]) -> Service {
    let labels: serde_json::Map<_, _> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut spec =
        json!({"ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]});
    if headless {
        spec["clusterIP"] = json!("None");
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": spec,
    }))
    .unwrap()
}

fn slice(
    ns: &str,
    name: &str,
    service: &str,
    addrs: &[&str],
    labels: &[(&str, &str)],
) -> EndpointSlice {
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
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": all},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

/// (services, slices, nodes) of namespace `ns` (nodes: those named with `ns`).
fn names(o: &Objects, ns: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mine = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.namespace.as_deref() == Some(ns)
    };
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
        o.nodes
            .iter()
            .filter_map(|n| n.metadata.name.clone())
            .filter(|n| n.starts_with(ns))
            .collect(),
    )
}

async fn until(source: &mut KubeSource, what: &str, ok: impl Fn(&Objects) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        if ok(&source.snapshot()) {
            return;
        }
        if tokio::time::timeout_at(deadline, source.changed())
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}");
        }
    }
}

async fn namespace(client: &Client, ns: &str) -> Result<()> {
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &obj)
        .await?;
    Ok(())
}

async fn started(client: &Client, cfg: KubeSourceConfig) -> KubeSource {
    let (mut source, run) = KubeSource::new(client.clone(), &cfg).unwrap();
    tokio::spawn(run);
    timeout(WAIT, source.wait_synced())
        .await
        .expect("caches sync in time")
        .unwrap();
    source
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agents_source_on_the_real_api_server() -> Result<()> {
    let cp = cluster::shared_control_plane()?;
    let client = cp.client().await?;
    let pp = PostParams::default();
    let run = std::process::id();

    // Initial list: every object is there when the source says it is synced.
    let ns = format!("list-{run}");
    namespace(&client, &ns).await?;
    let services = Api::<Service>::namespaced(client.clone(), &ns);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns);
    services
        .create(&pp, &service(&ns, "web", false, &[]))
        .await?;
    services
        .create(&pp, &service(&ns, "db", false, &[]))
        .await?;
    for (name, addr) in [
        ("web-a", "10.0.0.1"),
        ("web-b", "10.0.0.2"),
        ("web-c", "10.0.0.3"),
    ] {
        slices
            .create(&pp, &slice(&ns, name, "web", &[addr], &[]))
            .await?;
    }
    let node_name = format!("{ns}-node");
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": node_name, "labels": {"topology.kubernetes.io/zone": "a"}}}),
    )?;
    Api::<Node>::all(client.clone()).create(&pp, &node).await?;
    let other: Node = serde_json::from_value(json!({"metadata": {"name": format!("{ns}-other")}}))?;
    Api::<Node>::all(client.clone()).create(&pp, &other).await?;
    let (source, run_source) = KubeSource::new(
        client.clone(),
        &KubeSourceConfig {
            node_name: Some(node_name.clone()),
            proxy_name: None,
        },
    )?;
    assert!(!source.is_synced(), "synced before any list");
    tokio::spawn(run_source);
    let mut source = source;
    timeout(WAIT, source.wait_synced())
        .await
        .expect("caches sync in time")?;
    assert_eq!(
        names(&source.snapshot(), &ns),
        (
            vec!["db".into(), "web".into()],
            vec!["web-a".into(), "web-b".into(), "web-c".into()],
            vec![node_name.clone()],
        ),
        "every object at sync, and only the agent's own Node"
    );

    // Adds, modifications and deletes reach the snapshot.
    slices
        .create(&pp, &slice(&ns, "db-a", "db", &["10.0.1.1"], &[]))
        .await?;
    until(&mut source, "db-a added", |o| {
        names(o, &ns).1.contains(&"db-a".to_string())
    })
    .await;
    slices
        .replace("db-a", &pp, &{
            let mut s = slice(&ns, "db-a", "db", &["10.0.1.1", "10.0.1.2"], &[]);
            s.metadata.resource_version = slices.get("db-a").await?.metadata.resource_version;
            s
        })
        .await?;
    until(&mut source, "db-a's second endpoint", |o| {
        o.slices.iter().any(|s| {
            s.metadata.namespace.as_deref() == Some(ns.as_str())
                && s.metadata.name.as_deref() == Some("db-a")
                && s.endpoints.len() == 2
        })
    })
    .await;
    slices.delete("db-a", &DeleteParams::default()).await?;
    services.delete("db", &DeleteParams::default()).await?;
    until(&mut source, "db and db-a deleted", |o| {
        let (svcs, sl, _) = names(o, &ns);
        !svcs.contains(&"db".to_string()) && !sl.contains(&"db-a".to_string())
    })
    .await;

    // kube-proxy's selectors, evaluated by the server: another proxy's Services and
    // slices and headless Services' slices are never seen; handing a Service over
    // makes it vanish, taking it back brings it back.
    let ns = format!("select-{run}");
    namespace(&client, &ns).await?;
    let services = Api::<Service>::namespaced(client.clone(), &ns);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns);
    services
        .create(&pp, &service(&ns, "web", false, &[]))
        .await?;
    services
        .create(
            &pp,
            &service(&ns, "theirs", false, &[(PROXY_LABEL, "other")]),
        )
        .await?;
    services
        .create(&pp, &service(&ns, "headless", true, &[]))
        .await?;
    slices
        .create(&pp, &slice(&ns, "web-a", "web", &["10.0.0.1"], &[]))
        .await?;
    slices
        .create(
            &pp,
            &slice(
                &ns,
                "theirs-a",
                "theirs",
                &["10.0.0.2"],
                &[(PROXY_LABEL, "other")],
            ),
        )
        .await?;
    slices
        .create(
            &pp,
            &slice(
                &ns,
                "headless-a",
                "headless",
                &["10.0.0.3"],
                &[(HEADLESS_LABEL, "")],
            ),
        )
        .await?;
    until(&mut source, "the selected objects", |o| {
        names(o, &ns).0 == ["headless", "web"] && names(o, &ns).1 == ["web-a"]
    })
    .await;
    let mut web = services.get("web").await?;
    web.metadata
        .labels
        .get_or_insert_default()
        .insert(PROXY_LABEL.into(), "other".into());
    services.replace("web", &pp, &web).await?;
    until(&mut source, "web handed to another proxy", |o| {
        names(o, &ns).0 == ["headless"]
    })
    .await;
    let mut web = services.get("web").await?;
    web.metadata
        .labels
        .get_or_insert_default()
        .remove(PROXY_LABEL);
    services.replace("web", &pp, &web).await?;
    until(&mut source, "web back", |o| {
        names(o, &ns).0 == ["headless", "web"]
    })
    .await;

    // With its own proxy name, the agent sees only what carries that name.
    let ours = started(
        &client,
        KubeSourceConfig {
            node_name: None,
            proxy_name: Some("sliceway".into()),
        },
    )
    .await;
    services
        .create(
            &pp,
            &service(&ns, "ours", false, &[(PROXY_LABEL, "sliceway")]),
        )
        .await?;
    slices
        .create(
            &pp,
            &slice(
                &ns,
                "ours-a",
                "ours",
                &["10.0.0.4"],
                &[(PROXY_LABEL, "sliceway")],
            ),
        )
        .await?;
    let mut ours = ours;
    until(&mut ours, "ours", |o| {
        names(o, &ns).0 == ["ours"] && names(o, &ns).1 == ["ours-a"]
    })
    .await;
    assert_eq!(
        names(&ours.snapshot(), &ns).0,
        ["ours"],
        "only the labelled Service"
    );
    Ok(())
}

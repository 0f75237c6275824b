//! sliceway-controller's API edge against the real kube-apiserver (the cluster lab's
//! shared control plane): a plan's creates, updates and deletes as the server stores
//! them, the slice tracker fed by what the server answered, and the sweep of
//! Endpoints and mirrored slices whose Service is gone. Each test works in a
//! namespace of its own.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
};

use anyhow::Result;
use controller::{
    controller::{apply_plan, orphans, sweep, Context, SliceTracker, Stores},
    metrics::Metrics,
    plan::{Object, Plan},
    store, util,
};
use k8s_openapi::api::{
    core::v1::{Endpoints, Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    api::{ListParams, PostParams},
    runtime::{
        events::{Recorder, Reporter},
        reflector::{self, Store},
        watcher,
    },
    Api, Client,
};
use serde_json::json;
use sliceway_lab::cluster;

async fn namespace(client: &Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

fn slice(
    ns: &str,
    name: Option<&str>,
    service: &str,
    managed_by: &str,
    addr: &str,
) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "generateName": format!("{service}-"), "namespace": ns,
            "labels": {util::LABEL_SERVICE_NAME: service, util::LABEL_MANAGED_BY: managed_by},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [addr], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap()
}

fn endpoints(ns: &str, name: &str, annotations: serde_json::Value) -> Endpoints {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "subsets": [{"addresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 8080}]}],
    }))
    .unwrap()
}

async fn names<K>(api: &Api<K>) -> Result<BTreeSet<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|o| o.meta().name.clone())
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plan_is_stored_as_written_and_the_tracker_knows_each_generation() -> Result<()> {
    let cp = cluster::shared_control_plane()?;
    let client = cp.client().await?;
    let ns = format!("plan-{}", std::process::id());
    namespace(&client, &ns).await?;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns);
    let eps = Api::<Endpoints>::namespaced(client.clone(), &ns);
    let managed = util::CONTROLLER_NAME;
    // What an earlier pass left: a slice to update.
    let old = slices
        .create(
            &PostParams::default(),
            &slice(&ns, Some("web-old"), "web", managed, "10.0.0.1"),
        )
        .await?;

    let mut updated = old.clone();
    updated.endpoints[0].addresses = vec!["10.0.0.2".into()];
    let plan = Plan {
        create: vec![
            Object::EndpointSlice(slice(&ns, None, "web", managed, "10.0.0.3")),
            Object::Endpoints(endpoints(&ns, "web", json!({}))),
        ],
        update: vec![Object::EndpointSlice(updated)],
        // Already gone: a delete that finds nothing is not an error.
        delete: vec![Object::EndpointSlice(slice(
            &ns,
            Some("web-gone"),
            "web",
            managed,
            "10.0.0.4",
        ))],
    };
    let tracker = Mutex::new(SliceTracker::default());
    apply_plan(&client, &plan, "sliceway-controller", "svc-uid", &tracker).await?;

    let stored = slices.list(&ListParams::default()).await?.items;
    assert_eq!(stored.len(), 2, "{stored:?}");
    let created = stored
        .iter()
        .find(|s| s.metadata.name.as_deref() != Some("web-old"))
        .expect("the created slice");
    assert!(created
        .metadata
        .name
        .as_deref()
        .unwrap()
        .starts_with("web-"));
    let web_old = stored
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("web-old"))
        .unwrap();
    assert_eq!(web_old.endpoints[0].addresses, ["10.0.0.2"]);
    assert_eq!(web_old.metadata.generation, Some(2));
    // Writes carry the field manager.
    let managers: Vec<String> = web_old
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&"sliceway-controller".to_string()),
        "{managers:?}"
    );
    assert_eq!(names(&eps).await?, BTreeSet::from(["web".to_string()]));

    // The tracker holds what the server answered: a cache of the old generation is
    // stale, the stored one is not.
    let tracker = tracker.into_inner().unwrap();
    assert!(tracker.stale("svc-uid", managed, &[&old, created]));
    assert!(!tracker.stale("svc-uid", managed, &stored));
    Ok(())
}

fn filled<K>(objects: Vec<K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store::<K>();
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(o));
    }
    reader
}

/// Upstream's checkLeftoverEndpoints and the delete paths of the endpoints and
/// mirroring controllers: what a deleted Service leaves is swept, on the real server.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_deletes_what_removed_services_left_and_nothing_else() -> Result<()> {
    let cp = cluster::shared_control_plane()?;
    let client = cp.client().await?;
    let ns = format!("sweep-{}", std::process::id());
    namespace(&client, &ns).await?;
    let pp = PostParams::default();
    let services = Api::<Service>::namespaced(client.clone(), &ns);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns);
    let eps = Api::<Endpoints>::namespaced(client.clone(), &ns);
    let web: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"ports": [{"port": 80}]},
    }))?;
    let web = services.create(&pp, &web).await?;
    let mut stored_eps = Vec::new();
    for e in [
        endpoints(&ns, "web", json!({})),
        endpoints(&ns, "gone", json!({})),
        endpoints(&ns, "lock", json!({util::ANNOTATION_LEADER: "{}"})),
    ] {
        stored_eps.push(eps.create(&pp, &e).await?);
    }
    let mirroring = util::MIRRORING_CONTROLLER_NAME;
    let mut stored_slices = Vec::new();
    for s in [
        slice(&ns, Some("manual-abcde"), "manual", mirroring, "10.0.0.5"),
        slice(&ns, Some("web-fghij"), "web", mirroring, "10.0.0.6"),
    ] {
        stored_slices.push(slices.create(&pp, &s).await?);
    }
    let ctx = Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "sliceway-controller".into(),
                instance: None,
            },
        ),
        client: client.clone(),
        metrics: Metrics::new(),
        options: store::Options::default(),
        field_manager: "sliceway-controller".into(),
        stores: Stores::new(
            filled(vec![web]),
            filled(Vec::<Pod>::new()),
            filled(Vec::<Node>::new()),
            filled(stored_slices),
            filled(stored_eps),
        ),
        state: Mutex::new(store::State::default()),
        tracker: Arc::new(Mutex::new(SliceTracker::default())),
        failures: Mutex::new(Default::default()),
    };
    let found = orphans(&ctx.stores, &ctx.options);
    assert_eq!(
        found,
        BTreeSet::from([
            (ns.clone(), "gone".to_string()),
            (ns.clone(), "manual".to_string())
        ])
    );
    let failed = sweep(&ctx, found).await;
    assert!(failed.is_empty(), "{failed:?}");
    // A name whose Service exists is not swept even when asked for.
    let failed = sweep(&ctx, [(ns.clone(), "web".to_string())]).await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        names(&eps).await?,
        BTreeSet::from(["lock".to_string(), "web".to_string()])
    );
    assert_eq!(
        names(&slices).await?,
        BTreeSet::from(["web-fghij".to_string()])
    );
    Ok(())
}

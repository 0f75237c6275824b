//! The whole controller (`controller::run`: watches, index, trackers, queue) against
//! the real kube-apiserver of the upstream kit, in a test binary of its own so that
//! the running controller sees no other test's objects (it watches every namespace).
//!
//! Regression tests of issue 14's defects at the edge, each of which fails when the
//! fix is taken out: a slice deleted by someone else is recreated at once (the slice
//! watch makes the stale-cache tracker forget it; before, the Service stayed "stale"
//! and backed off until a restart), and a Service's placeholder slice, which the API
//! server sends with `"endpoints": null`, is seen by the watch, so its first Pod is
//! reconciled.

use std::time::{Duration, Instant};

use controller::metrics::Metrics;
use controller::{store, util};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use sliceway_lab::cluster;

/// Polls `f` every 100 ms until it gives `Some`, for at most `limit`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The names of the slices of Service `web` in `ns` and the addresses they hold.
async fn web_slices(api: &Api<EndpointSlice>) -> Vec<(String, Vec<String>)> {
    let lp = ListParams::default().labels(&format!("{}=web", util::LABEL_SERVICE_NAME));
    api.list(&lp)
        .await
        .expect("listing slices")
        .items
        .into_iter()
        .map(|s| {
            let addrs = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.iter().cloned())
                .collect();
            (s.metadata.name.unwrap_or_default(), addrs)
        })
        .collect()
}

/// Creates Pod `name` labelled `app` on `node` and reports it running and ready at
/// `ip` (no kubelet here writes its status).
async fn ready_pod(pods: &Api<Pod>, name: &str, app: &str, node: &str, ip: &str) {
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "lab"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }})),
    )
    .await
    .unwrap_or_else(|e| panic!("writing pod {name}'s status: {e}"));
}

#[tokio::test]
async fn a_slice_deleted_by_someone_else_is_recreated_at_once() {
    let c = cluster::shared_control_plane().expect("control plane");
    let ns = c.namespace("edge").await.expect("namespace");
    let admin: Client = c.client().await.expect("admin client");

    // A Node (cluster-scoped, named after the namespace), a Service and a ready Pod.
    let node_name = format!("{ns}-node");
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap(),
        )
        .await
        .expect("creating the node");
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            }))
            .unwrap(),
        )
        .await
        .expect("creating the service");
    // No kube-controller-manager here to make the namespace's default ServiceAccount,
    // which Pod admission asks for.
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
        .expect("creating the default service account");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    ready_pod(&pods, "web-1", "web", &node_name, "10.244.9.5").await;

    let run = tokio::spawn(controller::controller::run(
        admin.clone(),
        store::Options::default(),
        Metrics::new(),
        "sliceway-controller-edge-test".into(),
        Duration::ZERO,
    ));

    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), &ns);
    let first = eventually("the first slice", Duration::from_secs(20), || async {
        let s = web_slices(&slices).await;
        s.iter()
            .find(|(_, a)| a == &["10.244.9.5".to_string()])
            .map(|(n, _)| n.clone())
    })
    .await;

    // Someone else deletes it.
    slices
        .delete(&first, &DeleteParams::default())
        .await
        .expect("deleting the slice");
    let again = eventually("a new slice", Duration::from_secs(10), || async {
        let s = web_slices(&slices).await;
        s.iter()
            .find(|(n, a)| *n != first && a == &["10.244.9.5".to_string()])
            .map(|(n, _)| n.clone())
    })
    .await;
    assert_ne!(again, first);

    // And a Pod change after it is reconciled too (the Service is not held stale).
    pods.patch_status(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
    )
    .await
    .expect("making the pod unready");
    eventually(
        "the endpoint not ready",
        Duration::from_secs(10),
        || async {
            let list = slices
                .list(&ListParams::default().labels(&format!("{}=web", util::LABEL_SERVICE_NAME)))
                .await
                .ok()?;
            let ready = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .find_map(|e| e.conditions.as_ref()?.ready)?;
            (!ready).then_some(())
        },
    )
    .await;

    // A Service whose selector matches no Pod yet: its placeholder slice comes back
    // through the watch with `"endpoints": null`, which must decode (it did not,
    // once: the watch lost the event, and the Service stayed "stale" until a
    // restart); its first Pod then reaches a slice.
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "idle"},
                "spec": {"selector": {"app": "idle"}, "ports": [{"name": "http", "port": 80}]},
            }))
            .unwrap(),
        )
        .await
        .expect("creating the idle service");
    let idle = ListParams::default().labels(&format!("{}=idle", util::LABEL_SERVICE_NAME));
    eventually("the placeholder slice", Duration::from_secs(10), || async {
        let list = slices.list(&idle).await.ok()?;
        list.items
            .iter()
            .any(|s| s.endpoints.is_empty())
            .then_some(())
    })
    .await;
    ready_pod(&pods, "idle-1", "idle", &node_name, "10.244.9.6").await;
    eventually(
        "the idle service's first endpoint",
        Duration::from_secs(10),
        || async {
            let list = slices.list(&idle).await.ok()?;
            list.items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .any(|e| e.addresses == ["10.244.9.6"])
                .then_some(())
        },
    )
    .await;

    run.abort();
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
}

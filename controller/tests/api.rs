//! The API edge of the controller against the real kube-apiserver (the upstream kit's
//! etcd and kube-apiserver, one control plane for this test binary, tests in parallel
//! each in a namespace of its own): the requests `apply_plan`, the sweep of removed
//! Services and the Lease lock make through `kube::Api`, and what they leave on the
//! server. Faults come from the real thing: an object gone before its delete, a
//! Lease changed between read and write (409 Conflict), an identity without RBAC
//! grants (403).
//!
//! Two tests stay on a mock API server (tower-test): the mirroring warning for an
//! invalid address, because the real API server refuses to store an Endpoints object
//! with an address that is not an IP; and the Lease's expiry rule on a paused clock.
//! The trackers and the index are fed with objects and events directly.

use std::collections::BTreeSet;
use std::sync::Mutex;

use controller::controller::{apply_plan, sweep, Context, SliceTracker, Stores};
use controller::leader::LeaseLock;
use controller::metrics::Metrics;
use controller::plan::{Object, Plan};
use controller::{store, util};
use http::{Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use sliceway_lab::cluster::{
    self,
    api::{observed_client, recording_client, unique},
    Cluster,
};

/// The shared control plane, a namespace of the test's own and an admin client.
async fn env(prefix: &str) -> (&'static Cluster, String, Client) {
    let c = cluster::shared_control_plane().expect("control plane");
    let ns = c.namespace(prefix).await.expect("namespace");
    (c, ns, c.client().await.expect("admin client"))
}

/// The managed-by value of the test's slices.
const MANAGED_BY: &str = "endpointslice-controller.sliceway.io";

fn slice(ns: &str, name: Option<&str>, addrs: &[&str]) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "generateName": "web-",
            "namespace": ns,
            "labels": {
                util::LABEL_SERVICE_NAME: "web",
                util::LABEL_MANAGED_BY: MANAGED_BY,
            },
        },
        "addressType": "IPv4",
        "endpoints": addrs.iter().map(|a| json!({"addresses": [a]})).collect::<Vec<_>>(),
    }))
    .unwrap()
}

#[tokio::test]
async fn apply_plan_creates_updates_deletes_in_order() {
    let (_, ns, admin) = env("apply").await;
    let slices = Api::<EndpointSlice>::namespaced(admin.clone(), &ns);
    let pp = PostParams::default();
    let old = slices
        .create(&pp, &slice(&ns, Some("web-old"), &["10.1.0.1"]))
        .await
        .unwrap();
    let stale = slices
        .create(&pp, &slice(&ns, Some("web-stale"), &["10.1.0.2"]))
        .await
        .unwrap();
    // Deleted by someone else before the plan is applied: already gone is fine.
    let gone = slices
        .create(&pp, &slice(&ns, Some("web-gone"), &["10.1.0.3"]))
        .await
        .unwrap();
    slices
        .delete("web-gone", &Default::default())
        .await
        .unwrap();

    let endpoints = Endpoints {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        subsets: None,
    };
    let mut update = old.clone();
    update.endpoints = slice(&ns, None, &["10.1.0.1", "10.1.0.4"]).endpoints;
    let plan = Plan {
        create: vec![
            Object::EndpointSlice(slice(&ns, None, &["10.1.0.5"])),
            Object::Endpoints(endpoints),
        ],
        update: vec![Object::EndpointSlice(update)],
        delete: vec![
            Object::EndpointSlice(stale.clone()),
            Object::EndpointSlice(gone.clone()),
        ],
    };
    let (client, requests) = recording_client(
        cluster::shared_control_plane()
            .unwrap()
            .config()
            .await
            .unwrap(),
    )
    .unwrap();
    let tracker = Mutex::new(SliceTracker::default());
    apply_plan(&client, &plan, "sliceway-controller", "svc-uid", &tracker)
        .await
        .unwrap();

    // Creates, updates, deletes, in the plan's order, writes with the field manager.
    let slices_path = format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices");
    let seen: Vec<(String, String)> = requests
        .all()
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            ("POST".to_string(), slices_path.clone()),
            ("POST".into(), format!("/api/v1/namespaces/{ns}/endpoints")),
            ("PUT".into(), format!("{slices_path}/web-old")),
            ("DELETE".into(), format!("{slices_path}/web-stale")),
            ("DELETE".into(), format!("{slices_path}/web-gone")),
        ]
    );
    for r in &requests.all()[..3] {
        assert_eq!(
            r.param("fieldManager"),
            Some("sliceway-controller"),
            "{r:?}"
        );
    }

    // What the server holds now.
    let now = slices.list(&ListParams::default()).await.unwrap().items;
    let names: BTreeSet<String> = now
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains("web-old"));
    let new = now
        .iter()
        .find(|s| s.metadata.name.as_deref() != Some("web-old"))
        .unwrap();
    assert!(new.metadata.name.as_deref().unwrap().starts_with("web-"));
    let managers: Vec<_> = new
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    assert_eq!(managers, ["sliceway-controller"]);
    let old_now = slices.get("web-old").await.unwrap();
    assert_eq!(old_now.endpoints.len(), 2);
    assert!(old_now.metadata.generation > old.metadata.generation);
    Api::<Endpoints>::namespaced(admin, &ns)
        .get("web")
        .await
        .unwrap();

    // The tracker knows what was written: a cache still holding the old generation of
    // web-old, or still holding web-stale, is stale; one with the server's objects is
    // not.
    let tracker = tracker.into_inner().unwrap();
    assert!(tracker.stale("svc-uid", MANAGED_BY, &[old.clone(), new.clone()]));
    assert!(!tracker.stale("svc-uid", MANAGED_BY, &[old_now.clone(), new.clone()]));
    assert!(tracker.stale(
        "svc-uid",
        MANAGED_BY,
        &[old_now.clone(), new.clone(), stale]
    ));
    // Nor may the cache miss a slice it wrote.
    assert!(tracker.stale("svc-uid", MANAGED_BY, &[old_now]));
}

fn lease(holder: &str, renew: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": "sliceway"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew, "leaseTransitions": 2}
    }))
    .unwrap()
}

fn lock(client: Client, ns: &str, identity: &str) -> LeaseLock {
    LeaseLock::new(
        Api::<Lease>::namespaced(client, ns),
        "sliceway",
        identity,
        std::time::Duration::from_secs(15),
    )
}

#[tokio::test]
async fn a_missing_lease_is_created_and_then_held() {
    let (_, ns, admin) = env("lease-new").await;
    let now = "2030-01-01T00:00:00Z".parse().unwrap();
    assert!(lock(admin.clone(), &ns, "me")
        .try_acquire_or_renew(now)
        .await
        .unwrap());
    let held = Api::<Lease>::namespaced(admin.clone(), &ns)
        .get("sliceway")
        .await
        .unwrap();
    assert_eq!(held.spec.unwrap().holder_identity.as_deref(), Some("me"));
    // Another replica a second later finds it held.
    let later = "2030-01-01T00:00:01Z".parse().unwrap();
    assert!(!lock(admin, &ns, "other")
        .try_acquire_or_renew(later)
        .await
        .unwrap());
}

#[tokio::test]
async fn lease_held_by_another_live_replica_is_not_taken() {
    let (_, ns, admin) = env("lease-held").await;
    let leases = Api::<Lease>::namespaced(admin.clone(), &ns);
    let made = leases
        .create(
            &PostParams::default(),
            &lease("other", "2030-01-01T00:00:00.000000Z"),
        )
        .await
        .unwrap();
    let now = "2030-01-01T00:00:05Z".parse().unwrap();
    assert!(!lock(admin, &ns, "me")
        .try_acquire_or_renew(now)
        .await
        .unwrap());
    let after = leases.get("sliceway").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, made.metadata.resource_version,
        "not written"
    );
}

/// Two replicas find the Lease expired at once; the one whose write comes second
/// carries a resourceVersion that is no longer current and loses (409 Conflict).
#[tokio::test]
async fn a_lease_written_by_another_between_read_and_write_is_not_taken() {
    let (c, ns, admin) = env("lease-race").await;
    let leases = Api::<Lease>::namespaced(admin.clone(), &ns);
    // A Lease of one second, which this replica must see unchanged for that long
    // before it counts as expired (client-go's rule).
    let mut short = lease("other", "2030-01-01T00:00:00.000000Z");
    short.spec.as_mut().unwrap().lease_duration_seconds = Some(1);
    leases.create(&PostParams::default(), &short).await.unwrap();
    // Just before the lock's write goes out, the other replica renews.
    let hook_ns = ns.clone();
    let hooked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let armed = hooked.clone();
    let client = observed_client(c.config().await.unwrap(), move |r| {
        if armed.load(std::sync::atomic::Ordering::SeqCst)
            && r.method == "PUT"
            && r.path.ends_with("/leases/sliceway")
        {
            c.kubectl(&[
                "-n",
                &hook_ns,
                "annotate",
                "lease",
                "sliceway",
                "renewed-by=other",
            ])
            .expect("the other replica's write");
        }
    })
    .unwrap();
    let now = "2030-01-01T00:01:00Z".parse().unwrap();
    let me = lock(client, &ns, "me");
    hooked.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(
        !me.try_acquire_or_renew(now).await.unwrap(),
        "seen for the first time"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    hooked.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(!me.try_acquire_or_renew(now).await.unwrap());
    let after = leases.get("sliceway").await.unwrap();
    assert_eq!(
        after.spec.unwrap().holder_identity.as_deref(),
        Some("other")
    );
    assert_eq!(
        after.metadata.annotations.unwrap()["renewed-by"],
        "other",
        "the other replica's write stands"
    );
}

fn endpoints_named(ns: &str, name: &str, annotations: &[(&str, &str)]) -> Endpoints {
    Endpoints {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .filter(|a: &std::collections::BTreeMap<_, _>| !a.is_empty()),
            ..Default::default()
        },
        subsets: None,
    }
}

fn mirrored_slice(ns: &str, name: &str, service: &str) -> EndpointSlice {
    let mut s = slice(ns, Some(name), &[]);
    s.metadata.labels = Some(
        [
            (util::LABEL_SERVICE_NAME.to_string(), service.to_string()),
            (
                util::LABEL_MANAGED_BY.to_string(),
                util::MIRRORING_CONTROLLER_NAME.to_string(),
            ),
        ]
        .into(),
    );
    s
}

/// Stores filled as the reflectors would fill them, and a Context over them.
fn context_with(
    client: Client,
    services: Vec<Service>,
    endpoints: Vec<Endpoints>,
    slices: Vec<EndpointSlice>,
) -> Context {
    fn filled<K>(objects: Vec<K>) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        // A first list, as a reflector does it: the store is then ready.
        let (reader, mut writer) = reflector::store::<K>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        reader
    }
    Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "sliceway-controller".into(),
                instance: None,
            },
        ),
        client,
        metrics: Metrics::new(),
        options: store::Options::default(),
        field_manager: "sliceway-controller".into(),
        stores: Stores::new(
            filled(services),
            filled(Vec::<Pod>::new()),
            filled(Vec::<Node>::new()),
            filled(slices),
            filled(endpoints),
        ),
        state: Mutex::new(store::State::default()),
        tracker: std::sync::Arc::new(Mutex::new(SliceTracker::default())),
        failures: Mutex::new(Default::default()),
    }
}

/// A Context over what the server holds in namespace `ns`.
async fn context_from_server(client: Client, admin: &Client, ns: &str) -> Context {
    let lp = ListParams::default();
    context_with(
        client,
        Api::namespaced(admin.clone(), ns)
            .list(&lp)
            .await
            .unwrap()
            .items,
        Api::namespaced(admin.clone(), ns)
            .list(&lp)
            .await
            .unwrap()
            .items,
        Api::namespaced(admin.clone(), ns)
            .list(&lp)
            .await
            .unwrap()
            .items,
    )
}

async fn names<K>(admin: &Client, ns: &str) -> BTreeSet<String>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(admin.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.meta().name.clone().unwrap())
        .collect()
}

/// Upstream's checkLeftoverEndpoints and the delete paths of syncService and of the
/// mirroring controller: the runtime Controller never reconciles a Service that is
/// gone, so without the sweep its Endpoints and mirrored slices stayed forever.
#[tokio::test]
async fn sweep_deletes_endpoints_and_mirrored_slices_of_removed_services() {
    let (c, ns, admin) = env("sweep").await;
    let pp = PostParams::default();
    let web: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"ports": [{"port": 80}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(admin.clone(), &ns)
        .create(&pp, &web)
        .await
        .unwrap();
    let endpoints = Api::<Endpoints>::namespaced(admin.clone(), &ns);
    // Its Service exists: left alone.
    endpoints
        .create(&pp, &endpoints_named(&ns, "web", &[]))
        .await
        .unwrap();
    // Its Service is gone: deleted.
    endpoints
        .create(&pp, &endpoints_named(&ns, "gone", &[]))
        .await
        .unwrap();
    // A leader-election record: never deleted.
    endpoints
        .create(
            &pp,
            &endpoints_named(&ns, "lock", &[(util::ANNOTATION_LEADER, "{}")]),
        )
        .await
        .unwrap();
    let slices = Api::<EndpointSlice>::namespaced(admin.clone(), &ns);
    // Mirrored for a Service and Endpoints that are gone: deleted.
    slices
        .create(&pp, &mirrored_slice(&ns, "manual-abcde", "manual"))
        .await
        .unwrap();
    // Mirrored for an existing Service: the Controller's business.
    slices
        .create(&pp, &mirrored_slice(&ns, "web-fghij", "web"))
        .await
        .unwrap();

    let (client, requests) = recording_client(c.config().await.unwrap()).unwrap();
    let ctx = context_from_server(client, &admin, &ns).await;
    let orphans = controller::controller::orphans(&ctx.stores, &ctx.options);
    assert_eq!(
        orphans,
        BTreeSet::from([
            (ns.clone(), "gone".to_string()),
            (ns.clone(), "manual".to_string())
        ])
    );
    let failed = sweep(&ctx, orphans).await;
    assert!(failed.is_empty(), "{failed:?}");
    // A name whose Service exists is not swept even when asked for.
    let failed = sweep(&ctx, [(ns.clone(), "web".to_string())]).await;
    assert!(failed.is_empty(), "{failed:?}");

    let seen: Vec<(String, String)> = requests
        .all()
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "DELETE".to_string(),
                format!("/api/v1/namespaces/{ns}/endpoints/gone")
            ),
            (
                "DELETE".into(),
                format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/manual-abcde")
            ),
        ]
    );
    assert_eq!(
        names::<Endpoints>(&admin, &ns).await,
        BTreeSet::from(["lock".to_string(), "web".to_string()])
    );
    assert_eq!(
        names::<EndpointSlice>(&admin, &ns).await,
        BTreeSet::from(["web-fghij".to_string()])
    );
}

/// The sweep's identity may not delete (its RBAC is missing a verb): the name is
/// reported with the API server's refusal, and the object stays.
#[tokio::test]
async fn sweep_reports_the_names_it_could_not_clean() {
    let (c, ns, admin) = env("sweep-refused").await;
    Api::<Endpoints>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &endpoints_named(&ns, "gone", &[]))
        .await
        .unwrap();
    let mut config = c.config().await.unwrap();
    config.auth_info.impersonate = Some(unique("no-grants"));
    let ctx = context_from_server(Client::try_from(config).unwrap(), &admin, &ns).await;
    let failed = sweep(
        &ctx,
        controller::controller::orphans(&ctx.stores, &ctx.options),
    )
    .await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, (ns.clone(), "gone".to_string()));
    assert!(
        failed[0].1.to_string().contains("forbidden"),
        "{}",
        failed[0].1
    );
    assert_eq!(
        names::<Endpoints>(&admin, &ns).await,
        BTreeSet::from(["gone".to_string()])
    );
}

// On the mock API server: what the real one refuses to store.

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn mock() -> (Client, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), handle)
}

fn respond(
    send: tower_test::mock::SendResponse<Response<Body>>,
    status: u16,
    body: serde_json::Value,
) {
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
}

async fn body_json(req: Request<Body>) -> serde_json::Value {
    let bytes = req.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
}

/// Upstream's mirroring controller records its warnings on the Endpoints it
/// mirrors (InvalidIPAddress, TooManyAddressesToMirror), not on the Service. The
/// real API server validates Endpoints addresses, so an invalid one reaches a
/// controller only from a mock.
#[tokio::test]
async fn mirroring_warnings_are_recorded_on_the_endpoints() {
    let (client, mut handle) = mock();
    let manual = Service {
        metadata: ObjectMeta {
            name: Some("manual".into()),
            namespace: Some("default".into()),
            uid: Some("uid-svc".into()),
            ..Default::default()
        },
        spec: Some(Default::default()),
        ..Default::default()
    };
    let mut eps = endpoints_named("default", "manual", &[]);
    eps.metadata.uid = Some("uid-eps".into());
    eps.subsets = Some(vec![k8s_openapi::api::core::v1::EndpointSubset {
        addresses: Some(vec![
            k8s_openapi::api::core::v1::EndpointAddress {
                ip: "10.1.0.1".into(),
                ..Default::default()
            },
            k8s_openapi::api::core::v1::EndpointAddress {
                ip: "not-an-ip".into(),
                ..Default::default()
            },
        ]),
        not_ready_addresses: None,
        ports: None,
    }]);
    let ctx = std::sync::Arc::new(context_with(
        client,
        vec![manual.clone()],
        vec![eps],
        vec![],
    ));
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("event");
        assert_eq!(req.method(), http::Method::POST);
        assert_eq!(
            req.uri().path(),
            "/apis/events.k8s.io/v1/namespaces/default/events"
        );
        let event = body_json(req).await;
        assert_eq!(event["reason"], "InvalidIPAddress");
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["regarding"]["kind"], "Endpoints");
        assert_eq!(event["regarding"]["name"], "manual");
        assert_eq!(event["regarding"]["uid"], "uid-eps");
        respond(send, 201, event);
        // Then the mirrored slice with the one valid address.
        let (req, send) = handle.next_request().await.expect("create slice");
        assert_eq!(
            req.uri().path(),
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
        );
        let mut obj = body_json(req).await;
        assert_eq!(obj["endpoints"].as_array().map(Vec::len), Some(1));
        obj["metadata"]["name"] = "manual-abcde".into();
        respond(send, 201, obj);
    });
    assert_eq!(ctx.metrics.sync_cpu.get(), 0.0);
    controller::controller::reconcile(std::sync::Arc::new(manual), ctx.clone())
        .await
        .unwrap();
    server.await.unwrap();
    // The sync's own work was timed on the thread's CPU clock, and is exported.
    assert!(ctx.metrics.sync_cpu.get() > 0.0);
    assert!(ctx
        .metrics
        .render()
        .contains("sliceway_controller_sync_cpu_seconds_total "));
}

fn lease_json(holder: &str, renew: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sliceway", "namespace": "kube-system", "resourceVersion": "7"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew, "leaseTransitions": 2}
    })
}

/// client-go's semantics: the holder's renew time is never compared with this
/// replica's clock; the Lease is taken only after its record went unchanged for the
/// lease duration as this replica observed it.
#[tokio::test(start_paused = true)]
async fn a_lease_is_taken_only_after_it_stayed_unrenewed_for_its_duration() {
    let (client, mut handle) = mock();
    let server = tokio::spawn(async move {
        // Seen first: a renew time long past by the wall clock does not count.
        let (_req, send) = handle.next_request().await.expect("get");
        respond(
            send,
            200,
            lease_json("other", "2020-01-01T00:00:00.000000Z"),
        );
        // 10 s later, unchanged: still not expired (15 s duration).
        let (_req, send) = handle.next_request().await.expect("get");
        respond(
            send,
            200,
            lease_json("other", "2020-01-01T00:00:00.000000Z"),
        );
        // 16 s after the first sight, unchanged: taken, with the read version.
        let (_req, send) = handle.next_request().await.expect("get");
        respond(
            send,
            200,
            lease_json("other", "2020-01-01T00:00:00.000000Z"),
        );
        let (req, send) = handle.next_request().await.expect("replace");
        assert_eq!(req.method(), http::Method::PUT);
        let obj = body_json(req).await;
        assert_eq!(obj["metadata"]["resourceVersion"], "7");
        assert_eq!(obj["spec"]["holderIdentity"], "me");
        assert_eq!(obj["spec"]["leaseTransitions"], 3);
        respond(send, 200, obj);
    });
    let lock = LeaseLock::new(
        Api::<Lease>::namespaced(client, "kube-system"),
        "sliceway",
        "me",
        std::time::Duration::from_secs(15),
    );
    let now = "2030-01-01T00:01:00Z".parse().unwrap();
    assert!(!lock.try_acquire_or_renew(now).await.unwrap());
    tokio::time::advance(std::time::Duration::from_secs(10)).await;
    assert!(!lock.try_acquire_or_renew(now).await.unwrap());
    tokio::time::advance(std::time::Duration::from_secs(6)).await;
    assert!(lock.try_acquire_or_renew(now).await.unwrap());
    server.await.unwrap();
}

/// Issue 14: mirrored slices were recorded under the Service and looked for among
/// the EndpointSlice controller's slices, so every reconcile after the first mirrored
/// write found the cache "stale" and backed off.
#[test]
fn a_mirrored_slice_never_makes_the_other_controllers_cache_stale() {
    let mut tracker = SliceTracker::default();
    let mut mirrored = slice("default", Some("web-mirror"), &[]);
    mirrored.metadata.uid = Some("uid-web-mirror".into());
    mirrored.metadata.generation = Some(1);
    mirrored.metadata.labels = Some(
        [(
            util::LABEL_MANAGED_BY.to_string(),
            util::MIRRORING_CONTROLLER_NAME.to_string(),
        )]
        .into(),
    );
    tracker.written("svc-uid", &mirrored);
    let none: [EndpointSlice; 0] = [];
    assert!(!tracker.stale("svc-uid", MANAGED_BY, &none));
    // The mirroring controller's own view: stale until the cache shows its write.
    assert!(tracker.stale("svc-uid", util::MIRRORING_CONTROLLER_NAME, &none));
    assert!(!tracker.stale(
        "svc-uid",
        util::MIRRORING_CONTROLLER_NAME,
        std::slice::from_ref(&mirrored)
    ));
}

/// Issue 14: a slice deleted by someone else (or relabelled away) used to keep its
/// Service "stale" until a restart; the slice watch now makes the tracker forget it.
#[test]
fn a_slice_deleted_by_someone_else_is_forgotten() {
    let mut tracker = SliceTracker::default();
    let mut written = slice("default", Some("web-abcde"), &[]);
    written.metadata.uid = Some("uid-web-abcde".into());
    written.metadata.generation = Some(2);
    tracker.written("svc-uid", &written);
    let none: [EndpointSlice; 0] = [];
    assert!(tracker.stale("svc-uid", MANAGED_BY, &none));
    tracker.forget("uid-web-abcde");
    assert!(!tracker.stale("svc-uid", MANAGED_BY, &none));
}

/// The Endpoints half of the tracker (upstream's staleEndpointsTracker): after a
/// write, a cache that still shows the replaced version (or, after a create, no
/// object) is stale, and acting on it would only earn a conflict.
#[test]
fn endpoints_written_make_an_older_cache_stale_until_it_catches_up() {
    let mut tracker = SliceTracker::default();
    let with_version = |rv: &str| Endpoints {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        subsets: None,
    };
    assert!(!tracker.endpoints_stale("default", "web", None));
    tracker.endpoints_written("default", "web", None);
    assert!(
        tracker.endpoints_stale("default", "web", None),
        "created, not yet cached"
    );
    assert!(!tracker.endpoints_stale("default", "web", Some(&with_version("5"))));
    tracker.endpoints_written("default", "web", Some("5".into()));
    assert!(tracker.endpoints_stale("default", "web", Some(&with_version("5"))));
    assert!(!tracker.endpoints_stale("default", "web", Some(&with_version("6"))));
    // Caught up: forgotten, so the old version no longer counts.
    assert!(!tracker.endpoints_stale("default", "web", Some(&with_version("5"))));
    // Created, then deleted by someone before the cache saw it: the delete event
    // makes the tracker forget, so the Service is not held stale forever.
    tracker.endpoints_written("default", "web", None);
    tracker.endpoints_forget("default", "web");
    assert!(!tracker.endpoints_stale("default", "web", None));
}

/// Issue 14: a reconcile reads only its Service's Pods and slices through an index
/// kept from the watch events, not the whole cluster; the index follows relabelled
/// slices, deletions, and lists that dropped objects without events.
#[test]
fn the_index_follows_watch_events_and_lists() {
    use controller::controller::Index;
    let (pods, mut pods_w) = reflector::store::<Pod>();
    let (slices, mut slices_w) = reflector::store::<EndpointSlice>();
    let index = Index::default();
    let pod = |name: &str| -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}}})).unwrap()
    };
    let mut labelled = slice("default", Some("web-abcde"), &[]);
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert(util::LABEL_SERVICE_NAME.into(), "web".into());
    let service = Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(
            serde_json::from_value(serde_json::json!({"selector": {"app": "web"}})).unwrap(),
        ),
        ..Default::default()
    };
    let (services, mut services_w) = reflector::store::<Service>();
    services_w.apply_watcher_event(&watcher::Event::Apply(service));
    for event in [
        watcher::Event::Apply(pod("a")),
        watcher::Event::Apply(pod("b")),
    ] {
        pods_w.apply_watcher_event(&event);
        index.pod_event(&event, &pods);
    }
    let event = watcher::Event::Apply(labelled.clone());
    slices_w.apply_watcher_event(&event);
    index.slice_event(&event, &slices);
    let stores = Stores {
        services: services.clone(),
        pods: pods.clone(),
        nodes: reflector::store::<Node>().0,
        slices: slices.clone(),
        endpoints: reflector::store::<Endpoints>().0,
        index: std::sync::Arc::new(Index::default()),
    };
    // The index of `stores` is empty: nothing is found through it.
    assert!(stores.snapshot_for("default", "web").pods.is_empty());
    let stores = Stores::new(
        services,
        pods.clone(),
        reflector::store::<Node>().0,
        slices.clone(),
        reflector::store::<Endpoints>().0,
    );
    let snap = stores.snapshot_for("default", "web");
    assert_eq!(snap.pods.len(), 2);
    assert_eq!(snap.slices.len(), 1);
    // A relist that no longer has pod b (deleted while the watch was down).
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(pod("a")),
        watcher::Event::InitDone,
    ] {
        pods_w.apply_watcher_event(&event);
        stores.index.pod_event(&event, &pods);
    }
    assert_eq!(stores.snapshot_for("default", "web").pods.len(), 1);
    // The slice relabelled for another Service leaves web's view.
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert(util::LABEL_SERVICE_NAME.into(), "other".into());
    let event = watcher::Event::Apply(labelled);
    slices_w.apply_watcher_event(&event);
    stores.index.slice_event(&event, &slices);
    assert!(stores.snapshot_for("default", "web").slices.is_empty());
}

/// Issue 14: a snapshot shares the stores' objects instead of copying them, and holds
/// the Nodes of its Pods only, however many Nodes the cluster has.
#[test]
fn a_snapshot_shares_the_stores_objects() {
    let (services, mut services_w) = reflector::store::<Service>();
    let (pods, mut pods_w) = reflector::store::<Pod>();
    let (nodes, mut nodes_w) = reflector::store::<Node>();
    let (slices, _slices_w) = reflector::store::<EndpointSlice>();
    let (endpoints, _endpoints_w) = reflector::store::<Endpoints>();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}},
    }))
    .unwrap();
    services_w.apply_watcher_event(&watcher::Event::Apply(service));
    for i in 0..10 {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": format!("node-{i}")}})).unwrap();
        nodes_w.apply_watcher_event(&watcher::Event::Apply(node));
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "a", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-3", "containers": []},
    }))
    .unwrap();
    pods_w.apply_watcher_event(&watcher::Event::Apply(pod));
    let stores = Stores::new(
        services.clone(),
        pods.clone(),
        nodes.clone(),
        slices,
        endpoints,
    );
    let snap = stores.snapshot_for("default", "web");
    let key = ("default".to_string(), "a".to_string());
    let stored = pods.get(&reflector::ObjectRef::new("a").within("default"));
    assert!(std::sync::Arc::ptr_eq(&snap.pods[&key], &stored.unwrap()));
    let stored = services.get(&reflector::ObjectRef::new("web").within("default"));
    assert!(std::sync::Arc::ptr_eq(
        &snap.services[&("default".to_string(), "web".to_string())],
        &stored.unwrap()
    ));
    assert_eq!(snap.nodes.keys().collect::<Vec<_>>(), ["node-3"]);
}

/// Issue 14: the zones' CPU shares that topology hints weigh come from every Node,
/// computed again after a Node event, not per reconcile.
#[test]
fn the_topology_follows_node_events() {
    let (nodes, mut nodes_w) = reflector::store::<Node>();
    let node = |name: &str, zone: &str, cpu: &str| -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
            "status": {"allocatable": {"cpu": cpu},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap()
    };
    let stores = Stores::new(
        reflector::store::<Service>().0,
        reflector::store::<Pod>().0,
        nodes.clone(),
        reflector::store::<EndpointSlice>().0,
        reflector::store::<Endpoints>().0,
    );
    let mut apply = |n: Node| {
        let event = watcher::Event::Apply(n);
        nodes_w.apply_watcher_event(&event);
        stores.index.node_event(&event);
    };
    apply(node("n1", "zone-a", "3"));
    apply(node("n2", "zone-b", "1"));
    let ratios = |t: &controller::topology::TopologyInfo| t.cpu_ratios.clone().unwrap();
    let first = stores.topology();
    assert_eq!(ratios(&first)["zone-a"], 0.75);
    // Nothing changed: the same computation is handed out again.
    assert!(std::sync::Arc::ptr_eq(&first, &stores.topology()));
    apply(node("n2", "zone-b", "3"));
    assert_eq!(ratios(&stores.topology())["zone-a"], 0.5);
    let event = watcher::Event::Delete(node("n2", "zone-b", "3"));
    nodes_w.apply_watcher_event(&event);
    stores.index.node_event(&event);
    assert_eq!(ratios(&stores.topology())["zone-a"], 1.0);
}

/// Issue 14: a Pod's Services are found from its labels through an index of the
/// Services' selectors, not by testing every Service of the namespace; the index
/// follows changed and deleted Services, and an empty selector selects every Pod.
#[test]
fn the_selector_index_finds_a_pods_services_from_its_labels() {
    use controller::controller::SelectorIndex;
    let svc = |ns: &str, name: &str, selector: Option<serde_json::Value>| -> Service {
        let mut spec = json!({});
        if let Some(sel) = selector {
            spec["selector"] = sel;
        }
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}, "spec": spec}))
            .unwrap()
    };
    let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let mut index = SelectorIndex::default();
    index.put(&svc(
        "a",
        "web",
        Some(json!({"app": "web", "tier": "front"})),
    ));
    index.put(&svc("a", "all", Some(json!({}))));
    index.put(&svc("a", "none", None));
    index.put(&svc("b", "web", Some(json!({"app": "web"}))));
    let pod = labels(&[("app", "web")]);
    let names = |idx: &SelectorIndex, ns: &str, l: &std::collections::BTreeMap<String, String>| {
        idx.candidates(ns, Some(l)).into_iter().collect::<Vec<_>>()
    };
    // Candidates only: "web" of namespace a has the pair (its whole selector is
    // checked by the caller), "all" selects everything, "none" nothing.
    assert_eq!(names(&index, "a", &pod), ["all", "web"]);
    assert_eq!(names(&index, "b", &pod), ["web"]);
    assert_eq!(names(&index, "a", &labels(&[("app", "db")])), ["all"]);
    // A changed selector replaces the old one; a deleted Service goes.
    index.put(&svc("a", "web", Some(json!({"app": "db"}))));
    assert_eq!(names(&index, "a", &pod), ["all"]);
    assert_eq!(
        names(&index, "a", &labels(&[("app", "db")])),
        ["all", "web"]
    );
    index.remove("a", "all");
    assert_eq!(names(&index, "a", &pod), Vec::<String>::new());
    // Rebuilt from a list.
    index.rebuild([&svc("a", "web", Some(json!({"app": "web"})))]);
    assert_eq!(names(&index, "a", &pod), ["web"]);
    assert_eq!(names(&index, "b", &pod), Vec::<String>::new());
}

/// Issue 14: this controller's own slice writes coming back through the watch do not
/// sync their Service again (upstream's ShouldSync); a newer generation, written by
/// someone else, does.
#[test]
fn own_slice_writes_coming_back_do_not_sync_again() {
    let mut tracker = SliceTracker::default();
    let mut written = slice("default", Some("web-abcde"), &[]);
    written.metadata.uid = Some("uid-web-abcde".into());
    written.metadata.generation = Some(3);
    written.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-uid",
        "controller": true, "blockOwnerDeletion": true,
    }))
    .unwrap()]);
    assert!(tracker.should_sync(&written), "never written: syncs");
    tracker.written("svc-uid", &written);
    assert!(!tracker.should_sync(&written), "our own write");
    let mut theirs = written.clone();
    theirs.metadata.generation = Some(4);
    assert!(tracker.should_sync(&theirs), "changed by someone else");
}

/// Issue 14: a reconcile finds its Service's Pods through the index by label pair (the
/// rarest pair of the selector), not by testing every Pod of the namespace; the index
/// follows relabelled and deleted Pods and is rebuilt by a list.
#[test]
fn pods_are_found_by_the_rarest_pair_of_a_selector() {
    use controller::controller::Index;
    let (pods, mut pods_w) = reflector::store::<Pod>();
    let index = Index::default();
    let pod = |name: &str, labels: serde_json::Value| -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "ns", "labels": labels}}),
        )
        .unwrap()
    };
    let mut apply = |p: Pod| {
        let event = watcher::Event::Apply(p);
        pods_w.apply_watcher_event(&event);
        index.pod_event(&event, &pods);
    };
    for i in 0..50 {
        apply(pod(
            &format!("front-{i}"),
            json!({"tier": "front", "app": format!("a{}", i % 5)}),
        ));
    }
    apply(pod("db-0", json!({"tier": "back", "app": "db"})));
    let sel = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    // "app=a1" (10 Pods) is rarer than "tier=front" (50): only those are candidates.
    assert_eq!(
        index
            .pods_for_selector("ns", &sel(&[("tier", "front"), ("app", "a1")]))
            .len(),
        10
    );
    assert_eq!(
        index.pods_for_selector("ns", &sel(&[("app", "db")])),
        ["db-0"]
    );
    assert!(index
        .pods_for_selector("ns", &sel(&[("app", "nope")]))
        .is_empty());
    assert_eq!(index.pods_for_selector("ns", &sel(&[])).len(), 51);
    // Relabelled: found under its new labels only.
    apply(pod("db-0", json!({"tier": "back", "app": "cache"})));
    assert!(index
        .pods_for_selector("ns", &sel(&[("app", "db")]))
        .is_empty());
    assert_eq!(
        index.pods_for_selector("ns", &sel(&[("app", "cache")])),
        ["db-0"]
    );
    let event = watcher::Event::Delete(pod("db-0", json!({})));
    pods_w.apply_watcher_event(&event);
    index.pod_event(&event, &pods);
    assert!(index
        .pods_for_selector("ns", &sel(&[("app", "cache")]))
        .is_empty());
    index.rebuild_pods(&pods);
    assert_eq!(
        index
            .pods_for_selector("ns", &sel(&[("tier", "front")]))
            .len(),
        50
    );
}

/// A list's rebuild of the Pod index is swapped in whole: a reconcile reading the index
/// on another thread meanwhile finds every Pod of its Service, never part of them
/// (it found part of them while the rebuild refilled the index it had emptied, and
/// wrote slices missing Pods until another change of the Service came).
#[test]
fn a_rebuild_of_the_index_is_never_seen_half_done() {
    use controller::controller::Index;
    let (pods, mut pods_w) = reflector::store::<Pod>();
    let index = std::sync::Arc::new(Index::default());
    for i in 0..2000 {
        let p: Pod = serde_json::from_value(json!({"metadata": {
            "name": format!("p{i}"), "namespace": "ns", "labels": {"app": "web"}}}))
        .unwrap();
        let event = watcher::Event::Apply(p);
        pods_w.apply_watcher_event(&event);
        index.pod_event(&event, &pods);
    }
    let selector = std::collections::BTreeMap::from([("app".to_string(), "web".to_string())]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rebuilding = {
        let (index, stop, pods) = (index.clone(), stop.clone(), pods.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                index.rebuild_pods(&pods);
            }
        })
    };
    for _ in 0..2000 {
        assert_eq!(index.pods_for_selector("ns", &selector).len(), 2000);
        assert_eq!(
            index.pods_for_selector("ns", &Default::default()).len(),
            2000
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rebuilding.join().unwrap();
}

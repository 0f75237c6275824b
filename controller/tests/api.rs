//! The API edge against a mock API server (tower-test, after kube-rs controller-rs'
//! fixtures.rs Scenario pattern): the requests `apply_plan`, the sweep of removed
//! Services and the Lease lock make through `kube::Api`, and the answers a real
//! server would give.

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
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client};

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

/// The EndpointSlice controller's managed-by value, which the test's slices carry.
const MANAGED_BY: &str = util::CONTROLLER_NAME;

fn slice(name: Option<&str>) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: name.map(Into::into),
            generate_name: Some("web-".into()),
            namespace: Some("default".into()),
            uid: name.map(|n| format!("uid-{n}")),
            labels: Some([(util::LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: vec![],
        ports: None,
    }
}

#[tokio::test]
async fn apply_plan_creates_updates_deletes_in_order() {
    let (client, mut handle) = mock();
    let server = tokio::spawn(async move {
        // 1. create slice (generateName, no name), with the field manager.
        let (req, send) = handle.next_request().await.expect("create");
        assert_eq!(req.method(), http::Method::POST);
        assert_eq!(
            req.uri().path(),
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
        );
        assert!(req
            .uri()
            .query()
            .unwrap()
            .contains("fieldManager=sliceway-controller"));
        let mut obj = body_json(req).await;
        assert_eq!(obj["metadata"]["generateName"], "web-");
        obj["metadata"]["name"] = "web-abcde".into();
        obj["metadata"]["uid"] = "uid-new".into();
        obj["metadata"]["generation"] = 1.into();
        respond(send, 201, obj);
        // 2. create Endpoints.
        let (req, send) = handle.next_request().await.expect("create endpoints");
        assert_eq!(req.uri().path(), "/api/v1/namespaces/default/endpoints");
        let obj = body_json(req).await;
        respond(send, 201, obj);
        // 3. update slice by name.
        let (req, send) = handle.next_request().await.expect("update");
        assert_eq!(req.method(), http::Method::PUT);
        assert_eq!(
            req.uri().path(),
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-old"
        );
        let mut obj = body_json(req).await;
        obj["metadata"]["generation"] = 4.into();
        respond(send, 200, obj);
        // 4. delete slice; already gone is fine.
        let (req, send) = handle.next_request().await.expect("delete");
        assert_eq!(req.method(), http::Method::DELETE);
        assert_eq!(
            req.uri().path(),
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-gone"
        );
        respond(
            send,
            404,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        );
    });
    let endpoints = Endpoints {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        subsets: None,
    };
    let plan = Plan {
        create: vec![
            Object::EndpointSlice(slice(None)),
            Object::Endpoints(endpoints),
        ],
        update: vec![Object::EndpointSlice(slice(Some("web-old")))],
        delete: vec![Object::EndpointSlice(slice(Some("web-gone")))],
    };
    let tracker = Mutex::new(SliceTracker::default());
    apply_plan(&client, &plan, "sliceway-controller", "svc-uid", &tracker)
        .await
        .unwrap();
    server.await.unwrap();

    // The tracker now knows what was written: a cache still holding generation 3 of
    // web-old, or still holding web-gone, is stale.
    let tracker = tracker.into_inner().unwrap();
    let mut old = slice(Some("web-old"));
    old.metadata.generation = Some(3);
    let mut new = slice(Some("web-abcde"));
    new.metadata.uid = Some("uid-new".into());
    new.metadata.generation = Some(1);
    assert!(tracker.stale("svc-uid", MANAGED_BY, &[old.clone(), new.clone()]));
    old.metadata.generation = Some(4);
    assert!(!tracker.stale("svc-uid", MANAGED_BY, &[old.clone(), new.clone()]));
    assert!(tracker.stale("svc-uid", MANAGED_BY, &[old, new, slice(Some("web-gone"))]));
}

fn lease_json(holder: &str, renew: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sliceway", "namespace": "kube-system", "resourceVersion": "7"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew, "leaseTransitions": 2}
    })
}

#[tokio::test]
async fn lease_held_by_another_live_replica_is_not_taken() {
    let (client, mut handle) = mock();
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("get");
        assert_eq!(req.method(), http::Method::GET);
        assert_eq!(
            req.uri().path(),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/sliceway"
        );
        respond(
            send,
            200,
            lease_json("other", "2030-01-01T00:00:00.000000Z"),
        );
    });
    let lock = LeaseLock::new(
        Api::<Lease>::namespaced(client, "kube-system"),
        "sliceway",
        "me",
        std::time::Duration::from_secs(15),
    );
    let now = "2030-01-01T00:00:05Z".parse().unwrap();
    assert!(!lock.try_acquire_or_renew(now).await.unwrap());
    server.await.unwrap();
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

fn endpoints_named(name: &str, annotations: &[(&str, &str)]) -> Endpoints {
    Endpoints {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
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

fn mirrored_slice(name: &str, service: &str) -> EndpointSlice {
    let mut s = slice(Some(name));
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
        let (reader, mut writer) = reflector::store::<K>();
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::Apply(o));
        }
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

fn status_ok() -> serde_json::Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200})
}

/// Upstream's checkLeftoverEndpoints and the delete paths of syncService and of the
/// mirroring controller: the runtime Controller never reconciles a Service that is
/// gone, so without the sweep its Endpoints and mirrored slices stayed forever.
#[tokio::test]
async fn sweep_deletes_endpoints_and_mirrored_slices_of_removed_services() {
    let (client, mut handle) = mock();
    let web = Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let ctx = context_with(
        client,
        vec![web],
        vec![
            // Its Service exists: left alone.
            endpoints_named("web", &[]),
            // Its Service is gone: deleted.
            endpoints_named("gone", &[]),
            // A leader-election record: never deleted.
            endpoints_named("lock", &[(util::ANNOTATION_LEADER, "{}")]),
        ],
        vec![
            // Mirrored for a Service and Endpoints that are gone: deleted.
            mirrored_slice("manual-abcde", "manual"),
            // Mirrored for an existing Service: the Controller's business.
            mirrored_slice("web-fghij", "web"),
        ],
    );
    let orphans = controller::controller::orphans(&ctx.stores, &ctx.options);
    assert_eq!(
        orphans,
        BTreeSet::from([
            ("default".to_string(), "gone".to_string()),
            ("default".to_string(), "manual".to_string()),
        ])
    );

    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("delete endpoints");
        assert_eq!(req.method(), http::Method::DELETE);
        assert_eq!(
            req.uri().path(),
            "/api/v1/namespaces/default/endpoints/gone"
        );
        respond(send, 200, status_ok());
        let (req, send) = handle.next_request().await.expect("delete slice");
        assert_eq!(req.method(), http::Method::DELETE);
        assert_eq!(
            req.uri().path(),
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/manual-abcde"
        );
        respond(send, 200, status_ok());
        // Nothing else until the client is dropped.
        assert!(handle.next_request().await.is_none());
    });
    let failed = sweep(&ctx, orphans).await;
    assert!(failed.is_empty(), "{failed:?}");
    // A name whose Service exists is not swept even when asked for.
    let failed = sweep(&ctx, [("default".to_string(), "web".to_string())]).await;
    assert!(failed.is_empty(), "{failed:?}");
    drop(ctx);
    server.await.unwrap();
}

#[tokio::test]
async fn sweep_reports_the_names_it_could_not_clean() {
    let (client, mut handle) = mock();
    let ctx = context_with(client, vec![], vec![endpoints_named("gone", &[])], vec![]);
    let server = tokio::spawn(async move {
        let (_req, send) = handle.next_request().await.expect("delete endpoints");
        respond(
            send,
            500,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd unavailable"}),
        );
    });
    let failed = sweep(
        &ctx,
        controller::controller::orphans(&ctx.stores, &ctx.options),
    )
    .await;
    server.await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, ("default".to_string(), "gone".to_string()));
    assert!(
        failed[0].1.to_string().contains("etcd unavailable"),
        "{}",
        failed[0].1
    );
}

/// Upstream's mirroring controller records its warnings on the Endpoints it
/// mirrors (InvalidIPAddress, TooManyAddressesToMirror), not on the Service.
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
    let mut eps = endpoints_named("manual", &[]);
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
    controller::controller::reconcile(std::sync::Arc::new(manual), ctx)
        .await
        .unwrap();
    server.await.unwrap();
}

/// Issue 14: mirrored slices were recorded under the Service and looked for among
/// the EndpointSlice controller's slices, so every reconcile after the first mirrored
/// write found the cache "stale" and backed off.
#[test]
fn a_mirrored_slice_never_makes_the_other_controllers_cache_stale() {
    let mut tracker = SliceTracker::default();
    let mut mirrored = slice(Some("web-mirror"));
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
    let mut written = slice(Some("web-abcde"));
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
    let mut labelled = slice(Some("web-abcde"));
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

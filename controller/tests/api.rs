//! The API edge against a mock API server (tower-test, after kube-rs controller-rs'
//! fixtures.rs Scenario pattern): the requests `apply_plan` and the Lease lock make
//! through `kube::Api`, and the answers a real server would give.

use std::sync::Mutex;

use controller::controller::{apply_plan, SliceTracker};
use controller::leader::LeaseLock;
use controller::plan::{Object, Plan};
use http::{Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
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

fn slice(name: Option<&str>) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: name.map(Into::into),
            generate_name: Some("web-".into()),
            namespace: Some("default".into()),
            uid: name.map(|n| format!("uid-{n}")),
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
    assert!(tracker.stale("svc-uid", &[old.clone(), new.clone()]));
    old.metadata.generation = Some(4);
    assert!(!tracker.stale("svc-uid", &[old.clone(), new.clone()]));
    assert!(tracker.stale("svc-uid", &[old, new, slice(Some("web-gone"))]));
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

#[tokio::test]
async fn expired_lease_is_taken_with_resource_version() {
    let (client, mut handle) = mock();
    let server = tokio::spawn(async move {
        let (_req, send) = handle.next_request().await.expect("get");
        respond(
            send,
            200,
            lease_json("other", "2030-01-01T00:00:00.000000Z"),
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
    assert!(lock.try_acquire_or_renew(now).await.unwrap());
    server.await.unwrap();
}

//! Local mode end to end: `plan` over the example manifests, and `run --manifests`
//! writing EndpointSlice files into a directory and keeping them current.

use std::path::{Path, PathBuf};
use std::time::Duration;

use controller::local;
use controller::plan::Object;
use controller::store;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/manifests")
}

#[test]
fn plan_over_example_manifests() {
    let mut state = store::State::default();
    let opts = store::Options {
        garbage_collect: true,
        ..Default::default()
    };
    let (plan, loaded, _) = local::plan_dir(&examples(), &opts, &mut state).unwrap();
    assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
    assert_eq!(plan.create.len(), 2);
    assert!(plan.update.is_empty() && plan.delete.is_empty());
    let Object::EndpointSlice(slice) = &plan.create[0] else {
        panic!("first create is not a slice");
    };
    assert_eq!(slice.endpoints.len(), 3);
    assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(8080));
    assert!(slice.metadata.name.as_deref().unwrap().starts_with("web-"));
    assert_eq!(plan.create[1].kind(), "Endpoints");

    // JSON carries apiVersion and kind, and is stable.
    let json: serde_json::Value = serde_json::from_str(&plan.to_json().unwrap()).unwrap();
    assert_eq!(json["create"][0]["apiVersion"], "discovery.k8s.io/v1");
    assert_eq!(json["create"][0]["kind"], "EndpointSlice");
    assert_eq!(json["create"][1]["kind"], "Endpoints");
    let (again, _, _) = local::plan_dir(&examples(), &opts, &mut store::State::default()).unwrap();
    assert_eq!(plan, again);
    assert!(plan.to_table().contains("Service default/web"));
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sliceway-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn unparsable_files_are_reported_and_skipped() {
    let dir = temp_dir("bad");
    for f in ["service.yaml", "pods.yaml", "node.yaml"] {
        std::fs::copy(examples().join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("broken.yaml"),
        "kind: Service\nmetadata: [unclosed\n",
    )
    .unwrap();
    std::fs::write(dir.join("wrong.yml"), "kind: Pod\nspec: 7\n").unwrap();
    let loaded = local::load_dir(&dir).unwrap();
    let names: Vec<String> = loaded
        .rejected
        .iter()
        .map(|r| r.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["broken.yaml", "wrong.yml"]);
    assert_eq!(loaded.snapshot.pods.len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_writes_and_follows_the_directory() {
    let dir = temp_dir("run");
    for f in ["service.yaml", "pods.yaml", "node.yaml"] {
        std::fs::copy(examples().join(f), dir.join(f)).unwrap();
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run_dir = dir.clone();
    let task = tokio::spawn(async move {
        let opts = store::Options {
            garbage_collect: true,
            ..Default::default()
        };
        local::run(
            &run_dir,
            &opts,
            Duration::from_millis(50),
            Duration::from_millis(200),
            None,
            async {
                let _ = rx.await;
            },
        )
        .await
    });

    let slice_files = |dir: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("endpointslice-")
            })
            .collect();
        v.sort();
        v
    };
    let wait_for = |check: &dyn Fn() -> bool| {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if check() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    };
    assert!(wait_for(
        &|| slice_files(&dir).len() == 1 && dir.join("endpoints-default-web.yaml").exists()
    ));
    let text = std::fs::read_to_string(&slice_files(&dir)[0]).unwrap();
    assert!(text.contains("kind: EndpointSlice"), "{text}");
    assert!(text.contains("10.244.0.12"));

    // Remove a Pod: the slice follows within about a second.
    let pods = std::fs::read_to_string(dir.join("pods.yaml")).unwrap();
    let kept: Vec<&str> = pods.split("\n---\n").take(2).collect();
    std::fs::write(dir.join("pods.yaml"), kept.join("\n---\n")).unwrap();
    assert!(wait_for(&|| {
        slice_files(&dir)
            .first()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .is_some_and(|t| !t.contains("10.244.0.12") && t.contains("10.244.0.11"))
    }));

    // Remove the Service: its slice goes (there is no garbage collector here).
    std::fs::remove_file(dir.join("service.yaml")).unwrap();
    assert!(wait_for(&|| slice_files(&dir).is_empty()));

    tx.send(()).unwrap();
    task.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14: a file that stops parsing keeps its last good objects, so a typo in
/// the Pods' file does not empty the Service's slices.
#[test]
fn a_file_with_a_syntax_error_keeps_its_last_good_objects() {
    let dir = temp_dir("lastgood");
    for f in ["service.yaml", "pods.yaml", "node.yaml"] {
        std::fs::copy(examples().join(f), dir.join(f)).unwrap();
    }
    let mut last_good = local::LastGood::new(&dir);
    let loaded = local::load_dir_keeping(&mut last_good).unwrap();
    assert_eq!(loaded.snapshot.pods.len(), 3);
    let pods = std::fs::read_to_string(dir.join("pods.yaml")).unwrap();
    std::fs::write(dir.join("pods.yaml"), format!("{pods}\n  bad: [indent\n")).unwrap();
    let loaded = local::load_dir_keeping(&mut last_good).unwrap();
    assert_eq!(loaded.snapshot.pods.len(), 3, "the last good Pods are kept");
    assert_eq!(loaded.rejected.len(), 1);
    assert!(
        loaded.rejected[0]
            .reason
            .contains("last good version is kept"),
        "{:?}",
        loaded.rejected
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14: files people wrote are never rewritten or deleted. A hand-written
/// Endpoints of a selector Service is superseded by an owned file; a stale object
/// in a person's multi-document file is left alone and reported.
#[test]
fn files_people_wrote_are_never_rewritten_or_deleted() {
    let dir = temp_dir("userfiles");
    for f in ["service.yaml", "pods.yaml", "node.yaml"] {
        std::fs::copy(examples().join(f), dir.join(f)).unwrap();
    }
    // A person's file: a comment, the web Service's Endpoints (out of date) and a
    // slice of a Service that does not exist.
    let theirs = "# kept by hand\napiVersion: v1\nkind: Endpoints\nmetadata: {name: web, namespace: default}\nsubsets: [{addresses: [{ip: 10.9.9.9}], ports: [{port: 1}]}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: ghost-abcde\n  namespace: default\n  labels: {kubernetes.io/service-name: ghost, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}\n  ownerReferences: [{apiVersion: v1, kind: Service, name: ghost, uid: ghost-uid, controller: true}]\naddressType: IPv4\nendpoints: []\n";
    std::fs::write(dir.join("endpoints-default-web.yaml"), theirs).unwrap();
    let opts = store::Options {
        garbage_collect: true,
        ..Default::default()
    };
    for _ in 0..3 {
        let (plan, loaded, _) = local::plan_dir(&dir, &opts, &mut store::State::default()).unwrap();
        let applied = local::apply_plan(&dir, &plan, &loaded.sources).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("endpoints-default-web.yaml")).unwrap(),
            theirs,
            "a person's file was rewritten"
        );
        if applied.written == 0 {
            assert_eq!(applied.left_alone.len(), 1, "{applied:?}");
            assert_eq!(applied.left_alone[0].1 .1, "ghost-abcde");
            break;
        }
    }
    // The controller's own copy of web's Endpoints, next to the person's file, wins.
    let ours = std::fs::read_to_string(dir.join("endpoints-default-web.sliceway.yaml")).unwrap();
    assert!(ours.starts_with(local::HEADER), "{ours}");
    let loaded = local::load_dir(&dir).unwrap();
    let web = &loaded.snapshot.endpoints[&("default".to_string(), "web".to_string())];
    let ips: Vec<&str> = web
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten())
        .map(|a| a.ip.as_str())
        .collect();
    assert!(!ips.contains(&"10.9.9.9"), "{ips:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 19: one bad item of a `v1 List` is rejected alone; the items after it count.
#[test]
fn one_bad_list_item_rejects_only_that_item() {
    let dir = temp_dir("list");
    std::fs::write(
        dir.join("list.yaml"),
        "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}, spec: 7}\n- {apiVersion: v1, kind: Pod, metadata: {name: b, namespace: default}, spec: {containers: []}}\n",
    )
    .unwrap();
    let loaded = local::load_dir(&dir).unwrap();
    assert_eq!(loaded.snapshot.pods.len(), 1, "the item after the bad one");
    assert_eq!(loaded.rejected.len(), 1);
    assert!(
        loaded.rejected[0].reason.contains("List item 1"),
        "{:?}",
        loaded.rejected
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14 and 19: a written object's file name is made safe from its name.
#[test]
fn file_names_of_written_objects_are_safe() {
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "../../etc/x", "namespace": "a/b"}, "addressType": "IPv4", "endpoints": []}),
    )
    .unwrap();
    let name = local::file_name(&Object::EndpointSlice(slice));
    assert_eq!(name, "endpointslice-a_b-_.._.._etc_x.yaml");
    assert!(!name.contains('/'));
}

/// Issue 19: a write that fails leaves the previous file intact, the rest of the
/// plan is still written, and the next pass writes it.
#[test]
fn a_failed_write_leaves_the_previous_file_and_the_rest_of_the_plan_is_written() {
    let dir = temp_dir("failed-write");
    for entry in std::fs::read_dir(examples()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let opts = store::Options::default();
    let pass = || {
        let (plan, loaded, _) = local::plan_dir(&dir, &opts, &mut store::State::default()).unwrap();
        local::apply_plan(&dir, &plan, &loaded.sources).unwrap()
    };
    let first = pass();
    assert!(first.failed.is_empty() && first.written == 2, "{first:?}");
    let slice_file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("endpointslice-")
        })
        .unwrap();
    let before = std::fs::read_to_string(&slice_file).unwrap();
    let endpoints_file = dir.join("endpoints-default-web.yaml");
    let endpoints_before = std::fs::read_to_string(&endpoints_file).unwrap();

    // One Pod less: both files change. The slice's temporary file cannot be written
    // (a directory stands in its place).
    let blocker = slice_file.with_extension("yaml.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let pods = dir.join("pods.yaml");
    let text = std::fs::read_to_string(&pods).unwrap();
    let first_pod_end = text.find("\n---").unwrap();
    std::fs::write(&pods, &text[first_pod_end + 1..]).unwrap();
    let failed = pass();
    assert_eq!(failed.failed.len(), 1, "{failed:?}");
    assert_eq!(
        std::fs::read_to_string(&slice_file).unwrap(),
        before,
        "the old file is intact"
    );
    assert_ne!(
        std::fs::read_to_string(&endpoints_file).unwrap(),
        endpoints_before,
        "the rest of the plan is written"
    );
    std::fs::remove_dir(&blocker).unwrap();
    let retried = pass();
    assert!(
        retried.failed.is_empty() && retried.written == 1,
        "{retried:?}"
    );
    assert_ne!(std::fs::read_to_string(&slice_file).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 19: a Service defined twice is settled as `kubectl apply -f` of the
/// directory leaves it: the last definition (file order, then order in the file) is
/// used, the others are named with both files.
#[test]
fn the_last_definition_of_an_object_is_used() {
    let dir = temp_dir("duplicates");
    for f in ["pods.yaml", "node.yaml"] {
        std::fs::copy(examples().join(f), dir.join(f)).unwrap();
    }
    let service = std::fs::read_to_string(examples().join("service.yaml")).unwrap();
    // The first definition selects no Pod; the later one, in a later file, selects
    // the example's Pods.
    let selecting_none = service.replace("app: web", "app: none");
    assert_ne!(selecting_none, service);
    std::fs::write(
        dir.join("a.yaml"),
        format!("{service}---\n{selecting_none}"),
    )
    .unwrap();
    std::fs::write(dir.join("b.yaml"), &service).unwrap();
    let opts = store::Options::default();
    let (plan, loaded, _) = local::plan_dir(&dir, &opts, &mut store::State::default()).unwrap();
    let Object::EndpointSlice(slice) = &plan.create[0] else {
        panic!("first create is not a slice: {plan:?}");
    };
    assert_eq!(slice.endpoints.len(), 3, "b.yaml's definition is used");
    let reasons: Vec<(&str, String)> = loaded
        .rejected
        .iter()
        .map(|r| {
            (
                r.code,
                r.path.file_name().unwrap().to_string_lossy().into_owned(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("duplicate", "a.yaml".to_string()),
            ("duplicate", "a.yaml".to_string())
        ]
    );
    assert!(
        loaded.rejected[1]
            .reason
            .contains("(document 2) is defined again later, in ")
            && loaded.rejected[1].reason.contains("b.yaml (document 1)"),
        "{:?}",
        loaded.rejected
    );
    // The later file gone, a.yaml's last definition (selecting nothing) is used.
    std::fs::remove_file(dir.join("b.yaml")).unwrap();
    let (plan, loaded, _) = local::plan_dir(&dir, &opts, &mut store::State::default()).unwrap();
    assert_eq!(loaded.rejected.len(), 1, "{:?}", loaded.rejected);
    let Object::EndpointSlice(slice) = &plan.create[0] else {
        panic!("first create is not a slice: {plan:?}");
    };
    assert!(slice.endpoints.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 46: a Service named `1api` (a DNS-1123 label, valid since KEP-5311) gets
/// its EndpointSlice and Endpoints like any other.
#[test]
fn a_service_whose_name_starts_with_a_digit_gets_endpoint_slices() {
    let dir = temp_dir("1api");
    for f in ["pods.yaml", "node.yaml"] {
        std::fs::copy(examples().join(f), dir.join(f)).unwrap();
    }
    let service = std::fs::read_to_string(examples().join("service.yaml")).unwrap();
    let service = service.replace("name: web\n", "name: 1api\n");
    assert!(service.contains("name: 1api"));
    std::fs::write(dir.join("service.yaml"), service).unwrap();
    let mut state = store::State::default();
    let (plan, loaded, _) = local::plan_dir(&dir, &store::Options::default(), &mut state).unwrap();
    assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
    let Some(Object::EndpointSlice(slice)) = plan.create.first() else {
        panic!("no EndpointSlice planned: {plan:?}");
    };
    assert!(slice.metadata.name.as_deref().unwrap().starts_with("1api-"));
    assert_eq!(
        slice.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"],
        "1api"
    );
    assert_eq!(slice.endpoints.len(), 3);
    assert_eq!(plan.create[1].kind(), "Endpoints");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 46: files stand for stored objects: an Endpoints with an invalid address
/// has its valid ones mirrored, as upstream's mirroring controller does.
#[test]
fn an_endpoints_file_with_an_invalid_address_has_its_valid_ones_mirrored() {
    let dir = temp_dir("mirror-invalid");
    std::fs::write(
        dir.join("external.yaml"),
        "apiVersion: v1
kind: Service
metadata: {name: external, namespace: default, uid: 6c1e3f0a-3b7d-4c55-9d1e-2f1a0c0b7e09}
spec:
  clusterIP: 10.96.0.30
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: external, namespace: default, uid: 6c1e3f0a-3b7d-4c55-9d1e-2f1a0c0b7e0a}
subsets:
- addresses: [{ip: 192.0.2.10}, {ip: not-an-ip}]
  ports: [{name: http, port: 80, protocol: TCP}]
",
    )
    .unwrap();
    let mut state = store::State::default();
    let (plan, loaded, _) = local::plan_dir(&dir, &store::Options::default(), &mut state).unwrap();
    assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
    let slices: Vec<_> = plan
        .create
        .iter()
        .filter_map(|o| match o {
            Object::EndpointSlice(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(slices.len(), 1, "{plan:?}");
    let addresses: Vec<&str> = slices[0]
        .endpoints
        .iter()
        .map(|e| e.addresses[0].as_str())
        .collect();
    assert_eq!(addresses, ["192.0.2.10"]);
    let _ = std::fs::remove_dir_all(&dir);
}

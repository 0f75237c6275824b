use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::de::DeserializeOwned;

use super::*;

/// A Pod as the API server sends it after kubelet reported it: two managers'
/// managed fields, a service-account volume, resources, tolerations, a restartable
/// init container (a sidecar) with a named port, container statuses.
const POD: &str = r#"{
  "kind": "Pod", "apiVersion": "v1",
  "metadata": {
    "name": "web-7d9c-abcde", "generateName": "web-7d9c-", "namespace": "shop",
    "uid": "7b4b2f1e-0000-4000-8000-000000000001", "resourceVersion": "48213",
    "generation": 1, "creationTimestamp": "2026-11-27T01:00:00Z",
    "labels": {"app": "web", "pod-template-hash": "7d9c"},
    "annotations": {"note": "kept"},
    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c",
      "uid": "7b4b2f1e-0000-4000-8000-000000000002", "controller": true, "blockOwnerDeletion": true}],
    "finalizers": ["example.com/hold"],
    "managedFields": [
      {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
       "time": "2026-11-27T01:00:00Z", "fieldsType": "FieldsV1",
       "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}}}}}},
      {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
       "time": "2026-11-27T01:00:05Z", "fieldsType": "FieldsV1", "subresource": "status",
       "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}},
                    "f:podIP": {}, "f:podIPs": {}}}}
    ]
  },
  "spec": {
    "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
      {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
      {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
    "initContainers": [
      {"name": "proxy", "image": "proxy:1", "restartPolicy": "Always",
       "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]},
      {"name": "setup", "image": "setup:1", "command": ["sh", "-c", "true"]}
    ],
    "containers": [
      {"name": "web", "image": "web:1",
       "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                 {"name": "dns", "containerPort": 5353, "protocol": "UDP"}],
       "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
       "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets", "readOnly": true}],
       "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}
    ],
    "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
    "serviceAccountName": "default", "nodeName": "node-3", "hostname": "web-0", "subdomain": "web",
    "schedulerName": "default-scheduler",
    "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                     "effect": "NoExecute", "tolerationSeconds": 300}],
    "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
  },
  "status": {
    "phase": "Running",
    "conditions": [
      {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-11-27T01:00:02Z"},
      {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-27T01:00:03Z"},
      {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-27T01:00:05Z"},
      {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-27T01:00:00Z"}
    ],
    "hostIP": "10.0.0.3", "hostIPs": [{"ip": "10.0.0.3"}],
    "podIP": "10.244.3.7", "podIPs": [{"ip": "10.244.3.7"}, {"ip": "fd00:10:244:3::7"}],
    "startTime": "2026-11-27T01:00:00Z", "qosClass": "Burstable",
    "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "image": "web:1",
      "imageID": "sha256:00", "containerID": "containerd://00", "started": true,
      "state": {"running": {"startedAt": "2026-11-27T01:00:04Z"}}}]
  }
}"#;

fn whole<K: DeserializeOwned>(json: &str) -> K {
    serde_json::from_str(json).expect("the fixture decodes whole")
}

fn lean<K: Trimmed>(json: &str) -> K {
    serde_json::from_str::<Lean<K>>(json)
        .expect("the fixture decodes lean")
        .into_inner()
}

#[test]
fn a_lean_pod_keeps_what_the_controller_reads_and_nothing_else() {
    let full: Pod = whole(POD);
    let pod: Pod = lean(POD);
    // Metadata: everything but the managed fields.
    let mut meta = full.metadata.clone();
    assert!(meta.managed_fields.take().is_some());
    assert_eq!(pod.metadata, meta);
    // Spec: placement and the containers' names, ports and restart policies.
    let (spec, full_spec) = (pod.spec.as_ref().unwrap(), full.spec.as_ref().unwrap());
    assert_eq!(spec.node_name.as_deref(), Some("node-3"));
    assert_eq!(spec.hostname.as_deref(), Some("web-0"));
    assert_eq!(spec.subdomain.as_deref(), Some("web"));
    let names_and_ports = |c: &[k8s_openapi::api::core::v1::Container]| {
        c.iter()
            .map(|c| (c.name.clone(), c.ports.clone(), c.restart_policy.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names_and_ports(&spec.containers),
        names_and_ports(&full_spec.containers)
    );
    assert_eq!(
        names_and_ports(spec.init_containers.as_deref().unwrap()),
        names_and_ports(full_spec.init_containers.as_deref().unwrap())
    );
    assert_eq!(
        spec.init_containers.as_ref().unwrap()[0]
            .restart_policy
            .as_deref(),
        Some("Always")
    );
    assert!(spec.volumes.is_none() && spec.tolerations.is_none());
    assert!(spec.containers[0].image.is_none() && spec.containers[0].resources.is_none());
    // Status: phase, IPs and conditions exactly as decoded whole.
    let (status, full_status) = (pod.status.as_ref().unwrap(), full.status.as_ref().unwrap());
    assert_eq!(status.phase, full_status.phase);
    assert_eq!(status.pod_ip.as_deref(), Some("10.244.3.7"));
    assert_eq!(status.pod_ips, full_status.pod_ips);
    assert_eq!(status.pod_ips.as_ref().unwrap().len(), 2);
    assert_eq!(status.conditions, full_status.conditions);
    assert!(status.container_statuses.is_none() && status.host_ip.is_none());
}

#[test]
fn a_pod_without_spec_or_status_decodes_lean_as_whole() {
    let json = r#"{"metadata": {"name": "p", "namespace": "ns"}}"#;
    assert_eq!(lean::<Pod>(json), whole::<Pod>(json));
}

/// Kinds kept whole but for their managed fields: equal to the whole decode, every
/// field of the kind set in the fixture.
#[test]
fn services_slices_and_endpoints_decode_lean_as_whole_without_managed_fields() {
    fn check<K>(json: &str)
    where
        K: Trimmed
            + DeserializeOwned
            + PartialEq
            + std::fmt::Debug
            + k8s_openapi::Metadata<Ty = ObjectMeta>,
    {
        let mut full: K = whole(json);
        assert!(full.metadata_mut().managed_fields.take().is_some());
        assert_eq!(lean::<K>(json), full);
    }
    let managed = r#""managedFields": [{"manager": "m", "operation": "Update",
        "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]"#;
    check::<Service>(&format!(
        r#"{{"metadata": {{"name": "web", "namespace": "shop", "uid": "u1",
            "resourceVersion": "7", "annotations": {{"a": "b"}}, {managed}}},
          "spec": {{"selector": {{"app": "web"}}, "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"], "ipFamilies": ["IPv4"], "type": "ClusterIP",
            "ports": [{{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}}]}},
          "status": {{"loadBalancer": {{}}}}}}"#
    ));
    check::<EndpointSlice>(&format!(
        r#"{{"metadata": {{"name": "web-abc", "namespace": "shop", "generation": 3,
            "labels": {{"kubernetes.io/service-name": "web"}}, {managed}}},
          "addressType": "IPv4",
          "endpoints": [{{"addresses": ["10.244.3.7"], "conditions": {{"ready": true,
              "serving": true, "terminating": false}}, "nodeName": "node-3", "zone": "a",
              "targetRef": {{"kind": "Pod", "name": "web-0", "namespace": "shop"}},
              "hints": {{"forZones": [{{"name": "a"}}]}}}}],
          "ports": [{{"name": "http", "port": 8080, "protocol": "TCP"}}]}}"#
    ));
    check::<Endpoints>(&format!(
        r#"{{"metadata": {{"name": "web", "namespace": "shop", {managed}}},
          "subsets": [{{"addresses": [{{"ip": "10.244.3.7", "nodeName": "node-3"}}],
            "notReadyAddresses": [{{"ip": "10.244.3.8"}}],
            "ports": [{{"name": "http", "port": 8080, "protocol": "TCP"}}]}}]}}"#
    ));
}

#[test]
fn a_lean_node_keeps_labels_readiness_and_allocatable() {
    let json = r#"{"metadata": {"name": "node-3", "labels": {"topology.kubernetes.io/zone": "a"},
        "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
          "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]},
      "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"]},
      "status": {"allocatable": {"cpu": "2", "memory": "8Gi"}, "capacity": {"cpu": "2"},
        "conditions": [{"type": "Ready", "status": "True"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.3"}],
        "images": [{"names": ["web:1"], "sizeBytes": 1000}],
        "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6",
          "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v",
          "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}}"#;
    let full: Node = whole(json);
    let node: Node = lean(json);
    let mut meta = full.metadata.clone();
    assert!(meta.managed_fields.take().is_some());
    assert_eq!(node.metadata, meta);
    assert_eq!(node.spec, full.spec);
    let (status, full_status) = (node.status.unwrap(), full.status.unwrap());
    assert_eq!(status.allocatable, full_status.allocatable);
    assert_eq!(status.conditions, full_status.conditions);
    assert!(status.images.is_none() && status.node_info.is_none() && status.capacity.is_none());
}

#[test]
fn a_lean_object_is_a_resource_of_its_kind() {
    use k8s_openapi::Resource;
    assert_eq!(<Lean<Pod> as Resource>::KIND, "Pod");
    assert_eq!(
        <Lean<EndpointSlice> as Resource>::API_VERSION,
        "discovery.k8s.io/v1"
    );
    assert_eq!(<Lean<Endpoints> as Resource>::URL_PATH_SEGMENT, "endpoints");
}

/// The API server sends an empty list as `null` (an EndpointSlice without endpoints,
/// as the EndpointSlice controller's placeholder is): read lean as whole, as an
/// empty list. A watch event that does not decode is lost to the watch.
#[test]
fn null_lists_decode_lean_as_whole() {
    let slice = r#"{"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": "web-abc", "namespace": "shop", "generateName": "web-",
          "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "endpoints": null, "ports": null}"#;
    let lean_slice = lean::<EndpointSlice>(slice);
    assert_eq!(lean_slice, whole::<EndpointSlice>(slice));
    assert!(lean_slice.endpoints.is_empty() && lean_slice.ports.is_none());
    let endpoints = r#"{"metadata": {"name": "web", "namespace": "shop"}, "subsets": null}"#;
    assert_eq!(lean::<Endpoints>(endpoints), whole::<Endpoints>(endpoints));
    let service = r#"{"metadata": {"name": "web", "namespace": "shop", "labels": null},
        "spec": null, "status": null}"#;
    assert_eq!(lean::<Service>(service), whole::<Service>(service));
    let pod = r#"{"metadata": {"name": "p", "namespace": "shop"},
        "spec": {"containers": null, "initContainers": null, "nodeName": "node-1"},
        "status": {"podIPs": null, "conditions": null, "phase": "Pending"}}"#;
    let (lean_pod, whole_pod) = (lean::<Pod>(pod), whole::<Pod>(pod));
    assert_eq!(
        lean_pod.spec.as_ref().unwrap().containers,
        whole_pod.spec.as_ref().unwrap().containers
    );
    assert_eq!(lean_pod.status, whole_pod.status);
    let node =
        r#"{"metadata": {"name": "n"}, "status": {"allocatable": null, "conditions": null}}"#;
    assert_eq!(lean::<Node>(node).status, whole::<Node>(node).status);
}

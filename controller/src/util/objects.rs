//! What the reconcilers read of Pods, Services and Endpoints: readiness, IPs, ports,
//! selectors, an Endpoints subset's addresses
//! (upstream's podutil and endpointutil helpers,
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/util/endpoint/controller_utils.go>).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointSubset, ObjectReference, Pod, Service, ServicePort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Whether the Pod's `Ready` condition is `True` (podutil.IsPodReady).
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The last transition time of the Pod's `Ready` condition (getPodTriggerTime).
pub fn pod_ready_transition(pod: &Pod) -> Option<Time> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.clone())
}

/// Whether the Pod is in phase Failed or Succeeded (podutil.IsPodTerminal).
pub fn is_pod_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

/// The Pod's IPs: `status.podIPs`, or `status.podIP` when the list is empty (the API
/// server keeps the two in step; hand-written manifests often give only `podIP`).
pub fn pod_ips(pod: &Pod) -> Vec<String> {
    pod_ip_strs(pod).map(str::to_string).collect()
}

/// [`pod_ips`] without copying: the same addresses, borrowed from the Pod.
pub fn pod_ip_strs(pod: &Pod) -> impl Iterator<Item = &str> + Clone {
    let status = pod.status.as_ref();
    let listed = status
        .and_then(|s| s.pod_ips.as_deref())
        .unwrap_or(&[])
        .iter()
        .map(|p| p.ip.as_str())
        .filter(|ip| !ip.is_empty());
    let use_listed = listed.clone().next().is_some();
    let single = status
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !use_listed && !ip.is_empty());
    listed.filter(move |_| use_listed).chain(single)
}

/// Whether the Pod belongs in endpoints at all (endpointsliceutil.ShouldPodBeInEndpoints).
pub fn should_pod_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    if is_pod_terminal(pod) {
        return false;
    }
    if pod_ip_strs(pod).next().is_none() {
        return false;
    }
    if !include_terminating && pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    true
}

/// The Service port's protocol, defaulted to TCP as the API server does.
pub fn port_protocol(port: &ServicePort) -> String {
    port_protocol_str(port).to_string()
}

/// [`port_protocol`], borrowed.
pub fn port_protocol_str(port: &ServicePort) -> &str {
    port.protocol.as_deref().unwrap_or("TCP")
}

/// Resolves a Service port's target port on a Pod (podutil.FindPort): a number is
/// taken as is (an unset target port is the port itself); a name is looked up among
/// the containers' ports of the same protocol, then among restartable init containers.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            // The API server turns a numeric string into an int; be as lenient.
            if let Ok(n) = name.parse::<i32>() {
                return Some(n);
            }
            let proto = port_protocol_str(port);
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == proto
                })
                .map(|p| p.container_port)
        }
    }
}

/// Whether every key and value of the selector is among the labels.
pub fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// `helper.IsServiceIPSet`: a cluster IP that is neither empty nor `None`.
pub fn service_ip_set(svc: &Service) -> bool {
    let ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or("");
    !ip.is_empty() && ip != "None"
}

/// `publishNotReadyAddresses`, false when unset.
pub fn publish_not_ready(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

/// `endpointutil.ShouldSetHostname`.
pub fn should_set_hostname(pod: &Pod, svc: &Service) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let hostname = spec.hostname.as_deref().unwrap_or("");
    !hostname.is_empty()
        && spec.subdomain.as_deref() == svc.metadata.name.as_deref()
        && pod.metadata.namespace == svc.metadata.namespace
}

/// An object reference to a Pod, as targetRef.
pub fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The addresses of an Endpoints subset with their readiness: `addresses` (ready),
/// then `notReadyAddresses`.
pub fn subset_addresses(subset: &EndpointSubset) -> impl Iterator<Item = (&EndpointAddress, bool)> {
    let ready = subset.addresses.iter().flatten().map(|a| (a, true));
    let not_ready = subset
        .not_ready_addresses
        .iter()
        .flatten()
        .map(|a| (a, false));
    ready.chain(not_ready)
}

//! Objects decoded lean at the API edge: [`Lean<K>`] is a `K` read from the API
//! server's JSON (a list's items, a watch event's object) through a shape that names
//! only the fields sliceway reads, so the rest is skipped by the parser, never
//! allocated, copied or dropped. Every kind loses `metadata.managedFields` (a field
//! set per manager that names every field it owns, often the bulk of an object: a
//! slice's names each of its endpoints again); a Pod keeps of its spec only the node,
//! the hostname and subdomain and the containers' names and ports (what podutil's
//! FindPort reads); a Node keeps of its status only its conditions and allocatable
//! resources. Everything kept is decoded by the same k8s-openapi types, so a kept
//! field reads exactly as in the whole object.
//!
//! `Lean<K>` is a Kubernetes resource of K's kind (k8s-openapi's `Resource` and
//! `Metadata`), so a client can list and watch it as K; [`Lean::into_inner`] hands
//! the trimmed K to code that knows only K.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Endpoints, Node, NodeCondition, NodeSpec, NodeStatus, Pod,
    PodCondition, PodIP, PodSpec, PodStatus, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// A `K` decoded through [`Trimmed::Wire`]: only the fields sliceway reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Lean<K>(pub K);

impl<K> Lean<K> {
    /// The trimmed object.
    pub fn into_inner(self) -> K {
        self.0
    }
}

/// A kind that can be decoded lean: `Wire` is the shape read from JSON, turned into
/// the kind with every field it does not name left empty.
pub trait Trimmed: Sized {
    /// The fields read, with k8s-openapi's types.
    type Wire: DeserializeOwned + Into<Self>;
}

impl<'de, K: Trimmed> Deserialize<'de> for Lean<K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        K::Wire::deserialize(d).map(|wire| Lean(wire.into()))
    }
}

impl<K: k8s_openapi::Resource> k8s_openapi::Resource for Lean<K> {
    const API_VERSION: &'static str = K::API_VERSION;
    const GROUP: &'static str = K::GROUP;
    const KIND: &'static str = K::KIND;
    const VERSION: &'static str = K::VERSION;
    const URL_PATH_SEGMENT: &'static str = K::URL_PATH_SEGMENT;
    type Scope = K::Scope;
}

impl<K: k8s_openapi::Metadata<Ty = ObjectMeta>> k8s_openapi::Metadata for Lean<K> {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        self.0.metadata()
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        self.0.metadata_mut()
    }
}

/// A field the API server may send as `null` (Go's nil slice: an EndpointSlice
/// without endpoints has `"endpoints": null`) read as its default, as k8s-openapi
/// reads it; `#[serde(default)]` covers only a field left out.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// `ObjectMeta` without `managedFields`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

/// Kinds kept whole but for `managedFields`: the wire is the kind's own fields with
/// [`Meta`] for its metadata.
macro_rules! without_managed_fields {
    ($kind:ident, $wire:ident { $($field:ident: $ty:ty),* $(,)? }) => {
        #[doc = concat!("A ", stringify!($kind), " as [`Lean`] reads it.")]
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        pub struct $wire {
            #[serde(deserialize_with = "null_as_default")]
            metadata: Meta,
            $(#[serde(deserialize_with = "null_as_default")]
            $field: $ty,)*
        }

        impl From<$wire> for $kind {
            fn from(w: $wire) -> Self {
                $kind {
                    metadata: w.metadata.into(),
                    $($field: w.$field,)*
                }
            }
        }

        impl Trimmed for $kind {
            type Wire = $wire;
        }
    };
}

without_managed_fields!(Service, ServiceWire {
    spec: Option<k8s_openapi::api::core::v1::ServiceSpec>,
    status: Option<k8s_openapi::api::core::v1::ServiceStatus>,
});
without_managed_fields!(EndpointSlice, EndpointSliceWire {
    address_type: String,
    endpoints: Vec<k8s_openapi::api::discovery::v1::Endpoint>,
    ports: Option<Vec<k8s_openapi::api::discovery::v1::EndpointPort>>,
});
without_managed_fields!(Endpoints, EndpointsWire {
    subsets: Option<Vec<k8s_openapi::api::core::v1::EndpointSubset>>,
});

/// A Pod as [`Lean`] reads it: of the spec, what places it (node, hostname,
/// subdomain) and the containers' ports; of the status, phase, IPs and conditions.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct PodWire {
    #[serde(deserialize_with = "null_as_default")]
    metadata: Meta,
    spec: Option<PodSpecWire>,
    status: Option<PodStatusWire>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct PodSpecWire {
    #[serde(deserialize_with = "null_as_default")]
    containers: Vec<ContainerWire>,
    hostname: Option<String>,
    init_containers: Option<Vec<ContainerWire>>,
    node_name: Option<String>,
    subdomain: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct ContainerWire {
    #[serde(deserialize_with = "null_as_default")]
    name: String,
    ports: Option<Vec<ContainerPort>>,
    restart_policy: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct PodStatusWire {
    conditions: Option<Vec<PodCondition>>,
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<PodIP>>,
}

impl From<ContainerWire> for Container {
    fn from(c: ContainerWire) -> Self {
        Container {
            name: c.name,
            ports: c.ports,
            restart_policy: c.restart_policy,
            ..Default::default()
        }
    }
}

impl From<PodWire> for Pod {
    fn from(w: PodWire) -> Self {
        Pod {
            metadata: w.metadata.into(),
            spec: w.spec.map(|s| PodSpec {
                containers: s.containers.into_iter().map(Into::into).collect(),
                hostname: s.hostname,
                init_containers: s
                    .init_containers
                    .map(|c| c.into_iter().map(Into::into).collect()),
                node_name: s.node_name,
                subdomain: s.subdomain,
                ..Default::default()
            }),
            status: w.status.map(|s| PodStatus {
                conditions: s.conditions,
                phase: s.phase,
                pod_ip: s.pod_ip,
                pod_ips: s.pod_ips,
                ..Default::default()
            }),
        }
    }
}

impl Trimmed for Pod {
    type Wire = PodWire;
}

/// A Node as [`Lean`] reads it: its metadata (the zone is a label), spec, and of its
/// status the conditions (readiness) and allocatable resources (topology hints
/// share endpoints by allocatable CPU), not the images, addresses or node info.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct NodeWire {
    #[serde(deserialize_with = "null_as_default")]
    metadata: Meta,
    spec: Option<NodeSpec>,
    status: Option<NodeStatusWire>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeStatusWire {
    allocatable: Option<BTreeMap<String, Quantity>>,
    conditions: Option<Vec<NodeCondition>>,
}

impl From<NodeWire> for Node {
    fn from(w: NodeWire) -> Self {
        Node {
            metadata: w.metadata.into(),
            spec: w.spec,
            status: w.status.map(|s| NodeStatus {
                allocatable: s.allocatable,
                conditions: s.conditions,
                ..Default::default()
            }),
        }
    }
}

impl Trimmed for Node {
    type Wire = NodeWire;
}

#[cfg(test)]
mod tests;

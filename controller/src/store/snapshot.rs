//! A snapshot of the objects the controllers read, filled by both edges (a manifest
//! directory, kube-rs reflector stores), and its index of Pods by label.
//!
//! Objects are held behind `Arc`: the API edge shares the reflector stores' objects
//! (which kube-rs hands out as `Arc<K>`) instead of copying them per reconcile.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::util;

/// `(namespace, name)`.
pub type Key = (String, String);

fn key_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    (
        m.namespace.clone().unwrap_or_else(|| "default".into()),
        m.name.clone().unwrap_or_default(),
    )
}

/// The objects of a cluster the controllers read, shared (an object is never
/// changed in place; `Arc::make_mut` copies one that is shared).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Services by key.
    pub services: BTreeMap<Key, Arc<Service>>,
    /// Pods by key.
    pub pods: BTreeMap<Key, Arc<Pod>>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Arc<Node>>,
    /// EndpointSlices by key.
    pub slices: BTreeMap<Key, Arc<EndpointSlice>>,
    /// Endpoints by key.
    pub endpoints: BTreeMap<Key, Arc<Endpoints>>,
}

impl Snapshot {
    /// Adds a Service (owned, or shared with a store).
    pub fn add_service(&mut self, s: impl Into<Arc<Service>>) {
        let s = s.into();
        self.services.insert(key_of(&s.metadata), s);
    }
    /// Adds a Pod.
    pub fn add_pod(&mut self, p: impl Into<Arc<Pod>>) {
        let p = p.into();
        self.pods.insert(key_of(&p.metadata), p);
    }
    /// Adds a Node.
    pub fn add_node(&mut self, n: impl Into<Arc<Node>>) {
        let n = n.into();
        self.nodes
            .insert(n.metadata.name.clone().unwrap_or_default(), n);
    }
    /// Adds an EndpointSlice.
    pub fn add_slice(&mut self, s: impl Into<Arc<EndpointSlice>>) {
        let s = s.into();
        self.slices.insert(key_of(&s.metadata), s);
    }
    /// Adds an Endpoints.
    pub fn add_endpoints(&mut self, e: impl Into<Arc<Endpoints>>) {
        let e = e.into();
        self.endpoints.insert(key_of(&e.metadata), e);
    }

    /// The Pods a Service's selector matches, in key order.
    pub fn pods_for(&self, svc: &Service) -> Vec<&Pod> {
        let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
            return Vec::new();
        };
        let ns = key_of(&svc.metadata).0;
        self.pods
            .range((ns.clone(), String::new())..)
            .take_while(|((pns, _), _)| *pns == ns)
            .filter(|(_, p)| util::selector_matches(selector, p.metadata.labels.as_ref()))
            .map(|(_, p)| &**p)
            .collect()
    }

    /// An index of the Pods by namespace and label, for many [`Snapshot::pods_for`].
    pub fn pod_index(&self) -> PodIndex<'_> {
        let mut by_label: HashMap<(&str, &str, &str), Vec<&Pod>> = HashMap::new();
        for ((ns, _), pod) in &self.pods {
            for (k, v) in pod.metadata.labels.iter().flatten() {
                by_label
                    .entry((ns.as_str(), k.as_str(), v.as_str()))
                    .or_default()
                    .push(&**pod);
            }
        }
        PodIndex {
            snap: self,
            by_label,
        }
    }

    /// Slices labelled for a Service name and a managed-by value, not being deleted.
    pub fn slices_for(&self, ns: &str, name: &str, managed_by: &str) -> Vec<&EndpointSlice> {
        self.slices
            .range((ns.to_string(), String::new())..)
            .take_while(|((sns, _), _)| sns == ns)
            .map(|(_, s)| &**s)
            .filter(|s| {
                let labels = s.metadata.labels.as_ref();
                labels
                    .and_then(|l| l.get(util::LABEL_SERVICE_NAME))
                    .map(String::as_str)
                    == Some(name)
                    && labels
                        .and_then(|l| l.get(util::LABEL_MANAGED_BY))
                        .map(String::as_str)
                        == Some(managed_by)
                    && s.metadata.deletion_timestamp.is_none()
            })
            .collect()
    }
}

/// The Pods of a [`Snapshot`] by namespace and label: the Pods a selector matches
/// without looking at every Pod of the namespace.
pub struct PodIndex<'a> {
    snap: &'a Snapshot,
    /// Pods in key order, by (namespace, label key, label value).
    by_label: HashMap<(&'a str, &'a str, &'a str), Vec<&'a Pod>>,
}

impl<'a> PodIndex<'a> {
    /// What [`Snapshot::pods_for`] returns, in the same order.
    pub fn pods_for(&self, svc: &Service) -> Vec<&'a Pod> {
        let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
            return Vec::new();
        };
        if selector.is_empty() {
            return self.snap.pods_for(svc);
        }
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        // The Pods carrying the rarest of the selector's labels, then the rest.
        let fewest = selector
            .iter()
            .map(|(k, v)| {
                self.by_label
                    .get(&(ns, k.as_str(), v.as_str()))
                    .map_or(&[][..], Vec::as_slice)
            })
            .min_by_key(|pods| pods.len())
            .unwrap_or(&[]);
        fewest
            .iter()
            .copied()
            .filter(|p| util::selector_matches(selector, p.metadata.labels.as_ref()))
            .collect()
    }
}

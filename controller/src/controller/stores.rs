//! The reflector stores of the kinds the controllers read, and the indexes kept
//! from the Pod and Service watches (selectors by label pair, Pods by label).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::ResourceExt;

use crate::store::{Key, Snapshot};
use crate::topology::TopologyInfo;

/// The reflector stores.
#[derive(Clone)]
pub struct Stores {
    /// Services.
    pub services: Store<Service>,
    /// Pods.
    pub pods: Store<Pod>,
    /// Nodes.
    pub nodes: Store<Node>,
    /// EndpointSlices.
    pub slices: Store<EndpointSlice>,
    /// Endpoints.
    pub endpoints: Store<Endpoints>,
    /// Pods by namespace and slices by Service, so a reconcile reads only what
    /// concerns its Service, not the whole cluster.
    pub index: Arc<Index>,
}

/// Services by the label pairs of their selectors, so the Services of a Pod are found
/// from the Pod's own labels (one lookup per label), whatever the number of Services,
/// instead of testing every selector of its namespace. Kept from the Service watch
/// events, rebuilt from the store after every list.
#[derive(Debug, Default)]
pub struct SelectorIndex {
    /// (namespace, key, value) → names of the Services whose selector has the pair.
    by_pair: HashMap<(String, String, String), std::collections::BTreeSet<String>>,
    /// namespace → names of the Services with an empty selector (it selects every Pod
    /// of the namespace).
    select_all: HashMap<String, std::collections::BTreeSet<String>>,
    /// (namespace, name) → the selector indexed for it.
    indexed: HashMap<(String, String), std::collections::BTreeMap<String, String>>,
}

impl SelectorIndex {
    /// Indexes a Service's selector (replacing what was indexed for it).
    pub fn put(&mut self, svc: &Service) {
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        self.remove(&key.0, &key.1);
        let Some(selector) = svc.spec.as_ref().and_then(|s| s.selector.clone()) else {
            return;
        };
        if selector.is_empty() {
            self.select_all
                .entry(key.0.clone())
                .or_default()
                .insert(key.1.clone());
        }
        for (k, v) in &selector {
            self.by_pair
                .entry((key.0.clone(), k.clone(), v.clone()))
                .or_default()
                .insert(key.1.clone());
        }
        self.indexed.insert(key, selector);
    }

    /// Takes a Service out.
    pub fn remove(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let Some(selector) = self.indexed.remove(&key) else {
            return;
        };
        if let Some(names) = self.select_all.get_mut(namespace) {
            names.remove(name);
        }
        for (k, v) in selector {
            let pair = (key.0.clone(), k, v);
            if let Some(names) = self.by_pair.get_mut(&pair) {
                names.remove(name);
                if names.is_empty() {
                    self.by_pair.remove(&pair);
                }
            }
        }
    }

    /// Indexes exactly the Services of `services`.
    pub fn rebuild<'a>(&mut self, services: impl IntoIterator<Item = &'a Service>) {
        *self = Self::default();
        for svc in services {
            self.put(svc);
        }
    }

    /// Names of the Services of `namespace` whose selectors the Pod labels `labels`
    /// may match: every one with a pair the labels have, and those with an empty
    /// selector. The caller checks the whole selector.
    pub fn candidates(
        &self,
        namespace: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> std::collections::BTreeSet<String> {
        let mut out: std::collections::BTreeSet<String> =
            self.select_all.get(namespace).cloned().unwrap_or_default();
        for (k, v) in labels.into_iter().flatten() {
            if let Some(names) = self
                .by_pair
                .get(&(namespace.to_string(), k.clone(), v.clone()))
            {
                out.extend(names.iter().cloned());
            }
        }
        out
    }
}

/// Names of Pods by namespace and of EndpointSlices by (namespace, Service name),
/// kept current from the watch events (rebuilt from the store after every list).
#[derive(Debug, Default)]
pub struct Index {
    pods: std::sync::RwLock<HashMap<String, std::collections::BTreeSet<String>>>,
    /// (namespace, label key, value) → names of the Pods with that label, so a
    /// Service's Pods are found from one pair of its selector, not by testing every
    /// Pod of the namespace.
    pod_labels: std::sync::RwLock<PodLabels>,
    slices: std::sync::RwLock<HashMap<Key, std::collections::BTreeSet<String>>>,
    slice_service: std::sync::RwLock<HashMap<Key, String>>,
    /// Node changes seen, and the zone capacity computed at one of them.
    nodes_changed: std::sync::atomic::AtomicU64,
    topology: std::sync::Mutex<Option<(u64, Arc<TopologyInfo>)>>,
}

/// Pods by label pair, and the labels indexed for each Pod (to take them out again).
#[derive(Debug, Default)]
struct PodLabels {
    by_pair: HashMap<(String, String, String), std::collections::BTreeSet<String>>,
    of: HashMap<(String, String), std::collections::BTreeMap<String, String>>,
}

impl PodLabels {
    fn remove(&mut self, ns: &str, name: &str) {
        let Some(labels) = self.of.remove(&(ns.to_string(), name.to_string())) else {
            return;
        };
        for (k, v) in labels {
            let pair = (ns.to_string(), k, v);
            if let Some(names) = self.by_pair.get_mut(&pair) {
                names.remove(name);
                if names.is_empty() {
                    self.by_pair.remove(&pair);
                }
            }
        }
    }
    fn put(&mut self, ns: &str, name: &str, labels: std::collections::BTreeMap<String, String>) {
        self.remove(ns, name);
        for (k, v) in &labels {
            self.by_pair
                .entry((ns.to_string(), k.clone(), v.clone()))
                .or_default()
                .insert(name.to_string());
        }
        self.of.insert((ns.to_string(), name.to_string()), labels);
    }
}

impl Index {
    fn add_pod(&self, p: &Pod) {
        let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
        self.pods
            .write()
            .expect("index")
            .entry(ns.clone())
            .or_default()
            .insert(name.clone());
        self.pod_labels.write().expect("index").put(
            &ns,
            &name,
            p.metadata.labels.clone().unwrap_or_default(),
        );
    }
    fn remove_pod(&self, p: &Pod) {
        let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
        if let Some(names) = self.pods.write().expect("index").get_mut(&ns) {
            names.remove(&name);
        }
        self.pod_labels.write().expect("index").remove(&ns, &name);
    }
    /// Names of the Pods of `ns` that `selector` may select: those with its rarest
    /// label pair (every Pod of the namespace for an empty selector). The caller
    /// checks the whole selector.
    pub fn pods_for_selector(
        &self,
        ns: &str,
        selector: &std::collections::BTreeMap<String, String>,
    ) -> Vec<String> {
        if selector.is_empty() {
            return self
                .pods
                .read()
                .expect("index")
                .get(ns)
                .map(|n| n.iter().cloned().collect())
                .unwrap_or_default();
        }
        let labels = self.pod_labels.read().expect("index");
        let mut rarest: Option<&std::collections::BTreeSet<String>> = None;
        for (k, v) in selector {
            match labels.by_pair.get(&(ns.to_string(), k.clone(), v.clone())) {
                // A pair no Pod has: the selector selects nothing.
                None => return Vec::new(),
                Some(names) if rarest.is_none_or(|r| names.len() < r.len()) => rarest = Some(names),
                Some(_) => {}
            }
        }
        rarest
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
    fn add_slice(&self, s: &EndpointSlice) {
        self.remove_slice(s);
        let ns = s.namespace().unwrap_or_default();
        let Some(svc) = s.labels().get(crate::util::LABEL_SERVICE_NAME).cloned() else {
            return;
        };
        self.slice_service
            .write()
            .expect("index")
            .insert((ns.clone(), s.name_any()), svc.clone());
        self.slices
            .write()
            .expect("index")
            .entry((ns, svc))
            .or_default()
            .insert(s.name_any());
    }
    fn remove_slice(&self, s: &EndpointSlice) {
        let ns = s.namespace().unwrap_or_default();
        let old = self
            .slice_service
            .write()
            .expect("index")
            .remove(&(ns.clone(), s.name_any()));
        if let Some(svc) = old {
            if let Some(names) = self.slices.write().expect("index").get_mut(&(ns, svc)) {
                names.remove(&s.name_any());
            }
        }
    }
    /// Rebuilds the Pod part from the store's content. The new index is built aside
    /// and swapped in: a reconcile reading it meanwhile (on another thread) sees the
    /// old one or the new one, never a part.
    pub fn rebuild_pods(&self, pods: &Store<Pod>) {
        let fresh = Index::default();
        for p in pods.state() {
            fresh.add_pod(&p);
        }
        let (names, labels) = (
            fresh.pods.into_inner().expect("index"),
            fresh.pod_labels.into_inner().expect("index"),
        );
        // Both locks at once, in the order `pods_for_selector` never holds them
        // together; readers take one at a time.
        let mut pods_w = self.pods.write().expect("index");
        let mut labels_w = self.pod_labels.write().expect("index");
        *pods_w = names;
        *labels_w = labels;
    }
    /// Rebuilds the EndpointSlice part from the store's content, swapped in whole
    /// as the Pods are.
    pub fn rebuild_slices(&self, slices: &Store<EndpointSlice>) {
        let fresh = Index::default();
        for s in slices.state() {
            fresh.add_slice(&s);
        }
        let (by_service, of_slice) = (
            fresh.slices.into_inner().expect("index"),
            fresh.slice_service.into_inner().expect("index"),
        );
        let mut slices_w = self.slices.write().expect("index");
        let mut service_w = self.slice_service.write().expect("index");
        *slices_w = by_service;
        *service_w = of_slice;
    }
    /// Follows a Pod watch event (after the store applied it).
    pub fn pod_event(&self, event: &watcher::Event<Pod>, store: &Store<Pod>) {
        match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => self.add_pod(p),
            watcher::Event::Delete(p) => self.remove_pod(p),
            // A list may have dropped objects deleted meanwhile, without events.
            watcher::Event::InitDone => self.rebuild_pods(store),
            watcher::Event::Init => {}
        }
    }
    /// Follows a Node watch event (after the store applied it): the zone capacity
    /// is computed again when next asked for.
    pub fn node_event(&self, event: &watcher::Event<Node>) {
        if !matches!(event, watcher::Event::Init) {
            self.nodes_changed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    /// The zone capacity of the Nodes in `nodes`, computed again only after a Node
    /// event (upstream's topology cache is also set on Node events:
    /// `checkNodeTopologyDistribution` in
    /// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslice/endpointslice_controller.go>).
    pub fn topology(&self, nodes: &Store<Node>) -> Arc<TopologyInfo> {
        // The count is read before the store: a Node event counted later finds the
        // cache out of date, whichever state the store showed here.
        let seen = self.nodes_changed.load(std::sync::atomic::Ordering::SeqCst);
        if let Some((at, info)) = &*self.topology.lock().expect("topology") {
            if *at == seen {
                return info.clone();
            }
        }
        let nodes = nodes.state();
        let info = Arc::new(TopologyInfo::from_nodes(nodes.iter().map(|n| &**n)));
        *self.topology.lock().expect("topology") = Some((seen, info.clone()));
        info
    }
    /// The names of the slices labelled for Service `ns/name`.
    pub fn slice_names(&self, ns: &str, name: &str) -> Vec<String> {
        self.slices
            .read()
            .expect("index")
            .get(&(ns.to_string(), name.to_string()))
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
    /// Follows an EndpointSlice watch event (after the store applied it).
    pub fn slice_event(&self, event: &watcher::Event<EndpointSlice>, store: &Store<EndpointSlice>) {
        match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) => self.add_slice(s),
            watcher::Event::Delete(s) => self.remove_slice(s),
            watcher::Event::InitDone => self.rebuild_slices(store),
            watcher::Event::Init => {}
        }
    }
}

impl Stores {
    /// Whether every store has completed its first list.
    pub fn synced(&self) -> bool {
        use futures::FutureExt;
        fn ready<K>(s: &Store<K>) -> bool
        where
            K: kube::Resource + Clone + 'static,
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            matches!(s.wait_until_ready().now_or_never(), Some(Ok(())))
        }
        ready(&self.services)
            && ready(&self.pods)
            && ready(&self.nodes)
            && ready(&self.slices)
            && ready(&self.endpoints)
    }

    /// Stores with their index built from what they hold.
    pub fn new(
        services: Store<Service>,
        pods: Store<Pod>,
        nodes: Store<Node>,
        slices: Store<EndpointSlice>,
        endpoints: Store<Endpoints>,
    ) -> Self {
        let index = Arc::new(Index::default());
        index.rebuild_pods(&pods);
        index.rebuild_slices(&slices);
        Stores {
            services,
            pods,
            nodes,
            slices,
            endpoints,
            index,
        }
    }

    /// The objects of one namespace and name the reconcilers read: the Service, the
    /// Pods its selector matches, their Nodes, the slices labelled for the name and
    /// the Endpoints. The objects are shared with the stores, not copied, so a
    /// snapshot costs what the Service's own objects count, whatever the cluster's
    /// size.
    pub fn snapshot_for(&self, ns: &str, name: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        let svc = self.services.get(&ObjectRef::new(name).within(ns));
        let selector = svc
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.selector.as_ref());
        if let Some(selector) = selector {
            for pod in self.index.pods_for_selector(ns, selector) {
                let Some(p) = self.pods.get(&ObjectRef::new(&pod).within(ns)) else {
                    continue;
                };
                if crate::util::selector_matches(selector, p.metadata.labels.as_ref()) {
                    // The Nodes of those Pods (zones). Topology hints weigh the zones'
                    // capacity over every Node: that comes from [`Stores::topology`].
                    let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                    if let Some(node) = node.filter(|n| !snap.nodes.contains_key(*n)) {
                        if let Some(n) = self.nodes.get(&ObjectRef::new(node)) {
                            snap.add_node(n);
                        }
                    }
                    snap.add_pod(p);
                }
            }
        }
        if let Some(s) = svc {
            snap.add_service(s);
        }
        for slice in self.index.slice_names(ns, name) {
            if let Some(s) = self.slices.get(&ObjectRef::new(&slice).within(ns)) {
                snap.add_slice(s);
            }
        }
        if let Some(e) = self.endpoints.get(&ObjectRef::new(name).within(ns)) {
            snap.add_endpoints(e);
        }
        snap
    }

    /// The zones' share of allocatable CPU over every Node, for topology hints:
    /// computed once after each Node change, not per reconcile.
    pub fn topology(&self) -> Arc<TopologyInfo> {
        self.index.topology(&self.nodes)
    }
}

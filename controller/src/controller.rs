//! The kube-rs edge: reflectors for Services, Pods, Nodes, EndpointSlices and
//! Endpoints feed a runtime Controller keyed by Service; each reconcile builds a
//! [`Snapshot`] of the stores for that name, runs the pure reconcilers
//! ([`store::sync_service`]) and applies the plan with create/update/delete under a
//! named field manager. A [`SliceTracker`] keeps it from acting on a stale slice
//! cache (upstream's EndpointSliceTracker). The Controller never reconciles a name
//! whose Service is gone, so a [`sweep`] deletes the Endpoints and mirrored slices
//! of deleted Services, at start and on each deletion.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Node, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::instrument;

use crate::events::Regarding;
use crate::metrics::Metrics;
use crate::plan::{Object, Plan};
use crate::store::{self, Key, Snapshot};
use crate::topology::TopologyInfo;
use crate::{Error, Result};

/// Generations this controller wrote, per slice UID (upstream's EndpointSliceTracker).
///
/// Kept per Service and per `endpointslice.kubernetes.io/managed-by` value: the
/// EndpointSlice controller and the mirroring controller each track their own slices,
/// as upstream's two controllers each have a tracker, so a mirrored slice is never
/// looked for among the EndpointSlice controller's slices.
///
/// It also knows the Endpoints this controller wrote whose newer version the cache
/// may not show yet (upstream's staleEndpointsTracker in
/// pkg/controller/endpoint/endpoints_controller.go): acting on such a cache would
/// send a write bound to fail with a conflict.
#[derive(Debug, Default)]
pub struct SliceTracker {
    by_service: HashMap<(String, String), HashMap<String, i64>>,
    /// Per Endpoints (namespace, name): the resourceVersion this controller replaced,
    /// or `None` for one it created.
    endpoints: HashMap<(String, String), Option<String>>,
}

/// Marks a slice this controller deleted and expects gone from the cache.
const DELETION_EXPECTED: i64 = -1;

fn managed_by(slice: &EndpointSlice) -> String {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::util::LABEL_MANAGED_BY))
        .cloned()
        .unwrap_or_default()
}

impl SliceTracker {
    fn entry(&mut self, service_uid: &str, slice: &EndpointSlice) -> &mut HashMap<String, i64> {
        self.by_service
            .entry((service_uid.into(), managed_by(slice)))
            .or_default()
    }
    /// Records a written slice.
    pub fn written(&mut self, service_uid: &str, slice: &EndpointSlice) {
        if let Some(uid) = &slice.metadata.uid {
            let generation = slice.metadata.generation.unwrap_or(0);
            self.entry(service_uid, slice)
                .insert(uid.clone(), generation);
        }
    }
    /// Whether a slice event should sync its Service: not when it only shows this
    /// controller's own write coming back (upstream's endpointSliceTracker
    /// `ShouldSync`, <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/util/endpointslice/endpointslice_tracker.go>):
    /// a generation newer than the one written, or a slice never written, syncs.
    pub fn should_sync(&self, slice: &EndpointSlice) -> bool {
        let Some(uid) = slice.metadata.uid.as_deref() else {
            return true;
        };
        let generation = slice.metadata.generation.unwrap_or(0);
        let managed = managed_by(slice);
        let owner = slice
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        let written = match owner.and_then(|owner| self.by_service.get(&(owner, managed.clone()))) {
            Some(gens) => gens.get(uid).copied(),
            None => self.by_service.iter().find_map(|((_, m), gens)| {
                (*m == managed).then(|| gens.get(uid).copied()).flatten()
            }),
        };
        match written {
            Some(g) => generation > g,
            None => true,
        }
    }
    /// Records a deleted slice.
    pub fn deleted(&mut self, service_uid: &str, slice: &EndpointSlice) {
        if let Some(uid) = &slice.metadata.uid {
            self.entry(service_uid, slice)
                .insert(uid.clone(), DELETION_EXPECTED);
        }
    }
    /// Records an Endpoints write: `replaced` is the resourceVersion it replaced
    /// (`None` for a create).
    pub fn endpoints_written(&mut self, ns: &str, name: &str, replaced: Option<String>) {
        self.endpoints.insert((ns.into(), name.into()), replaced);
    }
    /// Forgets the last write of Endpoints `ns/name` (they were deleted).
    pub fn endpoints_forget(&mut self, ns: &str, name: &str) {
        self.endpoints.remove(&(ns.to_string(), name.to_string()));
    }
    /// Whether the cached Endpoints `ns/name` is older than this controller's last
    /// write of it; forgets the write once the cache has caught up.
    pub fn endpoints_stale(&mut self, ns: &str, name: &str, cached: Option<&Endpoints>) -> bool {
        let key = (ns.to_string(), name.to_string());
        let Some(written) = self.endpoints.get(&key) else {
            return false;
        };
        let stale = match (written, cached) {
            (None, None) => true,
            (Some(rv), Some(c)) => c.metadata.resource_version.as_ref() == Some(rv),
            _ => false,
        };
        if !stale {
            self.endpoints.remove(&key);
        }
        stale
    }
    /// Forgets everything recorded for a deleted Service.
    pub fn forget_service(&mut self, service_uid: &str) {
        self.by_service.retain(|(uid, _), _| uid != service_uid);
    }
    /// Forgets a slice that is gone or no longer managed by `managed_by`, whoever
    /// removed it (upstream's HandleDeletion): the cache cannot be stale about a slice
    /// the controller will never see again.
    pub fn forget(&mut self, slice_uid: &str) {
        for gens in self.by_service.values_mut() {
            gens.remove(slice_uid);
        }
        self.by_service.retain(|_, gens| !gens.is_empty());
    }
    /// Whether the cached slices of `service_uid` managed by `managed_by` are older
    /// than what this controller wrote (StaleSlices).
    pub fn stale<S: Borrow<EndpointSlice>>(
        &self,
        service_uid: &str,
        managed_by: &str,
        cached: &[S],
    ) -> bool {
        let Some(gens) = self
            .by_service
            .get(&(service_uid.to_string(), managed_by.to_string()))
        else {
            return false;
        };
        let mut seen = std::collections::HashSet::new();
        for s in cached.iter().map(Borrow::borrow) {
            let uid = s.metadata.uid.clone().unwrap_or_default();
            if let Some(g) = gens.get(&uid) {
                if *g == DELETION_EXPECTED || *g > s.metadata.generation.unwrap_or(0) {
                    return true;
                }
            }
            seen.insert(uid);
        }
        gens.iter()
            .any(|(uid, g)| *g != DELETION_EXPECTED && !seen.contains(uid))
    }
    /// Forgets deletions the cache has caught up with.
    pub fn settle<S: Borrow<EndpointSlice>>(
        &mut self,
        service_uid: &str,
        managed_by: &str,
        cached: &[S],
    ) {
        if let Some(gens) = self
            .by_service
            .get_mut(&(service_uid.to_string(), managed_by.to_string()))
        {
            let present: std::collections::HashSet<String> = cached
                .iter()
                .map(Borrow::borrow)
                .filter_map(|s| s.metadata.uid.clone())
                .collect();
            gens.retain(|uid, g| *g != DELETION_EXPECTED || present.contains(uid));
        }
    }
}

/// The error of a failed write of `obj`.
fn write_error<'a>(op: &'static str, obj: &'a Object) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| {
        let (namespace, name) = obj.key();
        let name = if name.is_empty() {
            obj.metadata().generate_name.clone().unwrap_or_default()
        } else {
            name
        };
        Error::Write {
            op,
            kind: obj.kind(),
            namespace,
            name,
            source: Box::new(source),
        }
    }
}

/// Applies a plan through the API: creates, then updates, then deletes, each with
/// the field manager. Written slices are recorded in the tracker under the UID of
/// the Service they belong to.
pub async fn apply_plan(
    client: &Client,
    plan: &Plan,
    field_manager: &str,
    service_uid: &str,
    tracker: &Mutex<SliceTracker>,
) -> Result<()> {
    let pp = PostParams {
        field_manager: Some(field_manager.into()),
        ..Default::default()
    };
    let slices = |ns: &str| Api::<EndpointSlice>::namespaced(client.clone(), ns);
    let endpoints = |ns: &str| Api::<Endpoints>::namespaced(client.clone(), ns);
    for obj in &plan.create {
        let (ns, _) = obj.key();
        match obj {
            Object::EndpointSlice(s) => {
                let made = slices(&ns)
                    .create(&pp, s)
                    .await
                    .map_err(write_error("create", obj))?;
                tracker.lock().expect("tracker").written(service_uid, &made);
            }
            Object::Endpoints(e) => {
                endpoints(&ns)
                    .create(&pp, e)
                    .await
                    .map_err(write_error("create", obj))?;
                let name = e.metadata.name.as_deref().unwrap_or_default();
                tracker
                    .lock()
                    .expect("tracker")
                    .endpoints_written(&ns, name, None);
            }
        }
    }
    for obj in &plan.update {
        let (ns, name) = obj.key();
        match obj {
            Object::EndpointSlice(s) => {
                let made = slices(&ns)
                    .replace(&name, &pp, s)
                    .await
                    .map_err(write_error("update", obj))?;
                tracker.lock().expect("tracker").written(service_uid, &made);
            }
            Object::Endpoints(e) => {
                endpoints(&ns)
                    .replace(&name, &pp, e)
                    .await
                    .map_err(write_error("update", obj))?;
                tracker.lock().expect("tracker").endpoints_written(
                    &ns,
                    &name,
                    e.metadata.resource_version.clone(),
                );
            }
        }
    }
    for obj in &plan.delete {
        let (ns, name) = obj.key();
        let result = match obj {
            Object::EndpointSlice(s) => {
                let r = slices(&ns)
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ());
                tracker.lock().expect("tracker").deleted(service_uid, s);
                r
            }
            Object::Endpoints(_) => endpoints(&ns)
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {}
            // Already gone: what we wanted.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(write_error("delete", obj)(e)),
        }
    }
    Ok(())
}

/// Shared state of reconciles.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
    /// Options of the reconcilers.
    pub options: store::Options,
    /// Field manager of writes.
    pub field_manager: String,
    /// Reflector stores.
    pub stores: Stores,
    /// Trigger-time state.
    pub state: Mutex<store::State>,
    /// Written generations (shared with the slice watch, which forgets deleted ones).
    pub tracker: Arc<Mutex<SliceTracker>>,
    /// Consecutive failures per Service and the overall retry budget.
    pub failures: Mutex<RateLimiter>,
}

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
    /// Rebuilds the Pod part from the store's content.
    pub fn rebuild_pods(&self, pods: &Store<Pod>) {
        self.pods.write().expect("index").clear();
        *self.pod_labels.write().expect("index") = PodLabels::default();
        for p in pods.state() {
            self.add_pod(&p);
        }
    }
    /// Rebuilds the EndpointSlice part from the store's content.
    pub fn rebuild_slices(&self, slices: &Store<EndpointSlice>) {
        self.slices.write().expect("index").clear();
        self.slice_service.write().expect("index").clear();
        for s in slices.state() {
            self.add_slice(&s);
        }
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
    /// Pods its selector matches, the Nodes, the slices labelled for the name and the
    /// Endpoints. Only those are copied out of the stores.
    pub fn snapshot_for(&self, ns: &str, name: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        let svc = self.services.get(&ObjectRef::new(name).within(ns));
        let selector = svc
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.selector.clone());
        let hinted = svc
            .as_ref()
            .is_some_and(|s| crate::topology::hints_enabled(s));
        if let Some(s) = svc {
            snap.add_service((*s).clone());
        }
        let mut node_names = std::collections::BTreeSet::new();
        if let Some(selector) = selector {
            for pod in self.index.pods_for_selector(ns, &selector) {
                let Some(p) = self.pods.get(&ObjectRef::new(&pod).within(ns)) else {
                    continue;
                };
                if crate::util::selector_matches(&selector, p.metadata.labels.as_ref()) {
                    if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                        node_names.insert(n);
                    }
                    snap.add_pod((*p).clone());
                }
            }
        }
        // The Nodes of those Pods (zones); every Node only for topology hints, which
        // weigh the zones' capacity.
        if hinted {
            for n in self.nodes.state() {
                snap.add_node((*n).clone());
            }
        } else {
            for name in &node_names {
                if let Some(n) = self.nodes.get(&ObjectRef::new(name)) {
                    snap.add_node((*n).clone());
                }
            }
        }
        let slice_names: Vec<String> = self
            .index
            .slices
            .read()
            .expect("index")
            .get(&(ns.to_string(), name.to_string()))
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default();
        for slice in slice_names {
            if let Some(s) = self.slices.get(&ObjectRef::new(&slice).within(ns)) {
                snap.add_slice((*s).clone());
            }
        }
        if let Some(e) = self.endpoints.get(&ObjectRef::new(name).within(ns)) {
            snap.add_endpoints((*e).clone());
        }
        snap
    }
}

/// What the sweep looks at: every name, or one name whose Service was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sweep {
    /// Every name with Endpoints or mirrored slices (at start and after a re-list,
    /// which drops deleted Services without an event).
    All,
    /// The name of a deleted Service.
    Name(Key),
}

/// Names whose Service is gone but which still have what the controllers delete
/// then: Endpoints (leader-election records aside) when the Endpoints controller
/// runs, slices of the mirroring controller when mirroring runs. The runtime
/// Controller never reconciles a name whose Service is gone, so these are left to
/// [`sweep`] (upstream: checkLeftoverEndpoints at start, and the delete paths of
/// syncService and of the mirroring controller's syncEndpoints).
pub fn orphans(stores: &Stores, opts: &store::Options) -> BTreeSet<Key> {
    let service_exists = |ns: &str, name: &str| {
        stores
            .services
            .get(&ObjectRef::new(name).within(ns))
            .is_some()
    };
    let mut out = BTreeSet::new();
    if opts.controllers.endpoints {
        let all = stores.endpoints.state();
        for e in crate::endpoints::leftovers(all.iter().map(|e| &**e), service_exists) {
            out.insert(key_of_meta(&e.metadata));
        }
    }
    if opts.controllers.mirroring {
        for s in stores.slices.state() {
            let labels = s.metadata.labels.as_ref();
            let managed = labels.and_then(|l| l.get(crate::util::LABEL_MANAGED_BY));
            let Some(name) = labels.and_then(|l| l.get(crate::util::LABEL_SERVICE_NAME)) else {
                continue;
            };
            let ns = s.metadata.namespace.as_deref().unwrap_or("default");
            if managed == Some(&opts.mirroring.controller_name) && !service_exists(ns, name) {
                out.insert((ns.to_string(), name.clone()));
            }
        }
    }
    out
}

fn key_of_meta(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    (
        m.namespace.clone().unwrap_or_else(|| "default".into()),
        m.name.clone().unwrap_or_default(),
    )
}

/// Deletes the Endpoints and mirrored slices of names whose Service is gone, one
/// name at a time with the same reconcilers as a sync ([`store::plan_service`]).
/// A name whose Service exists (again) is left to the Controller. Returns the names
/// that failed, with the error; the others are done.
pub async fn sweep(ctx: &Context, keys: impl IntoIterator<Item = Key>) -> Vec<(Key, Error)> {
    let mut failed = Vec::new();
    for key in keys {
        let (ns, name) = &key;
        if ctx
            .stores
            .services
            .get(&ObjectRef::new(name).within(ns))
            .is_some()
        {
            continue;
        }
        // The Service is gone: so are its series.
        ctx.metrics.forget_service(ns, name);
        let snap = ctx.stores.snapshot_for(ns, name);
        let outcome = {
            let mut state = ctx.state.lock().expect("state");
            store::plan_service(&snap, &key, &ctx.options, &mut state)
        };
        if outcome.plan.is_empty() {
            continue;
        }
        match apply_plan(
            &ctx.client,
            &outcome.plan,
            &ctx.field_manager,
            "",
            // Only deletions of objects no Service owns any more: nothing for the
            // EndpointSlice controller's tracker to wait for.
            &Mutex::new(SliceTracker::default()),
        )
        .await
        {
            Ok(()) => {
                ctx.metrics.applied(&outcome.plan);
                tracing::info!(
                    service = %format!("{ns}/{name}"),
                    deleted = outcome.plan.delete.len(),
                    "Service is gone; deleted its Endpoints and mirrored EndpointSlices"
                );
            }
            Err(e) => failed.push((key, e)),
        }
    }
    failed
}

/// Runs [`sweep`] for every request, once the stores have listed; a name that fails
/// is tried again after `retry`.
async fn sweeper(
    ctx: Arc<Context>,
    tx: tokio::sync::mpsc::UnboundedSender<Sweep>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Sweep>,
    retry: Duration,
) {
    let s = &ctx.stores;
    let ready = futures::future::try_join4(
        s.services.wait_until_ready(),
        s.endpoints.wait_until_ready(),
        s.slices.wait_until_ready(),
        s.pods.wait_until_ready(),
    )
    .await;
    if ready.is_err() {
        // Only when the reflectors are dropped, that is when the controller stops.
        tracing::warn!("a reflector stopped before listing; leftover Endpoints are not swept");
        return futures::future::pending().await;
    }
    while let Some(request) = rx.recv().await {
        let keys: Vec<Key> = match request {
            Sweep::All => orphans(&ctx.stores, &ctx.options).into_iter().collect(),
            Sweep::Name(key) => vec![key],
        };
        for (key, err) in sweep(&ctx, keys).await {
            tracing::warn!(
                service = %format!("{}/{}", key.0, key.1),
                error = %err,
                retry_in = ?retry,
                "deleting the Endpoints and mirrored EndpointSlices of a removed Service failed; will retry"
            );
            let tx = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(retry).await;
                let _ = tx.send(Sweep::Name(key));
            });
        }
    }
}

/// Reconciles one Service name: slices, Endpoints and mirrored slices.
#[instrument(skip(svc, ctx), fields(service = %format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())))]
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    // Nothing is reconciled before every watch has listed once, as upstream starts
    // its workers only after WaitForNamedCacheSync
    // (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslice/endpointslice_controller.go>,
    // `Run`): triggers of the initial lists (one per Pod, per slice...) only set the
    // Service's next run, so each Service is synced once after the lists, not once per
    // list page while its own writes are still on their way back through the watch
    // (which would find the cache stale and back off, 10 per second for all).
    if !ctx.stores.synced() {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let ns = svc.namespace().unwrap_or_else(|| "default".into());
    let name = svc.name_any();
    let uid = svc.uid().unwrap_or_default();
    let snap = ctx.stores.snapshot_for(&ns, &name);
    {
        let mut tracker = ctx.tracker.lock().expect("tracker");
        for managed_by in [
            &ctx.options.slices.controller_name,
            &ctx.options.mirroring.controller_name,
        ] {
            let cached = snap.slices_for(&ns, &name, managed_by);
            if tracker.stale(&uid, managed_by, &cached) {
                ctx.metrics.sync("stale");
                return Err(Error::StaleCache(format!("{ns}/{name}")));
            }
            tracker.settle(&uid, managed_by, &cached);
        }
        let cached = snap.endpoints.get(&(ns.clone(), name.clone()));
        if tracker.endpoints_stale(&ns, &name, cached) {
            ctx.metrics.sync("stale");
            return Err(Error::StaleCache(format!("{ns}/{name} (Endpoints)")));
        }
    }
    let topology = TopologyInfo::from_nodes(snap.nodes.values());
    let outcome = {
        let mut state = ctx.state.lock().expect("state");
        store::sync_service(
            &snap,
            &(ns.clone(), name.clone()),
            &ctx.options,
            &mut state,
            Some(&topology),
        )
    };
    ctx.metrics.record_pass(&outcome, 0);
    // Upstream's recorders: the EndpointSlice controller reports on the Service,
    // the mirroring controller on the Endpoints it mirrors.
    let endpoints_ref = || match snap.endpoints.get(&(ns.clone(), name.clone())) {
        Some(e) => e.object_ref(&()),
        None => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Endpoints".into()),
            namespace: Some(ns.clone()),
            name: Some(name.clone()),
            ..Default::default()
        },
    };
    for (about, _, warning) in &outcome.events {
        let regarding = match about {
            Regarding::Endpoints => endpoints_ref(),
            Regarding::Service => svc.object_ref(&()),
        };
        publish(&ctx, &regarding, warning.reason, &warning.note).await;
    }
    if let Err(e) = apply_plan(
        &ctx.client,
        &outcome.plan,
        &ctx.field_manager,
        &uid,
        &ctx.tracker,
    )
    .await
    {
        ctx.metrics.sync("error");
        let selector = svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some();
        let event = match &e {
            // The Endpoints controller reports on the Endpoints.
            Error::Write {
                kind: "Endpoints",
                op: "create",
                source,
                ..
            } => Some((
                endpoints_ref(),
                "FailedToCreateEndpoint",
                format!("Failed to create endpoint for service {ns}/{name}: {source}"),
            )),
            Error::Write {
                kind: "Endpoints",
                op: "update",
                source,
                ..
            } => Some((
                endpoints_ref(),
                "FailedToUpdateEndpoint",
                format!("Failed to update endpoint {ns}/{name}: {source}"),
            )),
            // The EndpointSlice controller reports on the Service; the mirroring
            // controller (selector-less Services) only retries.
            Error::Write {
                kind: "EndpointSlice",
                ..
            } if selector => Some((
                svc.object_ref(&()),
                "FailedToUpdateEndpointSlices",
                format!("Error updating Endpoint Slices for Service {ns}/{name}: {e}"),
            )),
            _ => None,
        };
        if let Some((regarding, reason, note)) = event {
            publish(&ctx, &regarding, reason, &note).await;
        }
        return Err(e);
    }
    ctx.metrics.applied(&outcome.plan);
    if let Some((_, reason)) = outcome.retry.first() {
        ctx.metrics.sync("retry");
        return Err(Error::Retry(reason.clone()));
    }
    ctx.metrics.sync("ok");
    ctx.failures
        .lock()
        .expect("failures")
        .forget(&format!("{ns}/{name}"));
    Ok(Action::await_change())
}

/// Publishes a Warning Event about an object; a failure to publish is logged.
async fn publish(ctx: &Context, regarding: &ObjectReference, reason: &str, note: &str) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Sync".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, regarding).await {
        tracing::warn!(error = %e, %reason, "publishing an event failed; it is dropped");
    }
}

/// How often a Service is retried before it is dropped from the queue (upstream's
/// `maxRetries` in pkg/controller/endpointslice/endpointslice_controller.go); a
/// later change of the Service or its Pods queues it again.
pub const MAX_RETRIES: u32 = 15;

/// Upstream's rate limiter for this controller's queue: the larger of a per-item
/// exponential backoff (1 s doubling up to 1000 s) and an overall token bucket of 10
/// retries per second with a burst of 100 (`NewTypedMaxOfRateLimiter` of
/// `ItemExponentialFailureRateLimiter(1s, 1000s)` and `BucketRateLimiter(10, 100)`).
#[derive(Debug)]
pub struct RateLimiter {
    failures: HashMap<String, u32>,
    tokens: f64,
    last: std::time::Instant,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self {
            failures: HashMap::new(),
            tokens: BUCKET_BURST,
            last: std::time::Instant::now(),
        }
    }
}

const BUCKET_RATE: f64 = 10.0;
const BUCKET_BURST: f64 = 100.0;

/// What to do after a failed sync.
#[derive(Debug, PartialEq)]
pub enum Retry {
    /// Retry after this delay (this is retry number `n`).
    After(Duration, u32),
    /// Retried [`MAX_RETRIES`] times: drop it until something changes.
    Drop,
}

impl RateLimiter {
    /// The decision for `key`'s next failure at `now`.
    pub fn failed(&mut self, key: &str, now: std::time::Instant) -> Retry {
        let n = self.failures.entry(key.to_string()).or_insert(0);
        if *n >= MAX_RETRIES {
            self.failures.remove(key);
            return Retry::Drop;
        }
        *n += 1;
        let n = *n;
        // Token bucket with reservations: a retry past the burst waits its turn.
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * BUCKET_RATE).min(BUCKET_BURST) - 1.0;
        let bucket = if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / BUCKET_RATE)
        };
        Retry::After(backoff(n).max(bucket), n)
    }

    /// A successful sync forgets the key's failures (the queue's `Forget`).
    pub fn forget(&mut self, key: &str) {
        self.failures.remove(key);
    }
}

/// Retries with upstream's rate limiter; after [`MAX_RETRIES`] the Service is dropped
/// with an event until it changes again.
pub fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
    let decision = ctx
        .failures
        .lock()
        .expect("failures")
        .failed(&key, std::time::Instant::now());
    match decision {
        Retry::After(delay, n) => {
            tracing::warn!(service = %key, error = %err, retry = n, retry_in = ?delay, "sync failed");
            Action::requeue(delay)
        }
        Retry::Drop => {
            tracing::error!(service = %key, error = %err, "sync failed {MAX_RETRIES} times: dropped until it changes");
            ctx.metrics.sync("dropped");
            let note = format!("dropped after {MAX_RETRIES} failed syncs: {err}");
            let regarding = svc.object_ref(&());
            tokio::spawn(async move {
                publish(&ctx, &regarding, "FailedToSyncService", &note).await;
            });
            Action::await_change()
        }
    }
}

/// The per-item delay before the `n`th retry: 1 s doubling up to 1000 s.
pub fn backoff(n: u32) -> Duration {
    let secs = 1u64.checked_shl(n.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_secs(secs.min(1000))
}

/// Each request of `requests` comes out `period` after the first request for the same
/// Service that is still waiting; later requests within that window join it (the
/// delaying queue's `AddAfter`, measured from the first change, not a trailing
/// debounce that a busy Service could postpone forever). A zero period passes every
/// request through at once.
pub fn batched<S>(
    requests: S,
    period: Duration,
) -> impl futures::Stream<Item = ObjectRef<Service>> + Send
where
    S: futures::Stream<Item = Vec<ObjectRef<Service>>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<Service>>();
    tokio::spawn(async move {
        let mut requests = std::pin::pin!(requests);
        let mut due: std::collections::BTreeMap<tokio::time::Instant, Vec<ObjectRef<Service>>> =
            Default::default();
        let mut waiting: std::collections::HashSet<ObjectRef<Service>> = Default::default();
        loop {
            let next = due.keys().next().copied();
            tokio::select! {
                r = requests.next() => {
                    let Some(refs) = r else { break };
                    for r in refs {
                        if period.is_zero() {
                            let _ = tx.send(r);
                        } else if waiting.insert(r.clone()) {
                            let at = tokio::time::Instant::now() + period;
                            due.entry(at).or_default().push(r);
                        }
                    }
                }
                () = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {
                    if let Some((_, refs)) = due.pop_first() {
                        for r in refs {
                            waiting.remove(&r);
                            let _ = tx.send(r);
                        }
                    }
                }
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) })
}

/// Reports each item of a watch stream to `/healthz`: an error marks the watch as
/// failing until its next success.
fn watch_health<T, E>(
    metrics: &Metrics,
    kind: &'static str,
) -> impl Fn(&std::result::Result<T, E>) {
    let health = metrics.health.clone();
    move |item| health.observe(kind, item.is_ok(), std::time::Instant::now())
}

/// Runs the controllers against the API server until the process is stopped.
pub async fn run(
    client: Client,
    options: store::Options,
    metrics: Metrics,
    field_manager: String,
    batch_period: Duration,
) -> Result<()> {
    let cfg = watcher::Config::default();
    let (pods_r, pods_w) = reflector::store::<Pod>();
    let (nodes_r, nodes_w) = reflector::store::<Node>();
    let (slices_r, slices_w) = reflector::store::<EndpointSlice>();
    let (eps_r, eps_w) = reflector::store::<Endpoints>();
    // A Pod whose labels changed also concerns the Services its old labels selected
    // (upstream's GetServicesToUpdateOnPodChange): the watch remembers each Pod's
    // labels and hands the previous ones to the mapper below when they change.
    type Labels = Option<std::collections::BTreeMap<String, String>>;
    let pod_labels: Arc<Mutex<HashMap<(String, String), Labels>>> = Arc::default();
    let previous_labels: Arc<Mutex<HashMap<(String, String), Labels>>> = Arc::default();
    let (labels_seen, labels_changed) = (pod_labels.clone(), previous_labels.clone());
    let index = Arc::new(Index::default());
    let (pod_index, pods_for_index) = (index.clone(), pods_r.clone());
    let pods = reflector::reflector(
        pods_w,
        watcher(Api::<Pod>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .inspect(watch_health(&metrics, "pod"))
    .inspect_ok(move |event| pod_index.pod_event(event, &pods_for_index))
    .inspect_ok(move |event| match event {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            let key = (p.namespace().unwrap_or_default(), p.name_any());
            let old = labels_seen
                .lock()
                .expect("pod labels")
                .insert(key.clone(), p.metadata.labels.clone());
            if let Some(old) = old.filter(|old| *old != p.metadata.labels) {
                labels_changed.lock().expect("pod labels").insert(key, old);
            }
        }
        watcher::Event::Delete(p) => {
            let key = (p.namespace().unwrap_or_default(), p.name_any());
            labels_seen.lock().expect("pod labels").remove(&key);
        }
        _ => {}
    })
    .touched_objects();
    let nodes = reflector::reflector(
        nodes_w,
        watcher(Api::<Node>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .inspect(watch_health(&metrics, "node"))
    .touched_objects();
    // A slice deleted by anyone, or taken out of this controller's hands by a changed
    // managed-by label, leaves the tracker at once (upstream's onEndpointSliceDelete
    // and HandleDeletion), so its Service is not held "stale" waiting for it.
    let tracker = Arc::new(Mutex::new(SliceTracker::default()));
    let ours = [
        options.slices.controller_name.clone(),
        options.mirroring.controller_name.clone(),
    ];
    let forgetting = tracker.clone();
    let (slice_index, slices_for_index) = (index.clone(), slices_r.clone());
    let slices = reflector::reflector(
        slices_w,
        watcher(Api::<EndpointSlice>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .inspect(watch_health(&metrics, "endpointslice"))
    .inspect_ok(move |event| slice_index.slice_event(event, &slices_for_index))
    .inspect_ok(move |event| {
        let gone = match event {
            watcher::Event::Delete(s) => Some(s),
            watcher::Event::Apply(s) if !ours.contains(&managed_by(s)) => Some(s),
            _ => None,
        };
        if let Some(uid) = gone.and_then(|s| s.metadata.uid.as_deref()) {
            forgetting.lock().expect("tracker").forget(uid);
        }
    })
    .touched_objects();
    let endpoints_tracker = tracker.clone();
    let eps = reflector::reflector(
        eps_w,
        watcher(Api::<Endpoints>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .inspect(watch_health(&metrics, "endpoints"))
    .inspect_ok(move |event| {
        // Endpoints deleted by anyone: whatever this controller last wrote of them
        // will never show in the cache, so it must not hold their Service stale.
        if let watcher::Event::Delete(e) = event {
            endpoints_tracker
                .lock()
                .expect("tracker")
                .endpoints_forget(&e.namespace().unwrap_or_default(), &e.name_any());
        }
    })
    .touched_objects();

    // The Service watch feeds the Controller and tells the sweep about deletions,
    // which the Controller never reconciles.
    let (sweep_tx, sweep_rx) = tokio::sync::mpsc::unbounded_channel::<Sweep>();
    let (services, services_w) = reflector::store::<Service>();
    let deletions = sweep_tx.clone();
    let deleted_tracker = tracker.clone();
    let selectors = Arc::new(Mutex::new(SelectorIndex::default()));
    let (selectors_w, services_for_selectors) = (selectors.clone(), services.clone());
    let service_events = reflector::reflector(
        services_w,
        watcher(Api::<Service>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .inspect(watch_health(&metrics, "service"))
    .inspect_ok(move |event| {
        let mut index = selectors_w.lock().expect("selector index");
        match event {
            watcher::Event::Apply(svc) | watcher::Event::InitApply(svc) => index.put(svc),
            watcher::Event::Delete(svc) => {
                index.remove(&svc.namespace().unwrap_or_default(), &svc.name_any())
            }
            // The store holds the list's result: what vanished without an event goes.
            watcher::Event::InitDone => {
                let all = services_for_selectors.state();
                index.rebuild(all.iter().map(|s| &**s));
            }
            watcher::Event::Init => {}
        }
    })
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(svc) = event {
            if let Some(uid) = svc.metadata.uid.as_deref() {
                deleted_tracker.lock().expect("tracker").forget_service(uid);
            }
        }
        let request = match event {
            watcher::Event::Delete(svc) => Sweep::Name(key_of_meta(&svc.metadata)),
            // A (re)list drops Services deleted meanwhile without an event.
            watcher::Event::InitDone => Sweep::All,
            _ => return,
        };
        // The receiver lives as long as the controller runs.
        let _ = deletions.send(request);
    })
    .applied_objects();
    let svc_for_pods = services.clone();
    let pod_to_services = move |pod: Pod| {
        let ns = pod.namespace().unwrap_or_default();
        let old = previous_labels
            .lock()
            .expect("pod labels")
            .remove(&(ns.clone(), pod.name_any()));
        let selects = |sel: &std::collections::BTreeMap<String, String>| {
            crate::util::selector_matches(sel, pod.metadata.labels.as_ref())
                || old
                    .as_ref()
                    .is_some_and(|old| crate::util::selector_matches(sel, old.as_ref()))
        };
        let mut names = {
            let index = selectors.lock().expect("selector index");
            let mut names = index.candidates(&ns, pod.metadata.labels.as_ref());
            if let Some(old) = &old {
                names.extend(index.candidates(&ns, old.as_ref()));
            }
            names
        };
        names.retain(|name| {
            svc_for_pods
                .get(&ObjectRef::new(name).within(&ns))
                .and_then(|s| s.spec.as_ref()?.selector.clone())
                .is_some_and(|sel| selects(&sel))
        });
        names
            .into_iter()
            .map(|name| ObjectRef::new(&name).within(&ns))
            .collect::<Vec<_>>()
    };
    // Pod changes reach a Service at most `batch_period` after the first of them
    // (upstream's --endpoint-updates-batch-period, default 0: at once); changes of
    // the Service, its slices, Endpoints and Nodes are not delayed.
    let pod_requests = batched(
        pods.filter_map(|pod| {
            futures::future::ready(match pod {
                Ok(pod) => Some(pod),
                Err(e) => {
                    tracing::warn!(error = %e, "pod watch");
                    None
                }
            })
        })
        .map(pod_to_services),
        batch_period,
    );
    let ctrl = Controller::for_stream(service_events, services.clone()).reconcile_on(pod_requests);
    let svc_for_nodes = services.clone();
    let own_writes = tracker.clone();
    let ctrl = ctrl
        .watches_stream(slices, move |s: EndpointSlice| {
            // This controller's own writes coming back do not sync again.
            if !own_writes.lock().expect("tracker").should_sync(&s) {
                return None;
            }
            let name = s.labels().get(crate::util::LABEL_SERVICE_NAME).cloned();
            let ns = s.namespace().unwrap_or_default();
            name.map(|n| ObjectRef::new(&n).within(&ns))
        })
        .watches_stream(eps, |e: Endpoints| {
            Some(ObjectRef::new(&e.name_any()).within(&e.namespace().unwrap_or_default()))
        })
        .watches_stream(nodes, move |_node: Node| {
            // Zones and capacity matter to Services with topology hints.
            svc_for_nodes
                .state()
                .into_iter()
                .filter(|s| crate::topology::hints_enabled(s))
                .map(|s| ObjectRef::from_obj(&*s))
                .collect::<Vec<_>>()
        })
        .shutdown_on_signal();
    let reporter = Reporter {
        controller: "sliceway-controller".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics,
        options,
        field_manager,
        stores: Stores {
            services,
            pods: pods_r,
            nodes: nodes_r,
            slices: slices_r,
            endpoints: eps_r,
            index,
        },
        state: Mutex::new(store::State::default()),
        tracker,
        failures: Mutex::new(RateLimiter::default()),
    });
    let sweeping = sweeper(ctx.clone(), sweep_tx, sweep_rx, Duration::from_secs(5));
    let controlling = ctrl
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile");
            }
        });
    // The sweep never ends by itself; the Controller ends on a signal.
    tokio::select! {
        () = controlling => {}
        () = sweeping => {}
    }
    Ok(())
}

//! The Kubernetes API source of the node agent: Services, EndpointSlices, the
//! ServiceCIDRs and the agent's own Node, kept in kube-rs reflector stores.
//!
//! Each kind is followed by a kube-rs `watcher` (list, then watch from the list's
//! resourceVersion, re-watch from the last resourceVersion seen when a watch ends,
//! relist on `410 Gone`) feeding a reflector store. Errors are logged and retried
//! with the watcher's default backoff; the source never ends on its own.
//!
//! The watches carry kube-proxy's filters as server-side selectors
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server.go>,
//! `labelSelector.Add(*noProxyName, *noHeadlessEndpoints)`):
//! Services and EndpointSlices with
//! `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`. With a
//! service proxy name configured, sliceway is an alternative proxy in the sense of
//! KEP-2447 and watches only the objects labelled with that name instead
//! (`service.kubernetes.io/service-proxy-name=<name>,!service.kubernetes.io/headless`).
//! The own Node is watched with the field selector `metadata.name=<node>`.
//! ServiceCIDRs (`networking.k8s.io/v1`) are watched whole, as kube-proxy's
//! `ServiceCIDRConfig` watches them, and handed to the sink all together at every
//! feed (a cluster has a few).
//!
//! Nothing may be written to the maps before every store has been filled once
//! ([`KubeSource::wait_synced`]): a restarted agent that synced on a partial cache
//! would shrink Services to the first slices seen. After that, [`KubeSource::next_batch`]
//! turns a burst of changes into one sync.
//!
//! Each store change also records which object changed (or that a store was listed
//! anew), so the agent feeds only those objects to its incremental compiler
//! ([`KubeSource::take_changes`], [`KubeSource::feed`]).
//!
//! Every object fed to the compiler passes the front door both binaries share
//! ([`conventions::validate`], with the rules for what an API server may hold:
//! [`conventions::validate::Rules::Stored`]), as objects of a manifest directory do:
//! one it refuses is logged once (object, field, reason) and recorded as an Event on
//! it, counted as the manifest reader's refusals are
//! (`sliceway_objects_skipped{kind="manifest", reason="invalid_object"}`), and kept
//! from the compiler, which drops its earlier version; the others go on
//! ([`KubeSource::refused`]; [`KubeSource::feed`] returns those newly refused).
//!
//! ```text
//! watcher ─► backoff ─► strip managedFields ─► reflector store ─► change counter
//!                                                   │            changed objects
//!                       snapshot(), feed() ◄────────┘   next_batch() ◄─┘
//!                                  └─► front door ─► compiler (sink)
//! ```

use std::{
    collections::{BTreeSet, HashSet},
    fmt::Debug,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use conventions::labels::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};
use conventions::validate::Checked;
use futures::{future::FutureExt as _, stream, Stream, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use kube::{
    runtime::{
        reflector::{self, ObjectRef, Store},
        watcher, WatchStreamExt as _,
    },
    Api, Client, Resource, ResourceExt as _,
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::{
    model::{Origin, ServiceCidrInfo, ServiceId, ServiceInfo, SliceId, SliceInfo},
    serve::health::Watches,
    source::{local::Objects, Sink},
};

/// How long [`KubeSource::next_batch`] keeps absorbing changes when the caller has no
/// opinion: short enough to be unnoticeable, long enough to merge the slice updates of
/// one rollout step.
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(100);

/// What the source needs to know to build its watches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeSourceConfig {
    /// The agent's own Node. Without one no Node is watched and the node store stays
    /// empty (and counts as synced).
    pub node_name: Option<String>,
    /// The `service.kubernetes.io/service-proxy-name` value that means "sliceway". With
    /// one, only objects carrying it are watched; without, only unlabelled ones.
    pub proxy_name: Option<String>,
}

impl KubeSourceConfig {
    /// Checks the names that go into selectors, so that neither can widen or break one.
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(name) = &self.proxy_name {
            check_label_value(name).map_err(|why| Error::InvalidProxyName(name.clone(), why))?;
        }
        if let Some(node) = &self.node_name {
            check_subdomain(node).map_err(|why| Error::InvalidNodeName(node.clone(), why))?;
        }
        Ok(())
    }

    /// The label selector of the Service and EndpointSlice watches (kube-proxy's).
    pub fn label_selector(&self) -> String {
        match &self.proxy_name {
            None => format!("!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}"),
            Some(name) => format!("{LABEL_SERVICE_PROXY_NAME}={name},!{LABEL_HEADLESS}"),
        }
    }

    /// The field selector of the Node watch, if a node name is set.
    pub fn node_field_selector(&self) -> Option<String> {
        self.node_name
            .as_ref()
            .map(|node| format!("metadata.name={node}"))
    }
}

/// Why the source cannot start or cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("service proxy name {0:?} is not a valid label value: {1}")]
    InvalidProxyName(String, &'static str),
    #[error("node name {0:?} is not a valid object name: {1}")]
    InvalidNodeName(String, &'static str),
    /// The reflector streams ended (their task was stopped or panicked).
    #[error("the Kubernetes watches stopped")]
    Stopped,
}

/// Changes absorbed by one [`KubeSource::next_batch`] or [`KubeSource::changed`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Store changes (an object applied or deleted, a relist completed) since the
    /// previous call; at least 1.
    pub changes: u64,
}

/// Namespace and name of an object.
pub type ObjectKey = (Option<String>, String);

/// The Services and EndpointSlices changed (applied or deleted) since the last
/// [`KubeSource::take_changes`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub services: BTreeSet<ObjectKey>,
    pub slices: BTreeSet<ObjectKey>,
    /// A store was listed (again): any of its objects may have changed.
    pub relisted: bool,
}

/// The reader side: stores, readiness and change notifications. The writer side is
/// the future returned by [`KubeSource::new`] (or the task of [`KubeSource::start`]).
#[derive(Debug)]
pub struct KubeSource {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    node: Store<Node>,
    service_cidrs: Store<ServiceCIDR>,
    changes: watch::Receiver<u64>,
    seen: u64,
    changed: Arc<Mutex<Changes>>,
    /// Which watches are failing, for `/healthz`.
    watches: Arc<Watches>,
    /// Objects the front door refuses now, as fed last.
    refused: Mutex<Refusals>,
}

/// An object of the stores that [`conventions::validate`] refuses: it is not handed
/// to the compiler (its earlier version is removed from it), and said once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// The field at fault and why, as the API server would name them.
    pub field: String,
    pub reason: String,
}

impl Refused {
    /// The reason's code, as the manifest reader's for the same refusal.
    pub const CODE: &'static str = "invalid_object";
}

/// Refused objects by kind, namespace and name.
type Refusals = std::collections::BTreeMap<(&'static str, String, String), Refused>;

/// The front door for an object of the stores: the API server's rules for what it
/// may hold ([`conventions::validate::Rules::Stored`]: what older releases stored
/// is read as kube-proxy reads it). `Some` when refused.
fn front_door<K: Kind>(obj: &K) -> Option<Refused> {
    let invalid = conventions::validate::stored(obj).err()?;
    Some(Refused {
        kind: K::KIND,
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        field: invalid.field,
        reason: invalid.reason,
    })
}

impl KubeSource {
    /// Builds the watches and returns the source with the future that drives them.
    /// The future never completes; spawn it or select on it next to a shutdown signal.
    pub fn new(
        client: Client,
        cfg: &KubeSourceConfig,
    ) -> Result<(Self, impl Future<Output = ()> + Send + 'static), Error> {
        cfg.validate()?;
        let labels = cfg.label_selector();
        let services = watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default().labels(&labels),
        );
        let slices = watcher(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default().labels(&labels),
        );
        let fields = cfg.node_field_selector();
        let node = match &fields {
            Some(fields) => watcher(
                Api::<Node>::all(client.clone()),
                watcher::Config::default().fields(fields),
            )
            .boxed(),
            None => synced_empty().boxed(),
        };
        let service_cidrs = watcher(
            Api::<ServiceCIDR>::all(client.clone()),
            watcher::Config::default(),
        );
        info!(labels = %labels, node = ?cfg.node_name, "watching the Kubernetes API");
        let (source, run) = Self::from_streams(services, slices, node, service_cidrs);
        let probe = probe_failing(client, labels, fields, source.watches.clone());
        Ok((source, async move {
            futures::join!(run, probe);
        }))
    }

    /// [`KubeSource::new`], with the driving future spawned on the current tokio
    /// runtime. Aborting the handle stops the watches; the source then reports
    /// [`Error::Stopped`].
    pub fn start(
        client: Client,
        cfg: &KubeSourceConfig,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), Error> {
        let (source, run) = Self::new(client, cfg)?;
        Ok((source, tokio::spawn(run)))
    }

    /// The source over arbitrary watcher event streams, one per kind. `new` passes
    /// kube-rs watchers; tests can pass scripted events. Each stream goes through the
    /// default backoff and a reflector store; errors are logged and the stream polled
    /// again.
    pub fn from_streams<S, E, N, C>(
        services: S,
        slices: E,
        node: N,
        service_cidrs: C,
    ) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        S: Stream<Item = watcher::Result<watcher::Event<Service>>> + Send + 'static,
        E: Stream<Item = watcher::Result<watcher::Event<EndpointSlice>>> + Send + 'static,
        N: Stream<Item = watcher::Result<watcher::Event<Node>>> + Send + 'static,
        C: Stream<Item = watcher::Result<watcher::Event<ServiceCIDR>>> + Send + 'static,
    {
        let (tx, rx) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let changed = Arc::new(Mutex::new(Changes::default()));
        let (services_store, services_writer) = reflector::store();
        let (slices_store, slices_writer) = reflector::store();
        let (node_store, node_writer) = reflector::store();
        let (cidrs_store, cidrs_writer) = reflector::store();
        let watches = Arc::new(Watches::default());
        let run = {
            let a = reflect(
                "Service",
                services,
                services_writer,
                tx.clone(),
                watches.clone(),
                recorder(changed.clone(), |c| &mut c.services),
            );
            let b = reflect(
                "EndpointSlice",
                slices,
                slices_writer,
                tx.clone(),
                watches.clone(),
                recorder(changed.clone(), |c| &mut c.slices),
            );
            // The compiler does not read the Node.
            let c = reflect(
                "Node",
                node,
                node_writer,
                tx.clone(),
                watches.clone(),
                |_: &watcher::Event<Node>| {},
            );
            // Read whole at every feed: nothing to record.
            let d = reflect(
                "ServiceCIDR",
                service_cidrs,
                cidrs_writer,
                tx,
                watches.clone(),
                |_: &watcher::Event<ServiceCIDR>| {},
            );
            async move {
                futures::join!(a, b, c, d);
            }
        };
        let source = Self {
            services: services_store,
            slices: slices_store,
            node: node_store,
            service_cidrs: cidrs_store,
            changes: rx,
            seen: 0,
            changed,
            watches,
            refused: Mutex::default(),
        };
        (source, run)
    }

    /// Waits until every store has been filled by a complete list once. Changes up to
    /// this point count as seen: the next [`snapshot`](Self::snapshot) has them.
    pub async fn wait_synced(&mut self) -> Result<(), Error> {
        let (a, b, c, d) = futures::join!(
            self.services.wait_until_ready(),
            self.slices.wait_until_ready(),
            self.node.wait_until_ready(),
            self.service_cidrs.wait_until_ready(),
        );
        a.and(b).and(c).and(d).map_err(|_| Error::Stopped)?;
        self.seen = *self.changes.borrow_and_update();
        info!(
            services = self.services.len(),
            slices = self.slices.len(),
            nodes = self.node.len(),
            service_cidrs = self.service_cidrs.len(),
            "Kubernetes caches synced"
        );
        Ok(())
    }

    /// Whether every store has been filled once (does not wait).
    pub fn is_synced(&self) -> bool {
        [
            self.services.wait_until_ready().now_or_never(),
            self.slices.wait_until_ready().now_or_never(),
            self.node.wait_until_ready().now_or_never(),
            self.service_cidrs.wait_until_ready().now_or_never(),
        ]
        .into_iter()
        .all(|ready| matches!(ready, Some(Ok(()))))
    }

    /// Resolves at the next store change after the previous call (or after
    /// [`wait_synced`](Self::wait_synced)); at once if one happened meanwhile.
    pub async fn changed(&mut self) -> Result<Batch, Error> {
        self.changes.changed().await.map_err(|_| Error::Stopped)?;
        Ok(self.mark_seen())
    }

    /// Waits for a change, then keeps absorbing changes for `delay`, so a burst of
    /// updates becomes one sync. The window is fixed, not extended by each change: a
    /// steady stream of updates still yields a batch every `delay`.
    pub async fn next_batch(&mut self, delay: Duration) -> Result<Batch, Error> {
        self.changes.changed().await.map_err(|_| Error::Stopped)?;
        tokio::time::sleep(delay).await;
        Ok(self.mark_seen())
    }

    fn mark_seen(&mut self) -> Batch {
        let now = *self.changes.borrow_and_update();
        let changes = now - self.seen;
        self.seen = now;
        Batch { changes }
    }

    /// The objects in the stores now, sorted by namespace and name, in the shape the
    /// compiler takes.
    pub fn snapshot(&self) -> Objects {
        Objects {
            services: sorted(&self.services),
            slices: sorted(&self.slices),
            nodes: sorted(&self.node),
            service_cidrs: sorted(&self.service_cidrs),
        }
    }

    /// The objects changed since the last call (every store change is in the stores
    /// before it is recorded here).
    pub fn take_changes(&self) -> Changes {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Brings `compiler` (the sink) to the stores: the objects named in `changes` are put or
    /// removed; after a relist, every object is put and those gone are removed. The
    /// own Node's zone and the ServiceCIDRs (all of them) are set every time (a
    /// no-op when they did not change). Returns
    /// the objects the front door refuses that it had not refused so (newly, or for
    /// another reason).
    pub fn feed(&self, changes: &Changes, compiler: &mut dyn Sink) -> Vec<Refused> {
        let node = self
            .node
            .state()
            .first()
            .map(|n| crate::model::NodeInfo::from(&**n));
        compiler.set_zone(node.as_ref().and_then(|n| n.zone.clone()));
        compiler.set_node_ip(node.as_ref().and_then(|n| n.primary_ipv4));
        compiler.set_node_ip6(node.as_ref().and_then(|n| n.primary_ipv6));
        compiler.set_pod_cidrs(node.map(|n| n.pod_cidrs).unwrap_or_default());
        compiler.set_service_cidrs(
            self.service_cidrs
                .state()
                .iter()
                .map(|c| ServiceCidrInfo::from(&**c))
                .collect(),
        );
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        let before = refused.clone();
        if changes.relisted {
            relist(&self.services, compiler, &mut refused);
            relist(&self.slices, compiler, &mut refused);
        } else {
            put_changed(&self.services, &changes.services, compiler, &mut refused);
            put_changed(&self.slices, &changes.slices, compiler, &mut refused);
        }
        refused
            .iter()
            .filter(|(key, why)| before.get(*key) != Some(*why))
            .map(|(_, why)| why.clone())
            .collect()
    }

    /// The objects of the stores that the front door refuses now (as last fed),
    /// sorted by kind, namespace and name.
    pub fn refused(&self) -> Vec<Refused> {
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.values().cloned().collect()
    }

    /// The Service store (reader side).
    pub fn services(&self) -> &Store<Service> {
        &self.services
    }

    /// The EndpointSlice store (reader side).
    pub fn slices(&self) -> &Store<EndpointSlice> {
        &self.slices
    }

    /// The own-Node store (reader side): empty or one Node.
    pub fn node(&self) -> &Store<Node> {
        &self.node
    }

    /// The ServiceCIDR store (reader side).
    pub fn service_cidrs(&self) -> &Store<ServiceCIDR> {
        &self.service_cidrs
    }
}

/// The API source as the agent follows it: the watches running on a task of their
/// own (stopped when this is dropped), bursts of changes batched for `batch`.
#[derive(Debug)]
pub struct ApiSource {
    source: KubeSource,
    task: tokio::task::JoinHandle<()>,
    batch: Duration,
    synced: bool,
    fed: bool,
    events: super::events::Events,
}

impl ApiSource {
    /// Starts the watches on the current tokio runtime.
    pub fn start(client: Client, cfg: &KubeSourceConfig, batch: Duration) -> Result<Self, Error> {
        let events = super::events::Events::new(client.clone(), cfg.node_name.as_deref());
        let (source, task) = KubeSource::start(client, cfg)?;
        Ok(Self {
            source,
            task,
            batch,
            synced: false,
            fed: false,
            events,
        })
    }
}

impl ApiSource {
    /// Which of its watches are failing, since when.
    pub fn watches(&self) -> Arc<Watches> {
        self.source.watches.clone()
    }
}

impl Drop for ApiSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl super::Source for ApiSource {
    type Error = Error;

    async fn wait(&mut self) -> Result<(), Error> {
        if !self.synced {
            // Nothing is written before every cache has listed once: a restart never
            // shrinks a Service to the first slice seen.
            info!("waiting for Services, EndpointSlices, ServiceCIDRs and the Node to sync");
            self.source.wait_synced().await?;
            self.synced = true;
            return Ok(());
        }
        self.source.next_batch(self.batch).await.map(|_| ())
    }

    fn report(&mut self, problems: &[super::events::Problem]) {
        for p in problems {
            let key = ObjectRef::new(&p.name).within(&p.namespace);
            let object = match p.kind {
                "Service" => self.source.services().get(&key).map(|o| o.object_ref(&())),
                "EndpointSlice" => self
                    .source
                    .slices()
                    .get(&ObjectRef::new(&p.name).within(&p.namespace))
                    .map(|o| o.object_ref(&())),
                // Cluster-scoped: its Event goes where kube-rs puts those.
                "ServiceCIDR" => self
                    .source
                    .service_cidrs()
                    .get(&ObjectRef::new(&p.name))
                    .map(|o| o.object_ref(&())),
                _ => None,
            };
            // Gone since: nothing to record it on.
            if let Some(object) = object {
                self.events.record(p, object);
            }
        }
    }

    fn node_eligible(&self) -> Option<bool> {
        self.source
            .node()
            .state()
            .first()
            .map(|n| crate::model::NodeInfo::from(&**n).eligible)
    }

    fn skipped_by_reason(&self) -> std::collections::BTreeMap<String, i64> {
        let refused = self.source.refused();
        if refused.is_empty() {
            return Default::default();
        }
        [(Refused::CODE.to_string(), refused.len() as i64)].into()
    }

    fn feed(&mut self, sink: &mut dyn Sink) -> super::Fed {
        let mut changes = self.source.take_changes();
        // The first feed hands over every object; later ones those that changed.
        changes.relisted |= !std::mem::replace(&mut self.fed, true);
        let refused = self.source.feed(&changes, sink);
        // Said on the object too, as the compiler's problems are.
        let problems: Vec<super::events::Problem> = refused
            .into_iter()
            .map(|r| super::events::Problem {
                kind: r.kind,
                namespace: r.namespace,
                name: r.name,
                code: Refused::CODE.into(),
                message: format!(
                    "{}: {}; the API server's rules do not allow it, so it is skipped",
                    r.field, r.reason
                ),
            })
            .collect();
        self.report(&problems);
        super::Fed::Changed
    }
}

/// What [`KubeSource::feed`] does alike for Services and EndpointSlices: the lean
/// copy the sink takes, its identity there, and the sink's calls for the kind.
/// (Its `KIND`, as the front door and messages name it, is [`Checked`]'s.)
trait Kind: Resource<DynamicType = ()> + Clone + Checked + 'static {
    type Info;
    type Id: Eq + std::hash::Hash;
    fn info(&self) -> Self::Info;
    fn id(info: &Self::Info) -> Self::Id;
    /// The identity of an object of the store named `key`, which may be gone.
    fn id_of(key: &ObjectKey) -> Self::Id;
    fn put(sink: &mut dyn Sink, info: Self::Info);
    fn remove(sink: &mut dyn Sink, id: &Self::Id);
    fn held(sink: &dyn Sink) -> Vec<Self::Id>;
}

impl Kind for Service {
    type Info = ServiceInfo;
    type Id = ServiceId;
    fn info(&self) -> ServiceInfo {
        ServiceInfo::from(self)
    }
    fn id(info: &ServiceInfo) -> ServiceId {
        ServiceId::of(info, Origin::default())
    }
    fn id_of((namespace, name): &ObjectKey) -> ServiceId {
        ServiceId {
            namespace: namespace.clone().unwrap_or_default(),
            name: name.clone(),
            origin: Origin::default(),
        }
    }
    fn put(sink: &mut dyn Sink, info: ServiceInfo) {
        sink.put_service(Origin::default(), info);
    }
    fn remove(sink: &mut dyn Sink, id: &ServiceId) {
        sink.remove_service(id);
    }
    fn held(sink: &dyn Sink) -> Vec<ServiceId> {
        sink.services_held()
    }
}

impl Kind for EndpointSlice {
    type Info = SliceInfo;
    type Id = SliceId;
    fn info(&self) -> SliceInfo {
        SliceInfo::from(self)
    }
    fn id(info: &SliceInfo) -> SliceId {
        SliceId::of(info, Origin::default())
    }
    fn id_of((namespace, name): &ObjectKey) -> SliceId {
        SliceId {
            namespace: namespace.clone(),
            name: Some(name.clone()),
            origin: Origin::default(),
        }
    }
    fn put(sink: &mut dyn Sink, info: SliceInfo) {
        sink.put_slice(Origin::default(), info);
    }
    fn remove(sink: &mut dyn Sink, id: &SliceId) {
        sink.remove_slice(id);
    }
    fn held(sink: &dyn Sink) -> Vec<SliceId> {
        sink.slices_held()
    }
}

/// Whether `obj` passes the front door; a refusal is recorded in `refused` and said
/// once (again only when its reason changes).
fn admitted<K: Kind>(obj: &K, refused: &mut Refusals) -> bool {
    let key = (K::KIND, obj.namespace().unwrap_or_default(), obj.name_any());
    match front_door(obj) {
        None => {
            refused.remove(&key);
            true
        }
        Some(why) => {
            if refused.get(&key) != Some(&why) {
                warn!(
                    kind = why.kind,
                    object = %format!("{}/{}", why.namespace, why.name),
                    field = %why.field,
                    reason = %why.reason,
                    "refused: the API server's rules do not allow it; skipped"
                );
            }
            refused.insert(key, why);
            false
        }
    }
}

/// After a relist: every object of `store` that passes the front door is put, and
/// what `sink` holds of the kind that the store no longer has (or that is refused
/// now) is removed.
fn relist<K: Kind>(store: &Store<K>, sink: &mut dyn Sink, refused: &mut Refusals) {
    let mut present = HashSet::new();
    let mut listed = HashSet::new();
    for obj in store.state() {
        listed.insert((obj.namespace().unwrap_or_default(), obj.name_any()));
        if !admitted(&*obj, refused) {
            continue;
        }
        let info = obj.info();
        present.insert(K::id(&info));
        K::put(sink, info);
    }
    refused.retain(|(kind, ns, name), _| {
        *kind != K::KIND || listed.contains(&(ns.clone(), name.clone()))
    });
    for id in K::held(sink).iter().filter(|id| !present.contains(id)) {
        K::remove(sink, id);
    }
}

/// The objects named in `keys` are put as `store` has them if they pass the front
/// door, or removed where it no longer has them or refuses them now.
fn put_changed<K: Kind>(
    store: &Store<K>,
    keys: &BTreeSet<ObjectKey>,
    sink: &mut dyn Sink,
    refused: &mut Refusals,
) {
    for key in keys {
        match store.get(&object_ref(&key.0, &key.1)) {
            Some(obj) if admitted(&*obj, refused) => K::put(sink, obj.info()),
            Some(_) => {
                K::remove(sink, &K::id_of(key));
            }
            None => {
                refused.remove(&(K::KIND, key.0.clone().unwrap_or_default(), key.1.clone()));
                K::remove(sink, &K::id_of(key));
            }
        }
    }
}

fn object_ref<K: Resource<DynamicType = ()>>(
    namespace: &Option<String>,
    name: &str,
) -> ObjectRef<K> {
    let r = ObjectRef::new(name);
    match namespace {
        Some(ns) => r.within(ns),
        None => r,
    }
}

/// Records the objects an event changed in `which` of `changed`.
fn recorder<K: Resource>(
    changed: Arc<Mutex<Changes>>,
    which: fn(&mut Changes) -> &mut BTreeSet<ObjectKey>,
) -> impl Fn(&watcher::Event<K>) + Send + 'static {
    move |event| {
        let mut c = changed.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                let meta = o.meta();
                which(&mut c).insert((
                    meta.namespace.clone(),
                    meta.name.clone().unwrap_or_default(),
                ));
            }
            watcher::Event::InitDone => c.relisted = true,
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

/// Drives one kind: events through the backoff into the store, each store change
/// recorded and counted. Returns only if `events` ends, which a kube-rs watcher never
/// does.
async fn reflect<K, S>(
    kind: &'static str,
    events: S,
    writer: reflector::store::Writer<K>,
    changes: Arc<watch::Sender<u64>>,
    watches: Arc<Watches>,
    record: impl Fn(&watcher::Event<K>),
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    let events = events
        .default_backoff()
        // Nobody reads managedFields here; they are often the bulk of an object.
        .modify(|obj: &mut K| obj.managed_fields_mut().clear())
        .reflect(writer);
    futures::pin_mut!(events);
    let mut failing = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if failing {
                    info!(kind, "watch recovered");
                    watches.recovered(kind);
                    failing = false;
                }
                if changes_store(&event) {
                    if let watcher::Event::Apply(o) | watcher::Event::Delete(o) = &event {
                        let meta = o.meta();
                        debug!(
                            kind,
                            name = meta.name.as_deref().unwrap_or_default(),
                            version = meta.resource_version.as_deref().unwrap_or_default(),
                            "store changed"
                        );
                    } else {
                        debug!(kind, %event, "store changed");
                    }
                    record(&event);
                    changes.send_modify(|n| *n += 1);
                }
            }
            Err(e) => {
                failing = true;
                match &e {
                    // Expected now and then: the watch fell behind compaction and the
                    // watcher relists.
                    watcher::Error::WatchError(status) if status.code == 410 => {
                        info!(kind, "watch expired, relisting: {e}")
                    }
                    _ => {
                        warn!(kind, "watch failed, retrying with backoff: {e}");
                        watches.failed(kind, &e);
                    }
                }
            }
        }
    }
    warn!(kind, "watch stream ended; no more updates of this kind");
}

/// While a watch fails, asks the API server every second for one object of its kind
/// (the same selector): when that works again the watch counts as recovered. A
/// watcher that resumes from its resource version says nothing until the next
/// change, so its silence cannot tell a recovered watch from a broken one; its next
/// retry (at most the watcher's 30 s backoff away) succeeds as the probe did, and a
/// watch that fails again starts a new failure.
async fn probe_failing(
    client: Client,
    labels: String,
    node_fields: Option<String>,
    watches: Arc<Watches>,
) {
    use kube::api::ListParams;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for kind in watches.failing_kinds() {
            let by_labels = ListParams::default().labels(&labels).limit(1);
            let answered = match kind {
                "Service" => Api::<Service>::all(client.clone())
                    .list_metadata(&by_labels)
                    .await
                    .is_ok(),
                "EndpointSlice" => Api::<EndpointSlice>::all(client.clone())
                    .list_metadata(&by_labels)
                    .await
                    .is_ok(),
                "ServiceCIDR" => Api::<ServiceCIDR>::all(client.clone())
                    .list_metadata(&ListParams::default().limit(1))
                    .await
                    .is_ok(),
                "Node" => {
                    let fields = node_fields.as_deref().unwrap_or_default();
                    Api::<Node>::all(client.clone())
                        .list_metadata(&ListParams::default().fields(fields).limit(1))
                        .await
                        .is_ok()
                }
                _ => false,
            };
            if answered {
                info!(kind, "the API server answers again for this kind");
                watches.recovered(kind);
            }
        }
    }
}

/// Whether applying `event` to a store changed what the store holds.
fn changes_store<K>(event: &watcher::Event<K>) -> bool {
    matches!(
        event,
        watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone
    )
}

/// A stream that fills a store with nothing once and then stays quiet.
fn synced_empty<K: Send + 'static>(
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static {
    stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)]).chain(stream::pending())
}

fn sorted<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut all: Vec<K> = store.state().iter().map(|o| (**o).clone()).collect();
    all.sort_by(|a, b| {
        (a.meta().namespace.as_deref(), a.meta().name.as_deref())
            .cmp(&(b.meta().namespace.as_deref(), b.meta().name.as_deref()))
    });
    all
}

/// A label value: at most 63 characters, alphanumerics, `-`, `_` and `.`, beginning
/// and ending with an alphanumeric (apimachinery `IsValidLabelValue`; empty is valid
/// there but names nothing here).
fn check_label_value(v: &str) -> Result<(), &'static str> {
    if v.is_empty() {
        return Err("empty");
    }
    if v.len() > 63 {
        return Err("longer than 63 characters");
    }
    if !v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("only letters, digits, '-', '_' and '.' are allowed");
    }
    if !v.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !v.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("must begin and end with a letter or digit");
    }
    Ok(())
}

/// A DNS-1123 subdomain, what Node names are (apimachinery `IsDNS1123Subdomain`).
fn check_subdomain(v: &str) -> Result<(), &'static str> {
    if v.is_empty() {
        return Err("empty");
    }
    if v.len() > 253 {
        return Err("longer than 253 characters");
    }
    for label in v.split('.') {
        let ok = !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err("lowercase letters, digits, '-' and '.', each part beginning and ending with a letter or digit");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::Incremental;

    fn service(name: &str, ip: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": ip, "ports": [{"port": 80}]},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn changes_name_the_objects_and_feed_brings_the_compiler_along() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let (mut source, run) = KubeSource::from_streams(
            rx.map(Ok),
            synced_empty::<EndpointSlice>(),
            synced_empty::<Node>(),
            synced_empty::<ServiceCIDR>(),
        );
        let run = tokio::spawn(run);
        let send = |e| tx.unbounded_send(e).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(service("a", "10.96.0.1")));
        send(watcher::Event::InitApply(service("b", "10.96.0.2")));
        send(watcher::Event::InitDone);
        source.wait_synced().await.unwrap();
        let changes = source.take_changes();
        assert!(changes.relisted, "{changes:?}");
        let mut compiler = Incremental::default();
        source.feed(&changes, &mut compiler);
        // A frontend and a ClusterIP marker each.
        assert_eq!(compiler.compile().len(), 4);

        // b changes, a goes: only they are named, and the compiler follows.
        send(watcher::Event::Apply(service("b", "10.96.0.3")));
        send(watcher::Event::Delete(service("a", "10.96.0.1")));
        while source.take_changes() == Changes::default() || source.services().len() != 1 {
            source.changed().await.unwrap();
        }
        let mut compiler2 = Incremental::default();
        source.feed(
            &Changes {
                relisted: true,
                ..Default::default()
            },
            &mut compiler2,
        );
        compiler2.compile();
        // The same changes again, named one by one, give what a full read gives.
        let named = Changes {
            services: [
                (Some("default".into()), "a".into()),
                (Some("default".into()), "b".into()),
            ]
            .into(),
            ..Default::default()
        };
        source.feed(&named, &mut compiler);
        assert_eq!(
            compiler.compile().len(),
            6,
            "a gone, b moved (frontend and marker each)"
        );
        assert_eq!(compiler.compiled(), compiler2.compiled());
        assert_eq!(compiler.service_count(), 1);
        run.abort();
    }

    #[test]
    fn selectors_follow_kube_proxy() {
        let cfg = KubeSourceConfig::default();
        assert_eq!(
            cfg.label_selector(),
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
        );
        assert_eq!(cfg.node_field_selector(), None);
        let cfg = KubeSourceConfig {
            node_name: Some("node-1".into()),
            proxy_name: Some("sliceway".into()),
        };
        assert_eq!(
            cfg.label_selector(),
            "service.kubernetes.io/service-proxy-name=sliceway,!service.kubernetes.io/headless"
        );
        assert_eq!(
            cfg.node_field_selector().as_deref(),
            Some("metadata.name=node-1")
        );
    }

    #[test]
    fn names_that_would_bend_a_selector_are_refused() {
        for bad in ["a,b", "x=y", "", "-a", "a b", &"a".repeat(64)] {
            let cfg = KubeSourceConfig {
                proxy_name: Some(bad.to_string()),
                ..Default::default()
            };
            assert!(
                matches!(cfg.validate(), Err(Error::InvalidProxyName(..))),
                "{bad:?}"
            );
        }
        for bad in ["Node", "a,metadata.name=b", "", "a..b", "-a"] {
            let cfg = KubeSourceConfig {
                node_name: Some(bad.to_string()),
                ..Default::default()
            };
            assert!(
                matches!(cfg.validate(), Err(Error::InvalidNodeName(..))),
                "{bad:?}"
            );
        }
        let good = KubeSourceConfig {
            node_name: Some("ip-10-0-0-1.eu-west-1.compute.internal".into()),
            proxy_name: Some("sliceway_v1.2".into()),
        };
        assert!(good.validate().is_ok());
    }
}

//! The kube-rs edge: reflectors for Services, Pods, Nodes, EndpointSlices and
//! Endpoints feed a runtime Controller keyed by Service; each reconcile builds a
//! [`Snapshot`] of the stores for that name, runs the pure reconcilers
//! ([`store::sync_service`]) and applies the plan with create/update/delete under a
//! named field manager. A [`SliceTracker`] keeps it from acting on a stale slice
//! cache (upstream's EndpointSliceTracker). The Controller never reconciles a name
//! whose Service is gone, so a [`sweep`] deletes the Endpoints and mirrored slices
//! of deleted Services, at start and on each deletion.

mod apply;
mod reconcile;
mod retry;
mod stores;
mod sweep;
mod tracker;

pub use apply::*;
pub use reconcile::*;
pub use retry::*;
pub use stores::*;
pub use sweep::*;
pub use tracker::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conventions::lean::Lean;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, store::Writer, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use crate::metrics::Metrics;
use crate::store::{self};
use crate::Result;

/// Services synced at once: upstream's default `--concurrent-service-endpoint-syncs`
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslice/config/v1alpha1/defaults.go>).
/// Also a bound the runtime needs: kube-rs's Controller polls every reconcile in
/// flight whenever one may have finished, so with no bound the 10,000 Services of a
/// cluster's first sync cost it quadratic time (it had written no slice after six
/// minutes).
pub const CONCURRENT_SYNCS: u16 = 5;

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
/// failing until its next success, and is logged (the watcher goes on by itself; an
/// event that did not decode is not seen again until its object changes).
fn watch_health<T, E: std::fmt::Display>(
    metrics: &Metrics,
    kind: &'static str,
) -> impl Fn(&std::result::Result<T, E>) {
    let health = metrics.health.clone();
    move |item| {
        if let Err(e) = item {
            tracing::warn!(%kind, error = %e, "watch failed; it is retried");
        }
        health.observe(kind, item.is_ok(), std::time::Instant::now())
    }
}

/// A watch of every object of a kind, decoded lean ([`conventions::lean`]: no
/// managed fields, of a Pod's spec and a Node's status only what the controller
/// reads), handed on as the kind itself. A write built from a cached object so
/// leaves the managed fields out, and the API server keeps what it has when an
/// update omits them.
pub fn lean_watcher<K>(
    client: &Client,
    cfg: &watcher::Config,
) -> impl futures::Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: conventions::lean::Trimmed + Clone + std::fmt::Debug + Send + 'static,
    Lean<K>: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    watcher(Api::<Lean<K>>::all(client.clone()), cfg.clone()).map_ok(|event| match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.into_inner()),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.into_inner()),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.into_inner()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}

/// The front door both binaries share ([`conventions::validate::stored`], the API
/// server's rules for what it may hold) on a watch stream, before its reflector
/// store: an object it refuses is logged (object, field, reason), counted as the
/// manifest reader's refusals are (`skipped{reason="invalid_object"}`) and kept out
/// of the store, so no reconciler sees it: left out of a list, and taken out of the
/// store (as deleted) when a change makes it refused. The others go on.
pub fn admitted<K, S>(events: S, metrics: &Metrics) -> impl futures::Stream<Item = S::Item> + Send
where
    K: kube::Resource + conventions::validate::Checked + Send + 'static,
    S: futures::Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let skipped = metrics.skipped.clone();
    events.try_filter_map(move |event| {
        let refused = |obj: &K| {
            let invalid = conventions::validate::stored(obj).err()?;
            let kind = K::KIND;
            tracing::warn!(
                %kind,
                object = %format!("{}/{}", obj.meta().namespace.as_deref().unwrap_or_default(), obj.meta().name.as_deref().unwrap_or_default()),
                field = %invalid.field,
                reason = %invalid.reason,
                "refused: the API server's rules do not allow it; skipped"
            );
            skipped
                .get_or_create(&vec![("reason".into(), "invalid_object".into())])
                .inc();
            Some(())
        };
        let event = match event {
            watcher::Event::InitApply(obj) if refused(&obj).is_some() => None,
            watcher::Event::Apply(obj) if refused(&obj).is_some() => {
                Some(watcher::Event::Delete(obj))
            }
            event => Some(event),
        };
        std::future::ready(Ok(event))
    })
}

/// The Endpoints of an Endpoints event that sync their Service, as upstream's two
/// controllers that watch Endpoints decide: the Endpoints controller syncs only on a
/// deletion (its informer has no other handler:
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpoint/endpoints_controller.go>,
/// `onEndpointsDelete`), the mirroring controller on Endpoints it mirrors now or
/// mirrored before the change (`onEndpointsAdd`, `onEndpointsUpdate` and
/// `onEndpointsDelete` with `shouldMirror` in
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslicemirroring/endpointslicemirroring_controller.go>).
/// So Endpoints labelled skip-mirror do not sync their Service while they change.
/// `mirrorable` holds the Endpoints last seen mirrorable, the previous object's
/// `shouldMirror` that a watch event does not carry.
///
/// `nothing_to_mirror(ns, name)` says the mirroring controller's sync would do
/// nothing for Endpoints it may mirror: their Service has a selector (so its sync
/// only deletes the mirrored slices of the name) and no mirrored slice of the name
/// is cached. Upstream queues that sync and it returns at once
/// (`syncEndpoints`: "Service now has selector, cleaning up any mirrored
/// EndpointSlices"); here a sync is of all three controllers at once, so it is not
/// asked for. This is what keeps the Endpoints the Endpoints controller writes, which
/// upstream v1.37.2 does not label skip-mirror, from syncing their Service again.
pub fn endpoints_trigger(
    mirrorable: &mut std::collections::HashSet<(String, String)>,
    event: watcher::Event<Endpoints>,
    nothing_to_mirror: impl Fn(&str, &str) -> bool,
) -> Option<Endpoints> {
    let key = |e: &Endpoints| (e.namespace().unwrap_or_default(), e.name_any());
    match event {
        watcher::Event::Delete(e) => {
            mirrorable.remove(&key(&e));
            Some(e)
        }
        watcher::Event::Apply(e) | watcher::Event::InitApply(e) => {
            let now = crate::mirroring::should_mirror(&e);
            let before = if now {
                !mirrorable.insert(key(&e))
            } else {
                mirrorable.remove(&key(&e))
            };
            let (ns, name) = key(&e);
            ((now || before) && !nothing_to_mirror(&ns, &name)).then_some(e)
        }
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
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
    let source = Source {
        client: &client,
        cfg: &cfg,
        metrics: &metrics,
    };
    let (stores, writers) = stores();
    // The Pod watch puts a Pod's previous labels here when they change, for the
    // mapping of Pods to their Services.
    let previous_labels = PodLabels::default();
    let pods = pod_watch(&source, writers.pods, &stores, previous_labels.clone());
    let nodes = node_watch(&source, writers.nodes, &stores);
    let tracker = Arc::new(Mutex::new(SliceTracker::default()));
    let slices = slice_watch(&source, writers.slices, &stores, &tracker, &options);
    let endpoints = endpoints_watch(
        &source,
        writers.endpoints,
        &tracker,
        nothing_to_mirror(&stores, &options),
    );
    let (sweep_tx, sweep_rx) = tokio::sync::mpsc::unbounded_channel::<Sweep>();
    let selectors = Arc::new(Mutex::new(SelectorIndex::default()));
    let service_events = service_watch(
        &source,
        writers.services,
        &stores,
        &selectors,
        &tracker,
        sweep_tx.clone(),
    );
    let to_services = pod_to_services(&stores, selectors, previous_labels);
    let pod_requests = pod_requests(pods, to_services, batch_period);
    let ctrl = runtime_controller(
        service_events,
        &stores,
        pod_requests,
        slices,
        endpoints,
        nodes,
        &tracker,
    );
    let ctx = context(client, metrics, options, field_manager, stores, tracker);
    until_stopped(ctrl, ctx, sweep_tx, sweep_rx).await;
    Ok(())
}

/// What every watch is built from: the API client, the one watch configuration, and
/// the metrics that count the watches' health and refusals.
struct Source<'a> {
    client: &'a Client,
    cfg: &'a watcher::Config,
    metrics: &'a Metrics,
}

/// The writers of the reflector stores, one per kind, each handed to its watch.
struct Writers {
    services: Writer<Service>,
    pods: Writer<Pod>,
    nodes: Writer<Node>,
    slices: Writer<EndpointSlice>,
    endpoints: Writer<Endpoints>,
}

/// Empty reflector stores of every kind the controllers read, with the index kept
/// beside them, and their writers.
fn stores() -> (Stores, Writers) {
    let (services, services_w) = reflector::store::<Service>();
    let (pods, pods_w) = reflector::store::<Pod>();
    let (nodes, nodes_w) = reflector::store::<Node>();
    let (slices, slices_w) = reflector::store::<EndpointSlice>();
    let (endpoints, endpoints_w) = reflector::store::<Endpoints>();
    let stores = Stores {
        services,
        pods,
        nodes,
        slices,
        endpoints,
        index: Arc::new(Index::default()),
    };
    let writers = Writers {
        services: services_w,
        pods: pods_w,
        nodes: nodes_w,
        slices: slices_w,
        endpoints: endpoints_w,
    };
    (stores, writers)
}

/// A Pod's labels by (namespace, name).
type PodLabels =
    Arc<Mutex<HashMap<(String, String), Option<std::collections::BTreeMap<String, String>>>>>;

/// The Pod watch: fills the Pod store and the index. A Pod whose labels changed also
/// concerns the Services its old labels selected (upstream's
/// GetServicesToUpdateOnPodChange): the watch remembers each Pod's labels and puts
/// the previous ones in `previous_labels` when they change, for [`pod_to_services`].
fn pod_watch(
    source: &Source<'_>,
    writer: Writer<Pod>,
    stores: &Stores,
    previous_labels: PodLabels,
) -> impl futures::Stream<Item = std::result::Result<Pod, watcher::Error>> + Send {
    let labels_seen = PodLabels::default();
    let (pod_index, pods_for_index) = (stores.index.clone(), stores.pods.clone());
    reflector::reflector(
        writer,
        admitted(
            lean_watcher::<Pod>(source.client, source.cfg),
            source.metrics,
        ),
    )
    .default_backoff()
    .inspect(watch_health(source.metrics, "pod"))
    .inspect_ok(move |event| pod_index.pod_event(event, &pods_for_index))
    .inspect_ok(move |event| match event {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
            let key = (p.namespace().unwrap_or_default(), p.name_any());
            let old = labels_seen
                .lock()
                .expect("pod labels")
                .insert(key.clone(), p.metadata.labels.clone());
            if let Some(old) = old.filter(|old| *old != p.metadata.labels) {
                previous_labels.lock().expect("pod labels").insert(key, old);
            }
        }
        watcher::Event::Delete(p) => {
            let key = (p.namespace().unwrap_or_default(), p.name_any());
            labels_seen.lock().expect("pod labels").remove(&key);
        }
        _ => {}
    })
    .touched_objects()
}

/// The Node watch: fills the Node store and tells the index that Nodes changed.
fn node_watch(
    source: &Source<'_>,
    writer: Writer<Node>,
    stores: &Stores,
) -> impl futures::Stream<Item = std::result::Result<Node, watcher::Error>> + Send {
    let node_index = stores.index.clone();
    reflector::reflector(writer, lean_watcher::<Node>(source.client, source.cfg))
        .default_backoff()
        .inspect(watch_health(source.metrics, "node"))
        .inspect_ok(move |event| node_index.node_event(event))
        .touched_objects()
}

/// The EndpointSlice watch: fills the slice store and the index. A slice deleted by
/// anyone, or taken out of this controller's hands by a changed managed-by label,
/// leaves the tracker at once (upstream's onEndpointSliceDelete and HandleDeletion),
/// so its Service is not held "stale" waiting for it.
fn slice_watch(
    source: &Source<'_>,
    writer: Writer<EndpointSlice>,
    stores: &Stores,
    tracker: &Arc<Mutex<SliceTracker>>,
    options: &store::Options,
) -> impl futures::Stream<Item = std::result::Result<EndpointSlice, watcher::Error>> + Send {
    let ours = [
        options.slices.controller_name.clone(),
        options.mirroring.controller_name.clone(),
    ];
    let forgetting = tracker.clone();
    let (slice_index, slices_for_index) = (stores.index.clone(), stores.slices.clone());
    reflector::reflector(
        writer,
        admitted(
            lean_watcher::<EndpointSlice>(source.client, source.cfg),
            source.metrics,
        ),
    )
    .default_backoff()
    .inspect(watch_health(source.metrics, "endpointslice"))
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
    .touched_objects()
}

/// Whether the mirroring controller's sync of a name would do nothing, as
/// [`endpoints_trigger`] asks: its Service has a selector and no slice of the
/// mirroring controller's is cached for it.
fn nothing_to_mirror(
    stores: &Stores,
    options: &store::Options,
) -> impl Fn(&str, &str) -> bool + Send + 'static {
    let (services, slices, index) = (
        stores.services.clone(),
        stores.slices.clone(),
        stores.index.clone(),
    );
    let mirroring = options.mirroring.controller_name.clone();
    move |ns: &str, name: &str| {
        let selector = services
            .get(&ObjectRef::new(name).within(ns))
            .is_some_and(|s| s.spec.as_ref().is_some_and(|s| s.selector.is_some()));
        selector
            && !index.slice_names(ns, name).iter().any(|slice| {
                slices
                    .get(&ObjectRef::new(slice).within(ns))
                    .is_some_and(|s| managed_by(&s) == mirroring)
            })
    }
}

/// The Endpoints watch: fills the Endpoints store and hands on the Endpoints that
/// sync their Service ([`endpoints_trigger`]).
fn endpoints_watch(
    source: &Source<'_>,
    writer: Writer<Endpoints>,
    tracker: &Arc<Mutex<SliceTracker>>,
    nothing_to_mirror: impl Fn(&str, &str) -> bool + Send + 'static,
) -> impl futures::Stream<Item = std::result::Result<Endpoints, watcher::Error>> + Send {
    let endpoints_tracker = tracker.clone();
    let mirrorable = Arc::new(Mutex::new(std::collections::HashSet::new()));
    reflector::reflector(
        writer,
        admitted(
            lean_watcher::<Endpoints>(source.client, source.cfg),
            source.metrics,
        ),
    )
    .default_backoff()
    .inspect(watch_health(source.metrics, "endpoints"))
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
    .try_filter_map(move |event| {
        let syncs = endpoints_trigger(
            &mut mirrorable.lock().expect("mirrorable"),
            event,
            &nothing_to_mirror,
        );
        std::future::ready(Ok(syncs))
    })
}

/// The Service watch: fills the Service store and the selector index, feeds the
/// Controller, and tells the sweep about deletions, which the Controller never
/// reconciles.
fn service_watch(
    source: &Source<'_>,
    writer: Writer<Service>,
    stores: &Stores,
    selectors: &Arc<Mutex<SelectorIndex>>,
    tracker: &Arc<Mutex<SliceTracker>>,
    deletions: tokio::sync::mpsc::UnboundedSender<Sweep>,
) -> impl futures::Stream<Item = std::result::Result<Service, watcher::Error>> + Send {
    let deleted_tracker = tracker.clone();
    let (selectors_w, services_for_selectors) = (selectors.clone(), stores.services.clone());
    reflector::reflector(
        writer,
        admitted(
            lean_watcher::<Service>(source.client, source.cfg),
            source.metrics,
        ),
    )
    .default_backoff()
    .inspect(watch_health(source.metrics, "service"))
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
    .applied_objects()
}

/// The Services a Pod's change concerns: those whose selector matches its labels,
/// or the labels it had before the change ([`pod_watch`]'s `previous_labels`,
/// taken here), found through the selector index.
fn pod_to_services(
    stores: &Stores,
    selectors: Arc<Mutex<SelectorIndex>>,
    previous_labels: PodLabels,
) -> impl Fn(Pod) -> Vec<ObjectRef<Service>> + Send + 'static {
    let svc_for_pods = stores.services.clone();
    move |pod: Pod| {
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
    }
}

/// The reconcile requests of Pod changes: each Pod the watch delivers, mapped to its
/// Services by `to_services`; a watch error is logged and skipped. Pod changes reach
/// a Service at most `batch_period` after the first of them (upstream's
/// --endpoint-updates-batch-period, default 0: at once); changes of the Service, its
/// slices, Endpoints and Nodes are not delayed.
fn pod_requests(
    pods: impl futures::Stream<Item = std::result::Result<Pod, watcher::Error>> + Send + 'static,
    to_services: impl Fn(Pod) -> Vec<ObjectRef<Service>> + Send + 'static,
    batch_period: Duration,
) -> impl futures::Stream<Item = ObjectRef<Service>> + Send {
    batched(
        pods.filter_map(|pod| {
            futures::future::ready(match pod {
                Ok(pod) => Some(pod),
                Err(e) => {
                    tracing::warn!(error = %e, "pod watch");
                    None
                }
            })
        })
        .map(to_services),
        batch_period,
    )
}

/// The runtime Controller keyed by Service: the Service watch and the Pod requests
/// trigger it, and slices, Endpoints and Nodes map to the Services they concern; at
/// most [`CONCURRENT_SYNCS`] reconciles at once, ended by a signal.
fn runtime_controller(
    service_events: impl futures::Stream<Item = std::result::Result<Service, watcher::Error>>
        + Send
        + 'static,
    stores: &Stores,
    pod_requests: impl futures::Stream<Item = ObjectRef<Service>> + Send + 'static,
    slices: impl futures::Stream<Item = std::result::Result<EndpointSlice, watcher::Error>>
        + Send
        + 'static,
    endpoints: impl futures::Stream<Item = std::result::Result<Endpoints, watcher::Error>>
        + Send
        + 'static,
    nodes: impl futures::Stream<Item = std::result::Result<Node, watcher::Error>> + Send + 'static,
    tracker: &Arc<Mutex<SliceTracker>>,
) -> Controller<Service> {
    let ctrl = Controller::for_stream(service_events, stores.services.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENT_SYNCS))
        .reconcile_on(pod_requests);
    let svc_for_nodes = stores.services.clone();
    let own_writes = tracker.clone();
    ctrl.watches_stream(slices, move |s: EndpointSlice| {
        // This controller's own writes coming back do not sync again.
        if !own_writes.lock().expect("tracker").should_sync(&s) {
            return None;
        }
        let name = s.labels().get(crate::util::LABEL_SERVICE_NAME).cloned();
        let ns = s.namespace().unwrap_or_default();
        name.map(|n| ObjectRef::new(&n).within(&ns))
    })
    .watches_stream(endpoints, |e: Endpoints| {
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
    .shutdown_on_signal()
}

/// The shared state of reconciles, with a recorder of Events reported as
/// sliceway-controller (the instance: `POD_NAME`).
fn context(
    client: Client,
    metrics: Metrics,
    options: store::Options,
    field_manager: String,
    stores: Stores,
    tracker: Arc<Mutex<SliceTracker>>,
) -> Arc<Context> {
    let reporter = Reporter {
        controller: "sliceway-controller".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics,
        options,
        field_manager,
        stores,
        state: Mutex::new(store::State::default()),
        tracker,
        failures: Mutex::new(RateLimiter::default()),
    })
}

/// Runs the Controller's reconciles (their CPU counted, their errors logged at debug)
/// and the sweep of deleted Services' leftovers side by side, until the Controller
/// ends on a signal; the sweep never ends by itself.
async fn until_stopped(
    ctrl: Controller<Service>,
    ctx: Arc<Context>,
    sweep_tx: tokio::sync::mpsc::UnboundedSender<Sweep>,
    sweep_rx: tokio::sync::mpsc::UnboundedReceiver<Sweep>,
) {
    let sweeping = sweeper(ctx.clone(), sweep_tx, sweep_rx, Duration::from_secs(5));
    let controlling = ctrl
        .run(
            |svc, ctx| {
                let cpu = ctx.metrics.clone();
                cpu.reconcile_cpu(reconcile(svc, ctx))
            },
            error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile");
            }
        });
    tokio::select! {
        () = controlling => {}
        () = sweeping => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, address: &str) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address]}],
        }))
        .unwrap()
    }

    fn endpoints(name: &str, labels: serde_json::Value) -> Endpoints {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "labels": labels},
        }))
        .unwrap()
    }

    /// Issue 14: Endpoints labelled skip-mirror do not sync their Service when they
    /// change; Endpoints that are mirrored, that were mirrored before the change, or
    /// that are deleted do, as upstream's Endpoints and mirroring controllers decide.
    #[test]
    fn endpoints_events_sync_as_upstreams_handlers_decide() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let skip = serde_json::json!({"endpointslice.kubernetes.io/skip-mirror": "true"});
        let none = serde_json::json!({});
        let mut seen = std::collections::HashSet::new();
        let mut syncs = |event| endpoints_trigger(&mut seen, event, |_, _| false).is_some();
        assert!(!syncs(Init));
        assert!(!syncs(InitApply(endpoints("own", skip.clone()))));
        assert!(syncs(InitApply(endpoints("hand", none.clone()))));
        assert!(!syncs(InitDone));
        assert!(!syncs(Apply(endpoints("own", skip.clone()))));
        assert!(syncs(Apply(endpoints("hand", none.clone()))));
        // Mirrored before the change, not after it: the mirrored slices must go.
        assert!(syncs(Apply(endpoints("hand", skip.clone()))));
        assert!(!syncs(Apply(endpoints("hand", skip.clone()))));
        // The skip-mirror label taken off.
        assert!(syncs(Apply(endpoints("own", none.clone()))));
        // A deletion always syncs (the Endpoints controller writes them again).
        assert!(syncs(Delete(endpoints("own", none))));
        assert!(syncs(Delete(endpoints("other", skip))));
    }

    /// Issue 14: the Endpoints the Endpoints controller writes for a Service with a
    /// selector (not labelled skip-mirror, as upstream v1.37.2 writes them) do not
    /// sync it again when they come back, unless mirrored slices of the name are
    /// left for the mirroring controller to delete; Endpoints of a Service without a
    /// selector (mirrored) always do, and a deletion does.
    #[test]
    fn endpoints_of_a_service_with_a_selector_sync_only_when_mirrors_must_go() {
        use watcher::Event::{Apply, Delete};
        let labels =
            serde_json::json!({"endpoints.kubernetes.io/managed-by": "endpoint-controller"});
        let mut seen = std::collections::HashSet::new();
        // "web" has a selector and no mirrored slice; "old" has a selector and a
        // mirrored slice left from before it had one; "manual" has no selector.
        let nothing_to_mirror = |_: &str, name: &str| name == "web";
        let mut syncs = |event| endpoints_trigger(&mut seen, event, nothing_to_mirror).is_some();
        assert!(!syncs(Apply(endpoints("web", labels.clone()))));
        assert!(!syncs(Apply(endpoints("web", labels.clone()))));
        assert!(syncs(Apply(endpoints("old", labels.clone()))));
        assert!(syncs(Apply(endpoints("manual", labels.clone()))));
        assert!(syncs(Delete(endpoints("web", labels))));
    }

    /// Issue 14: the stores hold no managedFields, which nothing reads: the watches
    /// decode their objects lean.
    #[test]
    fn watched_objects_lose_their_managed_fields() {
        let mut s = slice("web", "10.244.1.5");
        s.metadata.managed_fields = Some(vec![Default::default()]);
        let json = serde_json::to_string(&s).unwrap();
        let s = serde_json::from_str::<Lean<EndpointSlice>>(&json)
            .unwrap()
            .into_inner();
        assert_eq!(s.metadata.managed_fields, None);
        assert_eq!(s.metadata.name.as_deref(), Some("web"));
    }

    /// Issue 19: what the watches deliver passes the front door files pass, before
    /// the store: a refused object never reaches the reconcilers, one turned bad
    /// leaves the store, the others stay; each refusal is counted.
    #[tokio::test]
    async fn objects_the_front_door_refuses_never_reach_the_store() {
        let metrics = Metrics::new();
        let (store, writer) = reflector::store::<EndpointSlice>();
        let events = vec![
            watcher::Event::Init,
            watcher::Event::InitApply(slice("good", "10.244.1.5")),
            // Leading zeros: what an older API server stored, read as decimal.
            watcher::Event::InitApply(slice("old", "010.244.001.006")),
            watcher::Event::InitApply(slice("loopback", "127.0.0.1")),
            watcher::Event::InitDone,
            watcher::Event::Apply(slice("good", "169.254.169.254")),
            watcher::Event::Apply(slice("new", "10.244.1.7")),
        ];
        let stream = futures::stream::iter(events.into_iter().map(Ok));
        let applied = reflector::reflector(writer, admitted(stream, &metrics));
        let seen: Vec<_> = applied.try_collect().await.unwrap();
        assert_eq!(seen.len(), 6, "the refused list item is left out");
        let mut names: Vec<String> = store.state().iter().map(|s| s.name_any()).collect();
        names.sort();
        assert_eq!(names, ["new", "old"]);
        assert!(
            metrics
                .render()
                .contains("skipped_total{reason=\"invalid_object\"} 2"),
            "{}",
            metrics.render()
        );
    }
}

//! The kube-rs edge: reflectors for Services, Pods, Nodes, EndpointSlices and
//! Endpoints feed a runtime Controller keyed by Service; each reconcile builds a
//! [`Snapshot`] of the stores for that name, runs the pure reconcilers
//! ([`store::sync_service`]) and applies the plan with create/update/delete under a
//! named field manager. A [`SliceTracker`] keeps it from acting on a stale slice
//! cache (upstream's EndpointSliceTracker).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::instrument;

use crate::metrics::Metrics;
use crate::plan::{Object, Plan};
use crate::store::{self, Snapshot};
use crate::topology::TopologyInfo;
use crate::{Error, Result};

/// Generations this controller wrote, per slice UID (upstream's EndpointSliceTracker).
#[derive(Debug, Default)]
pub struct SliceTracker {
    by_service: HashMap<String, HashMap<String, i64>>,
}

/// Marks a slice this controller deleted and expects gone from the cache.
const DELETION_EXPECTED: i64 = -1;

impl SliceTracker {
    /// Records a written slice.
    pub fn written(&mut self, service_uid: &str, slice: &EndpointSlice) {
        if let Some(uid) = &slice.metadata.uid {
            self.by_service
                .entry(service_uid.into())
                .or_default()
                .insert(uid.clone(), slice.metadata.generation.unwrap_or(0));
        }
    }
    /// Records a deleted slice.
    pub fn deleted(&mut self, service_uid: &str, slice: &EndpointSlice) {
        if let Some(uid) = &slice.metadata.uid {
            self.by_service
                .entry(service_uid.into())
                .or_default()
                .insert(uid.clone(), DELETION_EXPECTED);
        }
    }
    /// Whether the cached slices are older than what this controller wrote
    /// (StaleSlices).
    pub fn stale(&self, service_uid: &str, cached: &[EndpointSlice]) -> bool {
        let Some(gens) = self.by_service.get(service_uid) else {
            return false;
        };
        let mut seen = std::collections::HashSet::new();
        for s in cached {
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
    pub fn settle(&mut self, service_uid: &str, cached: &[EndpointSlice]) {
        if let Some(gens) = self.by_service.get_mut(service_uid) {
            let present: std::collections::HashSet<String> = cached
                .iter()
                .filter_map(|s| s.metadata.uid.clone())
                .collect();
            gens.retain(|uid, g| *g != DELETION_EXPECTED || present.contains(uid));
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
                let made = slices(&ns).create(&pp, s).await?;
                tracker.lock().expect("tracker").written(service_uid, &made);
            }
            Object::Endpoints(e) => {
                endpoints(&ns).create(&pp, e).await?;
            }
        }
    }
    for obj in &plan.update {
        let (ns, name) = obj.key();
        match obj {
            Object::EndpointSlice(s) => {
                let made = slices(&ns).replace(&name, &pp, s).await?;
                tracker.lock().expect("tracker").written(service_uid, &made);
            }
            Object::Endpoints(e) => {
                endpoints(&ns).replace(&name, &pp, e).await?;
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
            Err(e) => return Err(e.into()),
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
    /// Written generations.
    pub tracker: Mutex<SliceTracker>,
    /// Consecutive failures per Service, for backoff.
    pub failures: Mutex<HashMap<String, u32>>,
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
}

impl Stores {
    /// The objects of one namespace and name the reconcilers read.
    pub fn snapshot_for(&self, ns: &str, name: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        let same_ns = |o: &dyn Fn() -> Option<String>| o().as_deref() == Some(ns);
        if let Some(s) = self.services.get(&ObjectRef::new(name).within(ns)) {
            snap.add_service((*s).clone());
        }
        for p in self.pods.state() {
            if same_ns(&|| p.metadata.namespace.clone()) {
                snap.add_pod((*p).clone());
            }
        }
        for n in self.nodes.state() {
            snap.add_node((*n).clone());
        }
        for s in self.slices.state() {
            if same_ns(&|| s.metadata.namespace.clone()) {
                snap.add_slice((*s).clone());
            }
        }
        if let Some(e) = self.endpoints.get(&ObjectRef::new(name).within(ns)) {
            snap.add_endpoints((*e).clone());
        }
        snap
    }
}

/// Reconciles one Service name: slices, Endpoints and mirrored slices.
#[instrument(skip(svc, ctx), fields(service = %format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())))]
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    let ns = svc.namespace().unwrap_or_else(|| "default".into());
    let name = svc.name_any();
    let uid = svc.uid().unwrap_or_default();
    let snap = ctx.stores.snapshot_for(&ns, &name);
    let cached = snap.slices_for(&ns, &name, &ctx.options.slices.controller_name);
    {
        let mut tracker = ctx.tracker.lock().expect("tracker");
        if tracker.stale(&uid, &cached) {
            ctx.metrics.sync("stale");
            return Err(Error::StaleCache(format!("{ns}/{name}")));
        }
        tracker.settle(&uid, &cached);
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
    for (kind, _, msg) in &outcome.events {
        let (reason, note) = msg.split_once(": ").unwrap_or(("Warning", msg));
        publish(&ctx, &svc, kind, reason, note).await;
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
        publish(
            &ctx,
            &svc,
            "Service",
            "FailedToUpdateEndpointSlices",
            &format!("Error updating Endpoint Slices for Service {ns}/{name}: {e}"),
        )
        .await;
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
        .remove(&format!("{ns}/{name}"));
    Ok(Action::await_change())
}

async fn publish(ctx: &Context, svc: &Service, _kind: &str, reason: &str, note: &str) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Sync".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &svc.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing event");
    }
}

/// Retries with exponential backoff per Service, 1s doubling up to 1000s, as
/// upstream's workqueue rate limiter for this controller.
pub fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
    let mut failures = ctx.failures.lock().expect("failures");
    let n = failures.entry(key.clone()).or_insert(0);
    *n = n.saturating_add(1);
    let delay = backoff(*n);
    tracing::warn!(service = %key, error = %err, retry_in = ?delay, "sync failed");
    Action::requeue(delay)
}

/// The delay before the `n`th retry.
pub fn backoff(n: u32) -> Duration {
    let secs = 1u64.checked_shl(n.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_secs(secs.min(1000))
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
    let pods = reflector::reflector(
        pods_w,
        watcher(Api::<Pod>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .touched_objects();
    let nodes = reflector::reflector(
        nodes_w,
        watcher(Api::<Node>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .touched_objects();
    let slices = reflector::reflector(
        slices_w,
        watcher(Api::<EndpointSlice>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .touched_objects();
    let eps = reflector::reflector(
        eps_w,
        watcher(Api::<Endpoints>::all(client.clone()), cfg.clone()),
    )
    .default_backoff()
    .touched_objects();

    let ctrl = Controller::new(Api::<Service>::all(client.clone()), cfg)
        .with_config(ControllerConfig::default().debounce(batch_period));
    let services = ctrl.store();
    let svc_for_pods = services.clone();
    let svc_for_nodes = services.clone();
    let ctrl = ctrl
        .watches_stream(pods, move |pod: Pod| {
            let ns = pod.namespace().unwrap_or_default();
            svc_for_pods
                .state()
                .into_iter()
                .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
                .filter(|s| {
                    s.spec
                        .as_ref()
                        .and_then(|sp| sp.selector.as_ref())
                        .is_some_and(|sel| {
                            crate::util::selector_matches(sel, pod.metadata.labels.as_ref())
                        })
                })
                .map(|s| ObjectRef::from_obj(&*s))
                .collect::<Vec<_>>()
        })
        .watches_stream(slices, |s: EndpointSlice| {
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
        },
        state: Mutex::new(store::State::default()),
        tracker: Mutex::new(SliceTracker::default()),
        failures: Mutex::new(HashMap::new()),
    });
    ctrl.run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile");
            }
        })
        .await;
    Ok(())
}

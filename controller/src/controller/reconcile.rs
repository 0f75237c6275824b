//! One reconcile: a snapshot of the stores for a Service name, the pure
//! reconcilers, events published, the plan applied.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::instrument;

use super::{apply_plan, Context};
use crate::events::Regarding;
use crate::store;
use crate::topology::TopologyInfo;
use crate::{Error, Result};

/// Reconciles one Service name: slices, Endpoints and mirrored slices.
/// Its span is at debug level: at the default info level it is not made, so a sync
/// does not pay for formatting and entering it at every poll.
#[instrument(level = "debug", skip(svc, ctx), fields(service = %format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())))]
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
    // The sync's own work, up to the first `.await`.
    let cpu = ctx.metrics.sync_cpu();
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
        let cached = snap
            .endpoints
            .get(&(ns.clone(), name.clone()))
            .map(|e| &**e);
        if tracker.endpoints_stale(&ns, &name, cached) {
            ctx.metrics.sync("stale");
            return Err(Error::StaleCache(format!("{ns}/{name} (Endpoints)")));
        }
    }
    // Zone capacity only matters to `topology-mode: Auto`.
    let topology = if crate::topology::hints_enabled(&svc) {
        ctx.stores.topology()
    } else {
        Arc::new(TopologyInfo::default())
    };
    let outcome = {
        let mut state = ctx.state.lock().expect("state");
        store::sync_service(
            &snap,
            &(ns.clone(), name.clone()),
            &ctx.options,
            &mut state,
            Some(&*topology),
        )
    };
    ctx.metrics.record_pass(&outcome, &[]);
    drop(cpu);
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
pub(super) async fn publish(ctx: &Context, regarding: &ObjectReference, reason: &str, note: &str) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Sync".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, regarding).await {
        tracing::warn!(
            error = %e,
            %reason,
            object = %format!("{}/{}", regarding.namespace.as_deref().unwrap_or_default(), regarding.name.as_deref().unwrap_or_default()),
            "publishing an event failed; it is dropped"
        );
    }
}

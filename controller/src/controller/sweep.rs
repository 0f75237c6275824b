//! Deleting what deleted Services leave (their Endpoints and mirrored slices): the
//! runtime Controller never reconciles a name whose Service is gone.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;

use super::{apply_plan, Context, SliceTracker, Stores};
use crate::store::{self, Key};
use crate::Error;

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

pub(super) fn key_of_meta(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
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
pub(super) async fn sweeper(
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

//! One reconcile pass over a [`Snapshot`]: a Service (what one sync does) or every
//! Service through the EndpointSlice, Endpoints and mirroring reconcilers, and the
//! garbage local mode collects itself.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::events::{Regarding, Warning};
use crate::plan::{Object, Plan};
use crate::topology::TopologyInfo;
use crate::util::{self, TriggerTimeTracker};
use crate::{endpoints, mirroring, reconciler};

use super::snapshot::{Key, PodIndex, Snapshot};

/// Which controllers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controllers {
    /// The EndpointSlice controller.
    pub endpointslice: bool,
    /// The legacy Endpoints controller.
    pub endpoints: bool,
    /// EndpointSlice mirroring.
    pub mirroring: bool,
}

impl Default for Controllers {
    fn default() -> Self {
        Controllers {
            endpointslice: true,
            endpoints: true,
            mirroring: true,
        }
    }
}

/// Options of a full pass.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// EndpointSlice reconciler options.
    pub slices: reconciler::Options,
    /// Mirroring options.
    pub mirroring: mirroring::Options,
    /// Which controllers run.
    pub controllers: Controllers,
    /// Delete what the API server's garbage collector would (slices whose owner is
    /// gone); for local mode, where there is no garbage collector.
    pub garbage_collect: bool,
    /// Most addresses of an Endpoints object when not upstream's
    /// [`endpoints::MAX_CAPACITY`]: only benchmarks set it.
    pub endpoints_max_capacity: Option<usize>,
}

/// State kept between passes (trigger times).
#[derive(Debug, Clone, Default)]
pub struct State {
    /// One tracker for both controllers: a sync computes the trigger time once and
    /// both use it (two trackers fed the same Pods would hold the same state).
    trigger: TriggerTimeTracker,
}

/// What a pass did for one Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceReport {
    /// Endpoints desired over all slices.
    pub endpoints_desired: usize,
    /// Slices after the plan is applied.
    pub slices: usize,
}

/// A pass's result: the plan, plus what must be retried or reported.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The plan.
    pub plan: Plan,
    /// Services to retry, with the reason.
    pub retry: Vec<(Key, String)>,
    /// Warnings to report, with the object they are about (`kind`, key).
    pub events: Vec<(Regarding, Key, Warning)>,
    /// Per-Service figures, for metrics.
    pub services: BTreeMap<Key, ServiceReport>,
}

/// Reconciles one Service name: its slices, its Endpoints and its mirrored slices.
pub fn sync_service(
    snap: &Snapshot,
    key: &Key,
    opts: &Options,
    state: &mut State,
    topology: Option<&TopologyInfo>,
) -> Outcome {
    sync_service_with(snap, None, key, opts, state, topology)
}

fn sync_service_with(
    snap: &Snapshot,
    index: Option<&PodIndex<'_>>,
    key: &Key,
    opts: &Options,
    state: &mut State,
    topology: Option<&TopologyInfo>,
) -> Outcome {
    let mut out = Outcome::default();
    let (ns, name) = key;
    let svc = snap.services.get(key).map(|s| &**s);
    let selector_service = svc.filter(|s| {
        let spec = s.spec.as_ref();
        spec.and_then(|s| s.type_.as_deref()) != Some("ExternalName")
            && spec.and_then(|s| s.selector.as_ref()).is_some()
    });

    // Both controllers read the same Pods and the same trigger time.
    let either = opts.controllers.endpointslice || opts.controllers.endpoints;
    let (pods, trigger) = match selector_service {
        Some(svc) if either => {
            let pods = match index {
                Some(index) => index.pods_for(svc),
                None => snap.pods_for(svc),
            };
            let trigger = state.trigger.compute(svc, &pods);
            (pods, trigger)
        }
        _ => {
            if either && svc.is_none() {
                state.trigger.delete(ns, name);
            }
            (Vec::new(), None)
        }
    };

    if let Some(svc) = selector_service.filter(|_| opts.controllers.endpointslice) {
        let existing = snap.slices_for(ns, name, &opts.slices.controller_name);
        let input = reconciler::Input {
            service: svc,
            pods: &pods,
            nodes: &snap.nodes,
            existing: &existing,
            trigger_time: trigger.as_ref(),
            topology,
        };
        let p = reconciler::reconcile(&input, &opts.slices);
        out.services.insert(
            key.clone(),
            ServiceReport {
                endpoints_desired: p.endpoints_desired,
                slices: p.slices_after,
            },
        );
        for r in p.retry {
            out.retry.push((key.clone(), r));
        }
        for e in p.events {
            out.events.push((Regarding::Service, key.clone(), e));
        }
        out.plan.extend_slices(p.create, p.update, p.delete);
    }

    if opts.controllers.endpoints {
        if let Some(svc) = selector_service {
            let input = endpoints::Input {
                service: svc,
                pods: &pods,
                current: snap.endpoints.get(key).map(|e| &**e),
                trigger_time: trigger.as_ref(),
                max_capacity: opts
                    .endpoints_max_capacity
                    .unwrap_or(endpoints::MAX_CAPACITY),
            };
            match endpoints::reconcile(&input) {
                Some(endpoints::Change::Create(e)) => out.plan.create.push(Object::Endpoints(e)),
                Some(endpoints::Change::Update(e)) => out.plan.update.push(Object::Endpoints(e)),
                None => {}
            }
        }
    }

    if opts.controllers.mirroring {
        let existing: Vec<EndpointSlice> = snap
            .slices_for(ns, name, &opts.mirroring.controller_name)
            .into_iter()
            .cloned()
            .collect();
        let eps = snap.endpoints.get(key).map(|e| &**e);
        if eps.is_some() || !existing.is_empty() {
            let m = mirroring::reconcile(svc, eps, &existing, &opts.mirroring);
            for w in m.warnings {
                out.events.push((Regarding::Endpoints, key.clone(), w));
            }
            out.plan.extend_slices(m.create, m.update, m.delete);
        }
    }
    out
}

/// What upstream does when one Service (or its Pods, Endpoints or slices) changes:
/// [`sync_service`] for that name, plus the delete path of the Endpoints controller
/// (the Endpoints of a Service that is gone) and, with `garbage_collect`, the slices
/// labelled for that name whose owner is gone. Reads only that name's objects,
/// the Pods its selector matches and the Nodes, so it costs what one Service costs
/// whatever the size of the snapshot.
pub fn plan_service(snap: &Snapshot, key: &Key, opts: &Options, state: &mut State) -> Outcome {
    let topology = TopologyInfo::from_nodes(snap.nodes.values().map(|n| &**n));
    let mut out = sync_service(snap, key, opts, state, Some(&topology));
    if opts.controllers.endpoints {
        for e in endpoints::leftovers(snap.endpoints.get(key).map(|e| &**e), |_, _| {
            snap.services.contains_key(key)
        }) {
            out.plan.delete.push(Object::Endpoints(e.clone()));
        }
    }
    if opts.garbage_collect {
        let (ns, name) = key;
        let labelled = |s: &EndpointSlice| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(util::LABEL_SERVICE_NAME))
                .is_some_and(|n| n == name)
        };
        let candidates = snap
            .slices
            .range((ns.clone(), String::new())..)
            .take_while(|((sns, _), _)| sns == ns)
            .map(|(k, s)| (k, &**s))
            .filter(|(_, s)| labelled(s));
        let garbage = garbage_among(snap, opts, &out.plan, candidates);
        out.plan.delete.extend(garbage);
    }
    out
}

/// One pass over every Service (and every name with Endpoints or slices).
pub fn plan_all(snap: &Snapshot, opts: &Options, state: &mut State) -> Outcome {
    let topology = TopologyInfo::from_nodes(snap.nodes.values().map(|n| &**n));
    let mut keys: BTreeSet<Key> = snap.services.keys().cloned().collect();
    if opts.controllers.mirroring {
        keys.extend(snap.endpoints.keys().cloned());
    }
    let index = snap.pod_index();
    let mut out = Outcome::default();
    for key in &keys {
        let o = sync_service_with(snap, Some(&index), key, opts, state, Some(&topology));
        out.plan.extend(o.plan);
        out.retry.extend(o.retry);
        out.events.extend(o.events);
        out.services.extend(o.services);
    }
    if opts.controllers.endpoints {
        for e in endpoints::leftovers(snap.endpoints.values().map(|e| &**e), |ns, name| {
            snap.services
                .contains_key(&(ns.to_string(), name.to_string()))
        }) {
            out.plan.delete.push(Object::Endpoints(e.clone()));
        }
    }
    if opts.garbage_collect {
        out.plan.delete.extend(garbage(snap, opts, &out.plan));
    }
    out
}

/// Slices managed by these controllers whose controlling owner no longer exists.
fn garbage(snap: &Snapshot, opts: &Options, plan: &Plan) -> Vec<Object> {
    garbage_among(snap, opts, plan, snap.slices.iter().map(|(k, s)| (k, &**s)))
}

/// [`garbage`] among some of the snapshot's slices.
fn garbage_among<'a>(
    snap: &Snapshot,
    opts: &Options,
    plan: &Plan,
    slices: impl Iterator<Item = (&'a Key, &'a EndpointSlice)>,
) -> Vec<Object> {
    let deleted: BTreeSet<Key> = plan.delete.iter().map(Object::key).collect();
    let uids: BTreeSet<(&str, &str)> = snap
        .services
        .values()
        .filter_map(|s| s.metadata.uid.as_deref().map(|u| ("Service", u)))
        .chain(
            snap.endpoints
                .values()
                .filter_map(|e| e.metadata.uid.as_deref().map(|u| ("Endpoints", u))),
        )
        .collect();
    slices
        .filter(|(k, _)| !deleted.contains(*k))
        .filter(|(_, s)| {
            let managed = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(util::LABEL_MANAGED_BY));
            managed == Some(&opts.slices.controller_name)
                || managed == Some(&opts.mirroring.controller_name)
        })
        .filter(|(_, s)| {
            s.metadata
                .owner_references
                .iter()
                .flatten()
                .filter(|o| o.controller == Some(true))
                .any(|o| !uids.contains(&(o.kind.as_str(), o.uid.as_str())))
        })
        .map(|(_, s)| Object::EndpointSlice(s.clone()))
        .collect()
}

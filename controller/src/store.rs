//! A snapshot of the objects the controllers read, and one reconcile pass over it:
//! every Service through the EndpointSlice, Endpoints and mirroring reconcilers.
//! Both edges (a manifest directory, kube-rs reflector stores) fill a [`Snapshot`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::plan::{Object, Plan};
use crate::topology::TopologyInfo;
use crate::util::{self, TriggerTimeTracker};
use crate::{endpoints, mirroring, reconciler};

/// `(namespace, name)`.
pub type Key = (String, String);

fn key_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    (
        m.namespace.clone().unwrap_or_else(|| "default".into()),
        m.name.clone().unwrap_or_default(),
    )
}

/// The objects of a cluster the controllers read.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Services by key.
    pub services: BTreeMap<Key, Service>,
    /// Pods by key.
    pub pods: BTreeMap<Key, Pod>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Node>,
    /// EndpointSlices by key.
    pub slices: BTreeMap<Key, EndpointSlice>,
    /// Endpoints by key.
    pub endpoints: BTreeMap<Key, Endpoints>,
}

impl Snapshot {
    /// Adds a Service.
    pub fn add_service(&mut self, s: Service) {
        self.services.insert(key_of(&s.metadata), s);
    }
    /// Adds a Pod.
    pub fn add_pod(&mut self, p: Pod) {
        self.pods.insert(key_of(&p.metadata), p);
    }
    /// Adds a Node.
    pub fn add_node(&mut self, n: Node) {
        self.nodes
            .insert(n.metadata.name.clone().unwrap_or_default(), n);
    }
    /// Adds an EndpointSlice.
    pub fn add_slice(&mut self, s: EndpointSlice) {
        self.slices.insert(key_of(&s.metadata), s);
    }
    /// Adds an Endpoints.
    pub fn add_endpoints(&mut self, e: Endpoints) {
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
            .map(|(_, p)| p)
            .collect()
    }

    /// Slices labelled for a Service name and a managed-by value, not being deleted.
    pub fn slices_for(&self, ns: &str, name: &str, managed_by: &str) -> Vec<EndpointSlice> {
        self.slices
            .range((ns.to_string(), String::new())..)
            .take_while(|((sns, _), _)| sns == ns)
            .map(|(_, s)| s)
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
            .cloned()
            .collect()
    }
}

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
}

/// State kept between passes (trigger times).
#[derive(Debug, Clone, Default)]
pub struct State {
    slice_trigger: TriggerTimeTracker,
    endpoints_trigger: TriggerTimeTracker,
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
    pub events: Vec<(String, Key, String)>,
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
    let mut out = Outcome::default();
    let (ns, name) = key;
    let svc = snap.services.get(key);
    let selector_service = svc.filter(|s| {
        let spec = s.spec.as_ref();
        spec.and_then(|s| s.type_.as_deref()) != Some("ExternalName")
            && spec.and_then(|s| s.selector.as_ref()).is_some()
    });

    if opts.controllers.endpointslice {
        match selector_service {
            Some(svc) => {
                let pods = snap.pods_for(svc);
                let existing = snap.slices_for(ns, name, &opts.slices.controller_name);
                let trigger = state.slice_trigger.compute(svc, &pods);
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
                    out.events.push(("Service".into(), key.clone(), e));
                }
                out.plan
                    .create
                    .extend(p.create.into_iter().map(Object::EndpointSlice));
                out.plan
                    .update
                    .extend(p.update.into_iter().map(Object::EndpointSlice));
                out.plan
                    .delete
                    .extend(p.delete.into_iter().map(Object::EndpointSlice));
            }
            None if svc.is_none() => state.slice_trigger.delete(ns, name),
            None => {}
        }
    }

    if opts.controllers.endpoints {
        if let Some(svc) = selector_service {
            let pods = snap.pods_for(svc);
            let trigger = state.endpoints_trigger.compute(svc, &pods);
            let input = endpoints::Input {
                service: svc,
                pods: &pods,
                current: snap.endpoints.get(key),
                trigger_time: trigger.as_ref(),
            };
            match endpoints::reconcile(&input) {
                Some(endpoints::Change::Create(e)) => out.plan.create.push(Object::Endpoints(e)),
                Some(endpoints::Change::Update(e)) => out.plan.update.push(Object::Endpoints(e)),
                None => {}
            }
        } else if svc.is_none() {
            state.endpoints_trigger.delete(ns, name);
        }
    }

    if opts.controllers.mirroring {
        let existing = snap.slices_for(ns, name, &opts.mirroring.controller_name);
        let eps = snap.endpoints.get(key);
        if eps.is_some() || !existing.is_empty() {
            let m = mirroring::reconcile(svc, eps, &existing, &opts.mirroring);
            for w in m.warnings {
                out.events.push(("Endpoints".into(), key.clone(), w));
            }
            out.plan
                .create
                .extend(m.create.into_iter().map(Object::EndpointSlice));
            out.plan
                .update
                .extend(m.update.into_iter().map(Object::EndpointSlice));
            out.plan
                .delete
                .extend(m.delete.into_iter().map(Object::EndpointSlice));
        }
    }
    out
}

/// One pass over every Service (and every name with Endpoints or slices).
pub fn plan_all(snap: &Snapshot, opts: &Options, state: &mut State) -> Outcome {
    let topology = TopologyInfo::from_nodes(snap.nodes.values());
    let mut keys: BTreeSet<Key> = snap.services.keys().cloned().collect();
    if opts.controllers.mirroring {
        keys.extend(snap.endpoints.keys().cloned());
    }
    let mut out = Outcome::default();
    for key in &keys {
        let o = sync_service(snap, key, opts, state, Some(&topology));
        out.plan.extend(o.plan);
        out.retry.extend(o.retry);
        out.events.extend(o.events);
        out.services.extend(o.services);
    }
    if opts.controllers.endpoints {
        for e in endpoints::leftovers(snap.endpoints.values(), |ns, name| {
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
    snap.slices
        .iter()
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

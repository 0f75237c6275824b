//! A snapshot of the objects the controllers read, and one reconcile pass over it:
//! every Service through the EndpointSlice, Endpoints and mirroring reconcilers.
//! Both edges (a manifest directory, kube-rs reflector stores) fill a [`Snapshot`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::events::{Regarding, Warning};
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

    /// An index of the Pods by namespace and label, for many [`Snapshot::pods_for`].
    pub fn pod_index(&self) -> PodIndex<'_> {
        let mut by_label: HashMap<(&str, &str, &str), Vec<&Pod>> = HashMap::new();
        for ((ns, _), pod) in &self.pods {
            for (k, v) in pod.metadata.labels.iter().flatten() {
                by_label
                    .entry((ns.as_str(), k.as_str(), v.as_str()))
                    .or_default()
                    .push(pod);
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
    let svc = snap.services.get(key);
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
                current: snap.endpoints.get(key),
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
        let eps = snap.endpoints.get(key);
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
    let topology = TopologyInfo::from_nodes(snap.nodes.values());
    let mut out = sync_service(snap, key, opts, state, Some(&topology));
    if opts.controllers.endpoints {
        for e in endpoints::leftovers(snap.endpoints.get(key), |_, _| {
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
            .filter(|(_, s)| labelled(s));
        let garbage = garbage_among(snap, opts, &out.plan, candidates);
        out.plan.delete.extend(garbage);
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
    garbage_among(snap, opts, plan, snap.slices.iter())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;

    /// Two selector Services sharing the namespace (one with two selector labels),
    /// and Endpoints left by a Service that is gone.
    fn snapshot() -> Snapshot {
        let mut snap = Snapshot::default();
        for n in nodes().into_values() {
            snap.add_node(n);
        }
        let foo = service();
        let mut bar = service();
        bar.metadata.name = Some("bar".into());
        bar.metadata.uid = Some("bar-uid".into());
        bar.spec.as_mut().unwrap().selector = Some(BTreeMap::from([
            ("app".into(), "foo".into()),
            ("tier".into(), "web".into()),
        ]));
        snap.add_service(foo);
        snap.add_service(bar);
        for i in 0..250 {
            let mut p = pod(i);
            if i % 3 == 0 {
                p.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("tier".into(), "web".into());
            }
            snap.add_pod(p);
        }
        snap.add_endpoints(Endpoints {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("gone".into()),
                namespace: Some(NS.into()),
                ..Default::default()
            },
            subsets: None,
        });
        snap
    }

    #[test]
    fn pod_index_finds_what_the_scan_finds() {
        let snap = snapshot();
        let index = snap.pod_index();
        for svc in snap.services.values() {
            let scanned: Vec<_> = snap
                .pods_for(svc)
                .iter()
                .map(|p| &p.metadata.name)
                .collect();
            let indexed: Vec<_> = index
                .pods_for(svc)
                .iter()
                .map(|p| &p.metadata.name)
                .collect();
            assert!(!scanned.is_empty());
            assert_eq!(scanned, indexed);
        }
        // bar selects a third of foo's Pods.
        let bar = &snap.services[&(NS.to_string(), "bar".to_string())];
        assert_eq!(index.pods_for(bar).len(), 84);
    }

    /// Both controllers stamp the same last-change trigger time: the one of the Pod
    /// that changed since the previous sync (none on the first sync).
    #[test]
    fn slices_and_endpoints_share_the_trigger_time() {
        let mut snap = snapshot();
        let opts = Options::default();
        let mut state = State::default();
        let foo = (NS.to_string(), "foo".to_string());
        let trigger_of = |o: &Object| {
            o.metadata()
                .annotations
                .as_ref()
                .and_then(|a| a.get(util::ANNOTATION_TRIGGER_TIME).cloned())
        };
        let mut first = plan_service(&snap, &foo, &opts, &mut state).plan;
        assert!(first.create.iter().all(|o| trigger_of(o).is_none()));
        first.assign_names(&snap.slices.keys().cloned().collect());
        for o in first.create {
            match o {
                Object::EndpointSlice(s) => snap.add_slice(s),
                Object::Endpoints(e) => snap.add_endpoints(e),
            }
        }
        // Pod 7 turns not ready later than every other change.
        let changed = time(1_800_000_000);
        let key = (NS.to_string(), "pod7".to_string());
        let pod = snap.pods.get_mut(&key).unwrap();
        let ready = &mut pod.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
        ready.status = "False".into();
        ready.last_transition_time = Some(changed.clone());
        let second = plan_service(&snap, &foo, &opts, &mut state).plan;
        let kinds: BTreeSet<&str> = second.update.iter().map(Object::kind).collect();
        assert_eq!(kinds, BTreeSet::from(["EndpointSlice", "Endpoints"]));
        for o in &second.update {
            assert_eq!(
                trigger_of(o),
                Some(util::format_time(&changed)),
                "{}",
                o.kind()
            );
        }
    }

    #[test]
    fn per_service_plans_add_up_to_the_full_pass() {
        let snap = snapshot();
        let opts = Options::default();
        let all = plan_all(&snap, &opts, &mut State::default());
        let mut state = State::default();
        let mut summed = Plan::default();
        for key in [("default", "bar"), ("default", "foo"), ("default", "gone")] {
            let key = (key.0.to_string(), key.1.to_string());
            summed.extend(plan_service(&snap, &key, &opts, &mut state).plan);
        }
        assert_eq!(summed.create, all.plan.create);
        assert_eq!(summed.update, all.plan.update);
        assert_eq!(summed.delete, all.plan.delete);
        // The leftover Endpoints are deleted.
        assert_eq!(all.plan.delete.len(), 1);
        assert_eq!(all.plan.delete[0].key().1, "gone");
    }
}

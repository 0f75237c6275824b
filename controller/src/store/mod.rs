//! A snapshot of the objects the controllers read ([`snapshot`]), and one reconcile
//! pass over it ([`pass`]): every Service through the EndpointSlice, Endpoints and
//! mirroring reconcilers. Both edges (a manifest directory, kube-rs reflector
//! stores) fill a [`Snapshot`].

mod pass;
mod snapshot;

pub use pass::*;
pub use snapshot::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::plan::{Object, Plan};
    use crate::util;
    use k8s_openapi::api::core::v1::Endpoints;
    use std::collections::{BTreeMap, BTreeSet};

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
        let pod = std::sync::Arc::make_mut(snap.pods.get_mut(&key).unwrap());
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

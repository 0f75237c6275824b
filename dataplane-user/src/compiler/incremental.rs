//! The compiler kept running between syncs: only what changed is recompiled.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use dataplane_common::{ServiceKey, ServiceKey6};

use super::cidrs::{service_cidrs, ServiceCidrs};
use super::claims::{conflict_messages, Claim, ClaimOrder};
use super::service::{compile_service, GroupKey, ServiceOut};
use super::slices::{classify_slice, merge_slice, EndpointsKey, PortEndpoints};
use super::{
    AnyFrontend, Compiled, Frontend, Frontend6, FrontendKey, HealthCheck, Ignored,
    NoLocalEndpoints, Options, Skipped,
};
use crate::model::{Origin, ServiceCidrInfo, ServiceId, ServiceInfo, SliceId, SliceInfo};

/// The compiler kept running between syncs. Objects go in one at a time
/// ([`put_service`](Self::put_service), [`remove_slice`](Self::remove_slice), ...);
/// [`compile`](Self::compile) then recompiles only the Services whose Service object
/// or EndpointSlices changed, and says which frontends changed. What it holds is
/// always what [`compile`](crate::compiler::compile) gives for the same objects.
#[derive(Debug, Default)]
pub struct Incremental {
    opts: Options,
    services: BTreeMap<ServiceId, ServiceInfo>,
    slices: BTreeMap<SliceId, SliceEntry>,
    /// The used slices of each Service, in merge order.
    slices_of: HashMap<EndpointsKey, Vec<SliceId>>,
    endpoints: HashMap<EndpointsKey, PortEndpoints>,
    groups: HashMap<GroupKey, ServiceOut>,
    /// Who asks for each frontend, first (the owner) first: (group, claim index).
    claims: HashMap<FrontendKey, Vec<(ClaimOrder, GroupKey, u32)>>,
    frontends: BTreeMap<ServiceKey, Frontend>,
    frontends6: BTreeMap<ServiceKey6, Frontend6>,
    /// Slices and groups that have something skipped; frontends asked for twice.
    slices_skipping: BTreeSet<SliceId>,
    groups_skipping: BTreeSet<GroupKey>,
    conflicts: BTreeSet<FrontendKey>,
    ignored: Ignored,
    /// Service ports whose `Local` policy finds no endpoint here, summed.
    no_local: NoLocalEndpoints,
    /// Health checks by Service, the first of a group's.
    health_checks: BTreeMap<(String, String), HealthCheck>,
    dirty_endpoints: BTreeSet<EndpointsKey>,
    dirty_groups: BTreeSet<GroupKey>,
    /// Trigger times of the slices put since the last `take_trigger_times`.
    trigger_times: Vec<((String, String), String, &'static str)>,
    /// Service and EndpointSlice changes put since the last `take_changes`.
    changes: Changes,
    /// The ServiceCIDR objects as last set, their prefixes and what was skipped of
    /// them.
    service_cidr_objects: Vec<ServiceCidrInfo>,
    service_cidrs: ServiceCidrs,
    service_cidrs_skipped: Vec<Skipped>,
    /// This node's pod CIDRs as its Node object says (`set_pod_cidrs`).
    pod_cidrs: crate::model::PodCidrs,
}

/// Changes put into the compiler, counted as kube-proxy counts them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Changes {
    /// Services added, changed or removed.
    pub services: u64,
    /// EndpointSlices added, changed or removed.
    pub endpoints: u64,
}

/// A slice and what it gives on its own.
#[derive(Debug)]
struct SliceEntry {
    info: SliceInfo,
    /// The Service it belongs to, if it is used.
    used_for: Option<EndpointsKey>,
    skipped: Vec<Skipped>,
    ignored: Ignored,
}

impl Incremental {
    pub fn new(opts: Options) -> Self {
        Self {
            opts,
            ..Default::default()
        }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// This node's primary address as its Node object says, if known.
    pub fn node_ip(&self) -> Option<std::net::Ipv4Addr> {
        self.opts.node_ip
    }

    /// Sets this node's zone (from its Node object). Topology hints of every Service
    /// are read against it, so a new zone recompiles them all. Whether it changed.
    pub fn set_zone(&mut self, zone: Option<String>) -> bool {
        if self.opts.zone == zone {
            return false;
        }
        self.opts.zone = zone;
        self.recompile_all();
        true
    }

    /// Sets the cluster's ServiceCIDR objects, all of them (few, and read whole as
    /// kube-proxy reads them). Whether they changed. They touch no frontend: the
    /// agent writes their prefixes apart ([`service_cidrs`](Self::service_cidrs)).
    pub fn set_service_cidrs(&mut self, mut objects: Vec<ServiceCidrInfo>) -> bool {
        objects.sort();
        if self.service_cidr_objects == objects {
            return false;
        }
        (self.service_cidrs, self.service_cidrs_skipped) = service_cidrs(&objects);
        self.service_cidr_objects = objects;
        true
    }

    /// The prefixes of the ServiceCIDRs as last set.
    pub fn service_cidrs(&self) -> &ServiceCidrs {
        &self.service_cidrs
    }

    /// Marks every Service to be compiled again (an option they all read changed).
    fn recompile_all(&mut self) {
        for id in self.services.keys() {
            self.dirty_groups
                .insert((id.namespace.clone(), id.name.clone()));
        }
    }

    /// Sets this node's primary address (from its Node object), where NodePorts are
    /// served in `primary` mode. Whether the NodePort addresses changed.
    pub fn set_node_ip(&mut self, ip: Option<std::net::Ipv4Addr>) -> bool {
        if self.opts.node_ip != ip {
            self.opts.node_ip = ip;
            // Source ranges that contain it allow the load-balancer IPs as sources.
            self.recompile_all();
        }
        match self.opts.node_port_addresses {
            super::NodePortAddresses::Primary => self.set_node_port_ips(ip.into_iter().collect()),
            super::NodePortAddresses::Cidrs(..) => false,
        }
    }

    /// Sets this node's pod CIDRs (its Node object's `spec.podCIDRs`). No frontend
    /// reads them: the agent writes them as the local-traffic CIDRs of
    /// `--detect-local-mode NodeCIDR` ([`pod_cidrs`](Self::pod_cidrs)). Whether they
    /// changed.
    pub fn set_pod_cidrs(&mut self, cidrs: crate::model::PodCidrs) -> bool {
        if self.pod_cidrs == cidrs {
            return false;
        }
        self.pod_cidrs = cidrs;
        true
    }

    /// This node's pod CIDRs as last set.
    pub fn pod_cidrs(&self) -> &crate::model::PodCidrs {
        &self.pod_cidrs
    }

    /// This node's primary IPv6 address as its Node object says, if known.
    pub fn node_ip6(&self) -> Option<std::net::Ipv6Addr> {
        self.opts.node_ip6
    }

    /// Sets this node's primary IPv6 address (from its Node object), as
    /// [`set_node_ip`](Self::set_node_ip) for IPv4. Whether the IPv6 NodePort
    /// addresses changed.
    pub fn set_node_ip6(&mut self, ip: Option<std::net::Ipv6Addr>) -> bool {
        if self.opts.node_ip6 != ip {
            self.opts.node_ip6 = ip;
            self.recompile_all();
        }
        match self.opts.node_port_addresses {
            super::NodePortAddresses::Primary => self.set_node_port_ips6(ip.into_iter().collect()),
            super::NodePortAddresses::Cidrs(..) => false,
        }
    }

    /// Sets the IPv6 addresses of the node's interfaces, as
    /// [`set_interface_addrs`](Self::set_interface_addrs) for IPv4.
    pub fn set_interface_addrs6(&mut self, addrs: &[std::net::Ipv6Addr]) -> bool {
        match &self.opts.node_port_addresses {
            super::NodePortAddresses::Primary => false,
            cidrs => {
                let ips = cidrs.matching6(addrs);
                self.set_node_port_ips6(ips)
            }
        }
    }

    fn set_node_port_ips6(&mut self, ips: Vec<std::net::Ipv6Addr>) -> bool {
        if self.opts.node_port_ips6 == ips {
            return false;
        }
        self.opts.node_port_ips6 = ips;
        self.recompile_all();
        true
    }

    /// Sets the addresses of the node's interfaces, where NodePorts are served in
    /// CIDR mode (those within the CIDRs). Whether the NodePort addresses changed.
    pub fn set_interface_addrs(&mut self, addrs: &[std::net::Ipv4Addr]) -> bool {
        match &self.opts.node_port_addresses {
            super::NodePortAddresses::Primary => false,
            cidrs => {
                let ips = cidrs.matching(addrs);
                self.set_node_port_ips(ips)
            }
        }
    }

    /// Sets the addresses NodePorts are served on. Every Service with a NodePort
    /// gets frontends on them, so a change recompiles every Service. Whether it
    /// changed.
    fn set_node_port_ips(&mut self, ips: Vec<std::net::Ipv4Addr>) -> bool {
        if self.opts.node_port_ips == ips {
            return false;
        }
        self.opts.node_port_ips = ips;
        self.recompile_all();
        true
    }

    /// Adds or replaces a Service. Whether anything changed.
    pub fn put_service(&mut self, origin: Origin, svc: ServiceInfo) -> bool {
        let id = ServiceId::of(&svc, origin);
        if self.services.get(&id) == Some(&svc) {
            return false;
        }
        self.dirty_groups
            .insert((id.namespace.clone(), id.name.clone()));
        self.services.insert(id, svc);
        self.changes.services += 1;
        true
    }

    /// Removes a Service. Whether it was there.
    pub fn remove_service(&mut self, id: &ServiceId) -> bool {
        if self.services.remove(id).is_none() {
            return false;
        }
        self.changes.services += 1;
        self.dirty_groups
            .insert((id.namespace.clone(), id.name.clone()));
        true
    }

    /// Adds or replaces an EndpointSlice. Whether anything changed.
    pub fn put_slice(&mut self, origin: Origin, slice: SliceInfo) -> bool {
        let id = SliceId::of(&slice, origin);
        if self.slices.get(&id).is_some_and(|e| e.info == slice) {
            return false;
        }
        self.drop_slice(&id);
        self.changes.endpoints += 1;
        if let Some(t) = &slice.trigger_time {
            let family = if slice.address_type == "IPv6" {
                "IPv6"
            } else {
                "IPv4"
            };
            self.trigger_times.push((
                (
                    id.namespace.clone().unwrap_or_default(),
                    id.name.clone().unwrap_or_default(),
                ),
                t.clone(),
                family,
            ));
        }
        let mut entry = SliceEntry {
            info: slice,
            used_for: None,
            skipped: Vec::new(),
            ignored: Ignored::default(),
        };
        entry.used_for = classify_slice(
            &entry.info,
            &self.opts,
            &mut entry.ignored,
            &mut entry.skipped,
        );
        if let Some(key) = &entry.used_for {
            // Run once on its own for the messages; merged with its siblings later.
            merge_slice(
                &entry.info,
                &self.opts,
                &mut PortEndpoints::default(),
                &mut entry.skipped,
            );
            // Most Services have one slice: room for it alone.
            let ids = self
                .slices_of
                .entry(key.clone())
                .or_insert_with(|| Vec::with_capacity(1));
            let at = ids.partition_point(|i| *i < id);
            ids.insert(at, id.clone());
            self.dirty_endpoints.insert(key.clone());
        }
        self.ignored.add(&entry.ignored);
        if !entry.skipped.is_empty() {
            self.slices_skipping.insert(id.clone());
        }
        self.slices.insert(id.clone(), entry);
        self.dirty_definitions(&id);
        true
    }

    /// Removes an EndpointSlice. Whether it was there.
    pub fn remove_slice(&mut self, id: &SliceId) -> bool {
        let removed = self.drop_slice(id);
        if removed {
            self.changes.endpoints += 1;
        }
        removed
    }

    fn drop_slice(&mut self, id: &SliceId) -> bool {
        let Some(entry) = self.slices.remove(id) else {
            return false;
        };
        self.ignored.sub(&entry.ignored);
        self.slices_skipping.remove(id);
        if let Some(key) = entry.used_for {
            if let Some(ids) = self.slices_of.get_mut(&key) {
                ids.retain(|i| i != id);
                if ids.is_empty() {
                    self.slices_of.remove(&key);
                }
            }
            self.dirty_endpoints.insert(key);
        }
        self.dirty_definitions(id);
        true
    }

    /// The other definitions of the slice `id` names (same namespace and name, other
    /// origins: a manifest directory may define a slice twice), in origin order.
    fn definitions<'a>(
        &'a self,
        id: &'a SliceId,
    ) -> impl Iterator<Item = (&'a SliceId, &'a SliceEntry)> + 'a {
        let first = SliceId {
            namespace: id.namespace.clone(),
            name: id.name.clone(),
            origin: Origin::default(),
        };
        self.slices
            .range(first..)
            .take_while(move |(i, _)| i.namespace == id.namespace && i.name == id.name)
    }

    /// Whether a later definition of the same slice shadows `id`: only the last one
    /// is used, as `kubectl apply -f` of a directory leaves it.
    fn shadowed(&self, id: &SliceId) -> bool {
        self.definitions(id)
            .last()
            .is_some_and(|(last, _)| last != id)
    }

    /// The Services of every definition of the slice `id` names: which one is used
    /// may have changed.
    fn dirty_definitions(&mut self, id: &SliceId) {
        let keys: Vec<EndpointsKey> = self
            .definitions(id)
            .filter_map(|(_, e)| e.used_for.clone())
            .collect();
        self.dirty_endpoints.extend(keys);
    }

    /// The `last-change-trigger-time` of each slice added or changed since the last
    /// call, by namespace and name (empty when unset): the agent's programming latency.
    /// Each comes with the slice's IP family as kube-proxy names it (`IPv4`, `IPv6`).
    pub fn take_trigger_times(&mut self) -> Vec<((String, String), String, &'static str)> {
        std::mem::take(&mut self.trigger_times)
    }

    /// The Service and EndpointSlice changes (added, changed or removed) since the
    /// last call: kube-proxy's `sync_proxy_rules_{service,endpoint}_changes_*`.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// The Services held, by identity.
    pub fn service_ids(&self) -> impl Iterator<Item = &ServiceId> {
        self.services.keys()
    }

    /// The EndpointSlices held, by identity.
    pub fn slice_ids(&self) -> impl Iterator<Item = &SliceId> {
        self.slices.keys()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn slice_count(&self) -> usize {
        self.slices.len()
    }

    /// Recompiles what changed since the last call. Returns the frontends (of both
    /// families) that were added, changed or removed.
    pub fn compile(&mut self) -> BTreeSet<FrontendKey> {
        for key in std::mem::take(&mut self.dirty_endpoints) {
            let merged = self.slices_of.get(&key).map(|ids| {
                let mut merged = PortEndpoints::default();
                let mut messages = Vec::new(); // kept per slice already
                for id in ids.iter().filter(|id| !self.shadowed(id)) {
                    merge_slice(
                        &self.slices[id].info,
                        &self.opts,
                        &mut merged,
                        &mut messages,
                    );
                }
                merged
            });
            let old = match merged {
                Some(m) => self.endpoints.insert(key.clone(), m),
                None => self.endpoints.remove(&key),
            };
            if old.as_ref() == self.endpoints.get(&key) {
                continue;
            }
            // A Service without a namespace compiles with those of `default` but is
            // ordered with those of the empty namespace.
            if key.0 == "default" {
                self.dirty_groups.insert((String::new(), key.1.clone()));
            }
            self.dirty_groups.insert(key);
        }

        let mut touched = BTreeSet::new();
        for group in std::mem::take(&mut self.dirty_groups) {
            if let Some(old) = self.groups.remove(&group) {
                self.ignored.sub(&old.ignored);
                self.no_local.sub(&old.no_local);
                for (key, _) in &old.health_checks {
                    self.health_checks.remove(key);
                }
                self.groups_skipping.remove(&group);
                for (i, claim) in old.claims.iter().enumerate() {
                    if let Some(who) = self.claims.get_mut(&claim.key) {
                        who.retain(|(_, g, j)| !(*g == group && *j == i as u32));
                        if who.is_empty() {
                            self.claims.remove(&claim.key);
                        }
                    }
                    touched.insert(claim.key);
                }
            }
            let mut out = ServiceOut::default();
            let from = ServiceId {
                namespace: group.0.clone(),
                name: group.1.clone(),
                origin: Origin::default(),
            };
            // A Service defined more than once (a manifest directory may): its last
            // definition, as `kubectl apply -f` of the directory leaves it.
            let last = self
                .services
                .range(from..)
                .take_while(|(id, _)| id.namespace == group.0 && id.name == group.1)
                .last();
            if let Some((_, svc)) = last {
                compile_service(svc, &self.endpoints, &self.opts, &mut out);
            }
            if out.is_empty() {
                continue;
            }
            // Kept until the Service changes: pushed one by one, the claims' vector
            // held room for twice as many (about 8 MB at 10,000 Services).
            out.shrink_to_fit();
            self.ignored.add(&out.ignored);
            self.no_local.add(&out.no_local);
            for (key, hc) in &out.health_checks {
                self.health_checks.entry(key.clone()).or_insert(*hc);
            }
            if !out.skipped.is_empty() {
                self.groups_skipping.insert(group.clone());
            }
            for (i, claim) in out.claims.iter().enumerate() {
                // Most frontends have one claim: room for it alone (a vector's
                // first push makes room for four).
                let who = self
                    .claims
                    .entry(claim.key)
                    .or_insert_with(|| Vec::with_capacity(1));
                let at = (claim.order.clone(), group.clone(), i as u32);
                let pos = who.partition_point(|c| *c < at);
                who.insert(pos, at);
                touched.insert(claim.key);
            }
            self.groups.insert(group, out);
        }

        let mut changed = BTreeSet::new();
        for key in touched {
            let who = self.claims.get(&key);
            if who.is_some_and(|w| w.len() > 1) {
                self.conflicts.insert(key);
            } else {
                self.conflicts.remove(&key);
            }
            let owner = who
                .and_then(|w| w.first())
                .map(|(_, g, i)| &self.groups[g].claims[*i as usize].frontend);
            let same = match (key, owner) {
                (FrontendKey::V4(k), Some(AnyFrontend::V4(f))) => self.frontends.get(&k) == Some(f),
                (FrontendKey::V6(k), Some(AnyFrontend::V6(f))) => {
                    self.frontends6.get(&k) == Some(f)
                }
                (FrontendKey::V4(k), None) => !self.frontends.contains_key(&k),
                (FrontendKey::V6(k), None) => !self.frontends6.contains_key(&k),
                // A claim's frontend is of its key's family.
                _ => true,
            };
            if same {
                continue;
            }
            match (key, owner) {
                (FrontendKey::V4(k), Some(AnyFrontend::V4(f))) => {
                    self.frontends.insert(k, f.clone());
                }
                (FrontendKey::V6(k), Some(AnyFrontend::V6(f))) => {
                    self.frontends6.insert(k, f.clone());
                }
                (FrontendKey::V4(k), _) => {
                    self.frontends.remove(&k);
                }
                (FrontendKey::V6(k), _) => {
                    self.frontends6.remove(&k);
                }
            }
            changed.insert(key);
        }
        changed
    }

    /// The frontends as of the last [`compile`](Self::compile).
    pub fn frontends(&self) -> &BTreeMap<ServiceKey, Frontend> {
        &self.frontends
    }

    /// The IPv6 frontends as of the last [`compile`](Self::compile).
    pub fn frontends6(&self) -> &BTreeMap<ServiceKey6, Frontend6> {
        &self.frontends6
    }

    /// Both families' frontends, as the map writer takes them.
    pub fn desired(&self) -> crate::writer::Desired<'_> {
        crate::writer::Desired {
            v4: &self.frontends,
            v6: &self.frontends6,
        }
    }

    /// What could not be used, sorted, as of the last [`compile`](Self::compile) (and
    /// of the slices put since).
    pub fn skipped(&self) -> Vec<Skipped> {
        let mut all = Vec::new();
        for id in &self.slices_skipping {
            all.extend(self.slices[id].skipped.iter().cloned());
        }
        for group in &self.groups_skipping {
            all.extend(self.groups[group].skipped.iter().cloned());
        }
        for key in &self.conflicts {
            let who: Vec<&Claim> = self.claims[key]
                .iter()
                .map(|(_, g, i)| &self.groups[g].claims[*i as usize])
                .collect();
            all.extend(conflict_messages(key, &who));
        }
        all.extend(self.service_cidrs_skipped.iter().cloned());
        all.sort();
        all
    }

    /// Health checks by Service (namespace, name), as of the last
    /// [`compile`](Self::compile).
    pub fn health_checks(&self) -> &BTreeMap<(String, String), HealthCheck> {
        &self.health_checks
    }

    /// Objects deliberately left alone, as of the last [`compile`](Self::compile).
    pub fn ignored(&self) -> &Ignored {
        &self.ignored
    }

    /// Service ports with a `Local` traffic policy and no usable endpoint on this
    /// node while others have some, as of the last [`compile`](Self::compile).
    pub fn no_local_endpoints(&self) -> &NoLocalEndpoints {
        &self.no_local
    }

    /// Everything, in the form [`compile`](crate::compiler::compile) gives.
    pub fn compiled(&self) -> Compiled {
        Compiled {
            frontends: self.frontends.clone(),
            frontends6: self.frontends6.clone(),
            skipped: self.skipped(),
            ignored: self.ignored.clone(),
            health_checks: self.health_checks.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::local::parse_file_model;

    const OBJECTS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-6
  namespace: default
  labels: {kubernetes.io/service-name: web}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2026-01-01T00:00:00Z"}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["fd00::1"]}]
"#;

    /// Each Service and EndpointSlice put, changed or removed counts once, as
    /// kube-proxy counts its changes; one put again unchanged does not count, and
    /// the trigger time comes with the slice's family.
    #[test]
    fn changes_are_counted_once_each_and_taken() {
        let (objects, problems) = parse_file_model(std::path::Path::new("a.yaml"), OBJECTS);
        assert!(problems.is_empty(), "{problems:?}");
        let objects = objects.unwrap();
        let mut c = Incremental::new(Options::default());
        let origin = Origin::default();
        for s in &objects.services {
            assert!(c.put_service(origin.clone(), s.clone()));
        }
        for s in &objects.slices {
            assert!(c.put_slice(origin.clone(), s.clone()));
        }
        assert_eq!(
            c.take_changes(),
            Changes {
                services: 1,
                endpoints: 1
            }
        );
        assert_eq!(
            c.take_trigger_times(),
            vec![(
                ("default".into(), "web-6".into()),
                "2026-01-01T00:00:00Z".into(),
                "IPv6"
            )]
        );
        assert!(!c.put_service(origin.clone(), objects.services[0].clone()));
        assert!(!c.put_slice(origin.clone(), objects.slices[0].clone()));
        assert_eq!(c.take_changes(), Changes::default());
        let mut changed = objects.slices[0].clone();
        changed.endpoints.clear();
        assert!(c.put_slice(origin.clone(), changed.clone()));
        assert!(c.remove_slice(&SliceId::of(&changed, origin.clone())));
        assert!(c.remove_service(&ServiceId::of(&objects.services[0], origin.clone())));
        assert_eq!(
            c.take_changes(),
            Changes {
                services: 1,
                endpoints: 2
            }
        );
    }

    const LOCAL_ONLY: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: local, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.20
  internalTrafficPolicy: Local
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: cluster, namespace: default}
spec:
  clusterIP: 10.96.0.21
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: local-4
  namespace: default
  labels: {kubernetes.io/service-name: local}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["10.1.0.1"], nodeName: other}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: cluster-4
  namespace: default
  labels: {kubernetes.io/service-name: cluster}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["10.1.0.2"], nodeName: other}]
"#;

    /// A port whose `Local` policies find endpoints only on other nodes counts
    /// once per policy (kube-proxy's `sync_proxy_rules_no_local_endpoints_total`),
    /// a `Cluster` one never, and the count falls back when an endpoint comes here.
    #[test]
    fn local_policies_without_local_endpoints_are_counted() {
        let (objects, problems) = parse_file_model(std::path::Path::new("a.yaml"), LOCAL_ONLY);
        assert!(problems.is_empty(), "{problems:?}");
        let objects = objects.unwrap();
        let mut c = Incremental::new(Options {
            node_name: Some("me".into()),
            ..Options::default()
        });
        let origin = Origin::default();
        for s in &objects.services {
            c.put_service(origin.clone(), s.clone());
        }
        for s in &objects.slices {
            c.put_slice(origin.clone(), s.clone());
        }
        c.compile();
        assert_eq!(
            *c.no_local_endpoints(),
            NoLocalEndpoints {
                internal: [1, 0],
                external: [1, 0]
            }
        );
        let mut here = objects.slices[0].clone();
        assert_eq!(here.name.as_deref(), Some("local-4"));
        here.endpoints[0].node_name = Some(std::sync::Arc::from("me"));
        assert!(c.put_slice(origin.clone(), here));
        c.compile();
        assert_eq!(*c.no_local_endpoints(), NoLocalEndpoints::default());
    }
}

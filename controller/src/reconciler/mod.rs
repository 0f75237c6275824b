//! The EndpointSlice reconciler: a pure function from a Service, its Pods, the Nodes
//! and the slices that exist to the slices to create, update and delete.
//!
//! Mirrors upstream's `Reconciler.Reconcile`, `reconcileByAddressType`,
//! `reconcileByPortMapping` and `finalize`:
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/endpointslice/reconciler.go>,
//! with the helpers of
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/endpointslice/utils.go>.
//! Where upstream iterates a Go map (random order) this code uses a fixed order, so a
//! plan is deterministic; the number and sizes of slices are the same.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::topology::{self, TopologyInfo};
use crate::util::{self, EndpointSet, PortMapKey};

/// The largest `--max-endpoints-per-slice` upstream accepts.
pub const MAX_ENDPOINTS_PER_SLICE_LIMIT: usize = 1000;
/// Upstream's default for `--max-endpoints-per-slice`.
pub const DEFAULT_MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// Options of the EndpointSlice reconciler.
#[derive(Debug, Clone)]
pub struct Options {
    /// Most endpoints in one slice, 1..=1000.
    pub max_endpoints_per_slice: usize,
    /// The managed-by label value written on slices.
    pub controller_name: String,
    /// Whether `service.kubernetes.io/topology-mode: Auto` hints are computed
    /// (upstream: the topology cache exists).
    pub topology_hints: bool,
    /// Whether `spec.trafficDistribution` is honoured (upstream: the
    /// ServiceTrafficDistribution gate, on by default).
    pub traffic_distribution: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_endpoints_per_slice: DEFAULT_MAX_ENDPOINTS_PER_SLICE,
            controller_name: util::CONTROLLER_NAME.into(),
            topology_hints: true,
            traffic_distribution: true,
        }
    }
}

impl Options {
    /// Checks the option ranges.
    pub fn validate(&self) -> crate::Result<()> {
        if !(1..=MAX_ENDPOINTS_PER_SLICE_LIMIT).contains(&self.max_endpoints_per_slice) {
            return Err(crate::Error::Options(format!(
                "max-endpoints-per-slice must be between 1 and {MAX_ENDPOINTS_PER_SLICE_LIMIT}, got {}",
                self.max_endpoints_per_slice
            )));
        }
        if self.controller_name.is_empty() {
            return Err(crate::Error::Options("managed-by must not be empty".into()));
        }
        Ok(())
    }
}

/// What the reconciler reads for one Service.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The Service (with a selector; callers filter).
    pub service: &'a Service,
    /// The Pods its selector matches.
    pub pods: &'a [&'a Pod],
    /// Nodes by name.
    pub nodes: &'a BTreeMap<String, std::sync::Arc<Node>>,
    /// The slices labelled for this Service and this controller, not being deleted.
    pub existing: &'a [&'a EndpointSlice],
    /// When the change that triggered this sync happened, if known.
    pub trigger_time: Option<&'a Time>,
    /// Zone capacity for `topology-mode: Auto`, from the Nodes.
    pub topology: Option<&'a TopologyInfo>,
}

/// The slices to write for one Service, in the order upstream writes them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlicePlan {
    /// Slices to create (no name yet, `generateName` set).
    pub create: Vec<EndpointSlice>,
    /// Slices to update (full desired objects).
    pub update: Vec<EndpointSlice>,
    /// Slices to delete.
    pub delete: Vec<EndpointSlice>,
    /// Pods skipped for now (unknown Node); the Service must be retried.
    pub retry: Vec<String>,
    /// Events to report (topology hints).
    pub events: Vec<crate::events::Warning>,
    /// Desired endpoints (for metrics).
    pub endpoints_desired: usize,
    /// Slices after this plan is applied (for metrics).
    pub slices_after: usize,
}

impl SlicePlan {
    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// The address types a Service's slices use (getAddressTypesForService): its
/// `ipFamilies`; else the family of its cluster IP; else (headless) both.
pub fn address_types_for_service(svc: &Service) -> BTreeSet<&'static str> {
    let spec = svc.spec.as_ref();
    let mut types = BTreeSet::new();
    for family in spec
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
    {
        match family.as_str() {
            "IPv4" => {
                types.insert(util::IPV4);
            }
            "IPv6" => {
                types.insert(util::IPV6);
            }
            _ => {}
        }
    }
    if !types.is_empty() {
        return types;
    }
    if util::service_ip_set(svc) {
        let ip = spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("");
        types.insert(if util::is_ipv6(ip) {
            util::IPV6
        } else {
            util::IPV4
        });
        return types;
    }
    types.insert(util::IPV4);
    types.insert(util::IPV6);
    types
}

/// The ports of a Pod's endpoint for a Service (getEndpointPorts): one per Service
/// port whose target resolves on this Pod.
pub fn endpoint_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let spec = svc.spec.as_ref();
    let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or(&[]);
    let mut out = Vec::with_capacity(ports.len());
    for sp in ports {
        let Some(num) = util::find_port(pod, sp) else {
            tracing::debug!(pod = ?pod.metadata.name, port = ?sp.name, "failed to find port for service");
            continue;
        };
        out.push(EndpointPort {
            name: Some(sp.name.clone().unwrap_or_default()),
            port: Some(num),
            protocol: Some(util::port_protocol(sp)),
            app_protocol: sp.app_protocol.clone(),
        });
    }
    out
}

/// A Pod as an endpoint of the given address type (podToEndpoint).
pub fn pod_to_endpoint(
    pod: &Pod,
    node: Option<&Node>,
    svc: &Service,
    address_type: &str,
) -> Endpoint {
    PodEndpoint::new(pod, node, svc, address_type).to_endpoint()
}

/// A Pod's addresses of one family, in order: held inline for the usual one (an
/// allocation per Pod and sync otherwise).
#[derive(Debug, Clone)]
enum Addresses<'a> {
    Inline(Option<&'a str>),
    Many(Vec<&'a str>),
}

impl<'a> Addresses<'a> {
    fn of(mut it: impl Iterator<Item = &'a str>) -> Self {
        let Some(first) = it.next() else {
            return Addresses::Inline(None);
        };
        match it.next() {
            None => Addresses::Inline(Some(first)),
            Some(second) => {
                let mut all = vec![first, second];
                all.extend(it);
                Addresses::Many(all)
            }
        }
    }
    fn as_slice(&self) -> &[&'a str] {
        match self {
            Addresses::Inline(a) => a.as_slice(),
            Addresses::Many(v) => v,
        }
    }
    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

/// A desired endpoint, borrowed from its Pod and Node: compared with the endpoints
/// of existing slices as it is, and turned into an [`Endpoint`] only when written.
#[derive(Debug, Clone)]
struct PodEndpoint<'a> {
    pod: &'a Pod,
    /// The Pod's namespace and name, kept at hand for the many key comparisons.
    namespace: &'a str,
    name: &'a str,
    /// Addresses of the address type, in the Pod's order.
    addresses: Addresses<'a>,
    ready: bool,
    serving: bool,
    terminating: bool,
    node_name: Option<&'a str>,
    zone: Option<&'a str>,
    hostname: Option<&'a str>,
}

impl<'a> PodEndpoint<'a> {
    fn new(pod: &'a Pod, node: Option<&'a Node>, svc: &Service, address_type: &str) -> Self {
        let serving = util::is_pod_ready(pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        // For compatibility, ready is never true for a terminating Pod unless
        // publishNotReadyAddresses is set.
        let ready = util::publish_not_ready(svc) || (serving && !terminating);
        let want_v6 = address_type == util::IPV6;
        let addresses =
            Addresses::of(util::pod_ip_strs(pod).filter(|ip| util::is_ipv6(ip) == want_v6));
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty());
        let zone = node
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(util::LABEL_ZONE))
            .map(String::as_str)
            .filter(|z| !z.is_empty());
        let hostname = if util::should_set_hostname(pod, svc) {
            pod.spec.as_ref().and_then(|s| s.hostname.as_deref())
        } else {
            None
        };
        PodEndpoint {
            pod,
            namespace: pod.metadata.namespace.as_deref().unwrap_or(""),
            name: pod.metadata.name.as_deref().unwrap_or(""),
            addresses,
            ready,
            serving,
            terminating,
            node_name,
            zone,
            hostname,
        }
    }

    fn to_endpoint(&self) -> Endpoint {
        Endpoint {
            addresses: self
                .addresses
                .as_slice()
                .iter()
                .map(|a| a.to_string())
                .collect(),
            conditions: Some(EndpointConditions {
                ready: Some(self.ready),
                serving: Some(self.serving),
                terminating: Some(self.terminating),
            }),
            target_ref: Some(util::pod_reference(self.pod)),
            node_name: self.node_name.map(str::to_string),
            zone: self.zone.map(str::to_string),
            hostname: self.hostname.map(str::to_string),
            ..Default::default()
        }
    }

    /// [`util::endpoints_equal_beyond_hash`] between this endpoint, written, and `ep`,
    /// an endpoint with the same key: their target namespaces and names are equal
    /// once missing ones count as empty, so only their presence is compared here.
    fn equal_beyond_hash(&self, ep: &Endpoint) -> bool {
        let c = ep.conditions.as_ref();
        let m = &self.pod.metadata;
        ep.node_name.as_deref() == self.node_name
            && ep.zone.as_deref() == self.zone
            && c.and_then(|c| c.ready) == Some(self.ready)
            && c.and_then(|c| c.serving) == Some(self.serving)
            && c.and_then(|c| c.terminating) == Some(self.terminating)
            && ep.target_ref.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Pod")
                    && r.namespace.is_some() == m.namespace.is_some()
                    && r.name.is_some() == m.name.is_some()
                    && r.uid == m.uid
                    && r.api_version.is_none()
                    && r.field_path.is_none()
                    && r.resource_version.is_none()
            })
    }
}

impl util::Keyed for PodEndpoint<'_> {
    fn key(&self) -> util::EndpointKeyRef<'_> {
        util::EndpointKeyRef {
            addresses: util::KeyAddresses::of(self.addresses.as_slice().iter().copied()),
            hostname: self.hostname.unwrap_or(""),
            namespace: self.namespace,
            name: self.name,
        }
    }
}

/// The slice labels for a Service (setEndpointSliceLabels): the slice's reserved
/// labels kept, the Service's labels copied (reserved keys skipped), the headless
/// label set or removed, service-name and managed-by set. Returns the labels and
/// whether they differ from the slice's.
pub fn slice_labels(
    slice: &EndpointSlice,
    svc: &Service,
    controller_name: &str,
) -> (BTreeMap<String, String>, bool) {
    let reserved = |k: &str| {
        k == util::LABEL_SERVICE_NAME || k == util::LABEL_MANAGED_BY || k == util::LABEL_HEADLESS
    };
    let mut labels = BTreeMap::new();
    for (k, v) in slice.metadata.labels.iter().flatten() {
        if reserved(k) {
            labels.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in svc.metadata.labels.iter().flatten() {
        if reserved(k) {
            tracing::info!(service = ?svc.metadata.name, label = %k, "service uses a reserved EndpointSlice label; ignored");
            continue;
        }
        labels.insert(k.clone(), v.clone());
    }
    if util::service_ip_set(svc) {
        labels.remove(util::LABEL_HEADLESS);
    } else {
        labels.insert(util::LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(
        util::LABEL_SERVICE_NAME.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(util::LABEL_MANAGED_BY.into(), controller_name.into());
    let changed = match &slice.metadata.labels {
        Some(l) => *l != labels,
        None => !labels.is_empty(),
    };
    (labels, changed)
}

/// A new, empty slice for a Service (newEndpointSlice).
pub fn new_slice(
    svc: &Service,
    ports: &[EndpointPort],
    address_type: &str,
    controller_name: &str,
) -> EndpointSlice {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    let mut slice = EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(util::slice_prefix(&name)),
            namespace: svc.metadata.namespace.clone(),
            owner_references: Some(vec![util::controller_ref("Service", &name, &uid)]),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints: Vec::new(),
        ports: Some(ports.to_vec()),
    };
    let (labels, _) = slice_labels(&slice, svc, controller_name);
    slice.metadata.labels = Some(labels);
    slice
}

fn service_uid(svc: &Service) -> &str {
    svc.metadata.uid.as_deref().unwrap_or("")
}

/// Reconciles one Service's slices (Reconciler.Reconcile).
pub fn reconcile(input: &Input<'_>, opts: &Options) -> SlicePlan {
    let supported = address_types_for_service(input.service);
    let mut unsupported = Vec::new();
    let mut by_type: BTreeMap<&str, Vec<&EndpointSlice>> = BTreeMap::new();
    for &slice in input.existing {
        match supported.get(slice.address_type.as_str()) {
            Some(t) => by_type.entry(t).or_default().push(slice),
            // A slice of an address type the Service no longer has (or the
            // deprecated `IP` type) is replaced.
            None => unsupported.push(slice.clone()),
        }
    }
    let mut plan = SlicePlan::default();
    for t in &supported {
        let existing = by_type.remove(t).unwrap_or_default();
        let part = reconcile_by_address_type(input, opts, &existing, t);
        plan.create.extend(part.create);
        plan.update.extend(part.update);
        plan.delete.extend(part.delete);
        plan.retry.extend(part.retry);
        plan.events.extend(part.events);
        plan.endpoints_desired += part.endpoints_desired;
        plan.slices_after += part.slices_after;
    }
    plan.delete.extend(unsupported);
    plan
}

fn reconcile_by_address_type(
    input: &Input<'_>,
    opts: &Options,
    existing: &[&EndpointSlice],
    address_type: &str,
) -> SlicePlan {
    let svc = input.service;
    let uid = service_uid(svc);
    let mut create = Vec::new();
    let mut update = Vec::new();
    let mut delete = Vec::new();
    let mut retry = Vec::new();

    // Existing state, grouped by ports. Slices not owned by this Service (e.g. left
    // by an older Service of the same name) are deleted.
    let mut existing_by_ports: BTreeMap<PortMapKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for &slice in existing {
        if util::owned_by(slice, "Service", uid) {
            existing_by_ports
                .entry(util::port_map_key(slice.ports.as_deref().unwrap_or(&[])))
                .or_default()
                .push(slice);
        } else {
            delete.push(slice.clone());
        }
    }

    // Desired state, grouped by the ports each Pod resolves. Pods resolve a handful
    // of distinct port lists; each is turned into ports and a key once.
    let mut desired: BTreeMap<PortMapKey, usize> = BTreeMap::new();
    let mut groups: Vec<(Vec<EndpointPort>, EndpointSet<PodEndpoint>)> = Vec::new();
    let service_ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or(&[]);
    let mut resolved: Vec<Option<i32>> = Vec::with_capacity(service_ports.len());
    let mut known: Vec<(Vec<Option<i32>>, usize)> = Vec::new();
    let publish_not_ready = util::publish_not_ready(svc);
    // Many Pods share few Nodes.
    let mut nodes_seen: util::FastMap<&str, Option<&Node>> = util::FastMap::default();
    for &pod in input.pods {
        if !util::should_pod_be_in_endpoints(pod, true) {
            continue;
        }
        resolved.clear();
        resolved.extend(service_ports.iter().map(|sp| util::find_port(pod, sp)));
        let group = match known.iter().find(|(r, _)| *r == resolved) {
            Some(&(_, g)) => g,
            None => {
                let ports = endpoint_ports(svc, pod);
                let g = *desired
                    .entry(util::port_map_key(&ports))
                    .or_insert_with(|| {
                        groups.push((ports, EndpointSet::with_capacity(input.pods.len())));
                        groups.len() - 1
                    });
                known.push((resolved.clone(), g));
                g
            }
        };
        let entry = &mut groups[group];
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("");
        let node = match nodes_seen.get(node_name) {
            Some(&n) => n,
            None => {
                let n = input.nodes.get(node_name).map(|n| &**n);
                nodes_seen.insert(node_name, n);
                n
            }
        };
        if node.is_none() && !publish_not_ready {
            // Upstream: skip the Pod but write the rest, and retry the Service.
            retry.push(format!(
                "skipping Pod {} for Service {}/{}: node {:?} not found",
                pod.metadata.name.as_deref().unwrap_or(""),
                svc.metadata.namespace.as_deref().unwrap_or(""),
                svc.metadata.name.as_deref().unwrap_or(""),
                node_name
            ));
            continue;
        }
        let ep = PodEndpoint::new(pod, node, svc, address_type);
        if !ep.addresses.is_empty() {
            entry.1.insert(ep);
        }
    }

    let mut endpoints_desired = 0;
    let mut slices_after = 0;
    let empty: Vec<&EndpointSlice> = Vec::new();
    for (key, &g) in &desired {
        let (ports, set) = &mut groups[g];
        endpoints_desired += set.len();
        let current = existing_by_ports.get(key).unwrap_or(&empty);
        let (c, u, d) =
            reconcile_by_port_mapping(svc, opts, current, std::mem::take(set), ports, address_type);
        slices_after += current.len() + c.len() - d.len();
        create.extend(c);
        update.extend(u);
        delete.extend(d);
    }
    for (key, slices) in &existing_by_ports {
        if !desired.contains_key(key) {
            delete.extend(slices.iter().map(|s| (*s).clone()));
        }
    }

    // When no slice would exist, keep (or create) an empty placeholder.
    if existing.len() == delete.len() && create.is_empty() {
        let placeholder = new_slice(svc, &[], address_type, &opts.controller_name);
        if delete.len() == 1 && placeholder_equal(&delete[0], &placeholder) {
            delete.clear();
        } else {
            create.push(placeholder);
        }
        slices_after = 1;
    }

    // Topology hints, per address type.
    let unchanged: Vec<&EndpointSlice> = {
        let touched: HashSet<&str> = update
            .iter()
            .chain(delete.iter())
            .filter_map(|s| s.metadata.name.as_deref())
            .collect();
        existing
            .iter()
            .filter(|s| !touched.contains(s.metadata.name.as_deref().unwrap_or("")))
            .copied()
            .collect()
    };
    let events = topology::reconcile_hints(
        svc,
        input.topology,
        topology::HintSources {
            topology_mode: opts.topology_hints,
            traffic_distribution: opts.traffic_distribution,
        },
        &mut create,
        &mut update,
        unchanged,
    );

    let (create, update, delete) = finalize(svc, create, update, delete, input.trigger_time);
    SlicePlan {
        create,
        update,
        delete,
        retry,
        events,
        endpoints_desired,
        slices_after,
    }
}

/// Upstream's placeholderSliceCompare: namespace and labels of the metadata, and the
/// rest of the slice (address type, no endpoints, no ports).
fn placeholder_equal(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.metadata.namespace == b.metadata.namespace
        && a.metadata.labels.clone().unwrap_or_default()
            == b.metadata.labels.clone().unwrap_or_default()
        && a.address_type == b.address_type
        && a.endpoints.is_empty()
        && b.endpoints.is_empty()
        && a.ports.as_deref().unwrap_or(&[]).is_empty()
        && b.ports.as_deref().unwrap_or(&[]).is_empty()
}

/// The fill algorithm for one set of ports (reconcileByPortMapping): keep what is
/// unchanged, fill updated slices first (fullest first), then put what is left into
/// one unchanged slice that fits exactly or best, else into new slices. Never
/// rebalances. Existing slices are copied only when they are written.
fn reconcile_by_port_mapping(
    svc: &Service,
    opts: &Options,
    existing: &[&EndpointSlice],
    mut desired: EndpointSet<PodEndpoint<'_>>,
    ports: &[EndpointPort],
    address_type: &str,
) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<EndpointSlice>) {
    let max = opts.max_endpoints_per_slice;
    // The existing slices by index, copied on first change. Ordered lists of
    // indices stand for upstream's unordered sets of names.
    let mut slices: Vec<Cow<'_, EndpointSlice>> = Vec::with_capacity(existing.len());
    let mut unchanged: Vec<usize> = Vec::new();
    let mut to_update: Vec<usize> = Vec::new();
    let mut to_delete: Vec<usize> = Vec::new();

    // 1. Drop endpoints no longer desired and refresh those that changed.
    let mut kept: Vec<PodEndpoint<'_>> = Vec::new();
    for (i, &slice) in existing.iter().enumerate() {
        kept.clear();
        let mut endpoint_updated = false;
        for ep in &slice.endpoints {
            if let Some(want) = desired.remove(ep) {
                if !want.equal_beyond_hash(ep) {
                    endpoint_updated = true;
                }
                kept.push(want);
            }
        }
        let (labels, labels_changed) = slice_labels(slice, svc, &opts.controller_name);
        if endpoint_updated || kept.len() != slice.endpoints.len() {
            if kept.is_empty() {
                to_delete.push(i);
                slices.push(Cow::Borrowed(slice));
            } else {
                let s = EndpointSlice {
                    metadata: ObjectMeta {
                        labels: Some(labels),
                        ..slice.metadata.clone()
                    },
                    address_type: slice.address_type.clone(),
                    endpoints: kept.iter().map(PodEndpoint::to_endpoint).collect(),
                    ports: slice.ports.clone(),
                };
                to_update.push(i);
                slices.push(Cow::Owned(s));
            }
        } else if labels_changed {
            let mut s = slice.clone();
            s.metadata.labels = Some(labels);
            to_update.push(i);
            slices.push(Cow::Owned(s));
        } else {
            unchanged.push(i);
            slices.push(Cow::Borrowed(slice));
        }
    }

    // 2. Fill the slices being updated anyway, fullest first.
    if !desired.is_empty() && !to_update.is_empty() {
        let mut order = to_update.clone();
        order.sort_by_key(|&i| std::cmp::Reverse(slices[i].endpoints.len()));
        for i in order {
            let slice = slices[i].to_mut();
            while slice.endpoints.len() < max {
                let Some(ep) = desired.pop_any() else { break };
                slice.endpoints.push(ep.to_endpoint());
            }
        }
    }

    // 3. What is left goes into one unchanged slice with room for all of it, else
    //    into new slices.
    let mut create = Vec::new();
    while !desired.is_empty() {
        let mut target = None;
        if desired.len() < max && !unchanged.is_empty() {
            target = slice_to_fill(&unchanged, &slices, desired.len(), max);
        }
        match target {
            Some(i) => {
                let slice = slices[i].to_mut();
                while slice.endpoints.len() < max {
                    let Some(ep) = desired.pop_any() else { break };
                    slice.endpoints.push(ep.to_endpoint());
                }
                unchanged.retain(|&u| u != i);
                if !to_update.contains(&i) {
                    to_update.push(i);
                }
            }
            None => {
                let mut slice = new_slice(svc, ports, address_type, &opts.controller_name);
                while slice.endpoints.len() < max {
                    let Some(ep) = desired.pop_any() else { break };
                    slice.endpoints.push(ep.to_endpoint());
                }
                create.push(slice);
            }
        }
    }

    let mut take =
        |i: usize| std::mem::replace(&mut slices[i], Cow::Borrowed(existing[i])).into_owned();
    let update = to_update.iter().map(|&i| take(i)).collect();
    let delete = to_delete.iter().map(|&i| take(i)).collect();
    (create, update, delete)
}

/// The unchanged slice the remaining endpoints fit in most tightly (getSliceToFill).
fn slice_to_fill(
    candidates: &[usize],
    slices: &[Cow<'_, EndpointSlice>],
    count: usize,
    max: usize,
) -> Option<usize> {
    let mut closest_diff = max;
    let mut closest = None;
    for &i in candidates {
        let len = slices[i].endpoints.len();
        if count + len > max {
            continue;
        }
        let diff = max - (count + len);
        if diff < closest_diff {
            closest_diff = diff;
            closest = Some(i);
            if diff == 0 {
                break;
            }
        }
    }
    closest
}

/// Turns creates into updates of slices that would be deleted (same address type,
/// owned by this Service), sets or clears the trigger-time annotation, and drops
/// creates when the Service is being deleted (finalize).
fn finalize(
    svc: &Service,
    mut create: Vec<EndpointSlice>,
    mut update: Vec<EndpointSlice>,
    mut delete: Vec<EndpointSlice>,
    trigger_time: Option<&Time>,
) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<EndpointSlice>) {
    let uid = service_uid(svc);
    let mut i = 0;
    while i < delete.len() && !create.is_empty() {
        let last = create.len() - 1;
        if delete[i].address_type == create[last].address_type
            && util::owned_by(&delete[i], "Service", uid)
        {
            let old = delete.remove(i);
            let mut slice = create.pop().expect("non-empty");
            slice.metadata.name = old.metadata.name;
            update.push(slice);
        } else {
            i += 1;
        }
    }
    if svc.metadata.deletion_timestamp.is_some() {
        create.clear();
    }
    for slice in create.iter_mut().chain(update.iter_mut()) {
        let annotations = slice.metadata.annotations.get_or_insert_with(BTreeMap::new);
        match trigger_time {
            Some(t) => {
                annotations.insert(util::ANNOTATION_TRIGGER_TIME.into(), util::format_time(t));
            }
            None => {
                annotations.remove(util::ANNOTATION_TRIGGER_TIME);
            }
        }
        if annotations.is_empty() {
            slice.metadata.annotations = None;
        }
    }
    (create, update, delete)
}

#[cfg(test)]
mod tests;

//! The compiler: Services, EndpointSlices and this node's identity in, the desired
//! frontends with their backends out. Pure: no kernel, no clock, no I/O.
//!
//! [`compile`] does it all at once. [`Incremental`] holds the objects between syncs
//! and recompiles only the Services whose Service object or EndpointSlices (by their
//! `kubernetes.io/service-name` label) changed, with the same result: both share the
//! per-slice and per-Service steps, and a frontend asked for by two Services goes to
//! the first in namespace and name order either way.
//!
//! Semantics follow kube-proxy where it defines them:
//! - which objects are used: kube-proxy's informer selectors skip objects labelled
//!   `service.kubernetes.io/service-proxy-name` and headless Services
//!   (<https://github.com/kubernetes/kubernetes/blob/master/cmd/kube-proxy/app/server.go>);
//! - how slices merge: `pkg/proxy/endpointslicecache.go`
//!   (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointslicecache.go>:
//!   several slices per Service, only `addresses[0]`, parsed sloppily, one copy per
//!   address where a later non-terminating copy wins, ports without a name field or
//!   without a number or with number 0 ignored, nil conditions defaulted: ready ⇒
//!   true, serving ⇒ true, terminating ⇒ false; zone and node hints kept);
//! - which endpoints serve: [`crate::categorize`] (`CategorizeEndpoints`: traffic
//!   policies, topology hints against this node's zone, the serving-terminating
//!   fallback), and what a frontend without them does (reject, or drop when only
//!   other nodes have endpoints and the policy is `Local`);
//! - session affinity: `pkg/proxy/serviceport.go` (`ClientIP` with its timeout).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    net::Ipv4Addr,
};

use dataplane_common::{Backend, ServiceKey, PROTO_SCTP, PROTO_TCP, PROTO_UDP};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use crate::categorize::{self, EmptyVerdict, EndpointFacts, NodeFacts, PortPolicy};
use crate::model::{Address, Origin, ServiceId, ServiceInfo, SliceId, SliceInfo};

/// Label that hands a Service to a specific proxy (kube-proxy skips these).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label kube-proxy uses to skip headless Services' slices.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label tying an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// What the compiler needs to know besides the objects.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// This node's name: `internalTrafficPolicy: Local` keeps endpoints on it.
    pub node_name: Option<String>,
    /// The `service-proxy-name` value that means "sliceway", if any.
    pub proxy_name: Option<String>,
    /// This node's `topology.kubernetes.io/zone` label: topology hints are read
    /// against it. `None` when the node has none (or is not known yet).
    pub zone: Option<String>,
}

/// A Service port as kube-proxy names it: `namespace/name:port`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port: String,
}

impl ServicePortName {
    /// Parses the `Display` form back (names read from the kernel's maps).
    pub fn parse(s: &str) -> Self {
        let (namespace, rest) = s.split_once('/').unwrap_or(("", s));
        let (name, port) = rest.split_once(':').unwrap_or((rest, ""));
        Self {
            namespace: namespace.into(),
            name: name.into(),
            port: port.into(),
        }
    }

    /// The name of a frontend found in the maps without one.
    pub fn unknown() -> Self {
        Self {
            namespace: String::new(),
            name: "?".into(),
            port: String::new(),
        }
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As kube-proxy prints it: no colon for an unnamed port.
        if self.port.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
        }
    }
}

/// One frontend to program: the Service port it belongs to and its backends, sorted
/// and without duplicates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    pub service: ServicePortName,
    pub backends: Vec<Backend>,
    pub policy: FrontendPolicy,
}

/// What a frontend does besides picking among its backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontendPolicy {
    /// What a new flow meets when there is no backend.
    pub on_empty: EmptyVerdict,
    /// `sessionAffinity: ClientIP`: the timeout in seconds.
    pub affinity_timeout: Option<u32>,
}

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds`
/// (`v1.DefaultClientIPServiceAffinitySeconds`, three hours).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;
/// The API's largest timeout (`v1.MaxClientIPServiceAffinitySeconds`, one day).
pub const MAX_AFFINITY_TIMEOUT: i32 = 86_400;

impl FrontendPolicy {
    /// The `SERVICES` value of a frontend with this policy.
    pub fn service_value(&self, id: u32, count: u32) -> dataplane_common::ServiceValue {
        let mut flags = 0;
        if self.on_empty == EmptyVerdict::Drop {
            flags |= dataplane_common::SVC_F_DROP_EMPTY;
        }
        if self.affinity_timeout.is_some() {
            flags |= dataplane_common::SVC_F_AFFINITY;
        }
        dataplane_common::ServiceValue {
            id,
            count,
            flags,
            affinity_timeout_s: self.affinity_timeout.unwrap_or(0),
        }
    }

    /// The policy a `SERVICES` value carries (read back from pinned maps).
    pub fn of(v: &dataplane_common::ServiceValue) -> Self {
        Self {
            on_empty: if v.flags & dataplane_common::SVC_F_DROP_EMPTY != 0 {
                EmptyVerdict::Drop
            } else {
                EmptyVerdict::Reject
            },
            affinity_timeout: (v.flags & dataplane_common::SVC_F_AFFINITY != 0)
                .then_some(v.affinity_timeout_s),
        }
    }
}

/// Which object a message is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Something the compiler could not use, and why. The rest still compiles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Skipped {
    pub object: ObjectRef,
    /// A short, stable name of the reason, for metrics.
    pub code: &'static str,
    pub reason: String,
}

/// Objects deliberately left alone (not an error): another proxy's, headless, and the
/// like. Counted so that `list` and metrics can say why a Service has no frontend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ignored {
    pub other_proxy: usize,
    pub headless: usize,
    pub external_name: usize,
    pub ipv6: usize,
}

/// The compiler's output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compiled {
    pub frontends: BTreeMap<ServiceKey, Frontend>,
    pub skipped: Vec<Skipped>,
    pub ignored: Ignored,
}

/// One endpoint of a Service port after merging its slices.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MergedEndpoint {
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
    zone_hints: Box<[std::sync::Arc<str>]>,
    node_hints: Box<[std::sync::Arc<str>]>,
}

impl EndpointFacts for MergedEndpoint {
    fn ready(&self) -> bool {
        self.ready
    }
    fn serving(&self) -> bool {
        self.serving
    }
    fn terminating(&self) -> bool {
        self.terminating
    }
    fn local(&self) -> bool {
        self.local
    }
    fn zone_hints(&self) -> &[std::sync::Arc<str>] {
        &self.zone_hints
    }
    fn node_hints(&self) -> &[std::sync::Arc<str>] {
        &self.node_hints
    }
}

/// (port name, protocol) → address → endpoint.
type PortEndpoints = HashMap<(String, u8), BTreeMap<(Ipv4Addr, u16), MergedEndpoint>>;

/// The slices of one Service: their namespace (`default` when unset) and the
/// Service's name from their label.
type EndpointsKey = (String, String);

/// Services compiled together, in order: same namespace and name (empty when unset).
type GroupKey = (String, String);

/// A frontend a Service asks for. When several ask for one, a ClusterIP (or its
/// marker) comes before an external or load-balancer IP, then the older Service (by
/// creation timestamp; without one, first), then namespace and name: the first keeps
/// it, and every one of them is reported.
#[derive(Clone, Debug)]
struct Claim {
    key: ServiceKey,
    frontend: Frontend,
    order: ClaimOrder,
}

/// (0 for a ClusterIP or its marker, 1 for an external or load-balancer IP; the
/// Service's creation timestamp).
type ClaimOrder = (u8, Option<String>);

impl Claim {
    /// The Service asking.
    fn by(&self) -> ObjectRef {
        ObjectRef {
            kind: "Service",
            namespace: self.frontend.service.namespace.clone(),
            name: self.frontend.service.name.clone(),
        }
    }
}

/// What compiling some Services gave, before frontend conflicts are settled.
#[derive(Clone, Debug, Default)]
struct ServiceOut {
    claims: Vec<Claim>,
    skipped: Vec<Skipped>,
    ignored: Ignored,
}

impl ServiceOut {
    fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.skipped.is_empty() && self.ignored == Ignored::default()
    }
}

impl Ignored {
    fn add(&mut self, o: &Ignored) {
        self.other_proxy += o.other_proxy;
        self.headless += o.headless;
        self.external_name += o.external_name;
        self.ipv6 += o.ipv6;
    }
    fn sub(&mut self, o: &Ignored) {
        self.other_proxy -= o.other_proxy;
        self.headless -= o.headless;
        self.external_name -= o.external_name;
        self.ipv6 -= o.ipv6;
    }
}

/// Compiles Services and EndpointSlices into frontends.
pub fn compile(services: &[Service], slices: &[EndpointSlice], opts: &Options) -> Compiled {
    let services: Vec<ServiceInfo> = services.iter().map(ServiceInfo::from).collect();
    let slices: Vec<SliceInfo> = slices.iter().map(SliceInfo::from).collect();
    compile_model(&services, &slices, opts)
}

/// [`compile`] over the agent's model of the objects.
pub fn compile_model(services: &[ServiceInfo], slices: &[SliceInfo], opts: &Options) -> Compiled {
    let mut out = Compiled::default();
    let mut slices: Vec<&SliceInfo> = slices.iter().collect();
    slices.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut endpoints: HashMap<EndpointsKey, PortEndpoints> = HashMap::new();
    for slice in slices {
        if let Some(key) = classify_slice(slice, opts, &mut out.ignored, &mut out.skipped) {
            merge_slice(
                slice,
                opts,
                endpoints.entry(key).or_default(),
                &mut out.skipped,
            );
        }
    }

    let mut services: Vec<&ServiceInfo> = services.iter().collect();
    services.sort_by(|a, b| group_of(a).cmp(&group_of(b)));
    let mut compiled = ServiceOut::default();
    // Every claim with its place: (order, group, index in the group).
    let mut claims: Vec<(ClaimOrder, GroupKey, u32, Claim)> = Vec::new();
    // The Services of a group are consecutive (sorted above): the index in the group
    // runs on until the group changes.
    let mut place: (GroupKey, u32) = Default::default();
    for svc in services {
        let group = (
            svc.namespace.clone().unwrap_or_default(),
            svc.name.clone().unwrap_or_default(),
        );
        if place.0 != group {
            place = (group.clone(), 0);
        }
        compile_service(svc, &endpoints, opts, &mut compiled);
        for claim in compiled.claims.drain(..) {
            claims.push((claim.order.clone(), group.clone(), place.1, claim));
            place.1 += 1;
        }
    }
    claims.sort_by(|a, b| (&a.0, &a.1, a.2).cmp(&(&b.0, &b.1, b.2)));
    let mut by_key: BTreeMap<ServiceKey, Vec<&Claim>> = BTreeMap::new();
    for (_, _, _, claim) in &claims {
        by_key.entry(claim.key).or_default().push(claim);
    }
    for (key, who) in by_key {
        out.skipped.extend(conflict_messages(&key, &who));
        out.frontends.insert(key, who[0].frontend.clone());
    }
    out.skipped.append(&mut compiled.skipped);
    out.ignored.add(&compiled.ignored);
    out.skipped.sort();
    out
}

/// The compile order of Services: namespace and name, empty when unset.
fn group_of(svc: &ServiceInfo) -> (&str, &str) {
    (
        svc.namespace.as_deref().unwrap_or_default(),
        svc.name.as_deref().unwrap_or_default(),
    )
}

fn service_ref(svc: &ServiceInfo) -> ObjectRef {
    ObjectRef {
        kind: "Service",
        namespace: svc.namespace.clone().unwrap_or_else(|| "default".into()),
        name: svc.name.clone().unwrap_or_default(),
    }
}

fn is_other_proxys(label: Option<&String>, opts: &Options) -> bool {
    match label {
        None => false,
        Some(v) => opts.proxy_name.as_deref() != Some(v.as_str()),
    }
}

/// Parses a protocol name; `None` (unset) means TCP, as the API defaults it.
fn protocol(p: Option<&str>) -> Result<u8, String> {
    match p {
        None | Some("TCP") => Ok(PROTO_TCP),
        Some("UDP") => Ok(PROTO_UDP),
        Some("SCTP") => Ok(PROTO_SCTP),
        Some(other) => Err(format!(
            "protocol {other} is not supported (TCP, UDP and SCTP are)"
        )),
    }
}

fn port_number(p: i32) -> Result<u16, String> {
    u16::try_from(p)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("port {p} is out of range 1-65535"))
}

fn slice_ref(slice: &SliceInfo) -> ObjectRef {
    ObjectRef {
        kind: "EndpointSlice",
        namespace: slice.namespace.clone().unwrap_or_else(|| "default".into()),
        name: slice.name.clone().unwrap_or_default(),
    }
}

/// Whether a slice is used, and for which Service: what is not used is counted as
/// ignored or skipped with a message.
fn classify_slice(
    slice: &SliceInfo,
    opts: &Options,
    ignored: &mut Ignored,
    skipped: &mut Vec<Skipped>,
) -> Option<EndpointsKey> {
    if is_other_proxys(slice.proxy_name.as_ref(), opts) {
        ignored.other_proxy += 1;
        return None;
    }
    if slice.headless {
        ignored.headless += 1;
        return None;
    }
    let Some(service) = &slice.service_name else {
        skipped.push(Skipped {
            object: slice_ref(slice),
            code: "no_service_label",
            reason: format!("no {LABEL_SERVICE_NAME} label: it belongs to no Service"),
        });
        return None;
    };
    match slice.address_type.as_str() {
        "IPv4" => {}
        "IPv6" => {
            ignored.ipv6 += 1;
            return None;
        }
        other => {
            skipped.push(Skipped {
                object: slice_ref(slice),
                code: "address_type",
                reason: format!("addressType {other} is not supported (IPv4 is)"),
            });
            return None;
        }
    }
    Some((
        slice.namespace.clone().unwrap_or_else(|| "default".into()),
        service.clone(),
    ))
}

/// Adds the endpoints of a used slice to its Service's, as kube-proxy's
/// endpointslicecache merges them (slices in namespace and name order).
fn merge_slice(
    slice: &SliceInfo,
    opts: &Options,
    by_port: &mut PortEndpoints,
    skipped: &mut Vec<Skipped>,
) {
    for port in &slice.ports {
        // endpointslicecache: a port without a name field, without a number or with
        // number 0 is ignored (with an error in kube-proxy's log; here a message).
        let Some(port_name) = &port.name else {
            skipped.push(Skipped {
                object: slice_ref(slice),
                code: "port_without_name",
                reason: "a port has no name field (unnamed ports have name \"\"); kube-proxy ignores it, so it is ignored".into(),
            });
            continue;
        };
        let Some(number) = port.port.filter(|n| *n != 0) else {
            skipped.push(Skipped {
                object: slice_ref(slice),
                code: "port_without_number",
                reason: format!("port {port_name:?} has no number (or 0); it is ignored as kube-proxy ignores it"),
            });
            continue;
        };
        let proto = match protocol(port.protocol.as_deref()) {
            Ok(p) => p,
            Err(reason) => {
                skipped.push(Skipped {
                    object: slice_ref(slice),
                    code: "protocol",
                    reason: format!("port {number}: {reason}"),
                });
                continue;
            }
        };
        let number = match port_number(number) {
            Ok(n) => n,
            Err(reason) => {
                skipped.push(Skipped {
                    object: slice_ref(slice),
                    code: "port_range",
                    reason,
                });
                continue;
            }
        };
        let addrs = by_port.entry((port_name.clone(), proto)).or_default();
        for ep in &slice.endpoints {
            let endpoint = MergedEndpoint {
                ready: ep.ready.unwrap_or(true),
                serving: ep.serving.unwrap_or(true),
                terminating: ep.terminating.unwrap_or(false),
                local: opts.node_name.as_deref().is_some_and(|n| !n.is_empty())
                    && ep.node_name.as_deref() == opts.node_name.as_deref(),
                zone_hints: ep.zone_hints.clone(),
                node_hints: ep.node_hints.clone(),
            };
            // A slice endpoint has one address (the API allows more, only the first
            // is used, as in kube-proxy).
            let Some(addr) = &ep.address else {
                continue;
            };
            let ip: Ipv4Addr = match addr {
                Address::V4(ip) => match crate::model::refused_address(*ip) {
                    None => *ip,
                    Some(why) => {
                        skipped.push(Skipped {
                            object: slice_ref(slice),
                            code: "refused_endpoint_address",
                            reason: format!(
                                "endpoint address {ip} {why}; that endpoint is skipped"
                            ),
                        });
                        continue;
                    }
                },
                Address::Other(addr) => {
                    skipped.push(Skipped {
                        object: slice_ref(slice),
                        code: "bad_endpoint_address",
                        reason: format!("endpoint address {addr:?} is not an IPv4 address"),
                    });
                    continue;
                }
            };
            // endpointslicecache `addEndpoints`: a copy replaces an earlier one of the
            // same address unless it is terminating.
            match addrs.entry((ip, number)) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(endpoint);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    if !endpoint.terminating {
                        o.insert(endpoint);
                    }
                }
            }
        }
    }
}

/// The messages of a frontend several Services ask for (`who` in precedence order):
/// each that does not get it, and the one that keeps it.
fn conflict_messages(key: &ServiceKey, who: &[&Claim]) -> Vec<Skipped> {
    if who.len() < 2 {
        return Vec::new();
    }
    let owner = &who[0].frontend.service;
    let mut out: Vec<Skipped> = who[1..]
        .iter()
        .map(|c| conflict(key, c.by(), owner))
        .collect();
    let others: Vec<String> = who[1..].iter().map(|c| c.by().to_string()).collect();
    out.push(Skipped {
        object: who[0].by(),
        code: "frontend_kept",
        reason: format!(
            "{} is also asked for by {}; this Service keeps it (a ClusterIP before an external IP, then the oldest Service)",
            frontend_addr(key),
            others.join(", ")
        ),
    });
    out
}

/// The message of a Service that asks for another one's frontend.
fn conflict(key: &ServiceKey, by: ObjectRef, winner: &ServicePortName) -> Skipped {
    let vip = Ipv4Addr::from(u32::from_be(key.addr_be));
    let number = u16::from_be(key.port_be);
    if is_clusterip_marker(key) {
        return Skipped {
            object: by,
            code: "clusterip_conflict",
            reason: format!(
                "ClusterIP {vip} is already the ClusterIP of {winner}; its undeclared ports are rejected as that Service's"
            ),
        };
    }
    Skipped {
        object: by,
        code: "frontend_conflict",
        reason: format!(
            "{vip}:{number}/{} is already the frontend of {winner}; this one is skipped",
            proto_name(key.proto),
        ),
    }
}

fn compile_service(
    svc: &ServiceInfo,
    endpoints: &HashMap<EndpointsKey, PortEndpoints>,
    opts: &Options,
    out: &mut ServiceOut,
) {
    let me = service_ref(svc);
    if me.name.is_empty() {
        out.skipped.push(Skipped {
            object: me,
            code: "no_name",
            reason: "metadata.name is empty".into(),
        });
        return;
    }
    if is_other_proxys(svc.proxy_name.as_ref(), opts) {
        out.ignored.other_proxy += 1;
        return;
    }
    let Some(spec) = svc.spec.as_ref() else {
        out.skipped.push(Skipped {
            object: me,
            code: "no_spec",
            reason: "no spec".into(),
        });
        return;
    };
    if spec.external_name {
        out.ignored.external_name += 1;
        return;
    }
    if spec.cluster_ips.iter().any(|ip| ip.as_str() == "None") {
        out.ignored.headless += 1;
        return;
    }
    if spec.cluster_ips.is_empty() {
        out.skipped.push(Skipped {
            object: me,
            code: "no_cluster_ip",
            reason: "no clusterIP assigned".into(),
        });
        return;
    }
    let mut vips: Vec<(Ipv4Addr, bool)> = Vec::new();
    for ip in &spec.cluster_ips {
        match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(v4)) => match crate::model::refused_address(v4) {
                None => vips.push((v4, true)),
                Some(why) => out.skipped.push(Skipped {
                    object: me.clone(),
                    code: "refused_cluster_ip",
                    reason: format!("clusterIP {v4} {why}; that address is skipped"),
                }),
            },
            Ok(std::net::IpAddr::V6(_)) => out.ignored.ipv6 += 1,
            Err(_) => {
                out.skipped.push(Skipped {
                    object: me,
                    code: "bad_cluster_ip",
                    reason: format!("clusterIP {ip:?} is not an IP address"),
                });
                return;
            }
        }
    }
    // External IPs and load-balancer ingress IPs reach the same endpoints; they follow
    // externalTrafficPolicy, which only matters for traffic from outside the node.
    for ip in &spec.external_ips {
        match ip.parse::<Ipv4Addr>() {
            Ok(v4) => match crate::model::refused_address(v4) {
                None => vips.push((v4, false)),
                Some(why) => out.skipped.push(Skipped {
                    object: me.clone(),
                    code: "refused_external_ip",
                    reason: format!("external IP {v4} {why}; that frontend is skipped"),
                }),
            },
            Err(_) => out.skipped.push(Skipped {
                object: me.clone(),
                code: "bad_external_ip",
                reason: format!(
                    "external IP {ip:?} is not an IPv4 address; that frontend is skipped"
                ),
            }),
        }
    }
    let policy = PortPolicy {
        internal_local: spec.internal_local,
        external_local: spec.external_local,
        // NodePorts and load-balancer IPs count here too once they are served.
        externally_accessible: vips.iter().any(|(_, is_cluster_ip)| !is_cluster_ip),
    };
    let affinity_timeout = session_affinity(spec, &me, &mut out.skipped);
    let node = NodeFacts {
        name: opts.node_name.as_deref().unwrap_or_default(),
        zone: opts.zone.as_deref().unwrap_or_default(),
    };
    let svc_endpoints = endpoints.get(&(me.namespace.clone(), me.name.clone()));
    let mut seen_ports = BTreeSet::new();
    for port in &spec.ports {
        let port_name = &port.name;
        let (proto, number) = match protocol(port.protocol.as_deref())
            .and_then(|p| Ok((p, port_number(port.port)?)))
        {
            Ok(v) => v,
            Err(reason) => {
                out.skipped.push(Skipped {
                    object: me.clone(),
                    code: "bad_port",
                    reason: format!("port {port_name:?}: {reason}; that port is skipped"),
                });
                continue;
            }
        };
        if !seen_ports.insert((number, proto)) {
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "duplicate_port",
                reason: format!("port {number} is listed twice; the second is skipped"),
            });
            continue;
        }
        let name = ServicePortName {
            namespace: me.namespace.clone(),
            name: me.name.clone(),
            port: port_name.clone(),
        };
        let candidates: Vec<(&(Ipv4Addr, u16), &MergedEndpoint)> = svc_endpoints
            .and_then(|e| e.get(&(port_name.clone(), proto)))
            .map(|m| m.iter().collect())
            .unwrap_or_default();
        let facts: Vec<&MergedEndpoint> = candidates.iter().map(|(_, e)| *e).collect();
        let sets = categorize::categorize(&facts, &policy, &node);
        let to_backends = |idx: &[usize]| -> Vec<Backend> {
            idx.iter()
                .map(|&i| {
                    let (ip, port) = candidates[i].0;
                    Backend {
                        addr_be: u32::from(*ip).to_be(),
                        port_be: port.to_be(),
                        proto,
                        _pad: 0,
                    }
                })
                .collect()
        };
        for &(vip, is_cluster_ip) in &vips {
            // Traffic from this node's pods: to a ClusterIP it follows
            // internalTrafficPolicy; to an external or load-balancer IP it is
            // short-circuited to the cluster endpoints whatever
            // externalTrafficPolicy says (the nftables proxier's EXT chain).
            let (backends, mut on_empty) = if is_cluster_ip {
                (
                    to_backends(sets.internal(&policy)),
                    sets.internal_empty_verdict(),
                )
            } else {
                (
                    to_backends(sets.cluster.as_deref().unwrap_or_default()),
                    EmptyVerdict::Reject,
                )
            };
            if !backends.is_empty() {
                // Meaningless with backends: one value, so the maps do not change
                // when only it would.
                on_empty = EmptyVerdict::default();
            }
            let key = ServiceKey {
                addr_be: u32::from(vip).to_be(),
                port_be: number.to_be(),
                proto,
                _pad: 0,
            };
            out.claims.push(Claim {
                key,
                frontend: Frontend {
                    service: name.clone(),
                    backends,
                    policy: FrontendPolicy {
                        on_empty,
                        affinity_timeout,
                    },
                },
                order: (u8::from(!is_cluster_ip), svc.created.clone()),
            });
        }
    }
    // Each ClusterIP of a Service with a port is marked, so traffic to it on a port
    // or protocol the Service does not declare is rejected (the nftables proxier's
    // `cluster-ips` set, filled per service port).
    if !seen_ports.is_empty() {
        for &(vip, is_cluster_ip) in &vips {
            if !is_cluster_ip {
                continue;
            }
            out.claims.push(Claim {
                key: dataplane_common::clusterip_marker(u32::from(vip).to_be()),
                frontend: Frontend {
                    service: ServicePortName {
                        namespace: me.namespace.clone(),
                        name: me.name.clone(),
                        port: String::new(),
                    },
                    backends: Vec::new(),
                    policy: FrontendPolicy::default(),
                },
                order: (0, svc.created.clone()),
            });
        }
    }
}

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
    claims: HashMap<ServiceKey, Vec<(ClaimOrder, GroupKey, u32)>>,
    frontends: BTreeMap<ServiceKey, Frontend>,
    /// Slices and groups that have something skipped; frontends asked for twice.
    slices_skipping: BTreeSet<SliceId>,
    groups_skipping: BTreeSet<GroupKey>,
    conflicts: BTreeSet<ServiceKey>,
    ignored: Ignored,
    dirty_endpoints: BTreeSet<EndpointsKey>,
    dirty_groups: BTreeSet<GroupKey>,
    /// Trigger times of the slices put since the last `take_trigger_times`.
    trigger_times: Vec<((String, String), String)>,
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

    /// Sets this node's zone (from its Node object). Topology hints of every Service
    /// are read against it, so a new zone recompiles them all. Whether it changed.
    pub fn set_zone(&mut self, zone: Option<String>) -> bool {
        if self.opts.zone == zone {
            return false;
        }
        self.opts.zone = zone;
        for id in self.services.keys() {
            self.dirty_groups
                .insert((id.namespace.clone(), id.name.clone()));
        }
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
        true
    }

    /// Removes a Service. Whether it was there.
    pub fn remove_service(&mut self, id: &ServiceId) -> bool {
        if self.services.remove(id).is_none() {
            return false;
        }
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
        self.remove_slice(&id);
        if let Some(t) = &slice.trigger_time {
            self.trigger_times.push((
                (
                    id.namespace.clone().unwrap_or_default(),
                    id.name.clone().unwrap_or_default(),
                ),
                t.clone(),
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
            let ids = self.slices_of.entry(key.clone()).or_default();
            let at = ids.partition_point(|i| *i < id);
            ids.insert(at, id.clone());
            self.dirty_endpoints.insert(key.clone());
        }
        self.ignored.add(&entry.ignored);
        if !entry.skipped.is_empty() {
            self.slices_skipping.insert(id.clone());
        }
        self.slices.insert(id, entry);
        true
    }

    /// Removes an EndpointSlice. Whether it was there.
    pub fn remove_slice(&mut self, id: &SliceId) -> bool {
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
        true
    }

    /// The `last-change-trigger-time` of each slice added or changed since the last
    /// call, by namespace and name (empty when unset): the agent's programming latency.
    pub fn take_trigger_times(&mut self) -> Vec<((String, String), String)> {
        std::mem::take(&mut self.trigger_times)
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

    /// Recompiles what changed since the last call. Returns the frontends that were
    /// added, changed or removed.
    pub fn compile(&mut self) -> BTreeSet<ServiceKey> {
        for key in std::mem::take(&mut self.dirty_endpoints) {
            let merged = self.slices_of.get(&key).map(|ids| {
                let mut merged = PortEndpoints::default();
                let mut messages = Vec::new(); // kept per slice already
                for id in ids {
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
            for (id, svc) in self.services.range(from..) {
                if id.namespace != group.0 || id.name != group.1 {
                    break;
                }
                compile_service(svc, &self.endpoints, &self.opts, &mut out);
            }
            if out.is_empty() {
                continue;
            }
            self.ignored.add(&out.ignored);
            if !out.skipped.is_empty() {
                self.groups_skipping.insert(group.clone());
            }
            for (i, claim) in out.claims.iter().enumerate() {
                let who = self.claims.entry(claim.key).or_default();
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
            if owner == self.frontends.get(&key) {
                continue;
            }
            match owner {
                Some(f) => {
                    self.frontends.insert(key, f.clone());
                }
                None => {
                    self.frontends.remove(&key);
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
        all.sort();
        all
    }

    /// Objects deliberately left alone, as of the last [`compile`](Self::compile).
    pub fn ignored(&self) -> &Ignored {
        &self.ignored
    }

    /// Everything, in the form [`compile`](crate::compiler::compile) gives.
    pub fn compiled(&self) -> Compiled {
        Compiled {
            frontends: self.frontends.clone(),
            skipped: self.skipped(),
            ignored: self.ignored.clone(),
        }
    }
}

/// `sessionAffinity: ClientIP` and its timeout (`pkg/proxy/serviceport.go`
/// `newBaseServiceInfo`); a value the API would refuse is reported and the Service
/// gets no affinity.
fn session_affinity(
    spec: &crate::model::ServiceSpecInfo,
    me: &ObjectRef,
    skipped: &mut Vec<Skipped>,
) -> Option<u32> {
    match spec.session_affinity.as_deref() {
        None | Some("None") => None,
        Some("ClientIP") => match spec.affinity_timeout {
            None => Some(DEFAULT_AFFINITY_TIMEOUT),
            Some(t) if (1..=MAX_AFFINITY_TIMEOUT).contains(&t) => Some(t as u32),
            Some(t) => {
                skipped.push(Skipped {
                    object: me.clone(),
                    code: "bad_affinity_timeout",
                    reason: format!(
                        "sessionAffinityConfig.clientIP.timeoutSeconds {t} is out of range 1-{MAX_AFFINITY_TIMEOUT}; the Service gets no session affinity"
                    ),
                });
                None
            }
        },
        Some(other) => {
            skipped.push(Skipped {
                object: me.clone(),
                code: "bad_affinity",
                reason: format!(
                    "sessionAffinity {other:?} is unknown (None and ClientIP are); the Service gets no session affinity"
                ),
            });
            None
        }
    }
}

/// `TCP` / `UDP` / `SCTP`, for messages and dumps.
pub fn proto_name(proto: u8) -> &'static str {
    match proto {
        PROTO_TCP => "TCP",
        PROTO_UDP => "UDP",
        PROTO_SCTP => "SCTP",
        _ => "?",
    }
}

/// Whether a frontend key is a ClusterIP's marker (port and protocol 0).
pub fn is_clusterip_marker(key: &ServiceKey) -> bool {
    key.port_be == 0 && key.proto == 0
}

/// `ip:port/PROTO` of a frontend key; `ip:*` for a ClusterIP's marker (its other
/// ports).
pub fn frontend_addr(key: &ServiceKey) -> String {
    if is_clusterip_marker(key) {
        return format!("{}:*", Ipv4Addr::from(u32::from_be(key.addr_be)));
    }
    format!(
        "{}:{}/{}",
        Ipv4Addr::from(u32::from_be(key.addr_be)),
        u16::from_be(key.port_be),
        proto_name(key.proto)
    )
}

/// `ip:port` of a backend.
pub fn backend_addr(b: &Backend) -> String {
    format!(
        "{}:{}",
        Ipv4Addr::from(u32::from_be(b.addr_be)),
        u16::from_be(b.port_be)
    )
}

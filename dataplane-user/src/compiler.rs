//! The compiler: Services, EndpointSlices and this node's identity in, the desired
//! frontends with their backends out. A pure function: no kernel, no clock, no I/O.
//!
//! Semantics follow kube-proxy where it defines them:
//! - which objects are used: kube-proxy's informer selectors skip objects labelled
//!   `service.kubernetes.io/service-proxy-name` and headless Services
//!   (<https://github.com/kubernetes/kubernetes/blob/master/cmd/kube-proxy/app/server.go>);
//! - how slices merge: `pkg/proxy/endpointslicecache.go` (several slices per Service,
//!   one copy per address, a non-terminating copy wins, ports without a number ignored,
//!   nil conditions defaulted: ready ⇒ true, serving ⇒ ready, terminating ⇒ false);
//! - which endpoints serve: `pkg/proxy/topology.go` `CategorizeEndpoints` (ready
//!   endpoints; if none, serving-and-terminating ones; `internalTrafficPolicy: Local`
//!   keeps only this node's).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    net::Ipv4Addr,
};

use dataplane_common::{Backend, ServiceKey, PROTO_TCP, PROTO_UDP};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MergedEndpoint {
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
}

/// (port name, protocol) → address → endpoint.
type PortEndpoints = HashMap<(String, u8), BTreeMap<(Ipv4Addr, u16), MergedEndpoint>>;

/// Compiles Services and EndpointSlices into frontends.
pub fn compile(services: &[Service], slices: &[EndpointSlice], opts: &Options) -> Compiled {
    let mut out = Compiled::default();
    let endpoints = merge_slices(slices, opts, &mut out);

    let mut services: Vec<&Service> = services.iter().collect();
    services.sort_by_key(|s| object_key(s));
    for svc in services {
        compile_service(svc, &endpoints, opts, &mut out);
    }
    out.skipped.sort();
    out
}

fn object_key(svc: &Service) -> (String, String) {
    (
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    )
}

fn service_ref(svc: &Service) -> ObjectRef {
    ObjectRef {
        kind: "Service",
        namespace: svc
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: svc.metadata.name.clone().unwrap_or_default(),
    }
}

fn is_other_proxys(labels: Option<&BTreeMap<String, String>>, opts: &Options) -> bool {
    match labels.and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME)) {
        None => false,
        Some(v) => opts.proxy_name.as_deref() != Some(v.as_str()),
    }
}

/// Parses a protocol name; `None` (unset) means TCP, as the API defaults it.
fn protocol(p: Option<&str>) -> Result<u8, String> {
    match p {
        None | Some("TCP") => Ok(PROTO_TCP),
        Some("UDP") => Ok(PROTO_UDP),
        Some(other) => Err(format!(
            "protocol {other} is not supported (TCP and UDP are)"
        )),
    }
}

fn port_number(p: i32) -> Result<u16, String> {
    u16::try_from(p)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("port {p} is out of range 1-65535"))
}

fn merge_slices(
    slices: &[EndpointSlice],
    opts: &Options,
    out: &mut Compiled,
) -> HashMap<(String, String), PortEndpoints> {
    let mut merged: HashMap<(String, String), PortEndpoints> = HashMap::new();
    let mut slices: Vec<&EndpointSlice> = slices.iter().collect();
    slices.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    for slice in slices {
        let namespace = slice
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let me = ObjectRef {
            kind: "EndpointSlice",
            namespace: namespace.clone(),
            name: slice.metadata.name.clone().unwrap_or_default(),
        };
        let labels = slice.metadata.labels.as_ref();
        if is_other_proxys(labels, opts) {
            out.ignored.other_proxy += 1;
            continue;
        }
        if labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)) {
            out.ignored.headless += 1;
            continue;
        }
        let Some(service) = labels.and_then(|l| l.get(LABEL_SERVICE_NAME)) else {
            out.skipped.push(Skipped {
                object: me,
                code: "no_service_label",
                reason: format!("no {LABEL_SERVICE_NAME} label: it belongs to no Service"),
            });
            continue;
        };
        match slice.address_type.as_str() {
            "IPv4" => {}
            "IPv6" => {
                out.ignored.ipv6 += 1;
                continue;
            }
            other => {
                out.skipped.push(Skipped {
                    object: me,
                    code: "address_type",
                    reason: format!("addressType {other} is not supported (IPv4 is)"),
                });
                continue;
            }
        }
        let by_port = merged.entry((namespace, service.clone())).or_default();
        for port in slice.ports.iter().flatten() {
            // endpointslicecache: a port without a number is ignored.
            let Some(number) = port.port else { continue };
            let proto = match protocol(port.protocol.as_deref()) {
                Ok(p) => p,
                Err(reason) => {
                    out.skipped.push(Skipped {
                        object: me.clone(),
                        code: "protocol",
                        reason: format!("port {number}: {reason}"),
                    });
                    continue;
                }
            };
            let number = match port_number(number) {
                Ok(n) => n,
                Err(reason) => {
                    out.skipped.push(Skipped {
                        object: me.clone(),
                        code: "port_range",
                        reason,
                    });
                    continue;
                }
            };
            let addrs = by_port
                .entry((port.name.clone().unwrap_or_default(), proto))
                .or_default();
            for ep in &slice.endpoints {
                let cond = ep.conditions.as_ref();
                let ready = cond.and_then(|c| c.ready).unwrap_or(true);
                let endpoint = MergedEndpoint {
                    ready,
                    serving: cond.and_then(|c| c.serving).unwrap_or(ready),
                    terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                    local: opts.node_name.is_some() && ep.node_name == opts.node_name,
                };
                // A slice endpoint has one address (the API allows more, only the first
                // is used, as in kube-proxy).
                let Some(addr) = ep.addresses.first() else {
                    continue;
                };
                let ip: Ipv4Addr = match addr.parse() {
                    Ok(ip) => ip,
                    Err(_) => {
                        out.skipped.push(Skipped {
                            object: me.clone(),
                            code: "bad_endpoint_address",
                            reason: format!("endpoint address {addr:?} is not an IPv4 address"),
                        });
                        continue;
                    }
                };
                addrs
                    .entry((ip, number))
                    .and_modify(|seen| {
                        if seen.terminating && !endpoint.terminating {
                            *seen = endpoint;
                        }
                    })
                    .or_insert(endpoint);
            }
        }
    }
    merged
}

fn compile_service(
    svc: &Service,
    endpoints: &HashMap<(String, String), PortEndpoints>,
    opts: &Options,
    out: &mut Compiled,
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
    if is_other_proxys(svc.metadata.labels.as_ref(), opts) {
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
    if spec.type_.as_deref() == Some("ExternalName") {
        out.ignored.external_name += 1;
        return;
    }
    let cluster_ips: Vec<&String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.iter().collect(),
        (_, Some(ip)) => vec![ip],
        _ => vec![],
    };
    if cluster_ips.iter().any(|ip| ip.as_str() == "None") {
        out.ignored.headless += 1;
        return;
    }
    if cluster_ips.is_empty() {
        out.skipped.push(Skipped {
            object: me,
            code: "no_cluster_ip",
            reason: "no clusterIP assigned".into(),
        });
        return;
    }
    let mut vips: Vec<(Ipv4Addr, bool)> = Vec::new();
    for ip in &cluster_ips {
        match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(v4)) => vips.push((v4, true)),
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
    let external = spec
        .external_ips
        .iter()
        .flatten()
        .map(String::as_str)
        .chain(
            svc.status
                .iter()
                .filter_map(|s| s.load_balancer.as_ref())
                .flat_map(|lb| lb.ingress.iter().flatten())
                .filter_map(|i| i.ip.as_deref()),
        );
    for ip in external {
        match ip.parse::<Ipv4Addr>() {
            Ok(v4) => vips.push((v4, false)),
            Err(_) => out.skipped.push(Skipped {
                object: me.clone(),
                code: "bad_external_ip",
                reason: format!(
                    "external IP {ip:?} is not an IPv4 address; that frontend is skipped"
                ),
            }),
        }
    }
    let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let svc_endpoints = endpoints.get(&(me.namespace.clone(), me.name.clone()));
    let mut seen_ports = BTreeSet::new();
    for port in spec.ports.iter().flatten() {
        let port_name = port.name.clone().unwrap_or_default();
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
        let candidates = svc_endpoints.and_then(|e| e.get(&(port_name.clone(), proto)));
        for &(vip, is_cluster_ip) in &vips {
            let backends = pick_endpoints(candidates, proto, is_cluster_ip && internal_local);
            let key = ServiceKey {
                addr_be: u32::from(vip).to_be(),
                port_be: number.to_be(),
                proto,
                _pad: 0,
            };
            if let Some(existing) = out.frontends.get(&key) {
                out.skipped.push(Skipped {
                    object: me.clone(),
                    code: "frontend_conflict",
                    reason: format!(
                        "{vip}:{number}/{} is already the frontend of {}; this one is skipped",
                        proto_name(proto),
                        existing.service
                    ),
                });
                continue;
            }
            out.frontends.insert(
                key,
                Frontend {
                    service: name.clone(),
                    backends,
                },
            );
        }
    }
}

/// kube-proxy's `CategorizeEndpoints` for one traffic scope: ready endpoints, or if
/// there are none the serving-and-terminating ones; `local_only` keeps this node's.
fn pick_endpoints(
    candidates: Option<&BTreeMap<(Ipv4Addr, u16), MergedEndpoint>>,
    proto: u8,
    local_only: bool,
) -> Vec<Backend> {
    let Some(candidates) = candidates else {
        return Vec::new();
    };
    let in_scope = |e: &MergedEndpoint| !local_only || e.local;
    let any_ready = candidates.values().any(|e| e.ready && in_scope(e));
    candidates
        .iter()
        .filter(|(_, e)| in_scope(e))
        .filter(|(_, e)| {
            if any_ready {
                e.ready
            } else {
                e.serving && e.terminating
            }
        })
        .map(|((ip, port), _)| Backend {
            addr_be: u32::from(*ip).to_be(),
            port_be: port.to_be(),
            proto,
            _pad: 0,
        })
        .collect()
}

/// `TCP` / `UDP`, for messages and dumps.
pub fn proto_name(proto: u8) -> &'static str {
    match proto {
        PROTO_TCP => "TCP",
        PROTO_UDP => "UDP",
        _ => "?",
    }
}

/// `ip:port/PROTO` of a frontend key.
pub fn frontend_addr(key: &ServiceKey) -> String {
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

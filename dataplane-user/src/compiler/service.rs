//! One Service with its merged endpoints into the frontends it asks for: its
//! ClusterIPs, external and load-balancer IPs, ports, traffic policies and session
//! affinity.

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use conventions::validate;
use dataplane_common::{Backend, Backend6, ServiceKey, ServiceKey6};

use super::claims::Claim;
use super::prefix;
use super::slices::{port_number, protocol, EndpointsKey, PortEndpoints};
use super::{
    is_other_proxys, AnyFrontend, Frontend, Frontend6, FrontendKey, FrontendPolicy, HealthCheck,
    Ignored, NoLocalEndpoints, ObjectRef, Options, ServicePortName, Skipped,
    DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT,
};
use crate::compiler::categorize::{self, EmptyVerdict, EndpointFacts, NodeFacts, PortPolicy};
use crate::model::{ServiceInfo, ServiceSpecInfo};

/// Services compiled together, in order: same namespace and name (empty when unset).
pub(super) type GroupKey = (String, String);

/// What compiling some Services gave, before frontend conflicts are settled.
#[derive(Clone, Debug, Default)]
pub(super) struct ServiceOut {
    pub(super) claims: Vec<Claim>,
    pub(super) skipped: Vec<Skipped>,
    pub(super) ignored: Ignored,
    pub(super) health_checks: Vec<(GroupKey, HealthCheck)>,
    pub(super) no_local: NoLocalEndpoints,
}

impl ServiceOut {
    /// Gives back the room its vectors hold beyond their contents.
    pub(super) fn shrink_to_fit(&mut self) {
        self.claims.shrink_to_fit();
        self.skipped.shrink_to_fit();
        self.health_checks.shrink_to_fit();
    }

    pub(super) fn is_empty(&self) -> bool {
        self.claims.is_empty()
            && self.skipped.is_empty()
            && self.ignored == Ignored::default()
            && self.health_checks.is_empty()
            && self.no_local == NoLocalEndpoints::default()
    }
}

fn service_ref(svc: &ServiceInfo) -> ObjectRef {
    ObjectRef::new("Service", svc.namespace.as_deref(), svc.name.as_deref())
}

/// One Service into its frontends' claims (each family's ClusterIP, external and
/// load-balancer IPs and NodePorts, per port, and a ClusterIP marker), its health
/// checks, and what was skipped or ignored, into `out`.
pub(super) fn compile_service(
    svc: &ServiceInfo,
    endpoints: &HashMap<EndpointsKey, PortEndpoints>,
    opts: &Options,
    out: &mut ServiceOut,
) {
    let Some((me, spec)) = screen(svc, opts, out) else {
        return;
    };
    let Some((cluster4, cluster6)) = cluster_ips(spec, &me, out) else {
        return;
    };
    let (others4, others6) = other_ips(spec, &me, (cluster4.is_some(), cluster6.is_some()), out);
    let affinity_timeout = session_affinity(spec, &me, &mut out.skipped);
    let any_lb = others4.iter().any(|(_, lb)| *lb) || others6.iter().any(|(_, lb)| *lb);
    let (ranges4, ranges6) = if any_lb {
        parse_source_ranges(spec, &me, &mut out.skipped)
    } else {
        Default::default()
    };
    let families = (
        cluster4.map(|c| Family::new(c, &others4, spec, &ranges4, opts)),
        cluster6.map(|c| Family::new(c, &others6, spec, &ranges6, opts)),
    );
    let svc_endpoints = endpoints.get(&(me.namespace.clone(), me.name.clone()));
    // One health check a family, as kube-proxy's per-family proxiers.
    health_check(
        spec,
        &me,
        svc_endpoints,
        (cluster4.is_some(), cluster6.is_some()),
        out,
    );
    let mut seen_ports = BTreeSet::new();
    // One copy of the names for all the Service's ports and frontends.
    let (namespace, name): (Arc<str>, Arc<str>) =
        (me.namespace.as_str().into(), me.name.as_str().into());
    let ctx = Ctx {
        svc,
        endpoints: svc_endpoints,
        opts,
        affinity_timeout,
    };
    for port in &spec.ports {
        let Some(port) = port_spec(port, &me, (&namespace, &name), &mut seen_ports, out) else {
            continue;
        };
        if let Some(f) = &families.0 {
            f.claims(&ctx, &port, &mut out.claims, &mut out.no_local);
        }
        if let Some(f) = &families.1 {
            f.claims(&ctx, &port, &mut out.claims, &mut out.no_local);
        }
    }
    // Each ClusterIP of a Service with a port is marked, so traffic to it on a port
    // or protocol the Service does not declare is rejected (the nftables proxier's
    // `cluster-ips` set, filled per service port).
    if !seen_ports.is_empty() {
        let service = ServicePortName {
            namespace,
            name,
            port: "".into(),
        };
        if let Some(f) = &families.0 {
            out.claims.push(f.marker(service.clone(), svc));
        }
        if let Some(f) = &families.1 {
            out.claims.push(f.marker(service, svc));
        }
    }
}

/// The Service's reference and spec, if it is one to program: named, this proxy's,
/// with a spec, not an ExternalName or headless one, with a ClusterIP (the others
/// skipped with a reason or counted as ignored).
fn screen<'a>(
    svc: &'a ServiceInfo,
    opts: &Options,
    out: &mut ServiceOut,
) -> Option<(ObjectRef, &'a crate::model::ServiceSpecInfo)> {
    let me = service_ref(svc);
    let skip = |out: &mut ServiceOut, me: ObjectRef, code, reason: &str| {
        out.skipped.push(Skipped {
            object: me,
            code,
            reason: reason.into(),
        });
        None
    };
    if me.name.is_empty() {
        return skip(out, me, "no_name", "metadata.name is empty");
    }
    if is_other_proxys(svc.proxy_name.as_ref(), opts) {
        out.ignored.other_proxy += 1;
        return None;
    }
    let Some(spec) = svc.spec.as_ref() else {
        return skip(out, me, "no_spec", "no spec");
    };
    if spec.external_name {
        out.ignored.external_name += 1;
        return None;
    }
    if spec.cluster_ips.iter().any(|ip| ip.as_str() == "None") {
        out.ignored.headless += 1;
        return None;
    }
    if spec.cluster_ips.is_empty() {
        return skip(out, me, "no_cluster_ip", "no clusterIP assigned");
    }
    Some((me, spec))
}

/// One ClusterIP per family: kube-proxy's proxier of each family takes the first
/// ClusterIP of its family (`GetClusterIPByFamily`, servicechangetracker.go). `None`
/// when one is not an address at all (the Service is skipped).
fn cluster_ips(
    spec: &crate::model::ServiceSpecInfo,
    me: &ObjectRef,
    out: &mut ServiceOut,
) -> Option<(Option<Ipv4Addr>, Option<Ipv6Addr>)> {
    let mut cluster4: Option<Ipv4Addr> = None;
    let mut cluster6: Option<Ipv6Addr> = None;
    for ip in &spec.cluster_ips {
        // As kube-proxy reads it (netutils.ParseIPSloppy): a stored ClusterIP may have
        // leading zeros; a file's was refused at the front door.
        let Some(parsed) = validate::parse_ip_sloppy(ip) else {
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "bad_cluster_ip",
                reason: format!("clusterIP {ip:?} is not an IP address"),
            });
            return None;
        };
        if let Some(why) = validate::translatable(parsed) {
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "refused_cluster_ip",
                reason: format!("clusterIP {parsed} {why}; that address is skipped"),
            });
            continue;
        }
        let taken = match parsed {
            IpAddr::V4(v4) => cluster4.replace(v4).map(IpAddr::from),
            IpAddr::V6(v6) => cluster6.replace(v6).map(IpAddr::from),
        };
        // The API server allows one ClusterIP per family; a file may list two of
        // one. The first stays, as kube-proxy's `GetClusterIPByFamily` takes it.
        if let Some(first) = taken {
            match first {
                IpAddr::V4(v4) => cluster4 = Some(v4),
                IpAddr::V6(v6) => cluster6 = Some(v6),
            }
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "cluster_ip_same_family",
                reason: format!(
                    "clusterIPs lists {parsed} after {first}, of the same family (a Service has one ClusterIP per family); {parsed} is ignored"
                ),
            });
        }
    }
    Some((cluster4, cluster6))
}

/// External IPs and load-balancer ingress IPs (`true`) by family: they reach the
/// same endpoints and follow externalTrafficPolicy, which only matters for traffic
/// from outside the node. Each is its family's, and only a family the Service has
/// a ClusterIP of (`families`: IPv4, IPv6) serves them (kube-proxy's proxier of the
/// other family never sees the Service).
#[allow(clippy::type_complexity)]
fn other_ips(
    spec: &crate::model::ServiceSpecInfo,
    me: &ObjectRef,
    families: (bool, bool),
    out: &mut ServiceOut,
) -> (Vec<(Ipv4Addr, bool)>, Vec<(Ipv6Addr, bool)>) {
    let mut others4: Vec<(Ipv4Addr, bool)> = Vec::new();
    let mut others6: Vec<(Ipv6Addr, bool)> = Vec::new();
    let external = spec.external_ips.iter().map(|ip| (ip, false));
    let lb = spec.load_balancer_ips.iter().map(|ip| (ip, true));
    for (ip, is_lb) in external.chain(lb) {
        let Some(parsed) = validate::parse_ip_sloppy(ip) else {
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "bad_external_ip",
                reason: format!(
                    "external IP {ip:?} is not an IP address; that frontend is skipped"
                ),
            });
            continue;
        };
        if let Some(why) = validate::translatable(parsed) {
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "refused_external_ip",
                reason: format!("external IP {parsed} {why}; that frontend is skipped"),
            });
            continue;
        }
        match parsed {
            IpAddr::V4(v4) if families.0 => others4.push((v4, is_lb)),
            IpAddr::V6(v6) if families.1 => others6.push((v6, is_lb)),
            _ => {
                out.ignored.other_family += 1;
                out.skipped.push(Skipped {
                    object: me.clone(),
                    code: "external_ip_other_family",
                    reason: format!(
                        "external IP {parsed} is of a family the Service has no ClusterIP of; that frontend is skipped"
                    ),
                });
            }
        }
    }
    (others4, others6)
}

/// One port of the Service as its frontends read it, or `None` when it is skipped
/// (a bad protocol or number, or listed twice: `seen` holds those before it). A
/// bad nodePort leaves the port without a NodePort.
fn port_spec(
    port: &crate::model::ServicePortInfo,
    me: &ObjectRef,
    (namespace, name): (&Arc<str>, &Arc<str>),
    seen: &mut BTreeSet<(u16, u8)>,
    out: &mut ServiceOut,
) -> Option<PortSpec> {
    let port_name = &port.name;
    let (proto, number) =
        match protocol(port.protocol.as_deref()).and_then(|p| Ok((p, port_number(port.port)?))) {
            Ok(v) => v,
            Err(reason) => {
                out.skipped.push(Skipped {
                    object: me.clone(),
                    code: "bad_port",
                    reason: format!("port {port_name:?}: {reason}; that port is skipped"),
                });
                return None;
            }
        };
    if !seen.insert((number, proto)) {
        out.skipped.push(Skipped {
            object: me.clone(),
            code: "duplicate_port",
            reason: format!("port {number} is listed twice; the second is skipped"),
        });
        return None;
    }
    // NodePorts: the node's addresses on the port's nodePort, reached as an
    // external IP is (from this node's pods and its own sockets today).
    let node_port = match port.node_port.map(port_number).transpose() {
        Ok(p) => p,
        Err(reason) => {
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "bad_node_port",
                reason: format!("port {port_name:?}: nodePort: {reason}; no NodePort for it"),
            });
            None
        }
    };
    Some(PortSpec {
        name: ServicePortName {
            namespace: namespace.clone(),
            name: name.clone(),
            port: port_name.as_str().into(),
        },
        proto,
        number,
        node_port,
    })
}

/// An address family as the compiler uses it: IPv4 ([`Ipv4Addr`], `SERVICES`) or
/// IPv6 ([`Ipv6Addr`], `SERVICES6`).
pub(super) trait Ip: Copy + Ord + Into<IpAddr> + std::fmt::Display {
    /// The family's backend in the maps.
    type Backend: Clone;
    /// An address as the maps hold it (network order).
    type Raw: Copy + Ord;
    /// The family's addresses of either.
    fn of(ip: IpAddr) -> Option<Self>;
    fn raw(self) -> Self::Raw;
    fn backend(self, port: u16, proto: u8) -> Self::Backend;
    fn key(self, port: u16, proto: u8, scope: u8) -> FrontendKey;
    fn marker(self) -> FrontendKey;
    fn wrap(f: Frontend<Self::Backend, Self::Raw>) -> AnyFrontend;
    fn node_port_ips(opts: &Options) -> &[Self];
    fn node_ip(opts: &Options) -> Option<Self>;
    /// The network of `self/len` (`len` within the family's bits).
    fn network(self, len: u8) -> Self;
    const BITS: u8;
}

impl Ip for Ipv4Addr {
    type Backend = Backend;
    type Raw = u32;
    fn of(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        }
    }
    fn raw(self) -> u32 {
        u32::from(self).to_be()
    }
    fn backend(self, port: u16, proto: u8) -> Backend {
        Backend {
            addr_be: self.raw(),
            port_be: port.to_be(),
            proto,
            _pad: 0,
        }
    }
    fn key(self, port: u16, proto: u8, scope: u8) -> FrontendKey {
        FrontendKey::V4(ServiceKey {
            addr_be: self.raw(),
            port_be: port.to_be(),
            proto,
            scope,
        })
    }
    fn marker(self) -> FrontendKey {
        FrontendKey::V4(dataplane_common::clusterip_marker(self.raw()))
    }
    fn wrap(f: Frontend) -> AnyFrontend {
        AnyFrontend::V4(f)
    }
    fn node_port_ips(opts: &Options) -> &[Self] {
        &opts.node_port_ips
    }
    fn node_ip(opts: &Options) -> Option<Self> {
        opts.node_ip
    }
    fn network(self, len: u8) -> Self {
        Ipv4Addr::from(u32::from(self) & super::prefix_mask(len))
    }
    const BITS: u8 = 32;
}

impl Ip for Ipv6Addr {
    type Backend = Backend6;
    type Raw = [u32; 4];
    fn of(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(v6) => Some(v6),
            IpAddr::V4(_) => None,
        }
    }
    fn raw(self) -> [u32; 4] {
        dataplane_common::addr_of(self.octets())
    }
    fn backend(self, port: u16, proto: u8) -> Backend6 {
        Backend6 {
            addr_be: self.raw(),
            port_be: port.to_be(),
            proto,
            _pad: 0,
        }
    }
    fn key(self, port: u16, proto: u8, scope: u8) -> FrontendKey {
        FrontendKey::V6(ServiceKey6 {
            addr_be: self.raw(),
            port_be: port.to_be(),
            proto,
            scope,
        })
    }
    fn marker(self) -> FrontendKey {
        FrontendKey::V6(dataplane_common::clusterip_marker6(self.raw()))
    }
    fn wrap(f: Frontend6) -> AnyFrontend {
        AnyFrontend::V6(f)
    }
    fn node_port_ips(opts: &Options) -> &[Self] {
        &opts.node_port_ips6
    }
    fn node_ip(opts: &Options) -> Option<Self> {
        opts.node_ip6
    }
    fn network(self, len: u8) -> Self {
        Ipv6Addr::from(u128::from(self) & super::prefix_mask6(len))
    }
    const BITS: u8 = 128;
}

/// One port of a Service, checked.
struct PortSpec {
    name: ServicePortName,
    proto: u8,
    number: u16,
    node_port: Option<u16>,
}

/// What every family's frontends of a Service read.
struct Ctx<'a> {
    svc: &'a ServiceInfo,
    endpoints: Option<&'a PortEndpoints>,
    opts: &'a Options,
    affinity_timeout: Option<u32>,
}

/// A Service as one family's proxier sees it: its ClusterIP of the family, then
/// its external and load-balancer IPs of the family, in order.
struct Family<A: Ip> {
    /// (address, is a ClusterIP).
    vips: Vec<(A, bool)>,
    lb_vips: BTreeSet<A>,
    policy: PortPolicy,
    source_ranges: Vec<(A::Raw, u8)>,
}

impl<A: Ip> Family<A> {
    fn new(
        cluster_ip: A,
        others: &[(A, bool)],
        spec: &ServiceSpecInfo,
        ranges: &Ranges<A>,
        opts: &Options,
    ) -> Self {
        let mut vips = vec![(cluster_ip, true)];
        vips.extend(others.iter().map(|(ip, _)| (*ip, false)));
        let lb_vips: BTreeSet<A> = others
            .iter()
            .filter(|(_, lb)| *lb)
            .map(|(ip, _)| *ip)
            .collect();
        let policy = PortPolicy {
            internal_local: spec.internal_local,
            external_local: spec.external_local,
            // kube-proxy's `ExternallyAccessible`: a NodePort, an external or a
            // load-balancer IP (of this family).
            externally_accessible: !others.is_empty()
                || spec.ports.iter().any(|p| p.node_port.is_some()),
        };
        let source_ranges = if lb_vips.is_empty() {
            Vec::new()
        } else {
            extend_source_ranges(ranges, &lb_vips, A::node_ip(opts))
        };
        Self {
            vips,
            lb_vips,
            policy,
            source_ranges,
        }
    }

    /// The ClusterIP's marker claim.
    fn marker(&self, service: ServicePortName, svc: &ServiceInfo) -> Claim {
        Claim {
            key: self.vips[0].0.marker(),
            frontend: A::wrap(Frontend {
                service,
                backends: Vec::new(),
                policy: FrontendPolicy::default(),
                source_ranges: Vec::new(),
            }),
            order: (0, svc.created.clone()),
        }
    }

    /// The frontends of one port in this family.
    fn claims(
        &self,
        ctx: &Ctx<'_>,
        port: &PortSpec,
        claims: &mut Vec<Claim>,
        no_local: &mut NoLocalEndpoints,
    ) {
        let PortSpec {
            name,
            proto,
            number,
            node_port,
        } = port;
        let (proto, number) = (*proto, *number);
        let opts = ctx.opts;
        let node = NodeFacts {
            name: opts.node_name.as_deref().unwrap_or_default(),
            zone: opts.zone.as_deref().unwrap_or_default(),
        };
        // This family's endpoints: from its slices only (an address is of its
        // slice's addressType).
        let candidates: Vec<(A, u16, &EndpointFacts)> = ctx
            .endpoints
            .and_then(|e| e.get(&(name.port.to_string(), proto)))
            .map(|m| {
                m.iter()
                    .filter_map(|((ip, p), e)| Some((A::of(*ip)?, *p, e)))
                    .collect()
            })
            .unwrap_or_default();
        let facts: Vec<&EndpointFacts> = candidates.iter().map(|(_, _, e)| *e).collect();
        let policy = &self.policy;
        let sets = categorize::categorize(&facts, policy, &node);
        // kube-proxy counts a port whose `Local` policy finds no endpoint here
        // while it has endpoints (`ExternalPolicyLocal` holds only for an
        // externally accessible Service).
        if sets.has_any && sets.local.as_ref().is_some_and(|l| l.is_empty()) {
            let fam = usize::from(A::BITS == 128);
            if policy.internal_local {
                no_local.internal[fam] += 1;
            }
            if policy.external_local && policy.externally_accessible {
                no_local.external[fam] += 1;
            }
        }
        let to_backends = |idx: &[usize]| -> Vec<A::Backend> {
            idx.iter()
                .map(|&i| {
                    let (ip, port, _) = candidates[i];
                    ip.backend(port, proto)
                })
                .collect()
        };
        let node_ports = node_port
            .iter()
            .flat_map(|n| A::node_port_ips(opts).iter().map(move |ip| (*ip, *n)));
        let frontends = self
            .vips
            .iter()
            .map(|&(vip, is_cluster_ip)| (vip, number, is_cluster_ip))
            .chain(node_ports.map(|(ip, n)| (ip, n, false)));
        let created = &ctx.svc.created;
        for (vip, number, is_cluster_ip) in frontends {
            // Traffic from this node's pods: to a ClusterIP it follows
            // internalTrafficPolicy; to an external or load-balancer IP it is
            // short-circuited to the cluster endpoints whatever
            // externalTrafficPolicy says (the nftables proxier's EXT chain).
            let (backends, mut on_empty) = if is_cluster_ip {
                (
                    to_backends(sets.internal(policy)),
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
            // Reached from outside: a Maglev table, the same on every node (and
            // nothing without backends, as above).
            let maglev = opts
                .maglev
                .filter(|_| !is_cluster_ip && !backends.is_empty());
            let key = vip.key(number, proto, dataplane_common::SCOPE_ANY);
            // loadBalancerSourceRanges guard the load-balancer IPs only (not
            // NodePorts, external IPs or ClusterIPs), from every client.
            let ranges = if self.lb_vips.contains(&vip) {
                self.source_ranges.clone()
            } else {
                Vec::new()
            };
            claims.push(Claim {
                key,
                frontend: A::wrap(Frontend {
                    service: name.clone(),
                    backends,
                    policy: FrontendPolicy {
                        on_empty,
                        affinity_timeout: ctx.affinity_timeout,
                        source_ranges: !ranges.is_empty(),
                        maglev,
                        // Reached from outside and masqueraded there: direct
                        // server return instead, where asked for.
                        dsr: opts.dsr && !is_cluster_ip,
                        // A pod reaching an external address of a `Cluster`
                        // policy is masqueraded, as kube-proxy's external chain
                        // masquerades it; with `Local` it is short-circuited with
                        // its address kept (the nftables proxier's EXT chain).
                        masq_pods: !is_cluster_ip && !policy.external_local,
                    },
                    source_ranges: ranges.clone(),
                }),
                order: (u8::from(!is_cluster_ip), created.clone()),
            });
            // Traffic from outside the node (the uplink program): with
            // `externalTrafficPolicy: Local`, this node's endpoints only and the
            // client's address kept; none here while others have some drops, none
            // anywhere rejects (the nftables proxier's external policy chain). With
            // `Cluster` there is no such entry: the uplink program uses the one
            // above and masquerades. (Two Services asking for one external address
            // and port are reported as a conflict; each entry goes to its own
            // winner.)
            if !is_cluster_ip && policy.external_local {
                let local = sets.local.as_deref().unwrap_or_default();
                let on_empty = if !local.is_empty() {
                    EmptyVerdict::default()
                } else {
                    sets.internal_empty_verdict()
                };
                claims.push(Claim {
                    key: vip.key(number, proto, dataplane_common::SCOPE_EXTERNAL),
                    frontend: A::wrap(Frontend {
                        service: name.clone(),
                        policy: FrontendPolicy {
                            on_empty,
                            affinity_timeout: ctx.affinity_timeout,
                            source_ranges: !ranges.is_empty(),
                            maglev: opts.maglev.filter(|_| !local.is_empty()),
                            // The client's address is kept anyway.
                            dsr: false,
                            masq_pods: false,
                        },
                        backends: to_backends(local),
                        // The ranges are kept under the frontend's entry for all.
                        source_ranges: Vec::new(),
                    }),
                    order: (1, created.clone()),
                });
            }
        }
    }
}

/// One family's `loadBalancerSourceRanges`: networks with prefix lengths; `None`
/// when one of them is a zero-length prefix (every source: no check).
type Ranges<A> = Option<Vec<(A, u8)>>;

/// `loadBalancerSourceRanges` as kube-proxy reads them (pkg/proxy/serviceport.go:
/// trimmed, parsed as `ParseCIDRSloppy` does, split by family, each family's
/// proxier taking its own). A range that does not parse is reported once and left
/// out.
fn parse_source_ranges(
    spec: &ServiceSpecInfo,
    me: &ObjectRef,
    skipped: &mut Vec<Skipped>,
) -> (Ranges<Ipv4Addr>, Ranges<Ipv6Addr>) {
    let mut v4 = Some(Vec::new());
    let mut v6 = Some(Vec::new());
    fn add<A: Ip>(ranges: &mut Ranges<A>, addr: A, len: u8) {
        if len == 0 {
            *ranges = None;
        } else if let Some(r) = ranges {
            r.push((addr.network(len), len));
        }
    }
    for raw in &spec.load_balancer_source_ranges {
        let text = raw.trim();
        let syntax = prefix::Syntax {
            address: validate::parse_ip_sloppy,
            canonical_length: false,
        };
        match prefix::parse(text, syntax) {
            Ok((IpAddr::V4(addr), len)) => add(&mut v4, addr, len),
            Ok((IpAddr::V6(addr), len)) => add(&mut v6, addr, len),
            Err(_) => skipped.push(Skipped {
                object: me.clone(),
                code: "bad_source_range",
                reason: format!(
                    "loadBalancerSourceRanges entry {raw:?} is not a CIDR; it is left out (the others still apply)"
                ),
            }),
        }
    }
    (v4, v6)
}

/// The sources a family's load-balancer IPs accept new connections from: its
/// ranges, extended as the nftables proxier's firewall chain does (when a range
/// contains the node's address, the load-balancer IPs themselves too, for a node
/// that answers its own LB IP with it as the source). Network addresses in network
/// byte order, with prefix lengths, sorted; empty: no check.
fn extend_source_ranges<A: Ip>(
    ranges: &Ranges<A>,
    lb_vips: &BTreeSet<A>,
    node_ip: Option<A>,
) -> Vec<(A::Raw, u8)> {
    let Some(ranges) = ranges else {
        return Vec::new();
    };
    if ranges.is_empty() {
        // Only unusable entries (or none of this family): kube-proxy checks
        // nothing either.
        return Vec::new();
    }
    let mut out = ranges.clone();
    let contains = |ip: A| ranges.iter().any(|&(net, len)| ip.network(len) == net);
    if node_ip.is_some_and(contains) {
        out.extend(lb_vips.iter().map(|ip| (*ip, A::BITS)));
    }
    let mut out: Vec<(A::Raw, u8)> = out.into_iter().map(|(net, len)| (net.raw(), len)).collect();
    out.sort();
    out.dedup();
    out
}

/// The Service's health check, if it needs one (kube-proxy's `newBaseServiceInfo`
/// takes `healthCheckNodePort` when `NeedsHealthCheck`, and logs one that is 0), with
/// its ready endpoints on this node counted by address (`LocalReadyEndpoints`: ready
/// only, since a node with only terminating endpoints should fail the check), for
/// each of the Service's `families` (IPv4, IPv6).
fn health_check(
    spec: &crate::model::ServiceSpecInfo,
    me: &ObjectRef,
    svc_endpoints: Option<&PortEndpoints>,
    families: (bool, bool),
    out: &mut ServiceOut,
) {
    let Some(port) = spec.health_check_node_port else {
        return;
    };
    let port = match u16::try_from(port) {
        Ok(p) if p != 0 => p,
        _ => {
            out.skipped.push(Skipped {
                object: me.clone(),
                code: "bad_health_check_node_port",
                reason: format!(
                    "healthCheckNodePort {port} is not a port (1-65535); the Service has no health check"
                ),
            });
            return;
        }
    };
    let local = |v6: bool| {
        svc_endpoints
            .into_iter()
            .flat_map(|by_port| by_port.values())
            .flat_map(|eps| eps.iter())
            .filter(|((ip, _), facts)| facts.ready && facts.local && ip.is_ipv6() == v6)
            .map(|((ip, _), _)| *ip)
            .collect::<BTreeSet<IpAddr>>()
            .len() as u32
    };
    out.health_checks.push((
        (me.namespace.clone(), me.name.clone()),
        HealthCheck {
            port,
            local4: families.0.then(|| local(false)),
            local6: families.1.then(|| local(true)),
        },
    ));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44: what `loadBalancerSourceRanges` accepts (by family, as networks)
    /// and refuses, with its message.
    #[test]
    fn source_ranges_read_each_cidr_case_as_before() {
        let me = ObjectRef {
            kind: "Service",
            namespace: "default".into(),
            name: "web".into(),
        };
        let got: Vec<String> = crate::compiler::CIDR_CASES
            .iter()
            .map(|s| {
                let spec = ServiceSpecInfo {
                    external_name: false,
                    cluster_ips: Vec::new(),
                    ip_families: Vec::new(),
                    ip_family_policy: None,
                    external_ips: Vec::new(),
                    load_balancer_ips: Vec::new(),
                    load_balancer_source_ranges: vec![s.to_string()],
                    internal_local: false,
                    external_local: false,
                    session_affinity: None,
                    affinity_timeout: None,
                    ports: Vec::new(),
                    health_check_node_port: None,
                };
                let mut skipped = Vec::new();
                let (v4, v6) = parse_source_ranges(&spec, &me, &mut skipped);
                match skipped.as_slice() {
                    [] => format!("{s:?} ok {v4:?} {v6:?}"),
                    [one] => format!("{s:?} err {}: {}", one.code, one.reason),
                    more => panic!("{more:?}"),
                }
            })
            .collect();
        assert_eq!(
            got,
            [
                "\"10.0.0.0/8\" ok Some([(10.0.0.0, 8)]) Some([])",
                "\"10.1.2.3/8\" ok Some([(10.0.0.0, 8)]) Some([])",
                "\"10.0.0.0/+8\" ok Some([(10.0.0.0, 8)]) Some([])",
                "\"10.0.0.0/08\" ok Some([(10.0.0.0, 8)]) Some([])",
                "\"10.0.0.0/0\" ok None Some([])",
                "\"10.0.0.0/00\" ok None Some([])",
                "\"10.0.0.0/32\" ok Some([(10.0.0.0, 32)]) Some([])",
                "\"10.0.0.0/33\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0/33\" is not a CIDR; it is left out (the others still apply)",
                "\"10.0.0.0/256\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0/256\" is not a CIDR; it is left out (the others still apply)",
                "\"10.0.0.0/-1\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0/-1\" is not a CIDR; it is left out (the others still apply)",
                "\"10.0.0.0\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0\" is not a CIDR; it is left out (the others still apply)",
                "\"10.0.0.0/\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0/\" is not a CIDR; it is left out (the others still apply)",
                "\"/8\" err bad_source_range: loadBalancerSourceRanges entry \"/8\" is not a CIDR; it is left out (the others still apply)",
                "\"010.0.0.0/8\" ok Some([(10.0.0.0, 8)]) Some([])",
                "\"10.0.0/8\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0/8\" is not a CIDR; it is left out (the others still apply)",
                "\"x/8\" err bad_source_range: loadBalancerSourceRanges entry \"x/8\" is not a CIDR; it is left out (the others still apply)",
                "\"10.0.0.0/8/9\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0/8/9\" is not a CIDR; it is left out (the others still apply)",
                "\" 10.0.0.0/8 \" ok Some([(10.0.0.0, 8)]) Some([])",
                "\"10.0.0.0 /8\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0 /8\" is not a CIDR; it is left out (the others still apply)",
                "\"10.0.0.0/ 8\" err bad_source_range: loadBalancerSourceRanges entry \"10.0.0.0/ 8\" is not a CIDR; it is left out (the others still apply)",
                "\"fd00::/8\" ok Some([]) Some([(fd00::, 8)])",
                "\"fd00::1/8\" ok Some([]) Some([(fd00::, 8)])",
                "\"fd00::/128\" ok Some([]) Some([(fd00::, 128)])",
                "\"fd00::/129\" err bad_source_range: loadBalancerSourceRanges entry \"fd00::/129\" is not a CIDR; it is left out (the others still apply)",
                "\"fd00::/+8\" ok Some([]) Some([(fd00::, 8)])",
                "\"fd00::/008\" ok Some([]) Some([(fd00::, 8)])",
                "\"::/0\" ok Some([]) None",
                "\"::ffff:10.0.0.0/104\" ok Some([]) Some([(::ffff:10.0.0.0, 104)])",
                "\"fd00::/ 8\" err bad_source_range: loadBalancerSourceRanges entry \"fd00::/ 8\" is not a CIDR; it is left out (the others still apply)",
            ]
        );
    }
}

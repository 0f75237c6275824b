//! One Service with its merged endpoints into the frontends it asks for: its
//! ClusterIPs, external and load-balancer IPs, ports, traffic policies and session
//! affinity.

use std::{
    collections::{BTreeSet, HashMap},
    net::Ipv4Addr,
};

use conventions::validate;
use dataplane_common::{Backend, ServiceKey};

use super::claims::Claim;
use super::slices::{port_number, protocol, EndpointsKey, PortEndpoints};
use super::{
    is_other_proxys, Frontend, FrontendPolicy, HealthCheck, Ignored, ObjectRef, Options,
    ServicePortName, Skipped, DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT,
};
use crate::categorize::{self, EmptyVerdict, EndpointFacts, NodeFacts, PortPolicy};
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
}

impl ServiceOut {
    pub(super) fn is_empty(&self) -> bool {
        self.claims.is_empty()
            && self.skipped.is_empty()
            && self.ignored == Ignored::default()
            && self.health_checks.is_empty()
    }
}

fn service_ref(svc: &ServiceInfo) -> ObjectRef {
    ObjectRef::new("Service", svc.namespace.as_deref(), svc.name.as_deref())
}

pub(super) fn compile_service(
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
        // As kube-proxy reads it (netutils.ParseIPSloppy): a stored ClusterIP may have
        // leading zeros; a file's was refused at the front door.
        match validate::parse_ip_sloppy(ip).ok_or(()) {
            Ok(std::net::IpAddr::V4(v4)) => match validate::translatable(v4.into()) {
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
    let mut lb_vips = BTreeSet::new();
    let external = spec.external_ips.iter().map(|ip| (ip, false));
    let lb = spec.load_balancer_ips.iter().map(|ip| (ip, true));
    for (ip, is_lb) in external.chain(lb) {
        match validate::parse_ip_sloppy(ip).ok_or(()) {
            Ok(std::net::IpAddr::V4(v4)) => match validate::translatable(v4.into()) {
                None => {
                    vips.push((v4, false));
                    if is_lb {
                        lb_vips.insert(v4);
                    }
                }
                Some(why) => out.skipped.push(Skipped {
                    object: me.clone(),
                    code: "refused_external_ip",
                    reason: format!("external IP {v4} {why}; that frontend is skipped"),
                }),
            },
            Ok(std::net::IpAddr::V6(_)) | Err(()) => out.skipped.push(Skipped {
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
        // kube-proxy's `ExternallyAccessible`: a NodePort, an external or a
        // load-balancer IP.
        externally_accessible: vips.iter().any(|(_, is_cluster_ip)| !is_cluster_ip)
            || spec.ports.iter().any(|p| p.node_port.is_some()),
    };
    let affinity_timeout = session_affinity(spec, &me, &mut out.skipped);
    let source_ranges = if lb_vips.is_empty() {
        Vec::new()
    } else {
        source_ranges(spec, &lb_vips, opts, &me, &mut out.skipped)
    };
    let node = NodeFacts {
        name: opts.node_name.as_deref().unwrap_or_default(),
        zone: opts.zone.as_deref().unwrap_or_default(),
    };
    let svc_endpoints = endpoints.get(&(me.namespace.clone(), me.name.clone()));
    health_check(spec, &me, svc_endpoints, out);
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
        let candidates: Vec<(&(Ipv4Addr, u16), &EndpointFacts)> = svc_endpoints
            .and_then(|e| e.get(&(port_name.clone(), proto)))
            .map(|m| m.iter().collect())
            .unwrap_or_default();
        let facts: Vec<&EndpointFacts> = candidates.iter().map(|(_, e)| *e).collect();
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
        let node_ports = node_port
            .into_iter()
            .flat_map(|n| opts.node_port_ips.iter().map(move |ip| (*ip, n)));
        let frontends = vips
            .iter()
            .map(|&(vip, is_cluster_ip)| (vip, number, is_cluster_ip))
            .chain(node_ports.map(|(ip, n)| (ip, n, false)));
        for (vip, number, is_cluster_ip) in frontends {
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
            // Reached from outside: a Maglev table, the same on every node (and
            // nothing without backends, as above).
            let maglev = opts
                .maglev
                .filter(|_| !is_cluster_ip && !backends.is_empty());
            let key = ServiceKey {
                addr_be: u32::from(vip).to_be(),
                port_be: number.to_be(),
                proto,
                scope: 0,
            };
            // loadBalancerSourceRanges guard the load-balancer IPs only (not
            // NodePorts, external IPs or ClusterIPs), from every client.
            let ranges = if lb_vips.contains(&vip) {
                source_ranges.clone()
            } else {
                Vec::new()
            };
            out.claims.push(Claim {
                key,
                frontend: Frontend {
                    service: name.clone(),
                    backends,
                    policy: FrontendPolicy {
                        on_empty,
                        affinity_timeout,
                        source_ranges: !ranges.is_empty(),
                        maglev,
                        // Reached from outside and masqueraded there: direct
                        // server return instead, where asked for.
                        dsr: opts.dsr && !is_cluster_ip,
                    },
                    source_ranges: ranges.clone(),
                },
                order: (u8::from(!is_cluster_ip), svc.created.clone()),
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
                out.claims.push(Claim {
                    key: ServiceKey {
                        scope: dataplane_common::SCOPE_EXTERNAL,
                        ..key
                    },
                    frontend: Frontend {
                        service: name.clone(),
                        policy: FrontendPolicy {
                            on_empty,
                            affinity_timeout,
                            source_ranges: !ranges.is_empty(),
                            maglev: opts.maglev.filter(|_| !local.is_empty()),
                            // The client's address is kept anyway.
                            dsr: false,
                        },
                        backends: to_backends(local),
                        // The ranges are kept under the frontend's entry for all.
                        source_ranges: Vec::new(),
                    },
                    order: (1, svc.created.clone()),
                });
            }
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
                    source_ranges: Vec::new(),
                },
                order: (0, svc.created.clone()),
            });
        }
    }
}

/// The sources a Service's load-balancer IPs accept new connections from, as
/// kube-proxy reads `loadBalancerSourceRanges` (pkg/proxy/serviceport.go: trimmed,
/// parsed as `ParseCIDRSloppy` does, this family's only, a zero-length prefix
/// meaning every source, so no check) and extends them (the nftables proxier's
/// firewall chain: when a range contains the node's address, the load-balancer IPs
/// themselves too, for a node that answers its own LB IP with it as the source).
/// Network addresses in network byte order, with prefix lengths, sorted; empty:
/// no check. A range that does not parse is reported and left out.
fn source_ranges(
    spec: &ServiceSpecInfo,
    lb_vips: &BTreeSet<Ipv4Addr>,
    opts: &Options,
    me: &ObjectRef,
    skipped: &mut Vec<Skipped>,
) -> Vec<(u32, u8)> {
    let mut out = Vec::new();
    for raw in &spec.load_balancer_source_ranges {
        let text = raw.trim();
        let parsed = text.split_once('/').and_then(|(addr, len)| {
            let addr = validate::parse_ip_sloppy(addr)?;
            let len: u8 = len.parse().ok()?;
            Some((addr, len))
        });
        match parsed {
            Some((std::net::IpAddr::V4(addr), len)) if len <= 32 => {
                if len == 0 {
                    return Vec::new();
                }
                out.push((u32::from(addr) & super::prefix_mask(len), len));
            }
            // The other family's ranges are the IPv6 frontends' business.
            Some((std::net::IpAddr::V6(_), len)) if len <= 128 => {}
            _ => skipped.push(Skipped {
                object: me.clone(),
                code: "bad_source_range",
                reason: format!(
                    "loadBalancerSourceRanges entry {raw:?} is not a CIDR; it is left out (the others still apply)"
                ),
            }),
        }
    }
    if out.is_empty() {
        // Only unusable entries: kube-proxy checks nothing either.
        return Vec::new();
    }
    let contains = |ip: Ipv4Addr| {
        out.iter()
            .any(|&(net, len)| u32::from(ip) & super::prefix_mask(len) == net)
    };
    if opts.node_ip.is_some_and(contains) {
        out.extend(lb_vips.iter().map(|ip| (u32::from(*ip), 32)));
    }
    let mut out: Vec<(u32, u8)> = out
        .into_iter()
        .map(|(net, len)| (net.to_be(), len))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The Service's health check, if it needs one (kube-proxy's `newBaseServiceInfo`
/// takes `healthCheckNodePort` when `NeedsHealthCheck`, and logs one that is 0), with
/// its ready endpoints on this node counted by address (`LocalReadyEndpoints`: ready
/// only, since a node with only terminating endpoints should fail the check).
fn health_check(
    spec: &crate::model::ServiceSpecInfo,
    me: &ObjectRef,
    svc_endpoints: Option<&PortEndpoints>,
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
    let local: BTreeSet<Ipv4Addr> = svc_endpoints
        .into_iter()
        .flat_map(|by_port| by_port.values())
        .flat_map(|eps| eps.iter())
        .filter(|(_, facts)| facts.ready && facts.local)
        .map(|((ip, _), _)| *ip)
        .collect();
    out.health_checks.push((
        (me.namespace.clone(), me.name.clone()),
        HealthCheck {
            port,
            local_endpoints: local.len() as u32,
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

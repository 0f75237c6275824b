//! Finding pod interfaces without naming a CNI's prefix (`--interfaces auto`): the
//! host side of a pod's network is, for every CNI that gives pods a host-side
//! interface, either a veth whose peer lives in another network namespace (bridge,
//! ptp, kindnet, flannel, Calico `cali*`, Cilium `lxc*`, AWS VPC CNI `eni*`, Azure
//! CNI `azv*`, GKE `gke*`, OVN-Kubernetes, Antrea), or an interface the node routes a
//! single pod address to (a host route, `/32` or `/128`, with no gateway: what ptp,
//! Calico, the AWS VPC CNI and GKE install per pod), such as a tun device.
//!
//! Never a pod interface: loopback; an uplink (named by `--external-interfaces`, or
//! carrying a default route); a bridge, whose ports are the pods' interfaces; a veth
//! whose peer is in the node's own namespace (Cilium's `cilium_host`/`cilium_net`).
//! kube-proxy tells the pods' traffic apart by `--detect-local-mode`
//! (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/util/localdetector.go),
//! its `InterfaceNamePrefix` mode by a name prefix as `--interfaces` patterns do; this
//! mode needs none.
//!
//! [`find`] is pure, over what [`dump`] reads from rtnetlink.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::netlink;

/// One interface as rtnetlink describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND`: `veth`, `bridge`, `vxlan`, `dummy`, ...; `None` for a
    /// physical device (and tun devices, which say `tun`).
    pub kind: Option<String>,
    /// Whether the link's peer is in another network namespace (`IFLA_LINK_NETNSID`).
    pub peer_elsewhere: bool,
    pub loopback: bool,
}

/// One route of the main table, as rtnetlink describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    pub dst: IpAddr,
    pub dst_len: u8,
    /// The interface it goes out of (`RTA_OIF`).
    pub oif: Option<u32>,
    /// Whether it goes through a gateway (`RTA_GATEWAY`).
    pub gateway: bool,
}

impl RouteInfo {
    fn is_default(&self) -> bool {
        self.dst_len == 0
    }
    fn is_host(&self) -> bool {
        self.dst_len == if self.dst.is_ipv4() { 32 } else { 128 }
    }
}

/// Why an interface was taken for a pod interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// A veth whose peer is in another network namespace.
    Veth,
    /// The node routes a single address (in the cluster's CIDRs, when given) to it.
    HostRoute,
}

/// Why an interface with a pod's marks was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passed {
    /// It carries a default route: the node's uplink.
    DefaultRoute,
    /// `--external-interfaces` names it.
    Uplink,
    /// A bridge: its ports are the pods' interfaces.
    Bridge,
}

/// What [`find`] makes of the node's interfaces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Pod interfaces, by name.
    pub pods: BTreeMap<String, Found>,
    /// Interfaces that looked like pods' and were not taken, with why.
    pub passed: BTreeMap<String, Passed>,
}

/// Which of `links` are pod interfaces. `uplink` says whether `--external-interfaces`
/// names an interface; `cluster`, when not empty, limits host routes to those within
/// it (kube-proxy's `--cluster-cidr`).
pub fn find(
    links: &[LinkInfo],
    routes: &[RouteInfo],
    cluster: &[(IpAddr, u8)],
    uplink: impl Fn(&str) -> bool,
) -> Findings {
    let default: BTreeSet<u32> = routes
        .iter()
        .filter(|r| r.is_default())
        .filter_map(|r| r.oif)
        .collect();
    let routed: BTreeSet<u32> = routes
        .iter()
        .filter(|r| r.is_host() && !r.gateway)
        .filter(|r| cluster.is_empty() || cluster.iter().any(|c| within(r.dst, *c)))
        .filter_map(|r| r.oif)
        .collect();
    let mut out = Findings::default();
    for l in links {
        let found = if l.kind.as_deref() == Some("veth") && l.peer_elsewhere {
            Found::Veth
        } else if routed.contains(&l.index) {
            Found::HostRoute
        } else {
            continue;
        };
        let passed = if l.loopback {
            continue;
        } else if uplink(&l.name) {
            Some(Passed::Uplink)
        } else if default.contains(&l.index) {
            Some(Passed::DefaultRoute)
        } else if l.kind.as_deref() == Some("bridge") {
            Some(Passed::Bridge)
        } else {
            None
        };
        match passed {
            Some(p) => {
                out.passed.insert(l.name.clone(), p);
            }
            None => {
                out.pods.insert(l.name.clone(), found);
            }
        }
    }
    out
}

/// Whether `addr` is within `(net, len)` (same family only).
fn within(addr: IpAddr, (net, len): (IpAddr, u8)) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The interfaces and main-table unicast routes of the calling thread's network
/// namespace, from rtnetlink dumps (`RTM_GETLINK`, `RTM_GETROUTE`).
pub fn dump() -> std::io::Result<(Vec<LinkInfo>, Vec<RouteInfo>)> {
    // The dump requests' bodies: an ifinfomsg or an rtmsg, zeroed but for the family.
    let dump = |kind: u16, family: i32, body_len: usize| {
        let mut body = vec![0u8; body_len];
        body[0] = family as u8;
        netlink::exchange(&netlink::request(kind, netlink::NLM_F_DUMP, &body))
    };
    let mut links = Vec::new();
    for (_, msg) in dump(libc::RTM_GETLINK, libc::AF_UNSPEC, IFINFOMSG_LEN)? {
        if let Some(l) = parse_link(&msg) {
            links.push(l);
        }
    }
    let mut routes = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        for (_, msg) in dump(libc::RTM_GETROUTE, family, RTMSG_LEN)? {
            if let Some(r) = parse_route(&msg) {
                routes.push(r);
            }
        }
    }
    Ok((links, routes))
}

const IFINFOMSG_LEN: usize = 16;
const RTMSG_LEN: usize = 12;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_TABLE: u16 = 15;
const RTA_VIA: u16 = 18;
const RT_TABLE_MAIN: u32 = 254;
const RTN_UNICAST: u8 = 1;

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// An `RTM_NEWLINK` message's body (after its header) as a [`LinkInfo`].
fn parse_link(body: &[u8]) -> Option<LinkInfo> {
    if body.len() < IFINFOMSG_LEN {
        return None;
    }
    let index = u32::from_ne_bytes(body[4..8].try_into().ok()?);
    let flags = u32::from_ne_bytes(body[8..12].try_into().ok()?);
    let mut l = LinkInfo {
        index,
        loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        ..LinkInfo::default()
    };
    for (kind, data) in netlink::attrs(&body[IFINFOMSG_LEN..]) {
        match kind {
            IFLA_IFNAME => l.name = c_string(data),
            IFLA_LINK_NETNSID => l.peer_elsewhere = true,
            IFLA_LINKINFO => {
                for (k, d) in netlink::attrs(data) {
                    if k == IFLA_INFO_KIND {
                        l.kind = Some(c_string(d));
                    }
                }
            }
            _ => {}
        }
    }
    (!l.name.is_empty()).then_some(l)
}

/// An `RTM_NEWROUTE` message's body as a [`RouteInfo`], if a unicast route of the main
/// table.
fn parse_route(body: &[u8]) -> Option<RouteInfo> {
    if body.len() < RTMSG_LEN {
        return None;
    }
    let (family, dst_len, table, rtype) = (body[0], body[1], body[4], body[7]);
    if rtype != RTN_UNICAST {
        return None;
    }
    let mut table = u32::from(table);
    let mut r = RouteInfo {
        dst: match i32::from(family) {
            libc::AF_INET => IpAddr::from([0u8; 4]),
            libc::AF_INET6 => IpAddr::from([0u8; 16]),
            _ => return None,
        },
        dst_len,
        oif: None,
        gateway: false,
    };
    for (kind, data) in netlink::attrs(&body[RTMSG_LEN..]) {
        match kind {
            RTA_DST => {
                r.dst = match data.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(data).ok()?),
                    16 => IpAddr::from(<[u8; 16]>::try_from(data).ok()?),
                    _ => return None,
                }
            }
            RTA_OIF => r.oif = Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?)),
            RTA_GATEWAY | RTA_VIA => r.gateway = true,
            RTA_TABLE => table = u32::from_ne_bytes(data.get(..4)?.try_into().ok()?),
            _ => {}
        }
    }
    (table == RT_TABLE_MAIN).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, kind: Option<&str>, peer_elsewhere: bool) -> LinkInfo {
        LinkInfo {
            index,
            name: name.into(),
            kind: kind.map(Into::into),
            peer_elsewhere,
            loopback: false,
        }
    }

    fn route(dst: &str, len: u8, oif: u32, gateway: bool) -> RouteInfo {
        RouteInfo {
            dst: dst.parse().unwrap(),
            dst_len: len,
            oif: Some(oif),
            gateway,
        }
    }

    /// The host sides of the pods of every CNI the issue names, beside what a node
    /// also has: its uplink, a bridge, tunnels, Cilium's own veth pair, kube-ipvs0.
    #[test]
    fn every_cnis_pod_interfaces_are_found_and_nothing_else() {
        let links = vec![
            LinkInfo {
                loopback: true,
                ..link(1, "lo", None, false)
            },
            link(2, "ens5", None, false),
            link(3, "eni1a2b3c4d5e6", Some("veth"), true), // AWS VPC CNI
            link(4, "azv0123456789a", Some("veth"), true), // Azure CNI
            link(5, "gke0123456789a", Some("veth"), true), // GKE
            link(6, "cali12ab34cd56e", Some("veth"), true), // Calico
            link(7, "lxc0a1b2c3d4e5f", Some("veth"), true), // Cilium
            link(8, "cni0", Some("bridge"), false),        // flannel, bridge
            link(9, "veth1a2b3c4d", Some("veth"), true),   // a cni0 port
            link(10, "veth9f8e7d6c", Some("veth"), true),  // ptp
            link(11, "flannel.1", Some("vxlan"), false),
            link(12, "cilium_host", Some("veth"), false),
            link(13, "cilium_net", Some("veth"), false),
            link(14, "kube-ipvs0", Some("dummy"), false),
            link(15, "tun-pod", Some("tun"), false), // a pod behind a tun, host-routed
            link(16, "tunl0", Some("ipip"), false),
        ];
        let routes = vec![
            route("0.0.0.0", 0, 2, true),
            route("192.168.1.0", 24, 2, false),
            route("10.244.0.0", 24, 8, false),
            route("10.244.0.12", 32, 10, false),
            route("10.244.0.13", 32, 6, false),
            route("10.244.0.14", 32, 15, false),
            route("10.244.1.0", 24, 11, true),
            route("10.244.2.0", 26, 16, true),
            route("10.0.0.0", 8, 13, true),
        ];
        let found = find(&links, &routes, &[], |name| name.starts_with("eth"));
        let pods: Vec<_> = found.pods.iter().map(|(n, f)| (n.as_str(), *f)).collect();
        assert_eq!(
            pods,
            [
                ("azv0123456789a", Found::Veth),
                ("cali12ab34cd56e", Found::Veth),
                ("eni1a2b3c4d5e6", Found::Veth),
                ("gke0123456789a", Found::Veth),
                ("lxc0a1b2c3d4e5f", Found::Veth),
                ("tun-pod", Found::HostRoute),
                ("veth1a2b3c4d", Found::Veth),
                ("veth9f8e7d6c", Found::Veth),
            ]
        );
        assert!(found.passed.is_empty(), "{found:?}");
    }

    #[test]
    fn uplinks_and_bridges_are_passed_with_why() {
        let links = vec![
            link(2, "eth0", Some("veth"), true), // a node in a container: its uplink is a veth
            link(3, "up0", Some("veth"), true),
            link(4, "br0", Some("bridge"), false),
        ];
        let routes = vec![
            route("0.0.0.0", 0, 3, true),
            route("::", 0, 3, true),
            route("10.244.0.5", 32, 4, false),
        ];
        let found = find(&links, &routes, &[], |name| name == "eth0");
        assert!(found.pods.is_empty(), "{found:?}");
        assert_eq!(
            found.passed,
            [
                ("br0".to_string(), Passed::Bridge),
                ("eth0".to_string(), Passed::Uplink),
                ("up0".to_string(), Passed::DefaultRoute),
            ]
            .into()
        );
    }

    #[test]
    fn host_routes_count_within_the_cluster_cidr_when_one_is_given() {
        let links = vec![
            link(5, "tun0", Some("tun"), false),
            link(6, "wg0", Some("wireguard"), false),
        ];
        let routes = vec![
            route("10.244.3.7", 32, 5, false),
            route("192.168.9.9", 32, 6, false),
            route("fd00:10:244::7", 128, 5, false),
            // Through a gateway: another node's pod, not one here.
            route("10.244.9.9", 32, 6, true),
        ];
        let cluster = [
            ("10.244.0.0".parse().unwrap(), 16),
            ("fd00:10:244::".parse().unwrap(), 48),
        ];
        let found = find(&links, &routes, &cluster, |_| false);
        assert_eq!(found.pods.keys().collect::<Vec<_>>(), ["tun0"]);
        let found = find(&links, &routes, &[], |_| false);
        assert_eq!(found.pods.keys().collect::<Vec<_>>(), ["tun0", "wg0"]);
    }

    #[test]
    fn this_namespace_dumps_with_its_loopback() {
        let (links, _routes) = dump().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").expect("lo");
        assert!(lo.loopback);
        assert_eq!(lo.kind, None);
    }
}

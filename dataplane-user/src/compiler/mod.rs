//! The compiler: Services, EndpointSlices and this node's identity in, the desired
//! frontends with their backends out. Pure: no kernel, no clock, no I/O.
//!
//! [`compile`] does it all at once ([`full`]). [`Incremental`] holds the objects
//! between syncs and recompiles only the Services whose Service object or
//! EndpointSlices (by their `kubernetes.io/service-name` label) changed, with the
//! same result: both share the per-slice ([`slices`]) and per-Service ([`service`])
//! steps, and a frontend asked for by two Services goes to the same one either way
//! ([`claims`]). [`output`] is what comes out; [`format`] prints frontends and
//! backends for messages, dumps and the CLI.
//!
//! Semantics follow kube-proxy where it defines them:
//! - which objects are used: kube-proxy's informer selectors skip objects labelled
//!   `service.kubernetes.io/service-proxy-name` and headless Services
//!   (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server.go>);
//! - how slices merge: `pkg/proxy/endpointslicecache.go`
//!   (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointslicecache.go>:
//!   several slices per Service, only `addresses[0]`, parsed sloppily, one copy per
//!   address where a later non-terminating copy wins, ports without a name field or
//!   without a number or with number 0 ignored, nil conditions defaulted: ready ⇒
//!   true, serving ⇒ true, terminating ⇒ false; zone and node hints kept);
//! - which endpoints serve: [`crate::compiler::categorize`] (`CategorizeEndpoints`: traffic
//!   policies, topology hints against this node's zone, the serving-terminating
//!   fallback), and what a frontend without them does (reject, or drop when only
//!   other nodes have endpoints and the policy is `Local`);
//! - session affinity: `pkg/proxy/serviceport.go` (`ClientIP` with its timeout);
//! - dual stack: kube-proxy runs one proxier per family, and each sees a Service
//!   only through its ClusterIP of that family (`GetClusterIPByFamily` in
//!   <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/servicechangetracker.go>:
//!   none, and the Service is not that family's), with that family's external and
//!   load-balancer IPs and source ranges (`newBaseServiceInfo`,
//!   <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/serviceport.go>),
//!   and only the EndpointSlices of its `addressType`
//!   (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointschangetracker.go>).
//!   Here both families compile together: an IPv4 frontend's backends come from
//!   IPv4 slices only, an IPv6 one's from IPv6 slices only.

pub mod categorize;
pub mod cidrs;
mod claims;
pub mod format;
mod full;
mod incremental;
pub mod output;
pub mod prefix;
mod service;
mod slices;

pub use format::{
    any_backend_addr, any_frontend_addr, backend_addr, backend_addr6, frontend_addr,
    frontend_addr6, is_any_clusterip_marker, is_clusterip_marker, is_clusterip_marker6, proto_name,
};
pub use full::{compile, compile_model};
pub use incremental::Incremental;
pub use output::{
    AnyBackend, AnyFrontend, Compiled, Frontend, Frontend6, FrontendKey, FrontendPolicy,
    HealthCheck, Ignored, NoLocalEndpoints, ObjectRef, ServicePortName, Skipped,
    DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT,
};
use prefix::BadPrefix;

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
    /// Where NodePorts are served (kube-proxy's `--nodeport-addresses`).
    pub node_port_addresses: NodePortAddresses,
    /// The addresses NodePorts are served on now, as `node_port_addresses` finds
    /// them (the node's primary address, or its interfaces' addresses in the CIDRs).
    pub node_port_ips: Vec<std::net::Ipv4Addr>,
    /// The IPv6 addresses NodePorts are served on, found as `node_port_ips`.
    pub node_port_ips6: Vec<std::net::Ipv6Addr>,
    /// The node's primary address (its Node object), for `loadBalancerSourceRanges`
    /// that contain it (kube-proxy's `allowFromNode`).
    pub node_ip: Option<std::net::Ipv4Addr>,
    /// The node's primary IPv6 address, as `node_ip` for IPv6's ranges.
    pub node_ip6: Option<std::net::Ipv6Addr>,
    /// The Maglev table size of the frontends traffic from outside reaches
    /// (NodePorts, external and load-balancer IPs), so every node picks the same
    /// backend for a flow; `None` places their slots as a ClusterIP's. `None` here
    /// by default; the agent's is `--maglev-table-size`.
    pub maglev: Option<crate::writer::maglev::TableSize>,
    /// Direct server return for the frontends traffic from outside reaches, where
    /// the uplink program would masquerade (`--external-mode dsr`).
    pub dsr: bool,
}

/// Where NodePorts are served: kube-proxy's `--nodeport-addresses`
/// (pkg/proxy/util/nodeport_addresses.go).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// The node's primary address (its Node object's first `InternalIP`, else
    /// `ExternalIP`): kube-proxy's default, `primary`.
    #[default]
    Primary,
    /// Every address of the node's interfaces within one of these CIDRs
    /// (address, prefix length): IPv4's, then IPv6's; loopback addresses never.
    /// As kube-proxy's `NewNodePortAddresses`
    /// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/util/nodeport_addresses.go>),
    /// a family given no CIDR gets its zero CIDR: every address of that family.
    Cidrs(Vec<(std::net::Ipv4Addr, u8)>, Vec<(std::net::Ipv6Addr, u8)>),
}

impl NodePortAddresses {
    /// `--nodeport-addresses`, as kube-proxy's `nodePortAddresses`
    /// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server.go>
    /// `expandNodePortAddressKeywords`): comma-separated CIDRs of either family and
    /// the keywords `all` (the zero CIDRs) and `localhost` (the loopback CIDRs, which
    /// serve no NodePort here: see [`NodePortAddresses::matching`]), each keyword
    /// once; or `primary` alone, which is also what nothing means (kube-proxy's
    /// nftables default). `primary` combined with CIDRs is refused: the node's
    /// primary address comes from its Node object, the CIDRs' from its interfaces.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s == "primary" {
            return Ok(Self::Primary);
        }
        let mut keywords = std::collections::BTreeSet::new();
        let mut literal = Vec::new();
        for part in s.split(',').map(str::trim) {
            match part {
                "primary" | "all" | "localhost" => {
                    if !keywords.insert(part) {
                        return Err(format!("{part:?} is given twice"));
                    }
                }
                _ => literal.push(part),
            }
        }
        if keywords.contains("primary") {
            return Err(
                "\"primary\" cannot be combined with CIDRs or other keywords here; give it alone, or give CIDRs"
                    .into(),
            );
        }
        if keywords.contains("all") {
            literal.extend(["0.0.0.0/0", "::/0"]);
        }
        if keywords.contains("localhost") {
            literal.extend(["127.0.0.0/8", "::1/128"]);
        }
        let mut cidrs = Vec::new();
        let mut cidrs6 = Vec::new();
        let syntax = prefix::Syntax {
            address: prefix::exact,
            canonical_length: false,
        };
        for part in literal {
            match prefix::parse(part, syntax) {
                Ok((std::net::IpAddr::V4(addr), len)) => cidrs.push((addr, len)),
                Ok((std::net::IpAddr::V6(addr), len)) => cidrs6.push((addr, len)),
                Err(BadPrefix::NoLength) => {
                    return Err(format!("{part:?} is not a CIDR (address/length)"))
                }
                Err(BadPrefix::Address(addr)) => {
                    return Err(format!("{part:?}: {addr:?} is not an IP address"))
                }
                Err(BadPrefix::Length { max, .. }) => {
                    return Err(format!("{part:?}: the prefix length must be 0 to {max}"))
                }
            }
        }
        if cidrs.is_empty() {
            cidrs.push((std::net::Ipv4Addr::UNSPECIFIED, 0));
        }
        if cidrs6.is_empty() {
            cidrs6.push((std::net::Ipv6Addr::UNSPECIFIED, 0));
        }
        Ok(Self::Cidrs(cidrs, cidrs6))
    }

    /// The addresses of `interface_addrs` within the CIDRs (none in `Primary` mode),
    /// loopback left out as kube-proxy's nftables proxier leaves it out of its
    /// `nodeport-ips` set (`syncProxyRules`,
    /// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go>).
    pub fn matching(&self, interface_addrs: &[std::net::Ipv4Addr]) -> Vec<std::net::Ipv4Addr> {
        let Self::Cidrs(cidrs, _) = self else {
            return Vec::new();
        };
        let mut out = within_any(interface_addrs, cidrs, |a| u128::from(u32::from(a)) << 96);
        out.retain(|a| !a.is_loopback());
        out
    }

    /// The IPv6 addresses of `interface_addrs` within the IPv6 CIDRs (none in
    /// `Primary` mode).
    pub fn matching6(&self, interface_addrs: &[std::net::Ipv6Addr]) -> Vec<std::net::Ipv6Addr> {
        let Self::Cidrs(_, cidrs) = self else {
            return Vec::new();
        };
        let mut out = within_any(interface_addrs, cidrs, u128::from);
        out.retain(|a| !a.is_loopback());
        out
    }
}

/// The addresses within any of `cidrs` (network, prefix length), sorted, once each;
/// `bits` puts an address's bits at the top of a `u128`, so a prefix of `len` bits
/// is the top `len` bits for either family.
fn within_any<A: Copy + Ord>(addrs: &[A], cidrs: &[(A, u8)], bits: impl Fn(A) -> u128) -> Vec<A> {
    let within = |ip: A, (net, len): (A, u8)| {
        let mask = prefix_mask6(len);
        bits(ip) & mask == bits(net) & mask
    };
    let mut out: Vec<A> = addrs
        .iter()
        .copied()
        .filter(|ip| cidrs.iter().any(|c| within(*ip, *c)))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The IPv6 netmask of a prefix of `len` bits (0 to 128).
pub(crate) fn prefix_mask6(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// The IPv4 netmask of a prefix of `len` bits (0 to 32), host order.
pub(crate) fn prefix_mask(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

/// Whether a `service-proxy-name` label hands the object to another proxy.
fn is_other_proxys(label: Option<&String>, opts: &Options) -> bool {
    match label {
        None => false,
        Some(v) => opts.proxy_name.as_deref() != Some(v.as_str()),
    }
}

/// Address/length texts that the CIDR readers' tests put to each reader (issue 44:
/// each reader accepts and refuses exactly these as it did before they shared one
/// core): signs, leading zeros, host bits, lengths past the family, spaces.
#[cfg(test)]
pub(crate) const CIDR_CASES: &[&str] = &[
    "10.0.0.0/8",
    "10.1.2.3/8",
    "10.0.0.0/+8",
    "10.0.0.0/08",
    "10.0.0.0/0",
    "10.0.0.0/00",
    "10.0.0.0/32",
    "10.0.0.0/33",
    "10.0.0.0/256",
    "10.0.0.0/-1",
    "10.0.0.0",
    "10.0.0.0/",
    "/8",
    "010.0.0.0/8",
    "10.0.0/8",
    "x/8",
    "10.0.0.0/8/9",
    " 10.0.0.0/8 ",
    "10.0.0.0 /8",
    "10.0.0.0/ 8",
    "fd00::/8",
    "fd00::1/8",
    "fd00::/128",
    "fd00::/129",
    "fd00::/+8",
    "fd00::/008",
    "::/0",
    "::ffff:10.0.0.0/104",
    "fd00::/ 8",
];

#[cfg(test)]
mod tests {
    use super::{NodePortAddresses, CIDR_CASES};

    /// Issue 44: what `--nodeport-addresses` accepts and refuses, with its messages.
    #[test]
    fn nodeport_addresses_read_each_cidr_case_as_before() {
        let got: Vec<String> = CIDR_CASES
            .iter()
            .map(|s| match NodePortAddresses::parse(s) {
                Ok(NodePortAddresses::Cidrs(v4, v6)) => format!("{s:?} ok {v4:?} {v6:?}"),
                Ok(NodePortAddresses::Primary) => format!("{s:?} primary"),
                Err(e) => format!("{s:?} err {e}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                "\"10.0.0.0/8\" ok [(10.0.0.0, 8)] [(::, 0)]",
                "\"10.1.2.3/8\" ok [(10.1.2.3, 8)] [(::, 0)]",
                "\"10.0.0.0/+8\" ok [(10.0.0.0, 8)] [(::, 0)]",
                "\"10.0.0.0/08\" ok [(10.0.0.0, 8)] [(::, 0)]",
                "\"10.0.0.0/0\" ok [(10.0.0.0, 0)] [(::, 0)]",
                "\"10.0.0.0/00\" ok [(10.0.0.0, 0)] [(::, 0)]",
                "\"10.0.0.0/32\" ok [(10.0.0.0, 32)] [(::, 0)]",
                "\"10.0.0.0/33\" err \"10.0.0.0/33\": the prefix length must be 0 to 32",
                "\"10.0.0.0/256\" err \"10.0.0.0/256\": the prefix length must be 0 to 32",
                "\"10.0.0.0/-1\" err \"10.0.0.0/-1\": the prefix length must be 0 to 32",
                "\"10.0.0.0\" err \"10.0.0.0\" is not a CIDR (address/length)",
                "\"10.0.0.0/\" err \"10.0.0.0/\": the prefix length must be 0 to 32",
                "\"/8\" err \"/8\": \"\" is not an IP address",
                "\"010.0.0.0/8\" err \"010.0.0.0/8\": \"010.0.0.0\" is not an IP address",
                "\"10.0.0/8\" err \"10.0.0/8\": \"10.0.0\" is not an IP address",
                "\"x/8\" err \"x/8\": \"x\" is not an IP address",
                "\"10.0.0.0/8/9\" err \"10.0.0.0/8/9\": the prefix length must be 0 to 32",
                "\" 10.0.0.0/8 \" ok [(10.0.0.0, 8)] [(::, 0)]",
                "\"10.0.0.0 /8\" err \"10.0.0.0 /8\": \"10.0.0.0 \" is not an IP address",
                "\"10.0.0.0/ 8\" err \"10.0.0.0/ 8\": the prefix length must be 0 to 32",
                "\"fd00::/8\" ok [(0.0.0.0, 0)] [(fd00::, 8)]",
                "\"fd00::1/8\" ok [(0.0.0.0, 0)] [(fd00::1, 8)]",
                "\"fd00::/128\" ok [(0.0.0.0, 0)] [(fd00::, 128)]",
                "\"fd00::/129\" err \"fd00::/129\": the prefix length must be 0 to 128",
                "\"fd00::/+8\" ok [(0.0.0.0, 0)] [(fd00::, 8)]",
                "\"fd00::/008\" ok [(0.0.0.0, 0)] [(fd00::, 8)]",
                "\"::/0\" ok [(0.0.0.0, 0)] [(::, 0)]",
                "\"::ffff:10.0.0.0/104\" ok [(0.0.0.0, 0)] [(::ffff:10.0.0.0, 104)]",
                "\"fd00::/ 8\" err \"fd00::/ 8\": the prefix length must be 0 to 128",
            ]
        );
    }

    /// `--nodeport-addresses` picks, per family, the interface addresses within its
    /// CIDRs of that family (kube-proxy's pkg/proxy/util/nodeport_addresses.go):
    /// prefix boundaries, both families from one flag, sorted and once each.
    #[test]
    fn nodeport_addresses_match_each_family_within_its_cidrs() {
        let cidrs = NodePortAddresses::parse("10.0.0.0/8,192.168.1.0/31,fd00:10::/64").unwrap();
        let v4 = [
            "10.1.2.3",
            "192.168.1.1",
            "192.168.1.2",
            "11.0.0.1",
            "10.1.2.3",
        ]
        .map(|a| a.parse().unwrap());
        assert_eq!(
            cidrs.matching(&v4),
            ["10.1.2.3", "192.168.1.1"].map(|a| a.parse::<std::net::Ipv4Addr>().unwrap())
        );
        let v6 = ["fd00:10::1", "fd00:10:0:1::1", "fd00:10::ffff", "fe80::1"]
            .map(|a| a.parse().unwrap());
        assert_eq!(
            cidrs.matching6(&v6),
            ["fd00:10::1", "fd00:10::ffff"].map(|a| a.parse::<std::net::Ipv6Addr>().unwrap())
        );
        assert!(NodePortAddresses::Primary.matching6(&v6).is_empty());
        let all = NodePortAddresses::parse("0.0.0.0/0,::/0").unwrap();
        assert_eq!(all.matching(&v4).len(), 4);
        assert_eq!(all.matching6(&v6).len(), 4);
    }

    /// kube-proxy's forms: unset is `primary` (its nftables default); `all` is the
    /// zero CIDRs and `localhost` the loopback ones, once each and beside CIDRs; a
    /// family given no CIDR gets its zero CIDR; loopback never serves NodePorts
    /// (even when a CIDR names it: the nftables proxier skips it).
    #[test]
    fn nodeport_addresses_take_kube_proxys_forms() {
        assert_eq!(NodePortAddresses::parse(""), Ok(NodePortAddresses::Primary));
        assert_eq!(
            NodePortAddresses::parse(" primary "),
            Ok(NodePortAddresses::Primary)
        );
        let all = NodePortAddresses::parse("all").unwrap();
        assert_eq!(all, NodePortAddresses::parse("0.0.0.0/0,::/0").unwrap());
        assert_eq!(
            NodePortAddresses::parse("localhost, 10.0.0.0/8").unwrap(),
            NodePortAddresses::parse("10.0.0.0/8,127.0.0.0/8,::1/128").unwrap()
        );
        assert!(NodePortAddresses::parse("all,all").is_err());
        assert!(NodePortAddresses::parse("primary,10.0.0.0/8").is_err());
        let v4_only = NodePortAddresses::parse("10.0.0.0/8").unwrap();
        let v6 = ["fd00::1", "::1", "2001:db8::1"].map(|a| a.parse().unwrap());
        assert_eq!(
            v4_only.matching6(&v6),
            ["2001:db8::1", "fd00::1"].map(|a| a.parse::<std::net::Ipv6Addr>().unwrap()),
            "IPv6 given no CIDR: all of it but loopback"
        );
        let with_loopback = NodePortAddresses::parse("127.0.0.0/8,10.0.0.0/8").unwrap();
        let v4 = ["127.0.0.1", "10.0.0.1"].map(|a| a.parse().unwrap());
        assert_eq!(
            with_loopback.matching(&v4),
            ["10.0.0.1".parse::<std::net::Ipv4Addr>().unwrap()]
        );
        assert_eq!(all.matching(&v4).len(), 1);
    }
}

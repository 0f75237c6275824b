//! The baselines: the rules kube-proxy would write for the benchmark's Services, in
//! its iptables mode and its nftables mode: whole tables, in the text and the order
//! of kube-proxy v1.37.2, the version the upstream kit builds and figure 7 runs.
//!
//! The benchmark's Services are ClusterIP Services with one TCP port, no session
//! affinity, no NodePort, external IP or load balancer, and endpoints on no node of
//! kube-proxy's own (none is local). kube-proxy is taken as the cluster lab runs it:
//! `--cluster-cidr=10.244.0.0/16` ([`CLUSTER_CIDR`]: local traffic is detected by
//! cluster CIDR, so pod-to-Service traffic is not masqueraded), the service CIDR
//! 10.96.0.0/16 ([`SERVICE_CIDR`]), everything else at its defaults.
//!
//! - iptables:
//!   <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/iptables/proxier.go>,
//!   `syncProxyRules` (one restore of the filter and nat tables: the top-level chains,
//!   then each Service's KUBE-SERVICES rule, its chain and its endpoint chains, then
//!   the stale chains' deletion and the NodePorts jump last), `writeServiceToEndpointRules`,
//!   `servicePortPolicyClusterChain`, `servicePortEndpointChainName`,
//!   `computeProbability`, `appendServiceCommentLocked` (large cluster mode, see
//!   [`large_cluster`]); `iptablesJumpChains` and `iptablesKubeletJumpChains`, the
//!   jumps from the built-in chains that kube-proxy inserts with `iptables -I` before
//!   its first restore, and the canary chain its monitor creates in the mangle, nat
//!   and filter tables at start
//!   (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/util/iptables/iptables.go>,
//!   `Monitor`). Loaded as kube-proxy loads it, `iptables-restore --noflush --counters`.
//!   The one rule that depends on the kernel is KUBE-FORWARD's drop of INVALID
//!   packets: see [`Nfacct`].
//! - nftables:
//!   <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go>,
//!   `setupNFTables` (table `ip kube-proxy`, its base chains, sets, maps and fixed
//!   rules), `syncProxyRules`, `writeServiceToEndpointDNATs` (without session affinity
//!   a Service has no endpoint chains: its chain is one DNAT rule, `numgen random mod
//!   N map` over the endpoints' `addr . port`), `servicePortChainNameBase`,
//!   `hashAndTruncate`, written as the transaction kube-proxy's
//!   `sigs.k8s.io/knftables` v0.0.22 renders (`add`, `flush`, `delete` commands
//!   against the table: <https://github.com/kubernetes-sigs/knftables/blob/v0.0.22/objects.go>).
//!   kube-proxy v1.37 sends that transaction over netlink (feature gate
//!   `NFTablesNetlink`, on by default); the benchmark loads the same commands with
//!   `nft -f`.
//!
//! Besides the full syncs ([`iptables_full`], [`nft_full`]), the syncs kube-proxy
//! makes after one endpoint of one Service was replaced: a partial restore
//! ([`iptables_partial`]: `syncProxyRules` without `doFullSync`, the unchanged
//! Services' chains skipped) and a transaction that rewrites the Service's chain alone
//! ([`nft_partial`]: `syncProxyRules`, `skipServiceUpdate`).
//!
//! What the generator cannot know is left out: the node's own addresses, which
//! kube-proxy's nftables mode puts in its `nodeport-ips` set (NodePorts accepted on
//! the node's primary address, the default `--nodeport-addresses` of that mode), and
//! the `kubernetes` Service of the API server. `bench/tests/kube_proxy_rules.rs`
//! compares these rules, whole tables, with the ones the kit's kube-proxy writes in
//! the cluster lab, in both modes.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::model::Svc;

/// The cluster CIDR kube-proxy is told about: the lab's pods live in 10.244.0.0/16.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// The lab's service CIDR (its `kubernetes` ServiceCIDR), which kube-proxy's nftables
/// mode drops traffic to unless it is to a ClusterIP it serves
/// (`OnServiceCIDRsChanged`). The model's ClusterIPs ([`crate::model::vip`]) are in it
/// up to 64,000 Services; the rule that names it only sees packets that no Service
/// rule translated.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// kube-proxy's masquerade mark, `fmt.Sprintf("%#08x", 1<<14)` (`--masquerade-bit` 14).
const MASQ_MARK: &str = "0x00004000";

/// RFC 4648 base32 (the alphabet of Go's `base32.StdEncoding`) of SHA-256(`s`), first
/// `len` characters.
fn sha256_base32(s: &str, len: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let hash = Sha256::digest(s.as_bytes());
    let mut out = String::with_capacity(len);
    let (mut acc, mut bits) = (0u64, 0u32);
    for byte in hash.iter() {
        acc = (acc << 8) | *byte as u64;
        bits += 8;
        while bits >= 5 && out.len() < len {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
        if out.len() == len {
            break;
        }
    }
    out
}

/// `KUBE-SVC-` + portProtoHash(servicePortName, protocol).
pub fn svc_chain(s: &Svc) -> String {
    format!(
        "KUBE-SVC-{}",
        sha256_base32(&format!("{}tcp", s.port_name_string()), 16)
    )
}

/// `KUBE-SEP-` + hash(servicePortName + protocol + endpoint).
pub fn sep_chain(s: &Svc, ep: &(Ipv4Addr, u16)) -> String {
    format!(
        "KUBE-SEP-{}",
        sha256_base32(&format!("{}tcp{}:{}", s.port_name_string(), ep.0, ep.1), 16)
    )
}

/// `computeProbability`: `fmt.Sprintf("%0.10f", 1.0/float64(n))`.
fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// kube-proxy's `largeClusterEndpointsThreshold`.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// kube-proxy's "large cluster mode" (`proxier.largeClusterMode`): more than
/// [`LARGE_CLUSTER_ENDPOINTS`] endpoints over all Service ports. In it kube-proxy
/// leaves out the comments of the rules that name an endpoint (the Service chain's
/// jumps to the endpoint chains and both rules of each endpoint chain), which upstream
/// says cuts the rules by 40% and more, skips its periodic full syncs, and deletes
/// stale chains only once per sync period (`syncPeriod`, 30 s by default). Its test:
/// `TestSyncProxyRulesLargeClusterMode`.
pub fn large_cluster(services: &[Svc]) -> bool {
    services.iter().map(|s| s.endpoints.len()).sum::<usize>() > LARGE_CLUSTER_ENDPOINTS
}

/// The endpoints of `s` in kube-proxy's order, which the Service chain's jumps (and
/// their probabilities) and the nftables DNAT map's indices follow: by their `ip:port`
/// string, so 10.0.0.10:80 comes before 10.0.0.9:80, whatever the order of `s.endpoints`
/// (`endpointsMapFromEndpointInfo` sorts each Service port's endpoints `byEndpoint`,
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointslicecache.go>).
fn kube_proxy_order(s: &Svc) -> Vec<&(Ipv4Addr, u16)> {
    let mut eps: Vec<(String, &(Ipv4Addr, u16))> = s
        .endpoints
        .iter()
        .map(|e| (format!("{}:{}", e.0, e.1), e))
        .collect();
    eps.sort_by(|a, b| a.0.cmp(&b.0));
    eps.into_iter().map(|(_, e)| e).collect()
}

/// The endpoints of `a` that `b` lacks.
fn only_in<'a>(a: &'a Svc, b: &Svc) -> Vec<&'a (Ipv4Addr, u16)> {
    a.endpoints
        .iter()
        .filter(|e| !b.endpoints.contains(e))
        .collect()
}

// ------------------------------------------------------------------------ iptables

/// The nfacct counter of kube-proxy's rule that drops INVALID packets in KUBE-FORWARD
/// (`metrics.IPTablesCTStateInvalidDroppedNFAcctCounter`).
pub const NFACCT_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// The other counter kube-proxy ensures in every full sync (its localhost NodePorts
/// rules use it; the benchmark's Services have none).
const NFACCT_LOCALHOST_NODEPORTS: &str = "localhost_nps_accepted_pkts";

/// Whether kube-proxy's INVALID drop rule counts with nfacct.
///
/// It depends on the kernel: kube-proxy adds `-m nfacct --nfacct-name
/// ct_state_invalid_dropped_pkts` to the rule only when it has that counter. At start
/// it probes the kernel's nfnetlink_acct (`nfacct.New`,
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/util/nfacct/nfacct_linux.go>:
/// a kernel without it leaves kube-proxy without nfacct), and every full sync creates
/// the counter if it is missing (`Ensure`); without nfacct, or when that fails, the
/// rule is `-m conntrack --ctstate INVALID -j DROP` (`syncProxyRules`,
/// `proxier.nfAcctCounters`). nfacct objects belong to a network namespace, and the
/// kernel refuses a rule that names a counter the namespace lacks, so the nfacct form
/// loads only where the counter was created first: [`ensure_nfacct_counters`] does
/// that, as kube-proxy does in its own namespace, and tells which form to write.
/// [`iptables_full`] and [`iptables_partial`] write the form without nfacct, which
/// loads anywhere; it differs from the other only for packets conntrack finds
/// INVALID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nfacct {
    /// No nfacct (the kernel lacks it): `-j DROP` alone.
    Absent,
    /// The counter exists in the namespace the rules are loaded into.
    Counted,
}

/// kube-proxy's `nfacct.Ensure` of its two counters, in the network namespace of the
/// calling thread: creates each that is missing. [`Nfacct::Absent`] when the kernel
/// has no nfacct (no netfilter netlink, or no nfnetlink_acct subsystem in it).
pub fn ensure_nfacct_counters() -> Result<Nfacct> {
    for name in [NFACCT_INVALID_DROPPED, NFACCT_LOCALHOST_NODEPORTS] {
        match nfacct_new(name).with_context(|| format!("creating nfacct counter {name}"))? {
            Some(0 | libc::EEXIST) => {}
            // No such netlink protocol, or no nfacct subsystem behind it.
            None | Some(libc::EINVAL | libc::EOPNOTSUPP) => return Ok(Nfacct::Absent),
            Some(errno) => bail!(
                "creating nfacct counter {name}: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
        }
    }
    Ok(Nfacct::Counted)
}

/// Sends `NFNL_MSG_ACCT_NEW` for counter `name` (exclusive create, acknowledged) on a
/// netfilter netlink socket; the errno of the kernel's answer (0: created), or `None`
/// when the kernel has no netfilter netlink.
fn nfacct_new(name: &str) -> Result<Option<i32>> {
    const NFNL_SUBSYS_ACCT: u16 = 7;
    const NFNL_MSG_ACCT_NEW: u16 = 0;
    const NFACCT_NAME: u16 = 1;
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) {
            return Ok(None);
        }
        return Err(e).context("opening a netfilter netlink socket");
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let fd = socket.as_raw_fd();

    // nlmsghdr, nfgenmsg (AF_UNSPEC, NFNETLINK_V0, res_id 0), then NFACCT_NAME.
    let mut attr = name.as_bytes().to_vec();
    attr.push(0);
    let attr_len = 4 + attr.len();
    attr.resize(attr_len.next_multiple_of(4) - 4, 0);
    let len = 16 + 4 + 4 + attr.len();
    let flags = libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_EXCL;
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&((NFNL_SUBSYS_ACCT << 8) | NFNL_MSG_ACCT_NEW).to_ne_bytes());
    msg.extend_from_slice(&(flags as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    msg.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    msg.extend_from_slice(&NFACCT_NAME.to_ne_bytes());
    msg.extend_from_slice(&attr);

    // SAFETY: a zeroed sockaddr_nl is valid; pid 0 and groups 0 address the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `msg` and `kernel` outlive the call; the lengths are theirs.
    let sent = unsafe {
        libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error()).context("sending to netfilter netlink");
    }
    let mut reply = [0u8; 512];
    // SAFETY: `reply` outlives the call and is as long as passed.
    let n = unsafe { libc::recv(fd, reply.as_mut_ptr().cast(), reply.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error()).context("reading netfilter netlink");
    }
    // The acknowledgement: nlmsghdr of type NLMSG_ERROR, then nlmsgerr's error.
    let reply = &reply[..n as usize];
    let field = |at: usize| -> Option<[u8; 4]> { reply.get(at..at + 4)?.try_into().ok() };
    let (Some(kind), Some(error)) = (reply.get(4..6), field(16)) else {
        bail!("a short answer from netfilter netlink ({n} bytes)");
    };
    if u16::from_ne_bytes([kind[0], kind[1]]) != libc::NLMSG_ERROR as u16 {
        bail!("netfilter netlink answered with a message of type {kind:?}, not an acknowledgement");
    }
    Ok(Some(-i32::from_ne_bytes(error)))
}

/// `appendServiceCommentLocked`: the comment match, or nothing in large cluster mode.
fn endpoint_comment(large: bool, comment: &str) -> String {
    if large {
        String::new()
    } else {
        format!(" -m comment --comment {comment}")
    }
}

/// The iptables-restore input of a full sync, with the INVALID drop rule of a kernel
/// without nfacct (see [`Nfacct`]; [`iptables_full_with`] for the other). `base_jumps`
/// adds what kube-proxy installs apart from its restores, before the first one: the
/// jumps from the built-in chains (`iptables -I`) and the canary chains (a fresh
/// namespace has none of them).
pub fn iptables_full(services: &[Svc], base_jumps: bool) -> String {
    iptables_full_with(services, base_jumps, Nfacct::Absent)
}

/// [`iptables_full`] with the INVALID drop rule of `nfacct`.
pub fn iptables_full_with(services: &[Svc], base_jumps: bool, nfacct: Nfacct) -> String {
    let mut out = String::with_capacity(services.len() * 1200);
    if base_jumps {
        // The monitor's canaries: mangle first (`Monitor`'s order: mangle, nat, filter).
        out.push_str("*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n");
    }
    write_filter(&mut out, base_jumps, nfacct);
    write_nat_head(&mut out, base_jumps);
    for s in services {
        write_svc_chain_lines(&mut out, s);
    }
    if base_jumps {
        write_base_jumps(&mut out, "nat");
    }
    write_nat_fixed(&mut out);
    let large = large_cluster(services);
    for s in services {
        write_services_rule(&mut out, s);
        write_svc_rules(&mut out, s, large);
    }
    write_nodeports_rule(&mut out);
    out.push_str("COMMIT\n");
    out
}

/// The iptables-restore input of kube-proxy's partial sync (`MinimizeIPTablesRestore`,
/// on by default since 1.27) after one endpoint of `changed` was replaced (`stale` is
/// the Service before), with the INVALID drop rule of a kernel without nfacct (see
/// [`Nfacct`]; [`iptables_partial_with`] for the other): the filter table and the
/// nat table's top-level chains in full (every Service's KUBE-SERVICES rule), of the
/// Services' chains only the changed one's, with all its endpoint chains, and the
/// stale endpoint chain deleted. In large cluster mode the stale chain is left
/// (kube-proxy deletes stale chains there once per sync period, not in every sync;
/// this is a change within one).
pub fn iptables_partial(services: &[Svc], changed: usize, stale: &Svc) -> String {
    iptables_partial_with(services, changed, stale, Nfacct::Absent)
}

/// [`iptables_partial`] with the INVALID drop rule of `nfacct`.
pub fn iptables_partial_with(
    services: &[Svc],
    changed: usize,
    stale: &Svc,
    nfacct: Nfacct,
) -> String {
    let large = large_cluster(services);
    let gone = if large {
        Vec::new()
    } else {
        only_in(stale, &services[changed])
    };
    let mut out = String::with_capacity(services.len() * 200);
    write_filter(&mut out, false, nfacct);
    write_nat_head(&mut out, false);
    write_svc_chain_lines(&mut out, &services[changed]);
    for ep in &gone {
        let _ = writeln!(out, ":{} - [0:0]", sep_chain(stale, ep));
    }
    write_nat_fixed(&mut out);
    for (i, s) in services.iter().enumerate() {
        write_services_rule(&mut out, s);
        if i == changed {
            write_svc_rules(&mut out, s, large);
        }
    }
    for ep in &gone {
        let _ = writeln!(out, "-X {}", sep_chain(stale, ep));
    }
    write_nodeports_rule(&mut out);
    out.push_str("COMMIT\n");
    out
}

/// The filter table, which every sync writes whole: its top-level chains, the
/// kubelet's KUBE-FIREWALL rule kube-proxy keeps a copy of (`localhostNodePorts`, on by
/// default), the KUBE-FORWARD rules.
fn write_filter(out: &mut String, base_jumps: bool, nfacct: Nfacct) {
    out.push_str("*filter\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
        "KUBE-FIREWALL",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    if base_jumps {
        out.push_str(":KUBE-PROXY-CANARY - [0:0]\n");
        write_base_jumps(out, "filter");
    }
    out.push_str("-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n");
    // Not `nf_conntrack_tcp_be_liberal` (0 in a new namespace): INVALID packets dropped.
    out.push_str("-A KUBE-FORWARD -m conntrack --ctstate INVALID");
    if nfacct == Nfacct::Counted {
        let _ = write!(out, " -m nfacct --nfacct-name {NFACCT_INVALID_DROPPED}");
    }
    out.push_str(" -j DROP\n");
    let _ = writeln!(out, "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT");
    out.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n");
    out.push_str("COMMIT\n");
}

/// `iptablesJumpChains` then `iptablesKubeletJumpChains`: table, built-in chain, the
/// chain it jumps to, extra matches, comment.
const BASE_JUMPS: [(&str, &str, &str, &str, &str); 14] = [
    (
        "filter",
        "INPUT",
        "KUBE-EXTERNAL-SERVICES",
        CT_NEW,
        "kubernetes externally-visible service portals",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-EXTERNAL-SERVICES",
        CT_NEW,
        "kubernetes externally-visible service portals",
    ),
    (
        "filter",
        "INPUT",
        "KUBE-NODEPORTS",
        "",
        "kubernetes health check service ports",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-SERVICES",
        CT_NEW,
        "kubernetes service portals",
    ),
    (
        "filter",
        "OUTPUT",
        "KUBE-SERVICES",
        CT_NEW,
        "kubernetes service portals",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-FORWARD",
        "",
        "kubernetes forwarding rules",
    ),
    (
        "filter",
        "INPUT",
        "KUBE-PROXY-FIREWALL",
        CT_NEW,
        "kubernetes load balancer firewall",
    ),
    (
        "filter",
        "OUTPUT",
        "KUBE-PROXY-FIREWALL",
        CT_NEW,
        "kubernetes load balancer firewall",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-PROXY-FIREWALL",
        CT_NEW,
        "kubernetes load balancer firewall",
    ),
    (
        "nat",
        "OUTPUT",
        "KUBE-SERVICES",
        "",
        "kubernetes service portals",
    ),
    (
        "nat",
        "PREROUTING",
        "KUBE-SERVICES",
        "",
        "kubernetes service portals",
    ),
    (
        "nat",
        "POSTROUTING",
        "KUBE-POSTROUTING",
        "",
        "kubernetes postrouting rules",
    ),
    ("filter", "INPUT", "KUBE-FIREWALL", "", ""),
    ("filter", "OUTPUT", "KUBE-FIREWALL", "", ""),
];
const CT_NEW: &str = " -m conntrack --ctstate NEW";

/// The jumps of [`BASE_JUMPS`] of `table`. kube-proxy inserts each at the top of its
/// built-in chain (`EnsureRule(Prepend, ...)`), so each chain has them in the reverse
/// of the list's order.
fn write_base_jumps(out: &mut String, table: &str) {
    for (_, chain, target, extra, comment) in BASE_JUMPS.iter().rev().filter(|j| j.0 == table) {
        let _ = write!(out, "-A {chain}{extra}");
        if !comment.is_empty() {
            let _ = write!(out, " -m comment --comment \"{comment}\"");
        }
        let _ = writeln!(out, " -j {target}");
    }
}

/// The nat table's header and top-level chains (and, with `base_jumps`, the canary).
fn write_nat_head(out: &mut String, base_jumps: bool) {
    out.push_str("*nat\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    if base_jumps {
        out.push_str(":KUBE-PROXY-CANARY - [0:0]\n");
    }
}

/// The chain lines of a Service: its chain, then its endpoints' chains.
fn write_svc_chain_lines(out: &mut String, s: &Svc) {
    let _ = writeln!(out, ":{} - [0:0]", svc_chain(s));
    for ep in kube_proxy_order(s) {
        let _ = writeln!(out, ":{} - [0:0]", sep_chain(s, ep));
    }
}

fn write_nat_fixed(out: &mut String) {
    let _ = writeln!(
        out,
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"
    );
    let _ = writeln!(out, "-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}");
    out.push_str("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n");
    let _ = writeln!(out, "-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}");
}

/// A Service's KUBE-SERVICES rule.
fn write_services_rule(out: &mut String, s: &Svc) {
    let _ = writeln!(
        out,
        "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\" -m tcp -p tcp -d {} --dport {} -j {}",
        s.port_name_string(),
        s.vip,
        s.port,
        svc_chain(s)
    );
}

/// The last rule of KUBE-SERVICES: NodePorts on every local address
/// (`nodePortAddresses.MatchAll()`, with localhost NodePorts).
fn write_nodeports_rule(out: &mut String) {
    out.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
}

/// The Service chain and its endpoint chains; `large`: large cluster mode.
fn write_svc_rules(out: &mut String, s: &Svc, large: bool) {
    let name = s.port_name_string();
    let chain = svc_chain(s);
    let _ = writeln!(
        out,
        "-A {chain} -m comment --comment \"{name} cluster IP\" -m tcp -p tcp -d {} --dport {} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ",
        s.vip, s.port
    );
    let eps = kube_proxy_order(s);
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let comment = format!("\"{name} -> {}:{}\"", ep.0, ep.1);
        let _ = write!(out, "-A {chain}{}", endpoint_comment(large, &comment));
        if i < n - 1 {
            let _ = write!(
                out,
                " -m statistic --mode random --probability {}",
                probability(n - i)
            );
        }
        let _ = writeln!(out, " -j {}", sep_chain(s, ep));
    }
    let comment = endpoint_comment(large, &name);
    for ep in eps {
        let sep = sep_chain(s, ep);
        let _ = writeln!(out, "-A {sep}{comment} -s {} -j KUBE-MARK-MASQ", ep.0);
        let _ = writeln!(
            out,
            "-A {sep}{comment} -m tcp -p tcp -j DNAT --to-destination {}:{}",
            ep.0, ep.1
        );
    }
}

// ------------------------------------------------------------------------ nftables

/// nftables' `hashAndTruncate`: 8 characters of base32(SHA-256) + `-` + the name.
fn hash_and_truncate(name: &str) -> String {
    format!("{}-{name}", sha256_base32(name, 8))
}

/// `service-` chain of a Service port: `namespace/name/protocol/portname`.
pub fn nft_service_chain(s: &Svc) -> String {
    format!(
        "service-{}",
        hash_and_truncate(&format!("{}/{}/tcp/{}", s.namespace, s.name, s.port_name))
    )
}

/// `endpoint-` chain of an endpoint: `namespace/name/protocol/portname__ip/port`.
/// kube-proxy v1.37 writes these only for Services with session affinity, which the
/// benchmark's have not: the generator writes none.
pub fn nft_endpoint_chain(s: &Svc, ep: &(Ipv4Addr, u16)) -> String {
    format!(
        "endpoint-{}",
        hash_and_truncate(&format!(
            "{}/{}/tcp/{}__{}/{}",
            s.namespace, s.name, s.port_name, ep.0, ep.1
        ))
    )
}

const T: &str = "ip kube-proxy";

/// The `nft -f` input of kube-proxy's first full sync (into a namespace without the
/// table): `setupNFTables`, then each Service's chain, set and map elements and DNAT
/// rule. Without the node's addresses in `nodeport-ips`, which kube-proxy adds there.
pub fn nft_full(services: &[Svc]) -> String {
    let mut out = String::with_capacity(services.len() * 600 + 8192);
    write_nft_setup(&mut out);
    for s in services {
        let chain = nft_service_chain(s);
        write_nft_ensure_chain(&mut out, &chain);
        let _ = writeln!(out, "add element {T} cluster-ips {{ {} }}", s.vip);
        let _ = writeln!(
            out,
            "add element {T} service-ips {{ {} . tcp . {} : goto {chain} }}",
            s.vip, s.port
        );
        write_nft_dnat(&mut out, s, &chain);
    }
    out
}

/// The `nft -f` transaction of kube-proxy's partial sync after one endpoint of
/// `changed` was replaced: the Service chain added (it exists: a no-op), flushed and
/// its DNAT rule written anew. Nothing else changes: no endpoint chain is created or
/// left stale, no element of a set or map is added or deleted (the endpoint chains of
/// Services with session affinity, which would change, are not generated).
pub fn nft_partial(services: &[Svc], changed: usize) -> String {
    let s = &services[changed];
    let chain = nft_service_chain(s);
    let mut out = String::new();
    write_nft_ensure_chain(&mut out, &chain);
    write_nft_dnat(&mut out, s, &chain);
    out
}

/// `ensureChain`: add the chain, flush it.
fn write_nft_ensure_chain(out: &mut String, chain: &str) {
    let _ = writeln!(out, "add chain {T} {chain}");
    let _ = writeln!(out, "flush chain {T} {chain}");
}

/// `writeServiceToEndpointDNATs`: one endpoint, `dnat to`; more, a map from a random
/// number to the endpoints.
fn write_nft_dnat(out: &mut String, s: &Svc, chain: &str) {
    let eps = kube_proxy_order(s);
    if let [ep] = eps[..] {
        let _ = writeln!(
            out,
            "add rule {T} {chain} meta l4proto tcp dnat to {}:{}",
            ep.0, ep.1
        );
        return;
    }
    let _ = write!(
        out,
        "add rule {T} {chain} meta l4proto tcp dnat ip addr . port to numgen random mod {} map {{",
        eps.len()
    );
    for (i, ep) in eps.iter().enumerate() {
        let sep = if i + 1 < eps.len() { " ," } else { "" };
        let _ = write!(out, " {i} : {} . {}{sep}", ep.0, ep.1);
    }
    out.push_str(" }\n");
}

/// `setupNFTables` of a first full sync (kube-proxy's `flushed` still false), IPv4,
/// local traffic by cluster CIDR, NodePorts on the node's primary address, without
/// the localhost NodePorts feature (alpha, off).
fn write_nft_setup(out: &mut String) {
    let _ = writeln!(
        out,
        "add table {T} {{ comment \"rules for kube-proxy\" ; }}"
    );
    // `nftablesBaseChains`: priorities as knftables renders them (dstnat -100, filter
    // 0, srcnat 100).
    let base = [
        ("filter-prerouting-pre-dnat", "filter", "prerouting", -110),
        ("filter-output-pre-dnat", "filter", "output", -110),
        ("filter-input", "filter", "input", 0),
        ("filter-forward", "filter", "forward", 0),
        ("filter-output", "filter", "output", 0),
        ("nat-prerouting", "nat", "prerouting", -100),
        ("nat-output", "nat", "output", -100),
        ("nat-postrouting", "nat", "postrouting", 100),
    ];
    // The first sync adds and deletes them, so that any of an older layout go.
    for (name, ..) in base {
        let _ = writeln!(out, "add chain {T} {name}");
        let _ = writeln!(out, "delete chain {T} {name}");
    }
    for (name, kind, hook, priority) in base {
        let _ = writeln!(
            out,
            "add chain {T} {name} {{ type {kind} hook {hook} priority {priority} ; }}"
        );
        let _ = writeln!(out, "flush chain {T} {name}");
    }
    // `nftablesJumpChains`: each chain created (and flushed) at its first jump.
    let mut created: Vec<&str> = Vec::new();
    for (dst, src, extra) in [
        ("nodeport-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-forward", "ct state new "),
        ("service-endpoints-check", "filter-output", "ct state new "),
        (
            "firewall-check",
            "filter-prerouting-pre-dnat",
            "ct state new ",
        ),
        ("firewall-check", "filter-output-pre-dnat", "ct state new "),
        ("services", "nat-output", ""),
        ("services", "nat-prerouting", ""),
        ("masquerading", "nat-postrouting", ""),
        ("cluster-ips-check", "filter-forward", "ct state new "),
        ("cluster-ips-check", "filter-output", "ct state new "),
    ] {
        if !created.contains(&dst) {
            created.push(dst);
            write_nft_ensure_chain(out, dst);
        }
        let _ = writeln!(out, "add rule {T} {src} {extra}jump {dst}");
    }
    let _ = writeln!(out, "add set {T} hairpin-connections {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment \"service hairpin connections\" ; }}");
    let _ = writeln!(out, "add rule {T} masquerading mark and {MASQ_MARK} != 0 mark set mark xor {MASQ_MARK} masquerade fully-random");
    let _ = writeln!(out, "add rule {T} masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random");
    let _ = writeln!(
        out,
        "add set {T} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}"
    );
    let _ = writeln!(out, "add rule {T} cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"");
    let _ = writeln!(out, "add rule {T} cluster-ips-check ip daddr {{ {SERVICE_CIDR} }} drop comment \"Drop traffic to unallocated ClusterIPs\"");
    // NodePorts on the node's primary address: the set, flushed, then (not here) the
    // node's addresses.
    let _ = writeln!(
        out,
        "add set {T} nodeport-ips {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}"
    );
    let _ = writeln!(out, "flush set {T} nodeport-ips");
    let _ = writeln!(out, "add map {T} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}");
    let _ = writeln!(out, "add map {T} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}");
    let _ = writeln!(out, "add chain {T} reject-chain {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}");
    let _ = writeln!(out, "flush chain {T} reject-chain");
    let _ = writeln!(out, "add rule {T} reject-chain reject");
    let _ = writeln!(out, "add rule {T} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services");
    let _ = writeln!(out, "add rule {T} nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports");
    // Localhost NodePorts off: the map and each protocol's chain and counter added and
    // deleted, so that none is left.
    let _ = writeln!(out, "add map {T} localhost-nodeport-reject-ports {{ type inet_proto . inet_service : verdict ; comment \"localhost NodePorts rejected by kube-proxy\" ; }}");
    let _ = writeln!(out, "delete map {T} localhost-nodeport-reject-ports");
    for protocol in ["tcp", "udp", "sctp"] {
        let _ = writeln!(out, "add chain {T} localhost-nodeport-reject-{protocol}");
        let _ = writeln!(out, "delete chain {T} localhost-nodeport-reject-{protocol}");
        let _ = writeln!(
            out,
            "add counter {T} localhost-nodeport-rejected-{protocol}"
        );
        let _ = writeln!(
            out,
            "delete counter {T} localhost-nodeport-rejected-{protocol}"
        );
    }
    let _ = writeln!(out, "add map {T} firewall-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}");
    let _ = writeln!(
        out,
        "add rule {T} firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips"
    );
    let _ = writeln!(out, "add map {T} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}");
    let _ = writeln!(out, "add map {T} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}");
    let _ = writeln!(out, "add rule {T} services ip daddr @cluster-ips ip saddr != {CLUSTER_CIDR} mark set mark or {MASQ_MARK} comment \"masquerade clusterIP traffic from outside cluster\"");
    let _ = writeln!(
        out,
        "add rule {T} services ip daddr . meta l4proto . th dport vmap @service-ips"
    );
    let _ = writeln!(out, "add rule {T} services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_go() {
        // echo -n "" | sha256sum, base32-encoded: 4OYMIQUY7QOBJGX36TEJS35ZEQT24QPEMSNZGTFESWMRW6CSXBKQ====
        assert_eq!(sha256_base32("", 16), "4OYMIQUY7QOBJGX3");
    }

    #[test]
    fn probabilities_as_kube_proxy_writes_them() {
        assert_eq!(probability(3), "0.3333333333");
        assert_eq!(probability(2), "0.5000000000");
    }

    #[test]
    fn one_svc_chain_per_service_and_one_sep_per_endpoint() {
        let c = crate::model::fake_cluster(2, 3);
        let text = iptables_full(&c, true);
        assert_eq!(text.matches(":KUBE-SVC-").count(), 2);
        assert_eq!(text.matches(":KUBE-SEP-").count(), 6);
        assert_eq!(text.matches("--probability").count(), 4);
        // nftables: no endpoint chains without session affinity; each Service chain
        // is one DNAT rule through a map with an entry per endpoint.
        let nft = nft_full(&c);
        assert_eq!(
            nft.matches(" dnat ip addr . port to numgen random mod 3 map {")
                .count(),
            2
        );
        for s in &c {
            for (i, ep) in kube_proxy_order(s).into_iter().enumerate() {
                let entry = format!(" {i} : {} . {}", ep.0, ep.1);
                assert_eq!(nft.matches(&entry).count(), 1, "{entry}");
            }
        }
        assert!(!nft.contains(" endpoint-"), "no endpoint chain");
        assert!(!nft.contains("dnat to"));
    }

    /// A Service of one endpoint: `dnat to IP:PORT`, no map
    /// (`writeServiceToEndpointDNATs`' special case).
    #[test]
    fn one_endpoint_is_a_plain_dnat_in_nftables() {
        let c = crate::model::fake_cluster(1, 1);
        let ep = c[0].endpoints[0];
        let nft = nft_full(&c);
        assert!(nft.contains(&format!(
            "add rule ip kube-proxy {} meta l4proto tcp dnat to {}:{}\n",
            nft_service_chain(&c[0]),
            ep.0,
            ep.1
        )));
        assert!(!nft.contains("numgen"));
    }

    /// kube-proxy's transaction for a changed endpoint touches the Service chain only.
    #[test]
    fn the_nftables_change_rewrites_the_service_chain_only() {
        let before = crate::model::fake_cluster(10, 3);
        let mut after = before.clone();
        after[4].endpoints[0].0 = std::net::Ipv4Addr::new(10, 250, 0, 1);
        let chain = nft_service_chain(&after[4]);
        let text = nft_partial(&after, 4);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], format!("add chain ip kube-proxy {chain}"));
        assert_eq!(lines[1], format!("flush chain ip kube-proxy {chain}"));
        assert!(lines[2].starts_with(&format!("add rule ip kube-proxy {chain} meta l4proto tcp dnat ip addr . port to numgen random mod 3 map {{")));
        assert!(lines[2].contains(" : 10.250.0.1 . 8080"));
        assert!(!lines[2].contains(&before[4].endpoints[0].0.to_string()));
        // The same rule as the full sync's for the Service after the change.
        assert!(nft_full(&after).contains(lines[2]));
    }

    /// The INVALID drop rule names the nfacct counter only when it exists; nothing
    /// else differs.
    #[test]
    fn the_invalid_drop_rule_counts_only_with_nfacct() {
        let c = crate::model::fake_cluster(3, 3);
        let plain = iptables_full(&c, true);
        let counted = iptables_full_with(&c, true, Nfacct::Counted);
        assert_eq!(plain, iptables_full_with(&c, true, Nfacct::Absent));
        assert!(plain.contains("\n-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n"));
        assert_eq!(
            counted,
            plain.replace(
                "--ctstate INVALID -j DROP",
                "--ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"
            )
        );
        let after = {
            let mut a = c.clone();
            a[1].endpoints[0].0 = std::net::Ipv4Addr::new(10, 250, 0, 1);
            a
        };
        assert!(iptables_partial_with(&after, 1, &c[1], Nfacct::Counted)
            .contains("INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"));
    }

    /// kube-proxy's order within the nat table: each Service's KUBE-SERVICES rule
    /// before its chains' rules, the stale chains' deletion after all of them, the
    /// NodePorts jump last.
    #[test]
    fn the_nat_rules_come_in_kube_proxys_order() {
        let before = crate::model::fake_cluster(4, 3);
        let full = iptables_full(&before, false);
        let at = |text: &str, needle: &str| text.find(needle).unwrap();
        let nodeports = at(
            &full,
            "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports",
        );
        for (i, s) in before.iter().enumerate() {
            let services_rule = at(
                &full,
                &format!(
                    "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\"",
                    s.port_name_string()
                ),
            );
            let chain = at(&full, &format!("-A {} ", svc_chain(s)));
            assert!(services_rule < chain && chain < nodeports);
            if let Some(next) = before.get(i + 1) {
                assert!(
                    chain
                        < at(
                            &full,
                            &format!(
                                "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\"",
                                next.port_name_string()
                            )
                        )
                );
            }
        }
        assert!(full.ends_with("-j KUBE-NODEPORTS\nCOMMIT\n"));
        let mut after = before.clone();
        after[2].endpoints[1].0 = std::net::Ipv4Addr::new(10, 250, 0, 1);
        let partial = iptables_partial(&after, 2, &before[2]);
        let gone = sep_chain(&before[2], &before[2].endpoints[1]);
        assert!(
            at(
                &partial,
                &format!("-A {}", sep_chain(&after[2], &after[2].endpoints[2]))
            ) < at(&partial, &format!("-X {gone}\n"))
        );
        assert!(at(&partial, &format!("-X {gone}\n")) < at(&partial, "-j KUBE-NODEPORTS\n"));
        // Every Service's KUBE-SERVICES rule, the changed one's chains only.
        for s in &after {
            assert!(partial.contains(&format!("-j {}\n", svc_chain(s))));
        }
        assert_eq!(partial.matches(":KUBE-SVC-").count(), 1);
    }

    /// kube-proxy orders a Service port's endpoints by their `ip:port` string: the
    /// rules do not depend on the order of `Svc::endpoints`.
    #[test]
    fn endpoints_are_in_kube_proxys_order_whatever_the_input_order() {
        let mut s = crate::model::fake_cluster(1, 1).remove(0);
        s.endpoints = [9, 10, 11]
            .map(|d| (std::net::Ipv4Addr::new(10, 244, 1, d), 8080))
            .to_vec();
        let mut reversed = s.clone();
        reversed.endpoints.reverse();
        for text in [
            iptables_full(&[s.clone()], true),
            iptables_full(&[reversed.clone()], true),
        ] {
            let jumps: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("-A {} ", svc_chain(&s))) && l.contains(" -> "))
                .collect();
            let order: Vec<usize> = ["10.244.1.10:8080", "10.244.1.11:8080", "10.244.1.9:8080"]
                .iter()
                .map(|ep| jumps.iter().position(|l| l.contains(ep)).unwrap())
                .collect();
            assert_eq!(order, [0, 1, 2], "{jumps:#?}");
        }
        assert_eq!(
            iptables_full(&[s.clone()], true),
            iptables_full(&[reversed.clone()], true)
        );
        assert_eq!(nft_full(&[s]), nft_full(&[reversed]));
    }

    /// The lines of `text` that DNAT to `ip`, and how many of them carry a comment
    /// (upstream's `countEndpointsAndComments`).
    fn dnat_lines<'a>(text: &'a str, ip: &str) -> (Vec<&'a str>, usize) {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(&format!("--to-destination {ip}:")))
            .collect();
        let comments = lines.iter().filter(|l| l.contains("-m comment")).count();
        (lines, comments)
    }

    /// Upstream's `TestSyncProxyRulesLargeClusterMode`: at most 1,000 endpoints every
    /// endpoint rule is commented; above, none is, and the Services' own rules keep
    /// theirs.
    #[test]
    fn large_cluster_mode_drops_the_endpoint_comments_above_1000_endpoints() {
        let small = crate::model::fake_cluster(333, 3);
        assert!(!large_cluster(&small), "999 endpoints is not large");
        let text = iptables_full(&small, true);
        let ep = small[0].endpoints[0];
        let (lines, comments) = dnat_lines(&text, &ep.0.to_string());
        assert_eq!((lines.len(), comments), (1, 1), "{lines:?}");
        assert!(text.contains(&format!(
            "\"{} -> {}:{}\"",
            small[0].port_name_string(),
            ep.0,
            ep.1
        )));

        let large = crate::model::fake_cluster(334, 3);
        assert!(large_cluster(&large), "1,002 endpoints is large");
        let text = iptables_full(&large, true);
        let ep = large[0].endpoints[0];
        let (lines, comments) = dnat_lines(&text, &ep.0.to_string());
        assert_eq!(
            lines,
            [format!(
                "-A {} -m tcp -p tcp -j DNAT --to-destination {}:{}",
                sep_chain(&large[0], &ep),
                ep.0,
                ep.1
            )]
        );
        assert_eq!(comments, 0);
        assert!(
            !text.contains(" -> "),
            "no jump to an endpoint chain is commented"
        );
        assert!(text.contains(&format!(
            "-A {} -s {} -j KUBE-MARK-MASQ",
            sep_chain(&large[0], &ep),
            ep.0
        )));
        // The Service's own rules keep their "cluster IP" comments: one in
        // KUBE-SERVICES and one in the Service chain for each Service.
        assert_eq!(text.matches(" cluster IP\"").count(), 2 * large.len());
        // What large cluster mode is for: a smaller table.
        let commented = iptables_full(&small, true).len() as f64 / small.len() as f64;
        let bare = text.len() as f64 / large.len() as f64;
        assert!(
            bare < 0.8 * commented,
            "{bare} bytes a Service against {commented}"
        );
    }

    /// In large cluster mode a partial restore leaves the stale endpoint chain (it
    /// is deleted in the next sync period's clean-up); below it, the chain is deleted.
    #[test]
    fn a_partial_restore_deletes_the_stale_chain_only_below_large_cluster_mode() {
        for (n, large) in [(10, false), (400, true)] {
            let stale = crate::model::fake_cluster(n, 3);
            let mut now = stale.clone();
            let new_ep = (std::net::Ipv4Addr::new(10, 250, 0, 1), 8080);
            now[5].endpoints[1] = new_ep;
            let text = iptables_partial(&now, 5, &stale[5]);
            let gone = sep_chain(&stale[5], &stale[5].endpoints[1]);
            assert_eq!(text.contains(&format!("-X {gone}")), !large, "{n} Services");
            assert_eq!(text.contains(&format!(":{gone} ")), !large, "{n} Services");
            // The changed Service's endpoint chains are all written anew, the new one
            // among them.
            for ep in &now[5].endpoints {
                assert!(text.contains(&format!(":{} ", sep_chain(&now[5], ep))));
            }
            assert_eq!(text.matches(":KUBE-SEP-").count(), 3 + usize::from(!large));
            let (lines, comments) = dnat_lines(&text, "10.250.0.1");
            assert_eq!(
                (lines.len(), comments),
                (1, usize::from(!large)),
                "{n} Services"
            );
        }
    }
}

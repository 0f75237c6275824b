//! The baselines: the rules kube-proxy would write for the benchmark's Services, in
//! its iptables mode and its nftables mode, byte for byte in the shape upstream
//! generates them.
//!
//! - iptables: kubernetes/kubernetes v1.34.0 `pkg/proxy/iptables/proxier.go`
//!   (`syncProxyRules`, `writeServiceToEndpointRules`, `servicePortChainName`,
//!   `servicePortEndpointChainName`, `computeProbability`), loaded as kube-proxy does
//!   with `iptables-restore --noflush --counters`. Local traffic is detected by cluster
//!   CIDR (`--cluster-cidr`), so pod-to-Service traffic is not masqueraded.
//! - nftables: kubernetes/kubernetes v1.34.0 `pkg/proxy/nftables/proxier.go`
//!   (`setupNFTables`, `syncProxyRules`, `writeServiceToEndpointRules`,
//!   `servicePortChainNameBase`, `hashAndTruncate`): table `ip kube-proxy`, the
//!   `service-ips` verdict map keyed `ipv4_addr . inet_proto . inet_service`, a chain per
//!   service port with `numgen random mod N vmap`, a chain per endpoint with the DNAT.
//!   Loaded with `nft -f`.
//!
//! Only the ClusterIP part is generated: the benchmark's Services have no NodePort,
//! external IP or load balancer.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::model::Svc;

/// The cluster CIDR kube-proxy is told about: the lab's pods live in 10.244.0.0/16.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

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
pub fn sep_chain(s: &Svc, ep: &(std::net::Ipv4Addr, u16)) -> String {
    format!(
        "KUBE-SEP-{}",
        sha256_base32(&format!("{}tcp{}:{}", s.port_name_string(), ep.0, ep.1), 16)
    )
}

/// `computeProbability`: `fmt.Sprintf("%0.10f", 1.0/float64(n))`.
fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// The iptables-restore input of a full sync. `base_jumps` adds the jumps from the
/// built-in chains, which kube-proxy installs with `iptables -I` before its first
/// restore (a fresh namespace has none).
pub fn iptables_full(services: &[Svc], base_jumps: bool) -> String {
    let mut out = String::with_capacity(services.len() * 1200);
    write_filter(&mut out, base_jumps);
    out.push_str("*nat\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    for s in services {
        let _ = writeln!(out, ":{} - [0:0]", svc_chain(s));
        for ep in &s.endpoints {
            let _ = writeln!(out, ":{} - [0:0]", sep_chain(s, ep));
        }
    }
    if base_jumps {
        out.push_str(
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        );
        out.push_str(
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        );
        out.push_str("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n");
    }
    write_nat_fixed(&mut out);
    for s in services {
        write_service_rules(&mut out, s);
    }
    write_services_chain(&mut out, services);
    out.push_str("COMMIT\n");
    out
}

/// The endpoints of `a` that `b` lacks.
fn only_in<'a>(a: &'a Svc, b: &Svc) -> Vec<&'a (std::net::Ipv4Addr, u16)> {
    a.endpoints
        .iter()
        .filter(|e| !b.endpoints.contains(e))
        .collect()
}

/// The iptables-restore input of kube-proxy's partial sync (`MinimizeIPTablesRestore`,
/// on by default since 1.27) after one endpoint of `changed` was replaced: the
/// top-level chains are written in full, of the Service chains only the changed one,
/// the new endpoint's chain, and the stale endpoint chain is deleted.
pub fn iptables_partial(services: &[Svc], changed: usize, stale: &Svc) -> String {
    let s = &services[changed];
    let new_eps = only_in(s, stale);
    let gone = only_in(stale, s);
    let mut out = String::new();
    write_filter(&mut out, false);
    out.push_str("*nat\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    let _ = writeln!(out, ":{} - [0:0]", svc_chain(s));
    for ep in &new_eps {
        let _ = writeln!(out, ":{} - [0:0]", sep_chain(s, ep));
    }
    for ep in &gone {
        let _ = writeln!(out, ":{} - [0:0]", sep_chain(s, ep));
    }
    write_nat_fixed(&mut out);
    write_service_rules_only(&mut out, s, &new_eps);
    write_services_chain(&mut out, services);
    for ep in &gone {
        let _ = writeln!(out, "-X {}", sep_chain(s, ep));
    }
    out.push_str("COMMIT\n");
    out
}

fn write_filter(out: &mut String, base_jumps: bool) {
    out.push_str("*filter\n");
    for chain in [
        "KUBE-NODEPORTS",
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FIREWALL",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    if base_jumps {
        out.push_str(
            "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n",
        );
        out.push_str("-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    }
    out.push_str("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n");
    out.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n");
    out.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n");
    out.push_str("COMMIT\n");
}

fn write_nat_fixed(out: &mut String) {
    out.push_str("-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n");
    out.push_str("-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n");
    out.push_str("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n");
    out.push_str("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n");
}

fn write_services_chain(out: &mut String, services: &[Svc]) {
    for s in services {
        let _ = writeln!(
            out,
            "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\" -m tcp -p tcp -d {} --dport {} -j {}",
            s.port_name_string(),
            s.vip,
            s.port,
            svc_chain(s)
        );
    }
    out.push_str("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n");
}

fn write_service_rules(out: &mut String, s: &Svc) {
    let all: Vec<_> = s.endpoints.iter().collect();
    write_service_rules_only(out, s, &all);
}

/// The Service chain in full, and the endpoint chains of `sep_for`.
fn write_service_rules_only(out: &mut String, s: &Svc, sep_for: &[&(std::net::Ipv4Addr, u16)]) {
    let name = s.port_name_string();
    let chain = svc_chain(s);
    let _ = writeln!(
        out,
        "-A {chain} -m comment --comment \"{name} cluster IP\" -m tcp -p tcp -d {} --dport {} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ",
        s.vip, s.port
    );
    let n = s.endpoints.len();
    for (i, ep) in s.endpoints.iter().enumerate() {
        let _ = write!(
            out,
            "-A {chain} -m comment --comment \"{name} -> {}:{}\"",
            ep.0, ep.1
        );
        if i < n - 1 {
            let _ = write!(
                out,
                " -m statistic --mode random --probability {}",
                probability(n - i)
            );
        }
        let _ = writeln!(out, " -j {}", sep_chain(s, ep));
    }
    for ep in sep_for {
        let sep = sep_chain(s, ep);
        let _ = writeln!(
            out,
            "-A {sep} -m comment --comment {name} -s {} -j KUBE-MARK-MASQ",
            ep.0
        );
        let _ = writeln!(
            out,
            "-A {sep} -m comment --comment {name} -m tcp -p tcp -j DNAT --to-destination {}:{}",
            ep.0, ep.1
        );
    }
}

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

/// `endpoint-` chain: `namespace/name/protocol/portname__ip/port`.
pub fn nft_endpoint_chain(s: &Svc, ep: &(std::net::Ipv4Addr, u16)) -> String {
    format!(
        "endpoint-{}",
        hash_and_truncate(&format!(
            "{}/{}/tcp/{}__{}/{}",
            s.namespace, s.name, s.port_name, ep.0, ep.1
        ))
    )
}

const T: &str = "ip kube-proxy";

/// The `nft -f` input of a full sync into a namespace without the table.
pub fn nft_full(services: &[Svc]) -> String {
    let mut out = String::with_capacity(services.len() * 1500);
    let _ = writeln!(
        out,
        "add table {T} {{ comment \"rules for kube-proxy\" ; }}"
    );
    // setupNFTables: the fixed chains, sets and maps.
    for (chain, hook) in [
        (
            "filter-prerouting",
            Some("type filter hook prerouting priority -110"),
        ),
        (
            "filter-forward",
            Some("type filter hook forward priority -110"),
        ),
        (
            "filter-output",
            Some("type filter hook output priority -110"),
        ),
        (
            "nat-prerouting",
            Some("type nat hook prerouting priority -100"),
        ),
        ("nat-output", Some("type nat hook output priority -100")),
        (
            "nat-postrouting",
            Some("type nat hook postrouting priority 100"),
        ),
        ("mark-for-masquerade", None),
        ("masquerading", None),
        ("services", None),
        ("service-endpoints-check", None),
        ("nodeport-endpoints-check", None),
        ("cluster-ips-check", None),
    ] {
        match hook {
            Some(h) => {
                let _ = writeln!(out, "add chain {T} {chain} {{ {h} ; }}");
            }
            None => {
                let _ = writeln!(out, "add chain {T} {chain}");
            }
        }
    }
    let _ = writeln!(
        out,
        "add set {T} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}"
    );
    let _ = writeln!(out, "add map {T} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}");
    let _ = writeln!(out, "add map {T} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}");
    let _ = writeln!(out, "add map {T} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}");
    let _ = writeln!(
        out,
        "add rule {T} filter-prerouting ct state new jump service-endpoints-check"
    );
    let _ = writeln!(
        out,
        "add rule {T} filter-forward ct state new jump service-endpoints-check"
    );
    let _ = writeln!(
        out,
        "add rule {T} filter-forward ct state new jump cluster-ips-check"
    );
    let _ = writeln!(
        out,
        "add rule {T} filter-output ct state new jump service-endpoints-check"
    );
    let _ = writeln!(out, "add rule {T} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services");
    let _ = writeln!(out, "add rule {T} cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"");
    let _ = writeln!(out, "add rule {T} nat-prerouting jump services");
    let _ = writeln!(out, "add rule {T} nat-output jump services");
    let _ = writeln!(out, "add rule {T} nat-postrouting jump masquerading");
    let _ = writeln!(
        out,
        "add rule {T} mark-for-masquerade mark set mark or 0x4000"
    );
    let _ = writeln!(out, "add rule {T} masquerading mark and 0x4000 == 0 return");
    let _ = writeln!(out, "add rule {T} masquerading mark set mark xor 0x4000");
    let _ = writeln!(out, "add rule {T} masquerading masquerade fully-random");
    let _ = writeln!(
        out,
        "add rule {T} services ip daddr . meta l4proto . th dport vmap @service-ips"
    );
    let _ = writeln!(out, "add rule {T} services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports");
    for s in services {
        write_nft_service(&mut out, s, &s.endpoints.iter().collect::<Vec<_>>());
        let _ = writeln!(out, "add element {T} cluster-ips {{ {} }}", s.vip);
        let _ = writeln!(
            out,
            "add element {T} service-ips {{ {} . tcp . {} : goto {} }}",
            s.vip,
            s.port,
            nft_service_chain(s)
        );
    }
    out
}

/// The `nft -f` transaction kube-proxy's nftables mode writes after one endpoint of
/// `changed` was replaced: only the changed Service's chain is flushed and rewritten,
/// the new endpoint's chain added, the stale one flushed and deleted.
pub fn nft_partial(services: &[Svc], changed: usize, stale: &Svc) -> String {
    let s = &services[changed];
    let new_eps = only_in(s, stale);
    let mut out = String::new();
    let _ = writeln!(out, "flush chain {T} {}", nft_service_chain(s));
    write_nft_service(&mut out, s, &new_eps);
    for ep in only_in(stale, s) {
        let chain = nft_endpoint_chain(s, ep);
        let _ = writeln!(out, "flush chain {T} {chain}");
        let _ = writeln!(out, "delete chain {T} {chain}");
    }
    out
}

/// The Service chain and the endpoint chains of `eps` (which must exist before the
/// vmap refers to them).
fn write_nft_service(out: &mut String, s: &Svc, eps: &[&(std::net::Ipv4Addr, u16)]) {
    for ep in eps {
        let chain = nft_endpoint_chain(s, ep);
        let _ = writeln!(out, "add chain {T} {chain}");
        let _ = writeln!(
            out,
            "add rule {T} {chain} ip saddr {} jump mark-for-masquerade",
            ep.0
        );
        let _ = writeln!(
            out,
            "add rule {T} {chain} meta l4proto tcp dnat to {}:{}",
            ep.0, ep.1
        );
    }
    let chain = nft_service_chain(s);
    let _ = writeln!(out, "add chain {T} {chain}");
    let _ = writeln!(
        out,
        "add rule {T} {chain} ip daddr {} tcp dport {} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade",
        s.vip, s.port
    );
    let vmap: Vec<String> = s
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", nft_endpoint_chain(s, ep)))
        .collect();
    let _ = writeln!(
        out,
        "add rule {T} {chain} numgen random mod {} vmap {{ {} }}",
        s.endpoints.len(),
        vmap.join(" , ")
    );
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
        let nft = nft_full(&c);
        assert_eq!(nft.matches("numgen random mod 3").count(), 2);
        assert_eq!(nft.matches("dnat to").count(), 6);
    }
}

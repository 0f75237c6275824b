//! Issue 12: the packet-fixture table ([`super::FIXTURES`]) run again with IPv6
//! addresses, through `sliceway_tc6` (reached from `sliceway_tc` by tail call). No
//! second table: each IPv4 fixture is translated into its IPv6 twin, manifests,
//! input packets and expected packets alike, by the fixed rules below, and run with
//! the same checks. A fixture without a twin is named in [`NOT_TWINNED`] with the
//! difference between the families that leaves it out.
//!
//! Addresses: an IPv4 address becomes the IPv6 address of its network's prefix with
//! the IPv4 address in the low 32 bits ([`PREFIXES`]); a prefix length grows by 96.
//!
//! Manifests: IPv4 literals and CIDRs become their twins, `IPv4` (`addressType`,
//! `ipFamilies`) becomes `IPv6`, and a Service without `ipFamilies` is given
//! `ipFamilies: [IPv6]` and `ipFamilyPolicy: SingleStack`. The twins go through the
//! same compiler and map writer into IPv6's maps.
//!
//! Packets, byte by byte rather than rebuilt, so a cut or odd IPv4 packet keeps its
//! oddity (RFC 7915's header translation where it applies): EtherType 0x86DD; IPv6
//! header with the twins, traffic class from the TOS, hop limit from the TTL, payload
//! length from the total length; an IP version other than 4 (an IPv4 fixture's odd
//! version) becomes 4 under the IPv6 EtherType; IPv4 options become a hop-by-hop
//! options header of padding as long (rounded up to 8 bytes); a fragment gets a
//! fragment header (RFC 8200, 4.5) with the same offset, more-fragments flag and
//! identification. The transport bytes are kept, all of them (also past the total
//! length): TCP's and UDP's checksums recomputed over IPv6's pseudo-header where the
//! segment is whole (a first fragment's over the bytes it carries, as the IPv4
//! fixture's), adjusted for the changed addresses where it is not (a cut header, a
//! quote; RFC 1624), left alone in later fragments; a UDP checksum of zero
//! stays zero (invalid in IPv6); SCTP's CRC32c covers no address and stays. ICMP
//! becomes ICMPv6 (RFC 7915, 4.2: port unreachable → port unreachable, fragmentation
//! needed → packet too big with the MTU 20 bytes larger, time exceeded → time
//! exceeded, echo → echo) with the quoted packet translated the same way; an ICMP
//! type without an ICMPv6 counterpart keeps protocol number 1, to IPv6 a protocol
//! the programs do not handle. A reject's expected reply is the ICMPv6 port
//! unreachable of the translated input (`icmp6_port_unreachable`).
//!
//! The whole table runs on one datapath (loading one costs seconds where the program
//! tests run under emulation): before each fixture its manifests replace the last
//! one's through the same writer and what the kernel wrote (conntrack, IPv6
//! fragments, affinity) is emptied, so no fixture sees another's state.

use std::{
    cell::Cell,
    net::{Ipv4Addr, Ipv6Addr, SocketAddrV4},
};

use dataplane_common::{addr_of, NatConfig6, PROTO_ICMP, PROTO_SCTP, PROTO_TCP, PROTO_UDP};
use sliceway_agent::{
    kernel::packet::{crc32c, icmp6_message, icmp6_port_unreachable, l4_checksum6, PROTO_ICMPV6},
    kernel::Datapath,
    writer::MapWriter,
};

use super::{fixture_capacities, run_fixture, Family, Fixture, Node, ETH, FIXTURES};

/// Fixtures of the IPv4 table without an IPv6 twin, by description, and the
/// difference between the families that leaves each out.
pub const NOT_TWINNED: &[(&str, &str)] = &[
    (
        "UDP without a checksum stays without one",
        "RFC 8200, 8.1: IPv6 UDP must carry a checksum; one of zero is dropped as \
         malformed (an IPv6 fixture, v6::FIXTURES6)",
    ),
    (
        "not IPv4 (ARP EtherType) passes unchanged",
        "ARP is IPv4's neighbour protocol; IPv6's is ICMPv6 neighbour discovery \
         (an IPv6 fixture, v6::FIXTURES6)",
    ),
    (
        "a pod reaching its own ClusterIP and picked as the backend is masqueraded to the hairpin address",
        "the hairpin address is each family's own: IPv6's, 100::5c1c:1, is no twin of \
         169.254.42.1 (an IPv6 fixture, v6::FIXTURES6)",
    ),
    (
        "an IHL below 5 words drops",
        "the header length field is IPv4's: IPv6's fixed header has none",
    ),
    (
        "direct server return: the first node sends a new connection on with the frontend in an IPv4 option, the backend's node records it from there",
        "IPv6 carries the frontend in a destination options header, not in a twin of \
         IPv4's option (v6_hand::HAND6, \"IPv6 direct server return carries the frontend \
         to the backend's node\")",
    ),
];

/// Each IPv4 network's IPv6 prefix (a /96: the IPv4 address is the low 32 bits),
/// the first that holds the address; the last holds every address.
pub const PREFIXES: &[(&str, &str)] = &[
    // Nodes (inside the service CIDR's range: first, the narrower).
    ("10.100.0.0/16", "fd00:10:100::"),
    // Service ClusterIPs (the service CIDR), as the labs' IPv6 ClusterIPs.
    ("10.96.0.0/12", "fd00:96::"),
    // Pods (the cluster CIDR), beside the labs' IPv6 pods (fd00:10:244:N::2).
    ("10.244.0.0/16", "fd00:10:244::"),
    // Clients and load-balancer IPs outside the cluster (documentation prefix).
    ("0.0.0.0/0", "2001:db8::"),
];

/// `PREFIXES` parsed: each IPv4 network (address, mask, prefix length) and its
/// twin's prefix, in order.
fn networks() -> impl Iterator<Item = (u32, u32, u32, Ipv6Addr)> {
    PREFIXES.iter().map(|(net, prefix)| {
        let (ip, len) = net.split_once('/').unwrap();
        let (ip, len): (Ipv4Addr, u32) = (ip.parse().unwrap(), len.parse().unwrap());
        (u32::from(ip), mask(len), len, prefix.parse().unwrap())
    })
}

fn mask(len: u32) -> u32 {
    u32::MAX.checked_shl(32 - len).unwrap_or(0)
}

/// The prefix length of `PREFIXES`' network holding `v4`, and its twin's prefix.
fn network(v4: Ipv4Addr) -> (u32, Ipv6Addr) {
    networks()
        .find(|(ip, mask, _, _)| u32::from(v4) & mask == *ip)
        .map(|(_, _, len, prefix)| (len, prefix))
        .expect("the last network holds every address")
}

/// The IPv6 twin of an IPv4 address.
pub fn addr(v4: Ipv4Addr) -> Ipv6Addr {
    let (_, prefix) = network(v4);
    Ipv6Addr::from(u128::from(prefix) | u128::from(u32::from(v4)))
}

/// The twin of a CIDR `ip/len`: the twin of `ip`, `len + 96`. A CIDR wider than its
/// network, or holding a narrower one (whose twins have another prefix), has none.
fn cidr(ip: Ipv4Addr, len: u32) -> Result<String, String> {
    let (net_len, net_prefix) = network(ip);
    let holds_another = networks().any(|(net, _, other_len, prefix)| {
        prefix != net_prefix && other_len >= len && net & mask(len) == u32::from(ip) & mask(len)
    });
    if len < net_len || len > 32 || holds_another {
        return Err(format!(
            "{ip}/{len} has no twin: it spans networks of other prefixes"
        ));
    }
    Ok(format!("{}/{}", addr(ip), len + 96))
}

/// The IPv6 twin of a manifest file (documents split at `---` lines).
pub fn manifests(yaml: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = yaml;
    // IPv4 literals, a CIDR's length included: a run of digits and dots that parses
    // as an address, not inside a longer word (`k8s.io`, `v1`).
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let (before, from) = rest.split_at(start);
        out.push_str(before);
        let len = from
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(from.len());
        let (token, after) = from.split_at(len);
        let in_word = out
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_');
        match token.parse::<Ipv4Addr>() {
            Ok(ip) if !in_word => {
                let prefix = after
                    .strip_prefix('/')
                    .map(|s| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()))
                    .filter(|&n| n > 0);
                let quoted = out.ends_with('"') || out.ends_with('\'');
                let (twin, after) = match prefix {
                    Some(n) => (cidr(ip, after[1..1 + n].parse().unwrap())?, &after[1 + n..]),
                    None => (addr(ip).to_string(), after),
                };
                // A colon in a plain scalar of a flow collection reads badly: quoted.
                if quoted {
                    out.push_str(&twin);
                } else {
                    out.push_str(&format!("\"{twin}\""));
                }
                rest = after;
            }
            _ => {
                out.push_str(token);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    let out = out.replace("IPv4", "IPv6");
    // Every Service of one family, IPv6.
    let docs: Vec<String> = out
        .split("\n---\n")
        .map(|doc| {
            let is_service = doc.lines().any(|l| l.trim() == "kind: Service");
            if !is_service || doc.contains("ipFamilies") {
                return doc.to_string();
            }
            let lines: Vec<&str> = doc.lines().collect();
            let Some(at) = lines.iter().position(|l| l.trim_end() == "spec:") else {
                return doc.to_string();
            };
            let indent: String = lines
                .get(at + 1)
                .map(|l| l.chars().take_while(|c| *c == ' ').collect())
                .unwrap_or_else(|| "  ".into());
            let mut lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            lines.insert(at + 1, format!("{indent}ipFamilyPolicy: SingleStack"));
            lines.insert(at + 1, format!("{indent}ipFamilies: [IPv6]"));
            lines.join("\n") + if doc.ends_with('\n') { "\n" } else { "" }
        })
        .collect();
    Ok(docs.join("\n---\n"))
}

/// IPv6's hop-by-hop options header and fragment header (RFC 8200, 4.3, 4.5).
const HOP_BY_HOP: u8 = 0;
const FRAGMENT: u8 = 44;

/// The IPv6 twin of an Ethernet frame holding an IPv4 packet (see the module's
/// documentation).
pub fn packet(frame: &[u8]) -> Result<Vec<u8>, String> {
    if frame.len() < ETH + 20 || frame[12..14] != [0x08, 0x00] {
        return Err(format!("not an IPv4 frame: {frame:02x?}"));
    }
    let ip = &frame[ETH..];
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    if ihl < 20 || ip.len() < ihl {
        return Err(format!("no IPv6 twin for an IPv4 header of {ihl} bytes"));
    }
    let version = match ip[0] >> 4 {
        4 => 6,
        6 => 4,
        other => other,
    };
    let tos = ip[1];
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let id = u16::from_be_bytes([ip[4], ip[5]]);
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    let (offset, more) = (frag & 0x1fff, frag & 0x2000 != 0);
    let (ttl, proto) = (ip[8], ip[9]);
    let (src4, dst4): ([u8; 4], [u8; 4]) = (
        ip[12..16].try_into().unwrap(),
        ip[16..20].try_into().unwrap(),
    );
    let (src, dst) = (addr(src4.into()).octets(), addr(dst4.into()).octets());
    let options = ihl - 20;
    // What the datagram says it carries after its header, and what the frame holds.
    let l4_len = total.saturating_sub(ihl);
    let mut l4 = ip[ihl..].to_vec();
    let later_fragment = offset != 0;
    let fragment = later_fragment || more;

    let mut next = proto;
    if proto == PROTO_ICMP && !fragment && l4.len() >= 8 {
        if let Some(message) = icmp(&l4)? {
            if options > 0 || l4.len() != l4_len {
                return Err("no twin written for ICMP with options, cut or padded".into());
            }
            let eth: [u8; 14] = [&frame[..12], &[0x86, 0xdd][..]]
                .concat()
                .try_into()
                .unwrap();
            let (kind, code, word, body) = message;
            let mut out = icmp6_message(&eth, &src, &dst, kind, code, word, &body);
            out[ETH] = (version << 4) | (tos >> 4);
            out[ETH + 1] = tos << 4;
            out[ETH + 7] = ttl;
            return Ok(out);
        }
    } else if (proto == PROTO_TCP || proto == PROTO_UDP) && !later_fragment {
        let at = if proto == PROTO_TCP { 16 } else { 6 };
        if l4.len() >= at + 2 {
            let old = u16::from_be_bytes([l4[at], l4[at + 1]]);
            let new = if proto == PROTO_UDP && old == 0 {
                0
            } else if l4.len() >= l4_len && l4_len >= at + 2 {
                l4[at..at + 2].copy_from_slice(&[0, 0]);
                match l4_checksum6(&src, &dst, proto, &l4[..l4_len]) {
                    0 if proto == PROTO_UDP => 0xffff,
                    c => c,
                }
            } else {
                let from = [src4, dst4].concat();
                adjust(old, &from, &[src, dst].concat())
            };
            l4[at..at + 2].copy_from_slice(&new.to_be_bytes());
        }
    }

    let mut ext = Vec::new();
    if options > 0 {
        // Padding only (PadN), as long as the options, in whole 8 bytes.
        let len = options.div_ceil(8) * 8;
        ext.extend_from_slice(&[0, (len / 8 - 1) as u8, 1, (len - 4) as u8]);
        ext.resize(len, 0);
    }
    if fragment {
        let field = (offset << 3) | u16::from(more);
        ext.extend_from_slice(&[0, 0]);
        ext.extend_from_slice(&field.to_be_bytes());
        ext.extend_from_slice(&u32::from(id).to_be_bytes());
    }
    // Each extension header names the next: hop-by-hop first, then the fragment
    // header, then the transport.
    let mut headers = Vec::new();
    if options > 0 {
        headers.push((0, HOP_BY_HOP));
    }
    if fragment {
        headers.push((ext.len() - 8, FRAGMENT));
    }
    for (i, &(at, _)) in headers.iter().enumerate() {
        ext[at] = headers.get(i + 1).map_or(next, |h| h.1);
    }
    if let Some(&(_, first)) = headers.first() {
        next = first;
    }

    let mut out = frame[..12].to_vec();
    out.extend_from_slice(&[0x86, 0xdd]);
    out.extend_from_slice(&[(version << 4) | (tos >> 4), tos << 4, 0, 0]);
    out.extend_from_slice(&((ext.len() + l4_len) as u16).to_be_bytes());
    out.extend_from_slice(&[next, ttl]);
    out.extend_from_slice(&src);
    out.extend_from_slice(&dst);
    out.extend_from_slice(&ext);
    out.extend_from_slice(&l4);
    Ok(out)
}

/// An ICMP message's ICMPv6 twin (RFC 7915, 4.2): type, code, the word after the
/// checksum and the body (an error's quoted packet translated); `None` for a type
/// without one.
#[allow(clippy::type_complexity)]
fn icmp(l4: &[u8]) -> Result<Option<(u8, u8, u32, Vec<u8>)>, String> {
    let (kind, code) = (l4[0], l4[1]);
    let word = u32::from_be_bytes(l4[4..8].try_into().unwrap());
    let body = &l4[8..];
    let (kind6, code6, word6) = match (kind, code) {
        (8, 0) => return Ok(Some((128, 0, word, body.to_vec()))),
        (0, 0) => return Ok(Some((129, 0, word, body.to_vec()))),
        // Destination unreachable: network, host; port; fragmentation needed
        // (packet too big, the MTU grown by the headers' difference).
        (3, 0 | 1) => (1, 0, 0),
        (3, 3) => (1, 4, 0),
        (3, 4) => (2, 0, (word & 0xffff) + 20),
        (11, 0 | 1) => (3, code, 0),
        (3 | 11 | 12, _) => return Err(format!("no ICMPv6 twin written for ICMP {kind}/{code}")),
        _ => return Ok(None),
    };
    // The quoted packet, translated as a frame of its own.
    let quoted = [&[0u8; 12][..], &[0x08, 0x00], body].concat();
    let quoted = packet(&quoted)?;
    Ok(Some((kind6, code6, word6, quoted[ETH..].to_vec())))
}

/// A checksum `old` over data whose `from` bytes became `to` (16-bit words, as many
/// of each), updated without the rest of the data (RFC 1624, eqn. 3).
fn adjust(old: u16, from: &[u8], to: &[u8]) -> u16 {
    let words = |b: &[u8]| -> Vec<u32> {
        b.chunks(2)
            .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
            .collect()
    };
    let mut sum = u64::from(!old);
    sum += words(from)
        .iter()
        .map(|w| u64::from(!*w as u16))
        .sum::<u64>();
    sum += words(to).iter().map(|&w| u64::from(w)).sum::<u64>();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

thread_local! {
    /// Whether this thread runs the IPv6 twins: [`super::remapped`] and
    /// [`super::masqueraded`] then hash the twins' addresses.
    static TWINS: Cell<bool> = const { Cell::new(false) };
}

/// Whether the fixtures are being run as their IPv6 twins on this thread.
pub fn running() -> bool {
    TWINS.with(Cell::get)
}

/// Says whether this thread runs the IPv6 twins from now on.
pub fn set_running(on: bool) {
    TWINS.with(|t| t.set(on));
}

/// Whether `fixture` has an IPv6 twin (is not in [`NOT_TWINNED`]).
pub fn twinned(fixture: &Fixture) -> bool {
    !NOT_TWINNED.iter().any(|(d, _)| *d == fixture.description)
}

/// Manifests as family `family` (0: IPv4, as written; 1: their IPv6 twins).
pub fn maps_of(family: usize) -> fn(&str) -> String {
    [
        |yaml: &str| yaml.to_string(),
        |yaml: &str| manifests(yaml).unwrap(),
    ][family]
}

/// Packets as family `family`, as [`maps_of`].
pub fn packet_of(family: usize) -> fn(Vec<u8>) -> Vec<u8> {
    [|p: Vec<u8>| p, |p: Vec<u8>| packet(&p).unwrap()][family]
}

/// The flow hash of the IPv6 twin of a TCP connection from `src` to `dst`
/// (`flow_hash6` over the twins): what the port rules of [`super::remapped`] and
/// [`super::masqueraded`] start from when the table runs as its twins.
pub fn flow_hash(src: SocketAddrV4, dst: SocketAddrV4) -> u32 {
    dataplane_common::flow_hash6(
        addr_of(addr(*src.ip()).octets()),
        addr_of(addr(*dst.ip()).octets()),
        src.port().to_be(),
        dst.port().to_be(),
        PROTO_TCP,
    )
}

/// The transport checksum of an IPv6 frame, checked on its own: TCP, UDP and ICMPv6
/// over the pseudo-header, SCTP's CRC32c (zero: left to the kernel), a first
/// fragment's over the bytes it carries; a later fragment has none.
fn checksum_ok6(p: &[u8]) -> Result<(), String> {
    let ip = p
        .get(ETH..)
        .filter(|ip| ip.len() >= 40)
        .ok_or("too short")?;
    let end = 40 + u16::from_be_bytes([ip[4], ip[5]]) as usize;
    let (src, dst): ([u8; 16], [u8; 16]) = (
        ip[8..24].try_into().unwrap(),
        ip[24..40].try_into().unwrap(),
    );
    let (mut next, mut off) = (ip[6], 40);
    while [0, 43, 60, FRAGMENT].contains(&next) {
        let h = ip.get(off..off + 8).ok_or("extension header cut")?;
        if next == FRAGMENT {
            if u16::from_be_bytes([h[2], h[3]]) & 0xfff8 != 0 {
                return Ok(());
            }
            off += 8;
        } else {
            off += (h[1] as usize + 1) * 8;
        }
        next = h[0];
    }
    let l4 = ip.get(off..end).ok_or("payload length past the frame")?;
    let ok = match next {
        PROTO_SCTP => {
            l4.len() >= 12 && (l4[8..12] == [0; 4] || crc32c(l4).to_le_bytes() == l4[8..12])
        }
        _ => l4_checksum6(&src, &dst, next, l4) == 0,
    };
    ok.then_some(())
        .ok_or_else(|| format!("bad checksum (next header {next})"))
}

/// The twins: each packet translated, rejects answered with ICMPv6.
struct V6;

impl Family for V6 {
    fn packet(&self, raw: Vec<u8>) -> Result<Vec<u8>, String> {
        packet(&raw)
    }

    fn rejected(&self, reply: &[u8], input: &[u8]) -> Result<Vec<u8>, String> {
        let ok = reply.get(ETH + 6) == Some(&PROTO_ICMPV6)
            && reply.get(ETH + 40..ETH + 42) == Some(&[1, 4][..]);
        if !ok {
            return Err("not an ICMPv6 port unreachable".into());
        }
        checksum_ok6(reply).map_err(|e| format!("reply: {e}"))?;
        Ok(icmp6_port_unreachable(input))
    }

    fn rewritten_ok(&self, packet: &[u8]) -> Result<(), String> {
        // As IPv4's: checked on its own too, not only against the expected bytes.
        checksum_ok6(packet).map_err(|e| format!("rewritten: {e}"))
    }

    fn set_node(&self, dp: &mut Datapath, node: Option<Node>) -> Result<(), String> {
        dp.set_nat6(nat6_of(node)).map_err(|e| e.to_string())
    }
}

/// The IPv6 twin of a fixture's node: its address's twin, the same ports.
pub fn nat6_of(node: Option<Node>) -> NatConfig6 {
    let v4 = super::nat_of(node);
    let node_addr_be = match node {
        Some(n) => addr_of(addr(n.addr.parse().unwrap()).octets()),
        None => [0; 4],
    };
    NatConfig6 {
        node_addr_be,
        port_min: v4.port_min,
        port_max: v4.port_max,
    }
}

/// IPv6's own fixtures (`v6::FIXTURES6`): packets as written, checked as the twins'.
pub struct Native6;

impl Family for Native6 {
    fn packet(&self, raw: Vec<u8>) -> Result<Vec<u8>, String> {
        Ok(raw)
    }

    fn rejected(&self, reply: &[u8], input: &[u8]) -> Result<Vec<u8>, String> {
        V6.rejected(reply, input)
    }

    fn rewritten_ok(&self, packet: &[u8]) -> Result<(), String> {
        V6.rewritten_ok(packet)
    }

    fn set_node(&self, dp: &mut Datapath, node: Option<Node>) -> Result<(), String> {
        V6.set_node(dp, node)
    }
}

/// Runs the IPv6 twin of `fixture` on `dp`; the first step that does not match,
/// described.
fn run(dp: &mut Datapath, writer: &mut MapWriter, fixture: &Fixture) -> Result<(), String> {
    run_fixture(dp, writer, fixture, &V6, &manifests)
}

/// Issue 12: every fixture of the table but those of [`NOT_TWINNED`] over IPv6.
#[test]
fn packet_fixtures_over_ipv6() {
    set_running(true);
    let caps = fixture_capacities();
    let mut dp = Datapath::load(&caps, None).expect("loading the datapath (needs root)");
    let mut writer = MapWriter::new(caps.limits).with_limits6(caps.limits6);
    let twinned: Vec<&Fixture> = FIXTURES.iter().filter(|f| twinned(f)).collect();
    let failures: Vec<String> = twinned
        .iter()
        .filter_map(|f| {
            run(&mut dp, &mut writer, f)
                .err()
                .map(|e| format!("{}: {e}", f.description))
        })
        .collect();
    set_running(false);
    assert!(
        failures.is_empty(),
        "{} of {} IPv6 twins failed:\n{}",
        failures.len(),
        twinned.len(),
        failures.join("\n")
    );
}

/// The list of fixtures left out names fixtures of the table, each once, and the
/// table's descriptions are unique (they are the names).
#[test]
fn the_fixtures_left_out_of_the_ipv6_table_exist() {
    let mut names: Vec<&str> = FIXTURES.iter().map(|f| f.description).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), FIXTURES.len(), "fixture descriptions repeat");
    for (i, (name, why)) in NOT_TWINNED.iter().enumerate() {
        assert!(names.contains(name), "{name:?} is no fixture");
        assert!(!why.is_empty(), "{name:?}: no reason");
        assert!(
            !NOT_TWINNED[..i].iter().any(|(n, _)| n == name),
            "{name:?} twice"
        );
    }
}

/// The translation on its own: the address twins, a manifest, and a packet whose
/// IPv4 and IPv6 forms are both built by the project's builders.
#[test]
fn ipv4_fixtures_translate_to_their_ipv6_twins() {
    use sliceway_agent::kernel::packet::{
        build, build6, PacketSpec, PacketSpec6, SCTP_INIT, TCP_SYN,
    };
    let twin = |s: &str| addr(s.parse().unwrap()).to_string();
    assert_eq!(twin("10.96.0.10"), "fd00:96::a60:a");
    assert_eq!(twin("10.244.11.2"), "fd00:10:244::af4:b02");
    assert_eq!(twin("10.100.0.1"), "fd00:10:100::a64:1");
    assert_eq!(twin("192.0.2.10"), "2001:db8::c000:20a");
    assert_eq!(
        cidr("10.244.0.0".parse().unwrap(), 16).unwrap(),
        "fd00:10:244::af4:0/112"
    );
    assert!(
        cidr("10.0.0.0".parse().unwrap(), 8).is_err(),
        "holds the pods"
    );
    assert!(
        cidr("10.96.0.0".parse().unwrap(), 12).is_err(),
        "holds the nodes"
    );
    assert!(
        cidr("10.244.0.0".parse().unwrap(), 15).is_err(),
        "wider than the pods"
    );
    assert_eq!(
        cidr("10.96.0.0".parse().unwrap(), 16).unwrap(),
        "fd00:96::a60:0/112"
    );
    let yaml = "kind: Service\nspec:\n  clusterIP: 10.96.0.10\n  loadBalancerSourceRanges: \
                [\"10.1.0.0/16\"]\n---\naddressType: IPv4\napiVersion: discovery.k8s.io/v1\n";
    assert_eq!(
        manifests(yaml).unwrap(),
        "kind: Service\nspec:\n  ipFamilies: [IPv6]\n  ipFamilyPolicy: SingleStack\n  \
         clusterIP: \"fd00:96::a60:a\"\n  loadBalancerSourceRanges: [\"2001:db8::a01:0/112\"]\n\
         ---\naddressType: IPv6\napiVersion: discovery.k8s.io/v1\n"
    );
    let (src, dst) = ("10.244.1.2:40000", "10.96.0.10:80");
    let v4 = build(&PacketSpec::tcp(
        src.parse().unwrap(),
        dst.parse().unwrap(),
        TCP_SYN,
    ));
    let six = |s: &str| {
        let s: SocketAddrV4 = s.parse().unwrap();
        std::net::SocketAddrV6::new(addr(*s.ip()), s.port(), 0, 0)
    };
    let v6 = build6(&PacketSpec6::tcp(six(src), six(dst), TCP_SYN));
    assert_eq!(packet(&v4).unwrap(), v6);
    // A quoted TCP header cut before its end: the checksum adjusted, not recomputed,
    // agrees with the one of the whole segment.
    let cut = &v4[..ETH + 20 + 18];
    let mut cut = cut.to_vec();
    cut[ETH + 2..ETH + 4].copy_from_slice(&40u16.to_be_bytes());
    let twin = packet(&cut).unwrap();
    assert_eq!(twin[ETH + 40 + 16..], v6[ETH + 40 + 16..ETH + 40 + 18]);
    // UDP, SCTP, and IPv4 options as a hop-by-hop header: as IPv6's builder makes
    // them.
    let (src4, dst4) = (src.parse().unwrap(), dst.parse().unwrap());
    let udp = build(&PacketSpec::udp(src4, dst4, b"query"));
    let udp6 = build6(&PacketSpec6::udp(six(src), six(dst), b"query"));
    assert_eq!(packet(&udp).unwrap(), udp6);
    let sctp = build(&PacketSpec::sctp(src4, dst4, SCTP_INIT));
    let sctp6 = build6(&PacketSpec6::sctp(six(src), six(dst), SCTP_INIT));
    assert_eq!(packet(&sctp).unwrap(), sctp6);
    let mut options = PacketSpec::tcp(src4, dst4, TCP_SYN);
    options.ip_options = 8;
    let mut hop_by_hop = PacketSpec6::tcp(six(src), six(dst), TCP_SYN);
    hop_by_hop.ext = vec![HOP_BY_HOP];
    assert_eq!(packet(&build(&options)).unwrap(), build6(&hop_by_hop));
    // ICMP port unreachable quoting a datagram cut short: ICMPv6 port unreachable
    // quoting its twin as far (RFC 7915, 4.2), as IPv6's error builder makes it.
    let error = super::icmp_error("10.244.11.2", "10.244.1.2", 3, 3, &udp, 28);
    let (from, to) = (addr([10, 244, 11, 2].into()), addr([10, 244, 1, 2].into()));
    let want = sliceway_agent::kernel::packet::icmp6_error(from, to, 1, 4, 0, &udp6, 48);
    assert_eq!(packet(&error).unwrap(), want);
}

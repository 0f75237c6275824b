//! The IPv6 programs over maps written by hand, a table of its own (`HAND6`): ids,
//! slots, flags and backends no manifest gives (two frontends on one backend,
//! session affinity over three backends, the direct server return flag),
//! written beside the IPv4 maps of `ONE_BACKEND` and the IPv6 frontends of
//! `v6::write_v6_frontends`. A fixture names what it writes beyond those
//! ([`HandFixture::setup`]) and a sequence of packets, each with the program it
//! enters (the pods', the uplink's, XDP, the L3 programs of an interface without an
//! Ethernet header), its expected verdict, exit reason and output; where a fixture
//! asserts what no packet shows (the `AFFINITY` map's clients, the conntrack entries
//! direct server return records), an after-check reads it. The fixtures share one
//! datapath, emptied before each as the table's are (`forget`: conntrack, fragments,
//! affinity) and given back the common IPv6 frontends and no node address nor
//! masquerade sources, so state carries from one step to the next and never between
//! fixtures: they run twice, the second time in the reverse order.
//!
//! What stays a Rust test in `v6` on these maps, and why:
//! - IPv6 from outside through XDP beside the uplink's TC program
//!   (`ipv6_from_outside_is_decided_by_xdp_as_by_the_uplink_tc_program`): two
//!   datapaths side by side, each packet's outcome through XDP compared with TC's
//!   alone, as the IPv4 table's XDP test does;
//! - an error about a connection after its entries expire
//!   (`ipv6_an_error_about_a_connection_whose_entries_expired_passes_untouched`): a
//!   timeout waited out.

use std::net::{Ipv6Addr, SocketAddrV6};

use aya::maps::{HashMap, Map, MapData};
use dataplane_common::{
    addr_of, map_name, AffinityKey, AffinityValue, Backend6, CtEntry, CtKey, NatConfig6,
    ServiceKey6, ServiceValue, SlotKey, CT_FORWARD, CT_REVERSE, FAMILY_V6, PROTO_TCP,
    SVC_F_AFFINITY, SVC_F_DSR,
};
use sliceway_agent::kernel::{
    packet::{icmp6_message, icmp6_port_unreachable, parse, parse6, PROTO_ICMPV6},
    Datapath, Role, TC_ACT_REDIRECT, XDP_PASS,
};

use super::v6::{
    error6, frontend, ip, map, sa, set_nat6, tcp6, tcp6_data, tcp6_ext, udp6, v6_datapath, whole,
    with_dsr_header, write_v6_frontends, BACKEND, CLIENT, DSR_ID, DSR_LB, EMPTY, MTU, NODE, ROUTER,
    VIP,
};
use super::{forget, stat, tcp, BACKEND_HTTP, DROP, ETH, PASS, TCP_ACK, TCP_SYN, VIP_HTTP};

/// Direct server return's option is skipped where unrecognised (RFC 8200, 4.2: the
/// two high bits of its type zero), so a pod's kernel keeps the packet.
const _: () = assert!(dataplane_common::dsr6::OPT_TYPE >> 6 == 0);

/// The program a step's packet enters.
#[derive(Clone, Copy)]
enum Program {
    /// The pods' TC program (`sliceway_tc`).
    Pods,
    /// The uplink's TC program (`sliceway_tc_ext`): packets from outside the node.
    Uplink,
    /// The XDP program (`sliceway_xdp`).
    Xdp,
    /// The L3 programs of `role`, for an interface without an Ethernet header.
    L3(Role),
}

/// A check of an output the fixture cannot give as bytes: the output, and the
/// outputs of the fixture's earlier steps.
type Check = Box<dyn Fn(&[u8], &[Vec<u8>]) -> Result<(), String>>;

/// A check of the datapath after a fixture's last step: what was wrong.
type After = fn(&Datapath) -> Result<(), String>;

/// What the program must leave in the buffer.
enum Expect {
    /// The input, byte for byte.
    Unchanged,
    /// Nothing to check: the packet is dropped.
    Dropped,
    /// Exactly these bytes, its checksums right on their own too (an ICMPv6 error's
    /// and, where it quotes its packet whole, the quoted packet's).
    Translated(Vec<u8>),
    /// Exactly these bytes (a frame without an Ethernet header).
    Exact(Vec<u8>),
    /// What [`Check`] accepts.
    Check(Check),
}

/// One packet of a fixture and what must come of it.
struct HandStep {
    what: &'static str,
    program: Program,
    input: Vec<u8>,
    verdict: i32,
    /// The `stat` slot that must count this exit, and no other.
    reason: u32,
    output: Expect,
}

struct HandFixture {
    description: &'static str,
    /// Writes the fixture's maps and settings beyond the common ones.
    setup: fn(&mut Datapath),
    steps: fn() -> Vec<HandStep>,
    /// From this step on (counted from 0) the packets are another node's: the same
    /// maps, and a conntrack (fragments, affinity) of its own, empty when it comes.
    other_node_from: Option<usize>,
    /// Checks, after the last step, what no packet shows.
    after: Option<After>,
}

/// What a fixture leaves unsaid: nothing written beyond the common maps, one node,
/// nothing checked after the steps.
const HAND: HandFixture = HandFixture {
    description: "",
    setup: |_| {},
    steps: Vec::new,
    other_node_from: None,
    after: None,
};

/// A step through the pods' program.
fn pods(what: &'static str, input: Vec<u8>, reason: u32, output: Expect) -> HandStep {
    HandStep {
        what,
        program: Program::Pods,
        input,
        verdict: PASS,
        reason,
        output,
    }
}

/// A step through the uplink's TC program.
fn uplink(
    what: &'static str,
    input: Vec<u8>,
    verdict: i32,
    reason: u32,
    output: Expect,
) -> HandStep {
    HandStep {
        what,
        program: Program::Uplink,
        input,
        verdict,
        reason,
        output,
    }
}

/// A step through XDP, which leaves the packet to TC untouched.
fn xdp_to_tc(what: &'static str, input: Vec<u8>) -> HandStep {
    HandStep {
        what,
        program: Program::Xdp,
        input,
        verdict: XDP_PASS,
        reason: stat::XDP_TO_TC,
        output: Expect::Unchanged,
    }
}

/// The frontend of the affinity fixture, its id and its three backends' ids.
const STICKY: &str = "fd00:10:96::40";
const STICKY_ID: u32 = 907;
/// The affinity fixture's second client: its address differs from `CLIENT`'s only
/// in its second word.
const OTHER_CLIENT: &str = "fd00:10:244:2::5";
/// The second frontend on the first backend (4000) of the errors fixture.
const API: &str = "fd00:10:96::11";
/// The client outside of the masquerade and direct server return fixtures.
const OUTSIDE6: &str = "2001:db8::7";

/// Hand-written frontends' ids start here; the writer gives `ONE_BACKEND`'s far
/// fewer, from 1.
const HAND_IDS: u32 = 900;

/// The source port a connection from `src` to `dst` gets when its reply tuple is
/// taken: the first candidate of the rule, `1024 + flow_hash6 % 64512` (IPv4's
/// `super::remapped`).
fn remapped6(src: SocketAddrV6, dst: SocketAddrV6) -> SocketAddrV6 {
    let hash = dataplane_common::flow_hash6(
        addr_of(src.ip().octets()),
        addr_of(dst.ip().octets()),
        src.port().to_be(),
        dst.port().to_be(),
        PROTO_TCP,
    );
    SocketAddrV6::new(*src.ip(), (1024 + hash % 64_512) as u16, 0, 0)
}

/// An ICMPv6 echo request (RFC 4443, 4.1) from `from` to `to`.
fn echo_request(from: &str, to: &str) -> Vec<u8> {
    let (from, to): (Ipv6Addr, Ipv6Addr) = (from.parse().unwrap(), to.parse().unwrap());
    let eth = tcp6(sa(CLIENT, 1), sa(VIP, 1), 0)[..ETH]
        .try_into()
        .unwrap();
    icmp6_message(
        &eth,
        &from.octets(),
        &to.octets(),
        128,
        0,
        0x1234_0001,
        b"ping",
    )
}

/// `frame` without its Ethernet header, as an interface without one carries it.
fn l3(frame: Vec<u8>) -> Vec<u8> {
    frame[ETH..].to_vec()
}

/// The checksums of a rewritten frame, checked on their own (not by comparing with
/// the expected bytes, built with the same checksum code): IPv4's header and
/// transport; IPv6's transport, and for an ICMPv6 error quoting its packet whole the
/// quoted TCP or UDP checksum too (over the quoted addresses).
fn checksums_ok(got: &[u8]) -> Result<(), String> {
    if got.get(12..14) == Some(&[0x08, 0x00][..]) {
        return match parse(got) {
            Some(p) if p.ip_csum_ok && p.l4_csum_ok => Ok(()),
            other => Err(format!("rewritten IPv4 packet not valid: {other:?}")),
        };
    }
    let p = parse6(got).ok_or("not an IPv6 packet")?;
    if !p.l4_csum_ok {
        return Err(format!("L4 checksum wrong: {p:?}"));
    }
    if p.proto == PROTO_ICMPV6 && got[p.l4_off] < 128 {
        let quote = &got[p.l4_off + 8..];
        let quoted_len = 40 + u16::from_be_bytes([quote[4], quote[5]]) as usize;
        if quote.len() >= quoted_len {
            let frame = [&got[..ETH], &quote[..quoted_len]].concat();
            let q = parse6(&frame).ok_or("the quoted packet is no IPv6 packet")?;
            if !q.l4_csum_ok {
                return Err(format!("quoted checksum wrong: {q:?}"));
            }
        }
    }
    Ok(())
}

/// `got` is exactly `want`.
fn same(got: &[u8], want: &[u8]) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "output differs\n got:  {got:02x?}\n want: {want:02x?}"
        ))
    }
}

/// The affinity fixture's steps: twenty new connections from each of two clients,
/// each to the backend of its client's first (one of the three), exact bytes.
fn sticky_steps() -> Vec<HandStep> {
    let mut steps = Vec::new();
    for client in [CLIENT, OTHER_CLIENT] {
        let first = steps.len();
        for port in 50_000..50_020 {
            let src = sa(client, port);
            let check: Check = Box::new(move |got, earlier| {
                let backend = match earlier.get(first) {
                    Some(out) => *parse6(out).ok_or("no IPv6 packet")?.dst.ip(),
                    None => {
                        let to = *parse6(got).ok_or("not an IPv6 packet")?.dst.ip();
                        let backends: Vec<Ipv6Addr> = (2..5)
                            .map(|i| format!("fd00:10:244:11::{i}").parse().unwrap())
                            .collect();
                        if !backends.contains(&to) {
                            return Err(format!("{to} is none of the backends {backends:?}"));
                        }
                        to
                    }
                };
                same(
                    got,
                    &tcp6(src, SocketAddrV6::new(backend, 8080, 0, 0), TCP_SYN),
                )?;
                checksums_ok(got)
            });
            let what = if steps.len() == first {
                "a client's first connection"
            } else {
                "a later connection of the client: to the backend of its first"
            };
            steps.push(pods(
                what,
                tcp6(src, sa(STICKY, 80), TCP_SYN),
                stat::DNAT_NEW,
                Expect::Check(check),
            ));
        }
    }
    steps
}

/// `AFFINITY` holds one entry of the sticky frontend per client, keyed by the
/// client's whole address.
fn one_affinity_entry_per_client(dp: &Datapath) -> Result<(), String> {
    let affinity: HashMap<MapData, AffinityKey, AffinityValue> =
        HashMap::try_from(Map::LruHashMap(map(dp, map_name::AFFINITY)))
            .map_err(|e| e.to_string())?;
    let mut clients: Vec<[u32; 4]> = affinity
        .keys()
        .map(|k| k.map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|k| k.service_id == STICKY_ID)
        .map(|k| k.client)
        .collect();
    clients.sort();
    let mut want = vec![ip(CLIENT), ip(OTHER_CLIENT)];
    want.sort();
    if clients != want {
        return Err(format!("AFFINITY clients {clients:?} instead of {want:?}"));
    }
    Ok(())
}

/// The packet the first node sends the backend's for the direct server return
/// fixture's connection: the client kept, the header naming the frontend added.
fn dsr_sent() -> Vec<u8> {
    with_dsr_header(
        &tcp6(sa(OUTSIDE6, 41000), sa(BACKEND, 8080), TCP_SYN),
        sa(DSR_LB, 80),
    )
}

/// The backend's node holds the pair of `FAMILY_V6` entries of the connection it
/// learnt from the header (the frontend as its destination, no backend id), and
/// nothing else: neither the refused header nor the dropped ones recorded anything.
fn dsr_connection_recorded(dp: &Datapath) -> Result<(), String> {
    let key = CtKey {
        src_be: ip(OUTSIDE6),
        dst_be: ip(DSR_LB),
        sport_be: 41000u16.to_be(),
        dport_be: 80u16.to_be(),
        proto: PROTO_TCP,
        family: FAMILY_V6,
        _pad: [0; 2],
    };
    let reply = CtKey {
        src_be: ip(BACKEND),
        dst_be: ip(OUTSIDE6),
        sport_be: 8080u16.to_be(),
        dport_be: 41000u16.to_be(),
        ..key
    };
    let mut entries: Vec<(CtKey, CtEntry)> = dp.conntrack();
    entries.sort_by_key(|(_, e)| e.dir);
    let got: Vec<_> = entries
        .iter()
        .map(|(k, e)| (*k, e.pair, e.dir, e.service_id, e.backend_id))
        .collect();
    let want = [
        (key, reply, CT_FORWARD, DSR_ID, u32::MAX),
        (reply, key, CT_REVERSE, DSR_ID, u32::MAX),
    ];
    if got != want {
        return Err(format!("conntrack {got:?} instead of {want:?}"));
    }
    Ok(())
}

/// The reject an L3 uplink program sends for `EMPTY`: `BPF_PROG_TEST_RUN` makes an
/// skb with a 14-byte MAC header whatever the program, its protocol from bytes 12
/// and 13 (here the client's address's fifth and sixth, which `bpf_skb_adjust_room`
/// needs to say IPv6), so the room for the reply's headers is made 14 bytes in, not
/// at the start as on a real device without one: the quote comes out garbled here,
/// and only the reply's length, its header and its checksum are checked.
fn l3_reject_input() -> Vec<u8> {
    tcp6(sa("fd00:10:86dd::5", 41001), sa(EMPTY, 80), TCP_SYN)
}

fn l3_reject_ok(got: &[u8], _: &[Vec<u8>]) -> Result<(), String> {
    let want = l3(icmp6_port_unreachable(&l3_reject_input()));
    if got.len() != want.len() {
        return Err(format!("{} bytes instead of {}", got.len(), want.len()));
    }
    if got[..42] != want[..42] {
        return Err(format!(
            "IPv6 header, ICMPv6 type and code differ\n got:  {:02x?}\n want: {:02x?}",
            &got[..42],
            &want[..42]
        ));
    }
    let src: [u8; 16] = got[8..24].try_into().unwrap();
    let dst: [u8; 16] = got[24..40].try_into().unwrap();
    match sliceway_agent::kernel::packet::l4_checksum6(&src, &dst, 58, &got[40..]) {
        0 => Ok(()),
        c => Err(format!("ICMPv6 checksum wrong (sums to {c:#x})")),
    }
}

static HAND6: &[HandFixture] = &[
    HandFixture {
        // Conntrack keeps the families apart: the IPv4 twin of the flow is new to it.
        description: "IPv6 TCP to a ClusterIP is translated and its replies reversed",
        steps: || {
            let client = sa(CLIENT, 41000);
            vec![
                pods(
                    "a new connection",
                    tcp6(client, sa(VIP, 80), TCP_SYN),
                    stat::DNAT_NEW,
                    Expect::Translated(tcp6(client, sa(BACKEND, 8080), TCP_SYN)),
                ),
                pods(
                    "an established packet",
                    tcp6(client, sa(VIP, 80), TCP_ACK),
                    stat::DNAT_ESTABLISHED,
                    Expect::Translated(tcp6(client, sa(BACKEND, 8080), TCP_ACK)),
                ),
                pods(
                    "the backend's reply",
                    tcp6(sa(BACKEND, 8080), client, TCP_SYN | TCP_ACK),
                    stat::REVNAT,
                    Expect::Translated(tcp6(sa(VIP, 80), client, TCP_SYN | TCP_ACK)),
                ),
                pods(
                    "the IPv4 twin of the flow, new",
                    tcp(super::client(41000), VIP_HTTP, TCP_ACK),
                    stat::DNAT_NEW,
                    Expect::Translated(tcp(super::client(41000), BACKEND_HTTP, TCP_ACK)),
                ),
            ]
        },
        ..HAND
    },
    HandFixture {
        description: "IPv4 is served as before beside IPv6",
        steps: || {
            vec![pods(
                "an IPv4 connection",
                tcp(super::client(41000), VIP_HTTP, TCP_SYN),
                stat::DNAT_NEW,
                Expect::Translated(tcp(super::client(41000), BACKEND_HTTP, TCP_SYN)),
            )]
        },
        ..HAND
    },
    HandFixture {
        // Every connection of one client lands on the backend its first got,
        // whatever its port hashes to; `AFFINITY` holds one entry per client.
        description: "IPv6 session affinity keys a client by its whole address",
        setup: |dp| {
            frontend(dp, STICKY, STICKY_ID, SVC_F_AFFINITY, &[4010, 4011, 4012]);
        },
        steps: sticky_steps,
        after: Some(one_affinity_entry_per_client),
        ..HAND
    },
    HandFixture {
        // Issue 46: `super::pods_connections_to_a_clusterip_are_masqueraded_as_the_
        // detector_says` over IPv6: `MASQ_SOURCES6` from an IPv6 cluster CIDR.
        description:
            "IPv6 pods' connections are not masqueraded, others' are, as the detector says",
        setup: |dp| {
            set_nat6(dp);
            let (v4, v6) = sliceway_agent::agent::masq_sources(
                false,
                &[("fd00:10:244::".parse().unwrap(), 48)],
            );
            assert!(v4.is_empty(), "an IPv6 cluster CIDR gave IPv4 sources");
            dp.set_masq_sources(&v4, &v6).unwrap();
        },
        steps: || {
            let pod = sa(CLIENT, 41000);
            let outside = sa(OUTSIDE6, 41000);
            vec![
                pods(
                    "a pod's connection",
                    tcp6(pod, sa(VIP, 80), TCP_SYN),
                    stat::DNAT_NEW,
                    Expect::Translated(tcp6(pod, sa(BACKEND, 8080), TCP_SYN)),
                ),
                pods(
                    "a connection from outside the cluster CIDR",
                    tcp6(outside, sa(VIP, 80), TCP_SYN),
                    stat::DNAT_MASQUERADED,
                    Expect::Translated(tcp6(sa(NODE, 61000), sa(BACKEND, 8080), TCP_SYN)),
                ),
                pods(
                    "its reply",
                    tcp6(sa(BACKEND, 8080), sa(NODE, 61000), TCP_SYN | TCP_ACK),
                    stat::REVNAT,
                    Expect::Translated(tcp6(sa(VIP, 80), outside, TCP_SYN | TCP_ACK)),
                ),
                // The IPv4 cluster CIDR was not given: IPv4 sources are not
                // masqueraded.
                pods(
                    "an IPv4 connection from elsewhere",
                    tcp("192.168.7.7:40000".parse().unwrap(), VIP_HTTP, TCP_SYN),
                    stat::DNAT_NEW,
                    Expect::Translated(tcp(
                        "192.168.7.7:40000".parse().unwrap(),
                        BACKEND_HTTP,
                        TCP_SYN,
                    )),
                ),
            ]
        },
        ..HAND
    },
    HandFixture {
        description: "IPv6 pods' connections are masqueraded with --masquerade-all",
        setup: |dp| {
            set_nat6(dp);
            let (v4, v6) = sliceway_agent::agent::masq_sources(true, &[]);
            dp.set_masq_sources(&v4, &v6).unwrap();
        },
        steps: || {
            let pod = sa(CLIENT, 41000);
            vec![pods(
                "a pod's connection",
                tcp6(pod, sa(VIP, 80), TCP_SYN),
                stat::DNAT_MASQUERADED,
                Expect::Translated(tcp6(sa(NODE, 61000), sa(BACKEND, 8080), TCP_SYN)),
            )]
        },
        ..HAND
    },
    HandFixture {
        // Issue 12. The first node's uplink program sends a new connection from
        // outside to its backend with the client's own address and a destination
        // options header naming the frontend right after the fixed header (before
        // extension headers the client sent, too); later packets go without it;
        // XDP leaves the new connection to TC. The backend's node (the same maps,
        // its conntrack empty: it saw nothing of the connection) records the
        // connection from the header, so the pod's reply leaves with the frontend
        // as its source; a header naming no frontend of the node is refused
        // (nothing recorded, the reply untouched), one on a packet to a frontend or
        // a ClusterIP dropped; a packet with a hop-by-hop header (which must stay
        // first, RFC 8200, 4.1) is dropped, never sent on without the header.
        description: "IPv6 direct server return carries the frontend to the backend's node",
        setup: |dp| frontend(dp, DSR_LB, DSR_ID, SVC_F_DSR, &[4020]),
        steps: || {
            let lb = sa(DSR_LB, 80);
            let pod = sa(BACKEND, 8080);
            let client = sa(OUTSIDE6, 41000);
            let other = sa(OUTSIDE6, 41001);
            let stranger = sa(OUTSIDE6, 41003);
            let odd = |to| with_dsr_header(&tcp6(sa(OUTSIDE6, 41004), to, TCP_SYN), lb);
            vec![
                xdp_to_tc("a new connection", tcp6(client, lb, TCP_SYN)),
                uplink(
                    "the new connection: to the backend, the client kept, the header added",
                    tcp6(client, lb, TCP_SYN),
                    PASS,
                    stat::DNAT_DSR,
                    Expect::Translated(dsr_sent()),
                ),
                uplink(
                    "a later packet: translated, no header",
                    tcp6(client, lb, TCP_ACK),
                    PASS,
                    stat::DNAT_ESTABLISHED,
                    Expect::Translated(tcp6(client, pod, TCP_ACK)),
                ),
                uplink(
                    "a client's own destination options header: kept, after this one",
                    tcp6_ext(other, lb, &[60]),
                    PASS,
                    stat::DNAT_DSR,
                    Expect::Translated(with_dsr_header(&tcp6_ext(other, pod, &[60]), lb)),
                ),
                uplink(
                    "a hop-by-hop header, which must stay first",
                    tcp6_ext(sa(OUTSIDE6, 41002), lb, &[0]),
                    DROP,
                    stat::DROP_DSR_OPTION,
                    Expect::Dropped,
                ),
                // The backend's node from here.
                xdp_to_tc("the packet carrying the header", dsr_sent()),
                uplink(
                    "the packet carrying the header: recorded, passed as it came",
                    dsr_sent(),
                    PASS,
                    stat::DSR_ACCEPTED,
                    Expect::Unchanged,
                ),
                pods(
                    "the pod's reply: from the frontend",
                    tcp6(pod, client, TCP_SYN | TCP_ACK),
                    stat::REVNAT,
                    Expect::Translated(tcp6(lb, client, TCP_SYN | TCP_ACK)),
                ),
                uplink(
                    "a header naming no frontend of this node: refused",
                    with_dsr_header(&tcp6(stranger, pod, TCP_SYN), sa("2001:db8:1::99", 80)),
                    PASS,
                    stat::PASS_DSR_REFUSED,
                    Expect::Unchanged,
                ),
                pods(
                    "the pod's reply to it: untouched",
                    tcp6(pod, stranger, TCP_SYN | TCP_ACK),
                    stat::PASS_NO_SERVICE,
                    Expect::Unchanged,
                ),
                uplink(
                    "the header on a packet to a frontend",
                    odd(lb),
                    DROP,
                    stat::DROP_DSR_OPTION,
                    Expect::Dropped,
                ),
                uplink(
                    "the header on a packet to a ClusterIP",
                    odd(sa(VIP, 80)),
                    DROP,
                    stat::DROP_DSR_OPTION,
                    Expect::Dropped,
                ),
            ]
        },
        other_node_from: Some(5),
        after: Some(dsr_connection_recorded),
    },
    HandFixture {
        // Interfaces without an Ethernet header (a tun device, WireGuard): the L3
        // programs hand IPv6 (IP version 6) to `sliceway_l3_6`, whose offsets start
        // at the IP header, translate ICMPv6 errors through `sliceway_icmp6_l3` and
        // reject through `sliceway_rej6_l3`.
        description: "IPv6 on an interface without an Ethernet header",
        steps: || {
            let client = sa(CLIENT, 41000);
            let sent = tcp6(client, sa(BACKEND, 8080), TCP_ACK);
            let asked = tcp6(client, sa(VIP, 80), TCP_ACK);
            vec![
                HandStep {
                    what: "a new connection",
                    program: Program::L3(Role::Pods),
                    input: l3(tcp6(client, sa(VIP, 80), TCP_SYN)),
                    verdict: PASS,
                    reason: stat::DNAT_NEW,
                    output: Expect::Exact(l3(tcp6(client, sa(BACKEND, 8080), TCP_SYN))),
                },
                HandStep {
                    what: "an error about the connection, through sliceway_icmp6_l3",
                    program: Program::L3(Role::Pods),
                    input: l3(error6(ROUTER, CLIENT, [2, 0], MTU, &sent, whole(&sent))),
                    verdict: PASS,
                    reason: stat::NAT_ICMP_ERROR,
                    output: Expect::Exact(l3(error6(
                        ROUTER,
                        CLIENT,
                        [2, 0],
                        MTU,
                        &asked,
                        whole(&asked),
                    ))),
                },
                HandStep {
                    what: "a frontend without backends from outside: rejected",
                    program: Program::L3(Role::External),
                    input: l3(l3_reject_input()),
                    verdict: TC_ACT_REDIRECT,
                    reason: stat::REJECT_NO_BACKEND,
                    output: Expect::Check(Box::new(l3_reject_ok)),
                },
            ]
        },
        ..HAND
    },
    HandFixture {
        // ECONNREFUSED through an IPv6 ClusterIP: the backend itself answers a UDP
        // datagram with port unreachable. The error comes from the frontend and
        // quotes what the client sent. Time exceeded and parameter problem (its
        // pointer kept) from a router are translated too; the same error from a
        // router about a connection whose client port was remapped (a second
        // frontend on the same backend, the same client port, as IPv4's clash
        // fixture) quotes the client's own port.
        description: "IPv6 errors from the backend and its path about a connection are translated",
        setup: |dp| frontend(dp, API, 906, 0, &[4000]),
        steps: || {
            let client = sa(CLIENT, 42000);
            let sent = udp6(client, sa(BACKEND, 5353), b"query");
            let asked = udp6(client, sa(VIP, 53), b"query");
            let tcp_client = sa(CLIENT, 41000);
            let remapped = remapped6(tcp_client, sa(API, 80));
            let remapped_sent = tcp6(remapped, sa(BACKEND, 8080), TCP_ACK);
            let remapped_asked = tcp6(tcp_client, sa(API, 80), TCP_ACK);
            let mut steps = vec![
                pods(
                    "a UDP datagram",
                    udp6(client, sa(VIP, 53), b"query"),
                    stat::DNAT_NEW,
                    Expect::Translated(sent.clone()),
                ),
                pods(
                    "the backend's port unreachable: from the frontend",
                    error6(BACKEND, CLIENT, [1, 4], 0, &sent, whole(&sent)),
                    stat::NAT_ICMP_ERROR,
                    Expect::Translated(error6(VIP, CLIENT, [1, 4], 0, &asked, whole(&asked))),
                ),
            ];
            for (what, kind, word) in [
                ("a router's time exceeded", [3, 0], 0),
                ("a router's parameter problem, its pointer kept", [4, 1], 46),
            ] {
                steps.push(pods(
                    what,
                    error6(ROUTER, CLIENT, kind, word, &sent, whole(&sent)),
                    stat::NAT_ICMP_ERROR,
                    Expect::Translated(error6(ROUTER, CLIENT, kind, word, &asked, whole(&asked))),
                ));
            }
            steps.extend([
                pods(
                    "a TCP connection to the first frontend",
                    tcp6(tcp_client, sa(VIP, 80), TCP_SYN),
                    stat::DNAT_NEW,
                    Expect::Translated(tcp6(tcp_client, sa(BACKEND, 8080), TCP_SYN)),
                ),
                pods(
                    "one from the same port to the second: its port remapped",
                    tcp6(tcp_client, sa(API, 80), TCP_SYN),
                    stat::DNAT_PORT_REMAPPED,
                    Expect::Translated(tcp6(remapped, sa(BACKEND, 8080), TCP_SYN)),
                ),
                pods(
                    "a router's error about it: quoting the client's own port",
                    error6(
                        ROUTER,
                        CLIENT,
                        [3, 0],
                        0,
                        &remapped_sent,
                        whole(&remapped_sent),
                    ),
                    stat::NAT_ICMP_ERROR,
                    Expect::Translated(error6(
                        ROUTER,
                        CLIENT,
                        [3, 0],
                        0,
                        &remapped_asked,
                        whole(&remapped_asked),
                    )),
                ),
            ]);
            steps
        },
        ..HAND
    },
    HandFixture {
        // An error about a flow nobody translated, one a client sends about a
        // backend's reply (only errors towards the client are translated), echo to
        // a frontend and to a pod. (One about a connection that ended, its entries
        // expired, is `v6::ipv6_an_error_about_a_connection_whose_entries_expired_
        // passes_untouched`.)
        description: "IPv6 errors about no live connection and echo pass untouched",
        steps: || {
            let client = sa(CLIENT, 43000);
            let untracked = tcp6_data(sa(CLIENT, 43001), sa(BACKEND, 8080), 10);
            let reply = tcp6(sa(BACKEND, 8080), client, TCP_SYN | TCP_ACK);
            let untouched = |what, input| pods(what, input, stat::PASS_NOT_L4, Expect::Unchanged);
            vec![
                pods(
                    "a connection",
                    tcp6(client, sa(VIP, 80), TCP_SYN),
                    stat::DNAT_NEW,
                    Expect::Translated(tcp6(client, sa(BACKEND, 8080), TCP_SYN)),
                ),
                untouched(
                    "a router's packet too big about an untracked flow",
                    error6(ROUTER, CLIENT, [2, 0], MTU, &untracked, whole(&untracked)),
                ),
                untouched(
                    "a port unreachable about an untracked flow",
                    error6(BACKEND, CLIENT, [1, 4], 0, &untracked, whole(&untracked)),
                ),
                untouched(
                    "the client's error about the backend's reply",
                    error6(CLIENT, BACKEND, [1, 4], 0, &reply, whole(&reply)),
                ),
                untouched("echo to the frontend", echo_request(CLIENT, VIP)),
                untouched("echo to a pod", echo_request(CLIENT, BACKEND)),
            ]
        },
        ..HAND
    },
];

/// Gives `dp` back what every fixture starts from: the common IPv6 frontends alone
/// (every IPv6 service and backend removed, and the slots of hand-written ids), no
/// node address, no masquerade sources.
fn reset(dp: &mut Datapath) -> Result<(), String> {
    fn clear<K: aya::Pod, V: aya::Pod>(
        dp: &Datapath,
        name: &str,
        keep: impl Fn(&K) -> bool,
    ) -> Result<(), String> {
        let mut m: HashMap<MapData, K, V> =
            HashMap::try_from(Map::HashMap(map(dp, name))).map_err(|e| e.to_string())?;
        let keys: Vec<K> = m
            .keys()
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        for k in keys.iter().filter(|k| !keep(k)) {
            m.remove(k).map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }
    clear::<ServiceKey6, ServiceValue>(dp, map_name::SERVICES6, |_| false)?;
    clear::<u32, Backend6>(dp, map_name::BACKENDS6, |_| false)?;
    clear::<SlotKey, u32>(dp, map_name::SLOTS, |k| k.service_id < HAND_IDS)?;
    write_v6_frontends(dp);
    dp.set_nat6(NatConfig6 {
        node_addr_be: [0; 4],
        port_min: 0,
        port_max: 0,
    })
    .map_err(|e| e.to_string())?;
    dp.set_masq_sources(&[], &[]).map_err(|e| e.to_string())
}

/// Runs one fixture on `dp` (emptied of what earlier ones left, its maps written);
/// the first step that does not match, described.
fn run_hand(dp: &mut Datapath, fixture: &HandFixture) -> Result<(), String> {
    forget(dp);
    reset(dp)?;
    (fixture.setup)(dp);
    let mut outputs: Vec<Vec<u8>> = Vec::new();
    for (i, step) in (fixture.steps)().into_iter().enumerate() {
        if fixture.other_node_from == Some(i) {
            forget(dp);
        }
        let at = format!("step {} ({})", i + 1, step.what);
        let out = super::checked_run(&at, dp, step.verdict, step.reason, |dp| {
            match step.program {
                Program::Pods => dp.test_run(&step.input),
                Program::Uplink => dp.test_run_as(Role::External, &step.input),
                Program::Xdp => dp.test_run_xdp(&step.input),
                Program::L3(role) => dp.test_run_l3(role, &step.input),
            }
        })?;
        let checked = match &step.output {
            Expect::Dropped => Ok(()),
            Expect::Unchanged => same(&out.packet, &step.input),
            Expect::Exact(want) => same(&out.packet, want),
            Expect::Translated(want) => {
                same(&out.packet, want).and_then(|()| checksums_ok(&out.packet))
            }
            Expect::Check(check) => check(&out.packet, &outputs),
        };
        checked.map_err(|e| format!("{at}: {e}"))?;
        outputs.push(out.packet);
    }
    if let Some(after) = fixture.after {
        after(dp).map_err(|e| format!("after the last step: {e}"))?;
    }
    Ok(())
}

/// Every fixture of [`HAND6`] on one datapath, then again in the reverse order: the
/// emptying between fixtures is enough.
#[test]
fn ipv6_hand_map_fixtures() {
    let mut names: Vec<&str> = HAND6.iter().map(|f| f.description).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), HAND6.len(), "fixture descriptions repeat");
    let mut dp = v6_datapath();
    let order = HAND6.iter().chain(HAND6.iter().rev());
    let failures: Vec<String> = order
        .enumerate()
        .filter_map(|(n, f)| {
            let pass = if n < HAND6.len() {
                ""
            } else {
                " (reverse order)"
            };
            run_hand(&mut dp, f)
                .err()
                .map(|e| format!("{}{pass}: {e}", f.description))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} hand-map fixture runs failed:\n{}",
        failures.len(),
        2 * HAND6.len(),
        failures.join("\n")
    );
}

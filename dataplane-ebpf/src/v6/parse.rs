//! Parsing IPv6: the fixed header, a bounded walk over extension headers, then
//! TCP/UDP/SCTP into a [`Flow6`]. Deliberate policy, as IPv4's (`crate::parse`):
//! - extension headers walked: hop-by-hop options (0), routing (43), destination
//!   options (60), fragment (44), at most `IPV6_EXT_MAX` of them (RFC 8200, 4.1
//!   recommends each at most once, destination options twice); a longer chain is
//!   dropped (`drop_ipv6_ext_chain`), never passed to a frontend untranslated;
//! - ICMPv6 goes to `super::icmp` (errors about translated connections are
//!   translated back, everything else, neighbour discovery and echo included, passes
//!   untouched), unless it is a fragment: passed untouched, as IPv4's fragmented ICMP;
//! - AH, ESP, no next header and any other protocol pass untouched (`pass_not_l4`);
//! - UDP with checksum zero is invalid over IPv6 (RFC 8200, 8.1): dropped as
//!   malformed; truncated headers, or headers beyond the payload length, too;
//! - fragments as IPv4's: the first fragment's ports are remembered in `FRAGMENTS6`
//!   per (source, destination, identification, protocol) (RFC 8200, 4.5), later ones
//!   take them from there, orphans are dropped. A datagram whose fragment header is
//!   followed by more extension headers (so later fragments cannot name their
//!   transport) is passed untouched, every fragment of it alike.

use dataplane_common::{
    stat, FragKey6, FragPorts, IPV6_DEST_OPTS, IPV6_EXT_MAX, IPV6_FRAGMENT, IPV6_HOP_BY_HOP,
    IPV6_ROUTING, PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};

use super::Flow6;
use crate::{
    counters::Exit,
    maps::{self, FRAGMENTS6},
    packet::{ipv6, load, sctp, tcp, udp, Frame, ETH_P_IPV6, ETH_TYPE_OFF},
    tc::{DROP, PASS},
};

/// The fragment header's offset field: the offset in 8-byte units in the upper 13
/// bits, the more-fragments flag in the lowest.
const FRAG_OFFSET_MASK: u16 = 0xfff8;
const FRAG_MORE: u16 = 1;

/// What parsing found. The addresses are in the flow either way.
pub enum Packet6 {
    /// TCP, UDP or SCTP: the flow is whole.
    L4,
    /// ICMPv6, not a fragment: offset of its header, end of the payload (offsets
    /// into the packet).
    Icmp { l4_off: usize, ip_end: usize },
}

/// Parses the packet into `flow` (the per-CPU scratch: the addresses go straight
/// there, never held in registers spilled to the stack). `Err` carries the exit for
/// packets the program does not handle.
#[inline(always)]
pub fn parse<C: Frame>(ctx: &C, flow: &mut Flow6) -> Result<Packet6, Exit> {
    if C::L2 > 0 {
        let ether_type: [u8; 2] = load(ctx, ETH_TYPE_OFF).ok_or((DROP, stat::DROP_MALFORMED))?;
        if u16::from_be_bytes(ether_type) != ETH_P_IPV6 {
            return Err((PASS, stat::PASS_NOT_IPV4));
        }
    }
    let head: [u8; 8] = load(ctx, C::L2).ok_or((DROP, stat::DROP_MALFORMED))?;
    if head[0] >> 4 != 6 {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    flow.src_be = load(ctx, C::L2 + ipv6::SRC).ok_or((DROP, stat::DROP_MALFORMED))?;
    flow.dst_be = load(ctx, C::L2 + ipv6::DST).ok_or((DROP, stat::DROP_MALFORMED))?;
    let payload = u16::from_be_bytes([head[ipv6::PAYLOAD_LEN], head[ipv6::PAYLOAD_LEN + 1]]);
    let ip_end = C::L2 + ipv6::LEN + payload as usize;
    let mut next = head[ipv6::NEXT];
    let mut off = C::L2 + ipv6::LEN;
    // The fragment header's offset field and identification, if there is one.
    let mut frag: Option<(u16, u32)> = None;
    // A constant bound: unrolled, one header per round. Each header is read as a
    // scalar (held in a register, not copied to the stack once per round).
    for _ in 0..IPV6_EXT_MAX {
        if next == IPV6_HOP_BY_HOP || next == IPV6_ROUTING || next == IPV6_DEST_OPTS {
            // Next header, then the length in 8-byte units not counting the first 8.
            let h = load::<u16>(ctx, off)
                .ok_or((DROP, stat::DROP_MALFORMED))?
                .to_ne_bytes();
            next = h[0];
            off += (h[1] as usize + 1) * 8;
        } else if next == IPV6_FRAGMENT {
            let h = load::<u64>(ctx, off)
                .ok_or((DROP, stat::DROP_MALFORMED))?
                .to_ne_bytes();
            next = h[0];
            off += 8;
            frag = Some((
                u16::from_be_bytes([h[2], h[3]]),
                u32::from_ne_bytes([h[4], h[5], h[6], h[7]]),
            ));
            // What follows belongs to the fragmentable part.
            break;
        } else {
            break;
        }
    }
    if frag.is_none()
        && (next == IPV6_HOP_BY_HOP
            || next == IPV6_ROUTING
            || next == IPV6_DEST_OPTS
            || next == IPV6_FRAGMENT)
    {
        return Err((DROP, stat::DROP_IPV6_EXT_CHAIN));
    }
    if off > ip_end {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let proto = next;
    if proto == PROTO_ICMPV6 && frag.is_none() {
        return Ok(Packet6::Icmp {
            l4_off: off,
            ip_end,
        });
    }
    if proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP {
        return Err((PASS, stat::PASS_NOT_L4));
    }
    let mut first_fragment = None;
    if let Some((field, id_be)) = frag {
        let frag_key = FragKey6 {
            src_be: flow.src_be,
            dst_be: flow.dst_be,
            id_be,
            proto,
            _pad: [0; 3],
        };
        if field & FRAG_OFFSET_MASK != 0 {
            let ports = maps::fragment6(&frag_key).ok_or((DROP, stat::DROP_FRAGMENT_ORPHAN))?;
            flow.sport_be = ports.sport_be;
            flow.dport_be = ports.dport_be;
            flow.proto = proto;
            flow.syn_only = false;
            flow.tcp_flags = 0;
            flow.later_fragment = true;
            flow.l4_len = 0;
            flow.l4_off = off;
            return Ok(Packet6::L4);
        }
        if field & FRAG_MORE != 0 {
            first_fragment = Some(frag_key);
        }
    }
    let l4_min = if proto == PROTO_TCP {
        tcp::MIN_LEN
    } else if proto == PROTO_SCTP {
        sctp::MIN_LEN
    } else {
        udp::LEN
    };
    if ip_end < off + l4_min {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let mut syn_only = false;
    let mut tcp_flags = 0;
    let (sport_be, dport_be) = if proto == PROTO_TCP {
        let h: [u8; tcp::MIN_LEN] = load(ctx, off).ok_or((DROP, stat::DROP_MALFORMED))?;
        tcp_flags = h[tcp::FLAGS];
        syn_only = tcp_flags & (tcp::FLAG_SYN | tcp::FLAG_ACK) == tcp::FLAG_SYN;
        (port(&h, tcp::SPORT), port(&h, tcp::DPORT))
    } else if proto == PROTO_SCTP {
        let h: [u8; sctp::MIN_LEN] = load(ctx, off).ok_or((DROP, stat::DROP_MALFORMED))?;
        let chunk = h[sctp::CHUNK_TYPE];
        syn_only = chunk == sctp::CHUNK_INIT;
        if chunk == sctp::CHUNK_ABORT || chunk == sctp::CHUNK_SHUTDOWN_COMPLETE {
            tcp_flags = tcp::FLAG_RST;
        }
        (port(&h, sctp::SPORT), port(&h, sctp::DPORT))
    } else {
        let h: [u8; udp::LEN] = load(ctx, off).ok_or((DROP, stat::DROP_MALFORMED))?;
        // RFC 8200, 8.1: an IPv6 node discards UDP packets with a zero checksum.
        if h[udp::CSUM] == 0 && h[udp::CSUM + 1] == 0 {
            return Err((DROP, stat::DROP_MALFORMED));
        }
        (port(&h, udp::SPORT), port(&h, udp::DPORT))
    };
    if let Some(frag_key) = first_fragment {
        // Later fragments find their ports here. If the map refuses, they are
        // dropped as orphans, never passed untranslated.
        let _ = FRAGMENTS6.insert(frag_key, FragPorts { sport_be, dport_be }, 0);
    }
    flow.sport_be = sport_be;
    flow.dport_be = dport_be;
    flow.proto = proto;
    flow.syn_only = syn_only;
    flow.tcp_flags = tcp_flags;
    flow.later_fragment = false;
    flow.l4_len = if first_fragment.is_some() {
        0
    } else {
        (ip_end - off) as u16
    };
    flow.l4_off = off;
    Ok(Packet6::L4)
}

/// The port at `at` of a header copy, as it lies in the packet.
#[inline(always)]
fn port<const N: usize>(h: &[u8; N], at: usize) -> u16 {
    u16::from_ne_bytes([h[at], h[at + 1]])
}

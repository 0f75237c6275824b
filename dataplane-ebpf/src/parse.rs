//! Parsing: Ethernet (or none, on an L3 device) + IPv4 + TCP/UDP/SCTP into a
//! [`Flow`]. IPv6 never gets here: the entry programs hand it to the IPv6 programs
//! (`crate::v6`) first. Deliberate policy for what the program does not handle:
//! other EtherTypes (any IP version but 4 and 6 is malformed) and other IP
//! protocols pass untouched; truncated or malformed headers drop, and so does a
//! packet whose IP total length ends before its L4 header (never rewritten: the bytes
//! after the datagram are not ours).
//!
//! Fragments, as Cilium's fragment map does
//! (https://github.com/cilium/cilium/blob/main/bpf/lib/ipv4.h): the first fragment
//! carries the ports, which are remembered per (source, destination, id, protocol);
//! later fragments take them from there and are translated like the first one
//! (addresses only: they carry no L4 header). A later fragment whose first one was
//! never seen is dropped and counted: its ports, so its Service, are unknown, and it
//! must not reach a VIP untranslated. This also drops out-of-order fragments of
//! traffic that is not a Service's; on the veth links of a node they do not arrive
//! out of order.

use dataplane_common::{stat, FragKey, FragPorts, PROTO_ICMP, PROTO_SCTP, PROTO_TCP, PROTO_UDP};

use crate::{
    counters::Exit,
    maps::{self, FRAGMENTS},
    packet::{ipv4, load, sctp, tcp, udp, Flow, Frame, Packet, ETH_P_IP, ETH_TYPE_OFF},
    tc::{DROP, PASS},
};

/// On an interface without an Ethernet header the IP version says the family: IPv6
/// goes to the IPv6 program (checked before `parse`, which then takes any other
/// version as malformed).
#[inline(always)]
pub fn l3_not_ipv4(ctx: &impl Frame) -> bool {
    load::<u32>(ctx, 0).is_some_and(|w| w.to_ne_bytes()[ipv4::VERSION_IHL] >> 4 == 6)
}

/// Parses the packet. `Err` carries the exit for packets the program does not handle.
#[inline(always)]
pub fn parse<C: Frame>(ctx: &C) -> Result<Packet, Exit> {
    if C::L2 > 0 {
        let ether_type: [u8; 2] = load(ctx, ETH_TYPE_OFF).ok_or((DROP, stat::DROP_MALFORMED))?;
        if u16::from_be_bytes(ether_type) != ETH_P_IP {
            return Err((PASS, stat::PASS_NOT_IPV4));
        }
    }
    let ip: [u8; ipv4::MIN_LEN] = load(ctx, C::L2).ok_or((DROP, stat::DROP_MALFORMED))?;
    if ip[ipv4::VERSION_IHL] >> 4 != 4 {
        // Behind an IPv4 EtherType, or on an L3 device after `l3_not_ipv4`.
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let ihl = ((ip[ipv4::VERSION_IHL] & 0x0f) as usize) * 4;
    if !(ipv4::MIN_LEN..=ipv4::MAX_LEN).contains(&ihl) {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let proto = ip[ipv4::PROTO];
    if proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP && proto != PROTO_ICMP {
        return Err((PASS, stat::PASS_NOT_L4));
    }
    let total = u16::from_be_bytes([ip[ipv4::TOTAL_LEN], ip[ipv4::TOTAL_LEN + 1]]) as usize;
    if total < ihl {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let src_be = u32::from_ne_bytes(field4(&ip, ipv4::SRC));
    let dst_be = u32::from_ne_bytes(field4(&ip, ipv4::DST));
    let l4_off = C::L2 + ihl;
    let frag = u16::from_be_bytes([ip[ipv4::FLAGS_FRAG], ip[ipv4::FLAGS_FRAG + 1]]);
    let frag_key = FragKey {
        src_be,
        dst_be,
        id_be: u16::from_ne_bytes(field2(&ip, ipv4::ID)),
        proto,
        _pad: 0,
    };
    if proto == PROTO_ICMP {
        // Only whole ICMP messages are looked at (errors are small).
        if frag & (ipv4::FRAG_OFFSET_MASK | ipv4::FLAG_MF) != 0 {
            return Err((PASS, stat::PASS_NOT_L4));
        }
        return Ok(Packet::Icmp {
            src_be,
            l4_off,
            ip_end: C::L2 + total,
        });
    }
    if frag & ipv4::FRAG_OFFSET_MASK != 0 {
        let ports = maps::fragment(&frag_key).ok_or((DROP, stat::DROP_FRAGMENT_ORPHAN))?;
        return Ok(Packet::L4(Flow {
            src_be,
            dst_be,
            sport_be: ports.sport_be,
            dport_be: ports.dport_be,
            proto,
            l4_off,
            l4_len: 0,
            syn_only: false,
            tcp_flags: 0,
            udp_no_csum: false,
            later_fragment: true,
        }));
    }
    let l4_min = if proto == PROTO_TCP {
        tcp::MIN_LEN
    } else if proto == PROTO_SCTP {
        sctp::MIN_LEN
    } else {
        udp::LEN
    };
    if total < ihl + l4_min {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let mut syn_only = false;
    let (sport_be, dport_be, tcp_flags, udp_no_csum) = if proto == PROTO_TCP {
        let h: [u8; tcp::MIN_LEN] = load(ctx, l4_off).ok_or((DROP, stat::DROP_MALFORMED))?;
        let flags = h[tcp::FLAGS];
        syn_only = flags & (tcp::FLAG_SYN | tcp::FLAG_ACK) == tcp::FLAG_SYN;
        (
            u16::from_ne_bytes(field2(&h, tcp::SPORT)),
            u16::from_ne_bytes(field2(&h, tcp::DPORT)),
            flags,
            false,
        )
    } else if proto == PROTO_SCTP {
        // Only the first chunk is read: INIT, SHUTDOWN COMPLETE are never bundled
        // (RFC 9260, 6.10); an ABORT bundled after others is seen by the idle timeout.
        let h: [u8; sctp::MIN_LEN] = load(ctx, l4_off).ok_or((DROP, stat::DROP_MALFORMED))?;
        let chunk = h[sctp::CHUNK_TYPE];
        syn_only = chunk == sctp::CHUNK_INIT;
        let ends = chunk == sctp::CHUNK_ABORT || chunk == sctp::CHUNK_SHUTDOWN_COMPLETE;
        (
            u16::from_ne_bytes(field2(&h, sctp::SPORT)),
            u16::from_ne_bytes(field2(&h, sctp::DPORT)),
            if ends { tcp::FLAG_RST } else { 0 },
            false,
        )
    } else {
        let h: [u8; udp::LEN] = load(ctx, l4_off).ok_or((DROP, stat::DROP_MALFORMED))?;
        (
            u16::from_ne_bytes(field2(&h, udp::SPORT)),
            u16::from_ne_bytes(field2(&h, udp::DPORT)),
            0,
            field2(&h, udp::CSUM) == [0, 0],
        )
    };
    let first_fragment = frag & ipv4::FLAG_MF != 0;
    if first_fragment {
        // A first fragment: later ones find their ports here. If the map refuses,
        // they are dropped as orphans, never passed untranslated.
        let _ = FRAGMENTS.insert(frag_key, FragPorts { sport_be, dport_be }, 0);
    }
    Ok(Packet::L4(Flow {
        src_be,
        dst_be,
        sport_be,
        dport_be,
        proto,
        l4_off,
        l4_len: if first_fragment {
            0
        } else {
            (total - ihl) as u16
        },
        syn_only,
        tcp_flags,
        udp_no_csum,
        later_fragment: false,
    }))
}

#[inline(always)]
fn field2<const N: usize>(h: &[u8; N], at: usize) -> [u8; 2] {
    [h[at], h[at + 1]]
}

#[inline(always)]
fn field4<const N: usize>(h: &[u8; N], at: usize) -> [u8; 4] {
    [h[at], h[at + 1], h[at + 2], h[at + 3]]
}

//! ICMP errors about translated connections (destination unreachable, fragmentation
//! needed included, and time exceeded), translated back so that path-MTU discovery
//! and ECONNREFUSED work through a Service, as netfilter does for related packets
//! (`nf_nat_icmp_reply_translation`,
//! https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_proto.c).
//!
//! An error from the backend's side about a packet sent to a backend quotes that
//! packet: client → backend. Its reply tuple is the connection's reverse key; when
//! that names a live connection, the quoted packet gets its frontend back as the
//! destination (and the client's own port if it was remapped), with the quoted IP and
//! L4 checksums and the ICMP checksum updated, and the error's own source becomes the
//! frontend if it was the backend. A connection whose client was given another
//! address (masqueraded to the node's, or the hairpin address) gets the client's
//! back in the quote, and an error sent to that address goes to the client. Errors
//! about anything else pass untouched.

use dataplane_common::{
    csum_replace2, csum_replace4, stat, CtKey, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};

use crate::{
    conntrack,
    counters::Exit,
    nat::rewrite_addr,
    packet::{icmp, ipv4, load, store, tcp, udp, Frame},
    tc::{DROP, PASS},
};

/// Translates the ICMP error at `l4_off` (outer header `src_be` → `dst_be`, IP total
/// length `total` from the outer header's start) if it is about a live connection.
#[inline(always)]
pub fn error<C: Frame>(
    ctx: &C,
    src_be: u32,
    l4_off: usize,
    ip_end: usize,
    now: u64,
) -> Result<Exit, Exit> {
    let not_ours = Ok((PASS, stat::PASS_NOT_L4));
    let h: [u8; icmp::HDR_LEN] = load(ctx, l4_off).ok_or((DROP, stat::DROP_MALFORMED))?;
    if h[icmp::TYPE] != icmp::DEST_UNREACH && h[icmp::TYPE] != icmp::TIME_EXCEEDED {
        return not_ours;
    }
    let inner = l4_off + icmp::HDR_LEN;
    // The quoted IP header without options and the first 8 bytes of its L4 header
    // (RFC 792 guarantees those), inside the outer datagram.
    if inner + ipv4::MIN_LEN + udp::LEN > ip_end {
        return not_ours;
    }
    let Some(ip) = load::<[u8; ipv4::MIN_LEN]>(ctx, inner) else {
        return not_ours;
    };
    let proto = ip[ipv4::PROTO];
    if ip[ipv4::VERSION_IHL] != 0x45
        || (proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP)
    {
        return not_ours;
    }
    let Some(ports) = load::<[u8; 4]>(ctx, inner + ipv4::MIN_LEN) else {
        return not_ours;
    };
    let q_src = u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]);
    let q_dst = u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let q_sport = u16::from_ne_bytes([ports[0], ports[1]]);
    let q_dport = u16::from_ne_bytes([ports[2], ports[3]]);
    // The quoted packet's reply tuple is its connection's reverse key.
    let reply = CtKey::v4(q_dst, q_src, q_dport, q_sport, proto);
    let Some(orig) = conntrack::related(&reply, now) else {
        return not_ours;
    };
    let (vip, vport, cport) = (orig.dst_be[0], orig.dport_be, orig.sport_be);
    // The client as it sent: a masqueraded or hairpin connection's packets went out
    // from another address, which the quote and the error's destination name.
    let client = orig.src_be[0];

    let icmp_csum_at = l4_off + icmp::CSUM;
    let mut icmp_csum: u16 = load(ctx, icmp_csum_at).ok_or((DROP, stat::DROP_REWRITE))?;
    // Quoted IP header: destination and its checksum.
    let ip_csum = u16::from_ne_bytes([ip[ipv4::CSUM], ip[ipv4::CSUM + 1]]);
    let mut new_ip_csum = csum_replace4(ip_csum, q_dst, vip);
    icmp_csum = csum_replace4(icmp_csum, q_dst, vip);
    if client != q_src {
        new_ip_csum = csum_replace4(new_ip_csum, q_src, client);
        icmp_csum = csum_replace4(icmp_csum, q_src, client);
    }
    icmp_csum = csum_replace2(icmp_csum, ip_csum, new_ip_csum);
    // Quoted ports.
    icmp_csum = csum_replace2(icmp_csum, q_dport, vport);
    icmp_csum = csum_replace2(icmp_csum, q_sport, cport);
    // Quoted L4 checksum, if quoted: it covers the pseudo-header and the ports.
    // SCTP's CRC covers the whole quoted packet, of which the error holds a part;
    // it is left as quoted (the receiver matches the error by ports and tag).
    let l4_csum_at = inner
        + ipv4::MIN_LEN
        + if proto == PROTO_TCP {
            tcp::CSUM
        } else {
            udp::CSUM
        };
    if proto != PROTO_SCTP && l4_csum_at + 2 <= ip_end {
        if let Some(c) = load::<u16>(ctx, l4_csum_at) {
            if !(proto == PROTO_UDP && c == 0) {
                let mut n = csum_replace4(c, q_dst, vip);
                n = csum_replace4(n, q_src, client);
                n = csum_replace2(n, q_dport, vport);
                n = csum_replace2(n, q_sport, cport);
                if proto == PROTO_UDP && n == 0 {
                    n = 0xffff;
                }
                icmp_csum = csum_replace2(icmp_csum, c, n);
                store(ctx, l4_csum_at, n).ok_or((DROP, stat::DROP_REWRITE))?;
            }
        }
    }
    let w = (DROP, stat::DROP_REWRITE);
    store(ctx, inner + ipv4::DST, vip).ok_or(w)?;
    store(ctx, inner + ipv4::SRC, client).ok_or(w)?;
    store(ctx, inner + ipv4::CSUM, new_ip_csum).ok_or(w)?;
    store(ctx, inner + ipv4::MIN_LEN, cport).ok_or(w)?;
    store(ctx, inner + ipv4::MIN_LEN + 2, vport).ok_or(w)?;
    store(ctx, icmp_csum_at, icmp_csum).ok_or(w)?;
    // The error came from the backend itself: it speaks as the frontend.
    if src_be == q_dst {
        rewrite_addr(ctx, ipv4::SRC, q_dst, vip).map_err(|_| w)?;
    }
    // Sent to the address the client was given (the node's, the hairpin one): it goes
    // to the client.
    if client != q_src {
        let outer_dst: u32 = load(ctx, C::L2 + ipv4::DST).ok_or(w)?;
        if outer_dst == q_src {
            rewrite_addr(ctx, ipv4::DST, q_src, client).map_err(|_| w)?;
        }
    }
    Ok((PASS, stat::NAT_ICMP_ERROR))
}

//! ICMPv6 errors about translated connections (RFC 4443: destination unreachable,
//! packet too big, time exceeded, parameter problem), translated back so that
//! path-MTU discovery and ECONNREFUSED work through an IPv6 Service, as netfilter
//! does for related ICMPv6 packets (`nf_nat_icmpv6_reply_translation`,
//! https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_proto.c) and
//! as `crate::icmp` does for IPv4.
//!
//! An error from the backend's side quotes the packet sent to the backend: client →
//! backend. Its reply tuple is the connection's reverse key; when that names a live
//! connection, the quoted packet gets its frontend back as the destination (and the
//! client's own port if it was remapped), the error's own source becomes the
//! frontend if it was the backend, and a connection whose client was given another
//! address (masqueraded to the node's, or the hairpin address) gets the client's back
//! in the quote, an error sent to that address going to the client.
//!
//! It runs as `sliceway_icmp6` (`sliceway_icmp6_l3` without an Ethernet header),
//! entered by tail call from the IPv6 programs once parsing found ICMPv6 (`JUMP6`
//! slots `JUMP6_ICMP`, `JUMP6_ICMP_L3`): a frame and a verifier budget of its own,
//! as IPv6's body has no room left on its stack. An empty slot (a kernel that
//! refused the program) passes ICMPv6 untouched, as before it existed.
//!
//! Checksums: the quoted IPv6 header has none; the quoted TCP or UDP checksum covers
//! the quoted addresses through its pseudo-header and the ports; the ICMPv6 checksum
//! covers the whole quote and a pseudo-header of the error's own addresses (RFC 4443,
//! 2.3; RFC 8200, 8.1), so it changes with both. Each is updated by the summed RFC
//! 1624 deltas of what changed under it (`csum_delta16`, `csum_apply`), never summed
//! over the payload.
//!
//! Deliberate policy:
//! - only error messages of types 1 to 4 are looked at; informational ones (128 and
//!   up: echo, neighbour discovery) and any other type pass untouched
//!   (`pass_not_l4`);
//! - a message without its type and code, an error whose 8-byte header is cut, or
//!   an error whose frame ends before its payload length says, is dropped
//!   (`drop_malformed`), as IPv4 drops a cut ICMP header;
//! - an error that quotes less than the fixed IPv6 header and 8 bytes of its
//!   transport header, quotes a packet with extension headers (a fragment among
//!   them) or of a protocol other than TCP, UDP and SCTP, or is about no live
//!   connection passes untouched (`pass_not_l4`): never rewritten on a guess;
//! - the quoted TCP or UDP checksum is updated only if the quote holds it; SCTP's
//!   CRC32c covers the whole quoted packet, of which the error holds a part, and is
//!   left as quoted (the receiver matches the error by ports and tag), as IPv4's.

use aya_ebpf::{macros::classifier, programs::TcContext};
use dataplane_common::{
    csum_apply, csum_delta16, csum_delta2, stat, CtKey, FAMILY_V6, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};

use super::same_addr;
use crate::{
    conntrack,
    counters::{count, Exit},
    maps::JUMP6,
    packet::{icmpv6, ipv6, load, store, tcp, udp, Frame, L3},
    tc::{DROP, PASS},
};

/// Words of the skb's control buffer handed over with the packet: the offset of
/// the ICMPv6 header, the end of the IPv6 payload (offsets into the packet).
const CB_L4_OFF: usize = 0;
const CB_IP_END: usize = 1;
/// The most of a message the program reads: the ICMPv6 header, the quoted fixed
/// header and the quoted TCP checksum.
const PULL_LEN: u32 = (icmpv6::HDR_LEN + ipv6::LEN + tcp::CSUM + 2) as u32;
/// Every offset handed over is below this (parsing reads no header past
/// `packet::MAX_OFFSET`, and a payload ends within 64 KiB of the start): masked on
/// arrival, so the verifier has a bound however the value travelled.
const OFF_MASK: u32 = 0x1_ffff;

/// Hands an ICMPv6 message (its header at `l4_off`, its payload ending at `ip_end`)
/// to the ICMPv6 error program in `slot` of `JUMP6`, which translates and counts it.
/// If the slot is empty, the message passes untouched, as anything the programs do
/// not handle.
#[inline(always)]
pub fn hand_over(ctx: &TcContext, slot: u32, l4_off: usize, ip_end: usize) -> Exit {
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it. A
    // tail call returns only if it failed.
    unsafe {
        let cb = &mut (*ctx.skb.skb).cb;
        cb[CB_L4_OFF] = l4_off as u32;
        cb[CB_IP_END] = ip_end as u32;
        JUMP6.tail_call(ctx, slot);
    }
    (PASS, stat::PASS_NOT_L4)
}

/// The ICMPv6 error program, entered only by tail call (`JUMP6_ICMP`).
#[classifier]
pub fn sliceway_icmp6(ctx: TcContext) -> i32 {
    run(&ctx, &ctx)
}

/// The ICMPv6 error program of interfaces without an Ethernet header
/// (`JUMP6_ICMP_L3`).
#[classifier]
pub fn sliceway_icmp6_l3(ctx: TcContext) -> i32 {
    run(&L3(&ctx), &ctx)
}

#[inline(always)]
fn run<C: Frame>(frame: &C, ctx: &TcContext) -> i32 {
    // SAFETY: the context's own skb.
    let (l4_off, ip_end) = unsafe {
        let cb = &(*ctx.skb.skb).cb;
        (cb[CB_L4_OFF] & OFF_MASK, cb[CB_IP_END] & OFF_MASK)
    };
    // An error that came in on a NIC may hold its quote outside the skb's linear
    // data, where packet access cannot reach: the bytes read are pulled in first (a
    // no-op when they are there already; never past the skb's end).
    let want = (l4_off + PULL_LEN).min(ip_end).min(ctx.len());
    let _ = ctx.pull_data(want);
    let (action, reason) = match error(frame, l4_off as usize, ip_end as usize) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    count(reason);
    action
}

/// Translates the ICMPv6 message at `l4_off` (its payload ending at `ip_end`) if it
/// is an error about a live connection.
#[inline(always)]
fn error<C: Frame>(ctx: &C, l4_off: usize, ip_end: usize) -> Result<Exit, Exit> {
    let not_ours = Ok((PASS, stat::PASS_NOT_L4));
    // Type and code, read as one: a single byte's bound check at a variable offset
    // compiles to a comparison the verifier cannot use (`>=` against the end).
    let kind: [u8; 2] = load(ctx, l4_off + icmpv6::TYPE).ok_or((DROP, stat::DROP_MALFORMED))?;
    if !(icmpv6::DEST_UNREACH..=icmpv6::PARAM_PROBLEM).contains(&kind[0]) {
        return not_ours;
    }
    // Its header beyond its payload, or a frame that ends before its payload does
    // (the kernel drops such a packet too).
    if l4_off + icmpv6::HDR_LEN > ip_end || (ctx.wire_len() as usize) < ip_end {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let inner = l4_off + icmpv6::HDR_LEN;
    // The quoted fixed header and the first 8 bytes of its transport header (the
    // ports, UDP's checksum), inside the error's payload.
    if inner + ipv6::LEN + udp::LEN > ip_end {
        return not_ours;
    }
    let Some(head) = load::<u64>(ctx, inner) else {
        return not_ours;
    };
    let head = head.to_ne_bytes();
    let proto = head[ipv6::NEXT];
    if head[0] >> 4 != 6 || (proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP) {
        return not_ours;
    }
    let (Some(q_src), Some(q_dst), Some(ports)) = (
        load::<[u32; 4]>(ctx, inner + ipv6::SRC),
        load::<[u32; 4]>(ctx, inner + ipv6::DST),
        load::<u32>(ctx, inner + ipv6::LEN),
    ) else {
        return not_ours;
    };
    let ports = ports.to_ne_bytes();
    let q_sport = u16::from_ne_bytes([ports[0], ports[1]]);
    let q_dport = u16::from_ne_bytes([ports[2], ports[3]]);
    // The quoted packet's reply tuple is its connection's reverse key.
    let reply = CtKey {
        src_be: q_dst,
        dst_be: q_src,
        sport_be: q_dport,
        dport_be: q_sport,
        proto,
        family: FAMILY_V6,
        _pad: [0; 2],
    };
    let Some(orig) = conntrack::related(&reply, conntrack::now()) else {
        return not_ours;
    };
    // The client as it sent: a masqueraded or hairpin connection's packets went out
    // from another address, which the quote and the error's destination name.
    let (vip, vport, client, cport) = (orig.dst_be, orig.dport_be, orig.src_be, orig.sport_be);
    let w = (DROP, stat::DROP_REWRITE);
    // The error came from the backend itself: it speaks as the frontend.
    let from_backend = same_addr(&load(ctx, C::L2 + ipv6::SRC).ok_or(w)?, &q_dst);
    // Sent to the address the client was given (the node's, the hairpin one): it
    // goes to the client.
    let to_the_client =
        !same_addr(&client, &q_src) && same_addr(&load(ctx, C::L2 + ipv6::DST).ok_or(w)?, &q_src);
    // What changes in the quote, under the quoted L4 checksum and the ICMPv6 one
    // alike: both addresses (the pseudo-header's) and both ports.
    let to_vip = csum_delta16(&q_dst, &vip);
    let to_client = csum_delta16(&q_src, &client);
    let quoted = to_vip + to_client + csum_delta2(q_dport, vport) + csum_delta2(q_sport, cport);
    let mut icmp_delta = quoted;
    // Quoted L4 checksum, if quoted (SCTP's CRC left as quoted).
    let l4_csum_at = inner
        + ipv6::LEN
        + if proto == PROTO_TCP {
            tcp::CSUM
        } else {
            udp::CSUM
        };
    let mut l4_csum = None;
    if proto != PROTO_SCTP && l4_csum_at + 2 <= ip_end {
        if let Some(c) = load::<u16>(ctx, l4_csum_at) {
            // A zero UDP checksum (none, invalid over IPv6) is left alone.
            if !(proto == PROTO_UDP && c == 0) {
                let mut n = csum_apply(c, quoted);
                if proto == PROTO_UDP && n == 0 {
                    n = 0xffff;
                }
                icmp_delta += csum_delta2(c, n);
                l4_csum = Some(n);
            }
        }
    }
    // The error's own addresses are in the ICMPv6 checksum's pseudo-header.
    if from_backend {
        icmp_delta += to_vip;
    }
    if to_the_client {
        icmp_delta += to_client;
    }
    let icmp_csum_at = l4_off + icmpv6::CSUM;
    let icmp_csum: u16 = load(ctx, icmp_csum_at).ok_or(w)?;
    store(ctx, inner + ipv6::SRC, client).ok_or(w)?;
    store(ctx, inner + ipv6::DST, vip).ok_or(w)?;
    store(ctx, inner + ipv6::LEN, cport).ok_or(w)?;
    store(ctx, inner + ipv6::LEN + 2, vport).ok_or(w)?;
    if let Some(n) = l4_csum {
        store(ctx, l4_csum_at, n).ok_or(w)?;
    }
    if from_backend {
        store(ctx, C::L2 + ipv6::SRC, vip).ok_or(w)?;
    }
    if to_the_client {
        store(ctx, C::L2 + ipv6::DST, client).ok_or(w)?;
    }
    store(ctx, icmp_csum_at, csum_apply(icmp_csum, icmp_delta)).ok_or(w)?;
    Ok((PASS, stat::NAT_ICMP_ERROR))
}

//! REJECT for IPv6: the packet becomes an ICMPv6 destination unreachable, code 4
//! port unreachable (RFC 4443, 3.1), sent back out of the interface it came in on,
//! as `crate::reject` does for IPv4 (kube-proxy rejects with the kernel's defaults,
//! which answer ICMPv6 port unreachable for IPv6).
//!
//! The reply quotes the start of the invoking packet up to a fixed cap
//! ([`QUOTE_MAX`], whole 32-bit words), well under what the minimum MTU of 1280
//! allows (RFC 4443, 2.4 (c)): the checksum is summed over a per-CPU copy of the
//! message in two `bpf_csum_diff` calls, as IPv4's. The checksum covers the
//! pseudo-header (RFC 8200, 8.1: source, destination, length, next header 58),
//! summed here as the seed of the message's sum. No error answers a packet from the
//! unspecified address or a multicast one (RFC 4443, 2.4 (e)): dropped instead.

use aya_ebpf::{
    bindings::{bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, TC_ACT_REDIRECT, TC_ACT_SHOT},
    helpers::{bpf_redirect, bpf_skb_change_tail},
    macros::classifier,
    programs::TcContext,
};
use dataplane_common::{csum_fold, stat, PROTO_ICMPV6};

use crate::{
    counters::count,
    maps::JUMP6,
    packet::{icmpv6, ipv6, load, ETH_LEN},
    reject::{sum_message, SUM_MAX},
};

/// Bytes of the invoking packet quoted at most (header and quote fill what IPv4's
/// reply sums, `SUM_MAX`).
pub const QUOTE_MAX: usize = SUM_MAX - icmpv6::HDR_LEN;
/// The reply's hop limit, as Linux's default.
const HOP_LIMIT: u8 = 64;
/// The word of the skb's control buffer the reason travels in.
const CB_REASON: usize = 0;

/// Hands the packet to the reject program in `slot` of `JUMP6`, which answers it
/// and counts `reason`. Returns only if the handover failed.
#[inline(always)]
pub fn port_unreachable(ctx: &TcContext, reason: u32, slot: u32) {
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it.
    unsafe {
        (*ctx.skb.skb).cb[CB_REASON] = reason;
        JUMP6.tail_call(ctx, slot);
    }
}

/// The IPv6 reject program, entered only by tail call (`JUMP6_REJECT`).
#[classifier]
pub fn sliceway_rej6(ctx: TcContext) -> i32 {
    reject::<ETH_LEN>(&ctx)
}

/// The IPv6 reject program of interfaces without an Ethernet header.
#[classifier]
pub fn sliceway_rej6_l3(ctx: TcContext) -> i32 {
    reject::<0>(&ctx)
}

#[inline(always)]
fn reject<const L2: usize>(ctx: &TcContext) -> i32 {
    // SAFETY: the context's own skb.
    let reason = unsafe { (*ctx.skb.skb).cb[CB_REASON] };
    match build::<L2>(ctx) {
        Ok(action) => {
            count(reason);
            action
        }
        Err(()) => {
            count(stat::DROP_REJECT);
            TC_ACT_SHOT
        }
    }
}

#[inline(always)]
fn build<const L2: usize>(ctx: &TcContext) -> Result<i32, ()> {
    let eth: Option<[u8; ETH_LEN]> = if L2 > 0 {
        Some(load(ctx, 0).ok_or(())?)
    } else {
        None
    };
    let head: [u8; 8] = load(ctx, L2).ok_or(())?;
    let src: [u32; 4] = load(ctx, L2 + ipv6::SRC).ok_or(())?;
    let dst: [u32; 4] = load(ctx, L2 + ipv6::DST).ok_or(())?;
    let first = src[0].to_ne_bytes()[0];
    if first == 0xff || (src[0] | src[1] | src[2] | src[3]) == 0 {
        return Err(());
    }
    let payload = u16::from_be_bytes([head[ipv6::PAYLOAD_LEN], head[ipv6::PAYLOAD_LEN + 1]]);
    // Only what arrived is quoted, as for IPv4 (issue 46).
    let claimed = ipv6::LEN + payload as usize;
    let arrived = (ctx.len() as usize).saturating_sub(L2);
    let total = if claimed < arrived { claimed } else { arrived };
    let quote = if total < QUOTE_MAX { total } else { QUOTE_MAX } & !3;
    if quote < ipv6::LEN + 8 {
        return Err(());
    }
    ctx.adjust_room((ipv6::LEN + icmpv6::HDR_LEN) as i32, BPF_ADJ_ROOM_MAC, 0)
        .map_err(|_| ())?;
    let new_len = (L2 + ipv6::LEN + icmpv6::HDR_LEN + quote) as u32;
    // SAFETY: the context's own skb; the helper checks the length.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, new_len, 0) } != 0 {
        return Err(());
    }
    if let Some(eth) = eth {
        let mut back = eth;
        back[..6].copy_from_slice(&eth[6..12]);
        back[6..12].copy_from_slice(&eth[..6]);
        ctx.store(0, &back, 0).map_err(|_| ())?;
    }
    // IPv6: from the address the client asked for, to the client.
    let len = (icmpv6::HDR_LEN + quote) as u16;
    let l = len.to_be_bytes();
    let fixed = [0x60, 0, 0, 0, l[0], l[1], PROTO_ICMPV6, HOP_LIMIT];
    ctx.store(L2, &fixed, 0).map_err(|_| ())?;
    ctx.store(L2 + ipv6::SRC, &dst, 0).map_err(|_| ())?;
    ctx.store(L2 + ipv6::DST, &src, 0).map_err(|_| ())?;
    let icmp = [icmpv6::DEST_UNREACH, icmpv6::PORT_UNREACH, 0, 0, 0, 0, 0, 0];
    let icmp_off = L2 + ipv6::LEN;
    ctx.store(icmp_off, &icmp, 0).map_err(|_| ())?;
    // The pseudo-header's words as they lie in memory, summed with end-around carry.
    let mut pseudo: u64 = (len as u32).to_be() as u64 + (PROTO_ICMPV6 as u32).to_be() as u64;
    let mut i = 0;
    while i < 4 {
        pseudo += src[i] as u64 + dst[i] as u64;
        i += 1;
    }
    let pseudo = (pseudo & 0xffff_ffff) + (pseudo >> 32);
    let pseudo = ((pseudo & 0xffff_ffff) + (pseudo >> 32)) as u32;
    let sum = sum_message(ctx, icmp_off, len as usize, pseudo)?;
    let check = !csum_fold(sum);
    ctx.store(icmp_off + 2, &check.to_ne_bytes(), 0)
        .map_err(|_| ())?;
    // SAFETY: reads the ifindex field of the context's skb.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: a plain helper call; it only records where the packet goes.
    let action = unsafe { bpf_redirect(ifindex, 0) } as i32;
    if action != TC_ACT_REDIRECT {
        return Err(());
    }
    Ok(action)
}

//! REJECT: the packet is turned into an ICMP destination-unreachable (port
//! unreachable) reply and sent back out of the interface it came in on, so the
//! client's `connect()` or `send()` fails at once with ECONNREFUSED.
//!
//! kube-proxy rejects with the kernel's defaults: `-j REJECT` in iptables mode and
//! `reject` in nftables mode both answer ICMP port unreachable for TCP, UDP and SCTP
//! alike (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go>,
//! the `reject-chain`), which is what a Linux TCP client in SYN-SENT turns into
//! ECONNREFUSED. The reply quotes as much of the datagram as fits in 576 bytes
//! (RFC 1812 4.3.2.3), rounded down to whole 32-bit words, so that an offloaded
//! checksum's position stays inside the packet when it is cut.
//!
//! How: room for a new IPv4 and ICMP header is made between the Ethernet header and
//! the datagram (`bpf_skb_adjust_room`), the datagram is cut to the quote
//! (`bpf_skb_change_tail`), the headers are written, the ICMP checksum is summed over
//! a per-CPU copy of header and quote (`bpf_csum_diff` takes whole words), and the
//! packet is redirected to the egress of its own interface. On an interface without
//! an Ethernet header (`sliceway_rej_l3`) the same, with no Ethernet header to turn.

use aya_ebpf::{
    bindings::{bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, TC_ACT_REDIRECT, TC_ACT_SHOT},
    cty::c_void,
    helpers::{bpf_csum_diff, bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes},
    macros::classifier,
    programs::TcContext,
};
use dataplane_common::{csum_fold, stat};
use network_types::{
    eth::EthHdr,
    ip::{IpProto, Ipv4Hdr},
};

use crate::{
    counters::count,
    maps::{JUMP, SCRATCH},
    packet::{load, Flow, ETH_LEN},
};

const IP_HDR: usize = 20;
const ICMP_HDR: usize = 8;
/// Bytes of the datagram an ICMP error carries at most: 576 - IP - ICMP.
pub const QUOTE_MAX: usize = 576 - IP_HDR - ICMP_HDR;
/// Bytes the checksum is summed over at most: ICMP header and quote.
pub const SUM_MAX: usize = ICMP_HDR + QUOTE_MAX;
/// Bytes summed by the first of two `bpf_csum_diff` calls (a multiple of 4, under
/// the 512 older kernels take per call).
const CSUM_PART: usize = 256;
/// What the second part's length is masked with: every multiple of 4 below 512.
const REST_MASK: usize = 0x1fc;
const _: () =
    assert!(SUM_MAX - CSUM_PART < 512 && SUM_MAX.is_multiple_of(4) && CSUM_PART.is_multiple_of(4));
/// The per-CPU buffer the checksum is summed over: room for the first part and any
/// masked second part, so the verifier sees every length fit whatever it knows.
pub const SCRATCH_LEN: usize = CSUM_PART + REST_MASK;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;
/// IPTOS_PREC_INTERNETCONTROL, as the kernel's own ICMP errors carry.
const TOS_INTERNETCONTROL: u8 = 0xc0;

/// Hands the packet of `flow` to `sliceway_reject` (`sliceway_rej_l3` where `l3`: no
/// Ethernet header) by tail call (a program of its own, with a stack of its own),
/// which turns it into an ICMP port unreachable to its source and redirects it,
/// counting `reason`. Returns only if the handover failed (the caller drops the
/// packet).
#[inline(always)]
pub fn port_unreachable(ctx: &TcContext, flow: &Flow, reason: u32, l3: bool) {
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it.
    unsafe {
        (*ctx.skb.skb).cb[CB_REASON] = reason;
        (*ctx.skb.skb).cb[CB_L4_OFF] = flow.l4_off as u32;
        JUMP.tail_call(ctx, if l3 { JUMP_REJECT_L3 } else { JUMP_REJECT });
    }
}

/// Slot of `sliceway_reject` in `JUMP`.
pub const JUMP_REJECT: u32 = 0;
/// Slot of `sliceway_rej_l3` in `JUMP`.
pub const JUMP_REJECT_L3: u32 = dataplane_common::JUMP_REJECT_L3;
/// Words of the skb's control buffer handed over with the packet.
const CB_REASON: usize = 0;
const CB_L4_OFF: usize = 1;

/// The reject program, entered only by tail call from the TC programs.
#[classifier]
pub fn sliceway_reject(ctx: TcContext) -> i32 {
    reject::<ETH_LEN>(&ctx)
}

/// The reject program of interfaces without an Ethernet header.
#[classifier]
pub fn sliceway_rej_l3(ctx: TcContext) -> i32 {
    reject::<0>(&ctx)
}

/// `L2`: bytes before the IP header.
#[inline(always)]
fn reject<const L2: usize>(ctx: &TcContext) -> i32 {
    // SAFETY: the context's own skb.
    let (reason, l4_off) = unsafe {
        let cb = &(*ctx.skb.skb).cb;
        (cb[CB_REASON], cb[CB_L4_OFF] as usize)
    };
    match build::<L2>(ctx, l4_off) {
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

/// Builds the reply in place and redirects it: the TC verdict, or `Err` when the
/// reply cannot be made.
#[inline(always)]
fn build<const L2: usize>(ctx: &TcContext, l4_off: usize) -> Result<i32, ()> {
    // A plain 20-byte header only: the quote's layout stays fixed for the verifier.
    if l4_off != L2 + IP_HDR {
        return Err(());
    }
    // Copies, taken before any helper moves the packet.
    let eth: Option<EthHdr> = if L2 > 0 {
        Some(load(ctx, 0).ok_or(())?)
    } else {
        None
    };
    let ip: Ipv4Hdr = load(ctx, L2).ok_or(())?;
    // Only what arrived is quoted: a header may claim more than the frame holds, and
    // `bpf_skb_change_tail` would grow the packet with zeros to the claim (issue 46).
    let claimed = ip.tot_len() as usize;
    let arrived = (ctx.len() as usize).saturating_sub(L2);
    let total = if claimed < arrived { claimed } else { arrived };
    let quote = if total < QUOTE_MAX { total } else { QUOTE_MAX } & !3;
    // The quote must hold the IP header and the 8 bytes of ports (RFC 792).
    if quote < IP_HDR + 8 {
        return Err(());
    }
    ctx.adjust_room((IP_HDR + ICMP_HDR) as i32, BPF_ADJ_ROOM_MAC, 0)
        .map_err(|_| ())?;
    let new_len = (L2 + IP_HDR + ICMP_HDR + quote) as u32;
    // SAFETY: the context's own skb; the helper checks the length.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, new_len, 0) } != 0 {
        return Err(());
    }

    // Ethernet: back to where it came from.
    if let Some(eth) = eth {
        let back = EthHdr {
            dst_addr: eth.src_addr,
            src_addr: eth.dst_addr,
            ether_type: eth.ether_type,
        };
        ctx.store(0, &back, 0).map_err(|_| ())?;
    }

    // IPv4: from the address the client asked for, to the client.
    let mut hdr = ip;
    hdr.set_vihl(4, IP_HDR as u8);
    hdr.tos = TOS_INTERNETCONTROL;
    hdr.set_tot_len((IP_HDR + ICMP_HDR + quote) as u16);
    hdr.set_id(0);
    hdr.set_frags(0, 0);
    hdr.ttl = 64;
    hdr.set_proto(IpProto::Icmp);
    hdr.src_addr = ip.dst_addr;
    hdr.dst_addr = ip.src_addr;
    hdr.set_checksum(0);
    hdr.set_checksum(ipv4_header_checksum(&hdr));
    ctx.store(L2, &hdr, 0).map_err(|_| ())?;

    // ICMP header with a zero checksum, then the checksum over header and quote.
    let icmp = [ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0, 0, 0, 0, 0, 0];
    let icmp_off = L2 + IP_HDR;
    ctx.store(icmp_off, &icmp, 0).map_err(|_| ())?;
    let len = ICMP_HDR + quote;
    if len == 0 || len > SUM_MAX {
        return Err(());
    }
    let sum = sum_message(ctx, icmp_off, len, 0)?;
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

/// The one's-complement sum (32 bits, unfolded) of the `len` bytes of an ICMP
/// message at `icmp_off` (header and quote, `len` a multiple of 4 up to `SUM_MAX`),
/// on top of `seed` (ICMPv6's pseudo-header; zero for ICMP).
#[inline(always)]
pub fn sum_message(ctx: &TcContext, icmp_off: usize, len: usize, seed: u32) -> Result<u32, ()> {
    if len == 0 || len > SUM_MAX {
        return Err(());
    }
    let buf = SCRATCH.get_ptr_mut(0).ok_or(())?;
    // SAFETY: a per-CPU buffer of SCRATCH_LEN bytes (more than SUM_MAX), only this
    // program on this CPU uses it while it runs; `len` is at most SUM_MAX and a
    // multiple of 4.
    let sum = unsafe {
        let copied = bpf_skb_load_bytes(
            ctx.skb.skb as *const c_void,
            icmp_off as u32,
            buf as *mut c_void,
            len as u32,
        );
        if copied != 0 {
            return Err(());
        }
        // bpf_csum_diff sums at most 512 bytes per call on older kernels (its
        // per-CPU scratch pad; EINVAL above that, measured on Debian's 6.1), so a
        // longer quote is summed in two calls, the first of a constant size.
        if len <= CSUM_PART {
            bpf_csum_diff(core::ptr::null_mut(), 0, buf as *mut u32, len as u32, seed)
        } else {
            // Masked for the verifier (a no-op: `rest` is a multiple of 4 below 512),
            // which on Linux 6.1 may meet `len` reloaded from the stack without the
            // bound the comparison above gave another copy ("R4 min value is
            // negative"); the buffer has room for any masked length (`SCRATCH_LEN`).
            let rest = (len - CSUM_PART) & REST_MASK;
            let first = bpf_csum_diff(
                core::ptr::null_mut(),
                0,
                buf as *mut u32,
                CSUM_PART as u32,
                seed,
            );
            if first < 0 {
                return Err(());
            }
            bpf_csum_diff(
                core::ptr::null_mut(),
                0,
                (buf as *mut u8).add(CSUM_PART) as *mut u32,
                rest as u32,
                first as u32,
            )
        }
    };
    if sum < 0 {
        return Err(());
    }
    Ok(sum as u32)
}

/// The checksum of an IPv4 header without options whose checksum field is zero, as
/// a number (RFC 1071: the one's complement of the one's-complement sum of its
/// 16-bit words).
#[inline(always)]
fn ipv4_header_checksum(h: &Ipv4Hdr) -> u16 {
    let word = |b: [u8; 2]| u16::from_be_bytes(b) as u32;
    let sum = word([h.vihl, h.tos])
        + word(h.tot_len)
        + word(h.id)
        + word(h.frags)
        + word([h.ttl, h.proto])
        + word([h.src_addr[0], h.src_addr[1]])
        + word([h.src_addr[2], h.src_addr[3]])
        + word([h.dst_addr[0], h.dst_addr[1]])
        + word([h.dst_addr[2], h.dst_addr[3]]);
    !csum_fold(sum)
}

//! SCTP port translation: a port change updates the packet's CRC32c, which covers the
//! whole SCTP packet and no addresses, with [`crc32c::port_delta`] (two fixed 32-step
//! multiplications, no payload read), where netfilter recomputes it over the packet
//! (`sctp_manip_pkt`,
//! <https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_proto.c>).
//! It runs as `sliceway_sctp_nat`, entered by tail call from `sliceway_tc` once the
//! addresses are translated: a program of its own, verified once, not at every place
//! the TC program rewrites a port.
//!
//! Like netfilter, a packet whose checksum the kernel has yet to compute (a pod's SCTP
//! socket on a veth offloads it: `CHECKSUM_PARTIAL`) is left for the kernel: the
//! sender writes zero into the field then, and a zero field stays zero (a computed
//! CRC of zero, one packet in 2^32, then goes out wrong and is retransmitted). A first
//! fragment does not hold its whole SCTP packet, so its CRC cannot be updated: it is
//! dropped (`DROP_REWRITE`). Services whose port is their target port change no port
//! and translate fragments as TCP and UDP do.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use dataplane_common::{crc32c, stat};

use crate::{
    counters::count,
    maps::JUMP,
    packet::{load, sctp, store, Flow},
};

/// Slot of `sliceway_sctp_nat` in `JUMP`.
pub const JUMP_SCTP_NAT: u32 = 1;
/// Words of the skb's control buffer handed over with the packet.
const CB_REASON: usize = 0;
/// L4 offset in the low half, L4 length (zero: unknown) in the high half.
const CB_L4: usize = 1;
/// Old port in the low half, new in the high half, as they lie in the packet.
const CB_SPORT: usize = 2;
const CB_DPORT: usize = 3;

/// Hands the packet of `flow`, its addresses translated, to `sliceway_sctp_nat` to set
/// its ports to `sport_be` and `dport_be`, fix its CRC and pass it, counting `reason`.
/// Returns only if the handover failed (the caller drops the packet).
#[inline(always)]
pub fn translate_ports(ctx: &TcContext, flow: &Flow, sport_be: u16, dport_be: u16, reason: u32) {
    let pair = |old: u16, new: u16| (old as u32) | ((new as u32) << 16);
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it.
    unsafe {
        let cb = &mut (*ctx.skb.skb).cb;
        cb[CB_REASON] = reason;
        cb[CB_L4] = (flow.l4_off as u32 & 0xffff) | ((flow.l4_len as u32) << 16);
        cb[CB_SPORT] = pair(flow.sport_be, sport_be);
        cb[CB_DPORT] = pair(flow.dport_be, dport_be);
        JUMP.tail_call(ctx, JUMP_SCTP_NAT);
    }
}

/// [`translate_ports`] for an IPv6 packet (the program reads only the SCTP header:
/// one for both families).
#[inline(always)]
pub fn translate_ports6(
    ctx: &TcContext,
    flow: &crate::v6::Flow6,
    sport_be: u16,
    dport_be: u16,
    reason: u32,
) {
    let pair = |old: u16, new: u16| (old as u32) | ((new as u32) << 16);
    // SAFETY: as in `translate_ports`.
    unsafe {
        let cb = &mut (*ctx.skb.skb).cb;
        cb[CB_REASON] = reason;
        cb[CB_L4] = (flow.l4_off as u32 & 0xffff) | ((flow.l4_len as u32) << 16);
        cb[CB_SPORT] = pair(flow.sport_be, sport_be);
        cb[CB_DPORT] = pair(flow.dport_be, dport_be);
        JUMP.tail_call(ctx, JUMP_SCTP_NAT);
    }
}

/// The SCTP port program, entered only by tail call from `sliceway_tc`.
#[classifier]
pub fn sliceway_sctp_nat(ctx: TcContext) -> i32 {
    // SAFETY: the context's own skb.
    let (reason, l4, sport, dport) = unsafe {
        let cb = &(*ctx.skb.skb).cb;
        (cb[CB_REASON], cb[CB_L4], cb[CB_SPORT], cb[CB_DPORT])
    };
    match ports(
        &ctx,
        (l4 & 0xffff) as usize,
        (l4 >> 16) as usize,
        sport,
        dport,
    ) {
        Ok(()) => {
            count(reason);
            TC_ACT_OK
        }
        Err(()) => {
            count(stat::DROP_REWRITE);
            TC_ACT_SHOT
        }
    }
}

#[inline(always)]
fn ports(ctx: &TcContext, l4_off: usize, l4_len: usize, sport: u32, dport: u32) -> Result<(), ()> {
    let old_s = (sport as u16).to_ne_bytes();
    let new_s = ((sport >> 16) as u16).to_ne_bytes();
    let old_d = (dport as u16).to_ne_bytes();
    let new_d = ((dport >> 16) as u16).to_ne_bytes();
    let csum_off = l4_off + sctp::CSUM;
    let field: [u8; 4] = load(ctx, csum_off).ok_or(())?;
    if field != [0; 4] {
        if l4_len < sctp::MIN_LEN {
            // A first fragment (length unknown): its CRC cannot be updated.
            return Err(());
        }
        // The bytes of the SCTP packet after each port.
        let delta = crc32c::port_delta(old_s, new_s, l4_len - sctp::SPORT - 2)
            ^ crc32c::port_delta(old_d, new_d, l4_len - sctp::DPORT - 2);
        store(
            ctx,
            csum_off,
            (u32::from_le_bytes(field) ^ delta).to_le_bytes(),
        )
        .ok_or(())?;
    }
    store(ctx, l4_off + sctp::SPORT, new_s).ok_or(())?;
    store(ctx, l4_off + sctp::DPORT, new_d).ok_or(())
}

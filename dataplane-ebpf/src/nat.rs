//! Address and port rewrites with incremental checksum updates (RFC 1624), so no
//! checksum is recomputed over the payload.
//!
//! The L4 checksum goes through [`Frame::l4_csum`]: in a TC program the kernel's
//! `l4_csum_replace` helper (only the kernel knows whether an skb carries a partial
//! checksum), in XDP an update of the field. The IPv4 header checksum is always
//! complete, so it is updated here, and the address and port are written straight
//! into the packet: three helper calls fewer per rewritten packet.
//!
//! SCTP: only addresses here (its CRC32c covers none); ports are set by the
//! `sliceway_sctp_nat` program (`crate::sctp`).

use dataplane_common::{csum_replace4, PROTO_SCTP, PROTO_TCP};

use crate::packet::{ipv4, load, store, tcp, udp, Flow, Frame};

/// Which end of the flow to rewrite.
#[derive(Clone, Copy)]
pub enum End {
    Source,
    Destination,
}

/// Rewrites one end of `flow` to `addr_be:port_be`, fixing IP and L4 checksums.
#[inline(always)]
pub fn rewrite<C: Frame>(
    ctx: &C,
    flow: &Flow,
    end: End,
    addr_be: u32,
    port_be: u16,
) -> Result<(), ()> {
    let (addr_off, port_off, old_addr, old_port) = match end {
        End::Source => (
            ipv4::SRC,
            flow.l4_off + tcp::SPORT,
            flow.src_be,
            flow.sport_be,
        ),
        End::Destination => (
            ipv4::DST,
            flow.l4_off + tcp::DPORT,
            flow.dst_be,
            flow.dport_be,
        ),
    };
    // TCP and UDP keep their ports at the same offsets.
    const _: () = assert!(tcp::SPORT == udp::SPORT && tcp::DPORT == udp::DPORT);
    if flow.later_fragment || flow.proto == PROTO_SCTP {
        // No L4 header here (the first fragment carried ports and checksum), or
        // SCTP, whose ports `crate::sctp` sets.
        return rewrite_addr(ctx, addr_off, old_addr, addr_be);
    }
    if !flow.udp_no_csum {
        let (csum_off, udp) = if flow.proto == PROTO_TCP {
            (flow.l4_off + tcp::CSUM, false)
        } else {
            (flow.l4_off + udp::CSUM, true)
        };
        ctx.l4_csum(csum_off, old_addr, addr_be, 4, true, udp)?;
        ctx.l4_csum(csum_off, old_port as u32, port_be as u32, 2, false, udp)?;
    }
    // The helpers may have moved the packet: `load` and `store` check afresh.
    rewrite_addr(ctx, addr_off, old_addr, addr_be)?;
    store(ctx, port_off, port_be).ok_or(())
}

/// Rewrites the IPv4 address at `addr_off` (into the IP header) from `old` to `new`
/// and updates the header checksum.
#[inline(always)]
pub fn rewrite_addr<C: Frame>(ctx: &C, addr_off: usize, old: u32, new: u32) -> Result<(), ()> {
    let csum_at = C::L2 + ipv4::CSUM;
    let check: u16 = load(ctx, csum_at).ok_or(())?;
    store(ctx, csum_at, csum_replace4(check, old, new)).ok_or(())?;
    store(ctx, C::L2 + addr_off, new).ok_or(())
}

//! Address and port rewrites with incremental checksum updates (RFC 1624) through the
//! kernel's csum helpers, so no checksum is recomputed over the payload.

use aya_ebpf::{bindings::BPF_F_PSEUDO_HDR, programs::TcContext};
use dataplane_common::PROTO_TCP;

use crate::packet::{Flow, IP_CSUM_OFF, IP_DST_OFF, IP_SRC_OFF, TCP_CSUM_OFF, UDP_CSUM_OFF};

/// `BPF_F_MARK_MANGLED_0`: a UDP checksum that becomes zero is written as 0xffff.
const BPF_F_MARK_MANGLED_0: u64 = 1 << 5;

/// Which end of the flow to rewrite.
#[derive(Clone, Copy)]
pub enum End {
    Source,
    Destination,
}

/// Rewrites one end of `flow` to `addr_be:port_be`, fixing IP and L4 checksums.
#[inline(always)]
pub fn rewrite(
    ctx: &TcContext,
    flow: &Flow,
    end: End,
    addr_be: u32,
    port_be: u16,
) -> Result<(), ()> {
    let (ip_off, port_off, old_addr, old_port) = match end {
        End::Source => (IP_SRC_OFF, flow.l4_off, flow.src_be, flow.sport_be),
        End::Destination => (IP_DST_OFF, flow.l4_off + 2, flow.dst_be, flow.dport_be),
    };
    if !flow.udp_no_csum {
        let (csum_off, flags) = if flow.proto == PROTO_TCP {
            (flow.l4_off + TCP_CSUM_OFF, 0)
        } else {
            (flow.l4_off + UDP_CSUM_OFF, BPF_F_MARK_MANGLED_0)
        };
        ctx.l4_csum_replace(
            csum_off,
            old_addr as u64,
            addr_be as u64,
            flags | BPF_F_PSEUDO_HDR as u64 | 4,
        )
        .map_err(|_| ())?;
        ctx.l4_csum_replace(csum_off, old_port as u64, port_be as u64, flags | 2)
            .map_err(|_| ())?;
    }
    ctx.l3_csum_replace(IP_CSUM_OFF, old_addr as u64, addr_be as u64, 4)
        .map_err(|_| ())?;
    ctx.store(ip_off, &addr_be, 0).map_err(|_| ())?;
    ctx.store(port_off, &port_be, 0).map_err(|_| ())?;
    Ok(())
}

//! Address and port rewrites with incremental checksum updates (RFC 1624), so no
//! checksum is recomputed over the payload.
//!
//! The L4 checksum goes through the kernel's `l4_csum_replace` helper: only the
//! kernel knows whether the skb carries a partial checksum (a veth peer with TX
//! offload hands over `CHECKSUM_PARTIAL` packets whose checksum field holds the
//! pseudo-header sum), and the helper updates the field the right way for each case.
//! The IPv4 header checksum is always complete, so it is updated here, and the
//! address and port are written straight into the packet: three helper calls fewer
//! per rewritten packet.

use aya_ebpf::{bindings::BPF_F_PSEUDO_HDR, programs::TcContext};
use dataplane_common::{csum_replace4, PROTO_TCP};

use crate::packet::{
    ptr_at_mut, Flow, ETH_LEN, IP_CSUM_OFF, IP_DST_OFF, IP_SRC_OFF, TCP_CSUM_OFF, UDP_CSUM_OFF,
};

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
    // The helpers may have moved the packet: take the pointers afresh.
    let ip: *mut [u8; 20] = ptr_at_mut(ctx, ETH_LEN).ok_or(())?;
    let port: *mut [u8; 2] = ptr_at_mut(ctx, port_off).ok_or(())?;
    // SAFETY: both ranges were bounds-checked against the packet just above, and
    // nothing else holds a reference into the packet.
    unsafe {
        let ip = &mut *ip;
        let csum_at = IP_CSUM_OFF - ETH_LEN;
        let check = u16::from_ne_bytes([ip[csum_at], ip[csum_at + 1]]);
        let check = csum_replace4(check, old_addr, addr_be);
        ip[csum_at..csum_at + 2].copy_from_slice(&check.to_ne_bytes());
        let at = ip_off - ETH_LEN;
        ip[at..at + 4].copy_from_slice(&addr_be.to_ne_bytes());
        (*port).copy_from_slice(&port_be.to_ne_bytes());
    }
    Ok(())
}

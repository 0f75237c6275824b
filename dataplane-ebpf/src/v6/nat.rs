//! IPv6 address and port rewrites. IPv6 has no header checksum; the L4 checksum
//! covers the addresses through the pseudo-header (RFC 8200, 8.1), so each changed
//! address word and the port go through [`Frame::l4_csum`] (the kernel's
//! `l4_csum_replace`, with `BPF_F_PSEUDO_HDR` for the addresses, so a packet a pod
//! hands over with a partial checksum stays right), as IPv4's `crate::nat` does.

use dataplane_common::{PROTO_SCTP, PROTO_TCP};

use super::Flow6;
use crate::{
    nat::End,
    packet::{ipv6, store, tcp, udp, Frame},
};

/// Every offset below 2048: more than any header the programs read lies at.
const L4_OFF_MASK: usize = 0x7ff;

/// Rewrites one end of `flow` to `addr_be:port_be`, fixing the L4 checksum (a later
/// fragment or SCTP: the address only, as IPv4's `rewrite`).
#[inline(always)]
pub fn rewrite6<C: Frame>(
    ctx: &C,
    flow: &Flow6,
    end: End,
    addr_be: &[u32; 4],
    port_be: u16,
) -> Result<(), ()> {
    // The flow lives in a map (`SCRATCH6`), so its offset comes back with no bound;
    // Linux 6.1's verifier then loses it when the value is spilled and reloaded
    // ("math between pkt pointer and register with unbounded min value"). Masked
    // here (a no-op: parsing keeps it under `MAX_OFFSET`), so every copy is bounded.
    let l4_off = flow.l4_off & L4_OFF_MASK;
    let (addr_off, port_off, old_addr, old_port) = match end {
        End::Source => (ipv6::SRC, l4_off + tcp::SPORT, &flow.src_be, flow.sport_be),
        End::Destination => (ipv6::DST, l4_off + tcp::DPORT, &flow.dst_be, flow.dport_be),
    };
    let ports_here = !flow.later_fragment && flow.proto != PROTO_SCTP;
    if ports_here {
        let (csum_off, udp) = if flow.proto == PROTO_TCP {
            (l4_off + tcp::CSUM, false)
        } else {
            (l4_off + udp::CSUM, true)
        };
        let mut i = 0;
        while i < 4 {
            if old_addr[i] != addr_be[i] {
                ctx.l4_csum(csum_off, old_addr[i], addr_be[i], 4, true, udp)?;
            }
            i += 1;
        }
        ctx.l4_csum(csum_off, old_port as u32, port_be as u32, 2, false, udp)?;
    }
    // The helpers may have moved the packet: `store` checks afresh.
    store(ctx, C::L2 + addr_off, *addr_be).ok_or(())?;
    if ports_here {
        store(ctx, port_off, port_be).ok_or(())?;
    }
    Ok(())
}

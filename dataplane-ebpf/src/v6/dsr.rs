//! Direct server return over IPv6 (`--external-mode dsr`): what `crate::dsr` does
//! for IPv4, with the frontend in a Destination Options extension header
//! ([`dataplane_common::dsr6`], RFC 8200, 4.6) instead of an IPv4 option, as
//! Cilium's DSR does for IPv6 (`dsr_set_ext6` and `find_dsr_v6`,
//! https://github.com/cilium/cilium/blob/main/bpf/lib/nodeport.h).
//!
//! It runs as `sliceway_dsr6` (`JUMP6_DSR`), entered by tail call from the IPv6
//! uplink programs, a stack and a verifier budget of its own, so the IPv6 body's
//! frame does not grow: to add the header to a new connection's translated packet,
//! or to record the connection of a packet that carries one. The header goes on the
//! packet that makes the first node's conntrack entry (a TCP SYN, the first datagram
//! of a UDP flow, the first packet a node sees of a flow moved to it), right after
//! the fixed IPv6 header, where the kernel makes room (`bpf_skb_adjust_room`,
//! `BPF_ADJ_ROOM_NET`), whatever extension headers follow: the fixed header's next
//! header becomes 60 and the new header's is the one it replaced, so the chain
//! stays valid. Only a hop-by-hop options header must stay first (RFC 8200, 4.1):
//! a packet with one is dropped (`drop_dsr_option`), never sent on without the
//! header, as IPv4 drops a packet whose header has no room left for its option. The payload length grows by the header's 24 bytes; the TCP or UDP
//! checksum stays as it is, because its pseudo-header holds the upper-layer packet
//! length (the transport header and data, not the extension headers before them)
//! and the final destination, neither of which changes (RFC 8200, 8.1,
//! https://www.rfc-editor.org/rfc/rfc8200#section-8.1).
//!
//! The MTU is not looked at, as with IPv4's option: a packet that no longer fits
//! its route is the kernel's to answer when it forwards it (ICMPv6 Packet Too Big,
//! `ip6_forward`). The header rides on a first packet only, usually a SYN or a
//! first datagram, far below any MTU.
//!
//! The backend's node finds the header as the packet's first extension header
//! ([`carries_option`], checked before the body) and leaves it on the packet, as
//! IPv4's option is left: the option's type says "skip if unrecognized", so the
//! pod's kernel, which does not know it, takes the packet all the same.

use aya_ebpf::{
    bindings::bpf_adj_room_mode::BPF_ADJ_ROOM_NET, macros::classifier, programs::TcContext,
};
use dataplane_common::{
    clusterip_marker6, dsr6, stat, CtKey, ServiceKey6, FAMILY_V6, IPV6_DEST_OPTS, IPV6_HOP_BY_HOP,
    JUMP6_DSR, PROTO_TCP, PROTO_UDP, SCOPE_ANY,
};

use super::{
    parse::{self, Packet6},
    Flow6,
};
use crate::{
    conntrack,
    counters::{count, Exit},
    dsr::{handover_failed, MODE_ACCEPT, MODE_INSERT},
    maps,
    packet::{ipv6, load, store, Frame, ETH_P_IPV6, ETH_TYPE_OFF, L3},
    tc::{DROP, PASS},
};

/// Keeps the frontend a new connection was sent to (the flow's destination as
/// parsed) in the skb's control buffer, for [`hand_over`] once the packet is
/// translated: the port in the upper half of `cb[0]`, the address in `cb[1..5]`.
#[inline(always)]
pub fn keep_frontend(ctx: &TcContext, flow: &Flow6) {
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it.
    unsafe {
        let cb = &mut (*ctx.skb.skb).cb;
        cb[0] = (flow.dport_be as u32) << 16;
        cb[1] = flow.dst_be[0];
        cb[2] = flow.dst_be[1];
        cb[3] = flow.dst_be[2];
        cb[4] = flow.dst_be[3];
    }
}

/// Hands the packet to `sliceway_dsr6`: with `insert`, the translated packet of a
/// new connection, to get the header naming the frontend [`keep_frontend`] kept;
/// without, a packet that carries one, to have its connection recorded. `l2`: bytes
/// before the IPv6 header. Returns the drop or pass if the handover failed.
#[inline(always)]
pub fn hand_over(ctx: &TcContext, insert: bool, l2: usize) -> Exit {
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it. A
    // tail call returns only if it failed.
    unsafe {
        let cb = &mut (*ctx.skb.skb).cb;
        let mode = if insert {
            (cb[0] & 0xffff_0000) | MODE_INSERT
        } else {
            MODE_ACCEPT
        };
        cb[0] = mode | ((l2 as u32) << 8);
        maps::JUMP6.tail_call(ctx, JUMP6_DSR);
    }
    handover_failed(insert)
}

/// Whether the packet is IPv6 whose first extension header is a destination options
/// header starting with the direct server return option (where the first node puts
/// it). `l2`: bytes before the IPv6 header.
#[inline(always)]
pub fn carries_option(ctx: &impl Frame, l2: usize) -> bool {
    if l2 > 0 && load::<[u8; 2]>(ctx, ETH_TYPE_OFF) != Some(ETH_P_IPV6.to_be_bytes()) {
        return false;
    }
    let Some(head) = load::<[u8; 8]>(ctx, l2) else {
        return false;
    };
    if head[0] >> 4 != 6 || head[ipv6::NEXT] != IPV6_DEST_OPTS {
        return false;
    }
    // Next header, length, option type, option length.
    let Some(h) = load::<[u8; 4]>(ctx, l2 + ipv6::LEN) else {
        return false;
    };
    h[1] == dsr6::HDR_EXT_LEN && h[2] == dsr6::OPT_TYPE && h[3] == dsr6::OPT_DATA_LEN
}

/// The IPv6 direct server return program, entered only by tail call from the IPv6
/// uplink programs (`sliceway_ext6`, `sliceway_l3ext6`).
#[classifier]
pub fn sliceway_dsr6(ctx: TcContext) -> i32 {
    // SAFETY: the context's own skb.
    let (w0, frontend_be) = unsafe {
        let cb = &(*ctx.skb.skb).cb;
        (cb[0], [cb[1], cb[2], cb[3], cb[4]])
    };
    let l2 = ((w0 >> 8) & 0xff) as usize;
    let (action, reason) = if w0 & 0xff == MODE_INSERT {
        match insert(&ctx, l2, frontend_be, (w0 >> 16) as u16) {
            Ok(()) => (PASS, stat::DNAT_DSR),
            Err(()) => (DROP, stat::DROP_DSR_OPTION),
        }
    } else if l2 == 0 {
        accept(&L3(&ctx))
    } else {
        accept(&ctx)
    };
    count(reason);
    // PASS and DROP are TC's verdicts.
    action
}

/// Puts the header naming `frontend_be:fport_be` after the fixed IPv6 header: the
/// fixed header's next header becomes 60 (the old one moves into the new header)
/// and its payload length grows by 24. Nothing else changes (no IPv6 header
/// checksum; the L4 checksum covers none of it, see the module's doc).
#[inline(always)]
fn insert(ctx: &TcContext, l2: usize, frontend_be: [u32; 4], fport_be: u16) -> Result<(), ()> {
    let head: [u8; 8] = load(ctx, l2).ok_or(())?;
    // A hop-by-hop options header must stay right after the fixed header (RFC 8200,
    // 4.1; the pod's kernel discards the packet otherwise): such a packet is dropped,
    // never sent on without the header.
    if head[ipv6::NEXT] == IPV6_HOP_BY_HOP {
        return Err(());
    }
    let payload = u16::from_be_bytes([head[ipv6::PAYLOAD_LEN], head[ipv6::PAYLOAD_LEN + 1]]);
    // A payload that would not fit the 16-bit field with the header: dropped, never
    // sent on without it.
    let grown = payload.checked_add(dsr6::HDR_LEN as u16).ok_or(())?;
    ctx.adjust_room(dsr6::HDR_LEN as i32, BPF_ADJ_ROOM_NET, 0)
        .map_err(|_| ())?;
    let len = grown.to_be_bytes();
    // Payload length and next header (the hop limit after them stays).
    store(
        ctx,
        l2 + ipv6::PAYLOAD_LEN,
        [len[0], len[1], IPV6_DEST_OPTS],
    )
    .ok_or(())?;
    let at = l2 + ipv6::LEN;
    store(
        ctx,
        at,
        [
            head[ipv6::NEXT],
            dsr6::HDR_EXT_LEN,
            dsr6::OPT_TYPE,
            dsr6::OPT_DATA_LEN,
        ],
    )
    .ok_or(())?;
    store(ctx, at + dsr6::ADDR_OFF, frontend_be).ok_or(())?;
    let port = fport_be.to_ne_bytes();
    store(ctx, at + dsr6::PORT_OFF, [port[0], port[1], dsr6::PADN, 0]).ok_or(())
}

/// Records the connection of a packet with the header, for a pod of this node, as
/// IPv4's `crate::dsr` does: its source is the client, its destination the pod, the
/// option names the frontend the client reached. The packet is parsed by the IPv6
/// body's walk (`parse::parse`: the header is one more destination options header
/// to it, and extension headers the client sent may follow). Refused (passed,
/// nothing recorded) if the frontend is not one of this node's; dropped if the
/// packet is addressed to a frontend or a ClusterIP (the header comes only on
/// packets already translated, and nothing reaches a frontend untranslated).
#[inline(always)]
fn accept<C: Frame>(ctx: &C) -> Exit {
    let refused = (PASS, stat::PASS_DSR_REFUSED);
    let Some(s) = maps::SCRATCH6.get_ptr_mut(0) else {
        return refused;
    };
    // SAFETY: a per-CPU map value, used only by this program on this CPU while it
    // runs (the IPv6 body that handed the packet over is done with it); no
    // reference outlives the run.
    let s = unsafe { &mut *s };
    match parse::parse(ctx, &mut s.flow) {
        Ok(Packet6::L4) => {}
        Ok(Packet6::Icmp { .. }) => return refused,
        Err(exit) => return exit,
    }
    let flow = &s.flow;
    let proto = flow.proto;
    if flow.later_fragment || (proto != PROTO_TCP && proto != PROTO_UDP) {
        return refused;
    }
    let at = C::L2 + ipv6::LEN;
    let Some(frontend_be) = load::<[u32; 4]>(ctx, at + dsr6::ADDR_OFF) else {
        return refused;
    };
    let Some(fport_be) = load::<u16>(ctx, at + dsr6::PORT_OFF) else {
        return refused;
    };
    let to_frontend = ServiceKey6 {
        addr_be: flow.dst_be,
        port_be: flow.dport_be,
        proto,
        scope: SCOPE_ANY,
    };
    if maps::service6(&to_frontend).is_some()
        || maps::service6(&clusterip_marker6(flow.dst_be)).is_some()
    {
        return (DROP, stat::DROP_DSR_OPTION);
    }
    let frontend = ServiceKey6 {
        addr_be: frontend_be,
        port_be: fport_be,
        proto,
        scope: SCOPE_ANY,
    };
    let Some(service) = maps::service6(&frontend) else {
        return refused;
    };
    // The pair this node would have made had it picked the pod: client to frontend,
    // pod to client.
    s.key = CtKey {
        src_be: flow.src_be,
        dst_be: frontend_be,
        sport_be: flow.sport_be,
        dport_be: fport_be,
        proto,
        family: FAMILY_V6,
        _pad: [0; 2],
    };
    let reply = CtKey {
        src_be: flow.dst_be,
        dst_be: flow.src_be,
        sport_be: flow.dport_be,
        dport_be: flow.sport_be,
        proto,
        family: FAMILY_V6,
        _pad: [0; 2],
    };
    if conntrack::adopt_dsr_keys(&s.key, &reply, flow.tcp_flags, service.id, conntrack::now()) {
        (PASS, stat::DSR_ACCEPTED)
    } else {
        refused
    }
}

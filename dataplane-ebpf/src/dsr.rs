//! Direct server return (`--external-mode dsr`, [`dataplane_common::SVC_F_DSR`]), as
//! Cilium's DSR with an IPv4 option does it (https://docs.cilium.io/en/stable/network/kubernetes/kubeproxy-free/#direct-server-return-dsr):
//! a connection from outside that would be masqueraded keeps its client's address;
//! the node it arrives at translates its destination to the backend as for any
//! connection and adds an IPv4 option naming the frontend the client addressed
//! ([`dataplane_common::dsr`]); the backend's node, seeing the option on a packet for
//! one of its pods, records the connection as if it had picked the pod itself, so the
//! pod's replies get the frontend back as their source there and go straight to the
//! client. With Maglev every node picks the same backend for a flow and the backend
//! sees the same tuple whichever node the flow arrives at, so a connection that ECMP
//! or a node change moves to another node goes on.
//!
//! It runs as `sliceway_dsr`, entered by tail call from the uplink programs (a stack
//! of its own): to add the option to a new connection's packet, or to record the
//! connection of a packet that carries one. The option goes on the packet that makes
//! the first node's conntrack entry (a TCP SYN, the first datagram of a UDP flow, or
//! the first packet a node sees of a flow moved to it), right after the fixed IPv4
//! header, where the kernel makes room (`bpf_skb_adjust_room`, `BPF_ADJ_ROOM_NET`).
//!
//! IPv6 has its own program, `sliceway_dsr6` (`crate::v6::dsr`), reached from the
//! IPv6 uplink programs: the same over IPv6's maps, the frontend in a destination
//! options header instead of an IPv4 option.

use aya_ebpf::{
    bindings::bpf_adj_room_mode::BPF_ADJ_ROOM_NET, macros::classifier, programs::TcContext,
};
use dataplane_common::{
    clusterip_marker, csum_replace2, dsr, stat, ServiceKey, PROTO_TCP, PROTO_UDP, SCOPE_ANY,
};

use crate::{
    conntrack,
    counters::{count, Exit},
    maps::{self, JUMP},
    packet::{ipv4, load, store, tcp, Flow, Frame, ETH_P_IP, ETH_TYPE_OFF},
    tc::{DROP, PASS},
};

/// What the program (`sliceway_dsr`, `sliceway_dsr6`) is to do with the packet
/// handed over.
pub(crate) const MODE_INSERT: u32 = 0;
pub(crate) const MODE_ACCEPT: u32 = 1;

/// What a packet gets when its handover to a direct server return program failed
/// (the tail call returned): a new connection's packet is dropped, since it must
/// not leave without the frontend's name; a packet with the option passes with
/// nothing recorded.
#[inline(always)]
pub(crate) fn handover_failed(insert: bool) -> Exit {
    if insert {
        (DROP, stat::DROP_DSR_OPTION)
    } else {
        (PASS, stat::PASS_DSR_REFUSED)
    }
}

/// Keeps the frontend a new connection was sent to (the flow's destination as
/// parsed) in the skb's control buffer, for [`hand_over`] once the packet is
/// translated.
#[inline(always)]
pub fn keep_frontend(ctx: &TcContext, flow: &Flow) {
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it.
    unsafe {
        let cb = &mut (*ctx.skb.skb).cb;
        cb[1] = flow.dst_be;
        cb[2] = flow.dport_be as u32;
    }
}

/// Hands the packet to `sliceway_dsr`: with `insert`, the translated packet of a new
/// connection, to get the option naming the frontend [`keep_frontend`] kept; without,
/// a packet that carries an option, to have its connection recorded (the program
/// reads the packet itself). `l2`: bytes before the IP header. Returns the drop or
/// pass if the handover failed.
#[inline(always)]
pub fn hand_over(ctx: &TcContext, insert: bool, l2: usize) -> Exit {
    let mode = if insert { MODE_INSERT } else { MODE_ACCEPT };
    // SAFETY: the context's own skb; `cb` is scratch space that travels with it.
    unsafe {
        (*ctx.skb.skb).cb[0] = mode | ((l2 as u32) << 8);
        JUMP.tail_call(ctx, dataplane_common::JUMP_DSR);
    }
    handover_failed(insert)
}

/// Whether the packet is IPv4 with the option as the first of its options (where the
/// first node puts it), in a first or only fragment (a later one holds no ports).
/// `l2`: bytes before the IP header.
#[inline(always)]
pub fn carries_option(ctx: &impl Frame, l2: usize) -> bool {
    if l2 > 0 && load::<[u8; 2]>(ctx, ETH_TYPE_OFF) != Some(ETH_P_IP.to_be_bytes()) {
        return false;
    }
    let Some(head) = load::<[u8; 8]>(ctx, l2) else {
        return false;
    };
    let words = (dsr::OPT_OFF + dsr::OPT_LEN as usize) / 4;
    if head[ipv4::VERSION_IHL] >> 4 != 4 || ((head[ipv4::VERSION_IHL] & 0x0f) as usize) < words {
        return false;
    }
    let frag = u16::from_be_bytes([head[ipv4::FLAGS_FRAG], head[ipv4::FLAGS_FRAG + 1]]);
    if frag & ipv4::FRAG_OFFSET_MASK != 0 {
        return false;
    }
    load::<[u8; 2]>(ctx, l2 + dsr::OPT_OFF) == Some([dsr::OPT_TYPE, dsr::OPT_LEN])
}

/// The DSR program, entered only by tail call from the uplink programs.
#[classifier]
pub fn sliceway_dsr(ctx: TcContext) -> i32 {
    // SAFETY: the context's own skb.
    let (w0, frontend_be, fport) = unsafe {
        let cb = &(*ctx.skb.skb).cb;
        (cb[0], cb[1], cb[2])
    };
    let l2 = ((w0 >> 8) & 0xff) as usize;
    let (action, reason) = if w0 & 0xff == MODE_INSERT {
        match insert(&ctx, l2, frontend_be, fport as u16) {
            Ok(()) => (PASS, stat::DNAT_DSR),
            Err(()) => (DROP, stat::DROP_DSR_OPTION),
        }
    } else {
        accept(&ctx, l2)
    };
    count(reason);
    // PASS and DROP are TC's verdicts.
    action
}

/// Puts the option naming `frontend_be:fport_be` after the fixed IPv4 header and
/// fixes the header's length, total length and checksum (the L4 checksum covers none
/// of them).
#[inline(always)]
fn insert(ctx: &TcContext, l2: usize, frontend_be: u32, fport_be: u16) -> Result<(), ()> {
    let head: [u8; 4] = load(ctx, l2).ok_or(())?;
    let check: u16 = load(ctx, l2 + ipv4::CSUM).ok_or(())?;
    let ihl = ((head[ipv4::VERSION_IHL] & 0x0f) as usize) * 4;
    if ihl + dsr::OPT_LEN as usize > ipv4::MAX_LEN {
        return Err(());
    }
    ctx.adjust_room(dsr::OPT_LEN as i32, BPF_ADJ_ROOM_NET, 0)
        .map_err(|_| ())?;
    let port = fport_be.to_ne_bytes();
    let addr = frontend_be.to_ne_bytes();
    let opt = [
        dsr::OPT_TYPE,
        dsr::OPT_LEN,
        port[0],
        port[1],
        addr[0],
        addr[1],
        addr[2],
        addr[3],
    ];
    let total = u16::from_be_bytes([head[2], head[3]]).wrapping_add(dsr::OPT_LEN as u16);
    let new_head = [
        head[ipv4::VERSION_IHL] + (dsr::OPT_LEN / 4),
        head[1],
        total.to_be_bytes()[0],
        total.to_be_bytes()[1],
    ];
    // RFC 1624 over the two changed words and the four new ones (zero before).
    let word = |b: [u8; 2]| u16::from_ne_bytes(b);
    let mut sum = csum_replace2(
        check,
        word([head[0], head[1]]),
        word([new_head[0], new_head[1]]),
    );
    sum = csum_replace2(
        sum,
        word([head[2], head[3]]),
        word([new_head[2], new_head[3]]),
    );
    sum = csum_replace2(sum, 0, word([opt[0], opt[1]]));
    sum = csum_replace2(sum, 0, word([opt[2], opt[3]]));
    sum = csum_replace2(sum, 0, word([opt[4], opt[5]]));
    sum = csum_replace2(sum, 0, word([opt[6], opt[7]]));
    store(ctx, l2, new_head).ok_or(())?;
    store(ctx, l2 + ipv4::CSUM, sum).ok_or(())?;
    store(ctx, l2 + dsr::OPT_OFF, opt).ok_or(())
}

/// Records the connection of a packet with the option, for a pod of this node: its
/// source is the client, its destination the pod, the option names the frontend the
/// client reached. Refused (passed, nothing recorded) if the frontend is not one of
/// this node's. A packet with the option addressed to a frontend or a ClusterIP is
/// dropped: the option comes only on packets already translated, and the packet
/// must never reach a frontend untranslated.
#[inline(always)]
fn accept(ctx: &TcContext, l2: usize) -> Exit {
    let refused = (PASS, stat::PASS_DSR_REFUSED);
    let Some(ip) = load::<[u8; ipv4::MIN_LEN + dsr::OPT_LEN as usize]>(ctx, l2) else {
        return refused;
    };
    let ihl = ((ip[ipv4::VERSION_IHL] & 0x0f) as usize) * 4;
    let proto = ip[ipv4::PROTO];
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return refused;
    }
    let Some(ports) = load::<[u8; 4]>(ctx, l2 + ihl) else {
        return refused;
    };
    // TCP's flags for the connection's state (UDP has none).
    let tcp_flags = if proto == PROTO_TCP {
        load::<u8>(ctx, l2 + ihl + tcp::FLAGS).unwrap_or(0)
    } else {
        0
    };
    let word = |at: usize| u32::from_ne_bytes([ip[at], ip[at + 1], ip[at + 2], ip[at + 3]]);
    let port = |at: usize| u16::from_ne_bytes([ip[at], ip[at + 1]]);
    let opt = dsr::OPT_OFF;
    let c = conntrack::Dsr {
        client_be: word(ipv4::SRC),
        pod_be: word(ipv4::DST),
        sport_be: u16::from_ne_bytes([ports[0], ports[1]]),
        pod_port_be: u16::from_ne_bytes([ports[2], ports[3]]),
        frontend_be: word(opt + 4),
        fport_be: port(opt + 2),
        proto,
        tcp_flags,
    };
    let to_frontend = ServiceKey {
        addr_be: c.pod_be,
        port_be: c.pod_port_be,
        proto,
        scope: SCOPE_ANY,
    };
    if maps::service(&to_frontend).is_some() || maps::service(&clusterip_marker(c.pod_be)).is_some()
    {
        return (DROP, stat::DROP_DSR_OPTION);
    }
    let key = ServiceKey {
        addr_be: c.frontend_be,
        port_be: c.fport_be,
        proto,
        scope: SCOPE_ANY,
    };
    let Some(service) = maps::service(&key) else {
        return refused;
    };
    if conntrack::adopt_dsr(c, service.id, conntrack::now()) {
        (PASS, stat::DSR_ACCEPTED)
    } else {
        refused
    }
}

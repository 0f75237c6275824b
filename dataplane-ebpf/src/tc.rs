//! The TC program's entry: parse, then conntrack, then the frontends. A packet from a
//! client of a tracked connection goes to its backend, a reply of one gets its
//! frontend back (reverse NAT), and a new packet to a frontend picks a backend
//! (`connection_or_frontend`; a frontend without backends rejects or drops); any
//! other packet (`untracked`) is rejected if it is for a ClusterIP's undeclared port,
//! dropped if for an address of a ServiceCIDR that no Service holds, or passes
//! untouched.
//!
//! IPv6 is handed over first, by tail call, to the IPv6 programs (`crate::v6`),
//! so this body and its frame are IPv4's alone.
//!
//! The XDP program of the uplinks (`xdp.rs`) runs this same body ([`decide`]) over
//! its frame; what needs a tail call or the skb (REJECT, SCTP ports, ICMP errors) it
//! leaves to this program ([`TO_TC`]).

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use dataplane_common::{
    stat, CtKey, JUMP6_EXT, JUMP6_L3, JUMP6_L3_EXT, JUMP6_L3_OUT, JUMP6_OUT, JUMP6_TC, PROTO_SCTP,
    SVC_F_DROP_EMPTY, SVC_F_SOURCE_RANGES,
};

use crate::{
    bridge,
    conntrack::{self, Forward, Reply},
    counters::{self, count, Exit},
    dsr, icmp, lookup, maps,
    nat::{rewrite, End},
    packet::{Flow, Frame, Packet, L3},
    parse::{self, parse},
    reject, sctp, v6, xdp,
};

pub const PASS: i32 = TC_ACT_OK;
pub const DROP: i32 = TC_ACT_SHOT;
/// Not one of TC's verdicts: the XDP program passes the packet on untouched, for the
/// TC program of the same interface to decide.
pub const TO_TC: i32 = -1;

/// What a program does beyond reading and rewriting its packet. TC hands packets to
/// other programs by tail call (`sliceway_reject`, `sliceway_sctp_nat`) and reads
/// the skb; XDP cannot (a tail call reaches programs of its own type only), so it
/// leaves those packets to TC, untouched.
pub trait Program: Frame {
    /// Whether this program finishes every packet itself (TC).
    const TAIL_CALLS: bool;
    /// An ICMP error that may be about a translated connection.
    #[inline(always)]
    fn icmp_error(&self, src_be: u32, l4_off: usize, ip_end: usize, now: u64) -> Result<Exit, Exit>
    where
        Self: Sized,
    {
        icmp::error(self, src_be, l4_off, ip_end, now)
    }
    /// Answers `flow` with ICMP port unreachable (`sliceway_reject` counts `reason`);
    /// drops it if the handover fails.
    fn reject(&self, flow: &Flow, reason: u32) -> Exit;
    /// Sets the ports of an SCTP packet whose addresses are translated (in
    /// `sliceway_sctp_nat`, which counts `reason` and passes it); unchanged ports
    /// need no handover.
    fn sctp_ports(&self, flow: &Flow, sport_be: u16, dport_be: u16, reason: u32) -> Exit;
    /// Direct server return (`sliceway_dsr`): with `insert`, adds the option naming
    /// the frontend [`Program::dsr_frontend`] kept to the translated packet of a new
    /// connection; without, records the connection of a packet that carries one.
    fn dsr(&self, insert: bool) -> Exit;
    /// Keeps the frontend a new connection with direct server return was sent to
    /// (the flow's destination as parsed) for [`Program::dsr`].
    fn dsr_frontend(&self, flow: &Flow);
}

impl Program for TcContext {
    const TAIL_CALLS: bool = true;

    #[inline(always)]
    fn reject(&self, flow: &Flow, reason: u32) -> Exit {
        reject::port_unreachable(self, flow, reason, false);
        (DROP, stat::DROP_REJECT)
    }

    #[inline(always)]
    fn sctp_ports(&self, flow: &Flow, sport_be: u16, dport_be: u16, reason: u32) -> Exit {
        if sport_be == flow.sport_be && dport_be == flow.dport_be {
            return (PASS, reason);
        }
        sctp::translate_ports(self, flow, sport_be, dport_be, reason);
        (DROP, stat::DROP_REWRITE)
    }

    #[inline(always)]
    fn dsr(&self, insert: bool) -> Exit {
        dsr::hand_over(self, insert, Self::L2)
    }

    #[inline(always)]
    fn dsr_frontend(&self, flow: &Flow) {
        dsr::keep_frontend(self, flow)
    }
}

/// Interfaces without an Ethernet header: the same, with offsets from the IP header
/// and a reject program of their own (there is no Ethernet header to turn round);
/// `sliceway_sctp_nat` serves both, its offsets come with the handover.
impl Program for L3<'_> {
    const TAIL_CALLS: bool = true;

    #[inline(always)]
    fn reject(&self, flow: &Flow, reason: u32) -> Exit {
        reject::port_unreachable(self.0, flow, reason, true);
        (DROP, stat::DROP_REJECT)
    }

    #[inline(always)]
    fn sctp_ports(&self, flow: &Flow, sport_be: u16, dport_be: u16, reason: u32) -> Exit {
        self.0.sctp_ports(flow, sport_be, dport_be, reason)
    }

    #[inline(always)]
    fn dsr(&self, insert: bool) -> Exit {
        dsr::hand_over(self.0, insert, Self::L2)
    }

    #[inline(always)]
    fn dsr_frontend(&self, flow: &Flow) {
        dsr::keep_frontend(self.0, flow)
    }
}

#[classifier]
pub fn sliceway_tc(ctx: TcContext) -> i32 {
    if v6::is_ipv6(&ctx) {
        return v6::hand_over(&ctx, JUMP6_TC);
    }
    run::<false, false, _>(&ctx)
}

/// The program of the node's uplinks (`--external-interfaces`): what `sliceway_tc`
/// does, but a new connection comes from outside the node, so it meets a frontend's
/// external entry first and is masqueraded without one (`lookup::frontend_external`).
/// Replies of masqueraded connections, from backends on other nodes, come back here.
/// A packet the XDP program decided passes at once; one with the direct server
/// return option goes to `sliceway_dsr` ([`dsr_accept`]).
#[classifier]
pub fn sliceway_tc_ext(ctx: TcContext) -> i32 {
    // First: IPv4 or IPv6, what the XDP programs decided passes at once.
    if xdp::decided(&ctx) {
        count(stat::PASS_XDP_DECIDED);
        return PASS;
    }
    if v6::is_ipv6(&ctx) {
        return v6::hand_over(&ctx, JUMP6_EXT);
    }
    if let Some(verdict) = dsr_accept(&ctx) {
        return verdict;
    }
    run::<false, true, _>(&ctx)
}

/// A connection another node sent here with direct server return, for a pod of
/// this node (only a node that translated it adds the option): handed to
/// `sliceway_dsr` to be recorded, so the pod's replies leave from the frontend.
/// Checked before parsing, outside the body's frame, which has no room to spare.
#[inline(always)]
fn dsr_accept<C: Program>(ctx: &C) -> Option<i32> {
    if !dsr::carries_option(ctx, C::L2) {
        return None;
    }
    let (verdict, reason) = ctx.dsr(false);
    count(reason);
    Some(verdict)
}

/// `sliceway_tc` on an interface without an Ethernet header.
#[classifier]
pub fn sliceway_l3(ctx: TcContext) -> i32 {
    if parse::l3_not_ipv4(&L3(&ctx)) {
        return v6::hand_over(&ctx, JUMP6_L3);
    }
    run::<false, false, _>(&L3(&ctx))
}

/// `sliceway_tc_ext` on an uplink without an Ethernet header (no XDP there).
#[classifier]
pub fn sliceway_l3_ext(ctx: TcContext) -> i32 {
    if parse::l3_not_ipv4(&L3(&ctx)) {
        return v6::hand_over(&ctx, JUMP6_L3_EXT);
    }
    if let Some(verdict) = dsr_accept(&L3(&ctx)) {
        return verdict;
    }
    run::<false, true, _>(&L3(&ctx))
}

/// The program at egress of the pods' interfaces and the uplinks. A backend in the
/// host network of this node (a hostNetwork pod, the API server behind `kubernetes`
/// on a control-plane node) answers from the node's own stack, so its replies meet
/// no ingress program: they get their frontend back here, as kube-proxy's
/// netfilter conntrack gives them back on the way out (`nf_nat_inet_fn` for
/// `IP_CT_REPLY` at `POSTROUTING`,
/// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_core.c). A
/// packet of the node's own to an unallocated address of a ServiceCIDR is dropped,
/// as kube-proxy's `cluster-ips-check` chain drops it at `output`
/// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go);
/// any other packet passes untouched.
#[classifier]
pub fn sliceway_tc_out(ctx: TcContext) -> i32 {
    if v6::is_ipv6(&ctx) {
        return v6::hand_over(&ctx, JUMP6_OUT);
    }
    out(&ctx)
}

/// `sliceway_tc_out` on an interface without an Ethernet header.
#[classifier]
pub fn sliceway_l3_out(ctx: TcContext) -> i32 {
    if parse::l3_not_ipv4(&L3(&ctx)) {
        return v6::hand_over(&ctx, JUMP6_L3_OUT);
    }
    out(&L3(&ctx))
}

#[inline(always)]
fn out<C: Program>(ctx: &C) -> i32 {
    let (action, reason) = match reply_out(ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    count(reason);
    action
}

/// The egress body: a reply of a live connection gets its frontend back; a packet
/// to an unallocated ClusterIP is dropped; anything else (not TCP, UDP or SCTP,
/// malformed, neither) passes.
#[inline(always)]
fn reply_out<C: Program>(ctx: &C) -> Result<Exit, Exit> {
    let Ok(Packet::L4(flow)) = parse(ctx) else {
        return Ok((PASS, stat::PASS_EGRESS));
    };
    let key = conntrack::key_of(&flow);
    let now = conntrack::now();
    let Forward::Reply(rev) = conntrack::forward(&flow, &key, now) else {
        return Ok(not_a_reply_out(&flow));
    };
    let Reply::Live(orig) = conntrack::reply_at(&rev, &flow, &key, now) else {
        return Ok(not_a_reply_out(&flow));
    };
    match revnat(ctx, &flow, &orig)? {
        (PASS, stat::REVNAT) => Ok((PASS, stat::REVNAT_EGRESS)),
        exit => Ok(exit),
    }
}

/// A packet the node sends that is no reply: dropped if to an unallocated ClusterIP
/// (`lookup::is_unallocated`), else passed.
#[inline(always)]
fn not_a_reply_out(flow: &Flow) -> Exit {
    if lookup::is_unallocated(flow) {
        return (DROP, stat::DROP_UNALLOCATED_CLUSTERIP);
    }
    (PASS, stat::PASS_EGRESS)
}

/// The program's body; `BRIDGE` adds what `sliceway_bridge` does while an agent
/// migrates from layout v1 (`bridge.rs`), compiled out of `sliceway_tc`; `EXTERNAL`
/// makes it `sliceway_tc_ext`.
#[inline(always)]
pub fn run<const BRIDGE: bool, const EXTERNAL: bool, C: Program>(ctx: &C) -> i32 {
    let (mut action, mut reason) = match decide::<BRIDGE, EXTERNAL, C>(ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    if EXTERNAL && reason == stat::DNAT_DSR {
        // The new connection is translated: its option goes on by tail call, out of
        // the body's frame (`sliceway_dsr` counts it).
        (action, reason) = ctx.dsr(true);
    }
    count(reason);
    action
}

/// What to do with the packet, and the `stat` slot that says why.
#[inline(always)]
pub fn decide<const BRIDGE: bool, const EXTERNAL: bool, C: Program>(ctx: &C) -> Result<Exit, Exit> {
    let flow = match parse(ctx)? {
        Packet::L4(flow) => flow,
        Packet::Icmp {
            src_be,
            l4_off,
            ip_end,
        } => return ctx.icmp_error(src_be, l4_off, ip_end, conntrack::now()),
    };
    if !C::TAIL_CALLS && flow.proto == PROTO_SCTP {
        // Its ports are set by a tail call, after its addresses: all of it is TC's.
        return Ok((TO_TC, stat::XDP_TO_TC));
    }
    let key = conntrack::key_of(&flow);
    let now = conntrack::now();
    match connection_or_frontend::<BRIDGE, EXTERNAL, C>(ctx, &flow, &key, now)? {
        Claim::Exit(exit) => Ok(exit),
        Claim::Unclaimed(met) => untracked::<BRIDGE, C>(ctx, &flow, &key, now, met),
    }
}

/// What the first half of a body (`connection_or_frontend`, and IPv6's) made of a
/// packet.
pub enum Claim {
    /// Its exit: translated on its connection or to a frontend's backend, refused,
    /// or, over IPv4, a reply given its frontend back.
    Exit(Exit),
    /// Neither a tracked connection's nor a frontend's: for the second half
    /// (`untracked`), with what the forward lookup met at its key.
    Unclaimed(Met),
}

/// What the forward lookup met at a packet's key besides a forward entry.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Met {
    /// No reverse entry at the key.
    Nothing,
    /// A live connection's reverse entry: the packet is its reply. IPv6 only; IPv4
    /// translates the reply at once.
    LiveReply,
    /// A reverse entry whose connection is gone (now removed): with no frontend
    /// either, the packet passes as stale.
    Stale,
}

/// A packet of a tracked connection keeps its backend, also when its Service is gone;
/// a reply of a live connection gets its frontend back (`revnat`); a new packet to a
/// frontend picks a backend and is tracked. Then DNAT (and a source port rewrite if
/// the connection's reply tuple needed one). [`Claim::Unclaimed`]: none of these.
///
/// Conntrack comes before the frontends, as in netfilter, where a packet on a live
/// connection's reply tuple is that connection's reply and NAT rules see only new
/// connections (`nf_conntrack_in`, then `nf_nat_inet_fn` for `IP_CT_NEW` only:
/// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_core.c): a
/// reply is never taken for a new connection to a frontend at its destination (a
/// masqueraded client's port that is also a NodePort), and costs no frontend lookup.
#[inline(always)]
fn connection_or_frontend<const BRIDGE: bool, const EXTERNAL: bool, C: Program>(
    ctx: &C,
    flow: &Flow,
    key: &CtKey,
    now: u64,
) -> Result<Claim, Exit> {
    if BRIDGE {
        // Before the lookup, which then finds what it adopted.
        bridge::adopt_forward(flow, now);
    }
    let (entry, reason) = match conntrack::forward(flow, key, now) {
        Forward::Tracked(entry) if flow.later_fragment => (entry, stat::NAT_FRAGMENT),
        Forward::Tracked(entry) => (entry, stat::DNAT_ESTABLISHED),
        new => {
            let met = match new {
                Forward::Reply(rev) => match conntrack::reply_at(&rev, flow, key, now) {
                    Reply::Live(orig) => return revnat(ctx, flow, &orig).map(Claim::Exit),
                    Reply::None => Met::Nothing,
                    Reply::Stale => Met::Stale,
                },
                _ => Met::Nothing,
            };
            let found = if EXTERNAL {
                lookup::frontend_external(flow)
            } else {
                lookup::frontend(flow).map(|s| (s, lookup::pod_nat(flow, &s)))
            };
            let Some((service, nat)) = found else {
                return Ok(Claim::Unclaimed(met));
            };
            if flow.later_fragment {
                // The first fragment made no connection (it was dropped, or the
                // connection expired since): never pass the rest untranslated.
                return Err((DROP, stat::DROP_FRAGMENT_ORPHAN));
            }
            // loadBalancerSourceRanges, before anything else (kube-proxy's
            // firewall check comes before the service's chains).
            if service.flags & SVC_F_SOURCE_RANGES != 0
                && !maps::source_allowed(lookup::frontend_key(flow), flow.src_be)
            {
                return Err((DROP, stat::DROP_SOURCE_RANGE));
            }
            if service.count == 0 {
                // Never let a packet reach the VIP untranslated: with endpoints on
                // other nodes only and a Local policy, drop (kube-proxy's "drop");
                // with none anywhere, reject.
                if service.flags & SVC_F_DROP_EMPTY != 0 {
                    counters::refused(service.id, true);
                    return Ok(Claim::Exit((DROP, stat::DROP_NO_BACKEND)));
                }
                if !C::TAIL_CALLS {
                    return Ok(Claim::Exit((TO_TC, stat::XDP_TO_TC)));
                }
                counters::refused(service.id, false);
                return Ok(Claim::Exit(ctx.reject(flow, stat::REJECT_NO_BACKEND)));
            }
            // Direct server return's option needs the skb: TC's.
            if nat == conntrack::NAT_DSR {
                if !C::TAIL_CALLS {
                    return Ok(Claim::Exit((TO_TC, stat::XDP_TO_TC)));
                }
                // For the option, added once the packet is translated (`run`).
                ctx.dsr_frontend(flow);
            }
            let picked = lookup::pick(flow.src_be, flow.hash(), &service, now)?;
            let tracked = conntrack::track(
                flow,
                key,
                service.id,
                picked.backend_id,
                &picked.backend,
                nat,
            )?;
            let entry = maps::conntrack(key).ok_or((DROP, stat::DROP_CONNTRACK))?;
            if BRIDGE {
                bridge::mirror(flow, &entry);
            }
            (entry, tracked.reason(nat))
        }
    };
    counters::translated(
        entry.service_id,
        entry.backend_id,
        ctx.wire_len() as u64,
        reason != stat::DNAT_ESTABLISHED && reason != stat::NAT_FRAGMENT,
    );
    let to = &entry.pair;
    rewrite(ctx, flow, End::Destination, to.src_be[0], to.sport_be)
        .map_err(|_| (DROP, stat::DROP_REWRITE))?;
    // The source as the backend is to see it: the client's own, with its port
    // remapped on a reply-tuple clash, or the hairpin address for a pod that reached
    // itself (a later fragment or SCTP: the address only, ports are elsewhere).
    let ports_here = flow.proto != PROTO_SCTP && !flow.later_fragment;
    if to.dst_be[0] != flow.src_be || (ports_here && to.dport_be != flow.sport_be) {
        rewrite(ctx, flow, End::Source, to.dst_be[0], to.dport_be)
            .map_err(|_| (DROP, stat::DROP_REWRITE))?;
    }
    if flow.proto == PROTO_SCTP && !flow.later_fragment {
        return Ok(Claim::Exit(ctx.sctp_ports(
            flow,
            to.dport_be,
            to.sport_be,
            reason,
        )));
    }
    Ok(Claim::Exit((PASS, reason)))
}

/// A reply of a live connection gets its frontend back as the source (and its
/// client's own port back if it was remapped).
#[inline(always)]
fn revnat<C: Program>(ctx: &C, flow: &Flow, orig: &CtKey) -> Result<Exit, Exit> {
    rewrite(ctx, flow, End::Source, orig.dst_be[0], orig.dport_be)
        .map_err(|_| (DROP, stat::DROP_REWRITE))?;
    // The client as it sent: its own port again if it was remapped, its own address
    // again for a hairpin connection.
    let ports_here = flow.proto != PROTO_SCTP && !flow.later_fragment;
    if orig.src_be[0] != flow.dst_be || (ports_here && orig.sport_be != flow.dport_be) {
        rewrite(ctx, flow, End::Destination, orig.src_be[0], orig.sport_be)
            .map_err(|_| (DROP, stat::DROP_REWRITE))?;
    }
    if flow.proto == PROTO_SCTP && !flow.later_fragment {
        return Ok(ctx.sctp_ports(flow, orig.dport_be, orig.sport_be, stat::REVNAT));
    }
    if flow.later_fragment {
        return Ok((PASS, stat::NAT_FRAGMENT));
    }
    Ok((PASS, stat::REVNAT))
}

/// A packet neither from a client of a tracked connection, nor a reply of one, nor
/// to a frontend (`met`: what the forward lookup met at its key): a stale reverse
/// entry's passes; the rest of a datagram whose
/// first fragment made no connection is dropped if to a ClusterIP; a ClusterIP's
/// undeclared port is rejected; an unallocated address of a ServiceCIDR is dropped;
/// anything else passes untouched.
#[inline(always)]
fn untracked<const BRIDGE: bool, C: Program>(
    ctx: &C,
    flow: &Flow,
    key: &CtKey,
    now: u64,
    met: Met,
) -> Result<Exit, Exit> {
    if BRIDGE {
        bridge::adopt_reply(flow, now);
    }
    // The forward lookup answered replies already (`connection_or_frontend`); bridging may
    // have just adopted a reply entry: it looks again.
    let stale = met == Met::Stale;
    let reply = if BRIDGE {
        match conntrack::reverse(flow, key, now) {
            Reply::None if stale => Reply::Stale,
            found => found,
        }
    } else if stale {
        Reply::Stale
    } else {
        Reply::None
    };
    match reply {
        Reply::Live(orig) => revnat(ctx, flow, &orig),
        // The rest of a datagram whose first fragment made no connection: to a
        // ClusterIP (the first was rejected) it is dropped, never passed to the VIP
        // untranslated; anything else passes.
        Reply::None if flow.later_fragment && lookup::is_clusterip(flow) => {
            Ok((DROP, stat::DROP_FRAGMENT_ORPHAN))
        }
        Reply::None if flow.later_fragment => Ok((PASS, stat::PASS_FRAGMENT)),
        Reply::None => {
            conntrack::direct(flow, key);
            // A ClusterIP on a port or protocol its Service does not declare: rejected,
            // as kube-proxy's nftables `cluster-ips` set does, never passed on.
            if lookup::is_clusterip(flow) {
                if !C::TAIL_CALLS {
                    return Ok((TO_TC, stat::XDP_TO_TC));
                }
                return Ok(ctx.reject(flow, stat::REJECT_NO_PORT));
            }
            // Inside a ServiceCIDR, and no Service's ClusterIP: dropped, as kube-proxy's
            // nftables `cluster-ips-check` chain drops it ("Drop traffic to unallocated
            // ClusterIPs", only with a ServiceCIDR;
            // https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go).
            if maps::in_service_cidr(flow.dst_be) {
                return Ok((DROP, stat::DROP_UNALLOCATED_CLUSTERIP));
            }
            Ok((PASS, stat::PASS_NO_SERVICE))
        }
        Reply::Stale => Ok((PASS, stat::PASS_STALE_CONNTRACK)),
    }
}

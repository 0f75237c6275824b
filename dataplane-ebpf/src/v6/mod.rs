//! IPv6: programs of their own, reached by tail call (`JUMP6`) from the entry
//! programs, which see the EtherType (or the IP version on an interface without an
//! Ethernet header) and hand the packet over before IPv4's body, so IPv4's frame and
//! verifier cost stay as they were. A kernel that refuses these programs leaves their
//! slots empty: IPv6 then passes untouched, counted `pass_not_ipv4`, as before.
//!
//! The body makes IPv4's decisions (`crate::tc`) over IPv6's maps (`SERVICES6`,
//! `BACKENDS6`, `FRAGMENTS6`, `NAT_CONFIG6`, `SOURCE_RANGES6`) and the shared ones
//! (`SLOTS`, `CONNTRACK` with `FAMILY_V6` keys, `AFFINITY` keyed by the whole
//! address, the counters): conntrack or pick, DNAT (a source port remapped on a
//! reply-tuple clash), reverse NAT, hairpin through `HAIRPIN6_ADDR_BE`, the
//! ClusterIP marker, reject (ICMPv6 port unreachable, `reject.rs`) or drop for
//! frontends without backends, masquerade on the uplinks (`NAT_CONFIG6`), or direct
//! server return there for frontends with `SVC_F_DSR` (`dsr.rs`, tail call: the
//! frontend in a destination options header; the backend's node records the
//! connection of a packet that carries one); ICMPv6 goes to the ICMPv6 error
//! program (`icmp.rs`, tail call), which translates errors about translated
//! connections back.
//!
//! The XDP program of the uplinks runs this body too ([`decide`], in
//! `sliceway_xdp6`, `crate::xdp`): what needs a tail call (reject, SCTP ports,
//! ICMPv6 errors, direct server return's new connections and packets carrying its
//! header) it leaves to TC before rewriting anything ([`Program6::TAIL_CALLS`]).

pub mod dsr;
mod icmp;
mod nat;
mod parse;
mod reject;

use aya_ebpf::{macros::classifier, programs::TcContext};
use dataplane_common::{
    flow_hash6, reply_client6, stat, Backend6, CtEntry, CtKey, FAMILY_V6, JUMP6_ICMP,
    JUMP6_ICMP_L3, JUMP6_REJECT, JUMP6_REJECT_L3, PROTO_SCTP, SVC_F_DROP_EMPTY,
    SVC_F_SOURCE_RANGES,
};

use crate::{
    conntrack::{self, Forward, Reply, Tuple},
    counters::{self, count, Exit},
    lookup, maps,
    nat::End,
    packet::{Frame, L3},
    sctp,
    tc::{Claim, Met, DROP, PASS, TO_TC},
};

pub use nat::rewrite6;

/// The fields of an IPv6 TCP/UDP/SCTP packet the programs decide on, network byte
/// order; as [`crate::packet::Flow`].
pub struct Flow6 {
    pub src_be: [u32; 4],
    pub dst_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// The first packet of a connection: TCP SYN without ACK, or SCTP INIT.
    pub syn_only: bool,
    /// TCP flags; SCTP's ends as `FLAG_RST` (see `Flow`).
    pub tcp_flags: u8,
    /// A non-first fragment: ports from the first fragment, addresses rewritten only.
    pub later_fragment: bool,
    /// Length of the L4 packet (payload length minus extension headers), zero for a
    /// first fragment. SCTP's checksum covers it.
    pub l4_len: u16,
    /// Offset of the L4 header (after the extension headers).
    pub l4_off: usize,
}

impl Flow6 {
    /// The conntrack key of the packet as it arrives.
    #[inline(always)]
    pub fn key(&self) -> CtKey {
        CtKey {
            src_be: self.src_be,
            dst_be: self.dst_be,
            sport_be: self.sport_be,
            dport_be: self.dport_be,
            proto: self.proto,
            family: FAMILY_V6,
            _pad: [0; 2],
        }
    }
}

impl Tuple for Flow6 {
    type Backend = Backend6;

    #[inline(always)]
    fn proto(&self) -> u8 {
        self.proto
    }

    #[inline(always)]
    fn syn_only(&self) -> bool {
        self.syn_only
    }

    #[inline(always)]
    fn tcp_flags(&self) -> u8 {
        self.tcp_flags
    }

    #[inline(always)]
    fn hash(&self) -> u32 {
        flow_hash6(
            self.src_be,
            self.dst_be,
            self.sport_be,
            self.dport_be,
            self.proto,
        )
    }

    #[inline(always)]
    fn reply_key(&self, backend: &Backend6) -> CtKey {
        CtKey {
            src_be: backend.addr_be,
            dst_be: reply_client6(self.src_be, backend.addr_be),
            sport_be: backend.port_be,
            dport_be: self.sport_be,
            proto: self.proto,
            family: FAMILY_V6,
            _pad: [0; 2],
        }
    }

    #[inline(always)]
    fn backend_holds(entry: &CtEntry) -> bool {
        matches!(maps::backend6(entry.backend_id),
            Some(b) if same_addr(&b.addr_be, &entry.pair.src_be) && b.port_be == entry.pair.sport_be)
    }

    #[inline(always)]
    fn masquerade(&self, reply: &mut CtKey, key: &CtKey, now: u64) -> Result<bool, Exit> {
        let nat = maps::NAT_CONFIG6
            .get(0)
            .filter(|c| c.node_addr_be != [0; 4])
            .ok_or((DROP, stat::DROP_NO_NODE_ADDR))?;
        if same_addr(&reply.src_be, &nat.node_addr_be) {
            // As IPv4's (`crate::conntrack::Tuple::masquerade`).
            return match conntrack::reply_taken(reply, key, now) {
                true => Err((DROP, stat::DROP_CT_CLASH)),
                false => Ok(false),
            };
        }
        reply.dst_be = nat.node_addr_be;
        if !conntrack::masquerade_port(reply, self.hash(), key, nat.port_min, nat.port_max, now) {
            return Err((DROP, stat::DROP_SNAT_EXHAUSTED));
        }
        Ok(true)
    }
}

/// Address equality word by word (a derived `==` on arrays may become a `bcmp`
/// call, which BPF does not have).
#[inline(always)]
pub fn same_addr(a: &[u32; 4], b: &[u32; 4]) -> bool {
    a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
}

/// Whether the frame behind an Ethernet header is IPv6 (EtherType 0x86DD).
#[inline(always)]
pub fn is_ipv6(ctx: &TcContext) -> bool {
    crate::packet::load::<[u8; 2]>(ctx, crate::packet::ETH_TYPE_OFF)
        .is_some_and(|t| u16::from_be_bytes(t) == crate::packet::ETH_P_IPV6)
}

/// Hands an IPv6 packet to the IPv6 program in `slot` of `JUMP6`; if there is none
/// (the kernel refused it, or it is not loaded), passes it untouched, counted.
#[inline(always)]
pub fn hand_over(ctx: &TcContext, slot: u32) -> i32 {
    // SAFETY: a tail call with the context's own skb; it returns only if it failed.
    unsafe {
        maps::JUMP6.tail_call(ctx, slot);
    }
    count(stat::PASS_NOT_IPV4);
    PASS
}

/// What the IPv6 body does beyond reading and rewriting its packet, as
/// `crate::tc::Program`: TC hands packets on by tail call (its reject program,
/// `sliceway_sctp_nat`); XDP cannot, so it leaves them to TC, untouched.
pub trait Program6: Frame {
    /// Whether this program finishes every packet itself (TC).
    const TAIL_CALLS: bool;
    /// Answers the packet with ICMPv6 port unreachable (the reject program counts
    /// `reason`); drops it if the handover fails.
    fn reject(&self, reason: u32) -> Exit;
    /// Sets the ports of an SCTP packet whose addresses are translated
    /// (`sliceway_sctp_nat`, shared with IPv4, which counts `reason`); unchanged
    /// ports need no handover.
    fn sctp_ports(&self, flow: &Flow6, sport_be: u16, dport_be: u16, reason: u32) -> Exit;
    /// An ICMPv6 message (its header at `l4_off`): an error about a translated
    /// connection is translated back by a program of its own (`sliceway_icmp6`),
    /// the rest passes untouched there.
    fn icmp(&self, l4_off: usize, ip_end: usize) -> Exit;
    /// Direct server return (`sliceway_dsr6`): with `insert`, adds the header naming
    /// the frontend [`Program6::dsr_frontend`] kept to the translated packet of a
    /// new connection; without, records the connection of a packet that carries one.
    fn dsr(&self, insert: bool) -> Exit;
    /// Keeps the frontend a new connection with direct server return was sent to
    /// (the flow's destination as parsed) for [`Program6::dsr`].
    fn dsr_frontend(&self, flow: &Flow6);
}

impl Program6 for TcContext {
    const TAIL_CALLS: bool = true;

    #[inline(always)]
    fn icmp(&self, l4_off: usize, ip_end: usize) -> Exit {
        icmp::hand_over(self, JUMP6_ICMP, l4_off, ip_end)
    }

    #[inline(always)]
    fn reject(&self, reason: u32) -> Exit {
        reject::port_unreachable(self, reason, JUMP6_REJECT);
        (DROP, stat::DROP_REJECT)
    }

    #[inline(always)]
    fn sctp_ports(&self, flow: &Flow6, sport_be: u16, dport_be: u16, reason: u32) -> Exit {
        if sport_be == flow.sport_be && dport_be == flow.dport_be {
            return (PASS, reason);
        }
        sctp::translate_ports6(self, flow, sport_be, dport_be, reason);
        (DROP, stat::DROP_REWRITE)
    }

    #[inline(always)]
    fn dsr(&self, insert: bool) -> Exit {
        dsr::hand_over(self, insert, Self::L2)
    }

    #[inline(always)]
    fn dsr_frontend(&self, flow: &Flow6) {
        dsr::keep_frontend(self, flow)
    }
}

impl Program6 for L3<'_> {
    const TAIL_CALLS: bool = true;

    #[inline(always)]
    fn icmp(&self, l4_off: usize, ip_end: usize) -> Exit {
        icmp::hand_over(self.0, JUMP6_ICMP_L3, l4_off, ip_end)
    }

    #[inline(always)]
    fn reject(&self, reason: u32) -> Exit {
        reject::port_unreachable(self.0, reason, JUMP6_REJECT_L3);
        (DROP, stat::DROP_REJECT)
    }

    #[inline(always)]
    fn sctp_ports(&self, flow: &Flow6, sport_be: u16, dport_be: u16, reason: u32) -> Exit {
        self.0.sctp_ports(flow, sport_be, dport_be, reason)
    }

    #[inline(always)]
    fn dsr(&self, insert: bool) -> Exit {
        dsr::hand_over(self.0, insert, Self::L2)
    }

    #[inline(always)]
    fn dsr_frontend(&self, flow: &Flow6) {
        dsr::keep_frontend(self.0, flow)
    }
}

/// `sliceway_tc`'s IPv6 program (`JUMP6_TC`).
#[classifier]
pub fn sliceway_tc6(ctx: TcContext) -> i32 {
    run::<false, _>(&ctx)
}

/// `sliceway_tc_ext`'s IPv6 program (`JUMP6_EXT`): new connections from outside
/// meet the external entry first, else are masqueraded to `NAT_CONFIG6` (or, with
/// direct server return, handed to `sliceway_dsr6` once translated). A packet that
/// carries direct server return's header goes to `sliceway_dsr6` first.
#[classifier]
pub fn sliceway_ext6(ctx: TcContext) -> i32 {
    if let Some(verdict) = dsr_accept(&ctx) {
        return verdict;
    }
    run::<true, _>(&ctx)
}

/// `sliceway_l3`'s IPv6 program (`JUMP6_L3`).
#[classifier]
pub fn sliceway_l3_6(ctx: TcContext) -> i32 {
    run::<false, _>(&L3(&ctx))
}

/// `sliceway_l3_ext`'s IPv6 program (`JUMP6_L3_EXT`).
#[classifier]
pub fn sliceway_l3ext6(ctx: TcContext) -> i32 {
    if let Some(verdict) = dsr_accept(&L3(&ctx)) {
        return verdict;
    }
    run::<true, _>(&L3(&ctx))
}

/// `sliceway_tc_out`'s IPv6 program (`JUMP6_OUT`): a reply from a host-network
/// backend of this node gets its frontend back (`crate::tc::sliceway_tc_out`).
#[classifier]
pub fn sliceway_out6(ctx: TcContext) -> i32 {
    out(&ctx)
}

/// `sliceway_l3_out`'s IPv6 program (`JUMP6_L3_OUT`).
#[classifier]
pub fn sliceway_l3out6(ctx: TcContext) -> i32 {
    out(&L3(&ctx))
}

#[inline(always)]
fn out<C: Program6>(ctx: &C) -> i32 {
    let (action, reason) = match reply_out(ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    count(reason);
    action
}

/// The egress body, as IPv4's (`crate::tc`): a reply of a live connection gets its
/// frontend back; a packet to an unallocated ClusterIP is dropped; anything else
/// passes.
#[inline(always)]
fn reply_out<C: Program6>(ctx: &C) -> Result<Exit, Exit> {
    let s = maps::SCRATCH6
        .get_ptr_mut(0)
        .ok_or((PASS, stat::PASS_EGRESS))?;
    // SAFETY: as in `decide`: this CPU's value, used by this program alone while it
    // runs.
    let s = unsafe { &mut *s };
    if !matches!(parse::parse(ctx, &mut s.flow), Ok(parse::Packet6::L4)) {
        return Ok((PASS, stat::PASS_EGRESS));
    }
    s.key = s.flow.key();
    let now = conntrack::now();
    let live = match conntrack::forward(&s.flow, &s.key, now) {
        Forward::Reply(rev) => matches!(
            conntrack::reply_at(&rev, &s.flow, &s.key, now),
            Reply::Live(_)
        ),
        _ => false,
    };
    if !live {
        // No reply: dropped if to an unallocated ClusterIP, as over IPv4.
        if lookup::is_unallocated6(&s.flow) {
            return Ok((DROP, stat::DROP_UNALLOCATED_CLUSTERIP));
        }
        return Ok((PASS, stat::PASS_EGRESS));
    }
    match untracked(ctx, &s.flow, &s.key, now, Met::LiveReply)? {
        (PASS, stat::REVNAT) => Ok((PASS, stat::REVNAT_EGRESS)),
        exit => Ok(exit),
    }
}

/// A connection another node sent here with direct server return, for a pod of
/// this node: handed to `sliceway_dsr6` to be recorded, so the pod's replies leave
/// from the frontend. Checked before the body, as IPv4's (`crate::tc`).
#[inline(always)]
fn dsr_accept<C: Program6>(ctx: &C) -> Option<i32> {
    if !dsr::carries_option(ctx, C::L2) {
        return None;
    }
    let (verdict, reason) = ctx.dsr(false);
    count(reason);
    Some(verdict)
}

#[inline(always)]
fn run<const EXTERNAL: bool, C: Program6>(ctx: &C) -> i32 {
    let (mut action, mut reason) = match decide::<EXTERNAL, C>(ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    if EXTERNAL && reason == stat::DNAT_DSR {
        // The new connection is translated: its header goes on by tail call, out of
        // the body's frame (`sliceway_dsr6` counts it).
        (action, reason) = ctx.dsr(true);
    }
    count(reason);
    action
}

/// The IPv6 body's flow, its conntrack key and the entry it is translated with,
/// kept in a per-CPU map (`SCRATCH6`) rather than on the stack: with 16-byte
/// addresses they would not fit the frame beside conntrack's own copies.
pub struct Scratch6 {
    pub flow: Flow6,
    pub key: CtKey,
    pub entry: CtEntry,
}

/// What to do with the packet, and the `stat` slot that says why.
#[inline(always)]
pub fn decide<const EXTERNAL: bool, C: Program6>(ctx: &C) -> Result<Exit, Exit> {
    let s = maps::SCRATCH6
        .get_ptr_mut(0)
        .ok_or((DROP, stat::DROP_MALFORMED))?;
    // SAFETY: a per-CPU map value, used only by this program on this CPU while it
    // runs (TC and XDP programs are not preempted); no reference outlives the run.
    let s = unsafe { &mut *s };
    if let parse::Packet6::Icmp { l4_off, ip_end } = parse::parse(ctx, &mut s.flow)? {
        // To the ICMPv6 error program (TC), or left to TC untouched (XDP).
        return Ok(ctx.icmp(l4_off, ip_end));
    }
    if !C::TAIL_CALLS && s.flow.proto == PROTO_SCTP {
        // Its ports are set by a tail call, after its addresses: all of it is TC's.
        return Ok((TO_TC, stat::XDP_TO_TC));
    }
    s.key = s.flow.key();
    let now = conntrack::now();
    match connection_or_frontend::<EXTERNAL, C>(ctx, &s.flow, &s.key, &mut s.entry, now)? {
        Claim::Exit(exit) => Ok(exit),
        Claim::Unclaimed(met) => untracked(ctx, &s.flow, &s.key, now, met),
    }
}

/// As `tc::connection_or_frontend`: a tracked connection keeps its backend; a reply of a live
/// connection is left to `untracked`, before any frontend (conntrack before NAT,
/// as in netfilter); a new packet to a frontend picks one and is tracked; then DNAT.
/// [`Claim::Unclaimed`]: neither, or a reply. `entry` is where the connection's
/// entry is kept while the packet is translated (`Scratch6`).
#[inline(always)]
fn connection_or_frontend<const EXTERNAL: bool, C: Program6>(
    ctx: &C,
    flow: &Flow6,
    key: &CtKey,
    entry: &mut CtEntry,
    now: u64,
) -> Result<Claim, Exit> {
    let reason = match conntrack::forward(flow, key, now) {
        Forward::Tracked(tracked) => {
            *entry = tracked;
            if flow.later_fragment {
                stat::NAT_FRAGMENT
            } else {
                stat::DNAT_ESTABLISHED
            }
        }
        new => {
            let met = match new {
                // A reply: `untracked` looks it up again and translates it
                // (translating it here, as `tc::connection_or_frontend` does, would
                // hold the connection's 40-byte key on this frame, near 6.1's limit;
                // not tried).
                Forward::Reply(rev) => match conntrack::reply_at(&rev, flow, key, now) {
                    Reply::Live(_) => return Ok(Claim::Unclaimed(Met::LiveReply)),
                    Reply::None => Met::Nothing,
                    Reply::Stale => Met::Stale,
                },
                _ => Met::Nothing,
            };
            let found = if EXTERNAL {
                lookup::frontend_external6(flow)
            } else {
                maps::service6(&lookup::frontend_key6(flow))
                    .map(|s| (s, lookup::pod_nat6(flow, &s)))
            };
            let Some((service, nat)) = found else {
                return Ok(Claim::Unclaimed(met));
            };
            if flow.later_fragment {
                return Err((DROP, stat::DROP_FRAGMENT_ORPHAN));
            }
            if service.flags & SVC_F_SOURCE_RANGES != 0
                && !maps::source_allowed6(lookup::frontend_key6(flow), flow.src_be)
            {
                return Err((DROP, stat::DROP_SOURCE_RANGE));
            }
            if service.count == 0 {
                if service.flags & SVC_F_DROP_EMPTY != 0 {
                    counters::refused(service.id, true);
                    return Ok(Claim::Exit((DROP, stat::DROP_NO_BACKEND)));
                }
                if !C::TAIL_CALLS {
                    return Ok(Claim::Exit((TO_TC, stat::XDP_TO_TC)));
                }
                counters::refused(service.id, false);
                return Ok(Claim::Exit(ctx.reject(stat::REJECT_NO_BACKEND)));
            }
            // Direct server return's header needs the skb: TC's.
            if nat == conntrack::NAT_DSR {
                if !C::TAIL_CALLS {
                    return Ok(Claim::Exit((TO_TC, stat::XDP_TO_TC)));
                }
                // For the header, added once the packet is translated (`run`).
                ctx.dsr_frontend(flow);
            }
            let picked = lookup::pick6(flow.src_be, flow.hash(), &service, now)?;
            let tracked = conntrack::track(
                flow,
                key,
                service.id,
                picked.backend_id,
                &picked.backend,
                nat,
            )?;
            *entry = maps::conntrack(key).ok_or((DROP, stat::DROP_CONNTRACK))?;
            tracked.reason(nat)
        }
    };
    counters::translated(
        entry.service_id,
        entry.backend_id,
        ctx.wire_len() as u64,
        reason != stat::DNAT_ESTABLISHED && reason != stat::NAT_FRAGMENT,
    );
    let to = &entry.pair;
    rewrite6(ctx, flow, End::Destination, &to.src_be, to.sport_be)
        .map_err(|_| (DROP, stat::DROP_REWRITE))?;
    let ports_here = flow.proto != PROTO_SCTP && !flow.later_fragment;
    if !same_addr(&to.dst_be, &flow.src_be) || (ports_here && to.dport_be != flow.sport_be) {
        rewrite6(ctx, flow, End::Source, &to.dst_be, to.dport_be)
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

/// As `tc::untracked`: a reply of a live connection gets its frontend back as
/// the source; a stale reverse entry's passes; a ClusterIP's undeclared port is
/// rejected; an unallocated address of a ServiceCIDR is dropped; anything else
/// passes.
#[inline(always)]
fn untracked<C: Program6>(
    ctx: &C,
    flow: &Flow6,
    key: &CtKey,
    now: u64,
    met: Met,
) -> Result<Exit, Exit> {
    let reply = match met {
        Met::LiveReply => conntrack::reverse(flow, key, now),
        Met::Stale => Reply::Stale,
        Met::Nothing => Reply::None,
    };
    match reply {
        Reply::Live(orig) => {
            rewrite6(ctx, flow, End::Source, &orig.dst_be, orig.dport_be)
                .map_err(|_| (DROP, stat::DROP_REWRITE))?;
            let ports_here = flow.proto != PROTO_SCTP && !flow.later_fragment;
            if !same_addr(&orig.src_be, &flow.dst_be)
                || (ports_here && orig.sport_be != flow.dport_be)
            {
                rewrite6(ctx, flow, End::Destination, &orig.src_be, orig.sport_be)
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
        Reply::None if flow.later_fragment && lookup::is_clusterip6(flow) => {
            Ok((DROP, stat::DROP_FRAGMENT_ORPHAN))
        }
        Reply::None if flow.later_fragment => Ok((PASS, stat::PASS_FRAGMENT)),
        Reply::None => {
            conntrack::direct(flow, key);
            // A ClusterIP on a port or protocol its Service does not declare:
            // rejected, as kube-proxy's nftables `cluster-ips` set does.
            if lookup::is_clusterip6(flow) {
                if !C::TAIL_CALLS {
                    return Ok((TO_TC, stat::XDP_TO_TC));
                }
                return Ok(ctx.reject(stat::REJECT_NO_PORT));
            }
            // An unallocated address of a ServiceCIDR: dropped, as over IPv4.
            if maps::in_service_cidr6(flow.dst_be) {
                return Ok((DROP, stat::DROP_UNALLOCATED_CLUSTERIP));
            }
            Ok((PASS, stat::PASS_NO_SERVICE))
        }
        Reply::Stale => Ok((PASS, stat::PASS_STALE_CONNTRACK)),
    }
}

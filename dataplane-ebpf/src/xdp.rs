//! The XDP fast path of the node's uplinks (`--xdp`): the uplink TC program's body
//! ([`tc::decide`] with `EXTERNAL`) run on the frame before the kernel makes an skb
//! of it, over the same maps and conntrack. What it cannot finish, it passes on
//! untouched to `sliceway_tc_ext`, which stays attached to the same interface: ICMP
//! errors, SCTP, and packets to reject (those need a tail call to a TC program or the
//! skb), counted `xdp_to_tc`. So a packet gets the same verdict and the same bytes
//! whichever program decides it, and the uplink works the same where XDP cannot
//! attach.
//!
//! IPv6 goes by tail call to `sliceway_xdp6` (`XDP_JUMP6`; an XDP program can reach
//! XDP programs only), which runs `sliceway_ext6`'s body ([`v6::decide`]) the same
//! way, so IPv4's program keeps its frame and verifier cost. It leaves to TC what
//! `sliceway_ext6` hands on by tail call (rejects, SCTP, direct server return's new
//! connections and packets carrying its header) and what it does not translate
//! (ICMPv6, its errors included, and other protocols). Without it (not
//! loaded, or refused by the kernel) the tail call fails and IPv6 goes to TC
//! untouched, as everything IPv6 did before.
//!
//! With `--xdp-forward` (`XDP_FORWARD` holds the ingress interface), a frame the
//! body translated is sent on from here (`forward.rs`: `XDP_TX` or `XDP_REDIRECT`
//! by the kernel's FIB); what forwarding cannot finish passes as below, untouched.
//!
//! A packet the XDP program decided carries a mark in its metadata (4 bytes before
//! the frame, kept in the skb's metadata), the interface's index under a constant, so
//! the TC program passes it at once instead of looking it up again (`decided`). The
//! mark is a shortcut, never needed for a right answer: without it (a driver without
//! metadata support) the TC program finds nothing to do with a translated packet,
//! whose destination is then a backend and whose tuple no conntrack entry keys.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS},
    helpers::bpf_xdp_adjust_meta,
    macros::xdp,
    programs::{TcContext, XdpContext},
};
use dataplane_common::{stat, XDP_JUMP6_EXT};

use crate::{
    counters::{count, Exit},
    forward, maps,
    packet::Flow,
    tc::{self, Program, DROP, PASS, TO_TC},
    v6::{self, Flow6, Program6},
};

/// The mark's constant ("SLWX"); the interface's index is XORed in, so metadata left
/// on an skb that reaches another interface's program never reads as a mark there.
const MARK: u32 = 0x534c_5758;
/// The metadata's length: one `u32` (the kernel wants a multiple of 4, at most 32).
const META_LEN: usize = 4;

#[xdp]
pub fn sliceway_xdp(ctx: XdpContext) -> u32 {
    if crate::packet::load::<[u8; 2]>(&ctx, crate::packet::ETH_TYPE_OFF)
        .is_some_and(|t| u16::from_be_bytes(t) == crate::packet::ETH_P_IPV6)
    {
        // SAFETY: a tail call with the context's own frame; it returns only if it
        // failed (no IPv6 program): then IPv6 is TC's, untouched and unmarked.
        unsafe {
            maps::XDP_JUMP6.tail_call(&ctx, XDP_JUMP6_EXT);
        }
        count(stat::XDP_TO_TC);
        return XDP_PASS;
    }
    if crate::dsr::carries_option(&ctx, <XdpContext as crate::packet::Frame>::L2) {
        // Direct server return's record is made by TC's `sliceway_dsr`.
        count(stat::XDP_TO_TC);
        return XDP_PASS;
    }
    let (verdict, reason) = match tc::decide::<false, true, _>(&ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    count(reason);
    if verdict == PASS && forward::translated(reason) {
        if let Some(sent) = forward(forward::forward4(&ctx)) {
            return sent;
        }
    }
    action(&ctx, verdict)
}

/// `sliceway_xdp`'s IPv6 program (`XDP_JUMP6_EXT`): `sliceway_ext6`'s body on the
/// frame.
#[xdp]
#[inline(always)]
pub fn sliceway_xdp6(ctx: XdpContext) -> u32 {
    if v6::dsr::carries_option(&ctx, <XdpContext as crate::packet::Frame>::L2) {
        // Direct server return's record is made by TC's `sliceway_dsr6`.
        count(stat::XDP_TO_TC);
        return XDP_PASS;
    }
    let (verdict, reason) = match v6::decide::<true, _>(&ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    if reason == stat::PASS_NOT_L4 {
        // ICMPv6 and the rest the body does not translate: TC's, which may have
        // more to do with an ICMPv6 error than pass it.
        count(stat::XDP_TO_TC);
        return XDP_PASS;
    }
    count(reason);
    if verdict == PASS && forward::translated(reason) {
        if let Some(sent) = forward(forward::forward6(&ctx)) {
            return sent;
        }
    }
    action(&ctx, verdict)
}

/// Counts what forwarding did with a translated frame (`forward.rs`); the action if
/// it sent or dropped it, `None` if the frame goes to the stack as without
/// forwarding (then marked as decided, as always).
#[inline(always)]
fn forward(exit: Option<Exit>) -> Option<u32> {
    let (action, reason) = exit?;
    count(reason);
    (action != XDP_PASS as i32).then_some(action as u32)
}

/// XDP's action for the body's verdict: a packet passed is marked as decided.
#[inline(always)]
fn action(ctx: &XdpContext, verdict: i32) -> u32 {
    match verdict {
        PASS => {
            mark(ctx);
            XDP_PASS
        }
        DROP => XDP_DROP,
        // TO_TC: untouched, unmarked.
        _ => XDP_PASS,
    }
}

impl Program for XdpContext {
    const TAIL_CALLS: bool = false;

    #[inline(always)]
    fn icmp_error(
        &self,
        _src: u32,
        _l4_off: usize,
        _ip_end: usize,
        _now: u64,
    ) -> Result<Exit, Exit> {
        Ok((TO_TC, stat::XDP_TO_TC))
    }

    #[inline(always)]
    fn reject(&self, _flow: &Flow, _reason: u32) -> Exit {
        (TO_TC, stat::XDP_TO_TC)
    }

    #[inline(always)]
    fn sctp_ports(&self, _flow: &Flow, _sport_be: u16, _dport_be: u16, _reason: u32) -> Exit {
        // `tc::decide` leaves SCTP to TC before anything is rewritten.
        (TO_TC, stat::XDP_TO_TC)
    }

    #[inline(always)]
    fn dsr(&self, _insert: bool) -> Exit {
        // `tc::decide` leaves both to TC before anything is rewritten.
        (TO_TC, stat::XDP_TO_TC)
    }

    #[inline(always)]
    fn dsr_frontend(&self, _flow: &Flow) {}
}

impl Program6 for XdpContext {
    const TAIL_CALLS: bool = false;

    #[inline(always)]
    fn reject(&self, _reason: u32) -> Exit {
        // `v6::decide` leaves rejects to TC before anything is rewritten.
        (TO_TC, stat::XDP_TO_TC)
    }

    #[inline(always)]
    fn sctp_ports(&self, _flow: &Flow6, _sport_be: u16, _dport_be: u16, _reason: u32) -> Exit {
        // `v6::decide` leaves SCTP to TC before anything is rewritten.
        (TO_TC, stat::XDP_TO_TC)
    }

    #[inline(always)]
    fn icmp(&self, _l4_off: usize, _ip_end: usize) -> Exit {
        // ICMPv6 errors are translated by a TC program (`sliceway_icmp6`); neighbour
        // discovery and the rest pass there too.
        (TO_TC, stat::XDP_TO_TC)
    }

    #[inline(always)]
    fn dsr(&self, _insert: bool) -> Exit {
        // `v6::decide` leaves both to TC before anything is rewritten.
        (TO_TC, stat::XDP_TO_TC)
    }

    #[inline(always)]
    fn dsr_frontend(&self, _flow: &Flow6) {}
}

/// Puts the mark in the frame's metadata; nothing if the driver keeps no metadata.
#[inline(always)]
fn mark(ctx: &XdpContext) {
    // SAFETY: the helper grows the metadata area in front of the frame or fails.
    if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -(META_LEN as i32)) } != 0 {
        return;
    }
    let (meta, data) = (ctx.metadata(), ctx.data());
    // The bounds check on the metadata the verifier needs, right before the write.
    if meta + META_LEN > data {
        return;
    }
    let value = MARK ^ ctx.ingress_ifindex() as u32;
    // SAFETY: `meta..meta + 4` is the metadata area, checked just above.
    unsafe { core::ptr::write_unaligned(meta as *mut u32, value) };
}

/// Whether the XDP program of this skb's interface decided it (its mark is in the
/// skb's metadata).
#[inline(always)]
pub fn decided(ctx: &TcContext) -> bool {
    let skb = ctx.skb.skb;
    // SAFETY: reads of the context's own `__sk_buff`.
    let (meta, ifindex) = unsafe { ((*skb).data_meta as usize, (*skb).ingress_ifindex) };
    let data = ctx.data();
    // The bounds check on the metadata the verifier needs, right before the read.
    if meta + META_LEN > data {
        return false;
    }
    // SAFETY: `meta..meta + 4` lies in the skb's metadata, checked just above.
    let value = unsafe { core::ptr::read_unaligned(meta as *const u32) };
    value == MARK ^ ifindex
}

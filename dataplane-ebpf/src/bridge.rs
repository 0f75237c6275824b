//! `sliceway_bridge`: the TC program while an agent migrates from layout v1. It is
//! `sliceway_tc` (same code, same v2 maps) with three additions, compiled in only here:
//!
//! - a packet from a client whose connection v2 conntrack does not know but v1's does
//!   (made by the v1 program, on this interface or another) first gets that
//!   connection in v2 conntrack, with its v1 backend (and this agent's ids of its
//!   frontend and backend), and then goes on as tracked;
//! - likewise a reply whose v1 reverse and forward entries name each other;
//! - a new connection also gets a v1 reverse entry, so its replies are translated on
//!   an interface where the v1 program still runs.
//!
//! Why: links are switched one interface at a time, and a connection's packets enter
//! on two interfaces (the client's and the backend's). While some run the v1 program
//! and others the v2 one, a connection made on one side must be known on the other,
//! or its replies pass untranslated and the client resets it. This is the failure of a
//! one-time copy of a conntrack map that the datapath itself keeps writing (Cilium's
//! cilium/cilium#28894, https://github.com/cilium/cilium/issues/28894: its one-time
//! migration at agent start interrupts traffic, and does not fit datapath-written
//! maps). The agent switches every v1
//! link to this program, copies what v1 conntrack still holds, then switches every
//! link to `sliceway_tc`; see the agent's `kernel/migrate.rs`.

use aya_ebpf::{macros::classifier, programs::TcContext};
use dataplane_common::{
    v1::{self, FlowKey, NatTarget},
    CtEntry, CtKey, ServiceKey, CT_FORWARD, CT_REVERSE, FAMILY_V4,
};

use crate::{
    conntrack::same,
    maps::{self, ADOPTION, CONNTRACK, CT_V1},
    packet::Flow,
    tc,
};

#[classifier]
pub fn sliceway_bridge(ctx: TcContext) -> i32 {
    tc::run::<true, false, _>(&ctx)
}

/// What the bridge builds for one packet, kept in a per-CPU map rather than on the
/// stack: `sliceway_tc`'s frame is close to the 512-byte limit, and Linux 6.1 counts a
/// called function's frame (`memset`) on top of it; a bridge with 504 bytes of stack
/// was refused there. Fields are written one by one, so no copy of them is built on
/// the stack first.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Adoption {
    fwd_key: CtKey,
    reply: CtKey,
    entry: CtEntry,
    v1_key: FlowKey,
    v1_target: NatTarget,
    frontend: ServiceKey,
}

/// This CPU's scratch space.
#[inline(always)]
fn scratch() -> Option<&'static mut Adoption> {
    let p = ADOPTION.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU map; a program runs to its end on one
    // CPU, and each use below starts by writing what it reads.
    Some(unsafe { &mut *p })
}

/// Sets `k` to an IPv4 tuple, field by field.
#[inline(always)]
fn set_v4(k: &mut CtKey, src_be: u32, dst_be: u32, sport_be: u16, dport_be: u16, proto: u8) {
    k.src_be = [src_be, 0, 0, 0];
    k.dst_be = [dst_be, 0, 0, 0];
    k.sport_be = sport_be;
    k.dport_be = dport_be;
    k.proto = proto;
    k.family = FAMILY_V4;
    k._pad = [0; 2];
}

/// Sets `k` to a v1 key, field by field.
#[inline(always)]
fn set_v1(k: &mut FlowKey, src_be: u32, dst_be: u32, sport_be: u16, dport_be: u16, proto: u8) {
    k.src_be = src_be;
    k.dst_be = dst_be;
    k.sport_be = sport_be;
    k.dport_be = dport_be;
    k.proto = proto;
    k._pad = [0; 3];
}

/// Copies v1's entry at `a.v1_key` into `a.v1_target`; whether there is one.
// Keys and values are passed by reference into the scratch map on purpose: by value
// they would be copied onto the stack this module keeps them off.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn load_v1(a: &mut Adoption) -> bool {
    // SAFETY: plain data, copied out at once.
    match unsafe { CT_V1.get(&a.v1_key) } {
        Some(t) => {
            a.v1_target = *t;
            true
        }
        None => false,
    }
}

/// The scratch space with its v1 key set to `flow`'s tuple.
#[inline(always)]
fn scratch_for(flow: &Flow) -> Option<&'static mut Adoption> {
    let a = scratch()?;
    set_v1(
        &mut a.v1_key,
        flow.src_be,
        flow.dst_be,
        flow.sport_be,
        flow.dport_be,
        flow.proto,
    );
    Some(a)
}

/// A packet from a client that v2 conntrack does not track: adopts its v1
/// connection, if there is one. Returns whether it did.
#[inline(always)]
pub fn adopt_forward(flow: &Flow, now: u64) -> bool {
    // A SYN starts a new connection on its tuple in either layout.
    if flow.syn_only {
        return false;
    }
    let Some(a) = scratch_for(flow) else {
        return false;
    };
    adopt(a, now)
}

/// A packet that may be a reply (backend → client) that v2 conntrack does not know:
/// adopts its v1 connection if its reverse and forward entries name each other.
#[inline(always)]
pub fn adopt_reply(flow: &Flow, now: u64) -> bool {
    let Some(a) = scratch_for(flow) else {
        return false;
    };
    if !load_v1(a) || a.v1_target.dir != v1::CT_REVERSE {
        return false;
    }
    // The forward key: client → the frontend the reverse entry names.
    let (frontend_be, frontend_port_be) = (a.v1_target.addr_be, a.v1_target.port_be);
    set_v1(
        &mut a.v1_key,
        flow.dst_be,
        frontend_be,
        flow.dport_be,
        frontend_port_be,
        flow.proto,
    );
    if !load_v1(a)
        || a.v1_target.dir != v1::CT_FORWARD
        || a.v1_target.addr_be != flow.src_be
        || a.v1_target.port_be != flow.sport_be
    {
        return false;
    }
    adopt(a, now)
}

/// Writes the v2 pair of the v1 connection whose forward key is `a.v1_key`, unless
/// v2 has a connection on the tuple or its reply tuple belongs to another one.
/// Returns whether it did.
// Keys and values are passed by reference into the scratch map on purpose: by value
// they would be copied onto the stack this module keeps them off.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn adopt(a: &mut Adoption, now: u64) -> bool {
    if !load_v1(a) || a.v1_target.dir != v1::CT_FORWARD {
        return false;
    }
    set_v4(
        &mut a.fwd_key,
        a.v1_key.src_be,
        a.v1_key.dst_be,
        a.v1_key.sport_be,
        a.v1_key.dport_be,
        a.v1_key.proto,
    );
    // A v2 connection on the tuple is newer than anything v1 holds (alive or not:
    // the check of its age does not fit the stack).
    if maps::with_conntrack(&a.fwd_key, |e| e.dir == CT_FORWARD) == Some(true) {
        return false;
    }
    // v1 never remapped a client's port.
    set_v4(
        &mut a.reply,
        a.v1_target.addr_be,
        a.v1_key.src_be,
        a.v1_target.port_be,
        a.v1_key.sport_be,
        a.v1_key.proto,
    );
    if maps::with_conntrack(&a.reply, |r| !same(&r.pair, &a.fwd_key)) == Some(true) {
        return false;
    }
    a.frontend.addr_be = a.v1_key.dst_be;
    a.frontend.port_be = a.v1_key.dport_be;
    a.frontend.proto = a.v1_key.proto;
    a.frontend.scope = dataplane_common::SCOPE_ANY;
    let (state, flags) = v1::adopted_state(a.v1_key.proto);
    let e = &mut a.entry;
    e.pair = a.fwd_key;
    e.last_seen_ns = now;
    // This agent's id of the frontend (the per-frontend counters' key), if it still
    // has it.
    e.service_id = maps::service(&a.frontend).map_or(v1::UNKNOWN_ID, |s| s.id);
    // This agent's id of the v1 backend, which the agent wrote before switching any
    // link: a UDP flow keeps its backend while that id holds it.
    e.backend_id = maps::backend_id_of_v1(a.v1_target.backend_id).unwrap_or(v1::UNKNOWN_ID);
    e.dir = CT_REVERSE;
    e.state = state;
    e.flags = flags;
    e._pad = [0; 5];
    // Reverse first, as for a new connection.
    if CONNTRACK.insert(&a.reply, &a.entry, 0).is_err() {
        return false;
    }
    a.entry.pair = a.reply;
    a.entry.dir = CT_FORWARD;
    CONNTRACK.insert(&a.fwd_key, &a.entry, 0).is_ok()
}

/// A connection just made in v2 (`entry` is its forward entry): its v1 reverse entry,
/// so that an interface still running the v1 program translates its replies. (v1
/// cannot give back a remapped client port; v1 had no remapping and would have
/// mixed up such connections anyway.)
// Keys and values are passed by reference into the scratch map on purpose: by value
// they would be copied onto the stack this module keeps them off.
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
pub fn mirror(flow: &Flow, entry: &CtEntry) {
    let Some(a) = scratch() else {
        return;
    };
    let reply: &CtKey = &entry.pair;
    set_v1(
        &mut a.v1_key,
        reply.src_be[0],
        reply.dst_be[0],
        reply.sport_be,
        reply.dport_be,
        reply.proto,
    );
    let t = &mut a.v1_target;
    t.addr_be = flow.dst_be;
    t.port_be = flow.dport_be;
    t.dir = v1::CT_REVERSE;
    t.service_id = 0;
    t.backend_id = 0;
    let _ = CT_V1.insert(&a.v1_key, &a.v1_target, 0);
}

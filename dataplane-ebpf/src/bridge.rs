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
    CtEntry, CtKey, ServiceKey, CT_FORWARD, CT_REVERSE,
};

use crate::{
    conntrack::same,
    maps::{self, CONNTRACK, CT_V1},
    packet::Flow,
    tc,
};

#[classifier]
pub fn sliceway_bridge(ctx: TcContext) -> i32 {
    tc::run::<true>(&ctx)
}

/// The v1 key of a packet as it arrives.
#[inline(always)]
fn v1_key(flow: &Flow) -> FlowKey {
    FlowKey {
        src_be: flow.src_be,
        dst_be: flow.dst_be,
        sport_be: flow.sport_be,
        dport_be: flow.dport_be,
        proto: flow.proto,
        _pad: [0; 3],
    }
}

#[inline(always)]
fn v1_entry(key: &FlowKey) -> Option<NatTarget> {
    // SAFETY: plain data, copied out at once.
    unsafe { CT_V1.get(key).copied() }
}

/// A packet from a client that v2 conntrack does not track: adopts its v1
/// connection, if there is one. Returns whether it did.
#[inline(always)]
pub fn adopt_forward(flow: &Flow, now: u64) -> bool {
    // A SYN starts a new connection on its tuple in either layout.
    !flow.syn_only && adopt(&v1_key(flow), now)
}

/// A packet that may be a reply (backend → client) that v2 conntrack does not know:
/// adopts its v1 connection if its reverse and forward entries name each other.
#[inline(always)]
pub fn adopt_reply(flow: &Flow, now: u64) -> bool {
    let key = v1_key(flow);
    let Some(rev) = v1_entry(&key) else {
        return false;
    };
    if rev.dir != v1::CT_REVERSE {
        return false;
    }
    let fwd = FlowKey {
        src_be: key.dst_be,
        dst_be: rev.addr_be,
        sport_be: key.dport_be,
        dport_be: rev.port_be,
        proto: key.proto,
        _pad: [0; 3],
    };
    match v1_entry(&fwd) {
        Some(f)
            if f.dir == v1::CT_FORWARD && f.addr_be == key.src_be && f.port_be == key.sport_be => {}
        _ => return false,
    }
    adopt(&fwd, now)
}

/// Writes the v2 pair of the v1 connection whose forward entry is at `key`, unless
/// its reply tuple belongs to another v2 connection. Returns whether it did.
#[inline(always)]
fn adopt(key: &FlowKey, now: u64) -> bool {
    let Some(target) = v1_entry(key) else {
        return false;
    };
    if target.dir != v1::CT_FORWARD {
        return false;
    }
    let fwd_key = key.to_v2();
    // A v2 connection on the tuple is newer than anything v1 holds (alive or not:
    // the check of its age does not fit the stack).
    if maps::with_conntrack(&fwd_key, |e| e.dir == CT_FORWARD) == Some(true) {
        return false;
    }
    let reply = v1::reply_key(key, &target);
    if maps::with_conntrack(&reply, |r| !same(&r.pair, &fwd_key)) == Some(true) {
        return false;
    }
    let (state, flags) = v1::adopted_state(key.proto);
    // One entry, made the reverse and then the forward one (the stack is tight).
    let mut entry = CtEntry {
        pair: fwd_key,
        last_seen_ns: now,
        // This agent's id of the frontend (the per-frontend counters' key), if it
        // still has it.
        service_id: maps::service(&ServiceKey {
            addr_be: key.dst_be,
            port_be: key.dport_be,
            proto: key.proto,
            _pad: 0,
        })
        .map_or(v1::UNKNOWN_ID, |s| s.id),
        // This agent's id of the v1 backend, which the agent wrote before switching
        // any link: a UDP flow keeps its backend while that id holds it.
        backend_id: maps::backend_id_of_v1(target.backend_id).unwrap_or(v1::UNKNOWN_ID),
        dir: CT_REVERSE,
        state,
        flags,
        _pad: [0; 5],
    };
    // Reverse first, as for a new connection.
    if CONNTRACK.insert(reply, entry, 0).is_err() {
        return false;
    }
    entry.pair = reply;
    entry.dir = CT_FORWARD;
    CONNTRACK.insert(fwd_key, entry, 0).is_ok()
}

/// A connection just made in v2 (`entry` is its forward entry): its v1 reverse entry,
/// so that an interface still running the v1 program translates its replies. (v1
/// cannot give back a remapped client port; v1 had no remapping and would have
/// mixed up such connections anyway.)
#[inline(always)]
pub fn mirror(flow: &Flow, entry: &CtEntry) {
    let reply: &CtKey = &entry.pair;
    let key = FlowKey {
        src_be: reply.src_be[0],
        dst_be: reply.dst_be[0],
        sport_be: reply.sport_be,
        dport_be: reply.dport_be,
        proto: reply.proto,
        _pad: [0; 3],
    };
    let target = NatTarget {
        addr_be: flow.dst_be,
        port_be: flow.dport_be,
        dir: v1::CT_REVERSE,
        service_id: 0,
        backend_id: 0,
    };
    let _ = CT_V1.insert(key, target, 0);
}

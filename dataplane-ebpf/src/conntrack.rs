//! Connection tracking. A connection has two paired entries (see `CtEntry`): the
//! forward one (client → frontend) holds the protocol state and the last time a
//! packet was seen in either direction; the reverse one (backend → client) names its
//! forward entry. Every packet looks up both, so LRU recency keeps them together;
//! a reply is translated only if its forward entry is alive and names it back.
//!
//! The state follows the TCP flags seen in both directions, as netfilter's TCP
//! tracker does in outline (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_proto_tcp.c):
//! SYN_SENT until the backend answers, ESTABLISHED, FIN_WAIT after one FIN,
//! TIME_WAIT after FINs both ways, CLOSE after an RST; each state with its own idle
//! timeout (`ct::DEFAULTS`, overridable in `CT_TIMEOUTS`).

use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns};
use dataplane_common::{
    ct::{self, flag, state},
    stat, Backend, CtEntry, CtKey, CT_FORWARD, CT_REVERSE, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};

use crate::{
    counters::Exit,
    maps::{self, CtSlot, CONNTRACK},
    packet::{tcp, Flow},
    tc::DROP,
};

/// How many source ports a new connection tries when its reply tuple is taken.
const REMAP_TRIES: u32 = 8;
/// Remapped source ports stay out of the privileged range, as netfilter's do for
/// ports above it.
const REMAP_PORT_MIN: u32 = 1024;

/// What conntrack reads of a packet, for either family ([`Flow`] for IPv4,
/// `crate::v6::Flow6` for IPv6): one code for both, monomorphized, so IPv4's
/// program is what it was.
pub trait Tuple {
    /// The backend a new connection is given (`Backend` or `Backend6`).
    type Backend;
    fn proto(&self) -> u8;
    fn syn_only(&self) -> bool;
    fn tcp_flags(&self) -> u8;
    /// The flow's hash (port remap and masquerade candidates).
    fn hash(&self) -> u32;
    /// The reply tuple of a new connection to `backend`, before any source
    /// translation. A pod picked as the backend of its own connection sees it come
    /// from the hairpin address, never from itself.
    fn reply_key(&self, backend: &Self::Backend) -> CtKey;
    /// Whether backend id `entry.backend_id` still holds the backend `entry` names.
    fn backend_holds(entry: &CtEntry) -> bool;
    /// Puts the node's address as the client of `reply` and gives it a free source
    /// port of the masquerade range ([`masquerade_port`]); true if it did. A backend
    /// at the node's own address (in the host network of this node) is not
    /// masqueraded: the packet is delivered to the node's stack, where netfilter's
    /// masquerade, at `POSTROUTING`, never meets it either, and a source that is
    /// the node's own address would be a martian there. Its replies leave through
    /// the egress program (`crate::tc::sliceway_tc_out`). Its reply tuple taken by a
    /// live connection drops it (`DROP_CT_CLASH`).
    fn masquerade(&self, reply: &mut CtKey, key: &CtKey, now: u64) -> Result<bool, Exit>;
}

impl Tuple for Flow {
    type Backend = Backend;

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
        Flow::hash(self)
    }

    #[inline(always)]
    fn reply_key(&self, backend: &Backend) -> CtKey {
        CtKey::v4(
            backend.addr_be,
            dataplane_common::reply_client(self.src_be, backend.addr_be),
            backend.port_be,
            self.sport_be,
            self.proto,
        )
    }

    #[inline(always)]
    fn backend_holds(entry: &CtEntry) -> bool {
        matches!(maps::backend(entry.backend_id),
            Some(b) if b.addr_be == entry.pair.src_be[0] && b.port_be == entry.pair.sport_be)
    }

    #[inline(always)]
    fn masquerade(&self, reply: &mut CtKey, key: &CtKey, now: u64) -> Result<bool, Exit> {
        // Read in place: a copy would cost stack the uplink program lacks.
        let nat = maps::NAT_CONFIG
            .get(0)
            .filter(|c| c.node_addr_be != 0)
            .ok_or((DROP, stat::DROP_NO_NODE_ADDR))?;
        if reply.src_be[0] == nat.node_addr_be {
            // The client's own tuple, unless a live connection holds it (no port
            // remap here: see `track_inner`).
            return match reply_taken(reply, key, now) {
                true => Err((DROP, stat::DROP_CT_CLASH)),
                false => Ok(false),
            };
        }
        reply.dst_be[0] = nat.node_addr_be;
        if !masquerade_port(reply, self.hash(), key, nat.port_min, nat.port_max, now) {
            return Err((DROP, stat::DROP_SNAT_EXHAUSTED));
        }
        Ok(true)
    }
}

/// The current time for conntrack, session affinity and fragments:
/// CLOCK_MONOTONIC_COARSE (`bpf_ktime_get_coarse_ns`), the clock the agent's sweeper
/// reads (CLOCK_MONOTONIC) at the resolution of the kernel's tick (1 to 10 ms; every
/// timeout here is whole seconds), never ahead of it.
///
/// Read once per tick and CPU: the value is kept in `CLOCK` with the tick's
/// `jiffies`, which the kernel's JIT reads inline (`bpf_jiffies64`, no call); a packet
/// of the same tick takes the kept value. On this project's test machine a call to
/// the clock helper took about 15 ns, a sixth of an established packet's time through
/// the XDP program, most of it the call itself. A tick read between the jiffy's
/// increase and the clock's may keep the tick before's time for that tick: the time
/// is then one tick late, never early. Linux 5.11 and later (the coarse helper).
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: a helper without arguments or side effects.
    let jiffies = unsafe { bpf_jiffies64() };
    let Some(kept) = maps::CLOCK.get_ptr_mut(0) else {
        // SAFETY: as above.
        return unsafe { bpf_ktime_get_coarse_ns() };
    };
    // SAFETY: this CPU's slot of a per-CPU array; plain loads and stores (a program
    // interleaved on this CPU can at worst keep a time one tick late).
    unsafe {
        if (*kept).jiffies == jiffies && (*kept).ns != 0 {
            return (*kept).ns;
        }
        let ns = bpf_ktime_get_coarse_ns();
        (*kept).jiffies = jiffies;
        (*kept).ns = ns;
        ns
    }
}

/// The conntrack key of a packet as it arrives.
#[inline(always)]
pub fn key_of(flow: &Flow) -> CtKey {
    CtKey::v4(
        flow.src_be,
        flow.dst_be,
        flow.sport_be,
        flow.dport_be,
        flow.proto,
    )
}

/// Whether `entry` is alive at `now`.
#[inline(always)]
fn alive(entry: &CtEntry, now: u64) -> bool {
    ct::alive(entry.last_seen_ns, now, maps::timeout(entry.state))
}

/// Who sent a packet of a connection, for [`next_state`].
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Sender {
    /// The client: the packet goes the way the connection was opened.
    Client,
    /// The backend: a reply.
    Backend,
}

/// The state a connection is in after `sender` sent a packet with `tcp_flags` (TCP
/// flags, zero for other protocols); and the flags seen.
#[inline(always)]
fn next_state(proto: u8, seen: u8, tcp_flags: u8, sender: Sender) -> (u8, u8) {
    let mut seen = seen;
    if sender == Sender::Backend {
        seen |= flag::REPLIED;
    }
    if proto == PROTO_SCTP {
        if tcp_flags & tcp::FLAG_RST != 0 {
            seen |= flag::RST;
        }
        let s = if seen & flag::RST != 0 {
            state::SCTP_CLOSED
        } else if seen & flag::REPLIED != 0 {
            state::SCTP_ESTABLISHED
        } else {
            state::SCTP_UNREPLIED
        };
        return (s, seen);
    }
    if proto != PROTO_TCP {
        let s = if proto != PROTO_UDP {
            state::OTHER
        } else if seen & flag::REPLIED != 0 {
            state::UDP_REPLIED
        } else {
            state::UDP_UNREPLIED
        };
        return (s, seen);
    }
    if tcp_flags & tcp::FLAG_RST != 0 {
        seen |= flag::RST;
    }
    if tcp_flags & tcp::FLAG_FIN != 0 {
        seen |= if sender == Sender::Client {
            flag::FIN_ORIG
        } else {
            flag::FIN_REPLY
        };
    }
    let s = if seen & flag::RST != 0 {
        state::TCP_CLOSE
    } else if seen & (flag::FIN_ORIG | flag::FIN_REPLY) == flag::FIN_ORIG | flag::FIN_REPLY {
        state::TCP_TIME_WAIT
    } else if seen & (flag::FIN_ORIG | flag::FIN_REPLY) != 0 {
        state::TCP_FIN_WAIT
    } else if seen & flag::REPLIED != 0 {
        state::TCP_ESTABLISHED
    } else {
        state::TCP_SYN_SENT
    };
    (s, seen)
}

/// A forward packet also looks up its connection's reverse entry, to keep it recent
/// in the LRU, when its time and the connection's last packet's fall in different
/// windows of 2^30 ns (about a second): about once a second while packets flow, and
/// the first packet after a pause. A second is far shorter than the time a full map
/// takes to turn over even at tens of thousands of new connections a second.
const LRU_REFRESH_SHIFT: u32 = 30;

/// What a tracked forward packet is to do.
pub enum Forward {
    /// Not tracked (or the entry is dead, or the packet starts a new connection on
    /// the tuple): pick a backend, if the destination is a frontend. Nor is it a
    /// reply: no reverse entry at its key, so [`reverse`] would find none.
    New,
    /// A reverse entry is at the key: the packet is its connection's reply if that
    /// connection lives ([`reply_at`]), else `New` (the entry is stale).
    Reply(CtSlot),
    /// Translate with this entry: destination to `pair.src:pair.sport`, source port
    /// to `pair.dport`.
    Tracked(CtEntry),
}

/// Looks up a packet from a client. A live entry keeps its backend through endpoint
/// churn and Service deletion, except: a TCP SYN without ACK starts a new connection
/// on its tuple (a retransmitted SYN picks again, which lands on the same backend
/// while the slots are unchanged; the benchmark times the new-connection path this
/// way), and a UDP flow whose backend
/// is gone moves on (kube-proxy clears UDP conntrack of removed endpoints:
/// https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/conntrack/cleanup.go).
#[inline(always)]
pub fn forward<F: Tuple>(flow: &F, key: &CtKey, now: u64) -> Forward {
    // One lookup serves the read and the update in place below.
    let Some(slot) = maps::conntrack_slot(key) else {
        return Forward::New;
    };
    if slot.with(|e| e.dir == CT_REVERSE) {
        return Forward::Reply(slot);
    }
    let entry = slot.get();
    // A forward entry at the key: never a reply's.
    if entry.dir != CT_FORWARD || !alive(&entry, now) || flow.syn_only() {
        return Forward::New;
    }
    if flow.proto() == PROTO_UDP && !F::backend_holds(&entry) {
        return Forward::New;
    }
    let (s, seen) = next_state(flow.proto(), entry.flags, flow.tcp_flags(), Sender::Client);
    slot.touch(s, seen, now);
    // Refresh the reverse entry's LRU recency with the forward one (a lookup sets
    // its referenced bit), about once a second (`LRU_REFRESH_SHIFT`): the LRU clears
    // the bit only when it rotates its lists, and an entry referenced once in a while
    // stays as well as one referenced by every packet. Replies look it up anyway;
    // this keeps the replies of a connection that sends one way only.
    if now >> LRU_REFRESH_SHIFT != entry.last_seen_ns >> LRU_REFRESH_SHIFT {
        maps::mark_conntrack_used(&entry.pair);
    }
    Forward::Tracked(entry)
}

/// What [`reverse`] found of a packet that may come from a backend.
pub enum Reply {
    /// No reverse entry at the packet's key: it is no reply.
    None,
    /// The reply of a live connection, whose forward entry is at this key: the
    /// reply gets that connection's frontend back as its source.
    Live(CtKey),
    /// A reverse entry whose connection is gone (dead, or its forward entry no longer
    /// names it): removed now.
    Stale,
}

/// Looks up a packet that may come from a backend: the reply of a live connection,
/// none, or a stale reverse entry (removed).
#[inline(always)]
pub fn reverse<F: Tuple>(flow: &F, key: &CtKey, now: u64) -> Reply {
    match maps::conntrack_slot(key) {
        Some(rev) => reply_at(&rev, flow, key, now),
        None => Reply::None,
    }
}

/// [`reverse`] with the entry at `key` already looked up (`rev`, from [`forward`]).
#[inline(always)]
pub fn reply_at<F: Tuple>(rev: &CtSlot, flow: &F, key: &CtKey, now: u64) -> Reply {
    let Some(fwd_key) = rev.with(|rev| (rev.dir == CT_REVERSE).then_some(rev.pair)) else {
        return Reply::None;
    };
    // One lookup of the forward entry serves the check and the update in place.
    let slot = maps::conntrack_slot(&fwd_key);
    let fwd_flags = slot.as_ref().and_then(|slot| {
        slot.with(|f| {
            (f.dir == CT_FORWARD && same(&f.pair, key) && alive(f, now)).then_some(f.flags)
        })
    });
    let (Some(slot), Some(fwd_flags)) = (slot, fwd_flags) else {
        let _ = CONNTRACK.remove(key);
        return Reply::Stale;
    };
    let (s, seen) = next_state(flow.proto(), fwd_flags, flow.tcp_flags(), Sender::Backend);
    slot.touch(s, seen, now);
    Reply::Live(fwd_key)
}

/// The forward key of the live connection whose reverse key is `reply`, for packets
/// related to it (ICMP errors); no state changes.
#[inline(always)]
pub fn related(reply: &CtKey, now: u64) -> Option<CtKey> {
    let fwd_key = maps::with_conntrack(reply, |rev| (rev.dir == CT_REVERSE).then_some(rev.pair))??;
    let live = maps::with_conntrack(&fwd_key, |f| {
        f.dir == CT_FORWARD && same(&f.pair, reply) && alive(f, now)
    })?;
    live.then_some(fwd_key)
}

/// A TCP SYN or SCTP INIT sent straight to a pod (no frontend) on a tuple whose replies a Service
/// connection's reverse entry would catch: once that connection is closing or closed,
/// its entries go, so the new direct connection is never rewritten.
#[inline(always)]
pub fn direct<F: Tuple>(flow: &F, key: &CtKey) {
    if !flow.syn_only() {
        return;
    }
    let reply = key.reversed();
    let Some(Some(fwd_key)) =
        maps::with_conntrack(&reply, |rev| (rev.dir == CT_REVERSE).then_some(rev.pair))
    else {
        return;
    };
    let live = maps::with_conntrack(&fwd_key, |f| {
        same(&f.pair, &reply)
            && (f.state == state::TCP_SYN_SENT
                || f.state == state::TCP_ESTABLISHED
                || f.state == state::SCTP_UNREPLIED
                || f.state == state::SCTP_ESTABLISHED)
    });
    if live != Some(true) {
        let _ = CONNTRACK.remove(reply);
        let names_it = maps::with_conntrack(&fwd_key, |f| same(&f.pair, &reply));
        if names_it == Some(true) {
            let _ = CONNTRACK.remove(fwd_key);
        }
    }
}

/// Records a new connection to `backend`: [`Tracked::Kept`], or
/// [`Tracked::Remapped`] if a live connection holds the reply tuple (two frontends
/// sharing a backend, one client port) and the new connection got another source
/// port, as netfilter's NAT does on a tuple clash (`get_unique_tuple`,
/// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_core.c);
/// otherwise the drop and its `stat` reason. The forward entry is then in the map
/// at `key`.
///
/// With `NAT_MASQUERADE` (a client outside the node, kube-proxy's masquerade), the
/// backend sees the connection come from the node's address and a source port
/// from the range of `NAT_CONFIG`: [`Tracked::Masqueraded`], or `DROP_SNAT_EXHAUSTED`
/// when none of [`SNAT_TRIES`] candidates is free, `DROP_NO_NODE_ADDR` when the
/// agent wrote no address.
///
/// With direct server return (`crate::dsr`) the backend's replies never come back
/// through this node, so a remapped source port could not be given back to the
/// client: a clash drops (`DROP_CT_CLASH`) instead.
#[inline(always)]
pub fn track<F: Tuple>(
    flow: &F,
    key: &CtKey,
    service_id: u32,
    backend_id: u32,
    backend: &F::Backend,
    nat: u8,
) -> Result<Tracked, Exit> {
    let now = now();
    // Checked here, before the body, whose frame has no room for one more value.
    if nat == NAT_DSR && reply_taken(&flow.reply_key(backend), key, now) {
        return Err((DROP, stat::DROP_CT_CLASH));
    }
    track_inner(flow, key, service_id, backend_id, backend, nat, now)
}

/// How [`track`] translates the client: its address kept (a port remapped on a
/// clash), masqueraded to the node's address, or kept with direct server return.
pub const NAT_KEEP: u8 = 0;
pub const NAT_MASQUERADE: u8 = 1;
pub const NAT_DSR: u8 = 2;

/// How [`track`] recorded a new connection: the client as the backend sees it.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Tracked {
    /// The client's own address and port (or, with direct server return, the
    /// client's as it sent them).
    Kept,
    /// The client's address, another source port: a live connection held the reply
    /// tuple.
    Remapped,
    /// The node's address and a port of the masquerade range.
    Masqueraded,
}

impl Tracked {
    /// The `stat` reason the connection's first packet is counted under; `nat` as
    /// given to [`track`].
    #[inline(always)]
    pub fn reason(self, nat: u8) -> u32 {
        match self {
            Tracked::Kept if nat == NAT_DSR => stat::DNAT_DSR,
            Tracked::Kept => stat::DNAT_NEW,
            Tracked::Remapped => stat::DNAT_PORT_REMAPPED,
            Tracked::Masqueraded => stat::DNAT_MASQUERADED,
        }
    }
}

/// How many source ports a masqueraded connection tries. Candidates are spread over
/// the range from the flow's hash (a retransmitted first packet finds its own port
/// again), so with the range half taken one connection in 2^16 is dropped; with it
/// full, all are (`drop_snat_exhausted`), never rewritten onto a taken tuple.
pub const SNAT_TRIES: u32 = 16;
/// The step between candidates: odd and large, so the tries spread over any range.
const SNAT_STEP: u32 = 0x9e37_79b1;

/// Gives `reply` (from the backend, to the node's address) a source port of `nat`'s
/// range that no live connection holds; false if the tries found none.
#[inline(always)]
pub fn masquerade_port(
    reply: &mut CtKey,
    start: u32,
    key: &CtKey,
    port_min: u16,
    port_max: u16,
    now: u64,
) -> bool {
    let min = port_min as u32;
    let max = port_max as u32;
    let span = if max >= min { max - min + 1 } else { 1 };
    for i in 0..SNAT_TRIES {
        reply.dport_be =
            ((min + start.wrapping_add(i.wrapping_mul(SNAT_STEP)) % span) as u16).to_be();
        if !reply_taken(reply, key, now) {
            return true;
        }
    }
    false
}

#[inline(always)]
fn track_inner<F: Tuple>(
    flow: &F,
    key: &CtKey,
    service_id: u32,
    backend_id: u32,
    backend: &F::Backend,
    nat: u8,
    now: u64,
) -> Result<Tracked, Exit> {
    // The previous connection on this tuple, if any: its reverse entry goes unless it
    // is the one this connection will use.
    let previous = maps::with_conntrack(key, |e| (e.dir == CT_FORWARD).then_some(e.pair)).flatten();
    let mut reply = flow.reply_key(backend);
    let mut how = Tracked::Kept;
    if nat == NAT_KEEP && flow.proto() == PROTO_TCP && flow.syn_only() {
        release_closing(&reply, key, now);
    }
    if nat == NAT_MASQUERADE {
        // Not in the condition below: the remap loop reached from this branch too
        // took Debian 6.1's verifier past its million instructions (the uplink
        // program without an Ethernet header).
        if flow.masquerade(&mut reply, key, now)? {
            how = Tracked::Masqueraded;
        }
    } else if reply_taken(&reply, key, now) {
        let hash = flow.hash();
        let span = 65_536 - REMAP_PORT_MIN;
        let mut found = false;
        for i in 0..REMAP_TRIES {
            let port = (REMAP_PORT_MIN + hash.wrapping_add(i.wrapping_mul(7919)) % span) as u16;
            // The candidate is `reply` itself, changed in place (a second key would
            // not fit the uplink programs' frames on older verifiers); a connection
            // that finds none is dropped, so the last candidate left in it is unused.
            reply.dport_be = port.to_be();
            if !reply_taken(&reply, key, now) {
                found = true;
                break;
            }
        }
        if !found {
            return Err((DROP, stat::DROP_CT_CLASH));
        }
        how = Tracked::Remapped;
    }
    let (s, seen) = next_state(flow.proto(), 0, flow.tcp_flags(), Sender::Client);
    // One entry on the stack, written as the reverse and then turned into the
    // forward: the uplink programs' frames have no room for two on older verifiers.
    let mut entry = CtEntry {
        pair: *key,
        last_seen_ns: now,
        service_id,
        backend_id,
        dir: CT_REVERSE,
        state: s,
        flags: seen,
        _pad: [0; 5],
    };
    // Reverse first: a reply can only exist once the forward packet went out.
    CONNTRACK
        .insert(reply, entry, 0)
        .map_err(|_| (DROP, stat::DROP_CONNTRACK))?;
    entry.pair = reply;
    entry.dir = CT_FORWARD;
    CONNTRACK
        .insert(key, entry, 0)
        .map_err(|_| (DROP, stat::DROP_CONNTRACK))?;
    if let Some(old_reply) = previous {
        let names_us =
            maps::with_conntrack(&old_reply, |r| r.dir == CT_REVERSE && same(&r.pair, key));
        if !same(&old_reply, &reply) && names_us == Some(true) {
            let _ = CONNTRACK.remove(old_reply);
        }
    }
    Ok(how)
}

/// A connection another node sent here with direct server return (`crate::dsr`):
/// the client, the pod it was translated to here, and the frontend it addressed.
pub struct Dsr {
    pub client_be: u32,
    pub pod_be: u32,
    pub sport_be: u16,
    pub pod_port_be: u16,
    pub frontend_be: u32,
    pub fport_be: u16,
    pub proto: u8,
    pub tcp_flags: u8,
}

/// Records, on the backend's node, a connection the first node sent here with direct
/// server return: the pair of entries this node would have made had it picked the
/// pod itself (forward: client to frontend; reverse: pod to client), so `reverse`
/// gives the pod's replies the frontend back as their source. A live forward entry
/// of the same pair is only refreshed (the option comes again on the first packet a
/// node sees of a flow moved to it). The backend id is none (`u32::MAX`): this node
/// did not pick it, and a UDP flow that reaches this node directly later picks
/// again. False, nothing recorded, if a live connection holds the reply tuple.
#[inline(always)]
pub fn adopt_dsr(c: Dsr, service_id: u32, now: u64) -> bool {
    let key = CtKey::v4(c.client_be, c.frontend_be, c.sport_be, c.fport_be, c.proto);
    let reply = CtKey::v4(c.pod_be, c.client_be, c.pod_port_be, c.sport_be, c.proto);
    adopt_dsr_keys(&key, &reply, c.tcp_flags, service_id, now)
}

/// [`adopt_dsr`] over the connection's two keys, for either family (IPv6's
/// `crate::v6::dsr` makes `FAMILY_V6` keys): `key` client to frontend, `reply` pod
/// to client.
#[inline(always)]
pub fn adopt_dsr_keys(
    key: &CtKey,
    reply: &CtKey,
    tcp_flags: u8,
    service_id: u32,
    now: u64,
) -> bool {
    let proto = key.proto;
    if reply_taken(reply, key, now) {
        return false;
    }
    // One lookup of the forward entry, read and then updated in place.
    if let Some(slot) = maps::conntrack_slot(key) {
        let live = slot.with(|f| {
            (f.dir == CT_FORWARD && same(&f.pair, reply) && alive(f, now)).then_some(f.flags)
        });
        if let Some(seen) = live {
            let (s, seen) = next_state(proto, seen, tcp_flags, Sender::Client);
            slot.touch(s, seen, now);
            maps::mark_conntrack_used(reply);
            return true;
        }
    }
    let (s, seen) = next_state(proto, 0, tcp_flags, Sender::Client);
    let forward = CtEntry {
        pair: *reply,
        last_seen_ns: now,
        service_id,
        backend_id: u32::MAX,
        dir: CT_FORWARD,
        state: s,
        flags: seen,
        _pad: [0; 5],
    };
    let reverse = CtEntry {
        pair: *key,
        dir: CT_REVERSE,
        ..forward
    };
    CONNTRACK.insert(reply, reverse, 0).is_ok() && CONNTRACK.insert(key, forward, 0).is_ok()
}

/// The forward key of the connection other than `key`'s whose reverse entry is at
/// `reply`, if one is there (alive or not: its forward entry says).
#[inline(always)]
fn reply_holder(reply: &CtKey, key: &CtKey) -> Option<CtKey> {
    maps::with_conntrack(reply, |rev| {
        (rev.dir == CT_REVERSE && !same(&rev.pair, key)).then_some(rev.pair)
    })
    .flatten()
}

/// Whether `reply` is the reverse key of a live connection other than `key`'s.
#[inline(always)]
pub fn reply_taken(reply: &CtKey, key: &CtKey, now: u64) -> bool {
    let Some(fwd_key) = reply_holder(reply, key) else {
        return false;
    };
    maps::with_conntrack(&fwd_key, |f| {
        f.dir == CT_FORWARD && same(&f.pair, reply) && alive(f, now)
    })
    .unwrap_or(false)
}

/// A new connection's TCP SYN takes over its reply tuple (`reply`, the client's own
/// port) from a connection that holds it but is closing (TIME_WAIT after FINs both
/// ways, CLOSE after an RST): the holder's forward entry goes, so the tuple counts as
/// free and the new connection's reverse entry takes its place. netfilter's NAT
/// likewise lets a new connection evict a conntrack in TIME_WAIT that holds the tuple
/// it needs (`nf_nat_used_tuple_harder`,
/// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_nat_core.c).
/// Without it, a client that opens connections to several Services sharing backends
/// finds each backend's reply tuples held for the TIME_WAIT timeout (120 s), and once
/// every candidate port is held its SYNs drop as `drop_ct_clash`.
///
/// Only the client's own tuple, before [`reply_taken`] and its remap candidates see
/// it: a takeover inside their loops multiplies the paths the verifier walks past
/// Debian 6.1's limit of a million instructions. A masqueraded connection's ports are
/// the node's, chosen among many (`masquerade_port`), and are not taken over; nor is
/// a tuple under direct server return, checked before (`track`).
#[inline(always)]
fn release_closing(reply: &CtKey, key: &CtKey, now: u64) {
    let Some(fwd_key) = reply_holder(reply, key) else {
        return;
    };
    let closing = maps::with_conntrack(&fwd_key, |f| {
        f.dir == CT_FORWARD
            && same(&f.pair, reply)
            && alive(f, now)
            && (f.state == state::TCP_TIME_WAIT || f.state == state::TCP_CLOSE)
    });
    if closing == Some(true) {
        let _ = CONNTRACK.remove(fwd_key);
    }
}

/// Key equality field by field: a derived `==` on the arrays becomes a `bcmp` call,
/// which BPF does not have.
#[inline(always)]
pub fn same(a: &CtKey, b: &CtKey) -> bool {
    a.src_be[0] == b.src_be[0]
        && a.src_be[1] == b.src_be[1]
        && a.src_be[2] == b.src_be[2]
        && a.src_be[3] == b.src_be[3]
        && a.dst_be[0] == b.dst_be[0]
        && a.dst_be[1] == b.dst_be[1]
        && a.dst_be[2] == b.dst_be[2]
        && a.dst_be[3] == b.dst_be[3]
        && a.sport_be == b.sport_be
        && a.dport_be == b.dport_be
        && a.proto == b.proto
        && a.family == b.family
}

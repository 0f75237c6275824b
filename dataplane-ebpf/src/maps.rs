//! The maps, one doc line each (key → value, who writes it), and getters that return
//! copies of map values, so no reference into a map outlives a lookup. Only the
//! agent's map writer writes `SERVICES`, `SLOTS` and `BACKENDS`; the programs write
//! only `CONNTRACK`, `AFFINITY`, the scratch maps, `FRAGMENTS`, `SOCK_REVNAT` (and
//! IPv6's of these) and the counters (and, migrating, `CT_V1`). Capacities here are
//! defaults, the agent resizes the maps at load time.

use aya_ebpf::{
    bindings::bpf_fib_lookup,
    macros::map,
    maps::{
        lpm_trie::Key, Array, DevMapHash, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray,
    },
};
use dataplane_common::{
    capacity, ct, stat, AffinityKey, AffinityValue, Backend, BackendCounters, CtEntry, CtKey,
    FragKey, FragPorts, FrontendCounters, NatConfig, ServiceKey, ServiceName, ServiceValue,
    SlotKey, SockRevKey, SockRevValue, SourceRange,
};
use dataplane_common::{
    capacity6, Backend6, FragKey6, NatConfig6, ServiceKey6, SockRevKey6, SockRevValue6,
    SourceRange6,
};

/// Frontends: (VIP, port, proto) → (id, slot count). Written by the agent.
#[map]
pub static SERVICES: HashMap<ServiceKey, ServiceValue> =
    HashMap::with_max_entries(capacity::SERVICES, 0);

/// Backend slots: (service id, slot) → backend id. Written by the agent.
#[map]
pub static SLOTS: HashMap<SlotKey, u32> = HashMap::with_max_entries(capacity::SLOTS, 0);

/// Backends: backend id → (ip, port, proto). Written by the agent.
#[map]
pub static BACKENDS: HashMap<u32, Backend> = HashMap::with_max_entries(capacity::BACKENDS, 0);

/// Conntrack: one direction of a connection → its entry (two per connection, paired).
/// Written by the program; expired entries removed by the agent's sweeper; LRU, so
/// the least recently used go first when full.
#[map]
pub static CONNTRACK: LruHashMap<CtKey, CtEntry> =
    LruHashMap::with_max_entries(capacity::CONNTRACK, 0);

/// The node's sockets' translations: (socket cookie, backend) → the frontend it
/// asked for. Written by `sliceway_connect4` and `sliceway_sendmsg4`, read by
/// `sliceway_recvmsg4` and `sliceway_getpeername4`; LRU.
#[map]
pub static SOCK_REVNAT: LruHashMap<SockRevKey, SockRevValue> =
    LruHashMap::with_max_entries(capacity::SOCK_REVNAT, 0);

/// Fragmented datagrams: (src, dst, id, proto) → the ports of the first fragment.
/// Written by the program for every first fragment; LRU.
#[map]
pub static FRAGMENTS: LruHashMap<FragKey, FragPorts> =
    LruHashMap::with_max_entries(capacity::FRAGMENTS, 0);

/// Idle timeouts in seconds, indexed by `ct::state::*`; zero means the default.
/// Written by the agent.
#[map]
pub static CT_TIMEOUTS: Array<u64> = Array::with_max_entries(ct::state::COUNT, 0);

/// Frontend id → Service port name. Written by the agent for `list` and restarts;
/// never read by the programs.
#[map]
pub static SERVICE_NAMES: HashMap<u32, ServiceName> =
    HashMap::with_max_entries(capacity::SERVICES, 0);

/// Session affinity: (client, frontend) → the backend it was given and when it last
/// connected. Written by the program for frontends with `SVC_F_AFFINITY`; LRU, so
/// the longest-idle clients go first when full.
#[map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue> =
    LruHashMap::with_max_entries(capacity::AFFINITY, 0);

/// Scratch space for building replies (one per CPU): a copy of an ICMP header and
/// quote to sum the checksum over.
#[map]
pub static SCRATCH: PerCpuArray<[u8; crate::reject::SCRATCH_LEN]> =
    PerCpuArray::with_max_entries(1, 0);

/// The clock's last reading on this CPU and the tick it was read in
/// (`conntrack::now`). Written by the programs; not pinned.
#[map]
pub static CLOCK: PerCpuArray<KeptTime> = PerCpuArray::with_max_entries(1, 0);

/// A reading of the clock (`ns`) and the `jiffies` it was made at.
#[repr(C)]
pub struct KeptTime {
    pub jiffies: u64,
    pub ns: u64,
}

/// Programs the TC program hands a packet over to (tail calls): slot
/// `JUMP_REJECT` is `sliceway_reject`, `JUMP_SCTP_NAT` is `sliceway_sctp_nat`,
/// `JUMP_REJECT_L3` is `sliceway_rej_l3`. Filled by the agent at load (a restarted agent
/// puts its own program in the pinned map).
#[map]
pub static JUMP: ProgramArray = ProgramArray::with_max_entries(dataplane_common::JUMP_SLOTS, 0);

/// The IPv6 programs (`dataplane_common::JUMP6_*` slots): the entry programs hand
/// IPv6 packets over to them, they hand rejects to their reject programs. A map of
/// its own, so `JUMP`'s size and slots stay as they are. Filled by the agent.
#[map]
pub static JUMP6: ProgramArray = ProgramArray::with_max_entries(dataplane_common::JUMP6_SLOTS, 0);

/// The XDP program's IPv6 program (`dataplane_common::XDP_JUMP6_EXT`): an XDP
/// program tail-calls XDP programs only, through an array of its own. Filled by the
/// agent when it loads the XDP program; not pinned (the XDP program is not either).
#[map]
pub static XDP_JUMP6: ProgramArray =
    ProgramArray::with_max_entries(dataplane_common::XDP_JUMP6_SLOTS, 0);

/// The interfaces the XDP program forwards between (`--xdp-forward`): interface
/// index → that interface (`XDP_REDIRECT` goes through it). An uplink the agent
/// put here forwards from XDP; one it did not passes every frame to the stack as
/// without forwarding. Written by the agent; not pinned (the XDP program is not).
#[map]
pub static XDP_FORWARD: DevMapHash = DevMapHash::with_max_entries(capacity::XDP_FORWARD, 0);

/// `bpf_fib_lookup`'s parameters and answer (one per CPU), off the XDP program's
/// stack, which has no 64 bytes to spare (`forward.rs`). Written by the program.
#[map]
pub static FIB_PARAMS: PerCpuArray<bpf_fib_lookup> = PerCpuArray::with_max_entries(1, 0);

/// Scratch space of the IPv6 programs (one per CPU): the packet's flow, conntrack
/// key and entry, kept off the stack.
#[map]
pub static SCRATCH6: PerCpuArray<crate::v6::Scratch6> = PerCpuArray::with_max_entries(1, 0);

/// Layout v1's conntrack, read and written only by `sliceway_bridge` while an agent
/// migrates from v1: the agent then loads the object over the pinned v1 map; the rest
/// of the time this is a small private map nothing uses.
#[map]
pub static CT_V1: LruHashMap<dataplane_common::v1::FlowKey, dataplane_common::v1::NatTarget> =
    LruHashMap::with_max_entries(16, 0);

/// Layout v1's backend id → this agent's id of the same backend, written by the agent
/// before it switches v1 links to `sliceway_bridge`, which gives the connections it
/// takes from `CT_V1` their backend id here. Allocated as written (no preallocation):
/// empty unless migrating.
#[map]
pub static BACKEND_IDS_V1: HashMap<u32, u32> =
    HashMap::with_max_entries(capacity::BACKENDS, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// Scratch space of `sliceway_bridge` (one per CPU): the keys and entry of a
/// connection it takes from `CT_V1`, kept off the stack.
#[map]
pub static ADOPTION: PerCpuArray<crate::bridge::Adoption> = PerCpuArray::with_max_entries(1, 0);

/// This agent's backend id of v1's backend `v1_id`, while migrating.
#[inline(always)]
pub fn backend_id_of_v1(v1_id: u32) -> Option<u32> {
    // SAFETY: as in `service`.
    unsafe { BACKEND_IDS_V1.get(v1_id).copied() }
}

/// `loadBalancerSourceRanges`: (frontend, source) prefixes → 1. Written by the agent.
#[map]
pub static SOURCE_RANGES: LpmTrie<SourceRange, u8> =
    LpmTrie::with_max_entries(capacity::SOURCE_RANGES, 0);

/// Whether `src_be` may open connections to `frontend` (a frontend with
/// `SVC_F_SOURCE_RANGES`): it is within one of its ranges.
#[inline(always)]
pub fn source_allowed(frontend: ServiceKey, src_be: u32) -> bool {
    let key = Key::new(SourceRange::LOOKUP_BITS, SourceRange::of(frontend, src_be));
    SOURCE_RANGES.get(&key).is_some()
}

/// The cluster's ServiceCIDRs (`networking.k8s.io/v1`): IPv4 prefixes (address in
/// network order) → 1. Written by the agent; empty without a ServiceCIDR.
#[map]
pub static SERVICE_CIDRS: LpmTrie<u32, u8> = LpmTrie::with_max_entries(capacity::SERVICE_CIDRS, 0);

/// Whether `addr_be` lies inside one of the cluster's ServiceCIDRs.
#[inline(always)]
pub fn in_service_cidr(addr_be: u32) -> bool {
    SERVICE_CIDRS.get(Key::new(32, addr_be)).is_some()
}

/// Which sources of a pod interface's new connections to a ClusterIP are masqueraded
/// (prefix → 1 masquerade, 0 keep; `--masquerade-all`, `--cluster-cidr`). Written by
/// the agent.
#[map]
pub static MASQ_SOURCES: LpmTrie<u32, u8> = LpmTrie::with_max_entries(capacity::MASQ_SOURCES, 0);

/// Whether a pod interface's new connection from `addr_be` to a ClusterIP is
/// masqueraded.
#[inline(always)]
pub fn masquerades(addr_be: u32) -> bool {
    MASQ_SOURCES
        .get(Key::new(32, addr_be))
        .is_some_and(|v| *v != 0)
}

/// The uplink program's masquerade settings (one entry). Written by the agent.
#[map]
pub static NAT_CONFIG: Array<NatConfig> = Array::with_max_entries(1, 0);

/// The masquerade settings, if the agent wrote an address of the node.
#[inline(always)]
pub fn nat_config() -> Option<NatConfig> {
    NAT_CONFIG.get(0).copied().filter(|c| c.node_addr_be != 0)
}

/// Exit counters, indexed by `stat::*`. Written by the program.
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// Per-frontend counters, indexed by frontend id. Written by the program; zeroed by
/// the agent when an id is given to a frontend.
#[map]
pub static FRONTEND_COUNTERS: PerCpuArray<FrontendCounters> =
    PerCpuArray::with_max_entries(capacity::COUNTED_FRONTENDS, 0);

/// Per-backend counters, indexed by backend id. As `FRONTEND_COUNTERS`.
#[map]
pub static BACKEND_COUNTERS: PerCpuArray<BackendCounters> =
    PerCpuArray::with_max_entries(capacity::COUNTED_BACKENDS, 0);

/// The frontend at `key`, if any.
#[inline(always)]
pub fn service(key: &ServiceKey) -> Option<ServiceValue> {
    // SAFETY: the value is plain data, copied out before anything else runs.
    unsafe { SERVICES.get(key).copied() }
}

/// The frontend a socket of the node asked for, given the backend it got instead.
#[inline(always)]
pub fn sock_revnat(key: &SockRevKey) -> Option<SockRevValue> {
    // SAFETY: as in `service`.
    unsafe { SOCK_REVNAT.get(key).copied() }
}

/// The backend id in slot `key`, if any.
#[inline(always)]
pub fn slot(key: &SlotKey) -> Option<u32> {
    // SAFETY: as in `service`.
    unsafe { SLOTS.get(key).copied() }
}

/// The backend with id `id`, if any.
#[inline(always)]
pub fn backend(id: u32) -> Option<Backend> {
    // SAFETY: as in `service`.
    unsafe { BACKENDS.get(id).copied() }
}

/// The conntrack entry at `key`, if any.
#[inline(always)]
pub fn conntrack(key: &CtKey) -> Option<CtEntry> {
    // SAFETY: as in `service`.
    unsafe { CONNTRACK.get(key).copied() }
}

/// The session-affinity entry at `key`, if any.
#[inline(always)]
pub fn affinity(key: &AffinityKey) -> Option<AffinityValue> {
    // SAFETY: as in `service`.
    unsafe { AFFINITY.get(key).copied() }
}

/// Runs `f` on the conntrack entry at `key` without copying it out (an entry is 64
/// bytes, and copies of several would not fit the 512-byte BPF stack).
#[inline(always)]
pub fn with_conntrack<R>(key: &CtKey, f: impl FnOnce(&CtEntry) -> R) -> Option<R> {
    // SAFETY: the reference lives only during `f`, which cannot return it (`R` does
    // not borrow from the entry); map values stay valid for the program's run.
    unsafe { CONNTRACK.get(key).map(f) }
}

/// Marks the conntrack entry at `key` recently used, for the LRU map's eviction: a
/// lookup sets the bit, and nothing is read.
#[inline(always)]
pub fn mark_conntrack_used(key: &CtKey) {
    let _ = with_conntrack(key, |_| ());
}

/// A conntrack entry found by one lookup, to read and then update in place.
pub struct CtSlot(*mut CtEntry);

impl CtSlot {
    /// A copy of the entry.
    #[inline(always)]
    pub fn get(&self) -> CtEntry {
        // SAFETY: the pointer is to a live map value of type `CtEntry` (map values
        // stay valid for the program's run); a plain read.
        unsafe { *self.0 }
    }

    /// Runs `f` on the entry in place, without copying it out (see
    /// [`with_conntrack`]).
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(&CtEntry) -> R) -> R {
        // SAFETY: as in `get`; the reference lives only during `f`, which cannot
        // return it (`R` does not borrow from the entry).
        f(unsafe { &*self.0 })
    }

    /// Updates state, flags and last-seen time in place. Another CPU may update the
    /// same entry at the same time; the fields are independent and a lost update of
    /// either is repaired by the next packet.
    #[inline(always)]
    pub fn touch(&self, state: u8, flags: u8, now_ns: u64) {
        // SAFETY: as in `get`; plain stores.
        unsafe {
            (*self.0).state = state;
            (*self.0).flags = flags;
            (*self.0).last_seen_ns = now_ns;
        }
    }
}

/// The conntrack entry at `key`, if any, for a read and an update with one lookup.
#[inline(always)]
pub fn conntrack_slot(key: &CtKey) -> Option<CtSlot> {
    CONNTRACK.get_ptr_mut(key).map(CtSlot)
}

/// The idle timeout of `state` in seconds.
#[inline(always)]
pub fn timeout(state: u8) -> u64 {
    let i = state as usize;
    // Checked right before use: the verifier needs the index bounded.
    if i >= ct::DEFAULTS.len() {
        return 0;
    }
    match CT_TIMEOUTS.get(state as u32) {
        Some(&t) if t != 0 => t,
        _ => ct::DEFAULTS[i],
    }
}

/// The ports the first fragment of datagram `key` carried, if it was seen.
#[inline(always)]
pub fn fragment(key: &FragKey) -> Option<FragPorts> {
    // SAFETY: as in `service`.
    unsafe { FRAGMENTS.get(key).copied() }
}

/// IPv6 frontends: (VIP, port, proto, scope) → (id, slot count), ids from the same
/// space as `SERVICES`' (`SLOTS` serves both). Written by the agent.
#[map]
pub static SERVICES6: HashMap<ServiceKey6, ServiceValue> =
    HashMap::with_max_entries(capacity6::SERVICES6, 0);

/// IPv6 backends: backend id → (ip, port, proto); an id is in `BACKENDS` or here,
/// never both. Written by the agent.
#[map]
pub static BACKENDS6: HashMap<u32, Backend6> = HashMap::with_max_entries(capacity6::BACKENDS6, 0);

/// Fragmented IPv6 datagrams: (src, dst, id, proto) → the ports of the first
/// fragment. Written by the IPv6 programs for every first fragment; LRU.
#[map]
pub static FRAGMENTS6: LruHashMap<FragKey6, FragPorts> =
    LruHashMap::with_max_entries(capacity6::FRAGMENTS6, 0);

/// The uplink IPv6 program's masquerade settings (one entry). Written by the agent.
#[map]
pub static NAT_CONFIG6: Array<NatConfig6> = Array::with_max_entries(1, 0);

/// IPv6 `loadBalancerSourceRanges`: (frontend, source) prefixes → 1. Written by the
/// agent.
#[map]
pub static SOURCE_RANGES6: LpmTrie<SourceRange6, u8> =
    LpmTrie::with_max_entries(capacity6::SOURCE_RANGES6, 0);

/// The node's IPv6 sockets' translations: (socket cookie, IPv6 backend) → the
/// frontend asked for. Written by `sliceway_connect6` and `sliceway_sendmsg6`, read
/// by `sliceway_recvmsg6` and `sliceway_getpeername6`; LRU.
#[map]
pub static SOCK_REVNAT6: LruHashMap<SockRevKey6, SockRevValue6> =
    LruHashMap::with_max_entries(capacity6::SOCK_REVNAT6, 0);

/// The frontend an IPv6 socket of the node asked for, given its backend, if known.
#[inline(always)]
pub fn sock_revnat6(key: &SockRevKey6) -> Option<SockRevValue6> {
    // SAFETY: as in `service`.
    unsafe { SOCK_REVNAT6.get(key).copied() }
}

/// The IPv6 frontend at `key`, if any.
#[inline(always)]
pub fn service6(key: &ServiceKey6) -> Option<ServiceValue> {
    // SAFETY: as in `service`.
    unsafe { SERVICES6.get(key).copied() }
}

/// The IPv6 backend with id `id`, if any.
#[inline(always)]
pub fn backend6(id: u32) -> Option<Backend6> {
    // SAFETY: as in `service`.
    unsafe { BACKENDS6.get(id).copied() }
}

/// The ports the first fragment of IPv6 datagram `key` carried, if it was seen.
#[inline(always)]
pub fn fragment6(key: &FragKey6) -> Option<FragPorts> {
    // SAFETY: as in `service`.
    unsafe { FRAGMENTS6.get(key).copied() }
}

/// Whether `src_be` may open connections to IPv6 `frontend` (a frontend with
/// `SVC_F_SOURCE_RANGES`): it is within one of its ranges.
#[inline(always)]
pub fn source_allowed6(frontend: ServiceKey6, src_be: [u32; 4]) -> bool {
    let key = Key::new(
        SourceRange6::LOOKUP_BITS,
        SourceRange6::of(frontend, src_be),
    );
    SOURCE_RANGES6.get(&key).is_some()
}

/// The cluster's ServiceCIDRs, IPv6 prefixes → 1. Written by the agent.
#[map]
pub static SERVICE_CIDRS6: LpmTrie<[u32; 4], u8> =
    LpmTrie::with_max_entries(capacity6::SERVICE_CIDRS6, 0);

/// [`MASQ_SOURCES`] for IPv6 sources. Written by the agent.
#[map]
pub static MASQ_SOURCES6: LpmTrie<[u32; 4], u8> =
    LpmTrie::with_max_entries(capacity::MASQ_SOURCES, 0);

/// [`masquerades`] for an IPv6 source.
#[inline(always)]
pub fn masquerades6(addr_be: [u32; 4]) -> bool {
    MASQ_SOURCES6
        .get(Key::new(128, addr_be))
        .is_some_and(|v| *v != 0)
}

/// Whether IPv6 `addr_be` lies inside one of the cluster's ServiceCIDRs.
#[inline(always)]
pub fn in_service_cidr6(addr_be: [u32; 4]) -> bool {
    SERVICE_CIDRS6.get(Key::new(128, addr_be)).is_some()
}

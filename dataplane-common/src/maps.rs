//! The object's maps as a whole: the layout version their pinned names carry, their
//! names, their default capacities, and the slots of the program array the TC program
//! tail-calls.

/// Version of the map layout. Map names carry it, so an agent never reads maps
/// written with another layout.
pub const MAP_LAYOUT_VERSION: u32 = 2;

/// Slots of the `JUMP` program array (the programs the TC program tail-calls).
pub const JUMP_SLOTS: u32 = 4;
/// The slot of the reject program of interfaces without an Ethernet header.
pub const JUMP_REJECT_L3: u32 = 2;
/// The slot of the direct server return program (`sliceway_dsr`).
pub const JUMP_DSR: u32 = 3;

/// Capacity defaults. The agent may size maps differently at load time.
pub mod capacity {
    /// Frontends (VIP:port:proto) and ClusterIP markers (one per ClusterIP): 128k
    /// covers the largest clusters we target (about 60k Services of one port).
    pub const SERVICES: u32 = 131_072;
    /// Distinct backends (ip:port:proto) across all services.
    pub const BACKENDS: u32 = 262_144;
    /// Backend slots across all services (sum of backends per frontend).
    pub const SLOTS: u32 = 1_048_576;
    /// Conntrack entries, two per connection; LRU, so when full the least recently
    /// used go first (both entries of a connection are touched by every packet).
    pub const CONNTRACK: u32 = 262_144;
    /// Clients remembered by session affinity (per client and frontend); LRU.
    pub const AFFINITY: u32 = 65_536;
    /// Datagrams being fragmented at once; LRU, an entry is only needed until the
    /// last fragment went by.
    pub const FRAGMENTS: u32 = 8_192;
    /// Frontends with counters of their own (`FRONTEND_COUNTERS`, per CPU: 40 bytes
    /// times the possible CPUs each). Ids are handed out densely from 0, so these are
    /// the first 16,384 frontends; one beyond is served but not counted.
    pub const COUNTED_FRONTENDS: u32 = 16_384;
    /// Backends with counters of their own (`BACKEND_COUNTERS`, 24 bytes per CPU each).
    pub const COUNTED_BACKENDS: u32 = 32_768;
    /// Translations the node's own sockets made (`SOCK_REVNAT`: socket, backend →
    /// frontend), for replies and peer names; LRU, a connection needs its entry only
    /// while its socket lives.
    pub const SOCK_REVNAT: u32 = 65_536;
    /// `loadBalancerSourceRanges` entries, all frontends together.
    pub const SOURCE_RANGES: u32 = 16_384;
    /// IPv4 prefixes of ServiceCIDR objects (`SERVICE_CIDRS`): a cluster has a few.
    pub const SERVICE_CIDRS: u32 = 1_024;
    /// Entries of `XDP_FORWARD`: two per uplink the XDP program forwards between
    /// (its index, and with [`crate::XDP_FORWARD_TX`] where it sends `XDP_TX`), a
    /// handful of uplinks.
    pub const XDP_FORWARD: u32 = 64;
    /// Prefixes of `MASQ_SOURCES` and of `MASQ_SOURCES6`: everything, and the
    /// cluster's pod CIDRs (one per family, as `--cluster-cidr`).
    pub const MASQ_SOURCES: u32 = 8;
}

/// Names of the maps in the object file. The layout version is part of the pinned
/// name (see the agent's pinning code), never of the section name.
pub mod map_name {
    pub const SERVICES: &str = "SERVICES";
    pub const SLOTS: &str = "SLOTS";
    pub const BACKENDS: &str = "BACKENDS";
    pub const CONNTRACK: &str = "CONNTRACK";
    pub const STATS: &str = "STATS";
    pub const SERVICE_NAMES: &str = "SERVICE_NAMES";
    pub const CT_TIMEOUTS: &str = "CT_TIMEOUTS";
    pub const FRAGMENTS: &str = "FRAGMENTS";
    pub const AFFINITY: &str = "AFFINITY";
    /// Tail-call targets. Pinned like the others: the kernel empties a program array
    /// once no process and no pin holds it, and the attached program must keep its
    /// targets while the agent restarts.
    pub const JUMP: &str = "JUMP";
    pub const FRONTEND_COUNTERS: &str = "FRONTEND_COUNTERS";
    pub const BACKEND_COUNTERS: &str = "BACKEND_COUNTERS";
    /// Layout v1's conntrack map, seen by `sliceway_bridge` while an agent migrates
    /// from v1 (the pinned v1 map is reused); otherwise a small private map. Never
    /// pinned under this layout.
    pub const CT_V1: &str = "CT_V1";
    /// v1 backend id → this layout's, for `sliceway_bridge`; written while migrating.
    pub const BACKEND_IDS_V1: &str = "BACKEND_IDS_V1";
    /// The node's sockets' translations (socket programs), for replies and peer names.
    pub const SOCK_REVNAT: &str = "SOCK_REVNAT";
    /// The uplink program's masquerade settings (`NatConfig`), written at the first
    /// sync and when the node's address changes; pinned, so a restarted agent's
    /// old program and a live `trace` see it.
    pub const NAT_CONFIG: &str = "NAT_CONFIG";
    /// `loadBalancerSourceRanges` (prefix length and `SourceRange` → 1), written by the
    /// agent.
    pub const SOURCE_RANGES: &str = "SOURCE_RANGES";
    /// IPv6 frontends (`ServiceKey6` → `ServiceValue`), written by the agent.
    pub const SERVICES6: &str = "SERVICES6";
    /// IPv6 backends (backend id → `Backend6`), written by the agent.
    pub const BACKENDS6: &str = "BACKENDS6";
    /// IPv6 fragments (`FragKey6` → `FragPorts`), written by the programs.
    pub const FRAGMENTS6: &str = "FRAGMENTS6";
    /// The uplink program's IPv6 masquerade settings (`NatConfig6`).
    pub const NAT_CONFIG6: &str = "NAT_CONFIG6";
    /// IPv6 `loadBalancerSourceRanges` (`SourceRange6`), written by the agent.
    pub const SOURCE_RANGES6: &str = "SOURCE_RANGES6";
    /// The IPv6 programs (tail calls, `JUMP6_*` slots), pinned as `JUMP` is.
    pub const JUMP6: &str = "JUMP6";
    /// The node's IPv6 sockets' translations (socket programs).
    pub const SOCK_REVNAT6: &str = "SOCK_REVNAT6";
    /// The IPv4 prefixes of the cluster's ServiceCIDR objects (prefix length and
    /// address → 1), written by the agent.
    pub const SERVICE_CIDRS: &str = "SERVICE_CIDRS";
    /// Their IPv6 prefixes, written by the agent.
    pub const SERVICE_CIDRS6: &str = "SERVICE_CIDRS6";
    /// The XDP program's IPv6 program (tail call, `XDP_JUMP6_*` slots). Not pinned:
    /// the XDP program and its link are the agent's own and go when it exits, so
    /// nothing attached outlives the map.
    pub const XDP_JUMP6: &str = "XDP_JUMP6";
    /// The interfaces the XDP program forwards between (`--xdp-forward`): a device
    /// map, interface index → that interface, and index | `XDP_FORWARD_TX` → the
    /// same for an uplink whose driver sends `XDP_TX` frames itself. Written by the
    /// agent for every uplink the XDP program is attached to; not pinned, as
    /// `XDP_JUMP6` is not.
    pub const XDP_FORWARD: &str = "XDP_FORWARD";
    /// The XDP program's scratch space for `bpf_fib_lookup`'s parameters (one per
    /// CPU), kept off the stack. Not pinned.
    pub const FIB_PARAMS: &str = "FIB_PARAMS";
    /// Which sources of a pod interface's new connections to a ClusterIP are
    /// masqueraded (prefix length and address → 1 masquerade, 0 keep; the longest
    /// prefix decides; empty: none), written by the agent at start from
    /// `--masquerade-all` and `--cluster-cidr`.
    pub const MASQ_SOURCES: &str = "MASQ_SOURCES";
    /// Their IPv6 prefixes.
    pub const MASQ_SOURCES6: &str = "MASQ_SOURCES6";

    /// Every map, in the order the agent pins them.
    pub const ALL: [&str; 26] = [
        SERVICES,
        SLOTS,
        BACKENDS,
        CONNTRACK,
        STATS,
        SERVICE_NAMES,
        CT_TIMEOUTS,
        FRAGMENTS,
        AFFINITY,
        JUMP,
        FRONTEND_COUNTERS,
        BACKEND_COUNTERS,
        SOCK_REVNAT,
        NAT_CONFIG,
        SOURCE_RANGES,
        SERVICES6,
        BACKENDS6,
        FRAGMENTS6,
        NAT_CONFIG6,
        SOURCE_RANGES6,
        JUMP6,
        SOCK_REVNAT6,
        SERVICE_CIDRS,
        SERVICE_CIDRS6,
        MASQ_SOURCES,
        MASQ_SOURCES6,
    ];
}

/// Marks a key of `XDP_FORWARD` (interface index | this): the interface sends a
/// frame its XDP program returns `XDP_TX` for. Absent (a veth, which hands `XDP_TX`
/// frames on only to a peer with an XDP program of its own), a frame forwarded
/// out of the interface it came in on goes by `XDP_REDIRECT` to that interface,
/// which a veth peer with NAPI (GRO on, or an XDP program) takes.
pub const XDP_FORWARD_TX: u32 = 1 << 31;

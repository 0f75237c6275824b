//! Map keys, values and constants shared by the kernel programs and the agent.
//!
//! Every type is `#[repr(C)]`, derives `bytemuck::{Pod, Zeroable}` (so the compiler
//! rejects hidden padding) and has its size asserted. Fields in network byte order end
//! in `_be`. No `bool`, `enum` or `Option` crosses the kernel boundary.
#![no_std]

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

mod v6;
pub use v6::*;

/// Version of the map layout. Map names carry it, so an agent never reads maps
/// written with another layout.
pub const MAP_LAYOUT_VERSION: u32 = 2;

/// Protocol numbers as they appear in the IPv4 header.
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;

/// Slots of the `JUMP` program array (the programs the TC program tail-calls).
pub const JUMP_SLOTS: u32 = 4;
/// The slot of the reject program of interfaces without an Ethernet header.
pub const JUMP_REJECT_L3: u32 = 2;
/// The slot of the direct server return program (`sliceway_dsr`).
pub const JUMP_DSR: u32 = 3;

/// Direct server return: the IPv4 option with which the node a connection from
/// outside arrives at tells the backend's node the frontend the client addressed, so
/// the backend's replies leave from that node with the frontend as their source.
/// Option 30 with the copied flag (0x80 | 30): the experimental value of RFC 4727
/// (https://www.rfc-editor.org/rfc/rfc4727#section-2.4), never given to anything
/// else. Eight bytes: type, length, the frontend's port, then its address (both in
/// network byte order). IPv6 carries the same in a destination options header
/// ([`dsr6`]).
pub mod dsr {
    pub const OPT_TYPE: u8 = 0x9e;
    pub const OPT_LEN: u8 = 8;
    /// Offset of the option from the IPv4 header: right after its fixed 20 bytes,
    /// where `bpf_skb_adjust_room` makes room, before any options the packet had.
    pub const OPT_OFF: usize = 20;
}

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
}

/// Per-frontend counters (`FRONTEND_COUNTERS`, per CPU, indexed by frontend id):
/// what clients sent to the frontend. Zeroed by the agent when it gives the id to a
/// frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct FrontendCounters {
    /// Connections (flows) given a backend.
    pub new: u64,
    /// Packets from clients translated to a backend (of new and tracked flows).
    pub packets: u64,
    /// Their bytes, as the interface saw them (frame length).
    pub bytes: u64,
    /// New flows dropped: no backend on this node and a `Local` policy.
    pub drops: u64,
    /// New flows refused (ICMP port unreachable, or TCP reset where answered): no
    /// backend at all.
    pub rejects: u64,
}
const _: () = assert!(size_of::<FrontendCounters>() == 40);

impl FrontendCounters {
    /// Adds `o` (another CPU's copy) to these counts.
    pub fn add(&mut self, o: &Self) {
        self.new += o.new;
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.drops += o.drops;
        self.rejects += o.rejects;
    }
}

/// Per-backend counters (`BACKEND_COUNTERS`, per CPU, indexed by backend id): what
/// clients sent to the backend through any frontend. Zeroed by the agent when it
/// gives the id to a backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BackendCounters {
    pub new: u64,
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(size_of::<BackendCounters>() == 24);

impl BackendCounters {
    /// Adds `o` (another CPU's copy) to these counts.
    pub fn add(&mut self, o: &Self) {
        self.new += o.new;
        self.packets += o.packets;
        self.bytes += o.bytes;
    }
}

/// Key of the `SERVICES` hash map: one frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct ServiceKey {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    /// Who the entry is for: [`SCOPE_ANY`] or [`SCOPE_EXTERNAL`].
    pub scope: u8,
}
const _: () = assert!(size_of::<ServiceKey>() == 8);

/// A frontend entry for every client: pods, the node's sockets, and clients outside
/// the node unless an [`SCOPE_EXTERNAL`] entry of the same frontend exists.
pub const SCOPE_ANY: u8 = 0;
/// A frontend entry only the uplink program (`sliceway_tc_ext`) looks up, before the
/// [`SCOPE_ANY`] one: the frontend of a Service with `externalTrafficPolicy: Local`
/// as clients outside the node reach it (this node's endpoints only, the client's
/// address kept). Without it, clients outside the node are masqueraded.
pub const SCOPE_EXTERNAL: u8 = 1;

/// What the uplink program needs to masquerade (kube-proxy's `KUBE-MARK-MASQ` for
/// traffic from outside the node): the node's address, and the source ports it may
/// give connections (inclusive). Written by the agent into `NAT_CONFIG` (one entry);
/// an address of zero means unknown, and a connection that needs it is dropped.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct NatConfig {
    pub node_addr_be: u32,
    pub port_min: u16,
    pub port_max: u16,
}
const _: () = assert!(size_of::<NatConfig>() == 8);

/// The default masquerade source ports: above Linux's default local port range
/// (`net.ipv4.ip_local_port_range`, 32768-60999), so a translated tuple never takes a
/// port the node's own sockets are given, and above the NodePort range.
pub const SNAT_PORTS_DEFAULT: (u16, u16) = (61_000, 65_535);

/// Value of the `SERVICES` map: the frontend's id and how many slots it publishes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct ServiceValue {
    /// Stable id of the frontend; slots are keyed by it.
    pub id: u32,
    /// Number of valid slots, `0..count`. Zero means no backend.
    pub count: u32,
    /// `SVC_F_*` bits.
    pub flags: u32,
    /// With `SVC_F_AFFINITY`: how long a client keeps its backend, in seconds.
    pub affinity_timeout_s: u32,
}

impl ServiceValue {
    /// Whether a pod's connect (`proto`) to this frontend is translated at the socket
    /// with `--socket-lb-pods`: TCP, with backends, and neither session affinity nor
    /// source ranges (both keyed by the pod's address, which TC sees); the rest is
    /// TC's. The socket programs and `trace --from pod-socket` both ask this.
    #[inline(always)]
    pub fn pod_socket_translates(&self, proto: u8) -> bool {
        proto == PROTO_TCP
            && self.count > 0
            && self.flags & (SVC_F_AFFINITY | SVC_F_SOURCE_RANGES) == 0
    }
}

/// A frontend without backends drops new flows silently (the Service has endpoints
/// on other nodes only and its policy is `Local`); without the bit it rejects them.
pub const SVC_F_DROP_EMPTY: u32 = 1 << 0;
/// `sessionAffinity: ClientIP`: a client IP keeps its backend for
/// `affinity_timeout_s` after its last new connection.
pub const SVC_F_AFFINITY: u32 = 1 << 1;
/// A load-balancer IP with `loadBalancerSourceRanges`: a new connection from a
/// source outside them (`SOURCE_RANGES`) is dropped.
pub const SVC_F_SOURCE_RANGES: u32 = 1 << 2;
/// The slots are a Maglev lookup table (`count` is its prime size), built from the
/// backends' identities alone, so every node picks the same backend for a flow. The
/// programs pick as for any frontend; the agent reads the bit back after a restart.
pub const SVC_F_MAGLEV: u32 = 1 << 3;
/// Direct server return (`--external-mode dsr`): a connection from outside the node
/// that would be masqueraded keeps its client's address instead, and leaves with the
/// frontend in an IPv4 option ([`dsr`]) or an IPv6 destination options header
/// ([`dsr6`]); the backend's node records it and its replies go straight to the
/// client from the frontend's address. Read by the uplink programs only.
pub const SVC_F_DSR: u32 = 1 << 4;

/// What the `SOURCE_RANGES` longest-prefix-match map matches on (after the key's
/// prefix length): a frontend (always its `SCOPE_ANY` key) and a source address. An
/// entry for range `addr/len` has prefix length [`SourceRange::FRONTEND_BITS`] +
/// len, so it matches only sources of that frontend within the range.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SourceRange {
    pub frontend: ServiceKey,
    pub src_be: u32,
}
const _: () = assert!(size_of::<SourceRange>() == 12);

impl SourceRange {
    /// Bits of the key before the source address.
    pub const FRONTEND_BITS: u32 = 64;
    /// The prefix length of a lookup: the whole key.
    pub const LOOKUP_BITS: u32 = 96;

    /// The data of range `addr_be/len` of `frontend`, or of a lookup of source
    /// `addr_be`; the prefix length goes beside it.
    #[inline(always)]
    pub fn of(frontend: ServiceKey, addr_be: u32) -> Self {
        Self {
            frontend: ServiceKey {
                scope: SCOPE_ANY,
                ..frontend
            },
            src_be: addr_be,
        }
    }
}
const _: () = assert!(size_of::<ServiceValue>() == 16);

/// Key of the `SLOTS` hash map: slot `slot` of frontend `service_id`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SlotKey {
    pub service_id: u32,
    pub slot: u32,
}
const _: () = assert!(size_of::<SlotKey>() == 8);

/// Value of the `BACKENDS` hash map (keyed by backend id, a `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct Backend {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<Backend>() == 8);

/// The source a hairpin connection (a pod that reaches its own Service and is picked
/// as the backend) is given, network byte order: the pod must not see a packet from
/// itself, so its connection comes from this address, and its replies, routed to the
/// node, are translated back. 169.254.42.1, link-local and never a pod's, as Cilium's
/// default service loopback address; kube-proxy masquerades to the node's address
/// for the same reason (its hairpin rule).
pub const HAIRPIN_ADDR_BE: u32 = u32::from_ne_bytes([169, 254, 42, 1]);

/// The client address a connection's reply tuple names: the client's own, or for a
/// connection that a pod makes to itself through a Service, [`HAIRPIN_ADDR_BE`].
#[inline(always)]
pub fn reply_client(client_be: u32, backend_be: u32) -> u32 {
    if client_be == backend_be {
        HAIRPIN_ADDR_BE
    } else {
        client_be
    }
}

/// Address family of a conntrack key.
pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

/// Key of the conntrack map: one direction of a connection, as the packet carries it.
/// Addresses have room for IPv6; an IPv4 address fills the first word (network byte
/// order) and leaves the other three zero. A connection has two entries: the forward
/// one keyed client → frontend, the reverse one keyed backend → client (as the
/// backend sees the client: after a source port remap, the remapped port).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct CtKey {
    pub src_be: [u32; 4],
    pub dst_be: [u32; 4],
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// `FAMILY_V4` or `FAMILY_V6`.
    pub family: u8,
    pub _pad: [u8; 2],
}
const _: () = assert!(size_of::<CtKey>() == 40);

impl CtKey {
    /// The key of an IPv4 packet.
    #[inline(always)]
    pub fn v4(src_be: u32, dst_be: u32, sport_be: u16, dport_be: u16, proto: u8) -> Self {
        Self {
            src_be: [src_be, 0, 0, 0],
            dst_be: [dst_be, 0, 0, 0],
            sport_be,
            dport_be,
            proto,
            family: FAMILY_V4,
            _pad: [0; 2],
        }
    }

    /// The same tuple seen from the other end.
    #[inline(always)]
    pub fn reversed(&self) -> Self {
        Self {
            src_be: self.dst_be,
            dst_be: self.src_be,
            sport_be: self.dport_be,
            dport_be: self.sport_be,
            ..*self
        }
    }
}

/// Value of the conntrack map. The two entries of a connection point at each other
/// through `pair`, and everything a rewrite needs is in the pair key, so a connection
/// keeps working when its Service, port or backend is deleted or renumbered:
/// - forward entry (`CT_FORWARD`, keyed client → frontend): `pair` is the reverse key,
///   backend → client as the backend sees it. Rewrite the destination to
///   `pair.src:pair.sport` and, if `pair.dport` differs from the packet's source
///   port, the source port to `pair.dport` (remapped on a reply-tuple clash).
/// - reverse entry (`CT_REVERSE`, keyed backend → client): `pair` is the forward key.
///   Rewrite the source to `pair.dst:pair.dport` and the destination port back to
///   `pair.sport`.
///
/// A reply is translated only if the forward entry it names is alive and names it
/// back, so a stale reverse entry never rewrites anything. Protocol state and the
/// last time a packet was seen in either direction live in the forward entry; the
/// reverse entry's copies are not kept up to date.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CtEntry {
    pub pair: CtKey,
    /// The time of the last packet, either direction (CLOCK_MONOTONIC in ns, read at
    /// the resolution of a tick: `conntrack::now` of the programs).
    pub last_seen_ns: u64,
    /// Frontend id the connection was made through (for `list`; never read to
    /// translate, so renumbered frontends do not matter).
    pub service_id: u32,
    /// Backend id the connection was given; a UDP flow whose backend id no longer
    /// holds this backend moves on.
    pub backend_id: u32,
    /// `CT_FORWARD` or `CT_REVERSE`.
    pub dir: u8,
    /// One of `ct::state::*`, which is also the index of its idle timeout.
    pub state: u8,
    /// `ct::flag::*` seen so far.
    pub flags: u8,
    pub _pad: [u8; 5],
}
const _: () = assert!(size_of::<CtEntry>() == 64);

/// Conntrack states, flags and idle timeouts.
pub mod ct {
    /// States; each is the index of its idle timeout in `CT_TIMEOUTS` and `DEFAULTS`.
    pub mod state {
        /// TCP: SYN from the client seen, no reply yet.
        pub const TCP_SYN_SENT: u8 = 0;
        /// TCP: the backend answered and no FIN or RST was seen.
        pub const TCP_ESTABLISHED: u8 = 1;
        /// TCP: a FIN seen in one direction.
        pub const TCP_FIN_WAIT: u8 = 2;
        /// TCP: FINs seen in both directions.
        pub const TCP_TIME_WAIT: u8 = 3;
        /// TCP: an RST seen.
        pub const TCP_CLOSE: u8 = 4;
        /// UDP: nothing from the backend yet.
        pub const UDP_UNREPLIED: u8 = 5;
        /// UDP: the backend answered.
        pub const UDP_REPLIED: u8 = 6;
        /// Any other protocol (ICMP when tracked).
        pub const OTHER: u8 = 7;
        /// SCTP: INIT from the client seen, nothing from the backend yet.
        pub const SCTP_UNREPLIED: u8 = 8;
        /// SCTP: the backend answered and no ABORT or SHUTDOWN COMPLETE was seen.
        pub const SCTP_ESTABLISHED: u8 = 9;
        /// SCTP: an ABORT or SHUTDOWN COMPLETE seen.
        pub const SCTP_CLOSED: u8 = 10;
        pub const COUNT: u32 = 11;

        pub const NAMES: [&str; COUNT as usize] = [
            "tcp_syn_sent",
            "tcp_established",
            "tcp_fin_wait",
            "tcp_time_wait",
            "tcp_close",
            "udp_unreplied",
            "udp_replied",
            "other",
            "sctp_unreplied",
            "sctp_established",
            "sctp_closed",
        ];
    }

    /// Flags seen over the connection's life.
    pub mod flag {
        /// A packet from the backend was seen.
        pub const REPLIED: u8 = 1;
        /// FIN from the client.
        pub const FIN_ORIG: u8 = 2;
        /// FIN from the backend.
        pub const FIN_REPLY: u8 = 4;
        /// RST (TCP), ABORT or SHUTDOWN COMPLETE (SCTP) from either side.
        pub const RST: u8 = 8;
    }

    /// Default idle timeouts in seconds, by state; the agent may override each one in
    /// the `CT_TIMEOUTS` map (a zero there means this default).
    ///
    /// | state | sliceway | netfilter | Cilium |
    /// |---|---|---|---|
    /// | TCP SYN_SENT | 60 | 120 (syn_sent) | 60 (tcp-syn) |
    /// | TCP ESTABLISHED | 86400 | 432000; kube-proxy sets 86400 | 8000 (regular-tcp) |
    /// | TCP FIN_WAIT | 120 | 120 (fin_wait), 60 (close_wait); kube-proxy sets close_wait 3600 | 10 (tcp-fin) |
    /// | TCP TIME_WAIT | 120 | 120 | 10 (tcp-fin) |
    /// | TCP CLOSE (RST) | 10 | 10 | 10 (tcp-fin) |
    /// | UDP unreplied | 30 | 30 (udp_timeout) | 60 (regular-any) |
    /// | UDP replied | 120 | 120 (udp_timeout_stream) | 60 (regular-any) |
    /// | other | 30 | 30 (icmp), 600 (generic) | 60 (regular-any) |
    /// | SCTP unreplied | 30 | 3 + 3 (cookie_wait, cookie_echoed) | 60 (regular-any) |
    /// | SCTP ESTABLISHED | 86400 | 432000 (established) | 60 (regular-any) |
    /// | SCTP closed (ABORT, SHUTDOWN COMPLETE) | 10 | 10 (closed) | 60 (regular-any) |
    ///
    /// Reasons: a ClusterIP connection through sliceway must last as long as it does
    /// through kube-proxy, so ESTABLISHED is kube-proxy's 24 hours
    /// (`conntrack.tcpEstablishedTimeout`), not netfilter's 5 days (a node's table
    /// would fill with dead peers) nor Cilium's 2h13m (idle database connections
    /// behind a Service would break where kube-proxy keeps them). A half-closed
    /// connection keeps netfilter's 120 s rather than kube-proxy's hour of CLOSE_WAIT:
    /// entries here are per Service connection only, and a peer that half-closes and
    /// keeps sending is refreshed by its own packets. SYN_SENT is Cilium's 60 s: a
    /// SYN retransmitted for longer than that picks again. UDP and the rest follow
    /// netfilter, whose reply-seen rule sliceway copies. SCTP is tracked by who has
    /// spoken, as UDP, not by netfilter's handshake states: an association is
    /// established once the backend answered, with TCP's day for the same reason,
    /// and closed by an ABORT or SHUTDOWN COMPLETE chunk (netfilter's `sctp_timeouts`,
    /// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_proto_sctp.c).
    ///
    /// Sources: netfilter's `tcp_timeouts` and `udp_timeouts`
    /// (https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_proto_tcp.c,
    /// https://github.com/torvalds/linux/blob/v6.18/net/netfilter/nf_conntrack_proto_udp.c),
    /// kube-proxy's defaults
    /// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/v1alpha1/defaults.go),
    /// Cilium's `bpf-ct-timeout-*` flags
    /// (https://github.com/cilium/cilium/blob/main/pkg/defaults/defaults.go).
    pub const DEFAULTS: [u64; state::COUNT as usize] =
        [60, 86_400, 120, 120, 10, 30, 120, 30, 30, 86_400, 10];

    /// Nanoseconds per second.
    pub const NS: u64 = 1_000_000_000;

    /// Whether an entry in `state` last seen at `last_seen_ns` is still alive at
    /// `now_ns`, with `timeout_s` the state's timeout in seconds (at most `u32::MAX`
    /// seconds count, which keeps the product in 64 bits: BPF has no 128-bit multiply).
    #[inline(always)]
    pub fn alive(last_seen_ns: u64, now_ns: u64, timeout_s: u64) -> bool {
        now_ns.saturating_sub(last_seen_ns) < timeout_s.min(u32::MAX as u64) * NS
    }
}

/// Key of the `FRAGMENTS` map: one IPv4 datagram being fragmented (RFC 791: source,
/// destination, protocol and identification name it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct FragKey {
    pub src_be: u32,
    pub dst_be: u32,
    pub id_be: u16,
    pub proto: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<FragKey>() == 12);

/// Value of the `FRAGMENTS` map: the L4 ports the first fragment carried, so later
/// fragments (which carry none) are matched to the same connection.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct FragPorts {
    pub sport_be: u16,
    pub dport_be: u16,
}
const _: () = assert!(size_of::<FragPorts>() == 4);

/// Bytes of a frontend's name kept in the `SERVICE_NAMES` map.
pub const SERVICE_NAME_LEN: usize = 124;

/// Value of the `SERVICE_NAMES` hash map (keyed by frontend id): the Service port's
/// name, `namespace/name:port`, so that `list` and a restarted agent can tell which
/// Service a frontend belongs to. Longer names are cut at `SERVICE_NAME_LEN` bytes.
/// The programs never read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ServiceName {
    pub len: u32,
    pub bytes: [u8; SERVICE_NAME_LEN],
}
const _: () = assert!(size_of::<ServiceName>() == 128);

impl ServiceName {
    pub fn new(name: &str) -> Self {
        let mut bytes = [0u8; SERVICE_NAME_LEN];
        let mut len = name.len().min(SERVICE_NAME_LEN);
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        Self {
            len: len as u32,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        let len = (self.len as usize).min(SERVICE_NAME_LEN);
        core::str::from_utf8(&self.bytes[..len]).unwrap_or("?")
    }
}

/// Key of the `AFFINITY` map: a client address (IPv4 in the first word, the other
/// three zero; room for IPv6) and the frontend it connected to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityKey {
    pub client: [u32; 4],
    pub service_id: u32,
}
const _: () = assert!(size_of::<AffinityKey>() == 20);

/// Value of the `AFFINITY` map: the backend the client was given, in which slot, and
/// when it last opened a connection (CLOCK_MONOTONIC in ns at a tick's resolution).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub slot: u32,
    pub last_ns: u64,
}
const _: () = assert!(size_of::<AffinityValue>() == 16);

/// Key of the `SOCK_REVNAT` map: a socket of the node (its cookie) and the backend
/// the socket programs gave it instead of a frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SockRevKey {
    pub cookie: u64,
    pub addr_be: u32,
    pub port_be: u16,
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockRevKey>() == 16);

/// Value of the `SOCK_REVNAT` map: the frontend the socket asked for, which a
/// datagram's source and the socket's peer name show again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SockRevValue {
    pub addr_be: u32,
    pub port_be: u16,
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockRevValue>() == 8);

/// A `SERVICES` key with port 0 and protocol 0 marks a ClusterIP: traffic to it on a
/// port or protocol no frontend has is rejected (kube-proxy's nftables
/// `cluster-ips` set). Its value has count 0.
pub fn clusterip_marker(addr_be: u32) -> ServiceKey {
    ServiceKey {
        addr_be,
        port_be: 0,
        proto: 0,
        scope: SCOPE_ANY,
    }
}

/// A forward conntrack entry: client → frontend, rewrite the destination.
pub const CT_FORWARD: u8 = 1;
/// A reverse conntrack entry: backend → client, rewrite the source.
pub const CT_REVERSE: u8 = 2;

/// Slots of the per-CPU `STATS` array: every exit of a program is counted once,
/// by verdict and reason. Each slot's constant, its name (what `list` and the
/// metrics print) and its doc comment (the generated exit-reason reference,
/// `docs/reference/exit-reasons.md`) come from one list.
pub mod stat {
    /// Defines the slot constants in order (each `NAME = number`, numbered from 0),
    /// `COUNT`, `NAMES` (the constants' names in lower case) and `DOCS` (their doc
    /// comments, line by line).
    macro_rules! slots {
        ($($(#[doc = $doc:literal])* $name:ident = $n:literal => $text:literal,)*) => {
            $($(#[doc = $doc])* pub const $name: u32 = $n;)*
            /// Number of slots.
            pub const COUNT: u32 = [$($n),*].len() as u32;
            /// Names, indexed by slot, as `list` and metrics print them.
            pub const NAMES: [&str; COUNT as usize] = [$($text),*];
            /// Each slot's doc comment, line by line, indexed by slot.
            pub const DOCS: [&[&str]; COUNT as usize] = [$(&[$($doc),*]),*];
            // The numbers are the slots' places in the list (0, 1, 2, ...) and each
            // name is its constant's in lower case.
            const _: () = {
                let numbers = [$($n),*];
                let idents = [$(stringify!($name)),*];
                let mut i = 0;
                while i < numbers.len() {
                    assert!(numbers[i] as usize == i, "stat slots are numbered in order from 0");
                    let (ident, name) = (idents[i].as_bytes(), NAMES[i].as_bytes());
                    assert!(ident.len() == name.len(), "a stat name is its constant's");
                    let mut j = 0;
                    while j < ident.len() {
                        assert!(ident[j].to_ascii_lowercase() == name[j], "a stat name is its constant's");
                        j += 1;
                    }
                    i += 1;
                }
            };
        };
    }

    slots! {
        /// Neither IPv4 nor IPv6 (or IPv6 whose program could not be reached: the kernel
        /// refused it, or the agent has not loaded it yet): passed untouched.
        PASS_NOT_IPV4 = 0 => "pass_not_ipv4",
        /// Neither TCP, UDP nor SCTP, nor an ICMP or ICMPv6 error about a translated
        /// connection: passed untouched.
        PASS_NOT_L4 = 1 => "pass_not_l4",
        /// A non-first fragment of a datagram whose first fragment was seen, to no
        /// frontend and no tracked connection: passed untouched.
        PASS_FRAGMENT = 2 => "pass_fragment",
        /// Destination is not a frontend and the flow is not a reply: passed.
        PASS_NO_SERVICE = 3 => "pass_no_service",
        /// First packet of a flow: backend chosen, conntrack written, DNAT.
        DNAT_NEW = 4 => "dnat_new",
        /// Later packet of a tracked flow: DNAT to the tracked backend.
        DNAT_ESTABLISHED = 5 => "dnat_established",
        /// Reply from a backend: source rewritten back to the frontend.
        REVNAT = 6 => "revnat",
        /// Frontend with no backend: dropped.
        DROP_NO_BACKEND = 7 => "drop_no_backend",
        /// Truncated or malformed header: dropped.
        DROP_MALFORMED = 8 => "drop_malformed",
        /// A slot or backend entry the service published is missing (the agent is mid
        /// update or a map is inconsistent): dropped rather than sent untranslated.
        DROP_MISSING_BACKEND = 9 => "drop_missing_backend",
        /// A rewrite helper failed: dropped.
        DROP_REWRITE = 10 => "drop_rewrite",
        /// Conntrack insert failed: dropped.
        DROP_CONNTRACK = 11 => "drop_conntrack",
        /// A packet from a backend whose conntrack entry belongs to no live connection
        /// (its forward entry is gone, expired, closed or names another reply tuple):
        /// passed untouched, the stale entry removed.
        PASS_STALE_CONNTRACK = 12 => "pass_stale_conntrack",
        /// A new connection whose reply tuple a live connection holds (two frontends
        /// sharing a backend, one client port) got a source port of its own.
        DNAT_PORT_REMAPPED = 13 => "dnat_port_remapped",
        /// Such a connection for which no free source port was found: dropped.
        DROP_CT_CLASH = 14 => "drop_ct_clash",
        /// A non-first fragment whose first fragment was never seen (its ports unknown),
        /// or whose first fragment made no connection to a frontend or ClusterIP it is
        /// addressed to: dropped, so nothing reaches a VIP untranslated.
        DROP_FRAGMENT_ORPHAN = 15 => "drop_fragment_orphan",
        /// A non-first fragment of a translated datagram: its addresses translated as
        /// the first fragment's were.
        NAT_FRAGMENT = 16 => "nat_fragment",
        /// An ICMP or ICMPv6 error about a translated connection: the quoted packet (and
        /// the error's source, if it was the backend) translated back.
        NAT_ICMP_ERROR = 17 => "nat_icmp_error",
        /// Frontend without endpoints anywhere: ICMP port unreachable sent back.
        REJECT_NO_BACKEND = 18 => "reject_no_backend",
        /// A ClusterIP on a port or protocol its Service does not declare: ICMP port
        /// unreachable sent back.
        REJECT_NO_PORT = 19 => "reject_no_port",
        /// A reject whose reply could not be built (IP options, a helper failed):
        /// dropped instead.
        DROP_REJECT = 20 => "drop_reject",
        /// A socket of the node connected (or sent a datagram) to a frontend and was
        /// given a backend's address instead (the socket programs).
        SOCK_TRANSLATED = 21 => "sock_translated",
        /// A socket of the node connected or sent to a frontend without backends: refused
        /// (`connect` and `sendmsg` fail with EPERM).
        SOCK_REJECT_NO_BACKEND = 22 => "sock_reject_no_backend",
        /// A socket of the node connected or sent to a ClusterIP on a port or protocol
        /// its Service does not declare: refused (EPERM).
        SOCK_REJECT_NO_PORT = 23 => "sock_reject_no_port",
        /// A datagram's source or a socket's peer name shown as the frontend the socket
        /// asked for, not the backend that answered.
        SOCK_REVNAT = 24 => "sock_revnat",
        /// First packet of a connection from outside the node (uplink program): backend
        /// chosen, the source masqueraded to the node's address and a port of its own
        /// (`NatConfig`), DNAT.
        DNAT_MASQUERADED = 25 => "dnat_masqueraded",
        /// Such a connection for which no free source port was found among the tries:
        /// dropped, never sent with a tuple another connection holds.
        DROP_SNAT_EXHAUSTED = 26 => "drop_snat_exhausted",
        /// Such a connection while the agent knows no address of the node: dropped.
        DROP_NO_NODE_ADDR = 27 => "drop_no_node_addr",
        /// A new connection to a load-balancer IP from a source outside its Service's
        /// `loadBalancerSourceRanges`: dropped (kube-proxy's firewall chain).
        DROP_SOURCE_RANGE = 28 => "drop_source_range",
        /// The XDP program left the packet, untouched, to the TC program of its
        /// interface, which counts it again: an ICMP error, SCTP, a packet to reject, or
        /// IPv6 (TC's alone).
        XDP_TO_TC = 29 => "xdp_to_tc",
        /// The uplink's TC program saw a packet the XDP program had decided (and
        /// counted): passed at once.
        PASS_XDP_DECIDED = 30 => "pass_xdp_decided",
        /// A new connection from outside to a frontend with direct server return: sent
        /// on with the client's own address and the frontend in an IPv4 option (IPv6: a
        /// destination options header).
        DNAT_DSR = 31 => "dnat_dsr",
        /// Such a connection could not get its option (the IPv4 header holds too many
        /// options already, or the kernel refused the room; IPv6: the kernel refused
        /// the room): dropped, never sent on without it. Also a packet carrying the option addressed to a frontend or a
        /// ClusterIP (the option comes only on translated packets): dropped, never
        /// passed to the frontend untranslated.
        DROP_DSR_OPTION = 32 => "drop_dsr_option",
        /// A packet with the option, for a pod of this node: its connection recorded, so
        /// the pod's replies leave with the frontend as their source.
        DSR_ACCEPTED = 33 => "dsr_accepted",
        /// A packet with the option that names no frontend of this node, or whose reply
        /// tuple a live connection holds: passed untouched, nothing recorded.
        PASS_DSR_REFUSED = 34 => "pass_dsr_refused",
        /// An IPv6 packet with more extension headers before its transport header than
        /// the programs walk (`IPV6_EXT_MAX`): dropped, never passed to a frontend
        /// untranslated.
        DROP_IPV6_EXT_CHAIN = 35 => "drop_ipv6_ext_chain",
        /// A pod's TCP connect to a frontend with backends, translated at the socket
        /// (`--socket-lb-pods`): its packets go straight to the backend, past the TC
        /// program's translation.
        SOCK_TRANSLATED_POD = 36 => "sock_translated_pod",
    }
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
    /// The XDP program's IPv6 program (tail call, `XDP_JUMP6_*` slots). Not pinned:
    /// the XDP program and its link are the agent's own and go when it exits, so
    /// nothing attached outlives the map.
    pub const XDP_JUMP6: &str = "XDP_JUMP6";

    /// Every map, in the order the agent pins them.
    pub const ALL: [&str; 22] = [
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
    ];
}

/// Layout v1, the previous pinned layout, as far as a v2 agent reads it to migrate
/// (`sliceway-agent` pinned it under `v1/` up to the commit that made conntrack two
/// paired entries). Only conntrack carries state a client would notice losing: v1 had
/// no session affinity, fragment or timeout maps, and its service maps are rewritten
/// from the compiler.
pub mod v1 {
    use super::*;

    /// The layout version these types belong to.
    pub const LAYOUT_VERSION: u32 = 1;

    /// v1's conntrack key: one direction of a flow, IPv4 only. Forward entries are
    /// keyed client → frontend, reverse entries backend → client.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
    pub struct FlowKey {
        pub src_be: u32,
        pub dst_be: u32,
        pub sport_be: u16,
        pub dport_be: u16,
        pub proto: u8,
        pub _pad: [u8; 3],
    }
    const _: () = assert!(size_of::<FlowKey>() == 16);

    /// v1's conntrack value: the address and port to write into the packet (the
    /// backend for a forward entry, the frontend for a reverse one). No state and no
    /// time: v1 entries lived until the LRU evicted them.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
    pub struct NatTarget {
        pub addr_be: u32,
        pub port_be: u16,
        /// [`CT_FORWARD`] or [`CT_REVERSE`].
        pub dir: u16,
        /// v1's frontend id (its own numbering).
        pub service_id: u32,
        /// v1's backend id (its own numbering).
        pub backend_id: u32,
    }
    const _: () = assert!(size_of::<NatTarget>() == 16);

    /// v1's direction values (v2 numbers them differently).
    pub const CT_FORWARD: u16 = 0;
    pub const CT_REVERSE: u16 = 1;

    /// Frontend or backend id of a migrated connection whose frontend or backend the
    /// new agent does not have (removed while no agent ran): a TCP connection keeps
    /// its backend regardless (entries hold addresses); a UDP flow picks again, as
    /// it would after its endpoint's removal.
    pub const UNKNOWN_ID: u32 = u32::MAX;

    impl FlowKey {
        /// The v2 key of the same direction of the flow.
        #[inline(always)]
        pub fn to_v2(&self) -> CtKey {
            CtKey::v4(
                self.src_be,
                self.dst_be,
                self.sport_be,
                self.dport_be,
                self.proto,
            )
        }
    }

    /// The v2 reverse key (backend → client) of the connection whose v1 forward entry
    /// is `key` → `target`. v1 never remapped a client's port.
    #[inline(always)]
    pub fn reply_key(key: &FlowKey, target: &NatTarget) -> CtKey {
        CtKey::v4(
            target.addr_be,
            key.src_be,
            target.port_be,
            key.sport_be,
            key.proto,
        )
    }

    /// The v2 state and flags of a connection taken over from a v1 entry. v1 kept
    /// none; a connection still tracked is taken as answered, so an established TCP
    /// connection stays established (with its timeout) and a later FIN or RST moves
    /// it on as usual. A v1 entry of a connection that had ended is then kept for
    /// the established timeout, as the LRU kept it in v1, unless its tuple is reused.
    #[inline(always)]
    pub fn adopted_state(proto: u8) -> (u8, u8) {
        let s = match proto {
            PROTO_TCP => ct::state::TCP_ESTABLISHED,
            PROTO_UDP => ct::state::UDP_REPLIED,
            PROTO_SCTP => ct::state::SCTP_ESTABLISHED,
            _ => ct::state::OTHER,
        };
        (s, ct::flag::REPLIED)
    }
}

/// Flow hash used to pick a slot for a new flow. Deterministic, so `trace` and tests
/// can predict the choice; well mixed over client ports. Shared by kernel and user
/// space so both compute the same slot.
#[inline(always)]
pub fn flow_hash(src_be: u32, dst_be: u32, sport_be: u16, dport_be: u16, proto: u8) -> u32 {
    let mut h: u32 = 0x9e37_79b9 ^ (proto as u32);
    h = mix(h, src_be);
    h = mix(h, dst_be);
    h = mix(h, ((sport_be as u32) << 16) | dport_be as u32);
    // Final avalanche (murmur3 fmix32).
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

#[inline(always)]
fn mix(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

/// Folds a 32-bit one's-complement sum to 16 bits (not complemented). The sum of
/// native-endian words gives the checksum in native-endian storage order.
#[inline(always)]
pub fn csum_fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// RFC 1624 eqn. 3: a 16-bit one's complement checksum `check` after a 32-bit field
/// it covers changed from `from` to `to`: HC' = ~(~HC + ~m + m'). All three are taken
/// as they lie in the packet (read with native byte order); the one's complement sum
/// does not depend on byte order as long as it is the same for all (RFC 1071).
#[inline(always)]
pub fn csum_replace4(check: u16, from: u32, to: u32) -> u16 {
    let nfrom = !from;
    let sum = (!check) as u32 + (nfrom & 0xffff) + (nfrom >> 16) + (to & 0xffff) + (to >> 16);
    // Two folds bring any sum of five 16-bit words back to 16 bits.
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// RFC 1624 eqn. 3 for a 16-bit field, as [`csum_replace4`].
#[inline(always)]
pub fn csum_replace2(check: u16, from: u16, to: u16) -> u16 {
    let sum = (!check) as u32 + (!from) as u32 + to as u32;
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// RFC 1624's `~m + m'` for a 16-byte field (an IPv6 address, as `CtKey` holds it)
/// that changes from `from` to `to`, over its eight 16-bit words, not folded: the
/// deltas of several fields add up, and [`csum_apply`] applies their sum to every
/// checksum that covers them all.
#[inline(always)]
pub fn csum_delta16(from: &[u32; 4], to: &[u32; 4]) -> u32 {
    let mut sum = 0;
    let mut i = 0;
    while i < 4 {
        let nfrom = !from[i];
        sum += (nfrom & 0xffff) + (nfrom >> 16) + (to[i] & 0xffff) + (to[i] >> 16);
        i += 1;
    }
    sum
}

/// RFC 1624's `~m + m'` for a 16-bit field, as [`csum_delta16`].
#[inline(always)]
pub fn csum_delta2(from: u16, to: u16) -> u32 {
    (!from) as u32 + to as u32
}

/// RFC 1624 eqn. 3 with a summed delta (below 2^31: the deltas of a few dozen
/// fields): HC' = ~(~HC + sum of (~m + m')). As [`csum_replace4`], all as they lie
/// in the packet.
#[inline(always)]
pub fn csum_apply(check: u16, delta: u32) -> u16 {
    !csum_fold((!check) as u32 + delta)
}

/// SCTP's checksum, CRC32c (RFC 9260, appendix A: the Castagnoli polynomial,
/// reflected, stored little-endian), updated for a changed port without reading the
/// payload.
///
/// A CRC is linear: for two messages of one length, `crc(a) ^ crc(b)` is the CRC with
/// zero initial value and no final XOR of `a ^ b`, which here is zero except for the
/// two bytes of a port. Its register after those two bytes is carried through the
/// `after` zero bytes that follow by a multiplication with x^(8·after) modulo the
/// polynomial (as zlib's `crc32_combine` does), taken from two tables of 256 powers
/// each. The cost is two fixed 32-step multiplications, whatever the packet's length.
pub mod crc32c {
    /// The polynomial, reflected.
    pub const POLY: u32 = 0x82f6_3b78;
    /// x^0 in the reflected representation (the coefficient of x^i is bit 31 - i).
    const ONE: u32 = 0x8000_0000;
    /// x^8: one byte's shift.
    const X8: u32 = ONE >> 8;

    /// `b · x` modulo the polynomial.
    #[inline(always)]
    const fn times_x(b: u32) -> u32 {
        (b >> 1) ^ (POLY & 0u32.wrapping_sub(b & 1))
    }

    /// `a · b` modulo the polynomial, for the tables (evaluated by the compiler).
    const fn mul_const(a: u32, b: u32) -> u32 {
        let mut p = 0u32;
        let mut b = b;
        let mut i = 0;
        while i < 32 {
            p ^= b & 0u32.wrapping_sub((a >> (31 - i)) & 1);
            b = times_x(b);
            i += 1;
        }
        p
    }

    /// All-zero or all-one masks, read through memory: the verifier forks its state
    /// on an AND of a value it knows is 0 or -1 (the branch-free select the compiler
    /// makes of `0 - bit`), 2^64 paths for a multiplication; a value loaded from a
    /// table it does not know, so one path.
    static SELECT: [u32; 2] = [0, u32::MAX];

    #[inline(always)]
    fn select(bit: u32) -> u32 {
        // SAFETY: an index of 0 or 1 into a two-element static.
        unsafe { core::ptr::read_volatile(&SELECT[(bit & 1) as usize]) }
    }

    /// `a · b` modulo the polynomial, in 32 steps without branches.
    #[inline(always)]
    pub fn mul(a: u32, b: u32) -> u32 {
        let mut p = 0u32;
        let mut b = b;
        let mut i = 0;
        while i < 32 {
            p ^= b & select(a >> (31 - i));
            b = (b >> 1) ^ (POLY & select(b));
            i += 1;
        }
        p
    }

    /// The CRC register (zero initial value) after the byte `d`.
    #[inline(always)]
    fn byte(reg: u32, d: u8) -> u32 {
        let mut r = reg ^ d as u32;
        let mut i = 0;
        while i < 8 {
            r = (r >> 1) ^ (POLY & select(r));
            i += 1;
        }
        r
    }

    const fn powers(step: u32) -> [u32; 256] {
        let mut t = [0u32; 256];
        t[0] = ONE;
        let mut i = 1;
        while i < 256 {
            t[i] = mul_const(t[i - 1], step);
            i += 1;
        }
        t
    }

    /// x^(8·i) for i < 256.
    pub static POW_LO: [u32; 256] = powers(X8);
    /// x^(8·256·j) for j < 256.
    pub static POW_HI: [u32; 256] = powers(mul_const(powers(X8)[255], X8));

    /// The XOR that turns the checksum (as a little-endian `u32`) of an SCTP packet
    /// into the one of the same packet with the two bytes `old` replaced by `new`,
    /// when `after` bytes of the packet follow them (`after` < 65,536).
    #[inline(always)]
    pub fn port_delta(old: [u8; 2], new: [u8; 2], after: usize) -> u32 {
        let reg = byte(byte(0, old[0] ^ new[0]), old[1] ^ new[1]);
        let n = after & 0xffff;
        mul(mul(reg, POW_LO[n & 0xff]), POW_HI[n >> 8])
    }
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    /// `T` is `bytemuck::Pod` (checked by the compiler where this is called).
    const fn is_pod<T: bytemuck::Pod>() {}

    /// `aya::Pod` for map types that are `bytemuck::Pod`.
    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            const _: () = is_pod::<$t>();
            // SAFETY: `$t` is `bytemuck::Pod` (the line above does not compile
            // otherwise): `#[repr(C)]`, no padding, every bit pattern valid, which is
            // what aya needs to copy it to and from a map as bytes.
            unsafe impl aya::Pod for $t {}
        )*};
    }

    aya_pod!(
        ServiceKey,
        ServiceValue,
        SlotKey,
        Backend,
        CtKey,
        CtEntry,
        FragKey,
        FragPorts,
        ServiceName,
        AffinityKey,
        AffinityValue,
        FrontendCounters,
        BackendCounters,
        NatConfig,
        SourceRange,
        v1::FlowKey,
        v1::NatTarget,
        // IPv6's map types (v6.rs).
        ServiceKey6,
        Backend6,
        FragKey6,
        NatConfig6,
        SourceRange6,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;

    /// CRC32c of `data` with the checksum field (bytes 8..12) taken as zero, as
    /// RFC 9260 computes it, bit by bit.
    fn sctp_crc(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for (i, &b) in data.iter().enumerate() {
            crc ^= if (8..12).contains(&i) { 0 } else { b as u32 };
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ crc32c::POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn crc32c_matches_rfc_3720s_test_vector() {
        // RFC 3720, B.4: 32 bytes of zeros have CRC32c 0x8a9136aa (stored aa 36 91 8a).
        let mut crc = !0u32;
        for _ in 0..32 {
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ crc32c::POLY
                } else {
                    crc >> 1
                };
            }
        }
        assert_eq!(!crc, 0x8a91_36aa);
    }

    /// A linear congruential generator from `seed` (Numerical Recipes' constants):
    /// test data that is the same on every run.
    fn lcg(seed: u32) -> impl FnMut() -> u32 {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state
        }
    }

    #[test]
    fn sctp_port_delta_matches_a_full_recompute() {
        let mut next = lcg(0x9e37_79b9);
        for round in 0..400 {
            // Lengths from the bare common header to a jumbo frame and the 16-bit limit.
            let len = match round % 4 {
                0 => 12 + (next() as usize % 64),
                1 => 12 + (next() as usize % 9000),
                2 => 65_535 - 20,
                _ => 12,
            };
            let mut pkt: std::vec::Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let crc = sctp_crc(&pkt);
            pkt[8..12].copy_from_slice(&crc.to_le_bytes());
            for at in [0usize, 2] {
                let old = [pkt[at], pkt[at + 1]];
                let new = (next() as u16).to_be_bytes();
                let field = u32::from_le_bytes([pkt[8], pkt[9], pkt[10], pkt[11]]);
                let updated = field ^ crc32c::port_delta(old, new, len - at - 2);
                pkt[at..at + 2].copy_from_slice(&new);
                assert_eq!(updated, sctp_crc(&pkt), "length {len}, port at {at}");
                pkt[8..12].copy_from_slice(&updated.to_le_bytes());
            }
        }
    }

    /// The checksum of 16-bit big-endian words, computed from scratch.
    fn full(words: &[u16]) -> u16 {
        let mut sum: u32 = words.iter().map(|&w| w as u32).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn incremental_checksum_matches_a_full_recompute() {
        // An IPv4 header's words with the checksum field zeroed; the destination
        // address (words 8 and 9) is rewritten to many values.
        let mut words = [
            0x4500, 0x003c, 0x1c46, 0x4000, 0x4006, 0x0000, 0x0a00, 0x0001, 0x0a60, 0x000a,
        ];
        let mut check = full(&words);
        let mut state = 0x1234_5678u32;
        for _ in 0..10_000 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let to_host = match state % 4 {
                0 => 0,
                1 => u32::MAX,
                _ => state,
            };
            let from_host = ((words[8] as u32) << 16) | words[9] as u32;
            // As the program sees them: bytes in packet order, read natively.
            let le = |w: u16| u16::from_ne_bytes(w.to_be_bytes());
            let le32 = |v: u32| u32::from_ne_bytes(v.to_be_bytes());
            let got = csum_replace4(le(check), le32(from_host), le32(to_host));
            words[8] = (to_host >> 16) as u16;
            words[9] = to_host as u16;
            let want = full(&words);
            let got = u16::from_be_bytes(got.to_ne_bytes());
            // 0x0000 and 0xffff are the same one's complement value.
            assert!(
                got == want || (got, want) == (0xffff, 0) || (got, want) == (0, 0xffff),
                "{got:#06x} != {want:#06x} after rewriting to {to_host:#010x}"
            );
            check = want;
        }
    }

    #[test]
    fn summed_deltas_of_addresses_and_ports_match_a_full_recompute() {
        // An IPv6 pseudo-header and a UDP header: source, destination, length, next
        // header, ports, length, checksum (word 22 zeroed); both addresses and both
        // ports are rewritten at once, as an ICMPv6 error's quote is.
        let mut next = lcg(0x0bad_cafe);
        let le = |w: u16| u16::from_ne_bytes(w.to_be_bytes());
        // Eight words of an address as the program holds it: four native reads.
        let addr = |w: &[u16]| -> [u32; 4] {
            core::array::from_fn(|i| {
                let [a, b] = w[2 * i].to_be_bytes();
                let [c, d] = w[2 * i + 1].to_be_bytes();
                u32::from_ne_bytes([a, b, c, d])
            })
        };
        for round in 0..5_000 {
            let mut words: [u16; 24] = core::array::from_fn(|_| next() as u16);
            words[16] = 0;
            words[17] = 16;
            words[18] = 0;
            words[19] = 17;
            words[22] = 0;
            let check = full(&words);
            let old = words;
            for i in (0..16).chain(20..22) {
                words[i] = match round % 3 {
                    0 => next() as u16,
                    1 => 0,
                    _ => 0xffff,
                };
            }
            let delta = csum_delta16(&addr(&old[..8]), &addr(&words[..8]))
                + csum_delta16(&addr(&old[8..16]), &addr(&words[8..16]))
                + csum_delta2(le(old[20]), le(words[20]))
                + csum_delta2(le(old[21]), le(words[21]));
            let got = u16::from_be_bytes(csum_apply(le(check), delta).to_ne_bytes());
            let want = full(&words);
            assert!(
                got == want || (got, want) == (0xffff, 0) || (got, want) == (0, 0xffff),
                "{got:#06x} != {want:#06x} in round {round}"
            );
        }
    }
}

//! Counters: per frontend (`FRONTEND_COUNTERS`), per backend (`BACKEND_COUNTERS`),
//! and every exit of a program by verdict and reason (`STATS`).

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

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

/// Slots of the per-CPU `STATS` array: every exit of a program is counted once,
/// by verdict and reason.
pub mod stat {
    /// Neither IPv4 nor IPv6 (or IPv6 whose program could not be reached: the kernel
    /// refused it, or the agent has not loaded it yet): passed untouched.
    pub const PASS_NOT_IPV4: u32 = 0;
    /// Neither TCP, UDP nor SCTP, nor an ICMP or ICMPv6 error about a translated
    /// connection: passed untouched.
    pub const PASS_NOT_L4: u32 = 1;
    /// A non-first fragment of a datagram whose first fragment was seen, to no
    /// frontend and no tracked connection: passed untouched.
    pub const PASS_FRAGMENT: u32 = 2;
    /// Destination is not a frontend and the flow is not a reply: passed.
    pub const PASS_NO_SERVICE: u32 = 3;
    /// First packet of a flow: backend chosen, conntrack written, DNAT.
    pub const DNAT_NEW: u32 = 4;
    /// Later packet of a tracked flow: DNAT to the tracked backend.
    pub const DNAT_ESTABLISHED: u32 = 5;
    /// Reply from a backend: source rewritten back to the frontend.
    pub const REVNAT: u32 = 6;
    /// Frontend with no backend: dropped.
    pub const DROP_NO_BACKEND: u32 = 7;
    /// Truncated or malformed header: dropped.
    pub const DROP_MALFORMED: u32 = 8;
    /// A slot or backend entry the service published is missing (the agent is mid
    /// update or a map is inconsistent): dropped rather than sent untranslated.
    pub const DROP_MISSING_BACKEND: u32 = 9;
    /// A rewrite helper failed: dropped.
    pub const DROP_REWRITE: u32 = 10;
    /// Conntrack insert failed: dropped.
    pub const DROP_CONNTRACK: u32 = 11;
    /// A packet from a backend whose conntrack entry belongs to no live connection
    /// (its forward entry is gone, expired, closed or names another reply tuple):
    /// passed untouched, the stale entry removed.
    pub const PASS_STALE_CONNTRACK: u32 = 12;
    /// A new connection whose reply tuple a live connection holds (two frontends
    /// sharing a backend, one client port) got a source port of its own.
    pub const DNAT_PORT_REMAPPED: u32 = 13;
    /// Such a connection for which no free source port was found: dropped.
    pub const DROP_CT_CLASH: u32 = 14;
    /// A non-first fragment whose first fragment was never seen (its ports unknown),
    /// or whose first fragment made no connection to a frontend or ClusterIP it is
    /// addressed to: dropped, so nothing reaches a VIP untranslated.
    pub const DROP_FRAGMENT_ORPHAN: u32 = 15;
    /// A non-first fragment of a translated datagram: its addresses translated as
    /// the first fragment's were.
    pub const NAT_FRAGMENT: u32 = 16;
    /// An ICMP or ICMPv6 error about a translated connection: the quoted packet (and
    /// the error's source, if it was the backend) translated back.
    pub const NAT_ICMP_ERROR: u32 = 17;
    /// Frontend without endpoints anywhere: ICMP port unreachable sent back.
    pub const REJECT_NO_BACKEND: u32 = 18;
    /// A ClusterIP on a port or protocol its Service does not declare: ICMP port
    /// unreachable sent back.
    pub const REJECT_NO_PORT: u32 = 19;
    /// A reject whose reply could not be built (IP options, a helper failed):
    /// dropped instead.
    pub const DROP_REJECT: u32 = 20;
    /// A socket of the node connected (or sent a datagram) to a frontend and was
    /// given a backend's address instead (the socket programs).
    pub const SOCK_TRANSLATED: u32 = 21;
    /// A socket of the node connected or sent to a frontend without backends: refused
    /// (`connect` and `sendmsg` fail with EPERM).
    pub const SOCK_REJECT_NO_BACKEND: u32 = 22;
    /// A socket of the node connected or sent to a ClusterIP on a port or protocol
    /// its Service does not declare: refused (EPERM).
    pub const SOCK_REJECT_NO_PORT: u32 = 23;
    /// A datagram's source or a socket's peer name shown as the frontend the socket
    /// asked for, not the backend that answered.
    pub const SOCK_REVNAT: u32 = 24;
    /// First packet of a connection from outside the node (uplink program): backend
    /// chosen, the source masqueraded to the node's address and a port of its own
    /// (`NatConfig`), DNAT.
    pub const DNAT_MASQUERADED: u32 = 25;
    /// Such a connection for which no free source port was found among the tries:
    /// dropped, never sent with a tuple another connection holds.
    pub const DROP_SNAT_EXHAUSTED: u32 = 26;
    /// Such a connection while the agent knows no address of the node: dropped.
    pub const DROP_NO_NODE_ADDR: u32 = 27;
    /// A new connection to a load-balancer IP from a source outside its Service's
    /// `loadBalancerSourceRanges`: dropped (kube-proxy's firewall chain).
    pub const DROP_SOURCE_RANGE: u32 = 28;
    /// The XDP program left the packet, untouched, to the TC program of its
    /// interface, which counts it again: an ICMP error, SCTP, a packet to reject, or
    /// IPv6 (TC's alone).
    pub const XDP_TO_TC: u32 = 29;
    /// The uplink's TC program saw a packet the XDP program had decided (and
    /// counted): passed at once.
    pub const PASS_XDP_DECIDED: u32 = 30;
    /// A new connection from outside to a frontend with direct server return: sent
    /// on with the client's own address and the frontend in an IPv4 option (IPv6: a
    /// destination options header).
    pub const DNAT_DSR: u32 = 31;
    /// Such a connection could not get its option (the IPv4 header holds too many
    /// options already, or the kernel refused the room; IPv6: the kernel refused
    /// the room): dropped, never sent on without it. Also a packet carrying the option addressed to a frontend or a
    /// ClusterIP (the option comes only on translated packets): dropped, never
    /// passed to the frontend untranslated.
    pub const DROP_DSR_OPTION: u32 = 32;
    /// A packet with the option, for a pod of this node: its connection recorded, so
    /// the pod's replies leave with the frontend as their source.
    pub const DSR_ACCEPTED: u32 = 33;
    /// A packet with the option that names no frontend of this node, or whose reply
    /// tuple a live connection holds: passed untouched, nothing recorded.
    pub const PASS_DSR_REFUSED: u32 = 34;
    /// An IPv6 packet with more extension headers before its transport header than
    /// the programs walk (`IPV6_EXT_MAX`): dropped, never passed to a frontend
    /// untranslated.
    pub const DROP_IPV6_EXT_CHAIN: u32 = 35;
    /// A pod's TCP connect to a frontend with backends, translated at the socket
    /// (`--socket-lb-pods`): its packets go straight to the backend, past the TC
    /// program's translation.
    pub const SOCK_TRANSLATED_POD: u32 = 36;
    /// Number of slots.
    pub const COUNT: u32 = 37;

    /// Names, indexed by slot, as `list` and metrics print them.
    pub const NAMES: [&str; COUNT as usize] = [
        "pass_not_ipv4",
        "pass_not_l4",
        "pass_fragment",
        "pass_no_service",
        "dnat_new",
        "dnat_established",
        "revnat",
        "drop_no_backend",
        "drop_malformed",
        "drop_missing_backend",
        "drop_rewrite",
        "drop_conntrack",
        "pass_stale_conntrack",
        "dnat_port_remapped",
        "drop_ct_clash",
        "drop_fragment_orphan",
        "nat_fragment",
        "nat_icmp_error",
        "reject_no_backend",
        "reject_no_port",
        "drop_reject",
        "sock_translated",
        "sock_reject_no_backend",
        "sock_reject_no_port",
        "sock_revnat",
        "dnat_masqueraded",
        "drop_snat_exhausted",
        "drop_no_node_addr",
        "drop_source_range",
        "xdp_to_tc",
        "pass_xdp_decided",
        "dnat_dsr",
        "drop_dsr_option",
        "dsr_accepted",
        "pass_dsr_refused",
        "drop_ipv6_ext_chain",
        "sock_translated_pod",
    ];
}

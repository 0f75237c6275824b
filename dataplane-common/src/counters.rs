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
        /// A reply leaving the node's own stack toward a pod or an uplink (egress
        /// program) from a backend in the host network of this node: its source
        /// rewritten back to the frontend.
        REVNAT_EGRESS = 37 => "revnat_egress",
        /// A packet at egress of a pod's interface or an uplink that is no reply of a
        /// connection to a host-network backend of this node, nor addressed to an
        /// unallocated address of a ServiceCIDR: passed untouched.
        PASS_EGRESS = 38 => "pass_egress",
        /// A new packet (no connection) from a pod, from outside or from the node's
        /// own stack to an address inside a ServiceCIDR that no Service holds as its
        /// ClusterIP: dropped, as kube-proxy's nftables mode drops it ("Drop traffic
        /// to unallocated ClusterIPs"). Never counted without a ServiceCIDR.
        DROP_UNALLOCATED_CLUSTERIP = 39 => "drop_unallocated_clusterip",
        /// XDP forwarding (`--xdp-forward`), counted besides the translation that
        /// came first (`dnat_*`, `revnat`): the translated frame sent back out of the
        /// uplink it came in on (`XDP_TX`; on a veth, `XDP_REDIRECT` to itself), with
        /// the next hop's MAC addresses from the kernel's FIB and its TTL or hop
        /// limit lowered, as the kernel forwards it.
        XDP_TX = 40 => "xdp_tx",
        /// As `xdp_tx`, out of another uplink the XDP program forwards to
        /// (`XDP_REDIRECT` through `XDP_FORWARD`).
        XDP_REDIRECT = 41 => "xdp_redirect",
        /// XDP forwarding found the route but no neighbour entry for its next hop:
        /// the translated frame passed to the kernel's stack, which resolves the
        /// neighbour and forwards it (later frames go by XDP).
        XDP_PASS_NO_NEIGH = 42 => "xdp_pass_no_neigh",
        /// XDP forwarding's FIB lookup answered other than "forward" (no route,
        /// blackhole, unreachable, prohibit, a local address, forwarding disabled on
        /// the interface, a tunnel route): the translated frame passed to the stack,
        /// which decides it as it would have.
        XDP_PASS_FIB = 43 => "xdp_pass_fib",
        /// XDP forwarding's frame is longer than the route's MTU: passed to the stack,
        /// which fragments it or answers "fragmentation needed".
        XDP_PASS_MTU = 44 => "xdp_pass_mtu",
        /// XDP forwarding's frame has a TTL or hop limit of 1 or less: passed to the
        /// stack, which answers "time exceeded".
        XDP_PASS_TTL = 45 => "xdp_pass_ttl",
        /// XDP forwarding's frame needs the stack: a fragment, IPv4 options, or IPv6
        /// extension headers. Passed.
        XDP_PASS_STACK = 46 => "xdp_pass_stack",
        /// XDP forwarding's route leaves through an interface the XDP program does not
        /// forward to (a pod's interface, an uplink without the XDP program): passed
        /// to the stack.
        XDP_PASS_EGRESS = 47 => "xdp_pass_egress",
    }
}

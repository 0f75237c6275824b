//! The `CONNTRACK` map: the two entries of a connection, their states, flags and
//! idle timeouts.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

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

/// A forward conntrack entry: client → frontend, rewrite the destination.
pub const CT_FORWARD: u8 = 1;
/// A reverse conntrack entry: backend → client, rewrite the source.
pub const CT_REVERSE: u8 = 2;

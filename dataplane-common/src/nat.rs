//! Translation beside DNAT: masquerade of connections from outside the node
//! (`NAT_CONFIG`), the source a hairpin connection is given, and direct server
//! return's IPv4 option.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

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

/// Direct server return: the IPv4 option with which the node a connection from
/// outside arrives at tells the backend's node the frontend the client addressed, so
/// the backend's replies leave from that node with the frontend as their source.
/// Option 30 with the copied flag (0x80 | 30): the experimental value of RFC 4727
/// (https://www.rfc-editor.org/rfc/rfc4727#section-2.4), never given to anything
/// else. Eight bytes: type, length, the frontend's port, then its address (both in
/// network byte order). IPv6 carries the same in a destination options header
/// ([`dsr6`](crate::dsr6)).
pub mod dsr {
    pub const OPT_TYPE: u8 = 0x9e;
    pub const OPT_LEN: u8 = 8;
    /// Offset of the option from the IPv4 header: right after its fixed 20 bytes,
    /// where `bpf_skb_adjust_room` makes room, before any options the packet had.
    pub const OPT_OFF: usize = 20;
}

//! IPv6's map types. IPv6 has maps of its own beside IPv4's (`SERVICES6`,
//! `BACKENDS6`, `FRAGMENTS6`, `NAT_CONFIG6`, `SOURCE_RANGES6`), so IPv4's entries keep
//! their size (an IPv4 frontend key is 8 bytes, an IPv6 one 20) and each lookup stays
//! one hash of its own family's key. What the families share is keyed by ids or
//! already has room for 16 bytes: frontend ids and backend ids come from one id space
//! each (`SLOTS`, the counters and `SERVICE_NAMES` serve both; a backend id is in
//! `BACKENDS` or in `BACKENDS6`, never both), and `CONNTRACK` and `AFFINITY` keys
//! carry a family and 16-byte addresses. Adding maps changes no existing one's
//! layout: an agent of the same layout version without them ignores them.
//!
//! Bytes per entry (key + value, before the kernel's own per-entry cost): `SERVICES6`
//! 20 + 16, `BACKENDS6` 4 + 20, `FRAGMENTS6` 40 + 4, `SOURCE_RANGES6` 4 + 36 + 1,
//! `SOCK_REVNAT6` 32 + 20, `SERVICE_CIDRS6` 4 + 16 + 1.
//!
//! Addresses are four words in network byte order, as `CtKey` has them: the first
//! word holds the address's first four bytes.

use super::*;

/// An IPv6 address as the maps hold it, from its 16 bytes in network order.
#[inline(always)]
pub fn addr_of(octets: [u8; 16]) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([octets[i], octets[i + 1], octets[i + 2], octets[i + 3]]);
    [w(0), w(4), w(8), w(12)]
}

/// The 16 bytes of an address the maps hold, in network order.
#[inline(always)]
pub fn octets_of(addr_be: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let b = addr_be[i].to_ne_bytes();
        out[i * 4] = b[0];
        out[i * 4 + 1] = b[1];
        out[i * 4 + 2] = b[2];
        out[i * 4 + 3] = b[3];
        i += 1;
    }
    out
}

/// Key of the `SERVICES6` hash map: one IPv6 frontend. The value is a
/// [`ServiceValue`], as IPv4's, with ids from the same space.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct ServiceKey6 {
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub proto: u8,
    /// [`SCOPE_ANY`] or [`SCOPE_EXTERNAL`], as IPv4's.
    pub scope: u8,
}
const _: () = assert!(size_of::<ServiceKey6>() == 20);

/// The `SERVICES6` key with port 0 and protocol 0 that marks an IPv6 ClusterIP, as
/// [`clusterip_marker`] does for IPv4.
#[inline(always)]
pub fn clusterip_marker6(addr_be: [u32; 4]) -> ServiceKey6 {
    ServiceKey6 {
        addr_be,
        port_be: 0,
        proto: 0,
        scope: SCOPE_ANY,
    }
}

/// Value of the `BACKENDS6` hash map (keyed by backend id, a `u32`, from the same
/// space as `BACKENDS`' ids): an IPv6 endpoint.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct Backend6 {
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub proto: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<Backend6>() == 20);

/// Key of the `FRAGMENTS6` map: one IPv6 datagram being fragmented (RFC 8200, 4.5:
/// source, destination and the Fragment header's 32-bit identification name it; the
/// protocol is the one after the Fragment header). The value is a [`FragPorts`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct FragKey6 {
    pub src_be: [u32; 4],
    pub dst_be: [u32; 4],
    pub id_be: u32,
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<FragKey6>() == 40);

/// The uplink program's IPv6 masquerade settings (`NAT_CONFIG6`, one entry), as
/// [`NatConfig`] for IPv4: the node's IPv6 address (zero: unknown, a connection that
/// needs it is dropped) and the source ports it may give connections.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct NatConfig6 {
    pub node_addr_be: [u32; 4],
    pub port_min: u16,
    pub port_max: u16,
}
const _: () = assert!(size_of::<NatConfig6>() == 20);

/// What the `SOURCE_RANGES6` longest-prefix-match map matches on, as
/// [`SourceRange`] for IPv4: an IPv6 frontend (its `SCOPE_ANY` key) and a source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SourceRange6 {
    pub frontend: ServiceKey6,
    pub src_be: [u32; 4],
}
const _: () = assert!(size_of::<SourceRange6>() == 36);

impl SourceRange6 {
    /// Bits of the key before the source address.
    pub const FRONTEND_BITS: u32 = 160;
    /// The prefix length of a lookup: the whole key.
    pub const LOOKUP_BITS: u32 = 288;

    /// The data of range `addr_be/len` of `frontend`, or of a lookup of source
    /// `addr_be`; the prefix length goes beside it.
    #[inline(always)]
    pub fn of(frontend: ServiceKey6, addr_be: [u32; 4]) -> Self {
        Self {
            frontend: ServiceKey6 {
                scope: SCOPE_ANY,
                ..frontend
            },
            src_be: addr_be,
        }
    }
}

/// The source an IPv6 hairpin connection is given (see [`HAIRPIN_ADDR_BE`]):
/// `100::5c1c:1`, in RFC 6666's discard-only prefix `100::/64`, which is never
/// assigned to a host, so never a pod's; the pod's reply goes by its default route
/// to the node, where it is translated back before any route is looked up.
pub const HAIRPIN6_ADDR_BE: [u32; 4] = [
    u32::from_ne_bytes([0x01, 0x00, 0, 0]),
    0,
    0,
    u32::from_ne_bytes([0x5c, 0x1c, 0, 1]),
];

/// The client address an IPv6 connection's reply tuple names: the client's own, or
/// [`HAIRPIN6_ADDR_BE`] for a pod that reached itself.
#[inline(always)]
pub fn reply_client6(client_be: [u32; 4], backend_be: [u32; 4]) -> [u32; 4] {
    if client_be == backend_be {
        HAIRPIN6_ADDR_BE
    } else {
        client_be
    }
}

/// The most IPv6 extension headers the programs walk before the transport header
/// (hop-by-hop, routing, destination options, fragment; RFC 8200 recommends at most
/// one of each but a destination options header twice). A longer chain is dropped
/// and counted (`stat::DROP_IPV6_EXT_CHAIN`), never passed to a frontend untranslated.
pub const IPV6_EXT_MAX: usize = 6;

/// Slots of the `JUMP6` program array: the IPv6 programs the entry programs hand an
/// IPv6 packet to (so IPv4's programs keep their frame and verifier cost), their
/// reject programs and their ICMPv6 error programs. A slot left empty (a kernel that
/// refused the IPv6 programs) passes IPv6 untouched, counted `pass_not_ipv4`; an
/// empty ICMPv6 slot passes ICMPv6 untouched, counted `pass_not_l4`; with an empty
/// direct server return slot a new connection is dropped (`drop_dsr_option`) and a
/// packet carrying the header passes unrecorded (`pass_dsr_refused`), as with
/// IPv4's `JUMP_DSR`.
pub const JUMP6_SLOTS: u32 = 11;
/// `sliceway_tc6`, reached from `sliceway_tc`.
pub const JUMP6_TC: u32 = 0;
/// `sliceway_ext6`, reached from `sliceway_tc_ext`.
pub const JUMP6_EXT: u32 = 1;
/// `sliceway_l3_6`, reached from `sliceway_l3`.
pub const JUMP6_L3: u32 = 2;
/// `sliceway_l3ext6`, reached from `sliceway_l3_ext`.
pub const JUMP6_L3_EXT: u32 = 3;
/// `sliceway_rej6`: ICMPv6 port unreachable, behind an Ethernet header.
pub const JUMP6_REJECT: u32 = 4;
/// `sliceway_rej6_l3`: the same without one.
pub const JUMP6_REJECT_L3: u32 = 5;
/// `sliceway_icmp6`: ICMPv6 errors about translated connections, translated back;
/// behind an Ethernet header.
pub const JUMP6_ICMP: u32 = 6;
/// `sliceway_icmp6_l3`: the same without one.
pub const JUMP6_ICMP_L3: u32 = 7;
/// `sliceway_dsr6`: direct server return's destination options header ([`dsr6`]),
/// for interfaces with and without an Ethernet header alike (the offset of the IPv6
/// header comes with the handover).
pub const JUMP6_DSR: u32 = 8;
/// `sliceway_out6`, reached from `sliceway_tc_out` (egress).
pub const JUMP6_OUT: u32 = 9;
/// `sliceway_l3out6`, reached from `sliceway_l3_out`.
pub const JUMP6_L3_OUT: u32 = 10;

/// Direct server return over IPv6 (`--external-mode dsr`, [`crate::SVC_F_DSR`]):
/// what IPv4's option ([`crate::dsr`]) says, in a Destination Options extension
/// header (RFC 8200, 4.6: next header 60) the first node puts right after the fixed
/// IPv6 header, as Cilium's DSR does for IPv6 (`dsr_set_ext6`,
/// https://github.com/cilium/cilium/blob/main/bpf/lib/nodeport.h). 24 bytes, a
/// multiple of 8 as RFC 8200, 4.6 asks:
///
/// ```text
///  0: next header (the packet's before)  1: length, 8-byte units after the first 8: 2
///  2: option type OPT_TYPE               3: option data length: 18
///  4: the frontend's address (16)       20: the frontend's port (2)
/// 22: PadN with no data (type 1, length 0: two bytes, RFC 8200, 4.2)
/// ```
///
/// The option type is 0x1e, an RFC 3692-style experimental value of RFC 4727
/// (https://www.iana.org/assignments/ipv6-parameters/ipv6-parameters.xhtml#ipv6-parameters-2),
/// never given to anything else, as IPv4's option is (Cilium uses 0x1b,
/// unassigned). Its two high-order bits are 00, "skip over
/// this option and continue processing the header" if unrecognized (RFC 8200, 4.2,
/// https://www.rfc-editor.org/rfc/rfc8200#section-4.2): the header is left on the
/// packet, and the pod's kernel, which knows nothing of it, must accept the packet
/// all the same (any other action discards it, with or without an ICMPv6 error). The
/// third bit is 0: the data does not change on the way.
pub mod dsr6 {
    pub const OPT_TYPE: u8 = 0x1e;
    /// The option's data: the frontend's address and port.
    pub const OPT_DATA_LEN: u8 = 18;
    /// The whole header, in bytes.
    pub const HDR_LEN: usize = 24;
    /// The header's length field: 8-byte units not counting the first 8.
    pub const HDR_EXT_LEN: u8 = ((HDR_LEN - 8) / 8) as u8;
    /// PadN (RFC 8200, 4.2), here with no data bytes: two bytes of padding.
    pub const PADN: u8 = 1;
    /// Offsets in the header.
    pub const ADDR_OFF: usize = 4;
    pub const PORT_OFF: usize = 20;
    pub const PAD_OFF: usize = 22;
    const _: () = assert!(HDR_LEN.is_multiple_of(8));
    const _: () = assert!(PAD_OFF + 2 == HDR_LEN);
    const _: () = assert!(2 + OPT_DATA_LEN as usize == PAD_OFF - 2);
}

/// Slots of the `XDP_JUMP6` program array: an XDP program can tail-call XDP
/// programs only, so `sliceway_xdp` hands IPv6 to its IPv6 program through a map of
/// its own. An empty slot (a kernel that refused the program) leaves IPv6 to the
/// uplink's TC program, untouched, counted `xdp_to_tc`.
pub const XDP_JUMP6_SLOTS: u32 = 1;
/// `sliceway_xdp6`, reached from `sliceway_xdp`.
pub const XDP_JUMP6_EXT: u32 = 0;

/// [`flow_hash`] of an IPv6 flow: each address folded to one word (XOR of its four)
/// first, so a flow's slot is as cheap to find as an IPv4 one's.
#[inline(always)]
pub fn flow_hash6(
    src_be: [u32; 4],
    dst_be: [u32; 4],
    sport_be: u16,
    dport_be: u16,
    proto: u8,
) -> u32 {
    let fold = |a: [u32; 4]| a[0] ^ a[1] ^ a[2] ^ a[3];
    flow_hash(fold(src_be), fold(dst_be), sport_be, dport_be, proto)
}

/// Protocol numbers of IPv6 (RFC 8200, 4; IANA's protocol numbers).
pub const PROTO_ICMPV6: u8 = 58;
pub const IPV6_HOP_BY_HOP: u8 = 0;
pub const IPV6_ROUTING: u8 = 43;
pub const IPV6_FRAGMENT: u8 = 44;
pub const IPV6_DEST_OPTS: u8 = 60;

/// IPv6's capacity defaults; the agent may size them differently at load time.
pub mod capacity6 {
    /// IPv6 frontends and ClusterIP markers.
    pub const SERVICES6: u32 = 65_536;
    /// Distinct IPv6 backends.
    pub const BACKENDS6: u32 = 131_072;
    /// IPv6 datagrams being fragmented at once; LRU.
    pub const FRAGMENTS6: u32 = 4_096;
    /// IPv6 `loadBalancerSourceRanges` entries.
    pub const SOURCE_RANGES6: u32 = 8_192;
    /// Translations the node's own IPv6 sockets made (`SOCK_REVNAT6`); LRU. Half of
    /// IPv4's: its entries are three times the size, and IPv4-only nodes allocate
    /// it too.
    pub const SOCK_REVNAT6: u32 = 32_768;
    /// IPv6 prefixes of ServiceCIDR objects (`SERVICE_CIDRS6`).
    pub const SERVICE_CIDRS6: u32 = 1_024;
}

/// Key of the `SOCK_REVNAT6` map: a socket of the node (its cookie) and the IPv6
/// backend the socket programs gave it instead of a frontend (IPv4's
/// [`SockRevKey`]; an IPv4-mapped address on an IPv6 socket is IPv4's, kept there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SockRevKey6 {
    pub cookie: u64,
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub _pad: u16,
    pub _pad2: u32,
}
const _: () = assert!(size_of::<SockRevKey6>() == 32);

/// Value of the `SOCK_REVNAT6` map: the IPv6 frontend the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct SockRevValue6 {
    pub addr_be: [u32; 4],
    pub port_be: u16,
    pub _pad: u16,
}
const _: () = assert!(size_of::<SockRevValue6>() == 20);

/// Word 2 of an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, RFC 4291 2.5.5.2) as
/// the maps hold it; words 0 and 1 are zero and word 3 is the IPv4 address.
pub const V4_MAPPED_WORD_BE: u32 = 0x0000_ffff_u32.to_be();

/// The IPv4 address an IPv4-mapped IPv6 address carries, if `addr_be` is one.
#[inline(always)]
pub fn v4_mapped(addr_be: [u32; 4]) -> Option<u32> {
    (addr_be[0] == 0 && addr_be[1] == 0 && addr_be[2] == V4_MAPPED_WORD_BE).then_some(addr_be[3])
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn addresses_round_trip_in_network_order() {
        let octets = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10];
        let addr = addr_of(octets);
        assert_eq!(addr[0].to_ne_bytes(), [0xfd, 0, 0, 0]);
        assert_eq!(addr[3].to_ne_bytes(), [0, 0, 0, 0x10]);
        assert_eq!(octets_of(addr), octets);
        assert_eq!(
            octets_of(HAIRPIN6_ADDR_BE),
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x5c, 0x1c, 0, 1]
        );
    }

    #[test]
    fn ipv4_mapped_addresses_give_their_ipv4_address() {
        let mapped: std::net::Ipv6Addr = "::ffff:10.96.0.10".parse().unwrap();
        let v4 = v4_mapped(addr_of(mapped.octets())).unwrap();
        assert_eq!(
            u32::from_be(v4),
            u32::from(std::net::Ipv4Addr::new(10, 96, 0, 10))
        );
        for other in ["::10.96.0.10", "fd00::ffff:a60:a", "::1", "64:ff9b::a60:a"] {
            let a: std::net::Ipv6Addr = other.parse().unwrap();
            assert_eq!(v4_mapped(addr_of(a.octets())), None, "{other}");
        }
    }
}

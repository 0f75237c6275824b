//! The `FRAGMENTS` map: the ports of the IPv4 datagrams being fragmented.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

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

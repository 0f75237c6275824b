//! The `SOCK_REVNAT` map: the translations the socket programs made for the node's
//! own sockets.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

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

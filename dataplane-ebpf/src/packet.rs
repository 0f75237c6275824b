//! Bounds-checked packet access and header offsets. Packet memory is reached only
//! through `ptr_at` and `ptr_at_mut`.

use aya_ebpf::programs::TcContext;
use core::mem::size_of;

pub const ETH_LEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const IP_CSUM_OFF: usize = ETH_LEN + 10;
pub const IP_SRC_OFF: usize = ETH_LEN + 12;
pub const IP_DST_OFF: usize = ETH_LEN + 16;
/// Offsets of the checksum inside the L4 header.
pub const TCP_CSUM_OFF: usize = 16;
pub const UDP_CSUM_OFF: usize = 6;
/// IHL is 4 bits of 32-bit words: at most 60 bytes of IPv4 header.
pub const IP_MAX_HDR_LEN: usize = 60;

/// A pointer to a `T` at `offset` bytes into the packet, or `None` if the packet is
/// too short. The check right before the return is what the verifier needs.
#[inline(always)]
pub fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
}

/// Like [`ptr_at`], for writing. Only `nat` writes, and only after the last helper
/// call that may move the packet.
#[inline(always)]
pub fn ptr_at_mut<T>(ctx: &TcContext, offset: usize) -> Option<*mut T> {
    ptr_at::<T>(ctx, offset).map(|p| p as *mut T)
}

/// The fields of an IPv4 TCP/UDP packet the programs decide on, network byte order.
pub struct Flow {
    pub src_be: u32,
    pub dst_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// Offset of the L4 header.
    pub l4_off: usize,
    /// TCP SYN without ACK: the first packet of a connection.
    pub syn_only: bool,
    /// UDP packet sent without a checksum (zero): left without one.
    pub udp_no_csum: bool,
}

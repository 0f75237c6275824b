//! Packet memory. Every read and write of the packet goes through [`load`] and
//! [`store`], the one bounds check the verifier needs; the rest of the program holds
//! copies, never pointers into the packet. Header fields are named here.
//!
//! The TC programs see an skb, the XDP program a frame ([`Frame`]); both start at the
//! Ethernet header, so parsing and rewriting are one code for both. On an interface
//! without an Ethernet header (a tun device, ipip, WireGuard) the skb starts at the
//! IP header ([`L3`]): every offset is taken from [`Frame::L2`], never assumed.

use aya_ebpf::{
    bindings::BPF_F_PSEUDO_HDR,
    programs::{TcContext, XdpContext},
};
use core::mem::size_of;
use dataplane_common::{csum_replace2, csum_replace4};

/// `BPF_F_MARK_MANGLED_0`: a UDP checksum that becomes zero is written as 0xffff.
const BPF_F_MARK_MANGLED_0: u64 = 1 << 5;

/// A packet as a program sees it: its bytes, and how its L4 checksum is updated.
pub trait Frame {
    /// Bytes before the IP header: the Ethernet header's 14, or none.
    const L2: usize;
    /// Address of the first byte.
    fn start(&self) -> usize;
    /// Address one past the last byte.
    fn end(&self) -> usize;
    /// The packet's length as received, for the byte counters.
    fn wire_len(&self) -> u32;
    /// Updates the L4 checksum at `csum_off` for a covered field of `size` bytes (2
    /// or 4) that changed from `from` to `to` (as they lie in the packet); `pseudo`:
    /// the field is in the pseudo-header (an address); `udp`: a checksum that becomes
    /// zero is written as 0xffff (zero means "none" in UDP).
    fn l4_csum(
        &self,
        csum_off: usize,
        from: u32,
        to: u32,
        size: u8,
        pseudo: bool,
        udp: bool,
    ) -> Result<(), ()>;
}

impl Frame for TcContext {
    const L2: usize = ETH_LEN;

    #[inline(always)]
    fn start(&self) -> usize {
        self.data()
    }

    #[inline(always)]
    fn end(&self) -> usize {
        self.data_end()
    }

    #[inline(always)]
    fn wire_len(&self) -> u32 {
        self.len()
    }

    /// Through the kernel's `l4_csum_replace`: only the kernel knows whether the skb
    /// carries a partial checksum (a veth peer with TX offload hands over
    /// `CHECKSUM_PARTIAL` packets whose field holds the pseudo-header sum), and the
    /// helper updates the field the right way for each case.
    #[inline(always)]
    fn l4_csum(
        &self,
        csum_off: usize,
        from: u32,
        to: u32,
        size: u8,
        pseudo: bool,
        udp: bool,
    ) -> Result<(), ()> {
        let mut flags = size as u64;
        if pseudo {
            flags |= BPF_F_PSEUDO_HDR as u64;
        }
        if udp {
            flags |= BPF_F_MARK_MANGLED_0;
        }
        self.l4_csum_replace(csum_off, from as u64, to as u64, flags)
            .map_err(|_| ())
    }
}

impl Frame for XdpContext {
    const L2: usize = ETH_LEN;

    #[inline(always)]
    fn start(&self) -> usize {
        self.data()
    }

    #[inline(always)]
    fn end(&self) -> usize {
        self.data_end()
    }

    #[inline(always)]
    fn wire_len(&self) -> u32 {
        (self.data_end() - self.data()) as u32
    }

    /// RFC 1624 on the field itself. A frame is what the wire carried, so its
    /// checksums are complete (a partial checksum exists only in an skb made on
    /// this host, which XDP on an uplink does not see; see ARCHITECTURE.md).
    #[inline(always)]
    fn l4_csum(
        &self,
        csum_off: usize,
        from: u32,
        to: u32,
        size: u8,
        _pseudo: bool,
        udp: bool,
    ) -> Result<(), ()> {
        let check: u16 = load(self, csum_off).ok_or(())?;
        let mut new = if size == 4 {
            csum_replace4(check, from, to)
        } else {
            csum_replace2(check, from as u16, to as u16)
        };
        if udp && new == 0 {
            new = 0xffff;
        }
        store(self, csum_off, new).ok_or(())
    }
}

/// Ethernet: 14 bytes; the EtherType is its last two.
pub const ETH_LEN: usize = 14;
pub const ETH_TYPE_OFF: usize = 12;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;

/// IPv6 header fields, as offsets into the fixed header (RFC 8200, 3).
pub mod ipv6 {
    pub const LEN: usize = 40;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT: usize = 6;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

/// IPv4 header fields, as offsets into the header (RFC 791).
pub mod ipv4 {
    /// The fixed part; IHL counts the options on top, in 32-bit words.
    pub const MIN_LEN: usize = 20;
    /// IHL is 4 bits of 32-bit words: at most 60 bytes of header.
    pub const MAX_LEN: usize = 60;
    pub const VERSION_IHL: usize = 0;
    pub const TOTAL_LEN: usize = 2;
    pub const ID: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const PROTO: usize = 9;
    pub const CSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
    /// The fragment offset bits of the flags/fragment field.
    pub const FRAG_OFFSET_MASK: u16 = 0x1fff;
    /// More fragments follow.
    pub const FLAG_MF: u16 = 0x2000;
}

/// TCP header fields (RFC 9293).
pub mod tcp {
    pub const MIN_LEN: usize = 20;
    pub const SPORT: usize = 0;
    pub const DPORT: usize = 2;
    pub const FLAGS: usize = 13;
    pub const CSUM: usize = 16;
    pub const FLAG_FIN: u8 = 0x01;
    pub const FLAG_SYN: u8 = 0x02;
    pub const FLAG_RST: u8 = 0x04;
    pub const FLAG_ACK: u8 = 0x10;
}

/// ICMP header fields (RFC 792).
pub mod icmp {
    pub const HDR_LEN: usize = 8;
    pub const TYPE: usize = 0;
    pub const CSUM: usize = 2;
    pub const DEST_UNREACH: u8 = 3;
    pub const TIME_EXCEEDED: u8 = 11;
}

/// ICMPv6 header fields (RFC 4443, 2.1): ICMP's, type, code, checksum and a word of
/// the message (Packet Too Big's MTU, Parameter Problem's pointer), the invoking
/// packet quoted after it in an error. The error messages are types 1 to 4
/// (destination unreachable, packet too big, time exceeded, parameter problem);
/// informational ones are 128 and up.
pub mod icmpv6 {
    pub use super::icmp::{CSUM, HDR_LEN, TYPE};
    pub const DEST_UNREACH: u8 = 1;
    pub const PARAM_PROBLEM: u8 = 4;
    /// Destination unreachable's code for port unreachable.
    pub const PORT_UNREACH: u8 = 4;
}

/// SCTP common header fields and chunk types (RFC 9260). The ports lie where TCP's
/// and UDP's do; the checksum is a CRC32c over the whole SCTP packet, no
/// pseudo-header.
pub mod sctp {
    /// The common header (12 bytes) and the first chunk's type, flags and length:
    /// the least an SCTP packet carries.
    pub const MIN_LEN: usize = 16;
    pub const SPORT: usize = 0;
    pub const DPORT: usize = 2;
    pub const CSUM: usize = 8;
    /// The first chunk's type.
    pub const CHUNK_TYPE: usize = 12;
    pub const CHUNK_INIT: u8 = 1;
    pub const CHUNK_ABORT: u8 = 6;
    pub const CHUNK_SHUTDOWN_COMPLETE: u8 = 14;
}

/// UDP header fields (RFC 768).
pub mod udp {
    pub const LEN: usize = 8;
    pub const SPORT: usize = 0;
    pub const DPORT: usize = 2;
    pub const CSUM: usize = 6;
}

/// A TC program's skb on an interface without an Ethernet header: the IP header
/// first (Linux hands such packets to TC ingress at their network header).
pub struct L3<'a>(pub &'a TcContext);

impl Frame for L3<'_> {
    const L2: usize = 0;

    #[inline(always)]
    fn start(&self) -> usize {
        self.0.data()
    }

    #[inline(always)]
    fn end(&self) -> usize {
        self.0.data_end()
    }

    #[inline(always)]
    fn wire_len(&self) -> u32 {
        self.0.len()
    }

    #[inline(always)]
    fn l4_csum(
        &self,
        csum_off: usize,
        from: u32,
        to: u32,
        size: u8,
        pseudo: bool,
        udp: bool,
    ) -> Result<(), ()> {
        self.0.l4_csum(csum_off, from, to, size, pseudo, udp)
    }
}

/// No header the programs read lies further into the packet than this. Checking it
/// gives the verifier a bound on offsets that went through memory (a `Flow` field
/// read back from the stack carries none); well under the verifier's own limit
/// (`MAX_PACKET_OFF`, 0xffff, on offset plus size), beyond which it marks no range.
const MAX_OFFSET: usize = 1024;

/// A copy of the `T` at `offset` bytes into the packet, or `None` if the packet is
/// too short. `T` is plain bytes (`[u8; N]`, integers), read unaligned.
#[inline(always)]
pub fn load<T: Copy>(ctx: &impl Frame, offset: usize) -> Option<T> {
    if offset > MAX_OFFSET {
        return None;
    }
    let start = ctx.start();
    let end = ctx.end();
    // This comparison right before the access is what the verifier needs.
    if start + offset + size_of::<T>() > end {
        return None;
    }
    // SAFETY: `offset..offset + size_of::<T>()` lies inside the packet (checked just
    // above), `T` is `Copy` plain data, and the read does not assume alignment.
    Some(unsafe { core::ptr::read_unaligned((start + offset) as *const T) })
}

/// Writes `value` at `offset` bytes into the packet; `None` if the packet is too
/// short (nothing written). Only `nat` writes, after the last helper call that may
/// move the packet.
#[inline(always)]
pub fn store<T: Copy>(ctx: &impl Frame, offset: usize, value: T) -> Option<()> {
    if offset > MAX_OFFSET {
        return None;
    }
    let start = ctx.start();
    let end = ctx.end();
    if start + offset + size_of::<T>() > end {
        return None;
    }
    // SAFETY: bounds-checked just above; TC and XDP programs may write packet data directly,
    // and no reference into the packet is alive anywhere in the program.
    unsafe { core::ptr::write_unaligned((start + offset) as *mut T, value) };
    Some(())
}

/// What parsing found.
pub enum Packet {
    /// TCP, UDP or SCTP.
    L4(Flow),
    /// ICMP, not a fragment: source (network byte order), offset of the ICMP header,
    /// end of the IP datagram (offset into the packet).
    Icmp {
        src_be: u32,
        l4_off: usize,
        ip_end: usize,
    },
}

/// The fields of an IPv4 TCP/UDP/SCTP packet the programs decide on, network byte
/// order.
pub struct Flow {
    pub src_be: u32,
    pub dst_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// Offset of the L4 header.
    pub l4_off: usize,
    /// Length of the L4 packet (IP total length minus header), zero when unknown (a
    /// first fragment: its datagram goes on in later ones). SCTP's checksum covers it.
    pub l4_len: u16,
    /// The first packet of a connection: TCP SYN without ACK, or SCTP INIT.
    pub syn_only: bool,
    /// TCP flags (zero for UDP). SCTP's first chunk in the same terms, as conntrack
    /// reads them: ABORT and SHUTDOWN COMPLETE end an association as RST ends a
    /// connection, so they are `FLAG_RST`.
    pub tcp_flags: u8,
    /// UDP packet sent without a checksum (zero): left without one.
    pub udp_no_csum: bool,
    /// A non-first fragment: no L4 header here, ports from the first fragment; only
    /// addresses are rewritten.
    pub later_fragment: bool,
}

impl Flow {
    /// The flow's hash: `flow_hash` of its addresses, ports and protocol.
    #[inline(always)]
    pub fn hash(&self) -> u32 {
        dataplane_common::flow_hash(
            self.src_be,
            self.dst_be,
            self.sport_be,
            self.dport_be,
            self.proto,
        )
    }
}

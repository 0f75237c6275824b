//! Crafting and checking IPv4 TCP/UDP/SCTP packets, IPv6 TCP/UDP/SCTP packets and
//! the ICMP and ICMPv6 errors the programs make or translate, for `trace` and for
//! program tests.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use dataplane_common::{PROTO_SCTP, PROTO_TCP, PROTO_UDP};

/// TCP flags.
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

/// SCTP chunk types (RFC 9260, 3.2).
pub const SCTP_DATA: u8 = 0;
pub const SCTP_INIT: u8 = 1;
pub const SCTP_ABORT: u8 = 6;

/// What to put in a crafted packet.
#[derive(Clone, Debug)]
pub struct PacketSpec {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub proto: u8,
    /// TCP flags (ignored for UDP); for SCTP the chunk type (`payload` is the chunk).
    pub tcp_flags: u8,
    pub payload: Vec<u8>,
    /// Length of IPv4 options to add (a multiple of 4, at most 40), filled with NOPs.
    pub ip_options: usize,
}

impl PacketSpec {
    pub fn tcp(src: SocketAddrV4, dst: SocketAddrV4, flags: u8) -> Self {
        Self {
            src,
            dst,
            proto: PROTO_TCP,
            tcp_flags: flags,
            payload: Vec::new(),
            ip_options: 0,
        }
    }
    /// An SCTP packet with one chunk of type `chunk` (an INIT has verification tag 0
    /// and INIT's parameters; others carry tag 1 and 4 bytes of value).
    pub fn sctp(src: SocketAddrV4, dst: SocketAddrV4, chunk: u8) -> Self {
        let mut payload = vec![chunk, 0];
        if chunk == SCTP_INIT {
            payload.extend_from_slice(&20u16.to_be_bytes());
            payload.extend_from_slice(&0x0102_0304u32.to_be_bytes()); // initiate tag
            payload.extend_from_slice(&65_536u32.to_be_bytes()); // a_rwnd
            payload.extend_from_slice(&[0, 10, 0, 10]); // streams out, in
            payload.extend_from_slice(&1u32.to_be_bytes()); // initial TSN
        } else {
            payload.extend_from_slice(&8u16.to_be_bytes());
            payload.extend_from_slice(b"data");
        }
        Self {
            src,
            dst,
            proto: PROTO_SCTP,
            tcp_flags: chunk,
            payload,
            ip_options: 0,
        }
    }
    pub fn udp(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Self {
        Self {
            src,
            dst,
            proto: PROTO_UDP,
            tcp_flags: 0,
            payload: payload.to_vec(),
            ip_options: 0,
        }
    }
}

/// Builds Ethernet + IPv4 + TCP/UDP/SCTP with correct checksums.
pub fn build(spec: &PacketSpec) -> Vec<u8> {
    let ihl = 20 + spec.ip_options;
    let l4_len = transport_header_len(spec.proto) + spec.payload.len();
    let mut p = Vec::with_capacity(14 + ihl + l4_len);
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 2]); // dst MAC
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]); // src MAC
    p.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip_start = p.len();
    p.push(0x40 | (ihl / 4) as u8);
    p.push(0);
    p.extend_from_slice(&((ihl + l4_len) as u16).to_be_bytes());
    p.extend_from_slice(&[0x12, 0x34, 0x40, 0x00]); // id, DF
    p.push(64);
    p.push(spec.proto);
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&spec.src.ip().octets());
    p.extend_from_slice(&spec.dst.ip().octets());
    p.extend(std::iter::repeat_n(1u8, spec.ip_options)); // NOP options
    let csum = checksum(&p[ip_start..ip_start + ihl], 0);
    p[ip_start + 10..ip_start + 12].copy_from_slice(&csum.to_be_bytes());
    let pseudo = pseudo_sum(
        &spec.src.ip().octets(),
        &spec.dst.ip().octets(),
        spec.proto,
        l4_len,
    );
    push_transport(
        &mut p,
        spec.proto,
        (spec.src.port(), spec.dst.port()),
        spec.tcp_flags,
        &spec.payload,
        pseudo,
    );
    p
}

/// The length of the header [`push_transport`] writes for `proto`.
fn transport_header_len(proto: u8) -> usize {
    match proto {
        PROTO_TCP => 20,
        PROTO_SCTP => 12,
        _ => 8,
    }
}

/// Appends `proto`'s header (ports; TCP's sequence numbers and flags, UDP's length,
/// SCTP's tag, `tcp_flags` naming SCTP's chunk) and the payload to `p`, with its
/// checksum: SCTP's CRC32c, else the Internet checksum over the segment from
/// `pseudo` (the sum of the family's pseudo-header, [`pseudo_sum`] or
/// [`pseudo_sum6`]), UDP's zero sent as 0xffff. Both families' builders end here.
fn push_transport(
    p: &mut Vec<u8>,
    proto: u8,
    (sport, dport): (u16, u16),
    tcp_flags: u8,
    payload: &[u8],
    pseudo: u32,
) {
    let l4_start = p.len();
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    if proto == PROTO_SCTP {
        let tag: u32 = if tcp_flags == SCTP_INIT { 0 } else { 1 };
        p.extend_from_slice(&tag.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        p.extend_from_slice(payload);
        let crc = crc32c(&p[l4_start..]);
        p[l4_start + 8..l4_start + 12].copy_from_slice(&crc.to_le_bytes());
        return;
    }
    let csum_off = if proto == PROTO_TCP {
        p.extend_from_slice(&1000u32.to_be_bytes()); // seq
        let ack: u32 = if tcp_flags & TCP_ACK != 0 { 2000 } else { 0 };
        p.extend_from_slice(&ack.to_be_bytes());
        p.push(5 << 4);
        p.push(tcp_flags);
        p.extend_from_slice(&64240u16.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0]);
        16
    } else {
        let len = (8 + payload.len()) as u16;
        p.extend_from_slice(&len.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        6
    };
    p.extend_from_slice(payload);
    let csum = checksum(&p[l4_start..], pseudo);
    let csum = if proto == PROTO_UDP && csum == 0 {
        0xffff
    } else {
        csum
    };
    p[l4_start + csum_off..l4_start + csum_off + 2].copy_from_slice(&csum.to_be_bytes());
}

/// The sum of IPv4's pseudo-header (RFC 793, 3.1: source, destination, zero,
/// protocol, transport length), where a transport checksum starts.
fn pseudo_sum(src: &[u8; 4], dst: &[u8; 4], proto: u8, len: usize) -> u32 {
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(src);
    pseudo.extend_from_slice(dst);
    pseudo.extend_from_slice(&[0, proto]);
    pseudo.extend_from_slice(&(len as u16).to_be_bytes());
    sum(&pseudo)
}

/// The fields of a parsed packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub proto: u8,
    pub ip_csum_ok: bool,
    pub l4_csum_ok: bool,
}

/// Parses Ethernet + IPv4 + TCP/UDP and verifies both checksums.
pub fn parse(p: &[u8]) -> Option<Parsed> {
    if p.len() < 14 + 20 || u16::from_be_bytes([p[12], p[13]]) != 0x0800 {
        return None;
    }
    let ip = &p[14..];
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ihl < 20 || ip.len() < total || total < ihl + 8 {
        return None;
    }
    let ip = &ip[..total];
    let proto = ip[9];
    let src_ip = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst_ip = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let l4 = &ip[ihl..];
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    let dport = u16::from_be_bytes([l4[2], l4[3]]);
    let udp_no_csum = proto == PROTO_UDP && l4[6] == 0 && l4[7] == 0;
    // An SCTP checksum of zero is one the kernel computes later (offload), as a UDP
    // checksum of zero is none.
    let l4_csum_ok = if proto == PROTO_SCTP {
        l4.len() >= 12 && (l4[8..12] == [0; 4] || crc32c(l4).to_le_bytes() == l4[8..12])
    } else {
        udp_no_csum || l4_checksum(ip) == 0
    };
    Some(Parsed {
        src: SocketAddrV4::new(src_ip, sport),
        dst: SocketAddrV4::new(dst_ip, dport),
        proto,
        ip_csum_ok: checksum(&ip[..ihl], 0) == 0,
        l4_csum_ok,
    })
}

/// SCTP's CRC32c (RFC 9260, appendix A) of an SCTP packet, its checksum field
/// (bytes 8 to 11) taken as zero; stored little-endian.
pub fn crc32c(sctp: &[u8]) -> u32 {
    let mut crc = !0u32;
    for (i, &b) in sctp.iter().enumerate() {
        crc ^= if (8..12).contains(&i) { 0 } else { b as u32 };
        for _ in 0..8 {
            crc = (crc >> 1) ^ (dataplane_common::crc32c::POLY & 0u32.wrapping_sub(crc & 1));
        }
    }
    !crc
}

/// The L4 checksum over pseudo-header and segment of an IPv4 packet (starting at the
/// IP header). Over a packet with a correct checksum in place, the result is zero.
fn l4_checksum(ip: &[u8]) -> u16 {
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let seg = &ip[ihl..total];
    let src = [ip[12], ip[13], ip[14], ip[15]];
    let dst = [ip[16], ip[17], ip[18], ip[19]];
    checksum(seg, pseudo_sum(&src, &dst, ip[9], seg.len()))
}

fn sum(data: &[u8]) -> u32 {
    let mut s = 0u32;
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        s += word as u32;
    }
    s
}

/// Internet checksum (RFC 1071) of `data`, starting from a partial sum.
pub fn checksum(data: &[u8], initial: u32) -> u16 {
    let mut s = initial as u64 + sum(data) as u64;
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The reply a REJECT makes of `original` (an Ethernet frame holding an IPv4
/// datagram), written from the RFCs for tests to compare with: ICMP destination
/// unreachable, port unreachable (RFC 792), from the address the client asked for,
/// quoting as much of the datagram as fits in 576 bytes (RFC 1812 4.3.2.3) in whole
/// 32-bit words, of what arrived (never more than the frame holds, whatever the
/// header claims); IP TOS of the kernel's own ICMP errors (internetwork control), TTL
/// 64, Ethernet addresses swapped.
pub fn icmp_port_unreachable(original: &[u8]) -> Vec<u8> {
    let ip = &original[14..];
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let quote = &ip[..total.min(ip.len()).min(576 - 28) / 4 * 4];
    let mut out = Vec::with_capacity(14 + 28 + quote.len());
    out.extend_from_slice(&reply_ethernet(original));
    let mut hdr = [0u8; 20];
    hdr[0] = 0x45;
    hdr[1] = 0xc0;
    hdr[2..4].copy_from_slice(&((28 + quote.len()) as u16).to_be_bytes());
    hdr[8] = 64;
    hdr[9] = 1;
    hdr[12..16].copy_from_slice(&ip[16..20]);
    hdr[16..20].copy_from_slice(&ip[12..16]);
    let c = checksum(&hdr, 0);
    hdr[10..12].copy_from_slice(&c.to_be_bytes());
    out.extend_from_slice(&hdr);
    let mut icmp = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(quote);
    let c = checksum(&icmp, 0);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    out.extend_from_slice(&icmp);
    out
}

/// The Ethernet header of a reply to `frame`: its addresses swapped, its EtherType.
fn reply_ethernet(frame: &[u8]) -> [u8; 14] {
    let mut eth = [0; 14];
    eth[..6].copy_from_slice(&frame[6..12]);
    eth[6..12].copy_from_slice(&frame[..6]);
    eth[12..].copy_from_slice(&frame[12..14]);
    eth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_packets_verify() {
        let src = "10.0.1.2:40000".parse().unwrap();
        let dst = "10.96.0.10:80".parse().unwrap();
        for spec in [
            PacketSpec::tcp(src, dst, TCP_SYN),
            PacketSpec::udp(src, dst, b"hello"),
        ] {
            let parsed = parse(&build(&spec)).unwrap();
            assert_eq!(
                (parsed.src, parsed.dst, parsed.proto),
                (src, dst, spec.proto)
            );
            assert!(parsed.ip_csum_ok && parsed.l4_csum_ok);
        }
    }

    #[test]
    fn a_flipped_bit_fails_the_checksum() {
        let src = "10.0.1.2:40000".parse().unwrap();
        let dst = "10.96.0.10:80".parse().unwrap();
        let mut p = build(&PacketSpec::udp(src, dst, b"hello"));
        let last = p.len() - 1;
        p[last] ^= 1;
        assert!(!parse(&p).unwrap().l4_csum_ok);
    }
}

/// What to put in a crafted IPv6 packet.
#[derive(Clone, Debug)]
pub struct PacketSpec6 {
    pub src: SocketAddrV6,
    pub dst: SocketAddrV6,
    pub proto: u8,
    /// TCP flags (ignored for UDP).
    pub tcp_flags: u8,
    pub payload: Vec<u8>,
    /// Extension headers before the transport header, by type (hop-by-hop 0,
    /// routing 43, destination options 60), each 8 bytes: padding only, or a routing
    /// header with no segments left.
    pub ext: Vec<u8>,
}

impl PacketSpec6 {
    pub fn tcp(src: SocketAddrV6, dst: SocketAddrV6, flags: u8) -> Self {
        Self {
            src,
            dst,
            proto: PROTO_TCP,
            tcp_flags: flags,
            payload: Vec::new(),
            ext: Vec::new(),
        }
    }
    pub fn udp(src: SocketAddrV6, dst: SocketAddrV6, payload: &[u8]) -> Self {
        Self {
            src,
            dst,
            proto: PROTO_UDP,
            tcp_flags: 0,
            payload: payload.to_vec(),
            ext: Vec::new(),
        }
    }
    /// An SCTP packet with one chunk of type `chunk`, as [`PacketSpec::sctp`].
    pub fn sctp(src: SocketAddrV6, dst: SocketAddrV6, chunk: u8) -> Self {
        let v4 = PacketSpec::sctp(
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, src.port()),
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, dst.port()),
            chunk,
        );
        Self {
            src,
            dst,
            proto: PROTO_SCTP,
            tcp_flags: chunk,
            payload: v4.payload,
            ext: Vec::new(),
        }
    }
}

/// IPv6's next header of ICMPv6.
pub const PROTO_ICMPV6: u8 = 58;
/// The IPv6 extension headers `build6` and `parse6` know.
const EXT_HEADERS: [u8; 4] = [0, 43, 44, 60];

/// Builds Ethernet + IPv6 (+ extension headers) + TCP/UDP/SCTP with a correct
/// checksum.
pub fn build6(spec: &PacketSpec6) -> Vec<u8> {
    let l4_len = transport_header_len(spec.proto) + spec.payload.len();
    let mut p = Vec::with_capacity(14 + 40 + 8 * spec.ext.len() + l4_len);
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    p.extend_from_slice(&0x86ddu16.to_be_bytes());
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&((8 * spec.ext.len() + l4_len) as u16).to_be_bytes());
    p.push(spec.ext.first().copied().unwrap_or(spec.proto));
    p.push(64);
    p.extend_from_slice(&spec.src.ip().octets());
    p.extend_from_slice(&spec.dst.ip().octets());
    for (i, kind) in spec.ext.iter().enumerate() {
        let next = spec.ext.get(i + 1).copied().unwrap_or(spec.proto);
        // Next header, length 0 (8 bytes), then: options, a PadN of 4 bytes; a
        // routing header, type 0 with no segments left (RFC 8200, 4.4: ignored).
        if *kind == 43 {
            p.extend_from_slice(&[next, 0, 0, 0, 0, 0, 0, 0]);
        } else {
            p.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
        }
    }
    let pseudo = pseudo_sum6(
        &spec.src.ip().octets(),
        &spec.dst.ip().octets(),
        spec.proto,
        l4_len,
    );
    push_transport(
        &mut p,
        spec.proto,
        (spec.src.port(), spec.dst.port()),
        spec.tcp_flags,
        &spec.payload,
        pseudo,
    );
    p
}

/// The sum of IPv6's pseudo-header (RFC 8200, 8.1: source, destination,
/// upper-layer length, zeros, next header), where a transport checksum starts.
fn pseudo_sum6(src: &[u8; 16], dst: &[u8; 16], proto: u8, len: usize) -> u32 {
    let mut pseudo = Vec::with_capacity(40);
    pseudo.extend_from_slice(src);
    pseudo.extend_from_slice(dst);
    pseudo.extend_from_slice(&(len as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, proto]);
    sum(&pseudo)
}

/// The checksum of an IPv6 upper-layer packet `seg` (RFC 8200, 8.1: over the
/// pseudo-header of source, destination, length and next header, then `seg`). Over
/// a packet with a correct checksum in place, the result is zero.
pub fn l4_checksum6(src: &[u8; 16], dst: &[u8; 16], proto: u8, seg: &[u8]) -> u16 {
    checksum(seg, pseudo_sum6(src, dst, proto, seg.len()))
}

/// The fields of a parsed IPv6 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed6 {
    pub src: SocketAddrV6,
    pub dst: SocketAddrV6,
    pub proto: u8,
    /// Offset of the transport header from the start of the frame.
    pub l4_off: usize,
    pub l4_csum_ok: bool,
}

/// Parses Ethernet + IPv6 (+ hop-by-hop, routing, destination options) + TCP/UDP/
/// SCTP/ICMPv6 and verifies the checksum (SCTP's CRC32c); `None` for anything else (a
/// fragment included).
pub fn parse6(p: &[u8]) -> Option<Parsed6> {
    if p.len() < 14 + 40 || u16::from_be_bytes([p[12], p[13]]) != 0x86dd {
        return None;
    }
    let ip = &p[14..];
    let total = 40 + u16::from_be_bytes([ip[4], ip[5]]) as usize;
    if ip.len() < total {
        return None;
    }
    let src: [u8; 16] = ip[8..24].try_into().ok()?;
    let dst: [u8; 16] = ip[24..40].try_into().ok()?;
    let mut next = ip[6];
    let mut off = 40;
    while EXT_HEADERS.contains(&next) && next != 44 {
        next = *ip.get(off)?;
        off += (*ip.get(off + 1)? as usize + 1) * 8;
    }
    if next == 44 || off + 4 > total {
        return None;
    }
    let l4 = &ip[off..total];
    let port = |at: usize| u16::from_be_bytes([l4[at], l4[at + 1]]);
    let (sport, dport) = if next == PROTO_ICMPV6 {
        (0, 0)
    } else {
        (port(0), port(2))
    };
    Some(Parsed6 {
        src: SocketAddrV6::new(src.into(), sport, 0, 0),
        dst: SocketAddrV6::new(dst.into(), dport, 0, 0),
        proto: next,
        l4_off: 14 + off,
        l4_csum_ok: if next == PROTO_SCTP {
            l4.len() >= 12 && crc32c(l4).to_le_bytes() == l4[8..12]
        } else {
            l4_checksum6(&src, &dst, next, l4) == 0
        },
    })
}

/// The reply an IPv6 REJECT makes of `original` (an Ethernet frame holding an IPv6
/// packet), written from the RFCs for tests to compare with: ICMPv6 destination
/// unreachable, port unreachable (RFC 4443, 3.1), from the address the client asked
/// for, quoting the packet up to the programs' cap of 548 bytes in whole 32-bit
/// words, of what arrived (never more than the frame holds); hop limit 64, Ethernet addresses swapped.
pub fn icmp6_port_unreachable(original: &[u8]) -> Vec<u8> {
    let ip = &original[14..];
    let total = 40 + u16::from_be_bytes([ip[4], ip[5]]) as usize;
    let quote = &ip[..total.min(ip.len()).min(548) / 4 * 4];
    let from: [u8; 16] = ip[24..40].try_into().unwrap_or_default();
    let to: [u8; 16] = ip[8..24].try_into().unwrap_or_default();
    icmp6_message(&reply_ethernet(original), &from, &to, 1, 4, 0, quote)
}

/// An ICMPv6 error (RFC 4443: `kind` and `code`, `word` the four bytes after the
/// checksum, Packet Too Big's MTU or Parameter Problem's pointer, zero for the
/// others) from `from` to `to`, quoting the first `quote` bytes of the IPv6 packet in
/// the frame `quoted`, in a frame with `quoted`'s Ethernet header; hop limit 64,
/// checksum over the pseudo-header.
pub fn icmp6_error(
    from: Ipv6Addr,
    to: Ipv6Addr,
    kind: u8,
    code: u8,
    word: u32,
    quoted: &[u8],
    quote: usize,
) -> Vec<u8> {
    let eth: [u8; 14] = quoted[..14].try_into().unwrap_or_default();
    let body = &quoted[14..14 + quote];
    icmp6_message(&eth, &from.octets(), &to.octets(), kind, code, word, body)
}

/// Ethernet (`eth`: addresses and EtherType) + IPv6 (hop limit 64) + an ICMPv6
/// message of `kind` and `code`, the word after the checksum and `body`, its
/// checksum over the pseudo-header (RFC 4443, 2.3).
pub fn icmp6_message(
    eth: &[u8; 14],
    src: &[u8; 16],
    dst: &[u8; 16],
    kind: u8,
    code: u8,
    word: u32,
    body: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(14 + 48 + body.len());
    out.extend_from_slice(eth);
    let len = (8 + body.len()) as u16;
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&[PROTO_ICMPV6, 64]);
    out.extend_from_slice(src);
    out.extend_from_slice(dst);
    let mut icmp = vec![kind, code, 0, 0];
    icmp.extend_from_slice(&word.to_be_bytes());
    icmp.extend_from_slice(body);
    let c = l4_checksum6(src, dst, PROTO_ICMPV6, &icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    out.extend_from_slice(&icmp);
    out
}

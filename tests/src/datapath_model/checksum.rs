//! The Internet checksum as the model computes it: RFC 1071's one's complement sum
//! of 16-bit words, and RFC 1624's update of a checksum when words it covers change
//! (HC' = ~(~HC + ~m + m'), eqn. 3), over big-endian words; and SCTP's CRC32c
//! (RFC 9260, appendix A) without its initial value and final complement, which is
//! linear: the CRCs of two messages of one length differ by that of their XOR.

/// A one's complement sum of 16-bit words in progress.
#[derive(Clone, Copy, Debug)]
pub struct Checksum {
    /// The sum, not yet folded.
    sum: u64,
}

impl Checksum {
    /// The sum of `data`'s 16-bit big-endian words (an odd last byte padded with a
    /// zero).
    pub fn of(data: &[u8]) -> Self {
        let mut s = Self { sum: 0 };
        s.add(data);
        s
    }

    /// Starts from a checksum field's value: its complement is the sum it stands for.
    pub fn from_field(check: u16) -> Self {
        Self {
            sum: (!check) as u64,
        }
    }

    /// Adds `data`'s words.
    pub fn add(&mut self, data: &[u8]) {
        for chunk in data.chunks(2) {
            let w = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
            self.sum += w as u64;
        }
    }

    /// The words `old` (an even number of bytes) became `new`: m' added, m taken
    /// away (adding ~m).
    pub fn replace(&mut self, old: &[u8], new: &[u8]) {
        debug_assert_eq!(old.len(), new.len());
        for (o, n) in old.chunks(2).zip(new.chunks(2)) {
            let o = u16::from_be_bytes([o[0], o[1]]);
            let n = u16::from_be_bytes([n[0], n[1]]);
            self.sum += (!o) as u64 + n as u64;
        }
    }

    /// The folded sum, complemented: what the checksum field holds.
    pub fn get(&self) -> u16 {
        let mut s = self.sum;
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }
}

/// CRC32c's polynomial, reflected (RFC 9260, appendix A).
const CRC32C_POLY: u32 = 0x82f6_3b78;

/// The CRC32c register over `data` from zero, without the final complement: the
/// difference between the CRCs of two messages of `data`'s length whose XOR is
/// `data`.
pub fn crc32c_linear(data: &[u8]) -> u32 {
    crc32c(0, data.iter().copied())
}

/// SCTP's CRC32c of an SCTP packet, its checksum field taken as zero, as the field
/// holds it (little-endian).
pub fn sctp_crc(sctp: &[u8]) -> u32 {
    let bytes = sctp
        .iter()
        .enumerate()
        .map(|(i, &b)| if (8..12).contains(&i) { 0 } else { b });
    !crc32c(!0, bytes)
}

/// The CRC32c register from `r` over `bytes`, a bit at a time (reflected).
fn crc32c(mut r: u32, bytes: impl Iterator<Item = u8>) -> u32 {
    for b in bytes {
        r ^= b as u32;
        for _ in 0..8 {
            r = if r & 1 != 0 {
                (r >> 1) ^ CRC32C_POLY
            } else {
                r >> 1
            };
        }
    }
    r
}

/// Whether `data` (a header or message with its checksum field in place) verifies.
pub fn verifies(data: &[u8]) -> bool {
    matches!(Checksum::of(data).get(), 0)
}

/// Whether an IPv4 packet's TCP or UDP checksum (pseudo-header and the segment
/// `ip[ihl..total]`) verifies; a UDP checksum of zero means none and verifies.
pub fn l4_verifies(ip: &[u8]) -> bool {
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let seg = &ip[ihl..total];
    if ip[9] == dataplane_common::PROTO_UDP && seg.len() >= 8 && seg[6] == 0 && seg[7] == 0 {
        return true;
    }
    let mut s = Checksum::of(&ip[12..20]);
    s.add(&[0, ip[9]]);
    s.add(&(seg.len() as u16).to_be_bytes());
    s.add(seg);
    s.get() == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crc_moves_by_the_crc_of_the_difference() {
        let mut pkt: Vec<u8> = (0..60u8).map(|i| i.wrapping_mul(37)).collect();
        let before = sctp_crc(&pkt);
        let mut diff = vec![0u8; pkt.len()];
        diff[0] = pkt[0] ^ 0x12;
        diff[3] = pkt[3] ^ 0x9a;
        pkt[0] = 0x12;
        pkt[3] = 0x9a;
        assert_eq!(sctp_crc(&pkt), before ^ crc32c_linear(&diff));
        // RFC 9260's check value of CRC32c: "123456789" gives 0xe3069283.
        let mut r = !0u32;
        for &b in b"123456789" {
            r ^= b as u32;
            for _ in 0..8 {
                r = if r & 1 != 0 {
                    (r >> 1) ^ CRC32C_POLY
                } else {
                    r >> 1
                };
            }
        }
        assert_eq!(!r, 0xe306_9283);
    }

    #[test]
    fn an_update_equals_a_full_sum() {
        let mut data = [
            0x45u8, 0, 0, 60, 0x1c, 0x46, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 96, 0, 10,
        ];
        let c = Checksum::of(&data).get();
        data[10..12].copy_from_slice(&c.to_be_bytes());
        assert!(verifies(&data));
        let mut s = Checksum::from_field(c);
        s.replace(&data[16..20], &[10, 244, 3, 7]);
        data[16..20].copy_from_slice(&[10, 244, 3, 7]);
        data[10..12].copy_from_slice(&s.get().to_be_bytes());
        assert!(verifies(&data));
    }
}

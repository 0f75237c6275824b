//! The Internet checksum as the model computes it: RFC 1071's one's complement sum
//! of 16-bit words, and RFC 1624's update of a checksum when words it covers change
//! (HC' = ~(~HC + ~m + m'), eqn. 3), over big-endian words.

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

//! Checksums the programs update in place: the Internet checksum (RFC 1624) and
//! SCTP's CRC32c.

/// Folds a 32-bit one's-complement sum to 16 bits (not complemented). The sum of
/// native-endian words gives the checksum in native-endian storage order.
#[inline(always)]
pub fn csum_fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// RFC 1624 eqn. 3: a 16-bit one's complement checksum `check` after a 32-bit field
/// it covers changed from `from` to `to`: HC' = ~(~HC + ~m + m'). All three are taken
/// as they lie in the packet (read with native byte order); the one's complement sum
/// does not depend on byte order as long as it is the same for all (RFC 1071).
#[inline(always)]
pub fn csum_replace4(check: u16, from: u32, to: u32) -> u16 {
    let nfrom = !from;
    let sum = (!check) as u32 + (nfrom & 0xffff) + (nfrom >> 16) + (to & 0xffff) + (to >> 16);
    // Two folds bring any sum of five 16-bit words back to 16 bits.
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// RFC 1624 eqn. 3 for a 16-bit field, as [`csum_replace4`].
#[inline(always)]
pub fn csum_replace2(check: u16, from: u16, to: u16) -> u16 {
    let sum = (!check) as u32 + (!from) as u32 + to as u32;
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// RFC 1624's `~m + m'` for a 16-byte field (an IPv6 address, as `CtKey` holds it)
/// that changes from `from` to `to`, over its eight 16-bit words, not folded: the
/// deltas of several fields add up, and [`csum_apply`] applies their sum to every
/// checksum that covers them all.
#[inline(always)]
pub fn csum_delta16(from: &[u32; 4], to: &[u32; 4]) -> u32 {
    let mut sum = 0;
    let mut i = 0;
    while i < 4 {
        let nfrom = !from[i];
        sum += (nfrom & 0xffff) + (nfrom >> 16) + (to[i] & 0xffff) + (to[i] >> 16);
        i += 1;
    }
    sum
}

/// RFC 1624's `~m + m'` for a 16-bit field, as [`csum_delta16`].
#[inline(always)]
pub fn csum_delta2(from: u16, to: u16) -> u32 {
    (!from) as u32 + to as u32
}

/// RFC 1624 eqn. 3 with a summed delta (below 2^31: the deltas of a few dozen
/// fields): HC' = ~(~HC + sum of (~m + m')). As [`csum_replace4`], all as they lie
/// in the packet.
#[inline(always)]
pub fn csum_apply(check: u16, delta: u32) -> u16 {
    !csum_fold((!check) as u32 + delta)
}

/// SCTP's checksum, CRC32c (RFC 9260, appendix A: the Castagnoli polynomial,
/// reflected, stored little-endian), updated for a changed port without reading the
/// payload.
///
/// A CRC is linear: for two messages of one length, `crc(a) ^ crc(b)` is the CRC with
/// zero initial value and no final XOR of `a ^ b`, which here is zero except for the
/// two bytes of a port. Its register after those two bytes is carried through the
/// `after` zero bytes that follow by a multiplication with x^(8·after) modulo the
/// polynomial (as zlib's `crc32_combine` does), taken from two tables of 256 powers
/// each. The cost is two fixed 32-step multiplications, whatever the packet's length.
pub mod crc32c {
    /// The polynomial, reflected.
    pub const POLY: u32 = 0x82f6_3b78;
    /// x^0 in the reflected representation (the coefficient of x^i is bit 31 - i).
    const ONE: u32 = 0x8000_0000;
    /// x^8: one byte's shift.
    const X8: u32 = ONE >> 8;

    /// `b · x` modulo the polynomial.
    #[inline(always)]
    const fn times_x(b: u32) -> u32 {
        (b >> 1) ^ (POLY & 0u32.wrapping_sub(b & 1))
    }

    /// `a · b` modulo the polynomial, for the tables (evaluated by the compiler).
    const fn mul_const(a: u32, b: u32) -> u32 {
        let mut p = 0u32;
        let mut b = b;
        let mut i = 0;
        while i < 32 {
            p ^= b & 0u32.wrapping_sub((a >> (31 - i)) & 1);
            b = times_x(b);
            i += 1;
        }
        p
    }

    /// All-zero or all-one masks, read through memory: the verifier forks its state
    /// on an AND of a value it knows is 0 or -1 (the branch-free select the compiler
    /// makes of `0 - bit`), 2^64 paths for a multiplication; a value loaded from a
    /// table it does not know, so one path.
    static SELECT: [u32; 2] = [0, u32::MAX];

    #[inline(always)]
    fn select(bit: u32) -> u32 {
        // SAFETY: an index of 0 or 1 into a two-element static.
        unsafe { core::ptr::read_volatile(&SELECT[(bit & 1) as usize]) }
    }

    /// `a · b` modulo the polynomial, in 32 steps without branches.
    #[inline(always)]
    pub fn mul(a: u32, b: u32) -> u32 {
        let mut p = 0u32;
        let mut b = b;
        let mut i = 0;
        while i < 32 {
            p ^= b & select(a >> (31 - i));
            b = (b >> 1) ^ (POLY & select(b));
            i += 1;
        }
        p
    }

    /// The CRC register (zero initial value) after the byte `d`.
    #[inline(always)]
    fn byte(reg: u32, d: u8) -> u32 {
        let mut r = reg ^ d as u32;
        let mut i = 0;
        while i < 8 {
            r = (r >> 1) ^ (POLY & select(r));
            i += 1;
        }
        r
    }

    const fn powers(step: u32) -> [u32; 256] {
        let mut t = [0u32; 256];
        t[0] = ONE;
        let mut i = 1;
        while i < 256 {
            t[i] = mul_const(t[i - 1], step);
            i += 1;
        }
        t
    }

    /// x^(8·i) for i < 256.
    pub static POW_LO: [u32; 256] = powers(X8);
    /// x^(8·256·j) for j < 256.
    pub static POW_HI: [u32; 256] = powers(mul_const(powers(X8)[255], X8));

    /// The XOR that turns the checksum (as a little-endian `u32`) of an SCTP packet
    /// into the one of the same packet with the two bytes `old` replaced by `new`,
    /// when `after` bytes of the packet follow them (`after` < 65,536).
    #[inline(always)]
    pub fn port_delta(old: [u8; 2], new: [u8; 2], after: usize) -> u32 {
        let reg = byte(byte(0, old[0] ^ new[0]), old[1] ^ new[1]);
        let n = after & 0xffff;
        mul(mul(reg, POW_LO[n & 0xff]), POW_HI[n >> 8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;

    /// CRC32c of `data` with the checksum field (bytes 8..12) taken as zero, as
    /// RFC 9260 computes it, bit by bit.
    fn sctp_crc(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for (i, &b) in data.iter().enumerate() {
            crc ^= if (8..12).contains(&i) { 0 } else { b as u32 };
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ crc32c::POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn crc32c_matches_rfc_3720s_test_vector() {
        // RFC 3720, B.4: 32 bytes of zeros have CRC32c 0x8a9136aa (stored aa 36 91 8a).
        let mut crc = !0u32;
        for _ in 0..32 {
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ crc32c::POLY
                } else {
                    crc >> 1
                };
            }
        }
        assert_eq!(!crc, 0x8a91_36aa);
    }

    /// A linear congruential generator from `seed` (Numerical Recipes' constants):
    /// test data that is the same on every run.
    fn lcg(seed: u32) -> impl FnMut() -> u32 {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state
        }
    }

    #[test]
    fn sctp_port_delta_matches_a_full_recompute() {
        let mut next = lcg(0x9e37_79b9);
        for round in 0..400 {
            // Lengths from the bare common header to a jumbo frame and the 16-bit limit.
            let len = match round % 4 {
                0 => 12 + (next() as usize % 64),
                1 => 12 + (next() as usize % 9000),
                2 => 65_535 - 20,
                _ => 12,
            };
            let mut pkt: std::vec::Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let crc = sctp_crc(&pkt);
            pkt[8..12].copy_from_slice(&crc.to_le_bytes());
            for at in [0usize, 2] {
                let old = [pkt[at], pkt[at + 1]];
                let new = (next() as u16).to_be_bytes();
                let field = u32::from_le_bytes([pkt[8], pkt[9], pkt[10], pkt[11]]);
                let updated = field ^ crc32c::port_delta(old, new, len - at - 2);
                pkt[at..at + 2].copy_from_slice(&new);
                assert_eq!(updated, sctp_crc(&pkt), "length {len}, port at {at}");
                pkt[8..12].copy_from_slice(&updated.to_le_bytes());
            }
        }
    }

    /// The checksum of 16-bit big-endian words, computed from scratch.
    fn full(words: &[u16]) -> u16 {
        let mut sum: u32 = words.iter().map(|&w| w as u32).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn incremental_checksum_matches_a_full_recompute() {
        // An IPv4 header's words with the checksum field zeroed; the destination
        // address (words 8 and 9) is rewritten to many values.
        let mut words = [
            0x4500, 0x003c, 0x1c46, 0x4000, 0x4006, 0x0000, 0x0a00, 0x0001, 0x0a60, 0x000a,
        ];
        let mut check = full(&words);
        let mut state = 0x1234_5678u32;
        for _ in 0..10_000 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let to_host = match state % 4 {
                0 => 0,
                1 => u32::MAX,
                _ => state,
            };
            let from_host = ((words[8] as u32) << 16) | words[9] as u32;
            // As the program sees them: bytes in packet order, read natively.
            let le = |w: u16| u16::from_ne_bytes(w.to_be_bytes());
            let le32 = |v: u32| u32::from_ne_bytes(v.to_be_bytes());
            let got = csum_replace4(le(check), le32(from_host), le32(to_host));
            words[8] = (to_host >> 16) as u16;
            words[9] = to_host as u16;
            let want = full(&words);
            let got = u16::from_be_bytes(got.to_ne_bytes());
            // 0x0000 and 0xffff are the same one's complement value.
            assert!(
                got == want || (got, want) == (0xffff, 0) || (got, want) == (0, 0xffff),
                "{got:#06x} != {want:#06x} after rewriting to {to_host:#010x}"
            );
            check = want;
        }
    }

    #[test]
    fn summed_deltas_of_addresses_and_ports_match_a_full_recompute() {
        // An IPv6 pseudo-header and a UDP header: source, destination, length, next
        // header, ports, length, checksum (word 22 zeroed); both addresses and both
        // ports are rewritten at once, as an ICMPv6 error's quote is.
        let mut next = lcg(0x0bad_cafe);
        let le = |w: u16| u16::from_ne_bytes(w.to_be_bytes());
        // Eight words of an address as the program holds it: four native reads.
        let addr = |w: &[u16]| -> [u32; 4] {
            core::array::from_fn(|i| {
                let [a, b] = w[2 * i].to_be_bytes();
                let [c, d] = w[2 * i + 1].to_be_bytes();
                u32::from_ne_bytes([a, b, c, d])
            })
        };
        for round in 0..5_000 {
            let mut words: [u16; 24] = core::array::from_fn(|_| next() as u16);
            words[16] = 0;
            words[17] = 16;
            words[18] = 0;
            words[19] = 17;
            words[22] = 0;
            let check = full(&words);
            let old = words;
            for i in (0..16).chain(20..22) {
                words[i] = match round % 3 {
                    0 => next() as u16,
                    1 => 0,
                    _ => 0xffff,
                };
            }
            let delta = csum_delta16(&addr(&old[..8]), &addr(&words[..8]))
                + csum_delta16(&addr(&old[8..16]), &addr(&words[8..16]))
                + csum_delta2(le(old[20]), le(words[20]))
                + csum_delta2(le(old[21]), le(words[21]));
            let got = u16::from_be_bytes(csum_apply(le(check), delta).to_ne_bytes());
            let want = full(&words);
            assert!(
                got == want || (got, want) == (0xffff, 0) || (got, want) == (0, 0xffff),
                "{got:#06x} != {want:#06x} in round {round}"
            );
        }
    }
}

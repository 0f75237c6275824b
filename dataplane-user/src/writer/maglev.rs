//! Maglev consistent hashing for the frontends traffic from outside the cluster
//! reaches (NodePorts, external and load-balancer IPs).
//!
//! The kernel picks `slot = flow_hash % count` and reads the backend of that slot
//! (`dataplane-ebpf/src/lookup.rs`). For these frontends the writer publishes a
//! Maglev lookup table as the slots: `count` is the table's prime size M and slot `i`
//! holds entry `i` of the table. `flow_hash` is unseeded and the table depends only on
//! the backends' identities (address, port, protocol) and M, never on node-local ids
//! or on the order backends arrived in, so every node running the same configuration
//! sends a flow to the same backend: a flow that ECMP moves to another node, or that
//! a new node receives, keeps its backend even where that node has no conntrack
//! entry for it (a TCP connection survives that only where the backend sees the
//! client's own address, not through the uplink's masquerade). When one of N
//! backends leaves, its own entries (about M/N) move and, by the cascade of the
//! turns, some others: for 1 of 100 at M = 1021, about 4.5% of the table in all (1%
//! at least), less as M grows against N.
//!
//! The table is the one of the Maglev paper (Eisenbud et al., "Maglev: A Fast and
//! Reliable Software Network Load Balancer", NSDI 2016, section 3.4,
//! <https://research.google/pubs/pub44824/>), as Katran builds it
//! (<https://github.com/facebookincubator/katran/blob/main/katran/lib/MaglevBase.cpp>):
//! each backend has a preference list over the entries, `(offset + j * skip) % M`
//! with `offset` and `skip` from two hashes of its identity (M prime, so every list
//! is a permutation); backends take turns, each taking its most preferred free
//! entry, until the table is full. Backends take turns in their sorted order, so each
//! ends with `M / N` entries rounded down or up. With more backends than entries
//! (N > M), only the first M in that order get one: M must be at least N for every
//! backend to get traffic, and about 100 N for the entries to split within 1%.
//!
//! The hash is this file's own (murmur3's 64-bit finalizer over the identity) and is
//! part of what nodes must agree on: changing it, or the turn order, moves nearly
//! every flow of every such frontend while nodes run different versions. The
//! `a_table_never_changes_silently` test pins it.

use std::{fmt, str::FromStr};

use dataplane_common::Backend;

/// The table sizes the agent accepts: primes, as Cilium's `--bpf-lb-maglev-table-size`
/// takes (<https://docs.cilium.io/en/stable/network/kubernetes/kubeproxy-free/>, "Maglev Consistent Hashing").
pub const SIZES: [u32; 10] = [
    251, 509, 1_021, 2_039, 4_093, 8_191, 16_381, 32_749, 65_521, 131_071,
];

/// A Maglev table's size M: one of [`SIZES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableSize(u32);

impl TableSize {
    /// The agent's default. Every Maglev frontend with backends holds M slots of the
    /// `SLOTS` map, whose default capacity is 1,048,576 (`capacity::SLOTS`), shared
    /// with every ClusterIP's backends: at 1,021 about a thousand tables fit beside
    /// them (a LoadBalancer Service port is two: its NodePort and its load-balancer
    /// IP), and a Service of up to 100 backends still gives each 10 or 11 entries
    /// (within 10% of its share; one backend of 100 leaving moves about 4.5% of
    /// flows, where 1% must move, against 99% placed as a ClusterIP's). Cilium's
    /// default, 16,381, would let only 64 such frontends fit. Larger clusters of
    /// Services with many backends raise `--max-slots` and the size together.
    pub const DEFAULT: TableSize = TableSize(1_021);

    /// M, if it is one of [`SIZES`].
    pub fn new(m: u32) -> Result<Self, String> {
        if SIZES.contains(&m) {
            Ok(Self(m))
        } else {
            let sizes: Vec<String> = SIZES.iter().map(u32::to_string).collect();
            Err(format!(
                "{m} is not a Maglev table size: it must be one of the primes {}",
                sizes.join(", ")
            ))
        }
    }

    /// The size of a table found in the maps (a frontend's slot count), as an earlier
    /// run wrote it; never used to build one.
    pub(crate) fn restored(count: u32) -> Self {
        Self(count)
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for TableSize {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl FromStr for TableSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let m = s
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("{s:?} is not a number"))?;
        Self::new(m)
    }
}

impl fmt::Display for TableSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The lookup table of `size` entries for `backends` (sorted and without duplicates,
/// as the compiler gives them): entry `i` is the index in `backends` of the backend
/// slot `i` sends to. Empty without backends.
pub fn table<B: Identity>(backends: &[B], size: TableSize) -> Vec<u32> {
    let m = size.get();
    if backends.is_empty() {
        return Vec::new();
    }
    let mut prefs: Vec<Preferences> = backends.iter().map(|b| Preferences::of(b, m)).collect();
    let mut table = vec![FREE; m as usize];
    let mut filled = 0;
    // Each turn fills one entry, and each backend's preferences cover every entry, so
    // the search for a free one ends: at most M turns of at most M steps.
    loop {
        for (i, p) in prefs.iter_mut().enumerate() {
            let mut entry = p.next(m);
            while table[entry as usize] != FREE {
                entry = p.next(m);
            }
            table[entry as usize] = i as u32;
            filled += 1;
            if filled == m {
                return table;
            }
        }
    }
}

/// A table entry no backend has taken yet.
const FREE: u32 = u32::MAX;

/// A backend's preference list, walked lazily: `offset`, `offset + skip`, ...
/// (mod M).
struct Preferences {
    at: u32,
    skip: u32,
}

impl Preferences {
    fn of<B: Identity>(b: &B, m: u32) -> Self {
        let id = b.identity();
        let offset = (hash(id, SEED_OFFSET) % u64::from(m)) as u32;
        // 1..M-1: with M prime, a step that walks through every entry.
        let skip = (hash(id, SEED_SKIP) % u64::from(m - 1)) as u32 + 1;
        Self { at: offset, skip }
    }

    fn next(&mut self, m: u32) -> u32 {
        let entry = self.at;
        // Both below M, which is below 2^31: the sum does not overflow.
        self.at = (self.at + self.skip) % m;
        entry
    }
}

/// What identifies a backend on every node: its address, port and protocol (host
/// order, so the value does not depend on how the maps store them).
pub trait Identity {
    fn identity(&self) -> u64;
}

impl Identity for Backend {
    fn identity(&self) -> u64 {
        (u64::from(u32::from_be(self.addr_be)) << 32)
            | (u64::from(u16::from_be(self.port_be)) << 16)
            | u64::from(self.proto)
    }
}

/// An IPv6 backend's 128-bit address does not fit beside its port in 64 bits: its
/// two halves are folded in with the hash's mixer, then port and protocol, so the
/// value is still a function of address, port and protocol alone.
impl Identity for dataplane_common::Backend6 {
    fn identity(&self) -> u64 {
        let addr = u128::from_be_bytes(dataplane_common::octets_of(self.addr_be));
        let folded = fmix64(fmix64((addr >> 64) as u64) ^ addr as u64);
        folded ^ ((u64::from(u16::from_be(self.port_be)) << 8) | u64::from(self.proto))
    }
}

impl Identity for crate::compiler::AnyBackend {
    fn identity(&self) -> u64 {
        match self {
            Self::V4(b) => b.identity(),
            Self::V6(b) => b.identity(),
        }
    }
}

const SEED_OFFSET: u64 = 0x736c_6963_6577_6179;
const SEED_SKIP: u64 = 0x6d61_676c_6576_0001;

/// A 64-bit hash of `key` under `seed`: murmur3's finalizer, twice, with the seed
/// between (every bit of key and seed reaches every bit of the result).
fn hash(key: u64, seed: u64) -> u64 {
    fmix64(fmix64(key ^ seed) ^ seed.rotate_left(32))
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// How much of a table moved between two of its versions, each entry named by its
/// backend: the share of entries whose backend differs.
pub fn moved_share(before: &[Backend], after: &[Backend]) -> f64 {
    assert_eq!(before.len(), after.len(), "tables of one size");
    if before.is_empty() {
        return 0.0;
    }
    let moved = before.iter().zip(after).filter(|(a, b)| a != b).count();
    moved as f64 / before.len() as f64
}

/// `table` with each entry replaced by its backend.
pub fn resolved(backends: &[Backend], size: TableSize) -> Vec<Backend> {
    table(backends, size)
        .into_iter()
        .map(|i| backends[i as usize])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_common::{flow_hash, PROTO_TCP, PROTO_UDP};

    fn backends(n: u32) -> Vec<Backend> {
        let mut v: Vec<Backend> = (0..n)
            .map(|i| Backend {
                addr_be: (0x0af4_0000 + i * 7).to_be(),
                port_be: 8080u16.to_be(),
                proto: PROTO_TCP,
                _pad: 0,
            })
            .collect();
        v.sort();
        v
    }

    /// xorshift: deterministic, no dependency.
    fn rng(mut seed: u32) -> impl FnMut() -> u32 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        }
    }

    #[test]
    fn every_entry_is_taken_and_backends_get_equal_shares() {
        for m in [251, 1_021, 16_381] {
            let size = TableSize::new(m).unwrap();
            for n in [1, 2, 3, 10, 100, 251] {
                let t = table(&backends(n), size);
                assert_eq!(t.len(), m as usize);
                let mut count = vec![0u32; n as usize];
                for &i in &t {
                    count[i as usize] += 1;
                }
                // Turns fill one entry per backend, so shares differ by one at most.
                let (lo, hi) = (m / n, m.div_ceil(n));
                assert!(
                    count.iter().all(|&c| c == lo || c == hi),
                    "M={m} N={n}: {count:?}"
                );
            }
        }
    }

    #[test]
    fn more_backends_than_entries_fill_the_table_once_each() {
        let b = backends(300);
        let t = table(&b, TableSize::new(251).unwrap());
        let mut seen = t.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 251, "every entry a different backend");
        assert!(table::<Backend>(&[], TableSize::DEFAULT).is_empty());
    }

    #[test]
    fn the_table_depends_only_on_identities() {
        // The same backends on another node, where they have other ids and came in
        // another order: the compiler sorts them, and nothing else enters.
        let b = backends(50);
        let mut shuffled = b.clone();
        shuffled.reverse();
        shuffled.sort();
        assert_eq!(
            resolved(&b, TableSize::DEFAULT),
            resolved(&shuffled, TableSize::DEFAULT)
        );
        // The protocol and the port are part of the identity.
        let udp: Vec<Backend> = b
            .iter()
            .map(|x| Backend {
                proto: PROTO_UDP,
                ..*x
            })
            .collect();
        assert_ne!(
            table(&b, TableSize::DEFAULT),
            table(&udp, TableSize::DEFAULT)
        );
    }

    /// Nodes running different versions must build the same table: a change of the
    /// hash or of the turn order is caught here (the values were printed by this code).
    #[test]
    fn a_table_never_changes_silently() {
        let t = table(&backends(5), TableSize::new(251).unwrap());
        assert_eq!(
            &t[..24],
            &[1, 2, 1, 4, 2, 2, 1, 2, 4, 0, 3, 3, 3, 4, 3, 0, 0, 0, 3, 3, 2, 1, 4, 1],
            "the Maglev table changed: every node must build the same one"
        );
        // All of a larger one, by its FNV-1a digest.
        let digest = table(&backends(100), TableSize::DEFAULT)
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &i| {
                (h ^ u64::from(i)).wrapping_mul(0x0100_0000_01b3)
            });
        assert_eq!(
            digest, 9_676_258_852_879_879_769,
            "the Maglev table changed: every node must build the same one"
        );
    }

    /// Share of table entries and of random flows (hashed as the kernel hashes them)
    /// whose backend changes when each of `n` backends leaves in turn: (mean, worst)
    /// of each.
    fn disruption(n: u32, size: TableSize) -> ((f64, f64), (f64, f64)) {
        let m = size.get();
        let all = backends(n);
        let before = resolved(&all, size);
        let mut next = rng(0x2545_f491);
        let flows: Vec<u32> = (0..20_000)
            .map(|_| {
                let (client, port) = (next(), next() as u16);
                flow_hash(
                    client,
                    0xc633_6401u32.to_be(),
                    port,
                    80u16.to_be(),
                    PROTO_TCP,
                )
            })
            .collect();
        let (mut entries, mut flows_moved) = ((0.0, 0.0f64), (0.0, 0.0f64));
        for gone in 0..all.len() {
            let mut left = all.clone();
            let removed = left.remove(gone);
            let after = resolved(&left, size);
            assert!(after.iter().all(|b| *b != removed), "nothing goes to it");
            let e = moved_share(&before, &after);
            let f = flows
                .iter()
                .filter(|h| before[(**h % m) as usize] != after[(**h % m) as usize])
                .count() as f64
                / flows.len() as f64;
            entries = (entries.0 + e / f64::from(n), entries.1.max(e));
            flows_moved = (flows_moved.0 + f / f64::from(n), flows_moved.1.max(f));
        }
        (entries, flows_moved)
    }

    /// When one of 100 backends leaves, its own entries move (about 1% of the table)
    /// and some others: Maglev's cascade, which shrinks as M grows against N (the
    /// paper's M > 100 N); about 4% in all at the default size, measured here on
    /// every backend in turn. The bounds are that measure with a margin; a ClusterIP's
    /// placement (slot = hash % count, the last slot moved into the hole) moves
    /// nearly every flow.
    #[test]
    fn one_backend_of_a_hundred_leaving_moves_few_flows() {
        let ((mean, worst), (flows_mean, flows_worst)) = disruption(100, TableSize::DEFAULT);
        eprintln!(
            "M=1021, 1 of 100 leaving: entries moved mean {mean:.4} worst {worst:.4}; \
             flows moved mean {flows_mean:.4} worst {flows_worst:.4}"
        );
        // At least the removed backend's own share: 10 or 11 entries of 1,021.
        assert!(mean >= 10.0 / 1021.0, "{mean}");
        assert!(mean <= 0.01 + 0.04, "entries moved: mean {mean}");
        assert!(worst <= 0.01 + 0.05, "entries moved: worst {worst}");
        assert!(flows_mean <= 0.01 + 0.04, "flows moved: mean {flows_mean}");
        assert!(
            flows_worst <= 0.01 + 0.05,
            "flows moved: worst {flows_worst}"
        );

        // A larger table moves fewer: within a point and a half of the minimum at
        // 16,381 entries.
        let ((mean, _), (flows_mean, _)) = disruption(100, TableSize::new(16_381).unwrap());
        eprintln!("M=16381: entries moved mean {mean:.4}, flows {flows_mean:.4}");
        assert!(mean <= 0.01 + 0.015, "entries moved at 16381: {mean}");
        assert!(
            flows_mean <= 0.01 + 0.015,
            "flows moved at 16381: {flows_mean}"
        );
    }

    #[test]
    fn sizes_are_the_listed_primes() {
        assert_eq!("1021".parse::<TableSize>().unwrap().get(), 1021);
        assert_eq!(" 251 ".parse::<TableSize>().unwrap().get(), 251);
        for bad in ["1000", "0", "1", "65537", "abc", ""] {
            let err = bad.parse::<TableSize>().unwrap_err();
            assert!(
                err.contains("not a number") || err.contains("251, 509, 1021"),
                "{bad}: {err}"
            );
        }
        for m in SIZES {
            assert!((2..m).take_while(|d| d * d <= m).all(|d| m % d != 0), "{m}");
        }
    }
}

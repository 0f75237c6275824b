//! Endpoint identity (upstream's endpoint hash) and the insertion-ordered endpoint
//! set the reconcilers fill slices from, with the hasher it uses.

use std::collections::HashMap;
use std::hash::Hasher as _;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};

/// The identity of an endpoint inside a set (upstream's hashEndpoint): its sorted
/// addresses, hostname and the namespace and name of its target.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointKey {
    addresses: Vec<String>,
    hostname: String,
    namespace: String,
    name: String,
}

impl EndpointKey {
    /// The key of an endpoint.
    pub fn of(ep: &Endpoint) -> Self {
        let k = ep.key();
        EndpointKey {
            addresses: k.addresses.iter().map(|a| a.to_string()).collect(),
            hostname: k.hostname.into(),
            namespace: k.namespace.into(),
            name: k.name.into(),
        }
    }
}

/// Sorted addresses of an endpoint key, borrowed; allocates only for two or more.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyAddresses<'a> {
    /// No address.
    None,
    /// One address.
    One(&'a str),
    /// Several addresses, sorted.
    Many(Vec<&'a str>),
}

impl<'a> KeyAddresses<'a> {
    /// The sorted key of these addresses.
    pub fn of(addresses: impl Iterator<Item = &'a str>) -> Self {
        let mut it = addresses;
        let Some(first) = it.next() else {
            return KeyAddresses::None;
        };
        let Some(second) = it.next() else {
            return KeyAddresses::One(first);
        };
        let mut all = vec![first, second];
        all.extend(it);
        all.sort_unstable();
        KeyAddresses::Many(all)
    }
    /// The addresses, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &'a str> + '_ {
        let (one, many): (Option<&'a str>, &[&'a str]) = match self {
            KeyAddresses::None => (None, &[]),
            KeyAddresses::One(a) => (Some(*a), &[]),
            KeyAddresses::Many(v) => (None, v.as_slice()),
        };
        one.into_iter().chain(many.iter().copied())
    }
}

/// [`EndpointKey`], borrowed from the endpoint: what two endpoints of a set are
/// compared by. Missing hostname, namespace and name are empty, as in the hash.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointKeyRef<'a> {
    /// Sorted addresses.
    pub addresses: KeyAddresses<'a>,
    /// Hostname or empty.
    pub hostname: &'a str,
    /// Target namespace or empty.
    pub namespace: &'a str,
    /// Target name or empty.
    pub name: &'a str,
}

/// Something with an endpoint identity: an [`Endpoint`], or a desired endpoint that
/// is turned into one only when it is written.
pub trait Keyed {
    /// The identity.
    fn key(&self) -> EndpointKeyRef<'_>;
}

impl Keyed for Endpoint {
    fn key(&self) -> EndpointKeyRef<'_> {
        let r = self.target_ref.as_ref();
        EndpointKeyRef {
            addresses: KeyAddresses::of(self.addresses.iter().map(String::as_str)),
            hostname: self.hostname.as_deref().unwrap_or(""),
            namespace: r.and_then(|r| r.namespace.as_deref()).unwrap_or(""),
            name: r.and_then(|r| r.name.as_deref()).unwrap_or(""),
        }
    }
}

/// `EndpointsEqualBeyondHash`: the fields the hash leaves out (node, zone, conditions,
/// target reference) are equal.
pub fn endpoints_equal_beyond_hash(a: &Endpoint, b: &Endpoint) -> bool {
    let none = EndpointConditions::default();
    let ca = a.conditions.as_ref().unwrap_or(&none);
    let cb = b.conditions.as_ref().unwrap_or(&none);
    a.node_name == b.node_name
        && a.zone == b.zone
        && ca.ready == cb.ready
        && ca.serving == cb.serving
        && ca.terminating == cb.terminating
        && a.target_ref == b.target_ref
}

/// The hash of a key: its addresses and target name, which tell endpoints apart;
/// hostname and namespace are left to the comparison (equal keys still hash alike).
fn key_hash(key: &EndpointKeyRef<'_>) -> u64 {
    let mut h = FastHasher::default();
    for a in key.addresses.iter() {
        h.write(a.as_bytes());
    }
    h.write(key.name.as_bytes());
    h.finish()
}

/// A fast, non-cryptographic hasher (eight bytes at a time, in the manner of rustc's
/// FxHasher) for short in-process keys; collisions are resolved by comparing keys,
/// so this only has to spread. Each `write` also mixes in the length, so adjacent
/// fields cannot run into each other.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::SEED);
    }
}

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // Spread the high bits into the low ones, which the table indexes by.
        let h = self.0;
        h ^ (h >> 29) ^ (h >> 47)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("eight bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(last));
        }
        self.mix(bytes.len() as u64);
    }
    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

/// A hasher for keys that are hashes already.
#[derive(Default)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const NO_SLOT: usize = usize::MAX;

#[derive(Debug, Clone)]
struct Slot<T> {
    item: Option<T>,
    /// The previous slot with the same key hash, or [`NO_SLOT`].
    chain: usize,
}

/// An insertion-ordered set of endpoints keyed by their [`EndpointKeyRef`] (upstream's
/// EndpointSet). `pop_any` pops in insertion order, so results are deterministic
/// where upstream's map order is random. Lookups do not allocate.
#[derive(Debug, Clone)]
pub struct EndpointSet<T = Endpoint> {
    slots: Vec<Slot<T>>,
    /// Key hash to the newest slot with that hash.
    index: HashMap<u64, usize, std::hash::BuildHasherDefault<PassThrough>>,
    next: usize,
    len: usize,
}

impl<T> Default for EndpointSet<T> {
    fn default() -> Self {
        EndpointSet {
            slots: Vec::new(),
            index: HashMap::default(),
            next: 0,
            len: 0,
        }
    }
}

impl<T: Keyed> EndpointSet<T> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty set with room for `n` endpoints.
    pub fn with_capacity(n: usize) -> Self {
        EndpointSet {
            slots: Vec::with_capacity(n),
            index: HashMap::with_capacity_and_hasher(n, Default::default()),
            next: 0,
            len: 0,
        }
    }
    fn find(&self, key: &EndpointKeyRef<'_>, hash: u64) -> Option<usize> {
        let mut i = self.index.get(&hash).copied().unwrap_or(NO_SLOT);
        while i != NO_SLOT {
            let slot = &self.slots[i];
            if slot.item.as_ref().is_some_and(|it| it.key() == *key) {
                return Some(i);
            }
            i = slot.chain;
        }
        None
    }
    /// Inserts or replaces (same key) an endpoint.
    pub fn insert(&mut self, ep: T) {
        let (hash, found) = {
            let key = ep.key();
            let hash = key_hash(&key);
            (hash, self.find(&key, hash))
        };
        match found {
            Some(i) => self.slots[i].item = Some(ep),
            None => {
                let i = self.slots.len();
                let chain = self.index.insert(hash, i).unwrap_or(NO_SLOT);
                self.slots.push(Slot {
                    item: Some(ep),
                    chain,
                });
                self.len += 1;
            }
        }
    }
    /// The endpoint with the same key.
    pub fn get(&self, ep: &impl Keyed) -> Option<&T> {
        let key = ep.key();
        let i = self.find(&key, key_hash(&key))?;
        self.slots[i].item.as_ref()
    }
    /// Removes and returns the endpoint with the same key.
    pub fn remove(&mut self, ep: &impl Keyed) -> Option<T> {
        let key = ep.key();
        let i = self.find(&key, key_hash(&key))?;
        self.len -= 1;
        self.slots[i].item.take()
    }
    /// Removes the endpoint with the same key.
    pub fn delete(&mut self, ep: &impl Keyed) {
        self.remove(ep);
    }
    /// Removes and returns the oldest endpoint.
    pub fn pop_any(&mut self) -> Option<T> {
        while self.next < self.slots.len() {
            let i = self.next;
            self.next += 1;
            if let Some(ep) = self.slots[i].item.take() {
                self.len -= 1;
                return Some(ep);
            }
        }
        None
    }
    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

//! Conntrack from user space: idle timeouts from flags, the sweeper that removes
//! expired connections from the kernel's `CONNTRACK` map in bounded batches, and the
//! map's fill level (a metric, and a warning before it is full).
//!
//! The kernel already treats an expired entry as absent; the sweeper gives its room
//! back, so the LRU map evicts nothing while dead connections can be collected, and a
//! long idle connection is not pushed out by connections that already ended.

use std::{
    collections::BTreeMap,
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::{HashMap as BpfHashMap, IterableMap, MapData};
use dataplane_common::{
    ct::{self, state},
    CtEntry, CtKey, CT_FORWARD, CT_REVERSE,
};

/// Idle timeouts in seconds, indexed by `ct::state::*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts(pub [u64; state::COUNT as usize]);

impl Default for Timeouts {
    fn default() -> Self {
        Self(ct::DEFAULTS)
    }
}

impl Timeouts {
    /// Applies `--conntrack-timeout` entries, `STATE=SECONDS` (states as
    /// `ct::state::NAMES` spells them, seconds above zero).
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut t = Self::default();
        for entry in entries {
            let (name, secs) = entry
                .split_once('=')
                .ok_or_else(|| format!("conntrack timeout {entry:?}: expected STATE=SECONDS"))?;
            let i = state::NAMES
                .iter()
                .position(|n| *n == name.trim())
                .ok_or_else(|| {
                    format!(
                        "conntrack timeout {entry:?}: unknown state {name:?} (one of {})",
                        state::NAMES.join(", ")
                    )
                })?;
            let secs: u64 = secs
                .trim()
                .parse()
                .ok()
                .filter(|s| (1..=u32::MAX as u64).contains(s))
                .ok_or_else(|| {
                    format!(
                        "conntrack timeout {entry:?}: seconds must be 1 to {}",
                        u32::MAX
                    )
                })?;
            t.0[i] = secs;
        }
        Ok(t)
    }

    fn of(&self, state: u8) -> u64 {
        self.0.get(state as usize).copied().unwrap_or(0)
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock the programs read at a tick's resolution
/// (`bpf_ktime_get_coarse_ns`, never ahead of this one).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * ct::NS + ts.tv_nsec as u64
}

/// What the sweeper does with one entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Remove this entry (an expired connection's forward entry also takes its
    /// reverse entry with it, see [`Sweeper::round`]).
    Remove,
}

/// The rule, on one entry and the entry its `pair` names (if any). A forward entry
/// goes when it expired; a reverse entry goes when its forward entry is gone, expired
/// or names another reverse entry. The kernel keeps the state in the forward entry.
pub fn verdict(
    entry: &CtEntry,
    pair: Option<&CtEntry>,
    key: &CtKey,
    now: u64,
    t: &Timeouts,
) -> Verdict {
    let expired = |e: &CtEntry| !ct::alive(e.last_seen_ns, now, t.of(e.state));
    match entry.dir {
        CT_FORWARD if expired(entry) => Verdict::Remove,
        CT_FORWARD => Verdict::Keep,
        CT_REVERSE => match pair {
            Some(f) if f.dir == CT_FORWARD && f.pair == *key && !expired(f) => Verdict::Keep,
            _ => Verdict::Remove,
        },
        _ => Verdict::Remove,
    }
}

/// Access to a conntrack map: the kernel's, or an in-memory one in tests.
pub trait CtMap {
    /// The key after `key` in the map's order (the first with `None`).
    fn next_key(&self, key: Option<&CtKey>) -> Option<CtKey>;
    fn get(&self, key: &CtKey) -> Option<CtEntry>;
    fn remove(&mut self, key: &CtKey);
}

impl CtMap for BTreeMap<CtKey, CtEntry> {
    fn next_key(&self, key: Option<&CtKey>) -> Option<CtKey> {
        match key {
            None => self.keys().next().copied(),
            Some(k) => self
                .range((std::ops::Bound::Excluded(*k), std::ops::Bound::Unbounded))
                .next()
                .map(|(k, _)| *k),
        }
    }
    fn get(&self, key: &CtKey) -> Option<CtEntry> {
        BTreeMap::get(self, key).copied()
    }
    fn remove(&mut self, key: &CtKey) {
        BTreeMap::remove(self, key);
    }
}

impl CtMap for BpfHashMap<MapData, CtKey, CtEntry> {
    fn next_key(&self, key: Option<&CtKey>) -> Option<CtKey> {
        bpf_next_key(self.map(), key)
    }
    fn get(&self, key: &CtKey) -> Option<CtEntry> {
        IterableMap::get(self, key).ok()
    }
    fn remove(&mut self, key: &CtKey) {
        // Gone already (the kernel or LRU got there first) is as good.
        let _ = BpfHashMap::remove(self, key);
    }
}

/// BPF_MAP_GET_NEXT_KEY on the map's fd: aya's key iterator always starts at the
/// first key, and a bounded round must resume where the last one stopped. A key that
/// was deleted meanwhile makes the kernel restart from the first key, which costs a
/// repeated stretch, never a missed pass.
fn bpf_next_key(map: &MapData, key: Option<&CtKey>) -> Option<CtKey> {
    #[repr(C)]
    struct Attr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        next_key: u64,
        flags: u64,
    }
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    let mut next = CtKey::default();
    let mut attr = Attr {
        map_fd: map.fd().as_fd().as_raw_fd() as u32,
        _pad: 0,
        key: key.map_or(0, |k| k as *const CtKey as u64),
        next_key: &mut next as *mut CtKey as u64,
        flags: 0,
    };
    // SAFETY: `attr` is the map-element layout of `union bpf_attr`; the kernel reads
    // `key` (40 bytes or none) and writes 40 bytes to `next_key`, both live here.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_GET_NEXT_KEY,
            &mut attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    (ret == 0).then_some(next)
}

/// What one round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub scanned: usize,
    pub removed: usize,
    /// Entries kept over the pass that ended with this round, if one did: the fill
    /// level, counted without a separate walk of the map.
    pub pass_entries: Option<usize>,
}

/// Where the walk stands.
#[derive(Clone, Copy, Debug)]
enum Pos {
    /// At the first key.
    Start,
    /// The next key is the one after this one.
    After(CtKey),
    /// The next key is this one (found before the previous key was removed).
    At(CtKey),
}

/// The sweeper: walks the map `batch` keys per round, resuming where it stopped, and
/// removes what [`verdict`] says. A connection's two entries go together.
#[derive(Debug)]
pub struct Sweeper {
    pub batch: usize,
    pub timeouts: Timeouts,
    pos: Pos,
    /// Entries kept so far in the current pass.
    kept: usize,
}

impl Sweeper {
    pub fn new(batch: usize, timeouts: Timeouts) -> Self {
        Self {
            batch: batch.max(1),
            timeouts,
            pos: Pos::Start,
            kept: 0,
        }
    }

    fn next<M: CtMap>(&self, map: &M) -> Option<CtKey> {
        match self.pos {
            Pos::Start => map.next_key(None),
            Pos::After(k) => map.next_key(Some(&k)),
            // Removed meanwhile (by the kernel): the kernel's own rule for a missing
            // key, start again at the first one.
            Pos::At(k) if map.get(&k).is_some() => Some(k),
            Pos::At(_) => map.next_key(None),
        }
    }

    /// One bounded round at time `now` (CLOCK_MONOTONIC ns).
    pub fn round<M: CtMap>(&mut self, map: &mut M, now: u64) -> Round {
        let mut r = Round::default();
        while r.scanned < self.batch {
            let Some(key) = self.next(map) else {
                // End of the pass: start again from the first key next time.
                r.pass_entries = Some(self.kept);
                self.pos = Pos::Start;
                self.kept = 0;
                return r;
            };
            r.scanned += 1;
            self.pos = Pos::After(key);
            let Some(entry) = map.get(&key) else {
                continue;
            };
            let pair = map.get(&entry.pair);
            if verdict(&entry, pair.as_ref(), &key, now, &self.timeouts) == Verdict::Keep {
                self.kept += 1;
                continue;
            }
            // An expired connection's reverse entry goes with it.
            let with_pair = entry.dir == CT_FORWARD
                && pair.is_some_and(|p| p.dir == CT_REVERSE && p.pair == key);
            // The key to go on from, found while the keys still exist (a missing key
            // would send `next_key` back to the start).
            let mut next = map.next_key(Some(&key));
            if with_pair && next == Some(entry.pair) {
                next = map.next_key(Some(&entry.pair));
            }
            map.remove(&key);
            r.removed += 1;
            if with_pair {
                map.remove(&entry.pair);
                r.removed += 1;
            }
            match next {
                Some(n) => self.pos = Pos::At(n),
                None => {
                    r.pass_entries = Some(self.kept);
                    self.pos = Pos::Start;
                    self.kept = 0;
                    return r;
                }
            }
        }
        r
    }
}

/// Removes the UDP connections of `pairs` (frontend id, backend id) from `map`, both
/// entries of each: their next datagram picks a backend of the frontend anew. One
/// pass over the map; returns how many connections went.
pub fn remove_udp_connections<M: CtMap>(
    map: &mut M,
    pairs: &std::collections::BTreeSet<(u32, u32)>,
) -> usize {
    let mut doomed = Vec::new();
    let mut key = map.next_key(None);
    while let Some(k) = key {
        if k.proto == dataplane_common::PROTO_UDP {
            if let Some(e) = map.get(&k) {
                if e.dir == CT_FORWARD && pairs.contains(&(e.service_id, e.backend_id)) {
                    doomed.push((k, e.pair));
                }
            }
        }
        key = map.next_key(Some(&k));
    }
    // After the walk: a removed key would send `next_key` back to the start.
    for (forward, reverse) in &doomed {
        let names_it = map
            .get(reverse)
            .is_some_and(|r| r.dir == CT_REVERSE && r.pair == *forward);
        map.remove(forward);
        if names_it {
            map.remove(reverse);
        }
    }
    doomed.len()
}

/// A connection's two entries as the datapath writes them: the forward one (client
/// to frontend) and the reverse one (backend to client), each naming the other, both
/// in `state` and last seen at `last_seen_ns`. For filling a map in tests and
/// benchmarks.
pub fn connection_entries(
    fwd: CtKey,
    rev: CtKey,
    state: u8,
    last_seen_ns: u64,
) -> [(CtKey, CtEntry); 2] {
    let forward = CtEntry {
        pair: rev,
        last_seen_ns,
        dir: CT_FORWARD,
        state,
        ..CtEntry::default()
    };
    let reverse = CtEntry {
        pair: fwd,
        dir: CT_REVERSE,
        ..forward
    };
    [(fwd, forward), (rev, reverse)]
}

/// Fill level above which the agent warns: LRU eviction of live connections is near.
pub const FILL_WARNING: f64 = 0.9;

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_common::PROTO_TCP;

    const S: u64 = ct::NS;

    /// A connection's two entries, last seen at `seen` in `state`.
    fn conn(map: &mut BTreeMap<CtKey, CtEntry>, port: u16, state: u8, seen: u64) -> (CtKey, CtKey) {
        let fwd = CtKey::v4(0x0a00_0001, 0x0a60_000a, port, 80, PROTO_TCP);
        let rev = CtKey::v4(0x0af4_0b02, 0x0a00_0001, 8080, port, PROTO_TCP);
        map.extend(connection_entries(fwd, rev, state, seen));
        (fwd, rev)
    }

    #[test]
    fn expired_connections_go_with_both_entries_and_live_ones_stay() {
        let mut map = BTreeMap::new();
        let now = 1_000_000 * S;
        let t = Timeouts::default();
        let (idle_fwd, idle_rev) = conn(&mut map, 1, state::TCP_ESTABLISHED, now - 3_600 * S);
        let (dead_fwd, dead_rev) = conn(&mut map, 2, state::TCP_TIME_WAIT, now - 121 * S);
        let (closing, _) = conn(&mut map, 3, state::TCP_TIME_WAIT, now - 119 * S);
        let (udp, udp_rev) = conn(&mut map, 4, state::UDP_UNREPLIED, now - 31 * S);
        // A reverse entry whose forward entry was replaced by another connection.
        let (_, orphan) = conn(&mut map, 5, state::TCP_ESTABLISHED, now);
        map.get_mut(&orphan).unwrap().pair.sport_be = 99;
        let mut sweeper = Sweeper::new(3, t);
        let mut removed = 0;
        let mut pass = None;
        for _ in 0..10 {
            let r = sweeper.round(&mut map, now);
            assert!(r.scanned <= 3, "a round is bounded: {r:?}");
            removed += r.removed;
            if r.pass_entries.is_some() {
                pass = r.pass_entries;
                break;
            }
        }
        assert_eq!(removed, 5);
        for gone in [dead_fwd, dead_rev, udp, udp_rev, orphan] {
            assert!(!map.contains_key(&gone), "{gone:?} not removed");
        }
        for kept in [idle_fwd, idle_rev, closing] {
            assert!(map.contains_key(&kept), "{kept:?} removed");
        }
        assert_eq!(pass, Some(map.len()));
    }

    /// A UDP flow of a frontend whose backend left it goes with its reverse entry;
    /// the same backend's flows of another frontend, and TCP, stay.
    #[test]
    fn stale_udp_connections_go_with_both_entries_and_others_stay() {
        use dataplane_common::{PROTO_TCP, PROTO_UDP};
        let mut map = BTreeMap::new();
        let mut conn = |sport: u16, proto: u8, service_id: u32, backend_id: u32| {
            let fwd = CtKey::v4(1, 2, sport, 53, proto);
            let rev = CtKey::v4(3, 1, 5353, sport, proto);
            for (k, mut e) in connection_entries(fwd, rev, state::UDP_REPLIED, 1) {
                e.service_id = service_id;
                e.backend_id = backend_id;
                map.insert(k, e);
            }
        };
        conn(1000, PROTO_UDP, 7, 42);
        conn(1001, PROTO_UDP, 8, 42);
        conn(1002, PROTO_TCP, 7, 42);
        conn(1003, PROTO_UDP, 7, 43);
        let removed = remove_udp_connections(&mut map, &[(7, 42)].into());
        assert_eq!(removed, 1);
        assert_eq!(map.len(), 6, "three connections of two entries stay");
        assert!(!map.keys().any(|k| k.sport_be == 1000 || k.dport_be == 1000));
    }

    #[test]
    fn configured_timeouts_replace_the_defaults_and_bad_ones_are_refused() {
        let t =
            Timeouts::parse(&["tcp_established=3600".into(), " udp_replied = 5".into()]).unwrap();
        assert_eq!(t.0[state::TCP_ESTABLISHED as usize], 3600);
        assert_eq!(t.0[state::UDP_REPLIED as usize], 5);
        assert_eq!(t.0[state::TCP_SYN_SENT as usize], ct::DEFAULTS[0]);
        for bad in [
            "tcp=1",
            "tcp_established",
            "tcp_established=0",
            "udp_replied=x",
        ] {
            let e = Timeouts::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}

/// Conntrack settings of `sliceway-agent run`.
#[derive(Clone, Debug)]
pub struct Settings {
    pub timeouts: Timeouts,
    /// Time between sweeper rounds.
    pub sweep_interval: std::time::Duration,
    /// Keys looked at per round.
    pub sweep_batch: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timeouts: Timeouts::default(),
            sweep_interval: std::time::Duration::from_millis(1000),
            sweep_batch: 4096,
        }
    }
}

/// The sweeper on the agent's clock: a round every `sweep_interval`, the fill level
/// published after every pass, a warning when it crosses [`FILL_WARNING`].
pub struct SweepTask {
    tick: tokio::time::Interval,
    sweeper: Sweeper,
    warned: bool,
}

impl SweepTask {
    pub fn new(settings: &Settings) -> Self {
        let mut tick = tokio::time::interval(settings.sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            tick,
            sweeper: Sweeper::new(settings.sweep_batch, settings.timeouts),
            warned: false,
        }
    }

    /// Resolves when the next round is due.
    pub async fn due(&mut self) {
        self.tick.tick().await;
    }

    /// One round over the datapath's conntrack map.
    pub fn run(
        &mut self,
        dp: &mut crate::kernel::Datapath,
        metrics: &crate::serve::metrics::Metrics,
    ) {
        let capacity = dp.conntrack_capacity();
        let r = self.sweeper.round(dp.conntrack_map(), now_ns());
        if r.removed > 0 {
            tracing::debug!(scanned = r.scanned, removed = r.removed, "conntrack sweep");
        }
        if let Some(entries) = r.pass_entries {
            metrics.set_map(
                dataplane_common::map_name::CONNTRACK,
                entries as u64,
                capacity,
            );
            let fill = entries as f64 / capacity.max(1) as f64;
            if fill >= FILL_WARNING && !self.warned {
                tracing::warn!(
                    entries,
                    capacity,
                    "conntrack map is {:.0}% full: when full, the least recently used connections are evicted; raise --max-conntrack",
                    fill * 100.0
                );
                self.warned = true;
            } else if fill < FILL_WARNING * 0.9 {
                self.warned = false;
            }
        }
    }
}

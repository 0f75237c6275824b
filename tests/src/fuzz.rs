//! The differential fuzzer: random service maps (random Services and EndpointSlices
//! through the real compiler and map writer) and random packet sequences through
//! the TC program with BPF_PROG_TEST_RUN, every result compared with the reference
//! model (`crate::datapath_model`): verdict, exit reason, output bytes (checksums
//! included) and the conntrack, fragment and session-affinity entries written.
//!
//! On top of the model, invariants that hold whatever the model says are checked on
//! every packet: a checksum that verified before verifies after, no length field
//! changes, no byte after the IP datagram changes, and a packet that matches no
//! Service and no tracked connection leaves untouched.
//!
//! A run is a sequence of episodes; an episode starts from empty conntrack,
//! fragment and affinity tables with a new random set of Services and idle
//! timeouts, so a mismatch replays from its episode's manifests and packets alone
//! ([`Fixture`], printed by [`run`] as a test one can paste).
//!
//! Needs root (BPF programs, a bpffs pin directory of its own); sends nothing
//! anywhere.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};
use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use dataplane_common::{
    ct::state, map_name, stat, AffinityKey, AffinityValue, CtEntry, CtKey, FragKey, FragPorts,
    CT_FORWARD, CT_REVERSE, PROTO_ICMP, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};
use sliceway_agent::{
    compiler::{self, Options},
    kernel::packet::{build, PacketSpec},
    kernel::{Capacities, Datapath, PinDir, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
    source::local::parse_file,
    writer::MapWriter,
};

use crate::datapath_model::{
    self as model,
    checksum::{l4_verifies, sctp_crc, verifies},
    Maps, Outcome, Tables, Verdict, Write, ETH,
};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub packets: u64,
    pub seed: u64,
    /// Packets per episode (one random set of Services, empty tables at its start).
    pub episode: u64,
    /// Print every packet and its outcome.
    pub verbose: bool,
    /// Stop at the first mismatch.
    pub stop_at_first: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            packets: 100_000,
            seed: 1,
            episode: 400,
            verbose: false,
            stop_at_first: false,
        }
    }
}

/// What a run saw.
#[derive(Debug, Default)]
pub struct Report {
    pub packets: u64,
    pub mismatches: u64,
    /// The first mismatch, described, and as a test one can paste.
    pub first: Option<String>,
    /// Exits by reason, as the model named them.
    pub reasons: BTreeMap<&'static str, u64>,
    /// Packets whose outcome depended on the instant (an idle timeout ended while
    /// the kernel ran): either outcome was accepted.
    pub ambiguous: u64,
    /// Frames BPF_PROG_TEST_RUN refuses (shorter than the network header their
    /// EtherType announces), not run.
    pub untestable: u64,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} packets in {:.1?}, {} mismatches, {} decided by the instant, {} too short for BPF_PROG_TEST_RUN",
            self.packets, self.elapsed, self.mismatches, self.ambiguous, self.untestable
        )?;
        for (reason, n) in &self.reasons {
            writeln!(f, "  {reason:<22} {n}")?;
        }
        if let Some(first) = &self.first {
            writeln!(f, "first mismatch:\n{first}")?;
        }
        Ok(())
    }
}

/// A reproducible case: the maps from `manifests` (compiled for node `node-1`), the
/// idle timeouts, and the steps in order: packets (hex, Ethernet on) and `age NS
/// SEED` (time passes by NS nanoseconds for the entries a generator seeded with
/// SEED picks); the last packet is the one that went wrong.
pub struct Fixture<'a> {
    pub manifests: &'a str,
    pub timeouts: [u64; state::COUNT as usize],
    pub packets: &'a [&'a str],
}

/// Runs `fixture` on a fresh datapath: `Err` describes the first packet whose
/// result differs from the model's or breaks an invariant.
pub fn replay(fixture: &Fixture) -> Result<()> {
    let mut h = Harness::new()?;
    h.episode(fixture.manifests, fixture.timeouts)?;
    for (i, step) in fixture.packets.iter().enumerate() {
        if let Some(age) = step.strip_prefix("age ") {
            let mut parts = age.split(' ').map(str::parse::<u64>);
            let (Some(Ok(ns)), Some(Ok(seed))) = (parts.next(), parts.next()) else {
                return Err(anyhow!("step {}: bad `age NS SEED`: {step}", i + 1));
            };
            h.age(&mut Rng::new(seed), ns);
            continue;
        }
        let frame = from_hex(step).with_context(|| format!("step {}", i + 1))?;
        h.packet(&frame)
            .map_err(|e| anyhow!("step {}: {e}", i + 1))?;
    }
    Ok(())
}

/// The node's address and masquerade ports (`NAT_CONFIG`), for pods' connections
/// to external IPs: four ports, so a backend's ports run out now and then
/// (`drop_snat_exhausted`).
const NODE_NAT: dataplane_common::NatConfig = dataplane_common::NatConfig {
    node_addr_be: u32::from_be_bytes([10, 100, 0, 1]).to_be(),
    port_min: 61_000,
    port_max: 61_003,
};

/// The kernel side: a datapath pinned in a directory of its own (so the fuzzer can
/// open the maps `Datapath` does not hand out), the map writer, and the model.
struct Harness {
    dp: Datapath,
    writer: MapWriter,
    pins: PathBuf,
    fragments: BpfHashMap<MapData, FragKey, FragPorts>,
    affinity: BpfHashMap<MapData, AffinityKey, AffinityValue>,
    maps: Maps,
    tables: Tables,
    stats: [u64; stat::COUNT as usize],
    ambiguous: u64,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pins);
    }
}

fn open_pinned<K: aya::Pod, V: aya::Pod>(
    pins: &PinDir,
    name: &str,
) -> Result<BpfHashMap<MapData, K, V>> {
    let data = MapData::from_pin(pins.map(name)).with_context(|| format!("opening {name}"))?;
    let map = Map::from_map_data(data)?;
    Ok(BpfHashMap::try_from(map)?)
}

impl Harness {
    fn new() -> Result<Self> {
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = PathBuf::from(format!(
            "/sys/fs/bpf/sliceway-fuzz-{}-{n}",
            std::process::id()
        ));
        let pins = PinDir::new(&base);
        let caps = Capacities::default();
        let dp = Datapath::load(&caps, Some(&pins)).context("loading the datapath (needs root)")?;
        let fragments = open_pinned(&pins, map_name::FRAGMENTS)?;
        let affinity = open_pinned(&pins, map_name::AFFINITY)?;
        let stats = dp.stats()?;
        Ok(Self {
            dp,
            writer: MapWriter::new(caps.limits),
            pins: base,
            fragments,
            affinity,
            maps: Maps::default(),
            tables: Tables::default(),
            stats,
            ambiguous: 0,
        })
    }

    /// A new episode: these Services and timeouts, empty tables.
    fn episode(&mut self, manifests: &str, timeouts: [u64; state::COUNT as usize]) -> Result<()> {
        let (objects, problems) = parse_file("fuzz.yaml".as_ref(), manifests);
        let objects = objects.ok_or_else(|| anyhow!("manifests refused: {problems:?}"))?;
        let opts = Options {
            node_name: Some("node-1".into()),
            ..Options::default()
        };
        let compiled = compiler::compile(&objects.services, &objects.slices, &opts);
        let report = self.writer.apply(&compiled.frontends, &mut self.dp.maps);
        if !report.errors.is_empty() {
            return Err(anyhow!("map writer: {:?}", report.errors));
        }
        self.dp.set_ct_timeouts(&timeouts)?;
        self.dp.set_nat(NODE_NAT)?;
        let keys: Vec<CtKey> = self.dp.conntrack().into_iter().map(|(k, _)| k).collect();
        for k in keys {
            let _ = self.dp.conntrack_map().remove(&k);
        }
        let keys: Vec<FragKey> = self.fragments.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = self.fragments.remove(&k);
        }
        let keys: Vec<AffinityKey> = self.affinity.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = self.affinity.remove(&k);
        }
        let state = self.dp.maps.state();
        self.maps = Maps {
            services: state.services.into_iter().collect(),
            slots: state.slots.into_iter().collect(),
            backends: state.backends.into_iter().collect(),
            timeouts,
            nat: Some(NODE_NAT),
        };
        self.tables = Tables::default();
        Ok(())
    }

    /// Runs one frame through the kernel and the model; `Err` describes how they
    /// differ. The model's tables follow the kernel's outcome either way.
    fn packet(&mut self, frame: &[u8]) -> Result<Outcome, String> {
        // The programs' clock is the coarse one, kept per CPU for a tick
        // (`conntrack::now`): their time may be a tick behind the coarse clock read
        // here (two are allowed), never ahead of the fine one read after.
        let t0 = coarse_ns().saturating_sub(2 * coarse_resolution_ns());
        let out = self.dp.test_run(frame).map_err(|e| e.to_string())?;
        let t1 = monotonic_ns();
        let stats = self.dp.stats().map_err(|e| e.to_string())?;
        let counted: Vec<usize> = (0..stat::COUNT as usize)
            .filter(|&r| stats[r] != self.stats[r])
            .collect();
        let counted: Vec<(usize, u64)> = counted
            .into_iter()
            .map(|r| (r, stats[r] - self.stats[r]))
            .collect();
        self.stats = stats;
        let early = model::step(&self.maps, &self.tables, frame, t0);
        let late = model::step(&self.maps, &self.tables, frame, t1);
        let mut candidates = vec![(&early, t0)];
        if normalized(&early, t0) != normalized(&late, t1) {
            self.ambiguous += 1;
            candidates.push((&late, t1));
        }
        let mut result: Result<Outcome, String> = Err(String::new());
        for (outcome, now) in candidates {
            match self.check(outcome, now, (t0, t1), &out, &counted) {
                Ok(()) => {
                    result = Ok(outcome.clone());
                    break;
                }
                Err(e) if result.as_ref().is_err_and(|s| s.is_empty()) => result = Err(e),
                Err(_) => {}
            }
        }
        let mut invariants = invariants(frame, &out.packet, out.verdict);
        // A packet of no Service and no tracked connection leaves untouched, whatever
        // the model says.
        if let [(reason, _)] = counted[..] {
            if UNTOUCHED.contains(&(reason as u32)) && out.packet != frame {
                invariants = Err(format!(
                    "a packet that took {} was changed",
                    stat::NAMES[reason]
                ));
            }
        }
        // The model follows the kernel: the outcome that matched, or the early one.
        let chosen = match &result {
            Ok(o) => o.clone(),
            Err(_) => early.clone(),
        };
        self.commit(&chosen, t0, t1);
        match (result, invariants) {
            (Ok(o), Ok(())) => Ok(o),
            (Ok(_), Err(e)) => Err(format!("invariant broken: {e}")),
            (Err(e), inv) => Err(match inv {
                Ok(()) => e,
                Err(i) => format!("{e}; invariant broken: {i}"),
            }),
        }
    }

    /// Whether the kernel's run (`out`, and the exits `counted` with how many each)
    /// is `outcome`, evaluated at `now`.
    fn check(
        &mut self,
        outcome: &Outcome,
        now: u64,
        (t0, t1): (u64, u64),
        out: &sliceway_agent::kernel::TestRunOutput,
        counted: &[(usize, u64)],
    ) -> Result<(), String> {
        let want_reason = outcome.reason as usize;
        if counted != [(want_reason, 1)] {
            return Err(format!(
                "counted {:?} instead of one {}",
                counted
                    .iter()
                    .map(|&(r, n)| (stat::NAMES[r], n))
                    .collect::<Vec<_>>(),
                stat::NAMES[want_reason]
            ));
        }
        let want = match outcome.verdict {
            Verdict::Pass => TC_ACT_OK,
            Verdict::Drop => TC_ACT_SHOT,
            Verdict::Redirect => TC_ACT_REDIRECT,
        };
        if out.verdict != want {
            return Err(format!("verdict {} instead of {want}", out.verdict));
        }
        if let Some(p) = &outcome.packet {
            same_bytes(p, &out.packet, &outcome.loose_checksums)?;
        }
        self.same_tables(outcome, now, t0, t1)
    }

    /// Whether the kernel's tables hold what `outcome` wrote (its last write per
    /// key); times written at `now` may be anywhere in the run's window.
    fn same_tables(&mut self, outcome: &Outcome, now: u64, t0: u64, t1: u64) -> Result<(), String> {
        let in_window = |got: u64, want: u64| {
            if want == now {
                (t0..=t1).contains(&got)
            } else {
                got == want
            }
        };
        let mut last: BTreeMap<String, &Write> = BTreeMap::new();
        for w in &outcome.writes {
            last.insert(write_key(w), w);
        }
        for w in last.values() {
            match w {
                Write::Ct(k, want) => {
                    let got = self.dp.conntrack_map().get(k, 0).ok();
                    let ok = match (want, got) {
                        (None, None) => true,
                        (Some(w), Some(g)) => {
                            in_window(g.last_seen_ns, w.last_seen_ns)
                                && CtEntry {
                                    last_seen_ns: 0,
                                    ..g
                                } == CtEntry {
                                    last_seen_ns: 0,
                                    ..*w
                                }
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(format!(
                            "conntrack at {}: kernel {}, model {}",
                            show_key(k),
                            show_entry(got.as_ref()),
                            show_entry(want.as_ref())
                        ));
                    }
                }
                Write::Fragment(k, want) => {
                    let got = self.fragments.get(k, 0).ok();
                    if got.as_ref() != Some(want) {
                        return Err(format!(
                            "fragment entry {k:?}: kernel {got:?}, model {want:?}"
                        ));
                    }
                }
                Write::Affinity(k, want) => {
                    let got = self.affinity.get(k, 0).ok();
                    let ok = got.is_some_and(|g| {
                        in_window(g.last_ns, want.last_ns)
                            && (g.backend_id, g.slot) == (want.backend_id, want.slot)
                    });
                    if !ok {
                        return Err(format!(
                            "affinity entry {k:?}: kernel {got:?}, model {want:?}"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies `outcome`'s writes to the model, with the times the kernel wrote.
    fn commit(&mut self, outcome: &Outcome, t0: u64, t1: u64) {
        let mut writes = outcome.writes.clone();
        for w in &mut writes {
            match w {
                Write::Ct(k, Some(e)) if (t0..=t1).contains(&e.last_seen_ns) => {
                    if let Ok(g) = self.dp.conntrack_map().get(k, 0) {
                        e.last_seen_ns = g.last_seen_ns;
                    }
                }
                Write::Affinity(k, v) if (t0..=t1).contains(&v.last_ns) => {
                    if let Ok(g) = self.affinity.get(k, 0) {
                        v.last_ns = g.last_ns;
                    }
                }
                _ => {}
            }
        }
        self.tables.apply(&writes);
    }

    /// Time passes for some connections and clients: their last-seen times move
    /// back by `ns` in the kernel's tables and the model's alike (entries seen less
    /// than `ns` after boot stay as they are).
    fn age(&mut self, rng: &mut Rng, ns: u64) {
        let mut keys: Vec<CtKey> = self.tables.conntrack.keys().copied().collect();
        keys.sort();
        for k in keys {
            if !rng.chance(60) {
                continue;
            }
            let e = self.tables.conntrack.get_mut(&k).expect("listed");
            if e.last_seen_ns < ns {
                continue;
            }
            e.last_seen_ns -= ns;
            let e = *e;
            let _ = self.dp.conntrack_map().insert(k, e, 0);
        }
        let mut keys: Vec<AffinityKey> = self.tables.affinity.keys().copied().collect();
        keys.sort_by_key(|k| (k.client, k.service_id));
        for k in keys {
            if !rng.chance(60) {
                continue;
            }
            let v = self.tables.affinity.get_mut(&k).expect("listed");
            if v.last_ns < ns {
                continue;
            }
            v.last_ns -= ns;
            let v = *v;
            let _ = self.affinity.insert(k, v, 0);
        }
    }

    /// Every conntrack entry of the kernel against the model's.
    fn same_conntrack(&self) -> Result<(), String> {
        let kernel: BTreeMap<CtKey, CtEntry> = self.dp.conntrack().into_iter().collect();
        let model: BTreeMap<CtKey, CtEntry> = self
            .tables
            .conntrack
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        if kernel == model {
            return Ok(());
        }
        let mut diff = String::new();
        for (k, v) in &kernel {
            if model.get(k) != Some(v) {
                let _ = writeln!(
                    diff,
                    "  {}: kernel {}, model {}",
                    show_key(k),
                    show_entry(Some(v)),
                    show_entry(model.get(k))
                );
            }
        }
        for (k, v) in &model {
            if !kernel.contains_key(k) {
                let _ = writeln!(
                    diff,
                    "  {}: kernel none, model {}",
                    show_key(k),
                    show_entry(Some(v))
                );
            }
        }
        Err(format!("conntrack differs:\n{diff}"))
    }
}

fn write_key(w: &Write) -> String {
    match w {
        Write::Ct(k, _) => format!("ct {k:?}"),
        Write::Fragment(k, _) => format!("fragment {k:?}"),
        Write::Affinity(k, _) => format!("affinity {k:?}"),
    }
}

/// The outcome with the times written at `now` zeroed, to compare two evaluations.
fn normalized(o: &Outcome, now: u64) -> Outcome {
    let mut o = o.clone();
    for w in &mut o.writes {
        match w {
            Write::Ct(_, Some(e)) if e.last_seen_ns == now => e.last_seen_ns = 0,
            Write::Affinity(_, v) if v.last_ns == now => v.last_ns = 0,
            _ => {}
        }
    }
    o
}

fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC, false)
}

/// CLOCK_MONOTONIC at a tick's resolution, the programs' clock.
fn coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE, false)
}

/// The coarse clock's resolution: the kernel's tick.
fn coarse_resolution_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE, true)
}

/// `clock`'s time, or with `resolution` its resolution, in nanoseconds.
fn clock_ns(clock: libc::clockid_t, resolution: bool) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe {
        if resolution {
            libc::clock_getres(clock, &mut ts)
        } else {
            libc::clock_gettime(clock, &mut ts)
        }
    };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Byte equality, except that a checksum field at one of `loose` may hold either
/// representation of zero.
fn same_bytes(want: &[u8], got: &[u8], loose: &[usize]) -> Result<(), String> {
    let differs = want.len() != got.len()
        || (0..want.len()).any(|i| {
            if want[i] == got[i] {
                return false;
            }
            let at = loose.iter().find(|&&l| i == l || i == l + 1).copied();
            match at {
                Some(l) if l + 2 <= want.len() => {
                    let w = [want[l], want[l + 1]];
                    let g = [got[l], got[l + 1]];
                    let zero = |c: [u8; 2]| c == [0, 0] || c == [0xff, 0xff];
                    !(zero(w) && zero(g))
                }
                _ => true,
            }
        });
    if differs {
        let first = (0..want.len().min(got.len()))
            .find(|&i| want[i] != got[i])
            .unwrap_or(want.len().min(got.len()));
        return Err(format!(
            "output differs from byte {first}\n  kernel: {}\n  model:  {}",
            hex(got),
            hex(want)
        ));
    }
    Ok(())
}

/// The invariants of issue 13, checked on the kernel's output alone.
fn invariants(input: &[u8], out: &[u8], verdict: i32) -> Result<(), String> {
    if verdict == TC_ACT_REDIRECT {
        // A REJECT reply: a whole datagram with good checksums.
        if out.len() < ETH + 28 {
            return Err("a reply shorter than IP and ICMP headers".into());
        }
        let ip = &out[ETH..];
        let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        if total != ip.len() || !verifies(&ip[..20]) || !verifies(&ip[20..]) {
            return Err("a REJECT reply with a wrong length or checksum".into());
        }
        return Ok(());
    }
    if verdict != TC_ACT_OK {
        return Ok(());
    }
    if out.len() != input.len() {
        return Err(format!(
            "the frame's length changed from {} to {}",
            input.len(),
            out.len()
        ));
    }
    if input.len() < ETH + 20 || u16::from_be_bytes([input[12], input[13]]) != 0x0800 {
        return if out == input {
            Ok(())
        } else {
            Err("a frame that is not IPv4 was changed".into())
        };
    }
    let ip_in = &input[ETH..];
    let ip_out = &out[ETH..];
    // Version, IHL, total length, id, flags and fragment offset, TTL, protocol.
    for (at, name) in [
        (0, "version/IHL"),
        (2, "total length"),
        (3, "total length"),
        (4, "id"),
        (6, "fragment field"),
        (7, "fragment field"),
        (8, "TTL"),
        (9, "protocol"),
    ] {
        if ip_in[at] != ip_out[at] {
            return Err(format!("the IP {name} changed"));
        }
    }
    let ihl = (ip_in[0] & 0x0f) as usize * 4;
    let total = u16::from_be_bytes([ip_in[2], ip_in[3]]) as usize;
    if ETH + total < input.len() && input[ETH + total..] != out[ETH + total..] {
        return Err(format!(
            "bytes after the IP datagram (which ends at {}) changed",
            ETH + total
        ));
    }
    if ihl >= 20 && ip_in.len() >= ihl && verifies(&ip_in[..ihl]) && !verifies(&ip_out[..ihl]) {
        return Err("a good IP header checksum went bad".into());
    }
    let frag = u16::from_be_bytes([ip_in[6], ip_in[7]]);
    let whole = ihl >= 20 && total >= ihl && ip_in.len() >= total && frag & 0x3fff == 0;
    if whole {
        let proto = ip_in[9];
        let need = match proto {
            PROTO_TCP => 20,
            PROTO_UDP => 8,
            PROTO_ICMP => 8,
            PROTO_SCTP => 16,
            _ => 0,
        };
        if need > 0 && total >= ihl + need {
            if proto == PROTO_SCTP {
                let crc = |ip: &[u8]| {
                    u32::from_le_bytes([ip[ihl + 8], ip[ihl + 9], ip[ihl + 10], ip[ihl + 11]])
                };
                let good = |ip: &[u8]| crc(ip) == sctp_crc(&ip[ihl..total]);
                if crc(ip_in) != 0 && good(ip_in) && !good(ip_out) {
                    return Err("a good SCTP CRC went bad".into());
                }
            } else if proto == PROTO_ICMP {
                if verifies(&ip_in[ihl..total]) && !verifies(&ip_out[ihl..total]) {
                    return Err("a good ICMP checksum went bad".into());
                }
                // A quoted header whose checksum was good stays good.
                let q = ihl + 8;
                if total >= q + 20
                    && ip_in[q] == 0x45
                    && verifies(&ip_in[q..q + 20])
                    && !verifies(&ip_out[q..q + 20])
                {
                    return Err("a good quoted IP checksum went bad".into());
                }
            } else if l4_verifies(&ip_in[..total]) && !l4_verifies(&ip_out[..total]) {
                return Err("a good L4 checksum went bad".into());
            }
        }
    }
    Ok(())
}

/// Reasons whose packets leave exactly as they came.
pub const UNTOUCHED: [u32; 5] = [
    stat::PASS_NOT_IPV4,
    stat::PASS_NOT_L4,
    stat::PASS_FRAGMENT,
    stat::PASS_NO_SERVICE,
    stat::PASS_STALE_CONNTRACK,
];

fn hex(p: &[u8]) -> String {
    p.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Result<Vec<u8>> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(s.get(i..i + 2).unwrap_or("x"), 16)
                .map_err(|e| anyhow!("bad hex at {i}: {e}"))
        })
        .collect()
}

fn ip(a: u32) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::from(a.to_ne_bytes())
}

fn show_key(k: &CtKey) -> String {
    format!(
        "{}:{} > {}:{} proto {}",
        ip(k.src_be[0]),
        u16::from_be(k.sport_be),
        ip(k.dst_be[0]),
        u16::from_be(k.dport_be),
        k.proto
    )
}

fn show_entry(e: Option<&CtEntry>) -> String {
    match e {
        None => "none".into(),
        Some(e) => format!(
            "{{{} pair {} state {} flags {:#x} service {} backend {} seen {}}}",
            if e.dir == CT_FORWARD { "fwd" } else { "rev" },
            show_key(&e.pair),
            state::NAMES.get(e.state as usize).unwrap_or(&"?"),
            e.flags,
            e.service_id,
            e.backend_id,
            e.last_seen_ns
        ),
    }
}

/// splitmix64: small, fast, and the same sequence for a seed everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const VIPS: [&str; 6] = [
    "10.96.0.10",
    "10.96.0.11",
    "10.96.0.12",
    "10.96.0.13",
    "10.96.0.14",
    "10.96.0.15",
];
const EXTERNAL: [&str; 2] = ["192.0.2.10", "192.0.2.11"];
const PODS: [&str; 8] = [
    "10.244.1.2",
    "10.244.1.3",
    "10.244.1.4",
    "10.244.2.2",
    "10.244.2.3",
    "10.244.3.2",
    "10.244.3.3",
    "10.244.3.4",
];
const CLIENTS: [&str; 3] = ["10.244.9.2", "10.244.9.3", "10.244.1.2"];
const ROUTER: &str = "10.244.99.1";

/// Ports a random Service declares: name, port, protocol, target port.
type PortSet = &'static [(&'static str, u16, &'static str, u16)];
const PORT_SETS: &[PortSet] = &[
    &[("http", 80, "TCP", 8080)],
    &[("dns", 53, "UDP", 5353)],
    &[("http", 80, "TCP", 8080), ("dns", 53, "UDP", 5353)],
    &[("dns", 53, "UDP", 53), ("dnstcp", 53, "TCP", 53)],
    &[("sig", 3868, "SCTP", 3868)],
    &[("sig", 3868, "SCTP", 13868), ("http", 80, "TCP", 8080)],
];

/// Random Services and EndpointSlices, as YAML.
fn manifests(rng: &mut Rng) -> String {
    let mut y = String::new();
    let n = 1 + rng.below(5);
    let mut vips: Vec<&str> = VIPS.to_vec();
    for i in 0..n {
        let vip = vips.remove(rng.below(vips.len() as u64) as usize);
        let ports = *rng.pick(PORT_SETS);
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: default}}\nspec:\n  clusterIP: {vip}\n"
        );
        if rng.chance(20) {
            let _ = writeln!(y, "  externalIPs: [{}]", EXTERNAL[i as usize % 2]);
        }
        if rng.chance(25) {
            let t = rng.pick(&[1, 2, 30]);
            let _ = writeln!(
                y,
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {t}}}}}"
            );
        }
        if rng.chance(15) {
            y.push_str("  internalTrafficPolicy: Local\n");
        }
        y.push_str("  ports:\n");
        for (name, port, proto, _) in ports {
            let _ = writeln!(y, "  - {{name: {name}, port: {port}, protocol: {proto}}}");
        }
        for s in 0..rng.below(3) {
            let _ = write!(
                y,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-{s}, namespace: default, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports:\n"
            );
            for (name, _, proto, target) in ports {
                let target = if rng.chance(80) { *target } else { 9000 };
                let _ = writeln!(y, "- {{name: {name}, port: {target}, protocol: {proto}}}");
            }
            y.push_str("endpoints:\n");
            for _ in 0..rng.below(5) {
                let addr = rng.pick(&PODS);
                let node = rng.pick(&["node-1", "node-2"]);
                let cond = rng.pick(&[
                    "",
                    "{ready: true}",
                    "{ready: false}",
                    "{ready: false, serving: true, terminating: true}",
                ]);
                let _ = write!(y, "- {{addresses: [{addr}], nodeName: {node}");
                if !cond.is_empty() {
                    let _ = write!(y, ", conditions: {cond}");
                }
                y.push_str("}\n");
            }
        }
    }
    y
}

/// Random idle timeouts: mostly the defaults, some of seconds, so that entries
/// expire as time passes (`Harness::age` moves it on).
fn timeouts(rng: &mut Rng) -> [u64; state::COUNT as usize] {
    let mut t = [0; state::COUNT as usize];
    for v in &mut t {
        *v = *rng.pick(&[0, 0, 0, 1, 2, 5, 60]);
    }
    t
}

fn addr(s: &str) -> std::net::Ipv4Addr {
    s.parse().expect("an address")
}

fn sock(a: u32, port_be: u16) -> std::net::SocketAddrV4 {
    std::net::SocketAddrV4::new(ip(a), u16::from_be(port_be))
}

fn fix_ip_csum(p: &mut [u8]) {
    let ihl = ((p[ETH] & 0x0f) as usize * 4).clamp(20, p.len() - ETH);
    p[ETH + 10] = 0;
    p[ETH + 11] = 0;
    let c = model::checksum::Checksum::of(&p[ETH..ETH + ihl]).get();
    p[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
}

/// Packet generator: draws flows from the maps and the model's conntrack, so that
/// replies, established flows and ICMP errors meet the connections they belong to.
struct Gen {
    rng: Rng,
    /// Fragments of datagrams under way, sent in random order among other packets.
    pending: Vec<Vec<u8>>,
}

impl Gen {
    fn pick_addr(&mut self, from: &[&str]) -> std::net::Ipv4Addr {
        addr(from[self.rng.below(from.len() as u64) as usize])
    }

    fn tcp_flags(&mut self) -> u8 {
        match self.rng.below(10) {
            0..=2 => 0x02,
            3..=5 => 0x10,
            6 => 0x11,
            7 => 0x14,
            8 => 0x18,
            _ => self.rng.below(256) as u8,
        }
    }

    fn l4(
        &mut self,
        src: std::net::SocketAddrV4,
        dst: std::net::SocketAddrV4,
        proto: u8,
    ) -> Vec<u8> {
        if proto == PROTO_SCTP {
            // The first chunk: INIT, DATA, ABORT, SHUTDOWN COMPLETE, any.
            let chunk = match self.rng.below(8) {
                0..=2 => 1,
                3 | 4 => 0,
                5 => 6,
                6 => 14,
                _ => self.rng.below(256) as u8,
            };
            let mut p = build(&PacketSpec::sctp(src, dst, chunk));
            if self.rng.chance(15) {
                // A CRC the kernel has yet to compute (a pod's offload).
                p[ETH + 28..ETH + 32].copy_from_slice(&[0; 4]);
            }
            let id = self.rng.next_u64() as u16;
            p[ETH + 4..ETH + 6].copy_from_slice(&id.to_be_bytes());
            fix_ip_csum(&mut p);
            return p;
        }
        let payload: Vec<u8> = (0..self.rng.below(40))
            .map(|_| self.rng.next_u64() as u8)
            .collect();
        let mut spec = if proto == PROTO_TCP {
            PacketSpec::tcp(src, dst, self.tcp_flags())
        } else {
            PacketSpec::udp(src, dst, &payload)
        };
        if proto == PROTO_TCP {
            spec.payload = payload;
        }
        let mut p = build(&spec);
        // A random id, and DF or not.
        let id = self.rng.next_u64() as u16;
        p[ETH + 4..ETH + 6].copy_from_slice(&id.to_be_bytes());
        p[ETH + 6] = if self.rng.chance(50) { 0x40 } else { 0 };
        fix_ip_csum(&mut p);
        p
    }

    fn port(&mut self) -> u16 {
        *self.rng.pick(&[40000, 40001, 40002, 53, 80, 8080, 5353])
            + if self.rng.chance(20) {
                self.rng.below(1000) as u16
            } else {
                0
            }
    }

    /// A connection tuple from the model's conntrack in direction `dir`, if any.
    fn tracked(&mut self, tables: &Tables, dir: u8) -> Option<CtKey> {
        let keys: Vec<&CtKey> = tables
            .conntrack
            .iter()
            .filter(|(_, e)| e.dir == dir)
            .map(|(k, _)| k)
            .collect();
        if keys.is_empty() {
            return None;
        }
        let mut keys = keys;
        keys.sort();
        Some(**self.rng.pick(&keys))
    }

    fn packet(&mut self, maps: &Maps, tables: &Tables) -> Vec<u8> {
        if !self.pending.is_empty() && self.rng.chance(50) {
            let i = self.rng.below(self.pending.len() as u64) as usize;
            return self.pending.swap_remove(i);
        }
        let mut p = match self.rng.below(100) {
            0..=29 => self.new_flow(maps),
            30..=47 => match self.tracked(tables, CT_FORWARD) {
                Some(k) => self.l4(
                    sock(k.src_be[0], k.sport_be),
                    sock(k.dst_be[0], k.dport_be),
                    k.proto,
                ),
                None => self.new_flow(maps),
            },
            48..=65 => match self.tracked(tables, CT_REVERSE) {
                Some(k) => self.l4(
                    sock(k.src_be[0], k.sport_be),
                    sock(k.dst_be[0], k.dport_be),
                    k.proto,
                ),
                None => self.direct(),
            },
            66..=71 => match self
                .tracked(tables, CT_REVERSE)
                .filter(|_| self.rng.chance(70))
            {
                // A direct packet on a Service connection's reply tuple.
                Some(k) => {
                    let k = k.reversed();
                    self.l4(
                        sock(k.src_be[0], k.sport_be),
                        sock(k.dst_be[0], k.dport_be),
                        k.proto,
                    )
                }
                None => self.direct(),
            },
            72..=80 => self.icmp_error(tables, maps),
            81..=88 => {
                self.fragments(maps, tables);
                return self.packet(maps, tables);
            }
            _ => self.other(),
        };
        if self.rng.chance(20) {
            self.mutate(&mut p);
        }
        p
    }

    fn new_flow(&mut self, maps: &Maps) -> Vec<u8> {
        let mut keys: Vec<_> = maps.services.keys().copied().collect();
        keys.sort();
        let client = std::net::SocketAddrV4::new(self.pick_addr(&CLIENTS), self.port());
        if keys.is_empty() {
            let dst = std::net::SocketAddrV4::new(self.pick_addr(&VIPS), 80);
            return self.l4(client, dst, PROTO_TCP);
        }
        let k = *self.rng.pick(&keys);
        let (port, proto) = if k.proto == 0 {
            // A ClusterIP marker: some port and protocol of it.
            (
                self.port(),
                *self.rng.pick(&[PROTO_TCP, PROTO_UDP, PROTO_SCTP]),
            )
        } else {
            (u16::from_be(k.port_be), k.proto)
        };
        self.l4(
            client,
            std::net::SocketAddrV4::new(ip(k.addr_be), port),
            proto,
        )
    }

    fn direct(&mut self) -> Vec<u8> {
        let src = std::net::SocketAddrV4::new(self.pick_addr(&CLIENTS), self.port());
        let dst = std::net::SocketAddrV4::new(self.pick_addr(&PODS), self.port());
        let proto = *self.rng.pick(&[PROTO_TCP, PROTO_UDP, PROTO_SCTP]);
        self.l4(src, dst, proto)
    }

    /// An ICMP error quoting a packet of a connection (client to backend, as it left
    /// the node), sent by the backend or by a router on the way, or quoting
    /// something else.
    fn icmp_error(&mut self, tables: &Tables, maps: &Maps) -> Vec<u8> {
        let quoted = match self.tracked(tables, CT_REVERSE) {
            Some(r) if self.rng.chance(85) => {
                let k = r.reversed();
                self.l4(
                    sock(k.src_be[0], k.sport_be),
                    sock(k.dst_be[0], k.dport_be),
                    k.proto,
                )
            }
            _ => self.new_flow(maps),
        };
        let qsrc = [
            quoted[ETH + 12],
            quoted[ETH + 13],
            quoted[ETH + 14],
            quoted[ETH + 15],
        ];
        let qdst = [
            quoted[ETH + 16],
            quoted[ETH + 17],
            quoted[ETH + 18],
            quoted[ETH + 19],
        ];
        let from = if self.rng.chance(60) {
            qdst
        } else {
            addr(ROUTER).octets()
        };
        let (kind, code) =
            *self
                .rng
                .pick(&[(3u8, 3u8), (3, 4), (3, 1), (11, 0), (8, 0), (0, 0), (5, 1)]);
        let qlen = quoted.len() - ETH;
        let quote = *self
            .rng
            .pick(&[28.min(qlen), 28.min(qlen), qlen, 20.min(qlen), 24.min(qlen)]);
        let mut p = quoted[..ETH].to_vec();
        let total = 20 + 8 + quote;
        p.extend_from_slice(&[0x45, 0]);
        p.extend_from_slice(&(total as u16).to_be_bytes());
        p.extend_from_slice(&[0x43, 0x21, 0, 0, 64, 1, 0, 0]);
        p.extend_from_slice(&from);
        p.extend_from_slice(&qsrc);
        p.extend_from_slice(&[kind, code, 0, 0, 0, 0, 0x05, 0xdc]);
        p.extend_from_slice(&quoted[ETH..ETH + quote]);
        let c = model::checksum::Checksum::of(&p[ETH + 20..]).get();
        p[ETH + 22..ETH + 24].copy_from_slice(&c.to_be_bytes());
        fix_ip_csum(&mut p);
        p
    }

    /// A datagram cut into fragments, queued to go out in any order.
    fn fragments(&mut self, maps: &Maps, tables: &Tables) {
        let proto = match self.rng.below(10) {
            0..=6 => PROTO_UDP,
            7 | 8 => PROTO_TCP,
            _ => PROTO_SCTP,
        };
        let (src, dst) = match self.rng.below(3) {
            0 => match self
                .tracked(tables, CT_REVERSE)
                .filter(|k| k.proto == proto)
            {
                Some(k) => (sock(k.src_be[0], k.sport_be), sock(k.dst_be[0], k.dport_be)),
                None => return,
            },
            1 => match self
                .tracked(tables, CT_FORWARD)
                .filter(|k| k.proto == proto)
            {
                Some(k) => (sock(k.src_be[0], k.sport_be), sock(k.dst_be[0], k.dport_be)),
                None => return,
            },
            _ => {
                let p = self.new_flow(maps);
                let parsed = match sliceway_agent::kernel::packet::parse(&p) {
                    Some(x) => x,
                    None => return,
                };
                (parsed.src, parsed.dst)
            }
        };
        let payload: Vec<u8> = (0..48 + self.rng.below(160))
            .map(|_| self.rng.next_u64() as u8)
            .collect();
        let mut spec = match proto {
            PROTO_TCP => PacketSpec::tcp(src, dst, 0x18),
            PROTO_SCTP => PacketSpec::sctp(src, dst, 0),
            _ => PacketSpec::udp(src, dst, &payload),
        };
        if proto != PROTO_UDP {
            spec.payload.extend_from_slice(&payload);
        }
        let whole = build(&spec);
        let body = &whole[ETH + 20..];
        let id = self.rng.next_u64() as u16;
        let min_first = match proto {
            PROTO_TCP => 24,
            PROTO_SCTP => 16,
            _ => 8,
        };
        let cuts = 1 + self.rng.below(2);
        let mut bounds = vec![0usize];
        for _ in 0..cuts {
            let last = *bounds.last().expect("non-empty");
            let lo = (last + 8).max(min_first);
            if lo + 8 >= body.len() {
                break;
            }
            let at = lo + (self.rng.below(((body.len() - lo) / 8) as u64) as usize) * 8;
            let at = at / 8 * 8;
            if at <= last || at >= body.len() {
                break;
            }
            bounds.push(at);
        }
        bounds.push(body.len());
        for w in bounds.windows(2) {
            let (from, to) = (w[0], w[1]);
            let mut f = whole[..ETH + 20].to_vec();
            f.extend_from_slice(&body[from..to]);
            f[ETH + 2..ETH + 4].copy_from_slice(&((20 + to - from) as u16).to_be_bytes());
            f[ETH + 4..ETH + 6].copy_from_slice(&id.to_be_bytes());
            let more = if to < body.len() { 0x2000 } else { 0 };
            let field = ((from / 8) as u16) | more;
            f[ETH + 6..ETH + 8].copy_from_slice(&field.to_be_bytes());
            fix_ip_csum(&mut f);
            self.pending.push(f);
        }
    }

    /// Not TCP or UDP over IPv4: ARP, IPv6, a VLAN tag, other IP protocols, ICMP
    /// that is not an error, garbage.
    fn other(&mut self) -> Vec<u8> {
        let mut p = self.direct();
        match self.rng.below(6) {
            0 => p[12..14].copy_from_slice(&0x0806u16.to_be_bytes()),
            1 => p[12..14].copy_from_slice(&0x86ddu16.to_be_bytes()),
            2 => {
                // An 802.1Q tag in front of the IPv4 EtherType.
                p.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
            }
            3 => {
                p[ETH + 9] = *self.rng.pick(&[47u8, 132, 50, 0]);
                fix_ip_csum(&mut p);
            }
            4 => {
                p[ETH + 9] = PROTO_ICMP;
                p[ETH + 20] = *self.rng.pick(&[0u8, 8, 3, 11]);
                fix_ip_csum(&mut p);
            }
            _ => {
                for b in p.iter_mut().skip(ETH) {
                    *b = self.rng.next_u64() as u8;
                }
                if self.rng.chance(50) {
                    p[ETH] = 0x45;
                }
            }
        }
        p
    }

    /// One deliberate fault.
    fn mutate(&mut self, p: &mut Vec<u8>) {
        if p.len() < ETH + 20 || p[12..14] != [0x08, 0x00] {
            return;
        }
        match self.rng.below(9) {
            0 => {
                // Truncated at every length, one frame each (queued).
                for len in ETH..p.len() {
                    self.pending.push(p[..len].to_vec());
                }
            }
            1 => {
                let len = ETH + self.rng.below((p.len() - ETH) as u64) as usize;
                p.truncate(len);
            }
            2 => {
                p[ETH] = 0x40 | self.rng.below(16) as u8;
                fix_ip_csum(p);
            }
            3 => {
                // IP options (NOPs): header longer, datagram longer.
                let words = 1 + self.rng.below(10) as usize;
                let ihl = ((p[ETH] & 0x0f) as usize) * 4;
                if ihl != 20 {
                    return;
                }
                p.splice(ETH + 20..ETH + 20, std::iter::repeat_n(1u8, words * 4));
                p[ETH] = 0x40 | (5 + words) as u8;
                let total = u16::from_be_bytes([p[ETH + 2], p[ETH + 3]]) as usize + words * 4;
                p[ETH + 2..ETH + 4].copy_from_slice(&(total as u16).to_be_bytes());
                fix_ip_csum(p);
            }
            4 => {
                if p[ETH + 9] == PROTO_UDP && p.len() >= ETH + 28 {
                    p[ETH + 26] = 0;
                    p[ETH + 27] = 0;
                }
                if p[ETH + 9] == PROTO_SCTP && p.len() >= ETH + 32 {
                    p[ETH + 28..ETH + 32].copy_from_slice(&[0; 4]);
                }
            }
            5 => {
                // Bytes after the datagram (Ethernet padding, or worse).
                for _ in 0..1 + self.rng.below(24) {
                    p.push(self.rng.next_u64() as u8);
                }
            }
            6 => {
                // An IP total length shorter than the frame holds, anywhere.
                let total = u16::from_be_bytes([p[ETH + 2], p[ETH + 3]]);
                let short = self.rng.below(total as u64 + 1) as u16;
                p[ETH + 2..ETH + 4].copy_from_slice(&short.to_be_bytes());
                fix_ip_csum(p);
            }
            7 => {
                p[ETH] = (p[ETH] & 0x0f) | (self.rng.below(16) as u8) << 4;
                fix_ip_csum(p);
            }
            _ => {
                // Fragment bits of a datagram that was not fragmented.
                let field = self.rng.next_u64() as u16 & 0x3fff;
                p[ETH + 6..ETH + 8].copy_from_slice(&field.to_be_bytes());
                fix_ip_csum(p);
            }
        }
    }
}

/// Runs the fuzzer: `config.packets` packets over episodes of random maps.
pub fn run(config: &Config, mut progress: impl FnMut(&Report)) -> Result<Report> {
    let start = Instant::now();
    let mut rng = Rng::new(config.seed);
    let mut h = Harness::new()?;
    let mut report = Report::default();
    let mut gen = Gen {
        rng: Rng::new(rng.next_u64()),
        pending: Vec::new(),
    };
    let mut episode_manifests = String::new();
    let mut episode_timeouts = [0; state::COUNT as usize];
    // The episode's steps as a fixture lists them: packets in hex, and `age NS SEED`.
    let mut history: Vec<String> = Vec::new();
    while report.packets < config.packets {
        if report.packets % config.episode == 0 {
            episode_manifests = manifests(&mut rng);
            episode_timeouts = timeouts(&mut rng);
            h.episode(&episode_manifests, episode_timeouts)?;
            gen.pending.clear();
            history.clear();
        }
        if rng.chance(2) {
            let secs = *rng.pick(&[0.5, 1.5, 3.0, 10.0, 70.0, 130.0]);
            let (ns, seed) = ((secs * 1e9) as u64, rng.next_u64());
            h.age(&mut Rng::new(seed), ns);
            history.push(format!("age {ns} {seed}"));
        }
        let frame = gen.packet(&h.maps, &h.tables);
        if !testable(&frame) {
            report.untestable += 1;
            continue;
        }
        report.packets += 1;
        history.push(hex(&frame));
        let result = h.packet(&frame);
        let result = result.and_then(|o| {
            if report.packets % 250 == 0 {
                h.same_conntrack()?;
            }
            Ok(o)
        });
        match result {
            Ok(o) => {
                *report
                    .reasons
                    .entry(stat::NAMES[o.reason as usize])
                    .or_default() += 1;
                if config.verbose {
                    println!(
                        "{} {} {}",
                        report.packets,
                        stat::NAMES[o.reason as usize],
                        hex(&frame)
                    );
                }
            }
            Err(e) => {
                report.mismatches += 1;
                if config.verbose {
                    println!("{} MISMATCH {} {e}", report.packets, hex(&frame));
                }
                if report.first.is_none() {
                    report.first = Some(describe(
                        &e,
                        &episode_manifests,
                        episode_timeouts,
                        &history,
                        config.seed,
                        report.packets,
                    ));
                    if config.stop_at_first {
                        break;
                    }
                }
                // Start the episode again from clean tables.
                h.episode(&episode_manifests, episode_timeouts)?;
                gen.pending.clear();
                history.clear();
            }
        }
        if report.packets % 10_000 == 0 {
            report.elapsed = start.elapsed();
            report.ambiguous = h.ambiguous;
            progress(&report);
        }
    }
    report.elapsed = start.elapsed();
    report.ambiguous = h.ambiguous;
    Ok(report)
}

/// Whether BPF_PROG_TEST_RUN takes the frame: it refuses frames shorter than
/// Ethernet, and IPv4 (IPv6) frames shorter than an IPv4 (IPv6) header, which no
/// driver delivers to TC either.
fn testable(frame: &[u8]) -> bool {
    if frame.len() < ETH {
        return false;
    }
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0800 => frame.len() >= ETH + 20,
        0x86dd => frame.len() >= ETH + 40,
        _ => true,
    }
}

/// The mismatch, and the shortest tail of its episode that still shows it, as a
/// test to paste.
fn describe(
    error: &str,
    manifests: &str,
    timeouts: [u64; state::COUNT as usize],
    hexes: &[String],
    seed: u64,
    at: u64,
) -> String {
    let mut keep = hexes.len();
    for n in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
        if n >= hexes.len() {
            break;
        }
        let tail: Vec<&str> = hexes[hexes.len() - n..]
            .iter()
            .map(String::as_str)
            .collect();
        let fixture = Fixture {
            manifests,
            timeouts,
            packets: &tail,
        };
        if replay(&fixture).is_err() {
            keep = n;
            break;
        }
    }
    let mut s = format!("packet {at} (seed {seed}): {error}\n\n");
    let _ = writeln!(
        s,
        "#[test]\nfn fuzz_seed_{seed}_packet_{at}() {{\n    sliceway_lab::fuzz::replay(&sliceway_lab::fuzz::Fixture {{\n        manifests: r#\"{manifests}\"#,\n        timeouts: {timeouts:?},\n        packets: &["
    );
    for h in &hexes[hexes.len() - keep..] {
        let _ = writeln!(s, "            \"{h}\",");
    }
    s.push_str("        ],\n    })\n    .unwrap();\n}\n");
    s
}

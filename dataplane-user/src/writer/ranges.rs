//! `loadBalancerSourceRanges` in the kernel: the `SOURCE_RANGES` longest-prefix-match
//! map, (frontend, source prefix) → allowed, kept in step with the compiled
//! frontends by [`RangeWriter`], the only writer of that map.
//!
//! Order: a frontend's new ranges are written before the map writer publishes its
//! `SERVICES` entry (whose `SVC_F_SOURCE_RANGES` flag makes the programs look here),
//! and its stale ranges are removed after, so an allowed source is never refused
//! while a Service changes; a frontend that goes loses its ranges after its entry.
//! Entries are keyed by the frontend's address, port and protocol, not by the map
//! writer's ids, so the two writers need nothing from each other.
//!
//! IPv6's frontends have their ranges in `SOURCE_RANGES6`, kept by a
//! `RangeWriter<V6>` the same way.

use std::collections::{BTreeMap, BTreeSet};

use dataplane_common::{ServiceKey, ServiceKey6, SourceRange, SourceRange6, SCOPE_ANY};

use crate::writer::Desired;

/// The map operations of [`RangeWriter`]: the kernel's maps, or memory in tests.
pub trait RangeOps {
    type Error: std::fmt::Display;
    fn put_range(&mut self, prefix_len: u32, range: &SourceRange) -> Result<(), Self::Error>;
    fn del_range(&mut self, prefix_len: u32, range: &SourceRange) -> Result<(), Self::Error>;
    /// Every entry the map holds (what an earlier run left, at the first sync).
    fn ranges(&self) -> Result<Vec<(u32, SourceRange)>, Self::Error>;
    /// `SOURCE_RANGES6`.
    fn put_range6(&mut self, prefix_len: u32, range: &SourceRange6) -> Result<(), Self::Error>;
    fn del_range6(&mut self, prefix_len: u32, range: &SourceRange6) -> Result<(), Self::Error>;
    fn ranges6(&self) -> Result<Vec<(u32, SourceRange6)>, Self::Error>;
}

/// A family's source-range map: its frontend keys, entries and map operations.
pub trait RangeFamily {
    type Key: Copy + Ord + std::fmt::Debug;
    type Range: Copy + Ord + std::fmt::Debug;
    /// The map's name, for messages.
    const MAP: &'static str;
    /// The entries frontend `key` wants (none if it is gone).
    fn wanted(desired: &Desired<'_>, key: &Self::Key) -> BTreeSet<(u32, Self::Range)>;
    fn scope(key: &Self::Key) -> u8;
    fn frontend(range: &Self::Range) -> Self::Key;
    fn put<M: RangeOps>(ops: &mut M, len: u32, range: &Self::Range) -> Result<(), M::Error>;
    fn del<M: RangeOps>(ops: &mut M, len: u32, range: &Self::Range) -> Result<(), M::Error>;
    fn list<M: RangeOps>(ops: &M) -> Result<Vec<(u32, Self::Range)>, M::Error>;
    /// An entry as text: the frontend and the source prefix.
    fn name(e: &(u32, Self::Range)) -> String;
}

/// IPv4's `SOURCE_RANGES`.
#[derive(Debug, Default)]
pub struct V4;

/// IPv6's `SOURCE_RANGES6`.
#[derive(Debug, Default)]
pub struct V6;

impl RangeFamily for V4 {
    type Key = ServiceKey;
    type Range = SourceRange;
    const MAP: &'static str = dataplane_common::map_name::SOURCE_RANGES;
    fn wanted(desired: &Desired<'_>, key: &ServiceKey) -> BTreeSet<(u32, SourceRange)> {
        let Some(f) = desired.v4.get(key) else {
            return BTreeSet::new();
        };
        f.source_ranges
            .iter()
            .map(|&(addr_be, len)| {
                (
                    SourceRange::FRONTEND_BITS + u32::from(len),
                    SourceRange::of(*key, addr_be),
                )
            })
            .collect()
    }
    fn scope(key: &ServiceKey) -> u8 {
        key.scope
    }
    fn frontend(range: &SourceRange) -> ServiceKey {
        range.frontend
    }
    fn put<M: RangeOps>(ops: &mut M, len: u32, range: &SourceRange) -> Result<(), M::Error> {
        ops.put_range(len, range)
    }
    fn del<M: RangeOps>(ops: &mut M, len: u32, range: &SourceRange) -> Result<(), M::Error> {
        ops.del_range(len, range)
    }
    fn list<M: RangeOps>(ops: &M) -> Result<Vec<(u32, SourceRange)>, M::Error> {
        ops.ranges()
    }
    fn name(e: &(u32, SourceRange)) -> String {
        format!(
            "{} from {}/{}",
            crate::compiler::frontend_addr(&e.1.frontend),
            std::net::Ipv4Addr::from(u32::from_be(e.1.src_be)),
            e.0.saturating_sub(SourceRange::FRONTEND_BITS)
        )
    }
}

impl RangeFamily for V6 {
    type Key = ServiceKey6;
    type Range = SourceRange6;
    const MAP: &'static str = dataplane_common::map_name::SOURCE_RANGES6;
    fn wanted(desired: &Desired<'_>, key: &ServiceKey6) -> BTreeSet<(u32, SourceRange6)> {
        let Some(f) = desired.v6.get(key) else {
            return BTreeSet::new();
        };
        f.source_ranges
            .iter()
            .map(|&(addr_be, len)| {
                (
                    SourceRange6::FRONTEND_BITS + u32::from(len),
                    SourceRange6::of(*key, addr_be),
                )
            })
            .collect()
    }
    fn scope(key: &ServiceKey6) -> u8 {
        key.scope
    }
    fn frontend(range: &SourceRange6) -> ServiceKey6 {
        range.frontend
    }
    fn put<M: RangeOps>(ops: &mut M, len: u32, range: &SourceRange6) -> Result<(), M::Error> {
        ops.put_range6(len, range)
    }
    fn del<M: RangeOps>(ops: &mut M, len: u32, range: &SourceRange6) -> Result<(), M::Error> {
        ops.del_range6(len, range)
    }
    fn list<M: RangeOps>(ops: &M) -> Result<Vec<(u32, SourceRange6)>, M::Error> {
        ops.ranges6()
    }
    fn name(e: &(u32, SourceRange6)) -> String {
        format!(
            "{} from {}/{}",
            crate::compiler::frontend_addr6(&e.1.frontend),
            crate::compiler::format::ipv6_of(e.1.src_be),
            e.0.saturating_sub(SourceRange6::FRONTEND_BITS)
        )
    }
}

/// One entry: prefix length and data.
type Entry<F> = (u32, <F as RangeFamily>::Range);

/// The `SOURCE_RANGES` (or, for [`V6`], `SOURCE_RANGES6`) mirror and its writes.
#[derive(Debug)]
pub struct RangeWriter<F: RangeFamily = V4> {
    /// What the kernel holds, by frontend (its `SCOPE_ANY` key).
    programmed: BTreeMap<F::Key, BTreeSet<Entry<F>>>,
    /// Entries found in the map at the first sync that belong to no frontend now.
    leftovers: BTreeSet<Entry<F>>,
    listed: bool,
    /// Frontends with a write that failed in `before`: not recorded as held, so
    /// their next sync writes their ranges again.
    failed: BTreeSet<F::Key>,
}

impl<F: RangeFamily> Default for RangeWriter<F> {
    fn default() -> Self {
        Self {
            programmed: BTreeMap::new(),
            leftovers: BTreeSet::new(),
            listed: false,
            failed: BTreeSet::new(),
        }
    }
}

impl<F: RangeFamily> RangeWriter<F> {
    /// Writes the new ranges of the frontends at `keys` (every frontend at the first
    /// sync), before the map writer publishes them. Errors are said, not fatal: a
    /// range not written refuses its sources until the frontend's next sync (its
    /// Service's next change) writes it again.
    pub fn before<'d, M: RangeOps>(
        &mut self,
        frontends: impl Into<Desired<'d>>,
        keys: &BTreeSet<F::Key>,
        ops: &mut M,
    ) -> Vec<String> {
        let frontends = frontends.into();
        let mut errors = Vec::new();
        if !self.listed {
            self.listed = true;
            match F::list(ops) {
                Ok(found) => self.leftovers = found.into_iter().collect(),
                Err(e) => errors.push(format!("listing {}: {e}", F::MAP)),
            }
        }
        for key in keys.iter().filter(|k| F::scope(k) == SCOPE_ANY) {
            let want = F::wanted(&frontends, key);
            let have = self.programmed.get(key);
            for e in &want {
                if have.is_some_and(|h| h.contains(e)) {
                    continue;
                }
                if let Err(err) = F::put(ops, e.0, &e.1) {
                    errors.push(format!("writing a source range of {key:?}: {err}"));
                    self.failed.insert(*key);
                }
                self.leftovers.remove(e);
            }
        }
        errors
    }

    /// Removes what the frontends at `keys` no longer allow (after the map writer),
    /// and at the first sync what an earlier run left for frontends gone since.
    pub fn after<'d, M: RangeOps>(
        &mut self,
        frontends: impl Into<Desired<'d>>,
        keys: &BTreeSet<F::Key>,
        ops: &mut M,
    ) -> Vec<String> {
        let frontends = frontends.into();
        let mut errors = Vec::new();
        for key in keys.iter().filter(|k| F::scope(k) == SCOPE_ANY) {
            let want = F::wanted(&frontends, key);
            let have = self.programmed.remove(key).unwrap_or_default();
            for e in have.difference(&want) {
                if let Err(err) = F::del(ops, e.0, &e.1) {
                    errors.push(format!("removing a source range of {key:?}: {err}"));
                }
            }
            if !want.is_empty() && !self.failed.remove(key) {
                self.programmed.insert(*key, want);
            }
        }
        for e in std::mem::take(&mut self.leftovers) {
            let still = F::wanted(&frontends, &F::frontend(&e.1)).contains(&e);
            if !still {
                if let Err(err) = F::del(ops, e.0, &e.1) {
                    errors.push(format!("removing a stale source range: {err}"));
                }
            }
        }
        errors
    }

    /// The drift audit of `SOURCE_RANGES`: entries the writer wrote that the map
    /// lacks are written again, entries the map holds that no frontend has are
    /// removed (after the writes, so an allowed source is never refused meanwhile).
    pub fn audit<M: RangeOps>(&self, ops: &mut M, report: &mut crate::writer::audit::AuditReport) {
        use crate::writer::audit::{Drift, DriftKind};
        let actual: BTreeSet<Entry<F>> = match F::list(ops) {
            Ok(found) => found.into_iter().collect(),
            Err(e) => {
                report.errors.push(format!("listing {}: {e}", F::MAP));
                return;
            }
        };
        let expected: BTreeSet<Entry<F>> = self.programmed.values().flatten().copied().collect();
        let name = |e: &Entry<F>| F::name(e);
        let missing: Vec<&Entry<F>> = expected.difference(&actual).collect();
        let extra: Vec<&Entry<F>> = actual.difference(&expected).collect();
        for (list, kind) in [(&missing, DriftKind::Missing), (&extra, DriftKind::Extra)] {
            for e in list {
                report.drift.push(Drift {
                    map: F::MAP.to_string(),
                    entry: name(e),
                    kind,
                    service: None,
                });
            }
        }
        for e in missing {
            report.repaired += 1;
            if let Err(err) = F::put(ops, e.0, &e.1) {
                report
                    .errors
                    .push(format!("writing source range {}: {err}", name(e)));
            }
        }
        for e in extra {
            report.repaired += 1;
            if let Err(err) = F::del(ops, e.0, &e.1) {
                report
                    .errors
                    .push(format!("removing source range {}: {err}", name(e)));
            }
        }
    }

    /// Entries held, all frontends together.
    pub fn len(&self) -> usize {
        self.programmed.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.programmed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        writer::audit::{AuditReport, DriftKind},
        writer::memory_maps::MemoryMaps,
    };

    /// A frontend's ranges written, then changed behind the writer's back: the
    /// audit names both differences and puts the map back as written.
    #[test]
    fn the_audit_finds_and_repairs_source_ranges_changed_behind_its_back() {
        let key = ServiceKey {
            addr_be: u32::from_be_bytes([192, 0, 2, 10]).to_be(),
            port_be: 80u16.to_be(),
            proto: dataplane_common::PROTO_TCP,
            scope: SCOPE_ANY,
        };
        let net = u32::from_be_bytes([10, 0, 0, 0]).to_be();
        let frontend = crate::compiler::Frontend {
            service: crate::compiler::ServicePortName::unknown(),
            backends: Vec::new(),
            policy: Default::default(),
            source_ranges: vec![(net, 8)],
        };
        let frontends = BTreeMap::from([(key, frontend)]);
        let keys = BTreeSet::from([key]);
        let mut maps = MemoryMaps::default();
        let mut w: RangeWriter = RangeWriter::default();
        assert!(w.before(&frontends, &keys, &mut maps).is_empty());
        assert!(w.after(&frontends, &keys, &mut maps).is_empty());
        let written = maps.ranges.clone();
        assert_eq!(written.len(), 1);
        let mut clean = AuditReport::default();
        w.audit(&mut maps, &mut clean);
        assert!(clean.drift.is_empty() && clean.repaired == 0);

        // Someone removed the entry and added another.
        maps.ranges.clear();
        let stray = (
            72,
            SourceRange::of(key, u32::from_be_bytes([172, 16, 0, 0]).to_be()),
        );
        maps.ranges.insert(stray);
        let mut report = AuditReport::default();
        w.audit(&mut maps, &mut report);
        let kinds: Vec<(DriftKind, &str)> = report
            .drift
            .iter()
            .map(|d| (d.kind, d.entry.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (DriftKind::Missing, "192.0.2.10:80/TCP from 10.0.0.0/8"),
                (DriftKind::Extra, "192.0.2.10:80/TCP from 172.16.0.0/8"),
            ]
        );
        assert_eq!(report.repaired, 2);
        assert_eq!(maps.ranges, written);
    }
}

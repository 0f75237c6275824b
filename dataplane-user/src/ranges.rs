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

use std::collections::{BTreeMap, BTreeSet};

use dataplane_common::{ServiceKey, SourceRange, SCOPE_ANY};

use crate::compiler::Frontend;

/// The map operations of [`RangeWriter`]: the kernel's map, or memory in tests.
pub trait RangeOps {
    type Error: std::fmt::Display;
    fn put_range(&mut self, prefix_len: u32, range: &SourceRange) -> Result<(), Self::Error>;
    fn del_range(&mut self, prefix_len: u32, range: &SourceRange) -> Result<(), Self::Error>;
    /// Every entry the map holds (what an earlier run left, at the first sync).
    fn ranges(&self) -> Result<Vec<(u32, SourceRange)>, Self::Error>;
}

/// One entry: prefix length and data.
type Entry = (u32, SourceRange);

/// The entries of one frontend's ranges.
fn entries(key: &ServiceKey, ranges: &[(u32, u8)]) -> BTreeSet<Entry> {
    ranges
        .iter()
        .map(|&(addr_be, len)| {
            (
                SourceRange::FRONTEND_BITS + u32::from(len),
                SourceRange::of(*key, addr_be),
            )
        })
        .collect()
}

/// The entries frontend `key` wants (none if it is gone).
fn wanted(frontends: &BTreeMap<ServiceKey, Frontend>, key: &ServiceKey) -> BTreeSet<Entry> {
    frontends
        .get(key)
        .map(|f| entries(key, &f.source_ranges))
        .unwrap_or_default()
}

/// The `SOURCE_RANGES` mirror and its writes.
#[derive(Debug, Default)]
pub struct RangeWriter {
    /// What the kernel holds, by frontend (its `SCOPE_ANY` key).
    programmed: BTreeMap<ServiceKey, BTreeSet<Entry>>,
    /// Entries found in the map at the first sync that belong to no frontend now.
    leftovers: BTreeSet<Entry>,
    listed: bool,
    /// Frontends with a write that failed in `before`: not recorded as held, so
    /// their next sync writes their ranges again.
    failed: BTreeSet<ServiceKey>,
}

impl RangeWriter {
    /// Writes the new ranges of the frontends at `keys` (every frontend at the first
    /// sync), before the map writer publishes them. Errors are said, not fatal: a
    /// range not written refuses its sources until the frontend's next sync (its
    /// Service's next change) writes it again.
    pub fn before<M: RangeOps>(
        &mut self,
        frontends: &BTreeMap<ServiceKey, Frontend>,
        keys: &BTreeSet<ServiceKey>,
        ops: &mut M,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        if !self.listed {
            self.listed = true;
            match ops.ranges() {
                Ok(found) => self.leftovers = found.into_iter().collect(),
                Err(e) => errors.push(format!("listing SOURCE_RANGES: {e}")),
            }
        }
        for key in keys.iter().filter(|k| k.scope == SCOPE_ANY) {
            let want = wanted(frontends, key);
            let have = self.programmed.get(key);
            for e in &want {
                if have.is_some_and(|h| h.contains(e)) {
                    continue;
                }
                if let Err(err) = ops.put_range(e.0, &e.1) {
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
    pub fn after<M: RangeOps>(
        &mut self,
        frontends: &BTreeMap<ServiceKey, Frontend>,
        keys: &BTreeSet<ServiceKey>,
        ops: &mut M,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        for key in keys.iter().filter(|k| k.scope == SCOPE_ANY) {
            let want = wanted(frontends, key);
            let have = self.programmed.remove(key).unwrap_or_default();
            for e in have.difference(&want) {
                if let Err(err) = ops.del_range(e.0, &e.1) {
                    errors.push(format!("removing a source range of {key:?}: {err}"));
                }
            }
            if !want.is_empty() && !self.failed.remove(key) {
                self.programmed.insert(*key, want);
            }
        }
        for e in std::mem::take(&mut self.leftovers) {
            let still = wanted(frontends, &e.1.frontend).contains(&e);
            if !still {
                if let Err(err) = ops.del_range(e.0, &e.1) {
                    errors.push(format!("removing a stale source range: {err}"));
                }
            }
        }
        errors
    }

    /// The drift audit of `SOURCE_RANGES`: entries the writer wrote that the map
    /// lacks are written again, entries the map holds that no frontend has are
    /// removed (after the writes, so an allowed source is never refused meanwhile).
    pub fn audit<M: RangeOps>(&self, ops: &mut M, report: &mut crate::audit::AuditReport) {
        use crate::audit::{Drift, DriftKind};
        let actual: BTreeSet<Entry> = match ops.ranges() {
            Ok(found) => found.into_iter().collect(),
            Err(e) => {
                report.errors.push(format!("listing SOURCE_RANGES: {e}"));
                return;
            }
        };
        let expected: BTreeSet<Entry> = self.programmed.values().flatten().copied().collect();
        let name = |e: &Entry| {
            format!(
                "{} from {}/{}",
                crate::compiler::frontend_addr(&e.1.frontend),
                std::net::Ipv4Addr::from(u32::from_be(e.1.src_be)),
                e.0.saturating_sub(SourceRange::FRONTEND_BITS)
            )
        };
        let missing: Vec<&Entry> = expected.difference(&actual).collect();
        let extra: Vec<&Entry> = actual.difference(&expected).collect();
        for (list, kind) in [(&missing, DriftKind::Missing), (&extra, DriftKind::Extra)] {
            for e in list {
                report.drift.push(Drift {
                    map: dataplane_common::map_name::SOURCE_RANGES.to_string(),
                    entry: name(e),
                    kind,
                    service: None,
                });
            }
        }
        for e in missing {
            report.repaired += 1;
            if let Err(err) = ops.put_range(e.0, &e.1) {
                report
                    .errors
                    .push(format!("writing source range {}: {err}", name(e)));
            }
        }
        for e in extra {
            report.repaired += 1;
            if let Err(err) = ops.del_range(e.0, &e.1) {
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
        audit::{AuditReport, DriftKind},
        memory_maps::MemoryMaps,
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
        let frontend = Frontend {
            service: crate::compiler::ServicePortName::unknown(),
            backends: Vec::new(),
            policy: Default::default(),
            source_ranges: vec![(net, 8)],
        };
        let frontends = BTreeMap::from([(key, frontend)]);
        let keys = BTreeSet::from([key]);
        let mut maps = MemoryMaps::default();
        let mut w = RangeWriter::default();
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

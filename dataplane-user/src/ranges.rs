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
            let want = frontends
                .get(key)
                .map(|f| entries(key, &f.source_ranges))
                .unwrap_or_default();
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
            let want = frontends
                .get(key)
                .map(|f| entries(key, &f.source_ranges))
                .unwrap_or_default();
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
            let still = frontends
                .get(&e.1.frontend)
                .is_some_and(|f| entries(&e.1.frontend, &f.source_ranges).contains(&e));
            if !still {
                if let Err(err) = ops.del_range(e.0, &e.1) {
                    errors.push(format!("removing a stale source range: {err}"));
                }
            }
        }
        errors
    }

    /// Entries held, all frontends together.
    pub fn len(&self) -> usize {
        self.programmed.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.programmed.is_empty()
    }
}

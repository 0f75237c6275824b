//! The map writer: the only code that writes the service maps.
//!
//! This folder is the stage from desired state to map state: this module writes the
//! service maps, [`maglev`] computes the tables it publishes as slots, [`ranges`]
//! writes `SOURCE_RANGES`, [`audit`] compares the kernel's maps with what was written
//! and repairs them, [`conntrack`] sweeps expired connections out of `CONNTRACK`, and
//! [`memory_maps`] holds the service maps in memory for tests and golden dumps.
//!
//! It keeps a mirror of what the kernel holds and, given the desired frontends,
//! writes only the difference, in an order that never shows a packet a half-written
//! Service: for each frontend its new backends first, then its slots, then the service
//! entry that publishes the slot count; stale slots after that; removed frontends and
//! orphan backends last.
//!
//! Slots move as little as possible: a backend that stays keeps its slot, a removed
//! backend's slot is filled by a new backend or by the frontend's last slot, so adding
//! or removing one endpoint costs a handful of map writes whatever the cluster size.
//! A frontend with a Maglev table ([`crate::writer::maglev`], the frontends traffic from
//! outside reaches) publishes the table as its slots instead, the same on every node;
//! a change writes the entries that moved (about M/N when one of N backends comes or
//! goes).
//!
//! [`MapWriter::apply`] compares every frontend; [`MapWriter::apply_changed`] looks
//! only at the frontends said to have changed (and at those rejected before, which
//! are retried), in the same order and with the same operations, so its cost follows
//! the change and not the cluster.
//!
//! Both families go through the same writer, in the same order: IPv6 frontends
//! (`SERVICES6`) and backends (`BACKENDS6`) take their ids from the same allocators
//! as IPv4's, since `SLOTS`, `SERVICE_NAMES` and the counters are indexed by them,
//! so a backend id names one backend in `BACKENDS` or in `BACKENDS6`, never both.

pub mod audit;
pub mod cidrs;
pub mod conntrack;
pub mod maglev;
pub mod memory_maps;
pub mod ranges;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use dataplane_common::{
    Backend, Backend6, ServiceKey, ServiceKey6, ServiceName, ServiceValue, SlotKey,
};

use crate::compiler::{
    AnyBackend, Frontend, Frontend6, FrontendKey, FrontendPolicy, ServicePortName,
};

/// The map operations the writer issues. Implemented by the kernel maps and by the
/// in-memory recorder the tests use.
pub trait MapOps {
    type Error: std::fmt::Display;
    fn put_backend(&mut self, id: u32, backend: &Backend) -> Result<(), Self::Error>;
    fn del_backend(&mut self, id: u32) -> Result<(), Self::Error>;
    fn put_slot(&mut self, key: &SlotKey, backend_id: u32) -> Result<(), Self::Error>;
    fn del_slot(&mut self, key: &SlotKey) -> Result<(), Self::Error>;
    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), Self::Error>;
    fn del_service(&mut self, key: &ServiceKey) -> Result<(), Self::Error>;
    fn put_name(&mut self, id: u32, name: &ServiceName) -> Result<(), Self::Error>;
    fn del_name(&mut self, id: u32) -> Result<(), Self::Error>;
    /// `BACKENDS6`.
    fn put_backend6(&mut self, id: u32, backend: &Backend6) -> Result<(), Self::Error>;
    fn del_backend6(&mut self, id: u32) -> Result<(), Self::Error>;
    /// `SERVICES6`.
    fn put_service6(&mut self, key: &ServiceKey6, value: &ServiceValue) -> Result<(), Self::Error>;
    fn del_service6(&mut self, key: &ServiceKey6) -> Result<(), Self::Error>;
}

pub(crate) fn put_any_backend<M: MapOps>(
    maps: &mut M,
    id: u32,
    b: &AnyBackend,
) -> Result<(), M::Error> {
    match b {
        AnyBackend::V4(b) => maps.put_backend(id, b),
        AnyBackend::V6(b) => maps.put_backend6(id, b),
    }
}

pub(crate) fn del_any_backend<M: MapOps>(
    maps: &mut M,
    id: u32,
    b: &AnyBackend,
) -> Result<(), M::Error> {
    match b {
        AnyBackend::V4(_) => maps.del_backend(id),
        AnyBackend::V6(_) => maps.del_backend6(id),
    }
}

pub(crate) fn put_any_service<M: MapOps>(
    maps: &mut M,
    key: &FrontendKey,
    value: &ServiceValue,
) -> Result<(), M::Error> {
    match key {
        FrontendKey::V4(k) => maps.put_service(k, value),
        FrontendKey::V6(k) => maps.put_service6(k, value),
    }
}

pub(crate) fn del_any_service<M: MapOps>(maps: &mut M, key: &FrontendKey) -> Result<(), M::Error> {
    match key {
        FrontendKey::V4(k) => maps.del_service(k),
        FrontendKey::V6(k) => maps.del_service6(k),
    }
}

/// The frontends the maps should hold, of both families.
#[derive(Clone, Copy, Debug)]
pub struct Desired<'a> {
    pub v4: &'a BTreeMap<ServiceKey, Frontend>,
    pub v6: &'a BTreeMap<ServiceKey6, Frontend6>,
}

/// No IPv6 frontend.
static NO_FRONTENDS6: BTreeMap<ServiceKey6, Frontend6> = BTreeMap::new();

/// IPv4 frontends only: the maps hold no IPv6 frontend.
impl<'a> From<&'a BTreeMap<ServiceKey, Frontend>> for Desired<'a> {
    fn from(v4: &'a BTreeMap<ServiceKey, Frontend>) -> Self {
        Self {
            v4,
            v6: &NO_FRONTENDS6,
        }
    }
}

impl<'a> Desired<'a> {
    fn get(&self, key: &FrontendKey) -> Option<FrontendRef<'a>> {
        match key {
            FrontendKey::V4(k) => self.v4.get(k).map(FrontendRef::V4),
            FrontendKey::V6(k) => self.v6.get(k).map(FrontendRef::V6),
        }
    }

    fn contains(&self, key: &FrontendKey) -> bool {
        match key {
            FrontendKey::V4(k) => self.v4.contains_key(k),
            FrontendKey::V6(k) => self.v6.contains_key(k),
        }
    }

    /// Every frontend, IPv4's first.
    fn iter(&self) -> impl Iterator<Item = (FrontendKey, FrontendRef<'a>)> + 'a {
        let v4 = self
            .v4
            .iter()
            .map(|(k, f)| (FrontendKey::V4(*k), FrontendRef::V4(f)));
        let v6 = self
            .v6
            .iter()
            .map(|(k, f)| (FrontendKey::V6(*k), FrontendRef::V6(f)));
        v4.chain(v6)
    }
}

/// A desired frontend of either family.
#[derive(Clone, Copy, Debug)]
enum FrontendRef<'a> {
    V4(&'a Frontend),
    V6(&'a Frontend6),
}

impl<'a> FrontendRef<'a> {
    fn service(&self) -> &'a ServicePortName {
        match self {
            Self::V4(f) => &f.service,
            Self::V6(f) => &f.service,
        }
    }

    fn policy(&self) -> FrontendPolicy {
        match self {
            Self::V4(f) => f.policy,
            Self::V6(f) => f.policy,
        }
    }

    fn backend_count(&self) -> usize {
        match self {
            Self::V4(f) => f.backends.len(),
            Self::V6(f) => f.backends.len(),
        }
    }

    /// The backends, sorted (each family's order is kept by `AnyBackend`'s).
    fn backends(&self) -> Vec<AnyBackend> {
        match self {
            Self::V4(f) => f.backends.iter().map(|b| AnyBackend::V4(*b)).collect(),
            Self::V6(f) => f.backends.iter().map(|b| AnyBackend::V6(*b)).collect(),
        }
    }

    /// Whether `have` (sorted) are the frontend's backends.
    fn backends_are(&self, have: &[AnyBackend]) -> bool {
        match self {
            Self::V4(f) => have
                .iter()
                .copied()
                .eq(f.backends.iter().map(|b| AnyBackend::V4(*b))),
            Self::V6(f) => have
                .iter()
                .copied()
                .eq(f.backends.iter().map(|b| AnyBackend::V6(*b))),
        }
    }

    /// The frontend's Maglev table, as indexes into its backends.
    fn table(&self, m: crate::writer::maglev::TableSize) -> Vec<u32> {
        match self {
            Self::V4(f) => crate::writer::maglev::table(&f.backends, m),
            Self::V6(f) => crate::writer::maglev::table(&f.backends, m),
        }
    }

    fn backend(&self, i: usize) -> Option<AnyBackend> {
        match self {
            Self::V4(f) => f.backends.get(i).map(|b| AnyBackend::V4(*b)),
            Self::V6(f) => f.backends.get(i).map(|b| AnyBackend::V6(*b)),
        }
    }
}

/// The service maps as read back from the kernel (pinned maps of an earlier run).
#[derive(Clone, Debug, Default)]
pub struct KernelState {
    pub services: Vec<(ServiceKey, ServiceValue)>,
    pub slots: Vec<(SlotKey, u32)>,
    pub backends: Vec<(u32, Backend)>,
    pub names: Vec<(u32, String)>,
    /// `SERVICES6` (empty when the loaded programs have no IPv6 maps).
    pub services6: Vec<(ServiceKey6, ServiceValue)>,
    /// `BACKENDS6`.
    pub backends6: Vec<(u32, Backend6)>,
}

impl KernelState {
    /// Every frontend of both families, IPv4's first.
    pub fn all_services(&self) -> impl Iterator<Item = (FrontendKey, ServiceValue)> + '_ {
        let v4 = self.services.iter().map(|(k, v)| (FrontendKey::V4(*k), *v));
        let v6 = self
            .services6
            .iter()
            .map(|(k, v)| (FrontendKey::V6(*k), *v));
        v4.chain(v6)
    }

    /// Every backend of both families.
    pub fn all_backends(&self) -> impl Iterator<Item = (u32, AnyBackend)> + '_ {
        let v4 = self
            .backends
            .iter()
            .map(|(id, b)| (*id, AnyBackend::V4(*b)));
        let v6 = self
            .backends6
            .iter()
            .map(|(id, b)| (*id, AnyBackend::V6(*b)));
        v4.chain(v6)
    }
}

/// Map capacities the writer must stay within.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub services: u32,
    pub backends: u32,
    pub slots: u32,
}

impl Default for Limits {
    fn default() -> Self {
        use dataplane_common::capacity;
        Self {
            services: capacity::SERVICES,
            backends: capacity::BACKENDS,
            slots: capacity::SLOTS,
        }
    }
}

/// IPv6's map capacities (frontends and backends; slots are shared with IPv4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits6 {
    pub services: u32,
    pub backends: u32,
}

impl Default for Limits6 {
    fn default() -> Self {
        use dataplane_common::capacity6;
        Self {
            services: capacity6::SERVICES6,
            backends: capacity6::BACKENDS6,
        }
    }
}

/// A frontend as the kernel holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Programmed {
    pub id: u32,
    pub service: ServicePortName,
    /// What the service entry says besides the count.
    pub policy: FrontendPolicy,
    /// Backend id per slot.
    pub slots: Vec<u32>,
}

/// What one `apply` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub map_writes: usize,
    pub map_deletes: usize,
    /// Frontends that kept their previous state, and why.
    pub rejected: Vec<(ServicePortName, Rejected)>,
    /// Map operations that failed.
    pub errors: Vec<MapOpError>,
    /// UDP frontends' backends that left them (frontend id, backend id) while the
    /// backend stays for other frontends: their flows would keep it, since the
    /// kernel only drops a flow whose backend id is gone. The agent removes those
    /// flows' conntrack entries, as kube-proxy deletes a UDP endpoint's conntrack
    /// entries when it leaves a Service (`deleteStaleEndpointConntrackEntries`,
    /// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/conntrack/cleanup.go>).
    pub stale_udp: Vec<(u32, u32)>,
}

/// Why a frontend kept its previous state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// It does not fit: nothing of it was written.
    #[error("the {map} map is full ({capacity} entries)")]
    Full { map: &'static str, capacity: u32 },
    /// A backend could not be written; the backends written before it were taken back.
    #[error("could not write a backend: {0}")]
    BackendWrite(String),
}

/// A map operation that failed: what the writer was doing, and the map's error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {error}")]
pub struct MapOpError {
    pub what: String,
    pub error: String,
}

impl MapOpError {
    fn new(what: String, error: &impl std::fmt::Display) -> Self {
        Self {
            what,
            error: error.to_string(),
        }
    }
}

/// Ids handed out from 0 upward, reusing freed ones.
#[derive(Clone, Debug, Default)]
struct IdAllocator {
    next: u32,
    free: Vec<u32>,
}

impl IdAllocator {
    /// An allocator that will not hand out `used`.
    fn around(used: &std::collections::BTreeSet<u32>) -> Self {
        let next = used.iter().next_back().map_or(0, |m| m + 1);
        let free = (0..next).rev().filter(|id| !used.contains(id)).collect();
        Self { next, free }
    }

    fn take(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }
    fn give_back(&mut self, id: u32) {
        self.free.push(id);
    }
}

/// The writer and its mirror of the kernel state.
#[derive(Debug, Default)]
pub struct MapWriter {
    limits: Limits,
    limits6: Limits6,
    frontends: BTreeMap<FrontendKey, Programmed>,
    /// IPv6 frontends among `frontends`, and IPv6 backends among `backends`.
    frontends6: usize,
    backends6: usize,
    /// backend → (id, number of slots referring to it)
    backends: HashMap<AnyBackend, (u32, u32)>,
    backend_by_id: HashMap<u32, AnyBackend>,
    service_ids: IdAllocator,
    backend_ids: IdAllocator,
    slot_count: u64,
    /// Left over in restored maps: deleted at the end of the next `apply`.
    stale_slots: Vec<SlotKey>,
    stale_names: Vec<u32>,
    /// Restored and not yet brought to a desired state by a full `apply`.
    restored: bool,
    /// Frontends the last apply rejected: the next one tries them again.
    retry: BTreeSet<FrontendKey>,
    /// Maglev tables adopted from the maps are compared entry by entry (not only by
    /// their backends) until a full `apply`: a write an earlier run left half done
    /// can hold the right backends in the wrong entries.
    verify_tables: bool,
}

impl MapWriter {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            ..Default::default()
        }
    }

    /// The writer with IPv6's capacities (the defaults of `capacity6` otherwise).
    pub fn with_limits6(mut self, limits6: Limits6) -> Self {
        self.limits6 = limits6;
        self
    }

    /// Counts a frontend or backend in or out of its family's.
    fn count(&mut self, v6: bool, backend: bool, add: bool) {
        if !v6 {
            return;
        }
        let n = if backend {
            &mut self.backends6
        } else {
            &mut self.frontends6
        };
        if add {
            *n += 1;
        } else {
            *n -= 1;
        }
    }

    /// A writer that adopts what an earlier run left in the maps, so the next `apply`
    /// writes only the difference (and flushes nothing). Entries no published slot
    /// reaches are deleted by that `apply`.
    pub fn restore(limits: Limits, state: KernelState) -> Self {
        let mut w = Self::new(limits);
        for (id, b) in state.all_backends() {
            // An id in both families' maps (never written so): the first kept.
            if w.backend_by_id.contains_key(&id) || w.backends.contains_key(&b) {
                continue;
            }
            w.backends.insert(b, (id, 0));
            w.backend_by_id.insert(id, b);
            w.count(matches!(b, AnyBackend::V6(_)), true, true);
        }
        let slots: HashMap<SlotKey, u32> = state.slots.iter().copied().collect();
        let names: HashMap<u32, &str> = state
            .names
            .iter()
            .map(|(id, n)| (*id, n.as_str()))
            .collect();
        let mut service_ids = std::collections::BTreeSet::new();
        let mut published = std::collections::HashSet::new();
        for (key, value) in state.all_services() {
            let value = &value;
            let mut programmed = Vec::new();
            for slot in 0..value.count {
                let k = SlotKey {
                    service_id: value.id,
                    slot,
                };
                match slots.get(&k) {
                    Some(b) if w.backend_by_id.contains_key(b) => programmed.push(*b),
                    // A hole can only come from an interrupted write: republish the
                    // prefix that is whole; the next apply rewrites the rest.
                    _ => break,
                }
            }
            for b in &programmed {
                w.backends.get_mut(&w.backend_by_id[b]).expect("present").1 += 1;
            }
            for slot in 0..programmed.len() as u32 {
                published.insert(SlotKey {
                    service_id: value.id,
                    slot,
                });
            }
            w.slot_count += programmed.len() as u64;
            service_ids.insert(value.id);
            let service = names
                .get(&value.id)
                .map_or_else(ServicePortName::unknown, |n| ServicePortName::parse(n));
            // A count that does not match the slots found is fixed by the next apply.
            let mut p = Programmed {
                id: value.id,
                service,
                policy: FrontendPolicy::of(value),
                slots: programmed,
            };
            if p.slots.len() != value.count as usize {
                p.service = ServicePortName::unknown();
            }
            if w.frontends.insert(key, p).is_none() {
                w.count(matches!(key, FrontendKey::V6(_)), false, true);
            }
        }
        w.stale_slots = slots
            .keys()
            .filter(|k| !published.contains(k))
            .copied()
            .collect();
        w.stale_names = names
            .keys()
            .filter(|id| !service_ids.contains(id))
            .copied()
            .collect();
        w.service_ids = IdAllocator::around(&service_ids);
        w.backend_ids = IdAllocator::around(&w.backend_by_id.keys().copied().collect());
        w.restored = true;
        w.verify_tables = true;
        w
    }

    /// The service maps as the writer wrote them: what the kernel must hold.
    pub fn expected(&self) -> KernelState {
        let mut out = KernelState::default();
        for (key, p) in &self.frontends {
            let value = p.policy.service_value(p.id, p.slots.len() as u32);
            match key {
                FrontendKey::V4(k) => out.services.push((*k, value)),
                FrontendKey::V6(k) => out.services6.push((*k, value)),
            }
            out.names.push((p.id, p.service.to_string()));
            for (slot, b) in p.slots.iter().enumerate() {
                out.slots.push((
                    SlotKey {
                        service_id: p.id,
                        slot: slot as u32,
                    },
                    *b,
                ));
            }
        }
        for (id, b) in &self.backend_by_id {
            match b {
                AnyBackend::V4(b) => out.backends.push((*id, *b)),
                AnyBackend::V6(b) => out.backends6.push((*id, *b)),
            }
        }
        out
    }

    /// What the kernel holds, as far as the writer knows: both families'
    /// frontends, IPv4's first.
    pub fn programmed(&self) -> &BTreeMap<FrontendKey, Programmed> {
        &self.frontends
    }

    pub fn backend(&self, id: u32) -> Option<&AnyBackend> {
        self.backend_by_id.get(&id)
    }

    /// IPv6 frontends among [`programmed`](Self::programmed), and IPv6 backends.
    pub fn counts6(&self) -> (usize, usize) {
        (self.frontends6, self.backends6)
    }

    /// Every backend the writer wrote, with its id.
    pub fn backends(&self) -> impl Iterator<Item = (u32, &AnyBackend)> {
        self.backend_by_id.iter().map(|(id, b)| (*id, b))
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    pub fn slot_count(&self) -> u64 {
        self.slot_count
    }

    /// Brings the maps to `desired` (both families, or IPv4's frontends alone),
    /// writing only what differs.
    pub fn apply<'d, M: MapOps>(
        &mut self,
        desired: impl Into<Desired<'d>>,
        maps: &mut M,
    ) -> ApplyReport {
        let desired = desired.into();
        let mut report = ApplyReport::default();
        self.retry.clear();
        self.restored = false;
        for (key, frontend) in desired.iter() {
            if let Err(reason) = self.apply_frontend(&key, frontend, maps, &mut report) {
                report.rejected.push((frontend.service().clone(), reason));
                self.retry.insert(key);
            }
        }
        let removed: Vec<FrontendKey> = self
            .frontends
            .keys()
            .filter(|k| !desired.contains(k))
            .copied()
            .collect();
        let mut orphans = Vec::new();
        for key in removed {
            self.remove_frontend(&key, maps, &mut report, &mut orphans);
        }
        for key in std::mem::take(&mut self.stale_slots) {
            if let Err(e) = maps.del_slot(&key) {
                report
                    .errors
                    .push(MapOpError::new(format!("deleting stale slot {key:?}"), &e));
            }
            report.map_deletes += 1;
        }
        for id in std::mem::take(&mut self.stale_names) {
            if let Err(e) = maps.del_name(id) {
                report
                    .errors
                    .push(MapOpError::new(format!("deleting stale name {id}"), &e));
            }
            report.map_deletes += 1;
        }
        // Backends restored from the kernel that nothing refers to.
        orphans.extend(
            self.backends
                .values()
                .filter(|(_, refs)| *refs == 0)
                .map(|(id, _)| *id),
        );
        orphans.sort_unstable();
        orphans.dedup();
        self.collect_orphans(orphans, maps, &mut report);
        self.verify_tables = false;
        report
    }

    /// Brings the maps to `desired` where it differs from the last state applied only
    /// at `changed` (frontends added, changed or removed since): [`apply`](Self::apply)
    /// restricted to those keys and to the frontends rejected before, with the same
    /// map operations in the same order. Writers restored from pinned maps fall back to
    /// the full `apply` until they have done one.
    pub fn apply_changed<'a, 'd, K, M: MapOps>(
        &mut self,
        desired: impl Into<Desired<'d>>,
        changed: impl IntoIterator<Item = &'a K>,
        maps: &mut M,
    ) -> ApplyReport
    where
        K: Copy + Into<FrontendKey> + 'a,
    {
        let desired = desired.into();
        if self.restored {
            return self.apply(desired, maps);
        }
        let mut keys = std::mem::take(&mut self.retry);
        keys.extend(changed.into_iter().map(|k| (*k).into()));
        let mut report = ApplyReport::default();
        let mut removed = Vec::new();
        for key in keys {
            match desired.get(&key) {
                Some(frontend) => {
                    if let Err(reason) = self.apply_frontend(&key, frontend, maps, &mut report) {
                        report.rejected.push((frontend.service().clone(), reason));
                        self.retry.insert(key);
                    }
                }
                None if self.frontends.contains_key(&key) => removed.push(key),
                None => {}
            }
        }
        let mut orphans = Vec::new();
        for key in removed {
            self.remove_frontend(&key, maps, &mut report, &mut orphans);
        }
        // Every backend left is referred to: a full apply swept the others.
        orphans.sort_unstable();
        orphans.dedup();
        self.collect_orphans(orphans, maps, &mut report);
        report
    }

    /// Brings one frontend to `desired`, in the order that never shows a packet a
    /// half-written Service: room checked first, then backends, slots, the name and
    /// the service entry that publishes the count, stale slots, orphaned backends.
    fn apply_frontend<M: MapOps>(
        &mut self,
        key: &FrontendKey,
        desired: FrontendRef<'_>,
        maps: &mut M,
        report: &mut ApplyReport,
    ) -> Result<(), Rejected> {
        let policy = desired.policy();
        let maglev = policy.maglev.filter(|_| desired.backend_count() > 0);
        if self.frontends.get(key).is_some_and(|o| {
            &o.service == desired.service()
                && o.policy == policy
                && self.holds(&o.slots, desired, maglev)
        }) {
            return Ok(());
        }
        let old = self.frontends.get(key).cloned();
        let frontend = Changed {
            service: desired.service(),
            policy,
            backends: desired.backends(),
        };
        // The Maglev table, as indexes into `frontend.backends`; the backends it
        // gives no entry (more backends than entries) are not written.
        let table = maglev.map(|m| crate::writer::maglev::table(&frontend.backends, m));
        let mut used = vec![table.is_none(); frontend.backends.len()];
        for &i in table.iter().flatten() {
            used[i as usize] = true;
        }
        let v6 = matches!(key, FrontendKey::V6(_));
        let slots_wanted = table.as_ref().map_or(frontend.backends.len(), Vec::len) as u64;
        self.check_room(v6, old.as_ref(), &frontend, &used, slots_wanted)?;

        // 1. Backends first.
        let wanted = self.write_backends(&frontend, &used, v6, maps, report)?;

        // 2. Slots: keep what stays, fill holes, append the rest; or the Maglev
        // table. Only the entries that differ are written.
        let (id, old_slots) = match &old {
            Some(o) => (o.id, o.slots.clone()),
            None => (self.service_ids.take(), Vec::new()),
        };
        let was_maglev = old.as_ref().is_some_and(|o| o.policy.maglev.is_some());
        let new_slots = slot_table(table.as_deref(), &used, &wanted, &old_slots, was_maglev);
        write_slots(maps, report, id, &old_slots, &new_slots, frontend.service);
        if key.proto() == dataplane_common::PROTO_UDP {
            let now: std::collections::BTreeSet<u32> = new_slots.iter().copied().collect();
            let left: std::collections::BTreeSet<u32> = old_slots
                .iter()
                .copied()
                .filter(|b| !now.contains(b))
                .collect();
            report.stale_udp.extend(left.into_iter().map(|b| (id, b)));
        }
        self.add_references(
            table.as_deref(),
            &wanted,
            &new_slots,
            frontend.backends.len(),
        );

        // 3. The name (read only by tools), then the service entry that publishes the
        // new slot count.
        if old.as_ref().is_none_or(|o| &o.service != frontend.service) {
            if let Err(e) = maps.put_name(id, &ServiceName::new(&frontend.service.to_string())) {
                report.errors.push(MapOpError::new(
                    format!("writing the name of {}", frontend.service),
                    &e,
                ));
            }
            report.map_writes += 1;
        }
        if old_slots.len() != new_slots.len()
            || old.as_ref().is_none_or(|o| o.policy != frontend.policy)
        {
            let value = frontend.policy.service_value(id, new_slots.len() as u32);
            if let Err(e) = put_any_service(maps, key, &value) {
                report.errors.push(MapOpError::new(
                    format!("writing service {}", frontend.service),
                    &e,
                ));
            }
            report.map_writes += 1;
        }

        // 4. Stale slots beyond the new count, then the backends no slot holds.
        delete_slots(
            maps,
            report,
            id,
            new_slots.len()..old_slots.len(),
            frontend.service,
        );
        let mut orphans = Vec::new();
        for b in &old_slots {
            self.release_backend(*b, &mut orphans);
        }
        self.slot_count = self.slot_count - old_slots.len() as u64 + new_slots.len() as u64;
        let added = self
            .frontends
            .insert(
                *key,
                Programmed {
                    id,
                    service: frontend.service.clone(),
                    policy: frontend.policy,
                    slots: new_slots,
                },
            )
            .is_none();
        if added {
            self.count(v6, false, true);
        }
        self.collect_orphans(orphans, maps, report);
        Ok(())
    }

    /// Whether `frontend` fits before any write (a frontend that does not keeps its
    /// previous state `old` and touches nothing): a service entry if it is new, its
    /// new backends (`used` of them), `slots_wanted` slots. Each family's frontends
    /// and backends have maps of their own; slots are shared.
    fn check_room(
        &self,
        v6: bool,
        old: Option<&Programmed>,
        frontend: &Changed<'_>,
        used: &[bool],
        slots_wanted: u64,
    ) -> Result<(), Rejected> {
        let new_backends = frontend
            .backends
            .iter()
            .zip(used)
            .filter(|(b, used)| **used && !self.backends.contains_key(b))
            .count() as u64;
        let old_slots = old.map_or(0, |o| o.slots.len()) as u64;
        let (frontends_now, backends_now, services_cap, backends_cap, services_map, backends_map) =
            if v6 {
                (
                    self.frontends6,
                    self.backends6,
                    self.limits6.services,
                    self.limits6.backends,
                    "services6",
                    "backends6",
                )
            } else {
                (
                    self.frontends.len() - self.frontends6,
                    self.backends.len() - self.backends6,
                    self.limits.services,
                    self.limits.backends,
                    "services",
                    "backends",
                )
            };
        if old.is_none() && frontends_now as u64 >= services_cap as u64 {
            return Err(Rejected::Full {
                map: services_map,
                capacity: services_cap,
            });
        }
        if backends_now as u64 + new_backends > backends_cap as u64 {
            return Err(Rejected::Full {
                map: backends_map,
                capacity: backends_cap,
            });
        }
        if self.slot_count - old_slots + slots_wanted > self.limits.slots as u64 {
            return Err(Rejected::Full {
                map: "slots",
                capacity: self.limits.slots,
            });
        }
        Ok(())
    }

    /// Writes the backends of `frontend` that `used` marks and no frontend holds
    /// yet, giving each an id; the ids of all the used ones, in order. A failed
    /// write takes back the backends written so far (nothing refers to them).
    fn write_backends<M: MapOps>(
        &mut self,
        frontend: &Changed<'_>,
        used: &[bool],
        v6: bool,
        maps: &mut M,
        report: &mut ApplyReport,
    ) -> Result<Vec<u32>, Rejected> {
        let mut wanted: Vec<u32> = Vec::with_capacity(frontend.backends.len());
        let mut written = Vec::new();
        for (b, _) in frontend
            .backends
            .iter()
            .zip(used)
            .filter(|(_, used)| **used)
        {
            let id = match self.backends.get(b) {
                Some((id, _)) => *id,
                None => {
                    let id = self.backend_ids.take();
                    if let Err(e) = put_any_backend(maps, id, b) {
                        self.backend_ids.give_back(id);
                        report
                            .errors
                            .push(MapOpError::new(format!("writing backend {id}"), &e));
                        self.collect_orphans(written, maps, report);
                        return Err(Rejected::BackendWrite(e.to_string()));
                    }
                    written.push(id);
                    report.map_writes += 1;
                    self.backends.insert(*b, (id, 0));
                    self.backend_by_id.insert(id, *b);
                    if v6 {
                        self.backends6 += 1;
                    }
                    id
                }
            };
            wanted.push(id);
        }
        Ok(wanted)
    }

    /// Counts each backend's references: one per slot it fills (counted per
    /// backend, not per slot: a table's thousand slots are a hundred backends).
    fn add_references(
        &mut self,
        table: Option<&[u32]>,
        wanted: &[u32],
        new_slots: &[u32],
        backends: usize,
    ) {
        let refs: Vec<(u32, u32)> = match table {
            Some(table) => {
                let mut per_index = vec![0u32; backends];
                for &i in table {
                    per_index[i as usize] += 1;
                }
                let counts = per_index.into_iter().filter(|n| *n > 0);
                wanted.iter().copied().zip(counts).collect()
            }
            None => new_slots.iter().map(|b| (*b, 1)).collect(),
        };
        for (b, n) in refs {
            self.backends
                .get_mut(&self.backend_by_id[&b])
                .expect("just written")
                .1 += n;
        }
    }

    fn remove_frontend<M: MapOps>(
        &mut self,
        key: &FrontendKey,
        maps: &mut M,
        report: &mut ApplyReport,
        orphans: &mut Vec<u32>,
    ) {
        let Some(old) = self.frontends.remove(key) else {
            return;
        };
        self.count(matches!(key, FrontendKey::V6(_)), false, false);
        // The service entry goes first, so no packet follows it to a deleted slot.
        if let Err(e) = del_any_service(maps, key) {
            report.errors.push(MapOpError::new(
                format!("deleting service {}", old.service),
                &e,
            ));
        }
        report.map_deletes += 1;
        for i in 0..old.slots.len() {
            if let Err(e) = maps.del_slot(&SlotKey {
                service_id: old.id,
                slot: i as u32,
            }) {
                report.errors.push(MapOpError::new(
                    format!("deleting slot {i} of {}", old.service),
                    &e,
                ));
            }
            report.map_deletes += 1;
        }
        if let Err(e) = maps.del_name(old.id) {
            report.errors.push(MapOpError::new(
                format!("deleting the name of {}", old.service),
                &e,
            ));
        }
        report.map_deletes += 1;
        for b in &old.slots {
            self.release_backend(*b, orphans);
        }
        self.slot_count -= old.slots.len() as u64;
        self.service_ids.give_back(old.id);
    }

    fn release_backend(&mut self, id: u32, orphans: &mut Vec<u32>) {
        let backend = self.backend_by_id[&id];
        let entry = self
            .backends
            .get_mut(&backend)
            .expect("mirror is consistent");
        entry.1 -= 1;
        if entry.1 == 0 {
            orphans.push(id);
        }
    }

    /// Deletes backends nothing refers to any more (last, after every slot moved off).
    fn collect_orphans<M: MapOps>(
        &mut self,
        orphans: Vec<u32>,
        maps: &mut M,
        report: &mut ApplyReport,
    ) {
        for id in orphans {
            let backend = self.backend_by_id[&id];
            if self.backends[&backend].1 != 0 {
                continue; // picked up again by another frontend
            }
            if let Err(e) = del_any_backend(maps, id, &backend) {
                report
                    .errors
                    .push(MapOpError::new(format!("deleting backend {id}"), &e));
            }
            report.map_deletes += 1;
            self.count(matches!(backend, AnyBackend::V6(_)), true, false);
            self.backends.remove(&backend);
            self.backend_by_id.remove(&id);
            self.backend_ids.give_back(id);
        }
    }
}

impl MapWriter {
    /// Whether `slots` already are what `frontend` asks for: its backends, each in
    /// one slot; or, with a Maglev table of size M, M slots over its backends (the
    /// table is a function of them, so the same set is the same table, except in a
    /// table adopted from the maps, which is compared entry by entry).
    fn holds(
        &self,
        slots: &[u32],
        frontend: FrontendRef<'_>,
        maglev: Option<crate::writer::maglev::TableSize>,
    ) -> bool {
        let Some(m) = maglev else {
            return slots.len() == frontend.backend_count()
                && same_set(slots, frontend, &self.backend_by_id, false);
        };
        if slots.len() != m.get() as usize || !same_set(slots, frontend, &self.backend_by_id, true)
        {
            return false;
        }
        !self.verify_tables
            || frontend
                .table(m)
                .iter()
                .zip(slots)
                .all(|(&i, id)| Some(self.backend_by_id[id]) == frontend.backend(i as usize))
    }
}

/// The frontend's new slots, as backend ids: the Maglev `table` (indexes into the
/// frontend's backends, of which `used` are written, with ids `wanted`), or `wanted`
/// placed over `old_slots` (kept where they stay; afresh when leaving a table,
/// `was_maglev`, which holds a backend in many slots).
fn slot_table(
    table: Option<&[u32]>,
    used: &[bool],
    wanted: &[u32],
    old_slots: &[u32],
    was_maglev: bool,
) -> Vec<u32> {
    match table {
        Some(table) => {
            let mut ids = vec![0; used.len()];
            let used_at = used.iter().enumerate().filter(|(_, u)| **u);
            for ((i, _), id) in used_at.zip(wanted) {
                ids[i] = *id;
            }
            table.iter().map(|&i| ids[i as usize]).collect()
        }
        None if was_maglev => place(&[], wanted),
        None => place(old_slots, wanted),
    }
}

/// Writes the slots of frontend `id` that differ from `old_slots`.
fn write_slots<M: MapOps>(
    maps: &mut M,
    report: &mut ApplyReport,
    id: u32,
    old_slots: &[u32],
    new_slots: &[u32],
    service: &ServicePortName,
) {
    for (i, backend_id) in new_slots.iter().enumerate() {
        if old_slots.get(i) != Some(backend_id) {
            let slot = SlotKey {
                service_id: id,
                slot: i as u32,
            };
            if let Err(e) = maps.put_slot(&slot, *backend_id) {
                report.errors.push(MapOpError::new(
                    format!("writing slot {i} of {service}"),
                    &e,
                ));
            }
            report.map_writes += 1;
        }
    }
}

/// Deletes slots `range` of frontend `id`.
fn delete_slots<M: MapOps>(
    maps: &mut M,
    report: &mut ApplyReport,
    id: u32,
    range: std::ops::Range<usize>,
    service: &ServicePortName,
) {
    for i in range {
        if let Err(e) = maps.del_slot(&SlotKey {
            service_id: id,
            slot: i as u32,
        }) {
            report.errors.push(MapOpError::new(
                format!("deleting slot {i} of {service}"),
                &e,
            ));
        }
        report.map_deletes += 1;
    }
}

/// A frontend that differs from what the maps hold: its backends of either family.
struct Changed<'a> {
    service: &'a ServicePortName,
    policy: FrontendPolicy,
    backends: Vec<AnyBackend>,
}

/// Whether the slots' backends are the frontend's (sorted); `distinct`: each may
/// fill more than one slot.
fn same_set(
    slots: &[u32],
    frontend: FrontendRef<'_>,
    by_id: &HashMap<u32, AnyBackend>,
    distinct: bool,
) -> bool {
    let mut have: Vec<AnyBackend> = if distinct {
        let ids: BTreeSet<u32> = slots.iter().copied().collect();
        ids.iter().map(|id| by_id[id]).collect()
    } else {
        slots.iter().map(|id| by_id[id]).collect()
    };
    have.sort();
    frontend.backends_are(&have)
}

/// New slot layout: backends that stay keep their slot; holes left by removed backends
/// are filled by new backends, then by moving the last slot in; new backends left over
/// are appended.
fn place(old: &[u32], wanted: &[u32]) -> Vec<u32> {
    let wanted_set: std::collections::HashSet<u32> = wanted.iter().copied().collect();
    let mut slots: Vec<Option<u32>> = old
        .iter()
        .map(|b| wanted_set.contains(b).then_some(*b))
        .collect();
    let kept: std::collections::HashSet<u32> = slots.iter().flatten().copied().collect();
    let mut fresh = wanted.iter().copied().filter(|b| !kept.contains(b));
    for slot in slots.iter_mut() {
        if slot.is_none() {
            *slot = fresh.next();
        }
    }
    // Remaining holes: move the tail in.
    let mut i = 0;
    while i < slots.len() {
        if slots[i].is_none() {
            let last = slots.pop().expect("non-empty");
            if i < slots.len() {
                slots[i] = last;
            }
            continue;
        }
        i += 1;
    }
    let mut out: Vec<u32> = slots.into_iter().flatten().collect();
    out.extend(fresh);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_keeps_survivors_in_their_slots() {
        assert_eq!(place(&[], &[1, 2, 3]), vec![1, 2, 3]);
        assert_eq!(place(&[1, 2, 3], &[1, 2, 3]), vec![1, 2, 3]);
        // 2 removed: the tail moves into its slot.
        assert_eq!(place(&[1, 2, 3], &[1, 3]), vec![1, 3]);
        // 2 replaced by 4: 4 takes the hole.
        assert_eq!(place(&[1, 2, 3], &[1, 3, 4]), vec![1, 4, 3]);
        // added at the end.
        assert_eq!(place(&[1, 2], &[1, 2, 5]), vec![1, 2, 5]);
        // several holes, tail holes too.
        assert_eq!(place(&[1, 2, 3, 4, 5], &[1, 5]), vec![1, 5]);
        assert_eq!(place(&[1, 2, 3, 4, 5], &[2, 4]), vec![4, 2]);
        assert_eq!(place(&[1, 2, 3], &[]), Vec::<u32>::new());
    }
}

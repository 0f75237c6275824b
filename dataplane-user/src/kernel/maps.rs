//! Maps: the service maps as the writer sees them (`MapOps`; a new frontend or backend
//! id gets its counters zeroed), the per-frontend and per-backend counters, conntrack for the
//! sweeper, the exit counters and the conntrack timeouts.

use aya::maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuValues};
use dataplane_common::{
    map_name, stat, Backend, BackendCounters, CtEntry, CtKey, FrontendCounters, ServiceKey,
    ServiceName, ServiceValue, SlotKey,
};

use super::{Datapath, KernelError};
use crate::writer::{KernelState, MapOps};

/// The service maps, as the writer sees them.
pub struct KernelMaps {
    pub(super) services: BpfHashMap<MapData, ServiceKey, ServiceValue>,
    pub(super) slots: BpfHashMap<MapData, SlotKey, u32>,
    pub(super) backends: BpfHashMap<MapData, u32, Backend>,
    pub(super) names: BpfHashMap<MapData, u32, ServiceName>,
    pub(super) frontend_counters: PerCpuArray<MapData, FrontendCounters>,
    pub(super) backend_counters: PerCpuArray<MapData, BackendCounters>,
    pub(super) source_ranges: aya::maps::LpmTrie<MapData, dataplane_common::SourceRange, u8>,
    pub(super) service_cidrs: aya::maps::LpmTrie<MapData, u32, u8>,
    /// IPv6's maps, when the loaded programs have them (`None`: an object built
    /// before IPv6; writing an IPv6 frontend then fails with a message, and IPv4 is
    /// untouched).
    pub(super) v6: Option<KernelMaps6>,
}

/// IPv6's service maps.
pub struct KernelMaps6 {
    pub(super) services: BpfHashMap<MapData, dataplane_common::ServiceKey6, ServiceValue>,
    pub(super) backends: BpfHashMap<MapData, u32, dataplane_common::Backend6>,
    pub(super) source_ranges: aya::maps::LpmTrie<MapData, dataplane_common::SourceRange6, u8>,
    pub(super) service_cidrs: aya::maps::LpmTrie<MapData, [u32; 4], u8>,
}

impl KernelMaps {
    fn v6(&mut self, name: &'static str) -> Result<&mut KernelMaps6, MapError> {
        self.v6.as_mut().ok_or_else(|| MapError::InvalidName {
            name: format!("{name} (the loaded programs have no IPv6 maps)"),
        })
    }
}

impl crate::writer::ranges::RangeOps for KernelMaps {
    type Error = MapError;
    fn put_range(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange,
    ) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, *range);
        self.source_ranges.insert(&key, 1, 0)
    }
    fn del_range(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange,
    ) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, *range);
        self.source_ranges.remove(&key)
    }
    fn ranges(&self) -> Result<Vec<(u32, dataplane_common::SourceRange)>, MapError> {
        self.source_ranges
            .keys()
            .map(|k| k.map(|k| (k.prefix_len(), k.data())))
            .collect()
    }
    fn put_range6(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange6,
    ) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, *range);
        self.v6(map_name::SOURCE_RANGES6)?
            .source_ranges
            .insert(&key, 1, 0)
    }
    fn del_range6(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange6,
    ) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, *range);
        self.v6(map_name::SOURCE_RANGES6)?
            .source_ranges
            .remove(&key)
    }
    fn ranges6(&self) -> Result<Vec<(u32, dataplane_common::SourceRange6)>, MapError> {
        // No IPv6 maps: nothing held.
        let Some(v6) = &self.v6 else {
            return Ok(Vec::new());
        };
        v6.source_ranges
            .keys()
            .map(|k| k.map(|k| (k.prefix_len(), k.data())))
            .collect()
    }
}

impl crate::writer::cidrs::CidrOps for KernelMaps {
    type Error = MapError;
    fn put_cidr(&mut self, prefix_len: u32, addr_be: u32) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, addr_be);
        self.service_cidrs.insert(&key, 1, 0)
    }
    fn del_cidr(&mut self, prefix_len: u32, addr_be: u32) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, addr_be);
        ignore_missing(self.service_cidrs.remove(&key))
    }
    fn cidrs(&self) -> Result<Vec<(u32, u32)>, MapError> {
        self.service_cidrs
            .keys()
            .map(|k| k.map(|k| (k.prefix_len(), k.data())))
            .collect()
    }
    fn put_cidr6(&mut self, prefix_len: u32, addr_be: [u32; 4]) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, addr_be);
        self.v6(map_name::SERVICE_CIDRS6)?
            .service_cidrs
            .insert(&key, 1, 0)
    }
    fn del_cidr6(&mut self, prefix_len: u32, addr_be: [u32; 4]) -> Result<(), MapError> {
        let key = aya::maps::lpm_trie::Key::new(prefix_len, addr_be);
        ignore_missing(
            self.v6(map_name::SERVICE_CIDRS6)?
                .service_cidrs
                .remove(&key),
        )
    }
    fn cidrs6(&self) -> Result<Vec<(u32, [u32; 4])>, MapError> {
        let Some(v6) = &self.v6 else {
            return Ok(Vec::new());
        };
        v6.service_cidrs
            .keys()
            .map(|k| k.map(|k| (k.prefix_len(), k.data())))
            .collect()
    }
}

/// Sets every CPU's copy of slot `index` to zero; an index beyond the map is not
/// counted, and a failure leaves counts that started earlier (never an error of the
/// write it accompanies).
fn zero<T: aya::Pod + Default + Clone>(map: &mut PerCpuArray<MapData, T>, index: u32) {
    let Ok(cpus) = aya::util::nr_cpus() else {
        return;
    };
    if let Ok(values) = PerCpuValues::try_from(vec![T::default(); cpus]) {
        let _ = map.set(index, values, 0);
    }
}

/// Every CPU's copy of slot `index` of a per-CPU counter map, summed.
pub(crate) fn summed<T: aya::Pod + Default>(
    map: &PerCpuArray<MapData, T>,
    index: u32,
    add: fn(&mut T, &T),
) -> Option<T> {
    let values = map.get(&index, 0).ok()?;
    let mut total = T::default();
    for v in values.iter() {
        add(&mut total, v);
    }
    Some(total)
}

impl KernelMaps {
    /// Per-frontend counters summed over CPUs, indexed by frontend id (ids below `n`).
    pub fn frontend_counters(&self, n: u32) -> Vec<FrontendCounters> {
        (0..n.min(self.frontend_counters.len()))
            .map(|i| summed(&self.frontend_counters, i, FrontendCounters::add).unwrap_or_default())
            .collect()
    }

    /// Per-backend counters summed over CPUs, indexed by backend id (ids below `n`).
    pub fn backend_counters(&self, n: u32) -> Vec<BackendCounters> {
        (0..n.min(self.backend_counters.len()))
            .map(|i| summed(&self.backend_counters, i, BackendCounters::add).unwrap_or_default())
            .collect()
    }
}

impl KernelMaps {
    /// Reads the maps back, for a restarted agent's writer and for `list`.
    pub fn state(&self) -> KernelState {
        KernelState {
            services: self.services.iter().filter_map(Result::ok).collect(),
            slots: self.slots.iter().filter_map(Result::ok).collect(),
            backends: self.backends.iter().filter_map(Result::ok).collect(),
            services6: self
                .v6
                .iter()
                .flat_map(|m| m.services.iter().filter_map(Result::ok))
                .collect(),
            backends6: self
                .v6
                .iter()
                .flat_map(|m| m.backends.iter().filter_map(Result::ok))
                .collect(),
            names: self
                .names
                .iter()
                .filter_map(Result::ok)
                .map(|(id, n)| (id, n.as_str().to_string()))
                .collect(),
        }
    }
}

impl Datapath {
    /// Exit counters summed over CPUs, indexed by `stat::*`.
    pub fn stats(&self) -> Result<[u64; stat::COUNT as usize], KernelError> {
        let mut out = [0u64; stat::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            let values = self
                .stats
                .get(&(i as u32), 0)
                .map_err(|source| KernelError::Map {
                    name: map_name::STATS,
                    source,
                })?;
            *slot = values.iter().sum();
        }
        Ok(out)
    }

    /// Conntrack entries (forward and reverse).
    pub fn conntrack(&self) -> Vec<(CtKey, CtEntry)> {
        self.conntrack.iter().filter_map(Result::ok).collect()
    }

    /// The conntrack map, for the sweeper (`crate::writer::conntrack`).
    pub fn conntrack_map(&mut self) -> &mut BpfHashMap<MapData, CtKey, CtEntry> {
        &mut self.conntrack
    }

    /// Capacity of the conntrack map as loaded.
    pub fn conntrack_capacity(&self) -> u32 {
        use aya::maps::IterableMap;
        self.conntrack
            .map()
            .info()
            .map(|i| i.max_entries())
            .unwrap_or(0)
    }

    /// Writes what the uplink program masquerades with.
    pub fn set_nat(&mut self, nat: dataplane_common::NatConfig) -> Result<(), KernelError> {
        self.set_only_entry(map_name::NAT_CONFIG, nat)
    }

    /// Whether the loaded programs have IPv6's maps.
    pub fn has_ipv6_maps(&self) -> bool {
        self.maps.v6.is_some()
    }

    /// Writes what the uplink program masquerades IPv6 connections with
    /// (`NAT_CONFIG6`).
    pub fn set_nat6(&mut self, nat: dataplane_common::NatConfig6) -> Result<(), KernelError> {
        self.set_only_entry(map_name::NAT_CONFIG6, nat)
    }

    /// Writes entry 0 of the one-entry array `name` (the masquerade settings).
    fn set_only_entry<T: aya::Pod>(
        &mut self,
        name: &'static str,
        value: T,
    ) -> Result<(), KernelError> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(KernelError::MissingMap(name))?;
        let mut array: aya::maps::Array<&mut MapData, T> =
            aya::maps::Array::try_from(map).map_err(|source| KernelError::Map { name, source })?;
        array
            .set(0, value, 0)
            .map_err(|source| KernelError::Map { name, source })
    }

    /// Makes `MASQ_SOURCES` and `MASQ_SOURCES6` hold these entries (prefix length,
    /// address, value; `crate::agent::masq_sources`) and nothing else, so a pinned
    /// map of an earlier run with other flags is brought in line.
    pub fn set_masq_sources(
        &mut self,
        v4: &[(u32, u32, u8)],
        v6: &[(u32, [u32; 4], u8)],
    ) -> Result<(), KernelError> {
        fn fill<K: aya::Pod + PartialEq>(
            ebpf: &mut aya::Ebpf,
            name: &'static str,
            want: &[(u32, K, u8)],
        ) -> Result<(), KernelError> {
            use aya::maps::lpm_trie::{Key, LpmTrie};
            let map = ebpf.map_mut(name).ok_or(KernelError::MissingMap(name))?;
            let mut trie: LpmTrie<&mut MapData, K, u8> =
                LpmTrie::try_from(map).map_err(|source| KernelError::Map { name, source })?;
            let err = |source| KernelError::Map { name, source };
            let have: Vec<Key<K>> = trie.keys().collect::<Result<_, _>>().map_err(err)?;
            for key in have {
                if !want
                    .iter()
                    .any(|(len, data, _)| *len == key.prefix_len() && *data == key.data())
                {
                    trie.remove(&key).map_err(err)?;
                }
            }
            for (len, data, value) in want {
                trie.insert(&Key::new(*len, *data), *value, 0)
                    .map_err(err)?;
            }
            Ok(())
        }
        fill(&mut self.ebpf, map_name::MASQ_SOURCES, v4)?;
        fill(&mut self.ebpf, map_name::MASQ_SOURCES6, v6)
    }

    /// Writes the conntrack idle timeouts the program uses (seconds, by state).
    pub fn set_ct_timeouts(&mut self, seconds: &[u64]) -> Result<(), KernelError> {
        let name = map_name::CT_TIMEOUTS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(KernelError::MissingMap(name))?;
        let mut array: aya::maps::Array<&mut MapData, u64> =
            aya::maps::Array::try_from(map).map_err(|source| KernelError::Map { name, source })?;
        for (i, s) in seconds.iter().enumerate() {
            array
                .set(i as u32, s, 0)
                .map_err(|source| KernelError::Map { name, source })?;
        }
        Ok(())
    }
}

impl MapOps for KernelMaps {
    type Error = MapError;
    fn put_backend(&mut self, id: u32, backend: &Backend) -> Result<(), MapError> {
        // A new backend for this id: its counts start at zero.
        zero(&mut self.backend_counters, id);
        self.backends.insert(id, backend, 0)
    }
    fn del_backend(&mut self, id: u32) -> Result<(), MapError> {
        ignore_missing(self.backends.remove(&id))
    }
    fn put_slot(&mut self, key: &SlotKey, backend_id: u32) -> Result<(), MapError> {
        self.slots.insert(key, backend_id, 0)
    }
    fn del_slot(&mut self, key: &SlotKey) -> Result<(), MapError> {
        ignore_missing(self.slots.remove(key))
    }
    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.services.insert(key, value, 0)
    }
    fn del_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        ignore_missing(self.services.remove(key))
    }
    fn put_name(&mut self, id: u32, name: &ServiceName) -> Result<(), MapError> {
        // Written for a new frontend (or one whose Service port changed name): its
        // counts start at zero.
        zero(&mut self.frontend_counters, id);
        self.names.insert(id, name, 0)
    }
    fn del_name(&mut self, id: u32) -> Result<(), MapError> {
        ignore_missing(self.names.remove(&id))
    }
    fn put_backend6(
        &mut self,
        id: u32,
        backend: &dataplane_common::Backend6,
    ) -> Result<(), MapError> {
        let v6 = self.v6(map_name::BACKENDS6)?;
        v6.backends.insert(id, backend, 0)?;
        // A new backend for this id: its counts start at zero (one id space).
        zero(&mut self.backend_counters, id);
        Ok(())
    }
    fn del_backend6(&mut self, id: u32) -> Result<(), MapError> {
        ignore_missing(self.v6(map_name::BACKENDS6)?.backends.remove(&id))
    }
    fn put_service6(
        &mut self,
        key: &dataplane_common::ServiceKey6,
        value: &ServiceValue,
    ) -> Result<(), MapError> {
        self.v6(map_name::SERVICES6)?.services.insert(key, value, 0)
    }
    fn del_service6(&mut self, key: &dataplane_common::ServiceKey6) -> Result<(), MapError> {
        ignore_missing(self.v6(map_name::SERVICES6)?.services.remove(key))
    }
}

fn ignore_missing(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
    }
}

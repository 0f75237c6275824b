//! The service maps in memory (`MemoryMaps`), and their text dump.
//!
//! `MemoryMaps` implements the writer's `MapOps` without a kernel: tests and golden
//! dumps use it, and it records every operation so tests can check write order and
//! counts. The dump is the form golden files are kept in.

use std::{collections::BTreeMap, convert::Infallible, fmt::Write as _};

use dataplane_common::{Backend, ServiceKey, ServiceName, ServiceValue, SlotKey};

use crate::{
    compiler::{backend_addr, backend_addr6, frontend_addr, frontend_addr6, proto_name},
    writer::MapOps,
};

/// One recorded map operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    PutBackend(u32),
    DelBackend(u32),
    PutSlot(SlotKey),
    DelSlot(SlotKey),
    PutService(ServiceKey),
    DelService(ServiceKey),
    PutName(u32),
    DelName(u32),
    PutBackend6(u32),
    DelBackend6(u32),
    PutService6(dataplane_common::ServiceKey6),
    DelService6(dataplane_common::ServiceKey6),
}

/// The three service maps, in memory.
#[derive(Clone, Debug, Default)]
pub struct MemoryMaps {
    pub services: BTreeMap<ServiceKey, ServiceValue>,
    pub slots: BTreeMap<SlotKey, u32>,
    pub backends: BTreeMap<u32, Backend>,
    pub names: BTreeMap<u32, String>,
    pub ops: Vec<Op>,
    /// `SERVICES6` and `BACKENDS6`.
    pub services6: BTreeMap<dataplane_common::ServiceKey6, ServiceValue>,
    pub backends6: BTreeMap<u32, dataplane_common::Backend6>,
    /// `SOURCE_RANGES` (prefix length, data).
    pub ranges: std::collections::BTreeSet<(u32, dataplane_common::SourceRange)>,
    /// `SOURCE_RANGES6` (prefix length, data).
    pub ranges6: std::collections::BTreeSet<(u32, dataplane_common::SourceRange6)>,
    /// `SERVICE_CIDRS` and `SERVICE_CIDRS6` (prefix length, address), and how many
    /// writes and removals they had.
    pub cidrs: std::collections::BTreeSet<(u32, u32)>,
    pub cidrs6: std::collections::BTreeSet<(u32, [u32; 4])>,
    pub cidr_ops: usize,
}

impl crate::writer::cidrs::CidrOps for MemoryMaps {
    type Error = Infallible;
    fn put_cidr(&mut self, prefix_len: u32, addr_be: u32) -> Result<(), Infallible> {
        self.cidr_ops += 1;
        self.cidrs.insert((prefix_len, addr_be));
        Ok(())
    }
    fn del_cidr(&mut self, prefix_len: u32, addr_be: u32) -> Result<(), Infallible> {
        self.cidr_ops += 1;
        self.cidrs.remove(&(prefix_len, addr_be));
        Ok(())
    }
    fn cidrs(&self) -> Result<Vec<(u32, u32)>, Infallible> {
        Ok(self.cidrs.iter().copied().collect())
    }
    fn put_cidr6(&mut self, prefix_len: u32, addr_be: [u32; 4]) -> Result<(), Infallible> {
        self.cidr_ops += 1;
        self.cidrs6.insert((prefix_len, addr_be));
        Ok(())
    }
    fn del_cidr6(&mut self, prefix_len: u32, addr_be: [u32; 4]) -> Result<(), Infallible> {
        self.cidr_ops += 1;
        self.cidrs6.remove(&(prefix_len, addr_be));
        Ok(())
    }
    fn cidrs6(&self) -> Result<Vec<(u32, [u32; 4])>, Infallible> {
        Ok(self.cidrs6.iter().copied().collect())
    }
}

impl crate::writer::ranges::RangeOps for MemoryMaps {
    type Error = Infallible;
    fn put_range(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange,
    ) -> Result<(), Infallible> {
        self.ranges.insert((prefix_len, *range));
        Ok(())
    }
    fn del_range(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange,
    ) -> Result<(), Infallible> {
        self.ranges.remove(&(prefix_len, *range));
        Ok(())
    }
    fn ranges(&self) -> Result<Vec<(u32, dataplane_common::SourceRange)>, Infallible> {
        Ok(self.ranges.iter().copied().collect())
    }
    fn put_range6(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange6,
    ) -> Result<(), Infallible> {
        self.ranges6.insert((prefix_len, *range));
        Ok(())
    }
    fn del_range6(
        &mut self,
        prefix_len: u32,
        range: &dataplane_common::SourceRange6,
    ) -> Result<(), Infallible> {
        self.ranges6.remove(&(prefix_len, *range));
        Ok(())
    }
    fn ranges6(&self) -> Result<Vec<(u32, dataplane_common::SourceRange6)>, Infallible> {
        Ok(self.ranges6.iter().copied().collect())
    }
}

impl MapOps for MemoryMaps {
    type Error = Infallible;
    fn put_backend(&mut self, id: u32, backend: &Backend) -> Result<(), Infallible> {
        self.ops.push(Op::PutBackend(id));
        self.backends.insert(id, *backend);
        Ok(())
    }
    fn del_backend(&mut self, id: u32) -> Result<(), Infallible> {
        self.ops.push(Op::DelBackend(id));
        self.backends.remove(&id);
        Ok(())
    }
    fn put_slot(&mut self, key: &SlotKey, backend_id: u32) -> Result<(), Infallible> {
        self.ops.push(Op::PutSlot(*key));
        self.slots.insert(*key, backend_id);
        Ok(())
    }
    fn del_slot(&mut self, key: &SlotKey) -> Result<(), Infallible> {
        self.ops.push(Op::DelSlot(*key));
        self.slots.remove(key);
        Ok(())
    }
    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), Infallible> {
        self.ops.push(Op::PutService(*key));
        self.services.insert(*key, *value);
        Ok(())
    }
    fn del_service(&mut self, key: &ServiceKey) -> Result<(), Infallible> {
        self.ops.push(Op::DelService(*key));
        self.services.remove(key);
        Ok(())
    }
    fn put_name(&mut self, id: u32, name: &ServiceName) -> Result<(), Infallible> {
        self.ops.push(Op::PutName(id));
        self.names.insert(id, name.as_str().to_string());
        Ok(())
    }
    fn del_name(&mut self, id: u32) -> Result<(), Infallible> {
        self.ops.push(Op::DelName(id));
        self.names.remove(&id);
        Ok(())
    }
    fn put_backend6(
        &mut self,
        id: u32,
        backend: &dataplane_common::Backend6,
    ) -> Result<(), Infallible> {
        self.ops.push(Op::PutBackend6(id));
        self.backends6.insert(id, *backend);
        Ok(())
    }
    fn del_backend6(&mut self, id: u32) -> Result<(), Infallible> {
        self.ops.push(Op::DelBackend6(id));
        self.backends6.remove(&id);
        Ok(())
    }
    fn put_service6(
        &mut self,
        key: &dataplane_common::ServiceKey6,
        value: &ServiceValue,
    ) -> Result<(), Infallible> {
        self.ops.push(Op::PutService6(*key));
        self.services6.insert(*key, *value);
        Ok(())
    }
    fn del_service6(&mut self, key: &dataplane_common::ServiceKey6) -> Result<(), Infallible> {
        self.ops.push(Op::DelService6(*key));
        self.services6.remove(key);
        Ok(())
    }
}

impl MemoryMaps {
    /// Whether every published slot points at an existing backend: what a packet
    /// would find at this instant.
    pub fn consistent(&self) -> Result<(), String> {
        for (key, value) in &self.services {
            for slot in 0..value.count {
                let k = SlotKey {
                    service_id: value.id,
                    slot,
                };
                let backend = self
                    .slots
                    .get(&k)
                    .ok_or_else(|| format!("{} slot {slot} missing", frontend_addr(key)))?;
                if !self.backends.contains_key(backend) {
                    return Err(format!(
                        "{} slot {slot} points at missing backend {backend}",
                        frontend_addr(key)
                    ));
                }
            }
        }
        // An IPv6 frontend's slots name IPv6 backends only; an id is in one
        // family's backends.
        for (key, value) in &self.services6 {
            for slot in 0..value.count {
                let k = SlotKey {
                    service_id: value.id,
                    slot,
                };
                let backend = self
                    .slots
                    .get(&k)
                    .ok_or_else(|| format!("{} slot {slot} missing", frontend_addr6(key)))?;
                if !self.backends6.contains_key(backend) {
                    return Err(format!(
                        "{} slot {slot} points at missing IPv6 backend {backend}",
                        frontend_addr6(key)
                    ));
                }
            }
        }
        if let Some(id) = self
            .backends6
            .keys()
            .find(|id| self.backends.contains_key(id))
        {
            return Err(format!("backend id {id} is in BACKENDS and BACKENDS6"));
        }
        Ok(())
    }

    /// What the maps hold, as the writer reads it back after a restart.
    pub fn state(&self) -> crate::writer::KernelState {
        crate::writer::KernelState {
            services: self.services.iter().map(|(k, v)| (*k, *v)).collect(),
            slots: self.slots.iter().map(|(k, v)| (*k, *v)).collect(),
            backends: self.backends.iter().map(|(k, v)| (*k, *v)).collect(),
            names: self.names.iter().map(|(k, v)| (*k, v.clone())).collect(),
            services6: self.services6.iter().map(|(k, v)| (*k, *v)).collect(),
            backends6: self.backends6.iter().map(|(k, v)| (*k, *v)).collect(),
        }
    }

    /// The maps as text, one entry a line, sorted by key; the name from the names map
    /// as a comment.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        out.push_str("SERVICES\n");
        for (key, value) in &self.services {
            let name = self.names.get(&value.id).cloned().unwrap_or_default();
            let policy = policy_text(value);
            let _ = writeln!(
                out,
                "  {} => id={} count={}{policy}  # {name}",
                frontend_addr(key),
                value.id,
                value.count
            );
        }
        out.push_str("SLOTS\n");
        for (key, backend) in &self.slots {
            let _ = writeln!(
                out,
                "  service={} slot={} => backend={backend}",
                key.service_id, key.slot
            );
        }
        out.push_str("BACKENDS\n");
        for (id, b) in &self.backends {
            let _ = writeln!(out, "  {id} => {}/{}", backend_addr(b), proto_name(b.proto));
        }
        // IPv6's maps, when they hold anything (so dumps of IPv4 alone read as before).
        if !self.services6.is_empty() || !self.backends6.is_empty() {
            out.push_str("SERVICES6\n");
            for (key, value) in &self.services6 {
                let name = self.names.get(&value.id).cloned().unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  {} => id={} count={}{}  # {name}",
                    frontend_addr6(key),
                    value.id,
                    value.count,
                    policy_text(value)
                );
            }
            out.push_str("BACKENDS6\n");
            for (id, b) in &self.backends6 {
                let _ = writeln!(
                    out,
                    "  {id} => {}/{}",
                    backend_addr6(b),
                    proto_name(b.proto)
                );
            }
        }
        out
    }
}

/// A service entry's policy in a dump: only what differs from the default (reject
/// when empty, no affinity).
fn policy_text(value: &ServiceValue) -> String {
    let mut policy = String::new();
    if value.flags & dataplane_common::SVC_F_DROP_EMPTY != 0 {
        policy.push_str(" empty=drop");
    }
    if value.flags & dataplane_common::SVC_F_AFFINITY != 0 {
        let _ = write!(policy, " affinity={}s", value.affinity_timeout_s);
    }
    if value.flags & dataplane_common::SVC_F_MAGLEV != 0 {
        policy.push_str(" maglev");
    }
    if value.flags & dataplane_common::SVC_F_MASQ_PODS != 0 {
        policy.push_str(" masq-pods");
    }
    policy
}

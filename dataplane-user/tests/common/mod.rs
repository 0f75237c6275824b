//! What the map writer's tests share: a map set that checks itself after every
//! operation.

use std::convert::Infallible;

use dataplane_common::{Backend, ServiceKey, ServiceName, ServiceValue, SlotKey};
use sliceway_agent::{writer::memory_maps::MemoryMaps, writer::MapOps};

/// Checks after every single map operation that each published slot points at an
/// existing backend: what a packet arriving at that instant would see. An operation
/// on a slot or a service entry can only break its own frontend, so only that one is
/// checked then; every frontend after a backend is deleted.
#[derive(Default)]
pub struct Checked {
    pub inner: MemoryMaps,
    pub ops: usize,
}

impl Checked {
    fn check(&mut self, only_id: Option<u32>) {
        self.ops += 1;
        let result = match only_id {
            None => self.inner.consistent(),
            Some(id) => {
                let mut one = MemoryMaps {
                    services: self
                        .inner
                        .services
                        .iter()
                        .filter(|(_, v)| v.id == id)
                        .map(|(k, v)| (*k, *v))
                        .collect(),
                    ..MemoryMaps::default()
                };
                std::mem::swap(&mut one.slots, &mut self.inner.slots);
                std::mem::swap(&mut one.backends, &mut self.inner.backends);
                let r = one.consistent();
                std::mem::swap(&mut one.slots, &mut self.inner.slots);
                std::mem::swap(&mut one.backends, &mut self.inner.backends);
                r
            }
        };
        if let Err(e) = result {
            panic!(
                "after operation {} ({:?}): {e}",
                self.ops,
                self.inner.ops.last()
            );
        }
    }
}

impl MapOps for Checked {
    type Error = Infallible;
    fn put_backend(&mut self, id: u32, b: &Backend) -> Result<(), Infallible> {
        self.inner.put_backend(id, b)?;
        self.check(None);
        Ok(())
    }
    fn del_backend(&mut self, id: u32) -> Result<(), Infallible> {
        self.inner.del_backend(id)?;
        self.check(None);
        Ok(())
    }
    fn put_slot(&mut self, k: &SlotKey, b: u32) -> Result<(), Infallible> {
        self.inner.put_slot(k, b)?;
        self.check(Some(k.service_id));
        Ok(())
    }
    fn del_slot(&mut self, k: &SlotKey) -> Result<(), Infallible> {
        self.inner.del_slot(k)?;
        self.check(Some(k.service_id));
        Ok(())
    }
    fn put_service(&mut self, k: &ServiceKey, v: &ServiceValue) -> Result<(), Infallible> {
        self.inner.put_service(k, v)?;
        self.check(Some(v.id));
        Ok(())
    }
    fn del_service(&mut self, k: &ServiceKey) -> Result<(), Infallible> {
        self.inner.del_service(k)?;
        self.check(None);
        Ok(())
    }
    fn put_name(&mut self, id: u32, name: &ServiceName) -> Result<(), Infallible> {
        self.inner.put_name(id, name)
    }
    fn del_name(&mut self, id: u32) -> Result<(), Infallible> {
        self.inner.del_name(id)
    }
    fn put_backend6(&mut self, id: u32, b: &dataplane_common::Backend6) -> Result<(), Infallible> {
        self.inner.put_backend6(id, b)?;
        self.check(None);
        Ok(())
    }
    fn del_backend6(&mut self, id: u32) -> Result<(), Infallible> {
        self.inner.del_backend6(id)?;
        self.check(None);
        Ok(())
    }
    fn put_service6(
        &mut self,
        k: &dataplane_common::ServiceKey6,
        v: &ServiceValue,
    ) -> Result<(), Infallible> {
        self.inner.put_service6(k, v)?;
        self.check(Some(v.id));
        Ok(())
    }
    fn del_service6(&mut self, k: &dataplane_common::ServiceKey6) -> Result<(), Infallible> {
        self.inner.del_service6(k)?;
        self.check(None);
        Ok(())
    }
}

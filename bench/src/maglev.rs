//! Figure 6: Maglev tables (issue 11), in process, no kernel: N Services of K
//! backends each, every one a frontend reached from outside (a load-balancer IP), so
//! the agent gives each a Maglev table. For each table size, and for the ClusterIP
//! placement beside them: the time to build every table alone (`maglev::table`), the
//! time of the map writer's full sync (`MapWriter::apply` from nothing, into maps that
//! only count the operations: tables, ids and the writer's mirror, no kernel), the
//! heap the writer holds afterwards, the slots the kernel's `SLOTS` map would need,
//! and what one backend of K leaving moves: table entries, random flows (hashed as the
//! kernel hashes them) and map writes.

use std::{collections::BTreeMap, convert::Infallible, time::Instant};

use anyhow::{ensure, Result};
use serde::Serialize;

use dataplane_common::{
    flow_hash, Backend, ServiceKey, ServiceName, ServiceValue, SlotKey, PROTO_TCP,
};
use sliceway_agent::{
    compiler::{Frontend, FrontendPolicy, ServicePortName},
    writer::maglev::{self, TableSize},
    writer::{Limits, MapOps, MapWriter},
};

use crate::{model, stats::Summary, Config};

/// Figure 6.
#[derive(Clone, Debug, Serialize)]
pub struct Fig6 {
    pub method: String,
    pub services: usize,
    pub backends_per_service: usize,
    pub rows: Vec<Fig6Row>,
}

/// One table size (or the ClusterIP placement).
#[derive(Clone, Debug, Serialize)]
pub struct Fig6Row {
    /// M; `None` for the ClusterIP placement (one slot per backend).
    pub table_size: Option<u32>,
    /// Every Service's table built alone (`maglev::table`), ms.
    pub tables_ms: Summary,
    /// The writer's full sync of every frontend from nothing, ms.
    pub apply_ms: Summary,
    /// Heap in use held by the writer after that sync, MiB (glibc's `mallinfo2`,
    /// in use after less in use before).
    pub writer_heap_mib: Summary,
    /// Slots the `SLOTS` map would hold.
    pub slots: u64,
    /// One backend leaving, over the sampled Services: share of entries (slots) whose
    /// backend changed, mean and worst.
    pub entries_moved: (f64, f64),
    /// Share of random flows whose backend changed, mean and worst.
    pub flows_moved: (f64, f64),
    /// Map operations of that change (writes and deletes), mean.
    pub change_map_ops: f64,
}

/// Map operations counted, nothing kept.
#[derive(Default)]
struct Counting(u64);

impl MapOps for Counting {
    type Error = Infallible;
    fn put_backend(&mut self, _: u32, _: &Backend) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn del_backend(&mut self, _: u32) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn put_slot(&mut self, _: &SlotKey, _: u32) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn del_slot(&mut self, _: &SlotKey) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn put_service(&mut self, _: &ServiceKey, _: &ServiceValue) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn del_service(&mut self, _: &ServiceKey) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn put_name(&mut self, _: u32, _: &ServiceName) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn del_name(&mut self, _: u32) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn put_backend6(&mut self, _: u32, _: &dataplane_common::Backend6) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn del_backend6(&mut self, _: u32) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn put_service6(
        &mut self,
        _: &dataplane_common::ServiceKey6,
        _: &ServiceValue,
    ) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
    fn del_service6(&mut self, _: &dataplane_common::ServiceKey6) -> Result<(), Infallible> {
        self.0 += 1;
        Ok(())
    }
}

/// Heap bytes in use (every arena, and mmapped chunks).
fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 has no preconditions; it only reads the allocator's state.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

fn frontends(services: &[model::Svc], maglev: Option<TableSize>) -> BTreeMap<ServiceKey, Frontend> {
    services
        .iter()
        .map(|s| {
            let key = ServiceKey {
                addr_be: u32::from(s.vip).to_be(),
                port_be: s.port.to_be(),
                proto: PROTO_TCP,
                scope: dataplane_common::SCOPE_ANY,
            };
            let mut backends: Vec<Backend> = s
                .endpoints
                .iter()
                .map(|(ip, port)| Backend {
                    addr_be: u32::from(*ip).to_be(),
                    port_be: port.to_be(),
                    proto: PROTO_TCP,
                    _pad: 0,
                })
                .collect();
            backends.sort();
            let frontend = Frontend {
                service: ServicePortName {
                    namespace: s.namespace.as_str().into(),
                    name: s.name.as_str().into(),
                    port: s.port_name.as_str().into(),
                },
                backends,
                policy: FrontendPolicy {
                    maglev,
                    ..FrontendPolicy::default()
                },
                source_ranges: Vec::new(),
            };
            (key, frontend)
        })
        .collect()
}

/// The maps are sized for what is measured: every table must fit.
fn roomy() -> Limits {
    Limits {
        services: u32::MAX,
        backends: u32::MAX,
        slots: u32::MAX,
    }
}

/// A frontend's slots as backends, as the writer holds them.
fn slots_of(writer: &MapWriter, key: &ServiceKey) -> Vec<Backend> {
    writer.programmed()[&(*key).into()]
        .slots
        .iter()
        .filter_map(|id| match writer.backend(*id) {
            Some(sliceway_agent::compiler::AnyBackend::V4(b)) => Some(*b),
            _ => None,
        })
        .collect()
}

fn row(cfg: &Config, services: &[model::Svc], maglev: Option<TableSize>) -> Result<Fig6Row> {
    let desired = frontends(services, maglev);
    let (mut tables_ms, mut apply_ms, mut heap_mib) = (Vec::new(), Vec::new(), Vec::new());
    let mut kept = None;
    for _ in 0..cfg.fig6_rounds {
        if let Some(m) = maglev {
            let start = Instant::now();
            let mut entries = 0usize;
            for f in desired.values() {
                entries += std::hint::black_box(maglev::table(&f.backends, m)).len();
            }
            tables_ms.push(start.elapsed().as_secs_f64() * 1e3);
            ensure!(
                entries == desired.len() * m.get() as usize,
                "a table is short"
            );
        }
        drop(kept.take());
        let before = heap_in_use();
        let mut writer = MapWriter::new(roomy());
        let mut ops = Counting::default();
        let start = Instant::now();
        let report = writer.apply(&desired, &mut ops);
        apply_ms.push(start.elapsed().as_secs_f64() * 1e3);
        heap_mib.push(heap_in_use().saturating_sub(before) as f64 / (1024.0 * 1024.0));
        ensure!(
            report.rejected.is_empty() && report.errors.is_empty(),
            "the writer refused frontends: {:?}",
            report.rejected.first()
        );
        kept = Some(writer);
    }
    let mut writer = kept.expect("at least one round");

    // One backend leaving, on a sample of Services: each is taken back afterwards.
    let flows: Vec<u32> = {
        let mut rng = crate::stats::Rng::new(0x5eed_6006);
        (0..cfg.fig6_flows)
            .map(|_| {
                let client = 0x0a00_0000 + rng.below(1 << 24) as u32;
                let port = 1024 + rng.below(60_000) as u16;
                // The frontend's address does not matter to the share: a fixed one.
                flow_hash(
                    client.to_be(),
                    0xcb00_710au32.to_be(),
                    port.to_be(),
                    80u16.to_be(),
                    6,
                )
            })
            .collect()
    };
    let keys: Vec<ServiceKey> = desired.keys().copied().collect();
    let step = (keys.len() / cfg.fig6_samples.max(1)).max(1);
    let (mut entries, mut moved, mut ops_total, mut samples) =
        ((0.0, 0.0f64), (0.0, 0.0f64), 0u64, 0usize);
    let mut changed = desired.clone();
    for (n, key) in keys.iter().step_by(step).enumerate() {
        let before = slots_of(&writer, key);
        let mut f = desired[key].clone();
        f.backends.remove(n % f.backends.len());
        changed.insert(*key, f);
        let mut ops = Counting::default();
        writer.apply_changed(&changed, [key], &mut ops);
        let after = slots_of(&writer, key);
        let e = match maglev {
            Some(_) => maglev::moved_share(&before, &after),
            None => {
                let stayed = before.iter().zip(&after).filter(|(a, b)| a == b).count();
                1.0 - stayed as f64 / before.len() as f64
            }
        };
        let fl = flows
            .iter()
            .filter(|h| {
                before[(**h % before.len() as u32) as usize]
                    != after[(**h % after.len() as u32) as usize]
            })
            .count() as f64
            / flows.len().max(1) as f64;
        entries = (entries.0 + e, entries.1.max(e));
        moved = (moved.0 + fl, moved.1.max(fl));
        ops_total += ops.0;
        samples += 1;
        changed.insert(*key, desired[key].clone());
        writer.apply_changed(&changed, [key], &mut Counting::default());
    }
    let per = samples.max(1) as f64;
    Ok(Fig6Row {
        table_size: maglev.map(TableSize::get),
        tables_ms: Summary::of(&tables_ms),
        apply_ms: Summary::of(&apply_ms),
        writer_heap_mib: Summary::of(&heap_mib),
        slots: writer.slot_count(),
        entries_moved: (entries.0 / per, entries.1),
        flows_moved: (moved.0 / per, moved.1),
        change_map_ops: ops_total as f64 / per,
    })
}

pub fn method(cfg: &Config) -> String {
    format!(
        "{n} Services of {k} made-up backends each, every one a frontend reached from \
         outside, in process (no kernel). Per table size M, and for the ClusterIP \
         placement (one slot per backend) beside them: every table built alone \
         (`maglev::table`); the map writer's full sync from nothing (`MapWriter::apply`, \
         into maps that only count operations: the tables, ids and the writer's mirror); \
         the heap the writer holds after it (glibc's `mallinfo2`, bytes in use after less \
         before; the {k}×{n} distinct backends are part of it in every row); the slots the \
         kernel's `SLOTS` map would hold (its default capacity is 1,048,576). {rounds} \
         rounds, median [min–max]. Then one backend leaves each of {samples} Services in \
         turn (`MapWriter::apply_changed`, taken back after): the share of its slots whose \
         backend changed, of {flows} random flows hashed as the kernel hashes them \
         (`flow_hash % count`), and the map operations, mean and worst over the Services. \
         The least possible is 1/{k} of entries and flows.",
        n = cfg.fig6_services,
        k = cfg.fig6_backends,
        rounds = cfg.fig6_rounds,
        samples = cfg.fig6_samples,
        flows = cfg.fig6_flows,
    )
}

/// Measures figure 6.
pub fn tables(cfg: &Config) -> Result<Fig6> {
    let services = model::fake_cluster(cfg.fig6_services, cfg.fig6_backends);
    let mut rows = Vec::new();
    for &m in &cfg.fig6_sizes {
        let size = TableSize::new(m).map_err(anyhow::Error::msg)?;
        crate::progress(&format!("figure 6: Maglev tables of {m}"));
        rows.push(row(cfg, &services, Some(size))?);
    }
    crate::progress("figure 6: the ClusterIP placement");
    rows.push(row(cfg, &services, None)?);
    Ok(Fig6 {
        method: method(cfg),
        services: cfg.fig6_services,
        backends_per_service: cfg.fig6_backends,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;

    /// Figure 6 at the smoke test's sizes: what it reports holds together (the times
    /// are not looked at).
    #[test]
    fn figure_6_at_a_tiny_size() {
        let cfg = Config::new(Mode::Smoke);
        let f = tables(&cfg).unwrap();
        assert_eq!(f.rows.len(), cfg.fig6_sizes.len() + 1);
        for (row, m) in f.rows.iter().zip(&cfg.fig6_sizes) {
            assert_eq!(row.table_size, Some(*m));
            assert_eq!(row.slots, cfg.fig6_services as u64 * u64::from(*m));
            assert_eq!(row.tables_ms.runs, cfg.fig6_rounds);
            // At least the leaving backend's own entries move, far from all.
            let own = 1.0 / cfg.fig6_backends as f64;
            assert!(row.entries_moved.0 >= own * 0.9, "{row:?}");
            assert!(row.entries_moved.1 < 0.5, "{row:?}");
            assert!(
                row.flows_moved.0 > 0.0 && row.flows_moved.1 < 0.5,
                "{row:?}"
            );
            // Measured every round; its value is the process's heap, which the other
            // tests of this crate, running beside this one, change too.
            assert_eq!(row.writer_heap_mib.runs, cfg.fig6_rounds, "{row:?}");
        }
        let placement = f.rows.last().unwrap();
        assert_eq!(placement.table_size, None);
        assert_eq!(
            placement.slots,
            (cfg.fig6_services * cfg.fig6_backends) as u64
        );
        // The ClusterIP placement moves most flows on the same change.
        assert!(placement.flows_moved.0 > 0.5, "{placement:?}");
    }
}

//! The drift audit: what the kernel's service maps hold, compared entry by entry
//! with what the writer wrote (its mirror of the desired state), and repaired.
//!
//! Only the agent writes these maps, so any difference was made behind its back (a
//! tool, an operator, a bug, a map write that failed unnoticed): cilium#48050 is a
//! node that kept a stale backend until a restart. The agent audits on a timer and
//! when asked (`sliceway-agent audit`); each difference is logged with its Service,
//! counted, and repaired by writing what the writer holds, in the writer's order
//! (backends, slots, names, service entries; removals last), so a packet never sees
//! a slot pointing at a missing backend because of the repair. `SOURCE_RANGES` is
//! audited the same way by its own writer (`crate::writer::ranges::RangeWriter::audit`).

use std::collections::BTreeMap;

use dataplane_common::{map_name, ServiceName};
use serde::{Deserialize, Serialize};

use crate::{
    compiler::{any_backend_addr, any_frontend_addr, AnyBackend, FrontendKey},
    writer::{self, KernelState, MapOpError, MapOps, MapWriter},
};

/// How one entry differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftKind {
    /// The writer wrote it; the kernel lacks it.
    Missing,
    /// Both have it, with different values.
    Changed,
    /// The kernel has it; the writer never wrote it (or removed it).
    Extra,
}

/// One entry where the kernel differs from what the writer wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drift {
    /// The map (`SERVICES`, `SLOTS`, `BACKENDS`, `SERVICE_NAMES`, `SOURCE_RANGES`).
    pub map: String,
    /// The entry's key, readable.
    pub entry: String,
    pub kind: DriftKind,
    /// The Service port it belongs to, where the writer knows one.
    pub service: Option<String>,
}

/// What one audit found and did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditReport {
    pub drift: Vec<Drift>,
    /// Map operations the repair made.
    pub repaired: usize,
    /// Repair operations that failed.
    pub errors: Vec<String>,
}

impl AuditReport {
    /// Differences per map.
    pub fn per_map(&self) -> BTreeMap<String, usize> {
        let mut out: BTreeMap<String, usize> = [
            map_name::SERVICES,
            map_name::SLOTS,
            map_name::BACKENDS,
            map_name::SERVICE_NAMES,
            map_name::SOURCE_RANGES,
        ]
        .into_iter()
        .map(|m| (m.to_string(), 0))
        .collect();
        for d in &self.drift {
            *out.entry(d.map.clone()).or_default() += 1;
        }
        out
    }
}

/// Why `sliceway-agent audit` got no report.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("no agent answers on {0} (its --metrics-bind-address)")]
    Connect(std::net::SocketAddr, #[source] std::io::Error),
    #[error("talking to the agent on {0}")]
    Io(std::net::SocketAddr, #[source] std::io::Error),
    #[error("the agent on {0} sent no HTTP answer")]
    NoAnswer(std::net::SocketAddr),
    #[error("the agent on {0} did not audit: {1}")]
    Refused(std::net::SocketAddr, String),
    #[error("the agent on {0} sent an unreadable report")]
    Unreadable(std::net::SocketAddr, #[source] serde_json::Error),
}

/// Asks the agent serving `/audit` on `addr` (its `--metrics-bind-address`) for an
/// audit.
pub fn ask(addr: std::net::SocketAddr) -> Result<AuditReport, AskError> {
    use std::{
        io::{Read as _, Write as _},
        time::Duration,
    };
    let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| AskError::Connect(addr, e))?;
    let mut reply = String::new();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .and_then(|()| write!(conn, "GET /audit HTTP/1.1\r\nHost: {addr}\r\n\r\n"))
        .and_then(|()| conn.read_to_string(&mut reply))
        .map_err(|e| AskError::Io(addr, e))?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or(AskError::NoAnswer(addr))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(AskError::Refused(addr, body.trim().to_string()));
    }
    serde_json::from_str(body).map_err(|e| AskError::Unreadable(addr, e))
}

/// The report as a table: one line per difference, then the totals.
pub fn render_table(r: &AuditReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if !r.drift.is_empty() {
        let _ = writeln!(out, "{:<14} {:<8} {:<30} SERVICE", "MAP", "KIND", "ENTRY");
    }
    for d in &r.drift {
        let kind = match d.kind {
            DriftKind::Missing => "missing",
            DriftKind::Changed => "changed",
            DriftKind::Extra => "extra",
        };
        let _ = writeln!(
            out,
            "{:<14} {:<8} {:<30} {}",
            d.map,
            kind,
            d.entry,
            d.service.as_deref().unwrap_or("-")
        );
    }
    let _ = writeln!(
        out,
        "{} entries differed; {} map operations repaired them{}",
        r.drift.len(),
        r.repaired,
        if r.errors.is_empty() {
            String::new()
        } else {
            format!("; {} failed: {}", r.errors.len(), r.errors.join("; "))
        }
    );
    out
}

/// Keyed comparison of one map: (key, expected, actual) for every key that differs.
fn differ<K: Ord + Copy, V: PartialEq + Clone>(
    expected: &BTreeMap<K, V>,
    actual: &BTreeMap<K, V>,
) -> Vec<(K, Option<V>, Option<V>)> {
    let mut out = Vec::new();
    for (k, v) in expected {
        match actual.get(k) {
            Some(a) if a == v => {}
            a => out.push((*k, Some(v.clone()), a.cloned())),
        }
    }
    for (k, a) in actual {
        if !expected.contains_key(k) {
            out.push((*k, None, Some(a.clone())));
        }
    }
    out
}

fn kind<V>(expected: &Option<V>, actual: &Option<V>) -> DriftKind {
    match (expected, actual) {
        (Some(_), None) => DriftKind::Missing,
        (None, _) => DriftKind::Extra,
        (Some(_), Some(_)) => DriftKind::Changed,
    }
}

/// Compares `actual` (read from the kernel) with what `writer` wrote, and writes
/// what the writer holds wherever they differ.
pub fn audit<M: MapOps>(writer: &MapWriter, actual: &KernelState, maps: &mut M) -> AuditReport {
    let expected = writer.expected();
    let names: BTreeMap<u32, String> = writer
        .programmed()
        .values()
        .map(|p| (p.id, p.service.to_string()))
        .collect();
    // Both families at once: IPv6's entries are in SERVICES6 and BACKENDS6, with ids
    // from the same spaces as IPv4's.
    let services = differ(
        &expected.all_services().collect(),
        &actual.all_services().collect::<BTreeMap<_, _>>(),
    );
    let slots = differ(
        &expected.slots.iter().copied().collect(),
        &actual.slots.iter().copied().collect::<BTreeMap<_, _>>(),
    );
    let backends = differ(
        &expected.all_backends().collect(),
        &actual.all_backends().collect::<BTreeMap<_, _>>(),
    );
    // Names compared as the kernel holds them (a fixed-size, possibly cut string).
    let name_diff = differ(
        &expected
            .names
            .iter()
            .map(|(id, n)| (*id, ServiceName::new(n).as_str().to_string()))
            .collect(),
        &actual.names.iter().cloned().collect::<BTreeMap<_, _>>(),
    );

    let mut report = AuditReport::default();
    let service_of_id = |id: u32| names.get(&id).cloned();
    let service_of_key = |k: &FrontendKey| {
        writer
            .programmed()
            .get(k)
            .map(|p| p.service.to_string())
            .or_else(|| {
                actual
                    .all_services()
                    .find(|(a, _)| a == k)
                    .and_then(|(_, v)| service_of_id(v.id))
            })
    };
    let backends_map = |b: &AnyBackend| match b {
        AnyBackend::V4(_) => map_name::BACKENDS,
        AnyBackend::V6(_) => map_name::BACKENDS6,
    };
    let services_map = |k: &FrontendKey| match k {
        FrontendKey::V4(_) => map_name::SERVICES,
        FrontendKey::V6(_) => map_name::SERVICES6,
    };
    for (k, e, a) in &backends {
        let b = e.as_ref().or(a.as_ref()).expect("one side");
        report.drift.push(Drift {
            map: backends_map(b).to_string(),
            entry: format!("{k} ({})", any_backend_addr(b)),
            kind: kind(e, a),
            service: None,
        });
    }
    for (k, e, a) in &slots {
        report.drift.push(Drift {
            map: map_name::SLOTS.to_string(),
            entry: format!("service {} slot {}", k.service_id, k.slot),
            kind: kind(e, a),
            service: service_of_id(k.service_id),
        });
    }
    for (id, e, a) in &name_diff {
        report.drift.push(Drift {
            map: map_name::SERVICE_NAMES.to_string(),
            entry: id.to_string(),
            kind: kind(e, a),
            service: service_of_id(*id),
        });
    }
    for (k, e, a) in &services {
        report.drift.push(Drift {
            map: services_map(k).to_string(),
            entry: any_frontend_addr(k),
            kind: kind(e, a),
            service: service_of_key(k),
        });
    }

    // The repair, in the writer's order: what is referred to before what refers.
    let mut errors: Vec<MapOpError> = Vec::new();
    let mut op = |what: String, r: Result<(), M::Error>| {
        report.repaired += 1;
        if let Err(e) = r {
            errors.push(MapOpError {
                what,
                error: e.to_string(),
            });
        }
    };
    for (k, e, a) in backends.iter().filter(|d| d.1.is_some()) {
        let e = e.expect("filtered");
        // An id held by the other family's map: removed there (an id is in one).
        if let Some(a) = a.filter(|a| std::mem::discriminant(a) != std::mem::discriminant(&e)) {
            op(
                format!("removing backend {k} of the other family"),
                writer::del_any_backend(maps, *k, &a),
            );
        }
        op(
            format!("writing backend {k}"),
            writer::put_any_backend(maps, *k, &e),
        );
    }
    for (k, e, _) in slots.iter().filter(|d| d.1.is_some()) {
        op(
            format!("writing slot {} of service {}", k.slot, k.service_id),
            maps.put_slot(k, e.unwrap()),
        );
    }
    for (id, _, _) in name_diff.iter().filter(|d| d.1.is_some()) {
        let name = names.get(id).map(String::as_str).unwrap_or("?");
        op(
            format!("writing the name of service {id}"),
            maps.put_name(*id, &ServiceName::new(name)),
        );
    }
    for (k, e, _) in services.iter().filter(|d| d.1.is_some()) {
        op(
            format!("writing service {}", any_frontend_addr(k)),
            writer::put_any_service(maps, k, &e.unwrap()),
        );
    }
    for (k, _, _) in services.iter().filter(|d| d.1.is_none()) {
        op(
            format!("removing service {}", any_frontend_addr(k)),
            writer::del_any_service(maps, k),
        );
    }
    for (id, _, _) in name_diff.iter().filter(|d| d.1.is_none()) {
        op(
            format!("removing the name of service {id}"),
            maps.del_name(*id),
        );
    }
    for (k, _, _) in slots.iter().filter(|d| d.1.is_none()) {
        op(
            format!("removing slot {} of service {}", k.slot, k.service_id),
            maps.del_slot(k),
        );
    }
    for (k, _, a) in backends.iter().filter(|d| d.1.is_none()) {
        let a = a.expect("one side");
        op(
            format!("removing backend {k}"),
            writer::del_any_backend(maps, *k, &a),
        );
    }
    report.errors = errors.iter().map(ToString::to_string).collect();
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        compiler::{self, Frontend},
        writer::memory_maps::MemoryMaps,
        writer::Limits,
    };
    use dataplane_common::{Backend, SlotKey};

    /// Two frontends with two backends each, written by the writer.
    fn written() -> (MapWriter, MemoryMaps) {
        let dir = "
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
- addresses: [10.0.0.2]
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
";
        let (objects, problems) =
            crate::source::local::parse_file(std::path::Path::new("x.yaml"), dir);
        assert!(problems.is_empty(), "{problems:?}");
        let o = objects.unwrap();
        let frontends: BTreeMap<dataplane_common::ServiceKey, Frontend> =
            compiler::compile(&o.services, &o.slices, &compiler::Options::default()).frontends;
        let mut writer = MapWriter::new(Limits::default());
        let mut maps = MemoryMaps::default();
        let r = writer.apply(&frontends, &mut maps);
        assert!(r.errors.is_empty());
        (writer, maps)
    }

    fn state(m: &MemoryMaps) -> KernelState {
        m.state()
    }

    #[test]
    fn maps_as_written_have_no_drift() {
        let (writer, mut maps) = written();
        let before = maps.ops.len();
        let report = audit(&writer, &state(&maps), &mut maps);
        assert!(report.drift.is_empty(), "{:?}", report.drift);
        assert_eq!(report.repaired, 0);
        assert_eq!(maps.ops.len(), before, "no writes without drift");
    }

    #[test]
    fn every_kind_of_drift_is_found_named_and_repaired() {
        let (writer, mut maps) = written();
        let clean = maps.clone();
        // Behind the writer's back: a service entry removed, a slot pointed at another
        // backend, a backend's port changed, an extra backend and slot, a name cut.
        let (&svc, _) = maps
            .services
            .iter()
            .find(|(k, _)| !compiler::is_clusterip_marker(k))
            .unwrap();
        maps.services.remove(&svc);
        let (&slot, &b) = maps.slots.iter().next().unwrap();
        let other = *maps.backends.keys().find(|k| **k != b).unwrap();
        maps.slots.insert(slot, other);
        let (&bid, _) = maps.backends.iter().next().unwrap();
        maps.backends.get_mut(&bid).unwrap().port_be ^= 0x0100;
        maps.backends.insert(999, Backend::default());
        maps.slots.insert(
            SlotKey {
                service_id: 77,
                slot: 0,
            },
            999,
        );
        let (&nid, _) = maps.names.iter().next().unwrap();
        maps.names.insert(nid, "x".into());

        let report = audit(&writer, &state(&maps), &mut maps);
        let kinds: Vec<(&str, DriftKind)> = report
            .drift
            .iter()
            .map(|d| (d.map.as_str(), d.kind))
            .collect();
        for want in [
            (map_name::SERVICES, DriftKind::Missing),
            (map_name::SLOTS, DriftKind::Changed),
            (map_name::SLOTS, DriftKind::Extra),
            (map_name::BACKENDS, DriftKind::Changed),
            (map_name::BACKENDS, DriftKind::Extra),
            (map_name::SERVICE_NAMES, DriftKind::Changed),
        ] {
            assert!(kinds.contains(&want), "{want:?} not in {kinds:?}");
        }
        assert_eq!(report.drift.len(), 6, "{:#?}", report.drift);
        let missing = report
            .drift
            .iter()
            .find(|d| d.kind == DriftKind::Missing)
            .unwrap();
        assert!(
            missing
                .service
                .as_deref()
                .unwrap()
                .starts_with("default/web:"),
            "{missing:?}"
        );
        assert_eq!(report.repaired, 6);
        assert!(report.errors.is_empty());
        // Repaired: the maps are as the writer wrote them.
        assert_eq!(maps.services, clean.services);
        assert_eq!(maps.slots, clean.slots);
        assert_eq!(maps.backends, clean.backends);
        assert_eq!(maps.names, clean.names);
        assert!(audit(&writer, &state(&maps), &mut maps).drift.is_empty());
        assert_eq!(
            report.per_map()[map_name::SLOTS],
            2,
            "{:?}",
            report.per_map()
        );
    }
}

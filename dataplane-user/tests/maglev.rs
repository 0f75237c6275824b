//! Maglev tables through the compiler and the map writer (issue 11): which frontends
//! get one, the same table on every node whatever its history, a packet never sees
//! a half-written one, a change writes only the entries that move, one backend of 100
//! leaving moves few flows, capacity, and adoption after a restart. No kernel needed.

use std::{collections::BTreeMap, path::Path};

mod common;
use common::Checked;

use dataplane_common::{
    flow_hash, Backend, ServiceKey, SlotKey, PROTO_TCP, SCOPE_ANY, SVC_F_MAGLEV,
};
use sliceway_agent::{
    compiler::{compile, Frontend, FrontendPolicy, Options, ServicePortName},
    source::local::parse_file,
    writer::maglev::{self, TableSize},
    writer::memory_maps::{MemoryMaps, Op},
    writer::{Limits, MapWriter},
};

/// The smallest table size, to keep the tests quick.
fn small() -> TableSize {
    TableSize::new(251).unwrap()
}

fn key(i: u32) -> ServiceKey {
    ServiceKey {
        addr_be: (0xc633_6400 + i).to_be(),
        port_be: 443u16.to_be(),
        proto: PROTO_TCP,
        scope: SCOPE_ANY,
    }
}

fn backend(i: u32) -> Backend {
    Backend {
        addr_be: (0x0af4_0000 + i).to_be(),
        port_be: 8443u16.to_be(),
        proto: PROTO_TCP,
        _pad: 0,
    }
}

fn frontend(
    name: u32,
    backends: impl IntoIterator<Item = u32>,
    maglev: Option<TableSize>,
) -> Frontend {
    let mut backends: Vec<Backend> = backends.into_iter().map(backend).collect();
    backends.sort();
    backends.dedup();
    Frontend {
        service: ServicePortName {
            namespace: "default".into(),
            name: format!("lb-{name}").into(),
            port: "https".into(),
        },
        policy: FrontendPolicy {
            maglev: maglev.filter(|_| !backends.is_empty()),
            ..FrontendPolicy::default()
        },
        backends,
        source_ranges: Vec::new(),
    }
}

/// Each frontend's slots as backends, in slot order: what a packet hashed to a slot
/// reaches.
fn tables(maps: &MemoryMaps) -> BTreeMap<ServiceKey, Vec<Backend>> {
    maps.services
        .iter()
        .map(|(k, v)| {
            let slots = (0..v.count)
                .map(|slot| {
                    maps.backends[&maps.slots[&SlotKey {
                        service_id: v.id,
                        slot,
                    }]]
                })
                .collect();
            (*k, slots)
        })
        .collect()
}

/// What `desired` must look like in the maps: a Maglev frontend's table entry by
/// entry; any other frontend's backends in some order.
fn check_against(maps: &MemoryMaps, desired: &BTreeMap<ServiceKey, Frontend>, at: &str) {
    let got = tables(maps);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        desired.keys().collect::<Vec<_>>(),
        "{at}"
    );
    for (k, f) in desired {
        match f.policy.maglev {
            Some(m) => {
                assert_eq!(got[k], maglev::resolved(&f.backends, m), "{at}: table");
                assert_ne!(maps.services[k].flags & SVC_F_MAGLEV, 0, "{at}: flag");
            }
            None => {
                let mut b = got[k].clone();
                b.sort();
                assert_eq!(b, f.backends, "{at}: backends");
                assert_eq!(maps.services[k].flags & SVC_F_MAGLEV, 0, "{at}: flag");
            }
        }
    }
}

/// xorshift: deterministic, no dependency.
fn rng(mut seed: u32) -> impl FnMut() -> u32 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    }
}

#[test]
fn frontends_reached_from_outside_get_a_table_and_cluster_ips_do_not() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.40
  externalIPs: [192.0.2.40]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.10}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: shop, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.2.2]}]
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: shop}
spec:
  clusterIP: 10.96.0.42
  externalIPs: [192.0.2.42]
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: shop, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.4], nodeName: node-1}, {addresses: [10.244.2.4], nodeName: node-2}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: shop}
spec:
  clusterIP: 10.96.0.41
  externalIPs: [192.0.2.41]
  ports: [{name: http, port: 80, protocol: TCP}]
"#;
    let (objects, problems) = parse_file(Path::new("lb.yaml"), yaml);
    assert!(problems.is_empty(), "{problems:?}");
    let objects = objects.unwrap();
    let opts = Options {
        node_name: Some("node-1".into()),
        node_port_ips: vec!["192.168.0.10".parse().unwrap()],
        maglev: Some(small()),
        ..Options::default()
    };
    let compiled = compile(&objects.services, &objects.slices, &opts);
    let maglev: BTreeMap<String, bool> = compiled
        .frontends
        .iter()
        .map(|(k, f)| {
            (
                sliceway_agent::compiler::frontend_addr(k),
                f.policy.maglev.is_some(),
            )
        })
        .collect();
    let want: BTreeMap<String, bool> = [
        ("10.96.0.40:80/TCP", false),
        ("10.96.0.40:*", false),
        ("192.0.2.40:80/TCP", true),
        ("203.0.113.10:80/TCP", true),
        ("192.168.0.10:30080/TCP", true),
        // externalTrafficPolicy: Local: the entry for everyone and the one for
        // clients outside the node (this node's endpoints) each get one.
        ("10.96.0.42:80/TCP", false),
        ("10.96.0.42:*", false),
        ("192.0.2.42:80/TCP", true),
        ("192.0.2.42:80/TCP (external)", true),
        // No backends: nothing to hash to.
        ("10.96.0.41:80/TCP", false),
        ("10.96.0.41:*", false),
        ("192.0.2.41:80/TCP", false),
    ]
    .into_iter()
    .map(|(a, m)| (a.to_string(), m))
    .collect();
    assert_eq!(maglev, want);

    let mut maps = MemoryMaps::default();
    let report = MapWriter::new(Limits::default()).apply(&compiled.frontends, &mut maps);
    assert!(report.rejected.is_empty() && report.errors.is_empty());
    check_against(&maps, &compiled.frontends, "compiled");
    let lb = key_of("203.0.113.10", 80);
    assert_eq!(maps.services[&lb].count, 251);
    assert!(maps.dump().contains("203.0.113.10:80/TCP => id="));
    assert!(maps.dump().contains("count=251 maglev"));
    let local = ServiceKey {
        scope: dataplane_common::SCOPE_EXTERNAL,
        ..key_of("192.0.2.42", 80)
    };
    assert!(
        tables(&maps)[&local]
            .iter()
            .all(|b| b.addr_be == u32::from_be_bytes([10, 244, 1, 4]).to_be()),
        "only this node's endpoint"
    );

    // Off: the same frontends, placed as ClusterIPs are.
    let off = compile(
        &objects.services,
        &objects.slices,
        &Options {
            maglev: None,
            ..opts
        },
    );
    assert!(off.frontends.values().all(|f| f.policy.maglev.is_none()));
}

fn key_of(ip: &str, port: u16) -> ServiceKey {
    ServiceKey {
        addr_be: u32::from(ip.parse::<std::net::Ipv4Addr>().unwrap()).to_be(),
        port_be: port.to_be(),
        proto: PROTO_TCP,
        scope: SCOPE_ANY,
    }
}

/// Nodes differ in their history (which backends came first, which ids they got,
/// restarts) but build the same table, entry by entry, from the same backends.
#[test]
fn every_node_builds_the_same_table_whatever_its_history() {
    let target: BTreeMap<ServiceKey, Frontend> =
        [(key(1), frontend(1, 0..40, Some(small())))].into();

    // Node A: all at once.
    let mut a = MemoryMaps::default();
    MapWriter::new(Limits::default()).apply(&target, &mut a);

    // Node B: other Services first (other backend ids), then the backends one at a
    // time in reverse, some coming and going, and a restart in the middle.
    let mut b = MemoryMaps::default();
    let mut writer = MapWriter::new(Limits::default());
    let mut desired: BTreeMap<ServiceKey, Frontend> =
        [(key(9), frontend(9, 100..130, None))].into();
    writer.apply(&desired, &mut b);
    for n in (0..40).rev() {
        desired.insert(key(1), frontend(1, n..40, Some(small())));
        if n.is_multiple_of(7) {
            desired.insert(
                key(1),
                frontend(1, (n..40).filter(|x| !x.is_multiple_of(3)), Some(small())),
            );
        }
        writer.apply(&desired, &mut b);
        if n == 20 {
            writer = MapWriter::restore(Limits::default(), b.state());
        }
    }
    desired.insert(key(1), target[&key(1)].clone());
    writer.apply(&desired, &mut b);
    desired.remove(&key(9));
    writer.apply(&desired, &mut b);

    assert_ne!(a.backends, b.backends, "the nodes' backend ids differ");
    assert_eq!(tables(&a), tables(&b), "same table on both nodes");
    check_against(&b, &target, "node B");
}

/// The writer's ordering invariant with Maglev frontends among others: backends,
/// then the entries that changed, then the service entry; stale slots and orphan
/// backends last. Checked after every map operation, while backends flip, frontends
/// come and go and switch between a table and a ClusterIP's placement.
#[test]
fn no_packet_ever_sees_a_half_written_maglev_table_while_backends_flip() {
    let mut writer = MapWriter::new(Limits::default());
    let mut maps = Checked::default();
    let mut next = rng(0x5eed_0011);
    for round in 0..300 {
        let mut desired = BTreeMap::new();
        for s in 0..4 {
            if next().is_multiple_of(9) {
                continue; // the frontend disappears this round
            }
            let n = next() % 12;
            // Mostly Maglev; now and then the same frontend without a table.
            let maglev = (s < 3 && !next().is_multiple_of(5)).then_some(small());
            desired.insert(key(s), frontend(s, (0..n).map(|_| next() % 16), maglev));
        }
        // Sometimes a restart: the writer adopts what the maps hold.
        if next().is_multiple_of(20) {
            writer = MapWriter::restore(Limits::default(), maps.inner.state());
        }
        let report = writer.apply(&desired, &mut maps);
        assert!(report.rejected.is_empty() && report.errors.is_empty());
        let at = format!("round {round}");
        check_against(&maps.inner, &desired, &at);
        // No orphan backends or stale slots left behind.
        let used: std::collections::BTreeSet<u32> = maps.inner.slots.values().copied().collect();
        assert_eq!(used.len(), maps.inner.backends.len(), "{at}: orphans");
        let slots: usize = maps.inner.services.values().map(|v| v.count as usize).sum();
        assert_eq!(slots, maps.inner.slots.len(), "{at}: stale slots");
    }
}

/// One backend of 100 leaving a Maglev frontend of the default size: the writer
/// writes only the entries that move (about 4% of 1,021 with Maglev's cascade) and
/// deletes the backend; about as many random flows change backend. The same change
/// with a ClusterIP's placement (slot = hash % count, the last slot moved into the
/// hole) writes two slots but moves nearly every flow.
#[test]
fn one_backend_of_a_hundred_leaving_writes_the_moved_entries_and_moves_few_flows() {
    let m = TableSize::DEFAULT;
    let mut next = rng(0x0bad_cafe);
    let flows: Vec<u32> = (0..20_000)
        .map(|_| {
            let (client, port) = (next(), next() as u16);
            flow_hash(client, key(1).addr_be, port, 443u16.to_be(), PROTO_TCP)
        })
        .collect();
    let moved_flows = |before: &[Backend], after: &[Backend]| {
        flows
            .iter()
            .filter(|h| {
                before[(**h % before.len() as u32) as usize]
                    != after[(**h % after.len() as u32) as usize]
            })
            .count() as f64
            / flows.len() as f64
    };
    for (maglev, writes, moved) in [
        (Some(m), (0.01, 0.01 + 0.05), (0.0, 0.01 + 0.05)),
        (None, (0.0, 0.01), (0.9, 1.0)),
    ] {
        let mut writer = MapWriter::new(Limits::default());
        let mut maps = MemoryMaps::default();
        let mut desired: BTreeMap<ServiceKey, Frontend> =
            [(key(1), frontend(1, 0..100, maglev))].into();
        writer.apply(&desired, &mut maps);
        let before = tables(&maps)[&key(1)].clone();
        desired.insert(key(1), frontend(1, (0..100).filter(|b| *b != 42), maglev));
        maps.ops.clear();
        let report = writer.apply(&desired, &mut maps);
        let after = tables(&maps)[&key(1)].clone();
        check_against(&maps, &desired, "after");

        let slot_writes = maps
            .ops
            .iter()
            .filter(|op| matches!(op, Op::PutSlot(_)))
            .count();
        let changed = match maglev {
            Some(_) => before.iter().zip(&after).filter(|(a, b)| a != b).count(),
            None => 1,
        };
        assert_eq!(slot_writes, changed, "only changed entries written");
        let share = slot_writes as f64 / before.len() as f64;
        let flows_moved = moved_flows(&before, &after);
        eprintln!(
            "maglev {maglev:?}: {slot_writes} slot writes ({share:.4} of the slots), \
             {flows_moved:.4} of flows moved, report {report:?}"
        );
        assert!(
            (writes.0..=writes.1).contains(&share),
            "{maglev:?}: slot writes {share}"
        );
        assert!(
            (moved.0..=moved.1).contains(&flows_moved),
            "{maglev:?}: flows moved {flows_moved}"
        );
        assert_eq!(
            maps.ops
                .iter()
                .filter(|op| matches!(op, Op::DelBackend(_)))
                .count(),
            1
        );
    }
}

/// A table that does not fit the slots map leaves its frontend as it was (here:
/// placed as a ClusterIP's, then its previous table), and the others go on.
#[test]
fn a_table_that_does_not_fit_keeps_the_previous_state() {
    let limits = Limits {
        services: 10,
        backends: 100,
        slots: 300,
    };
    let mut writer = MapWriter::new(limits);
    let mut maps = MemoryMaps::default();
    let mut desired: BTreeMap<ServiceKey, Frontend> = [
        (key(1), frontend(1, [1, 2, 3], Some(small()))),
        (key(2), frontend(2, [4, 5], None)),
    ]
    .into();
    let report = writer.apply(&desired, &mut maps);
    assert!(report.rejected.is_empty(), "{report:?}");
    let first = maps.clone();

    // Frontend 2 asks for a table too: 502 slots do not fit in 300.
    desired.insert(key(2), frontend(2, [4, 5, 6], Some(small())));
    desired.insert(key(1), frontend(1, [1, 2], Some(small())));
    maps.ops.clear();
    let report = writer.apply(&desired, &mut maps);
    assert_eq!(report.rejected.len(), 1, "{report:?}");
    assert_eq!(report.rejected[0].0.name.as_ref(), "lb-2");
    assert!(report.rejected[0]
        .1
        .to_string()
        .contains("slots map is full"));
    assert_eq!(tables(&maps)[&key(2)], tables(&first)[&key(2)], "kept");
    assert_eq!(
        tables(&maps)[&key(1)],
        maglev::resolved(&desired[&key(1)].backends, small()),
        "the other one updated"
    );
    maps.consistent().unwrap();
}

/// After a restart the writer adopts the tables and writes nothing; a table an
/// interrupted run left with the right backends in wrong entries is repaired.
#[test]
fn a_restored_writer_keeps_whole_tables_and_repairs_a_scrambled_one() {
    let desired: BTreeMap<ServiceKey, Frontend> = (0..20u32)
        .map(|s| {
            let maglev = s.is_multiple_of(2).then_some(small());
            (key(s), frontend(s, (0..10).map(|b| s * 3 + b), maglev))
        })
        .collect();
    let mut maps = MemoryMaps::default();
    MapWriter::new(Limits::default()).apply(&desired, &mut maps);

    let mut restored = MapWriter::restore(Limits::default(), maps.state());
    maps.ops.clear();
    let report = restored.apply(&desired, &mut maps);
    assert_eq!(
        (report.map_writes, report.map_deletes),
        (0, 0),
        "{:?}",
        maps.ops
    );

    // Two entries of one table swapped, as a write cut short could leave them.
    let id = maps.services[&key(4)].id;
    let (s0, s1) = (
        SlotKey {
            service_id: id,
            slot: 0,
        },
        SlotKey {
            service_id: id,
            slot: 1,
        },
    );
    let (b0, b1) = (maps.slots[&s0], maps.slots[&s1]);
    assert_ne!(b0, b1, "entries 0 and 1 of this table differ");
    maps.slots.insert(s0, b1);
    maps.slots.insert(s1, b0);
    let mut restored = MapWriter::restore(Limits::default(), maps.state());
    maps.ops.clear();
    let report = restored.apply(&desired, &mut maps);
    assert_eq!(maps.ops, [Op::PutSlot(s0), Op::PutSlot(s1)], "{report:?}");
    check_against(&maps, &desired, "repaired");
}

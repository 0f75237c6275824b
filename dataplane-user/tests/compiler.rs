//! Compiler and map-writer tests: golden map dumps for the manifests in `testdata/`,
//! and the writer's ordering and incremental-cost guarantees. No kernel needed.
//!
//! Golden files are written by the code, never by hand: run with `UPDATE_GOLDEN=1` to
//! regenerate them after a deliberate change, and review the diff.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path};

mod common;
use common::Checked;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde::Deserialize as _;

use dataplane_common::{Backend, ServiceKey, SlotKey, PROTO_TCP};
use sliceway_agent::{
    compiler::{compile, Frontend, Options, ServicePortName},
    source::local::parse_file,
    writer::memory_maps::{MemoryMaps, Op},
    writer::{Limits, MapWriter},
};

/// The Services and EndpointSlices of a manifest, read without the front door
/// (`conventions::validate`): the compiler's own handling of what the door refuses
/// (addresses that are not IPs, loopback, leading zeros as an older API server
/// stored them) is what these goldens show.
fn unchecked(text: &str) -> (Vec<Service>, Vec<EndpointSlice>) {
    let (mut services, mut slices) = (Vec::new(), Vec::new());
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_yaml_ng::Value::deserialize(doc).unwrap();
        match value.get("kind").and_then(|k| k.as_str()) {
            Some("Service") => services.push(serde_yaml_ng::from_value(value).unwrap()),
            Some("EndpointSlice") => slices.push(serde_yaml_ng::from_value(value).unwrap()),
            _ => {}
        }
    }
    (services, slices)
}

/// Compiles `testdata/{input}.yaml` and compares the dump with `golden/{case}.txt`.
fn golden(case: &str, input: &str, opts: &Options) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let input = dir.join("testdata").join(format!("{input}.yaml"));
    let (services, slices) = unchecked(&fs::read_to_string(&input).unwrap());
    let compiled = compile(&services, &slices, opts);
    let mut writer = MapWriter::new(Limits::default());
    let mut maps = MemoryMaps::default();
    let report = writer.apply(compiled.desired(), &mut maps);
    assert!(report.errors.is_empty() && report.rejected.is_empty());
    maps.consistent().unwrap();

    let mut got = String::new();
    let name = input.file_name().unwrap().to_string_lossy();
    writeln!(
        got,
        "# golden map dump of testdata/{name} (UPDATE_GOLDEN=1 to regenerate)"
    )
    .unwrap();
    got.push_str(&maps.dump());
    got.push_str("SKIPPED\n");
    for s in &compiled.skipped {
        writeln!(got, "  {}: {}", s.object, s.reason).unwrap();
    }
    writeln!(got, "IGNORED\n  {:?}", compiled.ignored).unwrap();

    let path = dir.join("golden").join(format!("{case}.txt"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::write(&path, &got).unwrap();
    }
    let want = fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_GOLDEN=1", path.display()));
    assert_eq!(
        got, want,
        "golden dump of {case} differs; if the change is deliberate, UPDATE_GOLDEN=1"
    );
}

/// Issue 12: IPv6 and dual-stack Services, for node-1 with addresses of both
/// families (NodePorts on both, masquerade sources, `allowFromNode`).
#[test]
fn golden_dualstack() {
    golden(
        "dualstack",
        "dualstack",
        &Options {
            node_name: Some("node-1".into()),
            node_port_ips: vec!["198.51.100.1".parse().unwrap()],
            node_ip: Some("198.51.100.1".parse().unwrap()),
            node_port_ips6: vec!["2001:db8:1::1".parse().unwrap()],
            node_ip6: Some("2001:db8:1::1".parse().unwrap()),
            ..Options::default()
        },
    );
}

#[test]
fn golden_basic() {
    golden("basic", "basic", &Options::default());
}

#[test]
fn golden_policy() {
    golden(
        "policy",
        "policy",
        &Options {
            node_name: Some("node-1".into()),
            proxy_name: None,
            zone: None,
            ..Options::default()
        },
    );
}

#[test]
fn golden_policy_as_the_named_proxy() {
    golden(
        "policy-named",
        "policy",
        &Options {
            node_name: Some("node-1".into()),
            proxy_name: Some("other-proxy".into()),
            zone: None,
            ..Options::default()
        },
    );
}

#[test]
fn golden_parity_with_kube_proxy_for_node_1_in_zone_a() {
    golden(
        "parity",
        "parity",
        &Options {
            node_name: Some("node-1".into()),
            proxy_name: None,
            zone: Some("zone-a".into()),
            ..Options::default()
        },
    );
}

// ---------------------------------------------------------------------------------
// Writer guarantees.

fn key(i: u32) -> ServiceKey {
    ServiceKey {
        addr_be: (0x0a60_0000 + i).to_be(),
        port_be: 80u16.to_be(),
        proto: PROTO_TCP,
        scope: 0,
    }
}

fn backend(i: u32) -> Backend {
    Backend {
        addr_be: (0x0af4_0000 + i).to_be(),
        port_be: 8080u16.to_be(),
        proto: PROTO_TCP,
        _pad: 0,
    }
}

fn frontend(name: u32, backends: impl IntoIterator<Item = u32>) -> Frontend {
    let mut backends: Vec<Backend> = backends.into_iter().map(backend).collect();
    backends.sort();
    backends.dedup();
    Frontend {
        service: ServicePortName {
            namespace: "default".into(),
            name: format!("svc-{name}").into(),
            port: "http".into(),
        },
        backends,
        policy: Default::default(),
        source_ranges: Vec::new(),
    }
}

/// Expected map content for `desired`, independent of ids: frontend → backend set.
fn resolve(maps: &MemoryMaps) -> BTreeMap<ServiceKey, Vec<Backend>> {
    maps.services
        .iter()
        .map(|(k, v)| {
            let mut b: Vec<Backend> = (0..v.count)
                .map(|s| {
                    maps.backends[&maps.slots[&SlotKey {
                        service_id: v.id,
                        slot: s,
                    }]]
                })
                .collect();
            b.sort();
            (*k, b)
        })
        .collect()
}

#[test]
fn no_packet_ever_sees_a_half_written_service_while_backends_flip() {
    // A deterministic pseudo-random walk over backend sets of three services that
    // share backends; the check runs after every single map operation.
    let mut writer = MapWriter::new(Limits::default());
    let mut maps = Checked::default();
    let mut seed = 0x2545_f491_u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    for round in 0..500 {
        let mut desired = BTreeMap::new();
        for s in 0..3 {
            if next() % 7 == 0 {
                continue; // the service disappears this round
            }
            let n = next() % 6;
            desired.insert(key(s), frontend(s, (0..n).map(|_| next() % 8)));
        }
        writer.apply(&desired, &mut maps);
        let want: BTreeMap<ServiceKey, Vec<Backend>> = desired
            .iter()
            .map(|(k, f)| (*k, f.backends.clone()))
            .collect();
        assert_eq!(resolve(&maps.inner), want, "round {round}");
        // No orphan backends or stale slots left behind.
        let used: std::collections::BTreeSet<u32> = maps.inner.slots.values().copied().collect();
        assert_eq!(
            used.len(),
            maps.inner.backends.len(),
            "round {round}: orphan backends"
        );
        let slots: usize = maps.inner.services.values().map(|v| v.count as usize).sum();
        assert_eq!(slots, maps.inner.slots.len(), "round {round}: stale slots");
    }
}

#[test]
fn one_endpoint_change_in_ten_thousand_services_costs_a_handful_of_writes() {
    let mut writer = MapWriter::new(Limits::default());
    let mut maps = MemoryMaps::default();
    let mut desired: BTreeMap<ServiceKey, Frontend> = (0..10_000)
        .map(|s| (key(s), frontend(s, (0..10).map(|b| s * 10 + b))))
        .collect();
    writer.apply(&desired, &mut maps);
    assert_eq!(maps.services.len(), 10_000);

    // Remove one endpoint of one service.
    desired.insert(
        key(4242),
        frontend(4242, (0..10).filter(|b| *b != 3).map(|b| 42420 + b)),
    );
    maps.ops.clear();
    let report = writer.apply(&desired, &mut maps);
    assert!(
        report.map_writes + report.map_deletes <= 5,
        "{report:?} {:?}",
        maps.ops
    );
    assert_eq!(resolve(&maps)[&key(4242)], desired[&key(4242)].backends);
    assert_eq!(
        maps.ops
            .iter()
            .filter(|op| matches!(op, Op::DelBackend(_)))
            .count(),
        1,
        "{:?}",
        maps.ops
    );

    // Add one back.
    desired.insert(key(4242), frontend(4242, (0..10).map(|b| 42420 + b)));
    maps.ops.clear();
    let report = writer.apply(&desired, &mut maps);
    assert!(
        report.map_writes + report.map_deletes <= 5,
        "{report:?} {:?}",
        maps.ops
    );
    assert_eq!(
        resolve(&maps)[&key(4242)],
        frontend(4242, (0..10).map(|b| 42420 + b)).backends
    );

    // Nothing changed: nothing written.
    maps.ops.clear();
    let report = writer.apply(&desired, &mut maps);
    assert_eq!((report.map_writes, report.map_deletes), (0, 0));
}

#[test]
fn a_service_that_does_not_fit_keeps_its_previous_state_and_others_are_untouched() {
    let limits = Limits {
        services: 10,
        backends: 6,
        slots: 100,
    };
    let mut writer = MapWriter::new(limits);
    let mut maps = MemoryMaps::default();
    let mut desired = BTreeMap::new();
    desired.insert(key(1), frontend(1, [1, 2]));
    desired.insert(key(2), frontend(2, [3]));
    let report = writer.apply(&desired, &mut maps);
    assert!(report.rejected.is_empty());

    // Service 1 grows beyond the backends map; service 2 changes and fits.
    desired.insert(key(1), frontend(1, [1, 2, 10, 11, 12, 13, 14]));
    desired.insert(key(2), frontend(2, [4]));
    let report = writer.apply(&desired, &mut maps);
    assert_eq!(report.rejected.len(), 1, "{report:?}");
    assert_eq!(report.rejected[0].0.name.as_ref(), "svc-1");
    assert!(
        report.rejected[0]
            .1
            .to_string()
            .contains("backends map is full"),
        "{report:?}"
    );
    let now = resolve(&maps);
    assert_eq!(
        now[&key(1)],
        frontend(1, [1, 2]).backends,
        "previous state kept"
    );
    assert_eq!(
        now[&key(2)],
        frontend(2, [4]).backends,
        "other service updated"
    );
}

#[test]
fn a_restored_writer_writes_nothing_when_nothing_changed_and_cleans_leftovers() {
    let mut desired: BTreeMap<ServiceKey, Frontend> = (0..50)
        .map(|s| (key(s), frontend(s, (0..4).map(|b| s * 4 + b))))
        .collect();
    let mut writer = MapWriter::new(Limits::default());
    let mut maps = MemoryMaps::default();
    writer.apply(&desired, &mut maps);

    // A restart: a new writer adopts the maps.
    let mut restored = MapWriter::restore(Limits::default(), maps.state());
    maps.ops.clear();
    let report = restored.apply(&desired, &mut maps);
    assert_eq!(
        (report.map_writes, report.map_deletes),
        (0, 0),
        "{:?}",
        maps.ops
    );

    // Leftovers of an interrupted run: an orphan backend and a stale slot.
    maps.backends.insert(9999, backend(9999));
    maps.slots.insert(
        SlotKey {
            service_id: 3,
            slot: 77,
        },
        0,
    );
    let mut restored = MapWriter::restore(Limits::default(), maps.state());
    desired.remove(&key(7));
    let report = restored.apply(&desired, &mut maps);
    assert!(report.errors.is_empty());
    assert!(!maps.backends.contains_key(&9999));
    assert!(!maps.slots.contains_key(&SlotKey {
        service_id: 3,
        slot: 77
    }));
    maps.consistent().unwrap();
    let want: BTreeMap<ServiceKey, Vec<Backend>> = desired
        .iter()
        .map(|(k, f)| (*k, f.backends.clone()))
        .collect();
    assert_eq!(resolve(&maps), want);
    assert_eq!(maps.names.len(), 49);

    // New ids do not collide with adopted ones.
    desired.insert(key(1000), frontend(1000, [1, 100_000]));
    restored.apply(&desired, &mut maps);
    maps.consistent().unwrap();
    assert_eq!(
        resolve(&maps)[&key(1000)],
        frontend(1000, [1, 100_000]).backends
    );
}

/// Issue 11: load-balancer ingress IPs are frontends like external IPs, except those
/// with `ipMode: Proxy`, whose traffic comes from a proxy (kube-proxy's `IsVIPMode`,
/// pkg/proxy/serviceport.go); a `LoadBalancer` with `externalTrafficPolicy: Local`
/// has a health check counting its ready endpoints on this node by address.
#[test]
fn load_balancer_ingress_ips_in_vip_mode_are_frontends_and_local_ones_are_health_checked() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.40
  externalTrafficPolicy: Local
  healthCheckNodePort: 30100
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
status:
  loadBalancer:
    ingress:
    - {ip: 203.0.113.10}
    - {ip: 203.0.113.11, ipMode: VIP}
    - {ip: 203.0.113.12, ipMode: Proxy}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: shop, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: admin, port: 9090, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-1}
- {addresses: [10.244.1.3], nodeName: node-1, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.2.2], nodeName: node-2}
"#;
    let (objects, problems) = parse_file(Path::new("lb.yaml"), yaml);
    assert!(problems.is_empty(), "{problems:?}");
    let objects = objects.unwrap();
    let opts = Options {
        node_name: Some("node-1".into()),
        ..Options::default()
    };
    let compiled = compile(&objects.services, &objects.slices, &opts);
    let vips = |scope: u8| {
        let mut v: Vec<String> = compiled
            .frontends
            .keys()
            .filter(|k| k.port_be != 0 && k.scope == scope)
            .map(|k| std::net::Ipv4Addr::from(u32::from_be(k.addr_be)).to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        vips(dataplane_common::SCOPE_ANY),
        ["10.96.0.40", "203.0.113.10", "203.0.113.11"]
    );
    // With `externalTrafficPolicy: Local`, clients outside the node get entries of
    // their own on the load-balancer IPs: this node's ready endpoint only, while
    // pods and the node's sockets get every endpoint.
    assert_eq!(
        vips(dataplane_common::SCOPE_EXTERNAL),
        ["203.0.113.10", "203.0.113.11"]
    );
    let backends = |scope: u8| {
        let key = compiled
            .frontends
            .keys()
            .find(|k| {
                k.addr_be == u32::from_be_bytes([203, 0, 113, 10]).to_be() && k.scope == scope
            })
            .unwrap();
        compiled.frontends[key]
            .backends
            .iter()
            .map(|b| std::net::Ipv4Addr::from(u32::from_be(b.addr_be)).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(backends(dataplane_common::SCOPE_EXTERNAL), ["10.244.1.2"]);
    assert_eq!(
        backends(dataplane_common::SCOPE_ANY),
        ["10.244.1.2", "10.244.2.2"]
    );
    let hc = compiled.health_checks[&("shop".to_string(), "lb".to_string())];
    assert_eq!((hc.port, hc.local4, hc.local6), (30100, Some(1), None));
    // Not a LoadBalancer with a Local policy: no health check.
    let cluster = yaml.replace(
        "externalTrafficPolicy: Local",
        "externalTrafficPolicy: Cluster",
    );
    let (objects, _) = parse_file(Path::new("lb.yaml"), &cluster);
    let objects = objects.unwrap();
    let cluster = compile(&objects.services, &objects.slices, &opts);
    assert!(cluster.health_checks.is_empty());
    // Nor entries for clients outside the node: they use the frontend's only entry
    // and are masqueraded.
    assert!(cluster
        .frontends
        .keys()
        .all(|k| k.scope == dataplane_common::SCOPE_ANY));
}

/// Issue 11: NodePorts are frontends on the node's primary address by default (its
/// Node object's first InternalIP, through the local source as `run` reads it), or
/// on the node's addresses within `--nodeport-addresses` CIDRs, on the port's
/// `nodePort`, with the Service's endpoints.
#[test]
fn node_ports_are_served_on_the_primary_address_or_the_addresses_in_the_cidrs() {
    use sliceway_agent::compiler::{Incremental, NodePortAddresses};
    use sliceway_agent::source::local::ManifestDir;
    use std::net::Ipv4Addr;
    let dir = std::env::temp_dir().join(format!("sliceway-nodeport-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("web.yaml"),
        r#"
apiVersion: v1
kind: Node
metadata: {name: node-1}
status:
  addresses:
  - {type: Hostname, address: node-1}
  - {type: ExternalIP, address: 203.0.113.1}
  - {type: InternalIP, address: 192.168.0.10}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
    )
    .unwrap();
    let frontends = |c: &Incremental| -> Vec<(Ipv4Addr, u16)> {
        let mut v: Vec<_> = c
            .frontends()
            .iter()
            .filter(|(k, f)| k.port_be != 0 && !f.backends.is_empty())
            .map(|(k, _)| {
                (
                    Ipv4Addr::from(u32::from_be(k.addr_be)),
                    u16::from_be(k.port_be),
                )
            })
            .collect();
        v.sort();
        v
    };
    let mut primary = Incremental::new(Options {
        node_name: Some("node-1".into()),
        ..Options::default()
    });
    let mut source = ManifestDir::new(&dir, Some("node-1".into()));
    source.rescan(&mut primary).unwrap();
    primary.compile();
    assert_eq!(
        frontends(&primary),
        [
            (Ipv4Addr::new(10, 96, 0, 10), 80),
            (Ipv4Addr::new(192, 168, 0, 10), 30080)
        ]
    );

    let mut cidrs = Incremental::new(Options {
        node_name: Some("node-1".into()),
        node_port_addresses: NodePortAddresses::parse("10.244.0.0/16, fd00::/8").unwrap(),
        ..Options::default()
    });
    let mut source = ManifestDir::new(&dir, Some("node-1".into()));
    source.rescan(&mut cidrs).unwrap();
    assert!(cidrs.set_interface_addrs(&[
        Ipv4Addr::new(10, 244, 1, 1),
        Ipv4Addr::new(10, 244, 2, 1),
        Ipv4Addr::new(192, 168, 0, 10),
    ]));
    cidrs.compile();
    assert_eq!(
        frontends(&cidrs),
        [
            (Ipv4Addr::new(10, 96, 0, 10), 80),
            (Ipv4Addr::new(10, 244, 1, 1), 30080),
            (Ipv4Addr::new(10, 244, 2, 1), 30080)
        ]
    );
    // The node's primary address does not count in CIDR mode.
    assert!(!cidrs.set_node_ip(Some(Ipv4Addr::new(10, 244, 9, 9))));
    assert!(NodePortAddresses::parse("10.0.0.0/33").is_err());
    assert_eq!(
        NodePortAddresses::parse("primary"),
        Ok(NodePortAddresses::Primary)
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// Issue 11: `loadBalancerSourceRanges` as kube-proxy reads them
/// (pkg/proxy/serviceport.go, the nftables proxier's firewall chain): on the
/// load-balancer IPs only, trimmed, networks masked, the other family's left to it, an
/// entry that is not a CIDR reported and left out, `0.0.0.0/0` meaning no check; a
/// range containing the node's address also lets the load-balancer IPs in.
#[test]
fn load_balancer_source_ranges_guard_the_load_balancer_ips_only() {
    let yaml = |ranges: &str| {
        format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: lb, namespace: shop}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.40
  externalIPs: [198.51.100.7]
  loadBalancerSourceRanges: {ranges}
  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}}]
status:
  loadBalancer:
    ingress: [{{ip: 203.0.113.10}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: lb-1, namespace: shop, labels: {{kubernetes.io/service-name: lb}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: [10.244.1.2], nodeName: node-1}}
"#
        )
    };
    let compile_with = |ranges: &str, node_ip: Option<&str>| {
        let (objects, problems) = parse_file(Path::new("lb.yaml"), &yaml(ranges));
        assert!(problems.is_empty(), "{problems:?}");
        let objects = objects.unwrap();
        let opts = Options {
            node_name: Some("node-1".into()),
            node_port_ips: vec!["192.168.0.10".parse().unwrap()],
            node_ip: node_ip.map(|ip| ip.parse().unwrap()),
            ..Options::default()
        };
        compile(&objects.services, &objects.slices, &opts)
    };
    let net = |s: &str| {
        let (a, l) = s.split_once('/').unwrap();
        (
            u32::from(a.parse::<std::net::Ipv4Addr>().unwrap()).to_be(),
            l.parse::<u8>().unwrap(),
        )
    };
    let guarded = |c: &sliceway_agent::compiler::Compiled| -> BTreeMap<String, Vec<(u32, u8)>> {
        c.frontends
            .iter()
            .filter(|(_, f)| f.policy.source_ranges || !f.source_ranges.is_empty())
            .map(|(k, f)| {
                (
                    sliceway_agent::compiler::frontend_addr(k),
                    f.source_ranges.clone(),
                )
            })
            .collect()
    };
    let c = compile_with(
        r#"["10.0.0.0/8", " 192.168.1.7/24 ", "fd00::/8", "bogus"]"#,
        Some("172.16.0.1"),
    );
    assert_eq!(
        guarded(&c),
        BTreeMap::from([(
            "203.0.113.10:80/TCP".to_string(),
            vec![net("10.0.0.0/8"), net("192.168.1.0/24")]
        )]),
        "the LB IP only: not the ClusterIP, the external IP or the NodePort"
    );
    assert!(
        c.skipped
            .iter()
            .any(|s| s.code == "bad_source_range" && s.reason.contains("bogus")),
        "{:?}",
        c.skipped
    );
    // The node's address within a range: the LB IP may be a source too.
    let c = compile_with(r#"["10.0.0.0/8"]"#, Some("10.1.2.3"));
    assert_eq!(
        guarded(&c)["203.0.113.10:80/TCP"],
        vec![net("10.0.0.0/8"), net("203.0.113.10/32")]
    );
    // Every source: no check at all.
    assert!(guarded(&compile_with(r#"["10.0.0.0/8", "0.0.0.0/0"]"#, None)).is_empty());
    assert!(guarded(&compile_with("[]", None)).is_empty());
}

/// Issue 46: a Service whose name is a DNS-1123 label that is not a DNS-1035 one
/// (`1api`, valid since KEP-5311) passes the front door of a manifest directory and
/// is programmed like any other.
#[test]
fn a_service_whose_name_starts_with_a_digit_is_programmed() {
    let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: 1api, namespace: shop}
spec:
  clusterIP: 10.96.0.41
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: 1api-x1, namespace: shop, labels: {kubernetes.io/service-name: 1api}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-1}
"#;
    let (objects, problems) = parse_file(Path::new("1api.yaml"), yaml);
    assert!(problems.is_empty(), "{problems:?}");
    let objects = objects.unwrap();
    assert_eq!(objects.services.len(), 1);
    let compiled = compile(&objects.services, &objects.slices, &Options::default());
    assert!(compiled.skipped.is_empty(), "{:?}", compiled.skipped);
    let vip = u32::from(std::net::Ipv4Addr::new(10, 96, 0, 41)).to_be();
    assert!(
        compiled
            .frontends
            .keys()
            .any(|k| k.addr_be == vip && k.port_be == 80u16.to_be()),
        "{:?}",
        compiled.frontends.keys().collect::<Vec<_>>()
    );
}

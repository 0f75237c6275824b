//! The incremental path against the full one: over random sequences of changes, the
//! incremental compiler gives what a full compile gives, and `MapWriter::apply_changed`
//! issues the same map operations as `MapWriter::apply` and leaves the maps holding
//! what a full compile and apply from scratch leaves. No kernel needed.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use dataplane_common::{Backend, ServiceKey, SlotKey};
use sliceway_agent::{
    agent::Pipeline,
    compiler::{compile, compile_model, Incremental, Options},
    model::{
        Address, EndpointInfo, Hints, Origin, ServiceId, ServiceInfo, ServicePortInfo,
        ServiceSpecInfo, SliceId, SliceInfo, SlicePortInfo,
    },
    source::local::{parse_file, ManifestDir},
    writer::memory_maps::MemoryMaps,
    writer::{Limits, MapWriter},
};

/// xorshift: deterministic, no dependency.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    fn below(&mut self, n: u32) -> u32 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u32) as usize]
    }
    fn chance(&mut self, one_in: u32) -> bool {
        self.below(one_in) == 0
    }
}

const NAMESPACES: [Option<&str>; 4] = [Some("default"), Some("apps"), None, Some("")];
const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

fn opt_string(s: Option<&str>) -> Option<String> {
    s.map(str::to_string)
}

fn origin(rng: &mut Rng) -> Origin {
    match rng.below(6) {
        0 => Origin {
            file: Some(Arc::from(Path::new("a.yaml"))),
            occurrence: rng.below(2),
        },
        1 => Origin {
            file: Some(Arc::from(Path::new("b.yaml"))),
            occurrence: 0,
        },
        _ => Origin::default(),
    }
}

/// A Service, now and then a broken or deliberately ignored one, on a small set of
/// addresses so that frontends collide.
fn service(rng: &mut Rng) -> ServiceInfo {
    let ip = |rng: &mut Rng| format!("10.96.0.{}", rng.below(6) + 1);
    let ip6 = |rng: &mut Rng| format!("fd00::{}", rng.below(6) + 1);
    let mut cluster_ips = vec![ip(rng)];
    match rng.below(12) {
        0 => cluster_ips = vec!["None".into()],
        1 => cluster_ips = vec![],
        2 => cluster_ips.push("fd00::1".into()),
        3 => cluster_ips = vec!["10.96.0.999".into()],
        // IPv6 only, IPv6 first, two of one family (issue 12).
        4 => cluster_ips = vec![ip6(rng)],
        5 => cluster_ips.insert(0, ip6(rng)),
        6 => cluster_ips.push(ip(rng)),
        _ => {}
    }
    let mut external_ips = Vec::new();
    if rng.chance(4) {
        external_ips.push(ip(rng));
    }
    if rng.chance(4) {
        external_ips.push(ip6(rng));
    }
    if rng.chance(10) {
        external_ips.push("not-an-ip".into());
    }
    let mut load_balancer_ips = Vec::new();
    if rng.chance(4) {
        load_balancer_ips.push(ip(rng));
    }
    if rng.chance(5) {
        load_balancer_ips.push(ip6(rng));
    }
    let load_balancer_source_ranges: Vec<String> = match rng.below(6) {
        0 => vec!["10.0.0.0/8".into()],
        1 => vec![
            "10.0.0.0/8".into(),
            "192.168.0.0/16".into(),
            "fd00::/8".into(),
        ],
        2 => vec!["0.0.0.0/0".into()],
        3 => vec!["not-a-cidr".into(), "10.96.0.0/12".into()],
        _ => vec![],
    };
    let mut ports = vec![ServicePortInfo {
        name: rng.pick(&["http", ""]).to_string(),
        protocol: opt_string(*rng.pick(&[None, Some("TCP"), Some("UDP")])),
        port: *rng.pick(&[80, 80, 443]),
        node_port: *rng.pick(&[None, None, Some(30_080), Some(70_000)]),
    }];
    if rng.chance(3) {
        ports.push(ServicePortInfo {
            name: rng.pick(&["dns", "http", "bad"]).to_string(),
            protocol: opt_string(*rng.pick(&[Some("UDP"), Some("SCTP"), None])),
            port: *rng.pick(&[53, 80, 0, 70000]),
            node_port: *rng.pick(&[None, Some(30_053), Some(30_080)]),
        });
    }
    let spec = (!rng.chance(20)).then(|| ServiceSpecInfo {
        external_name: rng.chance(15),
        cluster_ips,
        ip_families: Vec::new(),
        ip_family_policy: None,
        external_ips,
        load_balancer_ips,
        load_balancer_source_ranges,
        internal_local: rng.chance(4),
        external_local: rng.chance(4),
        session_affinity: opt_string(*rng.pick(&[
            None,
            None,
            Some("None"),
            Some("ClientIP"),
            Some("Sticky"),
        ])),
        affinity_timeout: *rng.pick(&[None, None, Some(60), Some(-1), Some(100_000)]),
        ports,
        health_check_node_port: *rng.pick(&[None, None, Some(30_000), Some(0), Some(70_000)]),
    });
    ServiceInfo {
        namespace: opt_string(*rng.pick(&NAMESPACES)),
        name: if rng.chance(30) {
            None
        } else {
            Some(rng.pick(&NAMES).to_string())
        },
        proxy_name: if rng.chance(12) {
            Some("other".into())
        } else {
            None
        },
        created: opt_string(*rng.pick(&[
            None,
            Some("2026-01-01T00:00:00Z"),
            Some("2026-01-02T00:00:00Z"),
        ])),
        spec,
    }
}

fn endpoint(rng: &mut Rng) -> EndpointInfo {
    let address = match rng.below(25) {
        0 => None,
        1 => Some(Address::new("not-an-ip")),
        // Either family, whatever the slice's addressType.
        2..=7 => Some(Address::new(&format!("fd00:244::{}", rng.below(12) + 1))),
        _ => Some(Address::new(&format!("10.244.0.{}", rng.below(12) + 1))),
    };
    let cond = |rng: &mut Rng| *rng.pick(&[None, Some(true), Some(false)]);
    EndpointInfo {
        address,
        ready: cond(rng),
        serving: cond(rng),
        terminating: cond(rng),
        node_name: rng
            .pick(&[None, Some("node-1"), Some("node-2")])
            .map(Arc::from),
        hints: Hints::new(
            hints(rng, &["zone-a", "zone-b"]),
            hints(rng, &["node-1", "node-2"]),
        ),
    }
}

/// No hint, one, or both of `names`.
fn hints(rng: &mut Rng, names: &[&str; 2]) -> Box<[Arc<str>]> {
    match rng.below(4) {
        0 | 1 => Box::new([]),
        2 => Box::new([Arc::from(*rng.pick(names))]),
        _ => names.iter().map(|n| Arc::from(*n)).collect(),
    }
}

fn slice(rng: &mut Rng) -> SliceInfo {
    let mut ports = vec![SlicePortInfo {
        name: opt_string(*rng.pick(&[Some("http"), Some(""), Some("http"), None])),
        protocol: opt_string(*rng.pick(&[None, Some("TCP"), Some("UDP")])),
        port: Some(*rng.pick(&[8080, 8081])),
    }];
    if rng.chance(4) {
        ports.push(SlicePortInfo {
            name: Some(rng.pick(&["dns", "bad"]).to_string()),
            protocol: opt_string(*rng.pick(&[Some("UDP"), Some("SCTP")])),
            port: *rng.pick(&[Some(53), None, Some(0)]),
        });
    }
    let n = rng.below(5);
    SliceInfo {
        namespace: opt_string(*rng.pick(&NAMESPACES)),
        name: Some(format!("s{}", rng.below(6))),
        proxy_name: rng.chance(15).then(|| "other".into()),
        headless: rng.chance(20),
        service_name: (!rng.chance(15)).then(|| rng.pick(&NAMES).to_string()),
        address_type: rng
            .pick(&["IPv4", "IPv4", "IPv4", "IPv6", "FQDN"])
            .to_string(),
        ports,
        endpoints: (0..n).map(|_| endpoint(rng)).collect(),
        trigger_time: rng
            .chance(3)
            .then(|| format!("2026-01-01T00:00:0{}Z", rng.below(9))),
    }
}

/// The objects, as the test holds them; the full compile's input in source order.
#[derive(Default)]
struct World {
    services: BTreeMap<ServiceId, ServiceInfo>,
    slices: BTreeMap<SliceId, SliceInfo>,
}

impl World {
    /// One random change, applied to the world and to the compiler.
    fn change(&mut self, rng: &mut Rng, c: &mut Incremental) {
        match rng.below(10) {
            0..=2 => {
                let svc = service(rng);
                let origin = origin(rng);
                self.services
                    .insert(ServiceId::of(&svc, origin.clone()), svc.clone());
                c.put_service(origin, svc);
            }
            3 if !self.services.is_empty() => {
                let ids: Vec<ServiceId> = self.services.keys().cloned().collect();
                let id = rng.pick(&ids).clone();
                self.services.remove(&id);
                assert!(c.remove_service(&id));
            }
            4..=6 => {
                let s = slice(rng);
                let origin = origin(rng);
                self.slices
                    .insert(SliceId::of(&s, origin.clone()), s.clone());
                c.put_slice(origin, s);
            }
            7 if !self.slices.is_empty() => {
                let ids: Vec<SliceId> = self.slices.keys().cloned().collect();
                let id = rng.pick(&ids).clone();
                self.slices.remove(&id);
                assert!(c.remove_slice(&id));
            }
            _ if !self.slices.is_empty() => {
                // One endpoint of a slice changes, the most common change of all.
                let ids: Vec<SliceId> = self.slices.keys().cloned().collect();
                let id = rng.pick(&ids).clone();
                let mut s = self.slices[&id].clone();
                if s.endpoints.is_empty() {
                    s.endpoints.push(endpoint(rng));
                } else {
                    let i = rng.below(s.endpoints.len() as u32) as usize;
                    s.endpoints[i] = endpoint(rng);
                }
                self.slices.insert(id.clone(), s.clone());
                c.put_slice(id.origin, s);
            }
            _ => {}
        }
    }

    fn compile(&self, opts: &Options) -> sliceway_agent::compiler::Compiled {
        let services: Vec<ServiceInfo> = self.services.values().cloned().collect();
        let slices: Vec<SliceInfo> = self.slices.values().cloned().collect();
        compile_model(&services, &slices, opts)
    }
}

/// What a packet would find: frontend → (name, backends), independent of ids and slots.
fn resolve(maps: &MemoryMaps) -> BTreeMap<ServiceKey, (String, Vec<Backend>)> {
    maps.services
        .iter()
        .map(|(k, v)| {
            let mut b: Vec<Backend> = (0..v.count)
                .map(|slot| {
                    maps.backends[&maps.slots[&SlotKey {
                        service_id: v.id,
                        slot,
                    }]]
                })
                .collect();
            b.sort();
            (*k, (maps.names[&v.id].clone(), b))
        })
        .collect()
}

/// [`resolve`] of IPv6's frontends.
fn resolve6(
    maps: &MemoryMaps,
) -> BTreeMap<dataplane_common::ServiceKey6, (String, Vec<dataplane_common::Backend6>)> {
    maps.services6
        .iter()
        .map(|(k, v)| {
            let mut b: Vec<_> = (0..v.count)
                .map(|slot| {
                    maps.backends6[&maps.slots[&SlotKey {
                        service_id: v.id,
                        slot,
                    }]]
                })
                .collect();
            b.sort();
            (*k, (maps.names[&v.id].clone(), b))
        })
        .collect()
}

fn no_leftovers(maps: &MemoryMaps, at: &str) {
    maps.consistent().unwrap_or_else(|e| panic!("{at}: {e}"));
    let used: BTreeSet<u32> = maps.slots.values().copied().collect();
    assert_eq!(
        used.len(),
        maps.backends.len() + maps.backends6.len(),
        "{at}: orphan backends"
    );
    let slots: usize = maps
        .services
        .values()
        .chain(maps.services6.values())
        .map(|v| v.count as usize)
        .sum();
    assert_eq!(slots, maps.slots.len(), "{at}: stale slots");
    assert_eq!(
        maps.names.len(),
        maps.services.len() + maps.services6.len(),
        "{at}: stale names"
    );
}

fn same_maps(a: &MemoryMaps, b: &MemoryMaps, at: &str) {
    assert_eq!(a.services, b.services, "{at}: services");
    assert_eq!(a.slots, b.slots, "{at}: slots");
    assert_eq!(a.backends, b.backends, "{at}: backends");
    assert_eq!(a.names, b.names, "{at}: names");
    assert_eq!(a.services6, b.services6, "{at}: IPv6 services");
    assert_eq!(a.backends6, b.backends6, "{at}: IPv6 backends");
}

/// Runs `rounds` rounds of a few random changes. `limits` small enough make the writer
/// reject frontends; then the from-scratch comparison does not hold (what was kept
/// depends on the history) and only the full writer fed the same history is compared.
fn random_walk(seed: u32, rounds: usize, opts: Options, limits: Limits) {
    let roomy = limits.services >= 1000;
    let mut rng = Rng(seed);
    let mut world = World::default();
    let mut incremental = Pipeline::new(Incremental::new(opts.clone()), MapWriter::new(limits));
    let mut inc_maps = MemoryMaps::default();
    // The reference: a full compile and a full apply at every round.
    let mut full = MapWriter::new(limits);
    let mut full_maps = MemoryMaps::default();
    let mut before = BTreeMap::new();
    let mut before6 = BTreeMap::new();
    let mut rounds_with_ranges = 0;
    for round in 0..rounds {
        let at = format!("seed {seed:#x} round {round}");
        for _ in 0..rng.below(4) + 1 {
            world.change(&mut rng, &mut incremental.compiler);
        }
        // Now and then the node moves to another zone (its Node's label changed).
        if rng.chance(15) {
            let zone = rng
                .pick(&[None, Some("zone-a"), Some("zone-b")])
                .map(String::from);
            incremental.compiler.set_zone(zone);
        }
        let opts = incremental.compiler.options().clone();
        // Now and then a restart: both writers adopt what their maps hold.
        if rng.chance(25) {
            let compiler = std::mem::take(&mut incremental.compiler);
            incremental = Pipeline::new(compiler, MapWriter::restore(limits, inc_maps.state()));
            full = MapWriter::restore(limits, full_maps.state());
        }
        inc_maps.ops.clear();
        full_maps.ops.clear();
        let synced = incremental.sync(&mut inc_maps);

        let want = world.compile(&opts);
        let got = incremental.compiler.compiled();
        assert_eq!(got.frontends, want.frontends, "{at}: frontends");
        assert_eq!(got.frontends6, want.frontends6, "{at}: IPv6 frontends");
        assert_eq!(got.skipped, want.skipped, "{at}: skipped");
        assert_eq!(got.ignored, want.ignored, "{at}: ignored");
        // What the compile called changed covers every frontend that changed.
        let changed: BTreeSet<&ServiceKey> = before
            .keys()
            .chain(want.frontends.keys())
            .filter(|k| before.get(*k) != want.frontends.get(*k))
            .collect();
        let changed6 = before6
            .keys()
            .chain(want.frontends6.keys())
            .filter(|k| before6.get(*k) != want.frontends6.get(*k))
            .collect::<BTreeSet<_>>();
        assert!(
            synced.changed >= changed.len() + changed6.len(),
            "{at}: changes missed"
        );

        let report = full.apply(want.desired(), &mut full_maps);
        assert_eq!(synced.report, report, "{at}: reports differ");
        assert_eq!(inc_maps.ops, full_maps.ops, "{at}: operations differ");
        same_maps(&inc_maps, &full_maps, &at);
        // The source ranges held are exactly the frontends' (restarts included: a
        // new pipeline removes what it does not want of what it finds).
        let want_ranges: BTreeSet<(u32, dataplane_common::SourceRange)> = want
            .frontends
            .iter()
            .filter(|(k, _)| k.scope == dataplane_common::SCOPE_ANY)
            .flat_map(|(k, f)| {
                f.source_ranges.iter().map(move |&(addr, len)| {
                    (
                        dataplane_common::SourceRange::FRONTEND_BITS + u32::from(len),
                        dataplane_common::SourceRange::of(*k, addr),
                    )
                })
            })
            .collect();
        assert_eq!(inc_maps.ranges, want_ranges, "{at}: source ranges");
        rounds_with_ranges += usize::from(!want_ranges.is_empty());
        inc_maps
            .consistent()
            .unwrap_or_else(|e| panic!("{at}: {e}"));
        if roomy {
            no_leftovers(&inc_maps, &at);
            let mut scratch = MemoryMaps::default();
            MapWriter::new(limits).apply(want.desired(), &mut scratch);
            assert_eq!(resolve(&inc_maps), resolve(&scratch), "{at}: from scratch");
            assert_eq!(
                resolve6(&inc_maps),
                resolve6(&scratch),
                "{at}: IPv6 from scratch"
            );
        }
        before = want.frontends;
        before6 = want.frontends6;
    }
    assert!(
        rounds < 50 || rounds_with_ranges > 0,
        "seed {seed:#x}: no round had source ranges to compare"
    );
}

#[test]
fn incremental_sync_matches_a_full_compile_and_apply() {
    for seed in [0x2545_f491, 0x1234_5678, 0x0bad_cafe, 0x7777_0001] {
        random_walk(seed, 400, Options::default(), Limits::default());
    }
}

#[test]
fn incremental_sync_matches_with_a_node_name_and_a_proxy_name() {
    let opts = Options {
        node_name: Some("node-1".into()),
        proxy_name: Some("other".into()),
        zone: Some("zone-a".into()),
        // NodePorts on two node addresses.
        node_port_ips: vec!["192.168.0.10".parse().unwrap(), "10.0.0.7".parse().unwrap()],
        ..Options::default()
    };
    for seed in [0x0000_beef, 0x5eed_5eed] {
        random_walk(seed, 400, opts.clone(), Limits::default());
    }
}

#[test]
fn incremental_sync_matches_with_maglev_tables() {
    // External IPs and NodePorts get tables (issue 11); ClusterIPs do not.
    let opts = Options {
        node_name: Some("node-1".into()),
        node_port_ips: ["192.168.0.10", "192.168.1.10", "10.0.0.7"]
            .map(|ip| ip.parse().unwrap())
            .to_vec(),
        maglev: Some(sliceway_agent::writer::maglev::TableSize::new(251).unwrap()),
        ..Options::default()
    };
    for seed in [0x00c0_ffee, 0x1dea_1dea] {
        random_walk(seed, 600, opts.clone(), Limits::default());
    }
    // Room for about two tables: some are refused, and keep their previous state.
    let limits = Limits {
        services: 20,
        backends: 20,
        slots: 600,
    };
    for seed in [0x0000_f00d, 0x7e57_7e57] {
        random_walk(seed, 600, opts.clone(), limits);
    }
}

#[test]
fn incremental_sync_matches_when_maps_are_full() {
    let limits = Limits {
        services: 6,
        backends: 7,
        slots: 12,
    };
    for seed in [0x4242_4242, 0x0dd_ba11] {
        random_walk(seed, 400, Options::default(), limits);
    }
}

#[test]
fn one_endpoint_change_in_ten_thousand_services_recompiles_one_service() {
    let services: Vec<ServiceInfo> = (0..10_000)
        .map(|i| ServiceInfo {
            namespace: Some("bench".into()),
            name: Some(format!("svc-{i}")),
            proxy_name: None,
            created: None,
            spec: Some(ServiceSpecInfo {
                external_name: false,
                cluster_ips: vec![format!(
                    "10.{}.{}.{}",
                    96 + i / 65536,
                    (i / 256) % 256,
                    i % 256
                )],
                ip_families: Vec::new(),
                ip_family_policy: None,
                external_ips: vec![],
                load_balancer_ips: vec![],
                load_balancer_source_ranges: vec![],
                internal_local: false,
                external_local: false,
                session_affinity: None,
                affinity_timeout: None,
                ports: vec![ServicePortInfo {
                    name: "http".into(),
                    protocol: Some("TCP".into()),
                    port: 80,
                    node_port: None,
                }],
                health_check_node_port: None,
            }),
        })
        .collect();
    let slice = |i: usize, moved: bool| SliceInfo {
        namespace: Some("bench".into()),
        name: Some(format!("svc-{i}-abcde")),
        proxy_name: None,
        headless: false,
        service_name: Some(format!("svc-{i}")),
        address_type: "IPv4".into(),
        ports: vec![SlicePortInfo {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: Some(8080),
        }],
        endpoints: (0..10)
            .map(|j| EndpointInfo {
                address: Some(Address::V4(if moved && j == 0 {
                    Ipv4Addr::new(10, 127, 255, 254)
                } else {
                    Ipv4Addr::from(0x0a80_0000 + (i * 10 + j) as u32)
                })),
                ready: Some(true),
                serving: None,
                terminating: None,
                node_name: Some(Arc::from("node-1")),
                hints: Hints::default(),
            })
            .collect(),
        trigger_time: None,
    };
    let mut p = Pipeline::new(Incremental::default(), MapWriter::new(Limits::default()));
    for s in services {
        p.compiler.put_service(Origin::default(), s);
    }
    for i in 0..10_000 {
        p.compiler.put_slice(Origin::default(), slice(i, false));
    }
    let mut maps = MemoryMaps::default();
    let first = p.sync(&mut maps);
    assert!(first.full && first.report.rejected.is_empty());
    // A frontend and a ClusterIP marker per Service.
    assert_eq!(maps.services.len(), 20_000);
    for moved in [true, false, true] {
        assert!(p.compiler.put_slice(Origin::default(), slice(4242, moved)));
        maps.ops.clear();
        let s = p.sync(&mut maps);
        assert!(!s.full);
        assert_eq!(s.changed, 1);
        assert!(
            s.report.map_writes + s.report.map_deletes <= 5,
            "{:?} {:?}",
            s.report,
            maps.ops
        );
    }
    // Nothing changed: nothing compiled, nothing written.
    assert!(!p.compiler.put_slice(Origin::default(), slice(4242, true)));
    let s = p.sync(&mut maps);
    assert_eq!(
        (s.changed, s.report.map_writes, s.report.map_deletes),
        (0, 0, 0)
    );
}

// ---------------------------------------------------------------------------------
// The manifest directory: rescans of rewritten files feed the compiler as a full read
// of the files would.

fn document(rng: &mut Rng) -> String {
    let ns = rng.pick(&["default", "apps"]);
    let name = rng.pick(&NAMES);
    if rng.chance(2) {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{clusterIP: 10.96.0.{}, ports: [{{name: http, port: 80}}]}}\n",
            rng.below(4) + 1
        )
    } else {
        let eps: Vec<String> = (0..rng.below(4))
            .map(|_| format!("{{addresses: [10.244.0.{}]}}", rng.below(8) + 1))
            .collect();
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-{}, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n",
            rng.below(2),
            eps.join(", ")
        )
    }
}

#[test]
fn rescans_feed_the_compiler_as_a_full_read_would() {
    let dir = std::env::temp_dir().join(format!("sliceway-incremental-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let files: Vec<PathBuf> = ["a.yaml", "b.yaml", "c.yml"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    let mut rng = Rng(0x600d_f11e);
    let mut manifests = ManifestDir::new(&dir, None);
    let mut compiler = Incremental::default();
    // The text each file last parsed with: what the compiler must hold.
    let mut good: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut stamp = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    for round in 0..150 {
        let path = rng.pick(&files).clone();
        match rng.below(8) {
            0 => {
                let _ = fs::remove_file(&path);
                good.remove(&path);
            }
            1 => {
                fs::write(&path, "apiVersion: v1\nkind: Service\nmetadata: {name: x\n").unwrap();
                // Broken: the last good objects stay (none if it never parsed).
            }
            _ => {
                let text: String = (0..rng.below(6)).map(|_| document(&mut rng)).collect();
                fs::write(&path, &text).unwrap();
                good.insert(path.clone(), text);
            }
        }
        if path.exists() {
            // A distinct modification time per write: the scan compares stamps.
            stamp += Duration::from_secs(1);
            fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(stamp)
                .unwrap();
        }
        manifests.rescan(&mut compiler).unwrap();
        compiler.compile();
        let (mut services, mut slices) = (Vec::new(), Vec::new());
        for (p, text) in &good {
            let objects = parse_file(p, text).0.unwrap();
            services.extend(objects.services);
            slices.extend(objects.slices);
        }
        let want = compile(&services, &slices, &Options::default());
        let got = compiler.compiled();
        assert_eq!(got, want, "round {round}");
        assert_eq!(compiler.service_count(), services.len(), "round {round}");
        assert_eq!(compiler.slice_count(), slices.len(), "round {round}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

//! Figure 1: the kernel cost per packet, through BPF_PROG_TEST_RUN, and the
//! in-process half of figure 3: sliceway's full and incremental sync into freshly
//! loaded maps. No program is attached and no packet leaves the test run.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6},
    time::Instant,
};

use anyhow::{ensure, Context, Result};
use dataplane_common::{addr_of, stat, Backend, Backend6, ServiceKey, ServiceKey6, PROTO_TCP};
use serde::Serialize;
use sliceway_agent::{
    agent::Pipeline,
    compiler::{self, Frontend, Frontend6, Incremental, ServicePortName},
    kernel::packet::{build, build6, PacketSpec, PacketSpec6, TCP_ACK, TCP_SYN},
    kernel::{Capacities, Datapath, Role},
    model::{Origin, ServiceInfo, SliceInfo},
    source::local,
    writer::{Desired, Limits, Limits6, MapWriter},
};

use super::{
    model::{self, Svc},
    stats::Summary,
    Config,
};

/// Endpoints per Service in figure 1.
pub const FIG1_ENDPOINTS: usize = 3;

/// One size of figure 1, nanoseconds per packet.
#[derive(Clone, Debug, Serialize)]
pub struct Fig1Row {
    pub services: usize,
    /// A packet to no Service (the floor), `repeat` runs.
    pub no_match_ns: Summary,
    /// The new-flow path (`DNAT_NEW`), `repeat` runs.
    pub new_flow_ns: Summary,
    /// The established path (`DNAT_ESTABLISHED`), `repeat` runs.
    pub established_ns: Summary,
    /// The same with the program loaded without its per-frontend and per-backend
    /// counters (`--no-flow-counters`), interleaved with the above.
    pub established_without_counters_ns: Summary,
    /// The uplink's programs on the floor's packet and the established one: the TC
    /// program (`sliceway_tc_ext`) and the XDP program in front of it, interleaved.
    pub uplink_no_match_tc_ns: Summary,
    pub uplink_no_match_xdp_ns: Summary,
    pub uplink_established_tc_ns: Summary,
    pub uplink_established_xdp_ns: Summary,
    /// Each round's established packet over the same round's no-match packet, and
    /// over the same round's packet through the program without counters: ratios of
    /// runs made back to back, so a change of the machine's speed between rounds
    /// (this VM's moves every column by up to 1.7x) cancels out.
    pub established_over_no_match: Summary,
    pub counted_over_uncounted: Summary,
    /// The harness's floor: an empty TC program and an empty XDP program (each only
    /// returns its verdict) timed the same way on the no-match packet, interleaved.
    pub harness_tc_ns: Summary,
    pub harness_xdp_ns: Summary,
    /// Cross-check: mean over distinct, never-seen tuples, one run each.
    pub new_flow_fresh_tuples_ns: Summary,
    /// The floor measured the same way (one run each), to compare with the above.
    pub no_match_single_run_ns: Summary,
    /// IPv6 packets through the same program (which hands them to `sliceway_tc6`),
    /// the same paths, over the IPv6 twin of each Service, interleaved.
    pub ipv6_no_match_ns: Summary,
    pub ipv6_new_flow_ns: Summary,
    pub ipv6_established_ns: Summary,
}

/// Figure 1.
#[derive(Clone, Debug, Serialize)]
pub struct Fig1 {
    pub method: String,
    pub program: String,
    pub xdp: String,
    pub repeat: u32,
    pub rounds: usize,
    pub rows: Vec<Fig1Row>,
    /// Medians at the largest size over the smallest: no match, new, established.
    pub ratio_largest_to_smallest: [Option<f64>; 3],
}

/// A Service of figure 1 as a frontend of either family: its key and backends.
fn frontend<K, B: Ord, A>(s: &Svc, key: K, backends: Vec<B>) -> (K, Frontend<B, A>) {
    let mut backends = backends;
    backends.sort();
    (
        key,
        Frontend {
            service: ServicePortName {
                namespace: s.namespace.as_str().into(),
                name: s.name.as_str().into(),
                port: s.port_name.as_str().into(),
            },
            backends,
            policy: Default::default(),
            source_ranges: Vec::new(),
        },
    )
}

fn backend(ip: Ipv4Addr, port: u16) -> Backend {
    Backend {
        addr_be: u32::from(ip).to_be(),
        port_be: port.to_be(),
        proto: PROTO_TCP,
        _pad: 0,
    }
}

/// The IPv6 twin of an IPv4 address of the model: `fd00:96::a.b.c.d` for a VIP,
/// `fd00:244::a.b.c.d` for an endpoint (the prefix's second group is the IPv4
/// address's second octet, 96 or 244).
fn twin6(ip: Ipv4Addr) -> Ipv6Addr {
    let [_, b, ..] = ip.octets();
    // The octet's decimal digits read as hex: 96 → group `96`.
    let group = u16::from_str_radix(&b.to_string(), 16).unwrap_or(0);
    let low = u32::from(ip);
    Ipv6Addr::new(0xfd00, group, 0, 0, 0, 0, (low >> 16) as u16, low as u16)
}

fn backend6(ip: Ipv4Addr, port: u16) -> Backend6 {
    Backend6 {
        addr_be: addr_of(twin6(ip).octets()),
        port_be: port.to_be(),
        proto: PROTO_TCP,
        _pad: 0,
    }
}

/// The first `n` Services of figure 1: Service 0 is its own backend (its DNAT is the
/// identity, so a rerun of the program sees the same packet and takes the same path),
/// the others have `FIG1_ENDPOINTS` made-up endpoints. `backend` gives a backend of
/// the family, `key` the frontend's key.
fn fig1_frontends_of<K: Ord, B: Ord, A>(
    services: &[Svc],
    n: usize,
    key: impl Fn(&Svc) -> K,
    backend: impl Fn(Ipv4Addr, u16) -> B,
) -> BTreeMap<K, Frontend<B, A>> {
    services[..n]
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let backends = if i == 0 {
                vec![backend(s.vip, s.port)]
            } else {
                s.endpoints.iter().map(|(ip, p)| backend(*ip, *p)).collect()
            };
            frontend(s, key(s), backends)
        })
        .collect()
}

/// Figure 1's first `n` Services, IPv4.
fn fig1_frontends(services: &[Svc], n: usize) -> BTreeMap<ServiceKey, Frontend> {
    let key = |s: &Svc| ServiceKey {
        addr_be: u32::from(s.vip).to_be(),
        port_be: s.port.to_be(),
        proto: PROTO_TCP,
        scope: 0,
    };
    fig1_frontends_of(services, n, key, backend)
}

/// Their IPv6 twins ([`twin6`] addresses, same ports).
fn fig1_frontends6(services: &[Svc], n: usize) -> BTreeMap<ServiceKey6, Frontend6> {
    let key = |s: &Svc| ServiceKey6 {
        addr_be: addr_of(twin6(s.vip).octets()),
        port_be: s.port.to_be(),
        proto: PROTO_TCP,
        scope: 0,
    };
    fig1_frontends_of(services, n, key, backend6)
}

fn delta(before: &[u64], after: &[u64], slot: u32) -> u64 {
    after[slot as usize] - before[slot as usize]
}

/// Runs `packet` `repeat` times and checks that every run took the exit `expect`.
fn timed(dp: &Datapath, packet: &[u8], repeat: u32, expect: u32) -> Result<f64> {
    timed_with(dp, repeat, expect, |dp| Ok(dp.time_run(packet, repeat)?))
}

/// [`timed`] through `run`, which runs the packet `repeat` times on `dp`.
fn timed_with(
    dp: &Datapath,
    repeat: u32,
    expect: u32,
    run: impl FnOnce(&Datapath) -> Result<std::time::Duration>,
) -> Result<f64> {
    let before = dp.stats()?;
    let d = run(dp)?;
    let after = dp.stats()?;
    let took = delta(&before, &after, expect);
    ensure!(
        took == repeat as u64,
        "only {took} of {repeat} runs took exit {} (the packet left its path)",
        stat::NAMES[expect as usize]
    );
    // The kernel reports the mean time per run, in whole nanoseconds.
    Ok(d.as_nanos() as f64)
}

/// Each round's `a` over the same round's `b`.
fn per_round(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(_, &y)| y > 0.0)
        .map(|(x, y)| x / y)
        .collect()
}

/// Figure 1.
pub fn per_packet(cfg: &Config) -> Result<Fig1> {
    let largest = *cfg.fig1_sizes.iter().max().context("no sizes")?;
    let services = model::fake_cluster(largest, FIG1_ENDPOINTS);
    let entries = (largest * FIG1_ENDPOINTS + 16) as u32;
    let caps = Capacities {
        limits: Limits {
            services: (largest as u32 + 16).max(Limits::default().services),
            backends: entries.max(Limits::default().backends),
            slots: (2 * entries).max(Limits::default().slots),
        },
        limits6: Limits6 {
            services: (largest as u32 + 16).max(Limits6::default().services),
            backends: entries.max(Limits6::default().backends),
        },
        ..Capacities::default()
    };
    let mut dp = Datapath::load(&caps, None).context("loading the datapath")?;
    dp.load_xdp().context("loading the XDP program")?;
    let (empty_tc, empty_xdp) = (super::harness::Empty::tc()?, super::harness::Empty::xdp()?);
    let mut writer = MapWriter::new(caps.limits).with_limits6(caps.limits6);
    // The same program without flow counters, over the same maps contents.
    let uncounted_caps = Capacities {
        flow_counters: false,
        ..caps
    };
    let mut uncounted =
        Datapath::load(&uncounted_caps, None).context("loading the datapath without counters")?;
    let mut uncounted_writer = MapWriter::new(caps.limits).with_limits6(caps.limits6);

    let client = Ipv4Addr::new(10, 244, 1, 2);
    let target = SocketAddrV4::new(services[0].vip, services[0].port);
    let nowhere = SocketAddrV4::new(Ipv4Addr::new(10, 200, 0, 1), 80);
    let floor = build(&PacketSpec::tcp(
        SocketAddrV4::new(client, 40000),
        nowhere,
        TCP_ACK,
    ));
    let syn = build(&PacketSpec::tcp(
        SocketAddrV4::new(client, 40001),
        target,
        TCP_SYN,
    ));
    let ack = build(&PacketSpec::tcp(
        SocketAddrV4::new(client, 40002),
        target,
        TCP_ACK,
    ));
    // The same three packets over IPv6, to the IPv6 twins.
    let client6 = twin6(client);
    let target6 = SocketAddrV6::new(twin6(services[0].vip), services[0].port, 0, 0);
    let nowhere6 = SocketAddrV6::new(twin6(*nowhere.ip()), 80, 0, 0);
    let tcp6 = |port: u16, to: SocketAddrV6, flags: u8| {
        build6(&PacketSpec6::tcp(
            SocketAddrV6::new(client6, port, 0, 0),
            to,
            flags,
        ))
    };
    let (floor6, syn6, ack6) = (
        tcp6(40000, nowhere6, TCP_ACK),
        tcp6(40001, target6, TCP_SYN),
        tcp6(40002, target6, TCP_ACK),
    );
    let mut sizes = cfg.fig1_sizes.clone();
    sizes.sort();
    let mut rows = Vec::new();
    let mut next_port: u16 = 1024;
    ensure!(
        dp.has_ipv6_maps(),
        "this kernel refused the IPv6 programs: figure 1's IPv6 columns cannot be measured"
    );
    for &n in &sizes {
        let (v4, v6) = (fig1_frontends(&services, n), fig1_frontends6(&services, n));
        let desired = Desired { v4: &v4, v6: &v6 };
        for (what, writer, maps) in [
            ("", &mut writer, &mut dp.maps),
            (
                " (without counters)",
                &mut uncounted_writer,
                &mut uncounted.maps,
            ),
        ] {
            let report = writer.apply(desired, maps);
            ensure!(
                report.errors.is_empty() && report.rejected.is_empty(),
                "filling the maps{what} for {n} Services of each family: {:?} {:?}",
                report.errors,
                report.rejected
            );
        }
        // The established flows' conntrack entries: their first packets are new flows.
        for packet in [&ack, &ack6] {
            let first = dp.test_run(packet)?;
            ensure!(
                &first.packet == packet,
                "the identity DNAT changed the packet"
            );
        }
        uncounted.test_run(&ack)?;
        let (mut floor_ns, mut new_ns, mut est_ns, mut fresh_ns, mut floor1_ns) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut est_uncounted_ns = vec![];
        let (mut up_floor_tc, mut up_floor_xdp, mut up_est_tc, mut up_est_xdp) =
            (vec![], vec![], vec![], vec![]);
        let (mut harness_tc, mut harness_xdp) = (vec![], vec![]);
        let (mut floor6_ns, mut new6_ns, mut est6_ns) = (vec![], vec![], vec![]);
        let repeat = cfg.repeat;
        for _ in 0..cfg.rounds {
            floor_ns.push(timed(&dp, &floor, cfg.repeat, stat::PASS_NO_SERVICE)?);
            new_ns.push(timed(&dp, &syn, cfg.repeat, stat::DNAT_NEW)?);
            est_ns.push(timed(&dp, &ack, cfg.repeat, stat::DNAT_ESTABLISHED)?);
            est_uncounted_ns.push(timed(&uncounted, &ack, cfg.repeat, stat::DNAT_ESTABLISHED)?);
            // The uplink: the connection tracked above is found by either program.
            up_floor_tc.push(timed_with(&dp, repeat, stat::PASS_NO_SERVICE, |dp| {
                Ok(dp.time_run_as(Role::External, &floor, repeat)?)
            })?);
            up_floor_xdp.push(timed_with(&dp, repeat, stat::PASS_NO_SERVICE, |dp| {
                Ok(dp.time_run_xdp(&floor, repeat)?)
            })?);
            up_est_tc.push(timed_with(&dp, repeat, stat::DNAT_ESTABLISHED, |dp| {
                Ok(dp.time_run_as(Role::External, &ack, repeat)?)
            })?);
            up_est_xdp.push(timed_with(&dp, repeat, stat::DNAT_ESTABLISHED, |dp| {
                Ok(dp.time_run_xdp(&ack, repeat)?)
            })?);
            harness_tc.push(empty_tc.time(&floor, repeat)?);
            harness_xdp.push(empty_xdp.time(&floor, repeat)?);
            floor6_ns.push(timed(&dp, &floor6, repeat, stat::PASS_NO_SERVICE)?);
            new6_ns.push(timed(&dp, &syn6, repeat, stat::DNAT_NEW)?);
            est6_ns.push(timed(&dp, &ack6, repeat, stat::DNAT_ESTABLISHED)?);
            // Cross-check of the new-flow path with tuples never seen before, one
            // run each (so the figure includes the timer's own cost once per packet).
            let mut sum_new = 0.0;
            let mut sum_floor = 0.0;
            for _ in 0..cfg.fresh_tuples {
                next_port = if next_port == u16::MAX {
                    1024
                } else {
                    next_port + 1
                };
                let src = SocketAddrV4::new(Ipv4Addr::new(10, 244, 2, 2), next_port);
                let p = build(&PacketSpec::tcp(src, target, TCP_SYN));
                sum_new += timed(&dp, &p, 1, stat::DNAT_NEW)?;
                sum_floor += timed(&dp, &floor, 1, stat::PASS_NO_SERVICE)?;
            }
            fresh_ns.push(sum_new / cfg.fresh_tuples as f64);
            floor1_ns.push(sum_floor / cfg.fresh_tuples as f64);
        }
        rows.push(Fig1Row {
            services: n,
            no_match_ns: Summary::of(&floor_ns),
            new_flow_ns: Summary::of(&new_ns),
            established_ns: Summary::of(&est_ns),
            established_without_counters_ns: Summary::of(&est_uncounted_ns),
            uplink_no_match_tc_ns: Summary::of(&up_floor_tc),
            uplink_no_match_xdp_ns: Summary::of(&up_floor_xdp),
            uplink_established_tc_ns: Summary::of(&up_est_tc),
            uplink_established_xdp_ns: Summary::of(&up_est_xdp),
            established_over_no_match: Summary::of(&per_round(&est_ns, &floor_ns)),
            counted_over_uncounted: Summary::of(&per_round(&est_ns, &est_uncounted_ns)),
            harness_tc_ns: Summary::of(&harness_tc),
            harness_xdp_ns: Summary::of(&harness_xdp),
            new_flow_fresh_tuples_ns: Summary::of(&fresh_ns),
            no_match_single_run_ns: Summary::of(&floor1_ns),
            ipv6_no_match_ns: Summary::of(&floor6_ns),
            ipv6_new_flow_ns: Summary::of(&new6_ns),
            ipv6_established_ns: Summary::of(&est6_ns),
        });
    }
    let (first, last) = (rows.first().unwrap(), rows.last().unwrap());
    let r = |f: fn(&Fig1Row) -> Summary| super::stats::ratio(f(last).median, f(first).median);
    Ok(Fig1 {
        method: format!(
            "BPF_PROG_TEST_RUN of the loaded (not attached) TC program with repeat={repeat}; \
             the kernel reports the mean time per run; {rounds} rounds, median [min–max]. \
             Maps filled by the agent's MapWriter with N Services ({FIG1_ENDPOINTS} endpoints each). \
             Each path is timed with a packet the program leaves on that path, checked by the \
             exit counters (every run must take the expected exit): no match = TCP ACK to a \
             non-Service address (passed untouched); new flow = TCP SYN to a Service whose only \
             backend is its own VIP:port (a SYN on a tracked tuple starts a new connection, so \
             every rerun picks a backend, writes both conntrack entries and rewrites, and the \
             identity DNAT leaves the packet as it was); established = TCP ACK on that Service \
             after its first packet created the conntrack entry; the same packet through the \
             program loaded without its per-frontend and per-backend counters, over the same \
             maps, interleaved round by round, gives what counting costs. The targets' \
             ratios (established over no match, with counters over without) are each \
             round's ratio of runs made back to back, median over the rounds. Cross-check: SYNs from {fresh} \
             distinct never-seen tuples, repeat=1 each (this includes the kernel timer's own \
             cost per packet, shown by the no-match floor measured the same way). IPv6: \
             the same three packets over IPv6 to each Service's IPv6 twin (the maps hold N \
             Services of each family), through the same program, which tail-calls \
             sliceway_tc6 for them; the IPv4 columns are measured with the IPv6 maps filled.",
            repeat = cfg.repeat,
            rounds = cfg.rounds,
            fresh = cfg.fresh_tuples,
        ),
        program: "The first seven columns: TC ingress of the pods' interfaces (sliceway_tc).".into(),
        xdp: "The uplink's programs, over the same maps and the same two packets, \
              interleaved: its TC program (sliceway_tc_ext) and the XDP program \
              (sliceway_xdp) through BPF_PROG_TEST_RUN of each; XDP's figure leaves out \
              the skb the kernel builds after XDP and before TC, which an attached XDP \
              program saves on what it drops and costs nothing more on what it passes. \
              The harness's floor: a TC program and an XDP program of two instructions \
              (return the verdict), timed the same way on the no-match packet in the same \
              rounds; every figure above includes it, and a program's own cost is its \
              figure less the floor of its hook."
            .into(),
        repeat: cfg.repeat,
        rounds: cfg.rounds,
        ratio_largest_to_smallest: [
            r(|x| x.no_match_ns),
            r(|x| x.new_flow_ns),
            r(|x| x.established_ns),
        ],
        rows,
    })
}

/// Sliceway's side of figure 3 at one size.
#[derive(Clone, Debug, Serialize)]
pub struct SlicewaySync {
    /// compile + apply from empty maps, milliseconds.
    pub full_ms: Summary,
    /// apply alone from empty maps, milliseconds.
    pub full_apply_ms: Summary,
    pub full_map_writes: usize,
}

/// Sliceway's incremental sync after one endpoint changed.
#[derive(Clone, Debug, Serialize)]
pub struct SlicewayChange {
    pub services: usize,
    /// Map writes plus deletes of the change.
    pub map_ops: Summary,
    /// The agent's sync of the change, milliseconds: the changed EndpointSlice into the
    /// incremental compiler (as the API source feeds it), recompile of its Service,
    /// `MapWriter::apply_changed` (`agent::Pipeline::sync`).
    pub sync_ms: Summary,
    /// `MapWriter::apply_changed` of the change alone, milliseconds.
    pub apply_ms: Summary,
    /// For comparison, what the agent did before its syncs were incremental: recompile
    /// every Service and compare every frontend (`compile` + `MapWriter::apply`).
    pub compile_and_apply_ms: Summary,
}

fn compile_yaml(services: &[Svc]) -> Result<local::Objects> {
    let (objects, problems) =
        local::parse_file(std::path::Path::new("bench.yaml"), &model::yaml(services));
    ensure!(problems.is_empty(), "{problems:?}");
    objects.context("the generated YAML does not parse")
}

/// Full sync from nothing, in-process: objects already parsed (as the agent's stores
/// hold them), compile + apply into freshly loaded maps.
pub fn full_sync(services: &[Svc], rounds: usize) -> Result<SlicewaySync> {
    let objects = compile_yaml(services)?;
    let opts = compiler::Options {
        node_name: Some("node-1".into()),
        proxy_name: None,
        zone: None,
        ..compiler::Options::default()
    };
    let (mut total, mut apply, mut writes) = (vec![], vec![], 0);
    for _ in 0..rounds {
        let mut dp =
            Datapath::load(&Capacities::default(), None).context("loading the datapath")?;
        let mut writer = MapWriter::new(Limits::default());
        let start = Instant::now();
        let compiled = compiler::compile(&objects.services, &objects.slices, &opts);
        let mid = Instant::now();
        let report = writer.apply(&compiled.frontends, &mut dp.maps);
        let end = Instant::now();
        ensure!(
            report.errors.is_empty() && report.rejected.is_empty(),
            "{:?} {:?}",
            report.errors,
            report.rejected
        );
        // One port each, and a ClusterIP marker each.
        ensure!(compiled.frontends.len() == 2 * services.len());
        total.push((end - start).as_secs_f64() * 1e3);
        apply.push((end - mid).as_secs_f64() * 1e3);
        writes = report.map_writes;
    }
    Ok(SlicewaySync {
        full_ms: Summary::of(&total),
        full_apply_ms: Summary::of(&apply),
        full_map_writes: writes,
    })
}

/// One endpoint of Service `changed` replaced, back and forth, `rounds` times, in
/// maps filled with all of `before`.
pub fn one_endpoint_change(before: &[Svc], after: &[Svc], rounds: usize) -> Result<SlicewayChange> {
    let opts = compiler::Options::default();
    let states = [compile_yaml(before)?, compile_yaml(after)?];
    // The EndpointSlice that differs: the change as the API server would send it.
    let changed = (0..states[0].slices.len())
        .find(|i| states[0].slices[*i] != states[1].slices[*i])
        .context("before and after have the same slices")?;
    let slice = |state: usize| &states[state].slices[changed];
    let mut dp = Datapath::load(&Capacities::default(), None).context("loading the datapath")?;
    let mut agent = Pipeline::new(
        Incremental::new(opts.clone()),
        MapWriter::new(Limits::default()),
    );
    for s in &states[0].services {
        agent
            .compiler
            .put_service(Origin::default(), ServiceInfo::from(s));
    }
    for s in &states[0].slices {
        agent
            .compiler
            .put_slice(Origin::default(), SliceInfo::from(s));
    }
    let first = agent.sync(&mut dp.maps);
    ensure!(
        first.report.errors.is_empty() && first.report.rejected.is_empty(),
        "{:?} {:?}",
        first.report.errors,
        first.report.rejected
    );
    // The agent's path for one changed slice, timed from the object to the map writes.
    let sync = |agent: &mut Pipeline, dp: &mut Datapath, to: usize| -> Result<(f64, f64)> {
        let start = Instant::now();
        agent
            .compiler
            .put_slice(Origin::default(), SliceInfo::from(slice(to)));
        let synced = agent.sync(&mut dp.maps);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let r = &synced.report;
        ensure!(r.errors.is_empty() && r.rejected.is_empty(), "{r:?}");
        ensure!(!synced.full && synced.changed == 1, "{synced:?}");
        Ok((ms, (r.map_writes + r.map_deletes) as f64))
    };
    let (mut ops, mut sync_ms, mut apply, mut total) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        // Before -> after, the agent's sync.
        let (ms, n) = sync(&mut agent, &mut dp, 1)?;
        sync_ms.push(ms);
        ops.push(n);
        // After -> before, its steps, to time the map writer alone.
        agent
            .compiler
            .put_slice(Origin::default(), SliceInfo::from(slice(0)));
        let keys = agent.compiler.compile();
        let start = Instant::now();
        let report = agent
            .writer
            .apply_changed(agent.compiler.frontends(), &keys, &mut dp.maps);
        apply.push(start.elapsed().as_secs_f64() * 1e3);
        ensure!(report.errors.is_empty(), "{:?}", report.errors);
        ops.push((report.map_writes + report.map_deletes) as f64);
        // Before -> after, as the agent did it before: recompile all, compare all.
        let start = Instant::now();
        let c = compiler::compile(&states[1].services, &states[1].slices, &opts);
        let report = agent.writer.apply(&c.frontends, &mut dp.maps);
        total.push(start.elapsed().as_secs_f64() * 1e3);
        ensure!(report.errors.is_empty(), "{:?}", report.errors);
        // The compiler catches up with the maps (nothing left to write).
        agent
            .compiler
            .put_slice(Origin::default(), SliceInfo::from(slice(1)));
        let caught_up = agent.sync(&mut dp.maps);
        ensure!(
            caught_up.report.map_writes + caught_up.report.map_deletes == 0,
            "{caught_up:?}"
        );
        // After -> before, the agent's sync again.
        let (ms, n) = sync(&mut agent, &mut dp, 0)?;
        sync_ms.push(ms);
        ops.push(n);
    }
    Ok(SlicewayChange {
        services: before.len(),
        map_ops: Summary::of(&ops),
        sync_ms: Summary::of(&sync_ms),
        apply_ms: Summary::of(&apply),
        compile_and_apply_ms: Summary::of(&total),
    })
}

/// Conntrack garbage collection at scale: the agent's sweeper over a kernel map of
/// `entries` conntrack entries, half of them expired.
#[derive(Clone, Debug, Serialize)]
pub struct ConntrackGc {
    pub method: String,
    pub entries: usize,
    pub expired: usize,
    /// Keys per round (the agent's default `--conntrack-sweep-batch`).
    pub batch: usize,
    /// Filling the map from user space.
    pub fill_s: f64,
    /// One whole pass: every round until the sweeper reports the end of the map.
    pub pass_s: f64,
    pub rounds: usize,
    pub longest_round_ms: f64,
    pub mean_round_ms: f64,
    pub ns_per_entry: f64,
    /// How long the agent takes to walk the map once at its default interval of one
    /// round a second.
    pub pass_at_default_interval_s: f64,
}

/// The agent's default sweep batch (`--conntrack-sweep-batch`).
pub const SWEEP_BATCH: usize = 4096;

/// Measures one sweep pass over `connections` connections (two entries each), every
/// other one expired an hour ago in TIME_WAIT, the rest ESTABLISHED and fresh.
pub fn conntrack_gc(connections: u32) -> Result<ConntrackGc> {
    use dataplane_common::{ct::state, CtKey, PROTO_TCP as TCP};
    use sliceway_agent::writer::conntrack::{connection_entries, now_ns, Sweeper, Timeouts};
    let caps = Capacities {
        conntrack: 2 * connections + 1024,
        ..Capacities::default()
    };
    let mut dp = Datapath::load(&caps, None).context("loading the datapath (needs root)")?;
    let now = now_ns();
    let fill = Instant::now();
    let map = dp.conntrack_map();
    for i in 0..connections {
        // Client 10.<i> to a VIP, backend 10.244.11.2.
        let client = (0x0a00_0000 | i).to_be();
        let fwd = CtKey::v4(
            client,
            0x0a60_000au32.to_be(),
            1000u16.to_be(),
            80u16.to_be(),
            TCP,
        );
        let rev = CtKey::v4(
            0x0af4_0b02u32.to_be(),
            client,
            8080u16.to_be(),
            1000u16.to_be(),
            TCP,
        );
        let (st, seen) = if i % 2 == 0 {
            (state::TCP_ESTABLISHED, now)
        } else {
            (
                state::TCP_TIME_WAIT,
                now.saturating_sub(3_600 * dataplane_common::ct::NS),
            )
        };
        for (key, entry) in connection_entries(fwd, rev, st, seen) {
            map.insert(key, entry, 0)?;
        }
    }
    let fill_s = fill.elapsed().as_secs_f64();
    let entries = 2 * connections as usize;
    ensure!(
        dp.conntrack_map().keys().count() == entries,
        "the map holds fewer entries than were written (LRU eviction?)"
    );
    let mut sweeper = Sweeper::new(SWEEP_BATCH, Timeouts::default());
    let start = Instant::now();
    let (mut rounds, mut removed, mut longest) = (0usize, 0usize, 0f64);
    loop {
        let t = Instant::now();
        let r = sweeper.round(dp.conntrack_map(), now);
        longest = longest.max(t.elapsed().as_secs_f64());
        rounds += 1;
        removed += r.removed;
        if r.pass_entries.is_some() {
            break;
        }
    }
    let pass_s = start.elapsed().as_secs_f64();
    ensure!(
        removed == entries / 2,
        "the sweep removed {removed} entries, not the {} expired ones",
        entries / 2
    );
    Ok(ConntrackGc {
        method: format!(
            "The agent's sweeper (`Sweeper::round`, batch {SWEEP_BATCH}, its default) over a \
             kernel CONNTRACK map filled from user space with {connections} connections (two \
             entries each), every other one expired an hour ago in TIME_WAIT; one whole pass, \
             timed per round. A round reads each key, its entry and its pair's, and removes \
             an expired connection's two entries together."
        ),
        entries,
        expired: removed,
        batch: SWEEP_BATCH,
        fill_s,
        pass_s,
        rounds,
        longest_round_ms: longest * 1e3,
        mean_round_ms: pass_s * 1e3 / rounds as f64,
        ns_per_entry: pass_s * 1e9 / entries as f64,
        pass_at_default_interval_s: rounds as f64,
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::twin6;

    #[test]
    fn ipv6_twins_keep_the_prefix_readable_and_the_ipv4_address_whole() {
        let twin = |a, b, c, d| twin6(Ipv4Addr::new(a, b, c, d));
        assert_eq!(
            twin(10, 96, 1, 1),
            "fd00:96::a60:101".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            twin(10, 244, 1, 2),
            "fd00:244::af4:102".parse::<Ipv6Addr>().unwrap()
        );
    }
}

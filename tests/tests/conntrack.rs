//! Conntrack on the kernel's map: the user-space sweeper over entries the program
//! wrote, idle timeouts written by the agent and honoured by the program, and the cost
//! of a sweep over a large table. Needs root (loading BPF programs); no traffic is
//! sent anywhere (BPF_PROG_TEST_RUN only).

use std::{net::SocketAddrV4, time::Instant};

use dataplane_common::{ct::state, stat, CtKey, PROTO_TCP};
use sliceway_agent::{
    compiler::{self, Options},
    kernel::packet::{build, PacketSpec, TCP_ACK, TCP_SYN},
    kernel::{Capacities, Datapath},
    source::local::parse_file,
    writer::conntrack::{connection_entries, now_ns, Sweeper, Timeouts},
    writer::MapWriter,
};

/// The Service `web` (10.96.0.10:80) with two ready backends, shared with the
/// program fixtures.
const MANIFESTS: &str = include_str!("../testdata/two_backends.yaml");

fn datapath(conntrack: u32) -> Datapath {
    let (objects, problems) = parse_file("ct.yaml".as_ref(), MANIFESTS);
    assert!(problems.is_empty(), "{problems:?}");
    let objects = objects.unwrap();
    let compiled = compiler::compile(&objects.services, &objects.slices, &Options::default());
    let caps = Capacities {
        conntrack,
        ..Capacities::default()
    };
    let mut dp = Datapath::load(&caps, None).expect("loading the datapath (needs root)");
    let report = MapWriter::new(caps.limits).apply(&compiled.frontends, &mut dp.maps);
    assert!(report.errors.is_empty(), "{report:?}");
    dp
}

fn syn(port: u16) -> Vec<u8> {
    let client = SocketAddrV4::new("10.244.1.2".parse().unwrap(), port);
    build(&PacketSpec::tcp(
        client,
        "10.96.0.10:80".parse().unwrap(),
        TCP_SYN,
    ))
}

fn ack(port: u16) -> Vec<u8> {
    let client = SocketAddrV4::new("10.244.1.2".parse().unwrap(), port);
    build(&PacketSpec::tcp(
        client,
        "10.96.0.10:80".parse().unwrap(),
        TCP_ACK,
    ))
}

#[test]
fn the_sweeper_removes_expired_connections_the_program_wrote_and_keeps_live_ones() {
    let mut dp = datapath(4096);
    for port in 20000..20100 {
        dp.test_run(&syn(port)).unwrap();
    }
    assert_eq!(dp.conntrack().len(), 200, "two entries per connection");
    let mut sweeper = Sweeper::new(64, Timeouts::default());
    // Now: every connection is alive (SYN_SENT, 60 s).
    let mut removed = 0;
    loop {
        let r = sweeper.round(dp.conntrack_map(), now_ns());
        assert!(r.scanned <= 64);
        removed += r.removed;
        if let Some(n) = r.pass_entries {
            assert_eq!(n, 200);
            break;
        }
    }
    assert_eq!(removed, 0);
    // 61 s later they have all expired, both entries of each.
    let later = now_ns() + 61 * dataplane_common::ct::NS;
    loop {
        let r = sweeper.round(dp.conntrack_map(), later);
        removed += r.removed;
        if r.pass_entries.is_some() {
            break;
        }
    }
    assert_eq!(removed, 200);
    assert!(dp.conntrack().is_empty(), "{:?}", dp.conntrack().len());
}

#[test]
fn an_idle_timeout_written_by_the_agent_is_honoured_by_the_program() {
    let mut dp = datapath(1024);
    let mut t = Timeouts::default();
    t.0[state::TCP_SYN_SENT as usize] = 1;
    dp.set_ct_timeouts(&t.0).unwrap();
    let stats = |dp: &Datapath| dp.stats().unwrap();
    dp.test_run(&syn(21000)).unwrap();
    let before = stats(&dp);
    dp.test_run(&ack(21000)).unwrap();
    let after = stats(&dp);
    let established = stat::DNAT_ESTABLISHED as usize;
    let new = stat::DNAT_NEW as usize;
    assert_eq!(
        after[established] - before[established],
        1,
        "alive within 1 s"
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // The ACK refreshed the entry; wait past the timeout again.
    let before = stats(&dp);
    dp.test_run(&ack(21000)).unwrap();
    let after = stats(&dp);
    assert_eq!(after[new] - before[new], 1, "expired after 1 s of SYN_SENT");
}

/// The cost of sweeping a large table, printed; the assertions check that a sweep
/// at this scale keeps what is alive and removes what expired.
#[test]
fn sweeping_a_large_table_costs_a_bounded_time_per_entry() {
    const CONNECTIONS: u32 = 250_000;
    let mut dp = datapath(2 * CONNECTIONS + 1024);
    // The sweep is given its clock: two hours on from the kernel's monotonic one, so
    // "an hour ago" exists also on a machine that booted minutes ago.
    let now = now_ns() + 7_200 * dataplane_common::ct::NS;
    let map = dp.conntrack_map();
    let fill = Instant::now();
    for i in 0..CONNECTIONS {
        let fwd = CtKey::v4(0x0a00_0000 | i, 0x0a60_000a, 1000, 80, PROTO_TCP);
        let rev = CtKey::v4(0x0af4_0b02, 0x0a00_0000 | i, 8080, 1000, PROTO_TCP);
        // Every other connection idled out an hour ago in TIME_WAIT.
        let (st, seen) = if i % 2 == 0 {
            (state::TCP_ESTABLISHED, now)
        } else {
            (state::TCP_TIME_WAIT, now - 3_600 * dataplane_common::ct::NS)
        };
        for (key, entry) in connection_entries(fwd, rev, st, seen) {
            map.insert(key, entry, 0).unwrap();
        }
    }
    let filled = fill.elapsed();
    let mut sweeper = Sweeper::new(16_384, Timeouts::default());
    let start = Instant::now();
    let (mut rounds, mut removed, mut scanned, mut longest) = (0, 0, 0, std::time::Duration::ZERO);
    let kept = loop {
        let t = Instant::now();
        let r = sweeper.round(dp.conntrack_map(), now);
        longest = longest.max(t.elapsed());
        rounds += 1;
        removed += r.removed;
        scanned += r.scanned;
        if let Some(n) = r.pass_entries {
            break n;
        }
    };
    let took = start.elapsed();
    let entries = 2 * CONNECTIONS as usize;
    println!(
        "filled {entries} entries in {filled:?}; one sweep pass: {took:?} in {rounds} rounds \
         of at most 16384 keys (longest round {longest:?}), {scanned} keys looked at, \
         {removed} removed, {:.0} ns per entry",
        took.as_nanos() as f64 / entries as f64
    );
    assert_eq!(removed, entries / 2);
    assert_eq!(kept, entries / 2);
    assert_eq!(dp.conntrack().len(), entries / 2);
}

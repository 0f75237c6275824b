//! Program tests: crafted packets through the TC program with BPF_PROG_TEST_RUN, the
//! maps filled by the real compiler and map writer. Packet in, verdict and packet out,
//! checksums verified. Needs root (loading BPF programs); no traffic is sent anywhere.

use std::net::SocketAddrV4;

use dataplane_common::{stat, PROTO_TCP, PROTO_UDP};
use sliceway_agent::{
    compiler::{self, Options},
    kernel::{Capacities, Datapath, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT},
    local::parse_file,
    packet::{build, icmp_port_unreachable, parse, PacketSpec, TCP_ACK, TCP_SYN},
    writer::MapWriter,
};

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- addresses: [10.244.11.2]
- addresses: [10.244.12.2]
  conditions: {ready: true}
- addresses: [10.244.13.2]
  conditions: {ready: false}
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: default}
spec:
  clusterIP: 10.96.0.30
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: default, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.21.2], nodeName: node-2}
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.0.40
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 1}}
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-1, namespace: default, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.31.2]}
- {addresses: [10.244.32.2]}
- {addresses: [10.244.33.2]}
"#;

struct Fixture {
    dp: Datapath,
}

fn fixture() -> Fixture {
    let (objects, problems) = parse_file("program.yaml".as_ref(), MANIFESTS);
    assert!(problems.is_empty(), "{problems:?}");
    let objects = objects.unwrap();
    let compiled = compiler::compile(&objects.services, &objects.slices, &Options::default());
    assert!(compiled.skipped.is_empty(), "{:?}", compiled.skipped);
    let caps = Capacities::default();
    let mut dp = Datapath::load(&caps, None).expect("loading the datapath (needs root)");
    let report = MapWriter::new(caps.limits).apply(&compiled.frontends, &mut dp.maps);
    assert!(
        report.errors.is_empty() && report.rejected.is_empty(),
        "{report:?}"
    );
    Fixture { dp }
}

fn addr(s: &str) -> SocketAddrV4 {
    s.parse().unwrap()
}

fn stat_delta(dp: &Datapath, before: &[u64], reason: u32) -> u64 {
    dp.stats().unwrap()[reason as usize] - before[reason as usize]
}

/// Only ready (or unset) endpoints are candidates.
const READY: [&str; 2] = ["10.244.11.2", "10.244.12.2"];

#[test]
fn first_tcp_packet_is_dnated_to_a_ready_backend_with_valid_checksums() {
    let f = fixture();
    let before = f.dp.stats().unwrap();
    let client = addr("10.244.1.2:40000");
    let out =
        f.dp.test_run(&build(&PacketSpec::tcp(
            client,
            addr("10.96.0.10:80"),
            TCP_SYN,
        )))
        .unwrap();
    assert_eq!(out.verdict, TC_ACT_OK);
    let p = parse(&out.packet).unwrap();
    assert_eq!(p.src, client, "source untouched");
    assert!(
        READY.contains(&p.dst.ip().to_string().as_str()),
        "dst {}",
        p.dst
    );
    assert_eq!(p.dst.port(), 8080);
    assert!(p.ip_csum_ok && p.l4_csum_ok, "{p:?}");
    assert_eq!(stat_delta(&f.dp, &before, stat::DNAT_NEW), 1);
}

#[test]
fn a_flow_keeps_its_backend_and_replies_are_reverse_nated() {
    let f = fixture();
    let client = addr("10.244.1.2:40001");
    let vip = addr("10.96.0.10:80");
    let first = parse(
        &f.dp
            .test_run(&build(&PacketSpec::tcp(client, vip, TCP_SYN)))
            .unwrap()
            .packet,
    )
    .unwrap();
    let before = f.dp.stats().unwrap();
    for _ in 0..5 {
        let mut spec = PacketSpec::tcp(client, vip, TCP_ACK);
        spec.payload = b"GET / HTTP/1.1\r\n\r\n".to_vec();
        let p = parse(&f.dp.test_run(&build(&spec)).unwrap().packet).unwrap();
        assert_eq!(
            p.dst, first.dst,
            "same backend for every packet of the flow"
        );
        assert!(p.ip_csum_ok && p.l4_csum_ok);
    }
    assert_eq!(stat_delta(&f.dp, &before, stat::DNAT_ESTABLISHED), 5);

    // The backend answers the client: the source becomes the VIP again.
    let reply =
        f.dp.test_run(&build(&PacketSpec::tcp(
            first.dst,
            client,
            TCP_SYN | TCP_ACK,
        )))
        .unwrap();
    assert_eq!(reply.verdict, TC_ACT_OK);
    let r = parse(&reply.packet).unwrap();
    assert_eq!((r.src, r.dst), (vip, client));
    assert!(r.ip_csum_ok && r.l4_csum_ok);
    assert_eq!(stat_delta(&f.dp, &before, stat::REVNAT), 1);
}

#[test]
fn udp_is_dnated_and_reverse_nated_with_valid_checksums() {
    let f = fixture();
    let client = addr("10.244.1.2:5000");
    let vip = addr("10.96.0.10:53");
    let out = parse(
        &f.dp
            .test_run(&build(&PacketSpec::udp(client, vip, b"query")))
            .unwrap()
            .packet,
    )
    .unwrap();
    assert_eq!(out.proto, PROTO_UDP);
    assert!(READY.contains(&out.dst.ip().to_string().as_str()));
    assert_eq!(out.dst.port(), 5353);
    assert!(out.ip_csum_ok && out.l4_csum_ok);
    let back = parse(
        &f.dp
            .test_run(&build(&PacketSpec::udp(out.dst, client, b"answer")))
            .unwrap()
            .packet,
    )
    .unwrap();
    assert_eq!((back.src, back.dst), (vip, client));
    assert!(back.ip_csum_ok && back.l4_csum_ok);
}

#[test]
fn udp_without_checksum_stays_without_one() {
    let f = fixture();
    let mut packet = build(&PacketSpec::udp(
        addr("10.244.1.2:5001"),
        addr("10.96.0.10:53"),
        b"q",
    ));
    let l4 = 14 + 20;
    packet[l4 + 6] = 0;
    packet[l4 + 7] = 0;
    let out = f.dp.test_run(&packet).unwrap();
    assert_eq!(out.verdict, TC_ACT_OK);
    assert_eq!(&out.packet[l4 + 6..l4 + 8], &[0, 0]);
    let p = parse(&out.packet).unwrap();
    assert!(p.ip_csum_ok);
    assert_eq!(p.dst.port(), 5353);
}

#[test]
fn ip_options_shift_the_l4_header_and_are_handled() {
    let f = fixture();
    let mut spec = PacketSpec::tcp(addr("10.244.1.2:40002"), addr("10.96.0.10:80"), TCP_SYN);
    spec.ip_options = 8;
    let p = parse(&f.dp.test_run(&build(&spec)).unwrap().packet).unwrap();
    assert_eq!(p.dst.port(), 8080);
    assert!(p.ip_csum_ok && p.l4_csum_ok);
}

#[test]
fn every_client_port_lands_on_a_ready_backend_and_both_are_used() {
    let f = fixture();
    let mut seen = std::collections::BTreeSet::new();
    for port in 30000..30064 {
        let client = SocketAddrV4::new("10.244.1.2".parse().unwrap(), port);
        let p = parse(
            &f.dp
                .test_run(&build(&PacketSpec::tcp(
                    client,
                    addr("10.96.0.10:80"),
                    TCP_SYN,
                )))
                .unwrap()
                .packet,
        )
        .unwrap();
        assert!(
            READY.contains(&p.dst.ip().to_string().as_str()),
            "not-ready backend chosen: {}",
            p.dst
        );
        seen.insert(p.dst);
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

/// Checks an ICMP reply's IPv4 and ICMP checksums on their own (not by comparing with
/// the expected bytes, which are built with the same checksum function).
fn icmp_checksums_ok(p: &[u8]) -> bool {
    let ip = &p[14..];
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    sliceway_agent::packet::checksum(&ip[..20], 0) == 0
        && sliceway_agent::packet::checksum(&ip[20..total], 0) == 0
        && total == ip.len()
}

#[test]
fn a_service_without_endpoints_rejects_with_icmp_port_unreachable() {
    let f = fixture();
    for packet in [
        build(&PacketSpec::tcp(
            addr("10.244.1.2:40003"),
            addr("10.96.0.20:80"),
            TCP_SYN,
        )),
        build(&PacketSpec::udp(
            addr("10.244.1.2:5003"),
            addr("10.96.0.20:53"),
            b"a datagram of a few bytes, not a multiple of four",
        )),
    ] {
        let before = f.dp.stats().unwrap();
        let out = f.dp.test_run(&packet).unwrap();
        assert_eq!(out.verdict, TC_ACT_REDIRECT, "sent back where it came from");
        assert_eq!(out.packet, icmp_port_unreachable(&packet));
        assert!(icmp_checksums_ok(&out.packet));
        assert_eq!(stat_delta(&f.dp, &before, stat::REJECT_NO_BACKEND), 1);
    }
}

#[test]
fn a_long_datagram_is_quoted_up_to_576_bytes() {
    let f = fixture();
    let packet = build(&PacketSpec::udp(
        addr("10.244.1.2:5004"),
        addr("10.96.0.20:53"),
        &[0xab; 1000],
    ));
    let out = f.dp.test_run(&packet).unwrap();
    assert_eq!(out.verdict, TC_ACT_REDIRECT);
    assert_eq!(out.packet.len(), 14 + 576);
    assert_eq!(out.packet, icmp_port_unreachable(&packet));
    assert!(icmp_checksums_ok(&out.packet));
}

#[test]
fn a_local_policy_service_with_only_remote_endpoints_drops() {
    let f = fixture();
    let before = f.dp.stats().unwrap();
    let out =
        f.dp.test_run(&build(&PacketSpec::tcp(
            addr("10.244.1.2:40003"),
            addr("10.96.0.30:80"),
            TCP_SYN,
        )))
        .unwrap();
    assert_eq!(out.verdict, TC_ACT_SHOT);
    assert_eq!(stat_delta(&f.dp, &before, stat::DROP_NO_BACKEND), 1);
}

#[test]
fn a_clusterip_on_an_undeclared_port_or_protocol_is_rejected() {
    let f = fixture();
    for packet in [
        build(&PacketSpec::tcp(
            addr("10.244.1.2:40004"),
            addr("10.96.0.10:81"),
            TCP_SYN,
        )),
        // UDP to the TCP-only port 80.
        build(&PacketSpec::udp(
            addr("10.244.1.2:40004"),
            addr("10.96.0.10:80"),
            b"x",
        )),
    ] {
        let before = f.dp.stats().unwrap();
        let out = f.dp.test_run(&packet).unwrap();
        assert_eq!(out.verdict, TC_ACT_REDIRECT);
        assert_eq!(out.packet, icmp_port_unreachable(&packet));
        assert_eq!(stat_delta(&f.dp, &before, stat::REJECT_NO_PORT), 1);
    }
}

/// The backend behind a slot of a frontend, read from the maps.
fn backend_of_slot(dp: &Datapath, vip: &str, port: u16, slot: u32) -> std::net::Ipv4Addr {
    let state = dp.maps.state();
    let key = dataplane_common::ServiceKey {
        addr_be: u32::from(vip.parse::<std::net::Ipv4Addr>().unwrap()).to_be(),
        port_be: port.to_be(),
        proto: PROTO_TCP,
        _pad: 0,
    };
    let (_, value) = state.services.iter().find(|(k, _)| *k == key).unwrap();
    let (_, id) = state
        .slots
        .iter()
        .find(|(k, _)| k.service_id == value.id && k.slot == slot)
        .unwrap();
    let (_, b) = state.backends.iter().find(|(i, _)| i == id).unwrap();
    std::net::Ipv4Addr::from(u32::from_be(b.addr_be))
}

/// The slot a new flow from `src` to the sticky Service hashes to.
fn hashed_slot(src: SocketAddrV4) -> u32 {
    let vip = SocketAddrV4::new("10.96.0.40".parse().unwrap(), 80);
    dataplane_common::flow_hash(
        u32::from(*src.ip()).to_be(),
        u32::from(*vip.ip()).to_be(),
        src.port().to_be(),
        vip.port().to_be(),
        PROTO_TCP,
    ) % 3
}

#[test]
fn session_affinity_keeps_a_client_on_its_backend_until_the_timeout() {
    let f = fixture();
    let syn = |src: SocketAddrV4| {
        let out =
            f.dp.test_run(&build(&PacketSpec::tcp(
                src,
                addr("10.96.0.40:80"),
                TCP_SYN,
            )))
            .unwrap();
        assert_eq!(out.verdict, TC_ACT_OK);
        *parse(&out.packet).unwrap().dst.ip()
    };
    // Two client ports of one client that hash to different backends.
    let first = addr("10.244.1.7:41000");
    let want = backend_of_slot(&f.dp, "10.96.0.40", 80, hashed_slot(first));
    let other = (41001..42000)
        .map(|p| SocketAddrV4::new(*first.ip(), p))
        .find(|s| backend_of_slot(&f.dp, "10.96.0.40", 80, hashed_slot(*s)) != want)
        .unwrap();
    assert_eq!(syn(first), want);
    // 50 more connections from other ports, the one that would hash elsewhere among
    // them: all to the same backend.
    assert_eq!(syn(other), want, "affinity, not the hash");
    for port in 42000..42049 {
        assert_eq!(syn(SocketAddrV4::new(*first.ip(), port)), want);
    }
    // Another client is not bound by it.
    let stranger = addr("10.244.1.8:41000");
    assert_eq!(
        syn(stranger),
        backend_of_slot(&f.dp, "10.96.0.40", 80, hashed_slot(stranger))
    );
    // After the timeout (1 s) the client is hashed again.
    std::thread::sleep(std::time::Duration::from_millis(1300));
    assert_ne!(syn(other), want, "affinity expired");
}

#[test]
fn other_traffic_passes_unchanged_and_is_counted() {
    let f = fixture();
    let before = f.dp.stats().unwrap();
    let packet = build(&PacketSpec::tcp(
        addr("10.244.1.2:40004"),
        addr("10.244.11.2:8080"),
        TCP_SYN,
    ));
    let out = f.dp.test_run(&packet).unwrap();
    assert_eq!(out.verdict, TC_ACT_OK);
    assert_eq!(out.packet, packet);
    assert_eq!(stat_delta(&f.dp, &before, stat::PASS_NO_SERVICE), 1);

    // Not IPv4 (ARP).
    let mut arp = packet.clone();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(f.dp.test_run(&arp).unwrap().verdict, TC_ACT_OK);
    assert_eq!(stat_delta(&f.dp, &before, stat::PASS_NOT_IPV4), 1);

    // ICMP to the VIP.
    let mut icmp = packet.clone();
    icmp[14 + 9] = 1;
    assert_eq!(f.dp.test_run(&icmp).unwrap().verdict, TC_ACT_OK);
    assert_eq!(stat_delta(&f.dp, &before, stat::PASS_NOT_L4), 1);
}

#[test]
fn fragments_and_truncated_headers_have_named_outcomes() {
    let f = fixture();
    let before = f.dp.stats().unwrap();
    // A non-first fragment: no ports to look at.
    let mut frag = build(&PacketSpec::udp(
        addr("10.244.1.2:5002"),
        addr("10.96.0.10:53"),
        b"x",
    ));
    frag[14 + 6] = 0x00;
    frag[14 + 7] = 0x10;
    assert_eq!(f.dp.test_run(&frag).unwrap().verdict, TC_ACT_OK);
    assert_eq!(stat_delta(&f.dp, &before, stat::PASS_FRAGMENT), 1);

    // TCP header cut short.
    let full = build(&PacketSpec::tcp(
        addr("10.244.1.2:40005"),
        addr("10.96.0.10:80"),
        TCP_SYN,
    ));
    let cut = &full[..14 + 20 + 10];
    assert_eq!(f.dp.test_run(cut).unwrap().verdict, TC_ACT_SHOT);
    assert_eq!(stat_delta(&f.dp, &before, stat::DROP_MALFORMED), 1);
    assert_eq!(full[14 + 9], PROTO_TCP);
}

/// A map pinned by a build with another layout is refused with a message, never read.
#[test]
fn a_pinned_map_of_another_layout_is_refused() {
    use sliceway_agent::kernel::{KernelError, PinDir};
    let base = std::path::PathBuf::from(format!("/sys/fs/bpf/slw-layout-{}", std::process::id()));
    let pins = PinDir::new(&base);
    std::fs::create_dir_all(pins.dir()).unwrap();
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(base.clone());
    // SERVICES with a 4-byte key instead of the 8-byte ServiceKey.
    let path = pins.map("SERVICES");
    let out = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(&path)
        .args([
            "type", "hash", "key", "4", "value", "16", "entries", "16", "name", "SERVICES",
        ])
        .output()
        .expect("bpftool (installed by the set-up)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match Datapath::load(&Capacities::default(), Some(&pins)) {
        Err(e @ KernelError::Layout { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("key size 4") && msg.contains("sliceway-agent cleanup"),
                "{msg}"
            );
        }
        Err(e) => panic!("expected a layout error, got {e}"),
        Ok(_) => panic!("a map of another layout was adopted"),
    }
}

//! Node-lab tests of connection tracking with real sockets, in network namespaces:
//! connections that outlive their Service, two Services sharing a backend hit from
//! one client port, and a UDP flow whose backend is removed. Need root.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use sliceway_lab::{in_netns, servers::EchoConn, Lab};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP2: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const PORT: u16 = 80;

fn vip() -> SocketAddrV4 {
    SocketAddrV4::new(VIP, PORT)
}

/// Replaces a manifest and waits until the agent has applied it.
fn change(agent: &sliceway_lab::Agent, apply: impl FnOnce()) {
    let before = agent.syncs();
    apply();
    agent
        .wait_for_sync(before + 1, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e:#}: {:#?}", agent.log()));
}

#[test]
fn an_open_connection_survives_the_deletion_of_its_service() {
    let lab = Lab::new(2).unwrap();
    lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[0, 1]))
        .unwrap();
    let agent = lab.start_agent().unwrap();
    let mut echo = in_netns(&lab.client.ns, || {
        EchoConn::open(vip(), Duration::from_secs(2))
    })
    .unwrap()
    .unwrap();
    echo.roundtrip("before").unwrap();
    change(&agent, || lab.remove_manifest("web.yaml").unwrap());
    // New connections find no Service...
    assert!(
        lab.tcp_request(vip()).is_err(),
        "the deleted VIP still answers"
    );
    // ...but the open one goes on, as with netfilter's conntrack.
    for i in 0..5 {
        echo.roundtrip(&format!("after {i}"))
            .unwrap_or_else(|e| panic!("open connection broke after the Service went: {e:#}"));
    }
}

#[test]
fn two_services_sharing_a_backend_hit_from_one_client_port_each_get_their_replies() {
    let lab = Lab::new(1).unwrap();
    lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[0]))
        .unwrap();
    lab.write_manifest("api.yaml", &lab.service_yaml("api", VIP2, PORT, &[0]))
        .unwrap();
    let _agent = lab.start_agent().unwrap();
    let backend = lab.backends[0].name.clone();
    let replies = in_netns(
        &lab.client.ns,
        move || -> std::io::Result<Vec<(SocketAddrV4, String)>> {
            // One socket, one port, both Services, several rounds: the two flows are
            // live at the same time and have the same reply tuple at the backend.
            let socket = UdpSocket::bind(("0.0.0.0", 0))?;
            socket.set_read_timeout(Some(Duration::from_secs(1)))?;
            let mut out = Vec::new();
            for _ in 0..3 {
                for to in [SocketAddrV4::new(VIP, PORT), SocketAddrV4::new(VIP2, PORT)] {
                    socket.send_to(b"hello", to)?;
                    let mut buf = [0u8; 1500];
                    let (n, from) = socket.recv_from(&mut buf)?;
                    let std::net::SocketAddr::V4(from) = from else {
                        panic!("IPv6 reply")
                    };
                    assert_eq!(from, to, "the reply to {to} came from {from}");
                    out.push((from, String::from_utf8_lossy(&buf[..n]).into_owned()));
                }
            }
            Ok(out)
        },
    )
    .unwrap()
    .unwrap();
    assert_eq!(replies.len(), 6);
    for (from, text) in &replies {
        assert!(text.starts_with(&backend), "{from}: {text}");
    }
}

#[test]
fn a_udp_flow_whose_backend_is_removed_moves_on() {
    let lab = Lab::new(2).unwrap();
    lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[0, 1]))
        .unwrap();
    let agent = lab.start_agent().unwrap();
    let ns = lab.client.ns.clone();
    // One connected socket: the same flow before and after the removal.
    let socket = in_netns(&ns, || -> std::io::Result<UdpSocket> {
        let s = UdpSocket::bind(("0.0.0.0", 0))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.connect(SocketAddrV4::new(VIP, PORT))?;
        Ok(s)
    })
    .unwrap()
    .unwrap();
    let ask = |s: &UdpSocket| -> String {
        s.send(b"hello").unwrap();
        let mut buf = [0u8; 1500];
        let n = s.recv(&mut buf).expect("an answer");
        String::from_utf8_lossy(&buf[..n])
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let first = ask(&socket);
    assert_eq!(ask(&socket), first, "a UDP flow keeps its backend");
    let kept = lab.backends.iter().position(|b| b.name != first).unwrap();
    change(&agent, || {
        lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[kept]))
            .unwrap()
    });
    assert_eq!(
        ask(&socket),
        lab.backends[kept].name,
        "the flow stayed on the removed backend {first}"
    );
}

/// Eviction pressure: with the sweeper collecting closed connections, a long idle
/// connection survives ten times the conntrack map's capacity in entries written by
/// short connections (each writes two). Closed connections idle out after 1 s here
/// instead of netfilter's 120 s of TIME_WAIT, so the test takes seconds, and the
/// connection rate stays below what the map holds for that long.
#[test]
fn an_idle_connection_survives_ten_times_the_map_capacity_in_short_connections() {
    const CAPACITY: usize = 1024;
    let lab = Lab::new(2).unwrap();
    lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[0, 1]))
        .unwrap();
    let mut args: Vec<std::ffi::OsString> =
        vec!["--manifests".into(), lab.manifests.clone().into()];
    for a in [
        "--max-conntrack",
        &CAPACITY.to_string(),
        "--conntrack-timeout",
        "tcp_time_wait=1",
        "--conntrack-timeout",
        "tcp_fin_wait=1",
        "--conntrack-timeout",
        "tcp_close=1",
        "--conntrack-sweep-interval-ms",
        "100",
    ] {
        args.push(a.into());
    }
    let agent =
        sliceway_lab::Agent::start(&lab.node.name, &args, &lab.pod_interfaces(), &lab.bpffs)
            .unwrap();
    agent.wait_for_sync(1, Duration::from_secs(20)).unwrap();
    let mut idle = in_netns(&lab.client.ns, || {
        EchoConn::open(vip(), Duration::from_secs(2))
    })
    .unwrap()
    .unwrap();
    idle.roundtrip("before").unwrap();
    let connections = 10 * CAPACITY / 2;
    let failed = in_netns(&lab.client.ns, move || {
        let start = std::time::Instant::now();
        let mut failed = 0;
        for i in 0..connections {
            // At most 250 new connections a second: about 550 entries alive at once.
            let due = start + Duration::from_millis(4 * i as u64);
            if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
                std::thread::sleep(wait);
            }
            if sliceway_lab::servers::tcp_request(vip(), Duration::from_secs(2)).is_err() {
                failed += 1;
            }
        }
        failed
    })
    .unwrap();
    assert_eq!(
        failed, 0,
        "{failed} of {connections} short connections failed"
    );
    idle.roundtrip("after")
        .unwrap_or_else(|e| panic!("the idle connection was evicted: {e:#}"));
    // The closed connections were collected, not left for LRU eviction: once they
    // idled out and a sweep pass went by, only the idle connection's two entries are
    // left.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let entries = conntrack_entries(&lab);
        if entries == Some(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "conntrack still holds {entries:?} entries: {:#?}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Entries in the lab agent's pinned conntrack map, as `sliceway-agent list` counts
/// them.
fn conntrack_entries(lab: &Lab) -> Option<u64> {
    let out = std::process::Command::new(sliceway_lab::workspace_binary("sliceway-agent").ok()?)
        .args(["list", "-o", "json", "--bpffs-dir"])
        .arg(&lab.bpffs)
        .output()
        .ok()?;
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    listing["conntrack_entries"].as_u64()
}

//! Issue 13: a change of the pinned layout is hitless. The agent of layout v1 (built
//! from this repository's history by `cargo xtask build-v1-agent`, which `cargo xtask
//! test` runs and passes in `SLICEWAY_V1_AGENT`) runs a node; the current agent
//! replaces it on the same bpffs directory while a client keeps making new TCP
//! connections and UDP requests and holds long-lived connections open. Cilium's
//! upgrades across incompatible maps interrupt traffic (cilium/cilium#28894); here
//! not one connection may fail. Needs root (CI runs as root).

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use sliceway_lab::{servers, Lab};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const PORT: u16 = 80;

fn vip() -> SocketAddrV4 {
    SocketAddrV4::new(VIP, PORT)
}

/// The layout-v1 agent: from `SLICEWAY_V1_AGENT`, or built now (cached by commit).
fn v1_agent() -> PathBuf {
    if let Some(bin) = std::env::var_os("SLICEWAY_V1_AGENT") {
        return bin.into();
    }
    let out = Command::new(env!("CARGO"))
        .args([
            "run",
            "--quiet",
            "--package",
            "xtask",
            "--",
            "build-v1-agent",
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("running cargo xtask build-v1-agent");
    assert!(
        out.status.success(),
        "cargo xtask build-v1-agent failed: the v1 agent is needed for this test"
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Lines of a log at WARN or ERROR level.
fn problems(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("panicked"))
        .collect()
}

#[test]
fn an_upgrade_from_layout_v1_under_load_fails_no_connection() {
    let v1 = v1_agent();
    let lab = Lab::new(3).unwrap();
    lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[0, 1, 2]))
        .unwrap();
    let mut old = lab.start_agent_binary(&v1).unwrap();
    assert!(
        lab.bpffs.join("v1").is_dir(),
        "the v1 agent pins under v1/: {:#?}",
        old.log()
    );

    // Long-lived connections, open across the upgrade.
    let mut echoes: Vec<servers::EchoConn> = (0..6)
        .map(|_| {
            sliceway_lab::in_netns(&lab.client.ns, || {
                servers::EchoConn::open(vip(), Duration::from_secs(2))
            })
            .unwrap()
            .unwrap()
        })
        .collect();
    for e in &mut echoes {
        e.roundtrip("before").unwrap();
    }

    // New connections and UDP requests, continuously, from the client pod. Each must
    // succeed at the first try: a TCP connect that needs its SYN sent again (a reply
    // lost at the switch) takes a second and is counted as slow.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let slowest_us = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, ok, failed, slowest_us) =
            (stop.clone(), ok.clone(), failed.clone(), slowest_us.clone());
        let ns = lab.client.ns.clone();
        std::thread::spawn(move || {
            sliceway_lab::in_netns(&ns, move || {
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let started = Instant::now();
                    let result = if i.is_multiple_of(3) {
                        servers::udp_request(vip(), Duration::from_secs(2))
                    } else {
                        servers::tcp_request(vip(), Duration::from_secs(3))
                    };
                    slowest_us.fetch_max(started.elapsed().as_micros() as u64, Ordering::SeqCst);
                    match result {
                        Ok(_) => ok.fetch_add(1, Ordering::SeqCst),
                        Err(e) => {
                            eprintln!("request {i} failed: {e:#}");
                            failed.fetch_add(1, Ordering::SeqCst)
                        }
                    };
                }
            })
            .unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // The v1 agent goes as a rolling update takes it away; its program keeps
    // translating with its pinned maps meanwhile.
    old.kill();
    let before_upgrade = ok.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        ok.load(Ordering::SeqCst) > before_upgrade,
        "traffic goes on without an agent"
    );

    let agent = lab.start_agent().unwrap();
    // The first sync has been logged; the migration follows at once (the bridge's
    // verification takes about a second here, far longer on a busy machine).
    let deadline = Instant::now() + sliceway_lab::agent_start();
    while agent
        .metric("sliceway_layout_migration{from=\"1\",state=\"complete\"}")
        .ok()
        .flatten()
        != Some(1.0)
    {
        assert!(
            Instant::now() < deadline,
            "no migration: {:#?}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let at_upgrade = ok.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    load.join().unwrap();

    let log = agent.log();
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "{} of {} requests failed; agent log:\n{}",
        failed.load(Ordering::SeqCst),
        ok.load(Ordering::SeqCst) + failed.load(Ordering::SeqCst),
        log.join("\n")
    );
    let made = ok.load(Ordering::SeqCst);
    assert!(
        made > at_upgrade && made > 100,
        "too few requests: {made} ({at_upgrade} before the migration ended)"
    );
    let slowest = Duration::from_micros(slowest_us.load(Ordering::SeqCst));
    eprintln!("{made} requests, none failed, slowest {slowest:?}");
    assert!(
        slowest < Duration::from_millis(900),
        "a request took {slowest:?}: a lost packet was sent again"
    );

    // Every long-lived connection still echoes, so it is still on its backend (another
    // backend would answer its next segment with a reset), and the new agent tracks it
    // as established on that backend.
    for (i, e) in echoes.iter_mut().enumerate() {
        let server = e.reply.backend.clone();
        e.roundtrip("after")
            .unwrap_or_else(|err| panic!("long-lived connection {i} to {server} broke: {err:#}"));
    }
    let bpffs = lab.bpffs.to_str().unwrap().to_string();
    let flows = sliceway_lab::agent_cli(&["conntrack", "-o", "json", "--bpffs-dir", &bpffs]);
    for e in &echoes {
        let pod = lab
            .backends
            .iter()
            .find(|b| b.name == e.reply.backend)
            .unwrap();
        let backend = format!("{}:{}", pod.ip, sliceway_lab::BACKEND_PORT);
        let client = e.local_addr().to_string();
        let flow = flows
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["client"] == client.as_str())
            .unwrap_or_else(|| panic!("{client} is not tracked: {flows:#}"));
        assert_eq!(flow["backend"], backend.as_str(), "{flow}");
        assert_eq!(flow["state"], "tcp_established", "{flow}");
        assert_eq!(flow["service"], "default/web:http", "{flow}");
    }

    assert!(
        !lab.bpffs.join("v1").exists(),
        "the v1 pins are still there: {:?}",
        std::fs::read_dir(lab.bpffs.join("v1")).map(|d| d.count())
    );
    for iface in lab.pod_interfaces() {
        assert!(
            lab.bpffs.join("v2").join(format!("link-{iface}")).exists(),
            "{iface} has no link under v2"
        );
    }
    assert!(
        log.iter()
            .any(|l| l.contains("v1 conntrack copied") && !l.contains("copied=0 ")),
        "{log:#?}"
    );
    assert_eq!(problems(&log), Vec::<&String>::new(), "{log:#?}");
}

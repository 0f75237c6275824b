//! `sliceway-demo`, run by `cargo xtask demo`: a node in network namespaces, a
//! Service with three backend pods written as YAML, the agent in local mode, and
//! traffic to the ClusterIP, like `while true; do curl <ClusterIP>; done`.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{Context, Result};
use sliceway_lab::Lab;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const PORT: u16 = 80;
const REQUESTS: usize = 12;

fn main() -> Result<()> {
    let vip = SocketAddrV4::new(VIP, PORT);
    println!("== building a node lab: 1 client pod, 1 node, 3 backend pods (network namespaces)");
    let lab = Lab::new(3)?;
    for pod in std::iter::once(&lab.client).chain(&lab.backends) {
        println!(
            "   {:<10} {:<12} on node interface {}",
            pod.name, pod.ip, pod.node_iface
        );
    }

    let yaml = lab.service_yaml("web", VIP, PORT, &[0, 1, 2]);
    lab.write_manifest("web.yaml", &yaml)?;
    println!("\n== manifests in {}: web.yaml\n", lab.manifests.display());
    for line in yaml.lines() {
        println!("   {line}");
    }

    println!(
        "\n== starting sliceway-agent in local mode on {}",
        lab.pod_interfaces().join(",")
    );
    let agent = lab.start_agent().context("starting the agent")?;
    println!("   agent synced: the Service is in the BPF maps");

    println!("\n== {REQUESTS} connections from the client pod to {vip}");
    round(&lab, vip)?;

    let removed = &lab.backends[1];
    println!(
        "\n== removing {} ({}) from the EndpointSlice",
        removed.name, removed.ip
    );
    let before = agent.syncs();
    lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[0, 2]))?;
    agent.wait_for_sync(before + 1, Duration::from_secs(5))?;
    println!("   agent re-synced\n\n== {REQUESTS} more connections to {vip}");
    let counts = round(&lab, vip)?;
    anyhow::ensure!(
        !counts.contains_key(&removed.name),
        "{} still received traffic after it was removed",
        removed.name
    );
    println!("   {} received no new connection", removed.name);

    println!("\n== cleaning up (agent stopped, namespaces deleted)");
    drop(agent);
    drop(lab);
    println!("done");
    Ok(())
}

fn round(lab: &Lab, vip: SocketAddrV4) -> Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for i in 1..=REQUESTS {
        let reply = lab.tcp_request(vip)?;
        println!(
            "   request {i:>2}: answered by {} ({})",
            reply.backend, reply.addr
        );
        *counts.entry(reply.backend).or_insert(0) += 1;
    }
    println!("   summary:");
    for (backend, n) in &counts {
        println!("     {backend:<10} {n:>2} {}", "#".repeat(*n));
    }
    Ok(counts)
}

//! `sliceway-demo`, run by `cargo xtask demo`: a node in network namespaces, a
//! Service with three backend pods written as YAML, the agent in local mode, and
//! traffic to the ClusterIP, like `while true; do curl <ClusterIP>; done`.
//!
//! With `--cluster` (`cargo xtask demo --cluster`): the same story on a two-node
//! cluster lab with the real control plane: a Deployment and a Service made with
//! kubectl, traffic from a pod, a pod deleted, traffic follows, everything removed.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{Context, Result};
use sliceway_lab::{
    cluster::{self, Spec},
    Lab,
};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const PORT: u16 = 80;
const REQUESTS: usize = 12;

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--cluster") {
        return cluster_demo();
    }
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
    agent
        .applies(|| lab.write_manifest("web.yaml", &lab.service_yaml("web", VIP, PORT, &[0, 2])))?;
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

fn cluster_demo() -> Result<()> {
    println!(
        "== starting a cluster lab: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,"
    );
    println!("   2 nodes (network namespaces) with sliceway-agent, sliceway-controller");
    let c = cluster::for_test(&Spec::default())?;
    let kubectl = |args: &[&str]| -> Result<String> {
        println!("\n$ kubectl {}", args.join(" "));
        let out = c.kubectl(args)?;
        print!("{out}");
        Ok(out)
    };
    kubectl(&["get", "nodes", "-L", "topology.kubernetes.io/zone"])?;
    kubectl(&[
        "create",
        "deployment",
        "web",
        "--image=anything",
        "--replicas=3",
        "--port=8080",
    ])?;
    kubectl(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ])?;
    kubectl(&["run", "client", "--image=anything", "--port=9"])?;
    c.wait_ready_pods("default", "app=web", 3)?;
    c.wait_ready_pods("default", "run=client", 1)?;
    kubectl(&["get", "pods", "-o", "wide"])?;
    wait_slice_endpoints(&c, 3)?;
    kubectl(&[
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=web",
    ])?;
    let vip = SocketAddrV4::new(c.cluster_ip("default", "web")?, 80);
    let client = c.pod_netns("default", "client")?;
    println!("\n== {REQUESTS} connections from pod client to {vip}");
    let counts = cluster_round(&client, vip)?;
    let victim = counts
        .keys()
        .next()
        .cloned()
        .context("no backend answered")?;
    kubectl(&["delete", "pod", &victim, "--grace-period=1", "--wait=true"])?;
    let now = c.wait_ready_pods("default", "app=web", 3)?;
    wait_slice_endpoints(&c, 3)?;
    kubectl(&["get", "pods", "-o", "wide", "-l", "app=web"])?;
    println!("\n== {REQUESTS} more connections to {vip}");
    let counts = cluster_round(&client, vip)?;
    anyhow::ensure!(
        !counts.contains_key(&victim),
        "{victim} still received traffic after it was deleted"
    );
    let replacement: Vec<&String> = now.iter().filter(|p| counts.contains_key(*p)).collect();
    println!(
        "   {victim} is gone and received no connection; {} of the {} pods now running answered",
        replacement.len(),
        now.len()
    );
    println!("\n== taking the cluster lab down");
    drop(c);
    println!("done");
    Ok(())
}

fn cluster_round(netns: &str, vip: SocketAddrV4) -> Result<BTreeMap<String, usize>> {
    let counts = cluster::tcp_spread(netns, vip, REQUESTS)?;
    for (backend, n) in &counts {
        println!("     {backend:<26} {n:>2} {}", "#".repeat(*n));
    }
    anyhow::ensure!(!counts.contains_key("(failed)"), "some connections failed");
    Ok(counts)
}

/// Waits until the `web` Service's EndpointSlices list `n` ready endpoints.
fn wait_slice_endpoints(c: &cluster::Cluster, n: usize) -> Result<()> {
    for _ in 0..100 {
        let out = c.kubectl(&[
            "get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o",
            "jsonpath={range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{\"\\n\"}{end}",
        ])?;
        if out.lines().count() == n {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("the EndpointSlices of web never listed {n} ready endpoints")
}

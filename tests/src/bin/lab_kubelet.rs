//! `sliceway-lab-kubelet`: the cluster lab's kubelet stand-in for one node (see
//! `sliceway_lab::cluster::kubelet`). Started by the cluster lab, not by people.

use std::{net::Ipv4Addr, path::PathBuf};

use anyhow::{Context, Result};
use clap::Parser;
use sliceway_lab::cluster::kubelet::{self, NodeConfig};

#[derive(Parser)]
#[command(
    name = "sliceway-lab-kubelet",
    about = "The cluster lab's kubelet stand-in"
)]
struct Args {
    /// Kubeconfig of the lab's admin.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The Node's name.
    #[arg(long)]
    node: String,
    /// The node's network namespace.
    #[arg(long)]
    netns: String,
    /// The node's address on the node network.
    #[arg(long)]
    ip: Ipv4Addr,
    /// The node's pod CIDR (a /24, given by its network address).
    #[arg(long)]
    pod_cidr: Ipv4Addr,
    /// The node's zone label.
    #[arg(long)]
    zone: String,
    /// The API server's port on the root namespace's loopback.
    #[arg(long)]
    apiserver_port: u16,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_ansi(false)
        .init();
    let args = Args::parse();
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = kube::Client::try_from(config)?;
    let cfg = NodeConfig {
        prefix: args.netns.clone(),
        name: args.node,
        netns: args.netns,
        ip: args.ip,
        pod_cidr: args.pod_cidr,
        zone: args.zone,
        apiserver_port: args.apiserver_port,
    };
    kubelet::run(cfg, client).await
}

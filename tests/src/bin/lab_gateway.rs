//! `sliceway-lab-gateway`: the cluster lab's gateway between the control plane and
//! the lab's namespaces, for real nodes (see `sliceway_lab::cluster::gateway`).
//! Started by the cluster lab, not by people.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Result;
use clap::Parser;
use sliceway_lab::cluster::gateway::{self, GatewayConfig};

#[derive(Parser)]
#[command(
    name = "sliceway-lab-gateway",
    about = "The cluster lab's gateway to and from the control plane"
)]
struct Args {
    /// The control-plane namespace.
    #[arg(long)]
    netns: String,
    /// An address in the namespace forwarded to the API server (repeatable).
    #[arg(long, required = true)]
    listen: Vec<SocketAddr>,
    /// The API server's port on the root namespace's loopback.
    #[arg(long)]
    apiserver_port: u16,
    /// The Unix socket of the API server's egress (HTTP CONNECT).
    #[arg(long)]
    egress_socket: PathBuf,
    /// A network the egress may connect to (repeatable): the lab's own.
    #[arg(long, required = true)]
    allow: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_ansi(false)
        .init();
    let args = Args::parse();
    let allow = args
        .allow
        .iter()
        .map(|c| gateway::parse_cidr(c))
        .collect::<Result<Vec<_>>>()?;
    gateway::run(GatewayConfig {
        netns: args.netns,
        listen: args.listen,
        apiserver_port: args.apiserver_port,
        egress_socket: args.egress_socket,
        allow,
    })
    .await
}

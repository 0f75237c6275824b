//! `sliceway-agent`: the node agent's command line.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use sliceway_agent::{agent, compiler, kernel::Capacities, writer::Limits};

#[derive(Parser)]
#[command(
    name = "sliceway-agent",
    version,
    about = "sliceway node agent: Kubernetes Services in BPF maps"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Program the datapath and keep it in sync.
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Directory of Kubernetes YAML (Services, EndpointSlices, Nodes) to take objects
    /// from instead of an API server. Watched for changes.
    #[arg(long)]
    manifests: PathBuf,
    /// Interfaces to attach the TC program to (pod-facing interfaces), comma-separated.
    #[arg(long, value_delimiter = ',')]
    interfaces: Vec<String>,
    /// This node's name (for internalTrafficPolicy: Local).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    /// Handle Services labelled service.kubernetes.io/service-proxy-name with this value.
    #[arg(long)]
    service_proxy_name: Option<String>,
    /// How often to check the manifest directory, in milliseconds.
    #[arg(long, default_value_t = 200)]
    poll_interval_ms: u64,
    /// Capacity of the services map (frontends).
    #[arg(long, default_value_t = Limits::default().services)]
    max_services: u32,
    /// Capacity of the backends map.
    #[arg(long, default_value_t = Limits::default().backends)]
    max_backends: u32,
    /// Capacity of the slots map (sum of backends over frontends).
    #[arg(long, default_value_t = Limits::default().slots)]
    max_slots: u32,
    /// Capacity of the conntrack map (LRU).
    #[arg(long, default_value_t = Capacities::default().conntrack)]
    max_conntrack: u32,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let settings = agent::Settings {
                manifests: args.manifests,
                interfaces: args.interfaces,
                compiler: compiler::Options {
                    node_name: args.node,
                    proxy_name: args.service_proxy_name,
                },
                capacities: Capacities {
                    limits: Limits {
                        services: args.max_services,
                        backends: args.max_backends,
                        slots: args.max_slots,
                    },
                    conntrack: args.max_conntrack,
                },
                poll: Duration::from_millis(args.poll_interval_ms),
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(agent::run_local(settings, shutdown_signal()))
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

//! `sliceway-agent`: the node agent's command line.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use std::net::{Ipv4Addr, SocketAddrV4};

use dataplane_common::{PROTO_TCP, PROTO_UDP};
use sliceway_agent::{
    agent, compiler, inspect, kernel, kernel::Capacities, kernel::PinDir, local, writer::Limits,
};

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
    /// Show what the kernel holds: frontends, backends, counters (from pinned maps).
    List {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Where would this packet go, and why? Runs one crafted packet through the
    /// programs (BPF_PROG_TEST_RUN); nothing is attached and no traffic is sent.
    Trace(TraceArgs),
    /// Remove all pinned maps and links: programs detach, conntrack is dropped.
    Cleanup {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
    },
}

const DEFAULT_BPFFS_DIR: &str = "/sys/fs/bpf/sliceway";

#[derive(Clone, Copy, clap::ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(clap::Args)]
struct TraceArgs {
    /// Compile this manifest directory with private maps; without it, trace against
    /// the live pinned maps.
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// Source address, IP or IP:PORT.
    #[arg(long)]
    src: String,
    /// Destination IP:PORT.
    #[arg(long)]
    dst: std::net::SocketAddrV4,
    #[arg(long, value_enum, default_value_t = Proto::Tcp)]
    proto: Proto,
    /// This node's name (for internalTrafficPolicy: Local).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
    bpffs_dir: PathBuf,
    #[arg(short, long, value_enum, default_value_t = Output::Json)]
    output: Output,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Proto {
    Tcp,
    Udp,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Directory of Kubernetes YAML (Services, EndpointSlices, Nodes) to take objects
    /// from instead of an API server. Watched for changes.
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// Kubeconfig for the API server (default: in-cluster config, then KUBECONFIG).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// How long a burst of API changes is collected into one sync, in milliseconds.
    #[arg(long, default_value_t = 100)]
    batch_delay_ms: u64,
    /// Address for /metrics and /healthz (kube-proxy's port; localhost by default).
    #[arg(long, default_value = "127.0.0.1:10256")]
    metrics_addr: std::net::SocketAddr,
    /// Serve no metrics.
    #[arg(long)]
    no_metrics: bool,
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
    /// bpffs directory for pinned maps and links (kept across restarts).
    #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
    bpffs_dir: PathBuf,
    /// Do not pin: maps are private and programs detach when the agent exits.
    #[arg(long)]
    no_pin: bool,
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
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let source = match args.manifests {
                    Some(dir) => agent::Source::Manifests {
                        dir,
                        poll: Duration::from_millis(args.poll_interval_ms),
                    },
                    None => agent::Source::Kubernetes {
                        client: kube_client(args.kubeconfig.as_deref()).await?,
                        batch: Duration::from_millis(args.batch_delay_ms),
                    },
                };
                let settings = agent::Settings {
                    source,
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
                    pins: (!args.no_pin).then(|| PinDir::new(args.bpffs_dir)),
                    metrics_addr: (!args.no_metrics).then_some(args.metrics_addr),
                };
                agent::run(settings, shutdown_signal()).await
            })
        }
        Command::List { bpffs_dir, output } => {
            let listing = inspect::list(&PinDir::new(bpffs_dir))?;
            match output {
                Output::Table => print!("{}", inspect::render_table(&listing)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&listing)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&listing)?),
            }
            Ok(())
        }
        Command::Trace(args) => {
            let src = match args.src.parse::<SocketAddrV4>() {
                Ok(s) => s,
                Err(_) => inspect::default_src(args.src.parse::<Ipv4Addr>().map_err(|_| {
                    anyhow::anyhow!("--src {:?} is neither IP nor IP:PORT", args.src)
                })?),
            };
            let proto = match args.proto {
                Proto::Tcp => PROTO_TCP,
                Proto::Udp => PROTO_UDP,
            };
            let trace = match &args.manifests {
                Some(dir) => {
                    let (objects, problems) = local::load_dir(dir)?;
                    for p in problems {
                        tracing::warn!(file = %p.file.display(), "{}", p.reason);
                    }
                    let opts = compiler::Options {
                        node_name: args.node,
                        proxy_name: None,
                    };
                    inspect::trace(&objects, &opts, src, args.dst, proto)?
                }
                None => {
                    let dp = inspect::live_datapath(&PinDir::new(&args.bpffs_dir))?;
                    inspect::run_trace(&dp, src, args.dst, proto)?
                }
            };
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&trace)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&trace)?),
                Output::Table => println!(
                    "verdict {} ({}); service {}; backend {}; candidates [{}]",
                    trace.verdict,
                    trace.reason,
                    trace.service.as_deref().unwrap_or("-"),
                    trace.backend.as_deref().unwrap_or("-"),
                    trace.candidates.join(", ")
                ),
            }
            Ok(())
        }
        Command::Cleanup { bpffs_dir } => {
            kernel::cleanup(&bpffs_dir)?;
            println!(
                "removed pinned maps and links under {}",
                bpffs_dir.display()
            );
            Ok(())
        }
    }
}

/// A client for the API server: from `--kubeconfig`, or inferred (in-cluster service
/// account, then KUBECONFIG / ~/.kube/config).
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("reading kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await.map_err(|e| {
            anyhow::anyhow!("no API server configuration ({e}); pass --manifests DIR for local mode or --kubeconfig")
        })?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

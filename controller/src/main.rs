//! The `sliceway-controller` binary: `run` (against an API server or a manifest
//! directory) and `plan`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use controller::store::{self, Controllers};
use controller::{mirroring, reconciler, util};

#[derive(Parser)]
#[command(
    name = "sliceway-controller",
    version,
    about = "EndpointSlice, Endpoints and mirroring controllers for Services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controllers against the API server, or a manifest directory.
    Run(RunArgs),
    /// One reconcile pass over a manifest directory; prints the plan, writes nothing.
    Plan(PlanArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Table,
}

#[derive(Args, Clone)]
struct ReconcileArgs {
    /// Most endpoints per EndpointSlice (1 to 1000).
    #[arg(long, env = "SLICEWAY_MAX_ENDPOINTS_PER_SLICE", default_value_t = reconciler::DEFAULT_MAX_ENDPOINTS_PER_SLICE)]
    max_endpoints_per_slice: usize,
    /// The `endpointslice.kubernetes.io/managed-by` value of the slices it writes.
    /// Keep upstream's value only when kube-controller-manager's controllers are off.
    #[arg(long, env = "SLICEWAY_MANAGED_BY", default_value = util::CONTROLLER_NAME)]
    managed_by: String,
    /// The managed-by value of mirrored slices.
    #[arg(long, env = "SLICEWAY_MIRRORING_MANAGED_BY", default_value = util::MIRRORING_CONTROLLER_NAME)]
    mirroring_managed_by: String,
    /// Controllers to run (comma-separated): endpointslice, endpoints, mirroring.
    #[arg(
        long,
        env = "SLICEWAY_CONTROLLERS",
        value_delimiter = ',',
        default_value = "endpointslice,endpoints,mirroring"
    )]
    controllers: Vec<String>,
}

impl ReconcileArgs {
    fn options(&self, garbage_collect: bool) -> anyhow::Result<store::Options> {
        let mut controllers = Controllers {
            endpointslice: false,
            endpoints: false,
            mirroring: false,
        };
        for c in &self.controllers {
            match c.trim() {
                "endpointslice" => controllers.endpointslice = true,
                "endpoints" => controllers.endpoints = true,
                "mirroring" => controllers.mirroring = true,
                other => anyhow::bail!(
                    "unknown controller {other:?} (endpointslice, endpoints, mirroring)"
                ),
            }
        }
        let opts = store::Options {
            slices: reconciler::Options {
                max_endpoints_per_slice: self.max_endpoints_per_slice,
                controller_name: self.managed_by.clone(),
                ..Default::default()
            },
            mirroring: mirroring::Options {
                controller_name: self.mirroring_managed_by.clone(),
                ..Default::default()
            },
            controllers,
            garbage_collect,
            endpoints_max_capacity: None,
        };
        opts.slices.validate()?;
        Ok(opts)
    }
}

#[derive(Args)]
struct RunArgs {
    /// Local mode: read objects from the YAML files of this directory and write the
    /// managed objects back into it.
    #[arg(long)]
    manifests: Option<PathBuf>,
    #[command(flatten)]
    reconcile: ReconcileArgs,
    /// Pod changes reach their Services at most this long after the first of them
    /// (upstream's --endpoint-updates-batch-period; 0: at once). Changes of Services,
    /// slices, Endpoints and Nodes are never delayed.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    batch_period: Duration,
    /// Address of the /metrics and /healthz endpoint (loopback unless asked).
    #[arg(long, env = "SLICEWAY_METRICS_ADDR", default_value = "127.0.0.1:9090")]
    metrics_addr: SocketAddr,
    /// Lease name for leader election (API mode).
    #[arg(long, default_value = "sliceway-controller")]
    lease_name: String,
    /// Lease namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,
    /// This replica's identity in the Lease (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Run without leader election (a single replica only).
    #[arg(long)]
    no_leader_election: bool,
    /// Field manager name of writes.
    #[arg(long, default_value = "sliceway-controller")]
    field_manager: String,
}

#[derive(Args)]
struct PlanArgs {
    /// The manifest directory.
    #[arg(long)]
    manifests: PathBuf,
    #[command(flatten)]
    reconcile: ReconcileArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Json)]
    output: Format,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Prints to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

// Every watch event and write allocates and frees thousands of small objects (JSON
// decoding, TLS records); profiled at cluster scale, glibc's allocator took about a
// quarter of the controller's CPU per Pod change (most of it consolidating bins).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    // API mode on one thread: its work is a stream of small steps (watch events,
    // reconciles, writes), and handing each between threads (futex and eventfd
    // wake-ups, profiled at about a sixth of the CPU per Pod change) cost more than
    // the steps. Local mode keeps worker threads, so /healthz answers while a large
    // directory is read.
    let api_mode = matches!(&cli.command, Command::Run(args) if args.manifests.is_none());
    let runtime = if api_mode {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Plan(args) => {
            let opts = args.reconcile.options(true)?;
            let mut state = store::State::default();
            let (plan, loaded, _) = controller::local::plan_dir(&args.manifests, &opts, &mut state)
                .with_context(|| format!("reading {}", args.manifests.display()))?;
            for r in &loaded.rejected {
                eprintln!("skipped {}: {}", r.path.display(), r.reason);
            }
            let text = match args.output {
                Format::Json => format!("{}\n", plan.to_json_with_skipped(&loaded.rejected)?),
                Format::Table => {
                    let mut text = plan.to_table();
                    for r in &loaded.rejected {
                        text.push_str(&format!("skipped: {}: {}\n", r.path.display(), r.reason));
                    }
                    text
                }
            };
            print_out(&text)?;
        }
        Command::Run(args) => {
            let opts = args.reconcile.options(args.manifests.is_some())?;
            let metrics = controller::metrics::Metrics::new();
            let server = tokio::spawn(controller::metrics::serve(
                args.metrics_addr,
                metrics.clone(),
            ));
            let stop = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            let result = match &args.manifests {
                Some(dir) => controller::local::run(
                    dir,
                    &opts,
                    Duration::from_millis(250),
                    Duration::from_secs(5),
                    Some(&metrics),
                    stop,
                )
                .await
                .map_err(anyhow::Error::from),
                None => run_api(&args, opts, metrics).await,
            };
            server.abort();
            result?;
        }
    }
    Ok(())
}

async fn run_api(
    args: &RunArgs,
    opts: store::Options,
    metrics: controller::metrics::Metrics,
) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
    let health = metrics.health.clone();
    let run = controller::controller::run(
        client.clone(),
        opts,
        metrics,
        args.field_manager.clone(),
        args.batch_period,
    );
    if args.no_leader_election {
        return run.await.map_err(Into::into);
    }
    let identity = match &args.identity {
        Some(i) => i.clone(),
        None => std::env::var("HOSTNAME").unwrap_or_else(|_| "sliceway-controller".into()),
    };
    let lock = controller::leader::LeaseLock::new(
        kube::Api::namespaced(client, &args.lease_namespace),
        &args.lease_name,
        &identity,
        Duration::from_secs(15),
    )
    .with_health(health);
    tracing::info!(%identity, lease = %args.lease_name, "waiting for leadership");
    lock.acquire().await?;
    tracing::info!("leading");
    tokio::select! {
        r = run => {
            // Stopped by a signal (or failed): hand the Lease over at once.
            if let Err(e) = lock.release().await {
                tracing::warn!(error = %e, "releasing the lease failed; it expires instead");
            } else {
                tracing::info!("released the lease");
            }
            r.map_err(Into::into)
        }
        r = lock.keep() => {
            // Stop at once: another replica may already be writing.
            r?;
            anyhow::bail!("lost the lease")
        }
    }
}

//! The `sliceway-controller` binary: `run` (against an API server or a manifest
//! directory) and `plan`.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;

use controller::cli::{Cli, Command, Format, RunArgs};
use controller::store;

/// Prints to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Logs to stderr as `--logging-format` and `-v` say (`conventions::logging`).
fn init_tracing(log: &conventions::logging::LogArgs) {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};
    tracing_subscriber::registry()
        .with(log.filter())
        .with(log.layer())
        .init();
}

// Every watch event and write allocates and frees thousands of small objects (JSON
// decoding, TLS records); profiled at cluster scale, glibc's allocator took about a
// quarter of the controller's CPU per Pod change (most of it consolidating bins).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Generate(generate) = &cli.command {
        use clap::CommandFactory as _;
        conventions::clidoc::run(generate, Cli::command())?;
        return Ok(());
    }
    init_tracing(&cli.log);
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
        Command::Generate(_) => unreachable!("answered before the runtime starts"),
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
            let mut terminate = terminate_signal()?;
            let stop = async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
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

/// SIGTERM, as the kubelet sends it to stop a container.
fn terminate_signal() -> anyhow::Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")
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
    // SIGTERM (a rolling update, a drain) is heard from here on, so the Lease is
    // released before the process goes, whatever the Controller is doing.
    let mut terminate = terminate_signal()?;
    tracing::info!(%identity, lease = %args.lease_name, "waiting for leadership");
    tokio::select! {
        r = lock.acquire() => r?,
        _ = terminate.recv() => {
            tracing::info!("stopped by SIGTERM before leading");
            return Ok(());
        }
    }
    tracing::info!("leading");
    let stopped = tokio::select! {
        _ = terminate.recv() => {
            tracing::info!("stopped by SIGTERM");
            Ok(())
        }
        // Stopped by a signal, or failed.
        r = run => r.map_err(Into::into),
        r = lock.keep() => {
            // Stop at once: another replica may already be writing.
            r?;
            anyhow::bail!("lost the lease")
        }
    };
    // Hand the Lease over at once: the next replica need not wait for it to expire.
    if let Err(e) = lock.release().await {
        tracing::warn!(error = %e, "releasing the lease failed; it expires instead");
    } else {
        tracing::info!("released the lease");
    }
    stopped
}

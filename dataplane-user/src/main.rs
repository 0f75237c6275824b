//! `sliceway-agent`: the node agent's command line.

use std::time::Duration;

use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _};

use dataplane_common::{PROTO_SCTP, PROTO_TCP, PROTO_UDP};
use sliceway_agent::{
    agent,
    cmd::cli::{Cli, Command, From, Output, Proto},
    cmd::config,
    cmd::inspect,
    compiler, kernel,
    kernel::interfaces,
    kernel::Capacities,
    kernel::PinDir,
    source::local::ManifestDir,
    writer::Limits,
};

/// One glibc malloc arena for the whole process. The agent reads a manifest
/// directory on a blocking thread and compiles on its loop's thread; with an arena
/// per thread, what reading freed in one could not hold what compiling built in the
/// other (at 10,000 Services of 10 endpoints, 17 MB of the peak resident set). The
/// agent's threads seldom allocate at the same time, so they do not wait on each
/// other for it. (mimalloc, which the controller uses, was measured too: its peak was
/// higher.)
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: `mallopt` only sets a parameter of the allocator; called before any
    // thread is started.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() -> anyhow::Result<()> {
    one_malloc_arena();
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `run --config FILE` before logging starts: the file may set its format and
    // level. A flag given (before or after `run`) wins over the file.
    let config_warnings = match (&mut cli.command, matches.subcommand()) {
        (Command::Run(run), Some((_, run_matches))) => {
            let config = run.config.clone();
            let warnings = config::load(run, &mut cli.log, |id| {
                config::given(&matches, id) || config::given(run_matches, id)
            })?;
            config.map(|path| (path, warnings))
        }
        _ => None,
    };
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};
    tracing_subscriber::registry()
        .with(cli.log.filter())
        .with(cli.log.layer())
        .with(sliceway_agent::serve::metrics::LogCounter)
        .init();
    if let Some((path, warnings)) = config_warnings {
        for w in &warnings {
            tracing::warn!(config = %path.display(), "{w}");
        }
        tracing::info!(config = %path.display(), not_honoured = warnings.len(), "read the kube-proxy configuration file");
    }
    match cli.command {
        Command::Run(args) => {
            let args = *args;
            let local = args.local_detection().map_err(anyhow::Error::msg)?;
            for note in &local.notes {
                tracing::warn!("{note}");
            }
            let (healthz_addr, metrics_addr) = (args.healthz_addr(), args.metrics_addr());
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
                        client: kube_client(args.kubeconfig.as_deref(), &args.apiserver).await?,
                        batch: Duration::from_millis(args.batch_delay_ms),
                    },
                };
                let pod_interfaces = match &local.interfaces {
                    Some(pattern) => vec![pattern.clone()],
                    None => args.interfaces.clone(),
                };
                let settings = agent::Settings {
                    source,
                    interfaces: interfaces::Selection::parse(&pod_interfaces)?
                        .with_external(&args.external_interfaces)?,
                    masquerade_all: local.masquerade_all,
                    local_cidrs: local.local_cidrs,
                    local_from_node: local.from_node,
                    snat_ports: args.snat_ports,
                    interface_scan: Duration::from_millis(args.interface_scan_interval_ms),
                    compiler: compiler::Options {
                        node_name: args.node,
                        proxy_name: args.service_proxy_name,
                        zone: None,
                        node_port_addresses: args.nodeport_addresses,
                        node_port_ips: Vec::new(),
                        node_ip: None,
                        node_port_ips6: Vec::new(),
                        node_ip6: None,
                        maglev: args.maglev.table_size(),
                        dsr: args.external.dsr(),
                    },
                    capacities: Capacities {
                        limits: Limits {
                            services: args.max_services,
                            backends: args.max_backends,
                            slots: args.max_slots,
                        },
                        limits6: sliceway_agent::writer::Limits6 {
                            services: args.max_services6,
                            backends: args.max_backends6,
                        },
                        conntrack: args.max_conntrack,
                        flow_counters: !args.no_flow_counters,
                        socket_lb_pods: args.socket_lb_pods,
                    },
                    pins: (!args.no_pin).then(|| PinDir::new(args.bpffs_dir)),
                    attach: args.attach,
                    xdp: args.xdp,
                    xdp_forward: args.xdp_forward,
                    socket_lb: (!args.no_socket_lb).then_some(args.socket_lb_cgroup),
                    healthz_addr,
                    metrics_addr,
                    audit_on_non_loopback: args.audit_on_non_loopback,
                    netfilter: sliceway_agent::kernel::netfilter::Conntrack {
                        max_per_core: args.conntrack_max_per_core,
                        min: args.conntrack_min,
                        tcp_established: args.conntrack_tcp_timeout_established,
                        tcp_close_wait: args.conntrack_tcp_timeout_close_wait,
                        tcp_be_liberal: args.conntrack_tcp_be_liberal,
                        udp: args.conntrack_udp_timeout,
                        udp_stream: args.conntrack_udp_timeout_stream,
                    },
                    conntrack: sliceway_agent::writer::conntrack::Settings {
                        timeouts: sliceway_agent::writer::conntrack::Timeouts::parse(
                            &args.conntrack_timeout,
                        )
                        .map_err(anyhow::Error::msg)?,
                        sweep_interval: Duration::from_millis(args.conntrack_sweep_interval_ms),
                        sweep_batch: args.conntrack_sweep_batch as usize,
                    },
                    health_timeout: Duration::from_secs(args.healthz_timeout_seconds),
                    counters_interval: Duration::from_millis(args.counters_interval_ms),
                    backend_metrics: !args.no_backend_metrics,
                    audit_interval: (args.audit_interval_seconds > 0)
                        .then(|| Duration::from_secs(args.audit_interval_seconds)),
                };
                agent::run(settings, shutdown_signal()).await?;
                anyhow::Ok(())
            })
        }
        Command::List {
            bpffs_dir,
            service,
            output,
        } => {
            let listing = inspect::list(&PinDir::new(bpffs_dir), service.as_deref())?;
            match output {
                Output::Table => print!("{}", inspect::render_table(&listing)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&listing)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&listing)?),
            }
            Ok(())
        }
        Command::Top {
            bpffs_dir,
            interval_ms,
            iterations,
            rows,
        } => {
            use std::io::IsTerminal as _;
            let stdout = std::io::stdout();
            let terminal = stdout.is_terminal();
            sliceway_agent::cmd::top::run(
                &PinDir::new(bpffs_dir),
                Duration::from_millis(interval_ms),
                iterations,
                rows,
                &mut stdout.lock(),
                terminal,
            )?;
            Ok(())
        }
        Command::Audit {
            metrics_bind_address,
            output,
        } => {
            let report = sliceway_agent::writer::audit::ask(metrics_bind_address)?;
            match output {
                Output::Table => print!("{}", sliceway_agent::writer::audit::render_table(&report)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&report)?),
            }
            Ok(())
        }
        Command::Conntrack {
            bpffs_dir,
            service,
            flush_backend,
            output,
        } => {
            let pins = PinDir::new(bpffs_dir);
            if let Some(backend) = flush_backend {
                let n = sliceway_agent::cmd::flows::flush_backend(&pins, backend)?;
                println!("removed {n} connections to {backend}");
                return Ok(());
            }
            let flows = sliceway_agent::cmd::flows::flows(
                &pins,
                service.as_deref(),
                sliceway_agent::writer::conntrack::now_ns(),
            )?;
            match output {
                Output::Table => print!("{}", sliceway_agent::cmd::flows::render_table(&flows)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&flows)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&flows)?),
            }
            Ok(())
        }
        Command::Trace(args) => {
            let (src, dst) = inspect::endpoints(args.src, args.dst)?;
            let proto = match args.proto {
                Proto::Tcp => PROTO_TCP,
                Proto::Udp => PROTO_UDP,
                Proto::Sctp => PROTO_SCTP,
            };
            let trace = match &args.manifests {
                Some(dir) => {
                    // The same source and compiler as `run`: the local source hands
                    // the directory (the Node's zone and address included) to the
                    // incremental compiler, whose first sync fills the maps.
                    let mut compiler = compiler::Incremental::new(compiler::Options {
                        node_name: args.node.clone(),
                        proxy_name: args.service_proxy_name,
                        maglev: args.maglev.table_size(),
                        dsr: args.external.dsr(),
                        ..Default::default()
                    });
                    let mut manifests = ManifestDir::new(dir, args.node);
                    manifests.rescan(&mut compiler).with_context(|| {
                        format!("reading the manifest directory {}", dir.display())
                    })?;
                    let problems = manifests.problems();
                    for p in &problems {
                        tracing::warn!(file = %p.file.display(), "{}", p.reason);
                    }
                    // What the reader refused first, then what the compiler did.
                    let mut trace = inspect::trace(compiler, src, dst, proto, args.from)?;
                    let mut skipped: Vec<_> = problems
                        .iter()
                        .map(inspect::TraceSkipped::of_problem)
                        .collect();
                    skipped.append(&mut trace.skipped);
                    trace.skipped = skipped;
                    trace
                }
                None => {
                    let mut dp = inspect::live_datapath(&PinDir::new(&args.bpffs_dir))?;
                    match args.from {
                        From::Host => inspect::host_trace(&dp, dst, proto)?,
                        From::Pod => inspect::run_trace(&dp, kernel::Role::Pods, src, dst, proto)?,
                        From::PodSocket => inspect::pod_socket_trace(&dp, src, dst, proto)?,
                        From::External => {
                            inspect::run_trace(&dp, kernel::Role::External, src, dst, proto)?
                        }
                        From::ExternalXdp => inspect::run_trace_xdp(&mut dp, src, dst, proto)?,
                    }
                }
            };
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&trace)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&trace)?),
                Output::Table => {
                    println!(
                        "verdict {} ({}); service {}; backend {}; candidates [{}]; snat {}; program {}",
                        trace.verdict,
                        trace.reason,
                        trace.service.as_deref().unwrap_or("-"),
                        trace.backend.as_deref().unwrap_or("-"),
                        trace.candidates.join(", "),
                        trace.snat.as_deref().unwrap_or("-"),
                        trace.program.as_deref().unwrap_or("-")
                    );
                    for s in &trace.skipped {
                        match &s.file {
                            // The reader's reason already names the document and field.
                            Some(file) => println!("skipped: {file}: {}", s.reason),
                            None => println!("skipped: {}: {}", s.object, s.reason),
                        }
                    }
                }
            }
            Ok(())
        }
        Command::Check { output } => {
            let check = kernel::check()?;
            match output {
                Output::Table => print!("{}", kernel::render_check(&check)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&check)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&check)?),
            }
            if let Some(msg) = kernel::requirements::refusal(&check.requirements) {
                anyhow::bail!("{msg}");
            }
            if !check.ok() {
                anyhow::bail!("this kernel refuses a program (its verifier's log above)");
            }
            Ok(())
        }
        Command::Generate(generate) => {
            conventions::clidoc::run(&generate, Cli::command())?;
            Ok(())
        }
        Command::Cleanup { bpffs_dir, all } => {
            let report = match all {
                true => kernel::cleanup_all(&bpffs_dir),
                false => kernel::cleanup(&bpffs_dir),
            }
            .with_context(|| format!("cleaning up under {}", bpffs_dir.display()))?;
            for line in &report.removed {
                println!("{line}");
            }
            for line in &report.left {
                println!("{line}");
            }
            if report.nothing() {
                println!(
                    "nothing to clean up: no sliceway TC filter on this network namespace's \
                     interfaces and nothing under {}{}",
                    bpffs_dir.display(),
                    if all { " (already clean)" } else { "" }
                );
            }
            Ok(())
        }
    }
}

/// A client for the API server: from `--kubeconfig`, or inferred (in-cluster service
/// account, then KUBECONFIG / ~/.kube/config); with `--apiserver`, at those
/// addresses in turn, with the credentials of the kubeconfig or of the service
/// account.
async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    apiservers: &[String],
) -> anyhow::Result<kube::Client> {
    use sliceway_agent::source::apiserver;
    let endpoints = apiserver::parse_list(apiservers).map_err(anyhow::Error::msg)?;
    if !endpoints.is_empty() && kubeconfig.is_none() {
        // The service account's token and CA; the address is ours.
        let config = match kube::Config::incluster_dns() {
            Ok(config) => config,
            Err(e) => kube::Config::infer().await.map_err(|inferred| {
                anyhow::anyhow!("--apiserver: no credentials (no service account: {e}; {inferred}); pass --kubeconfig")
            })?,
        };
        tracing::info!(apiservers = %apiservers.join(","), "the API server at these addresses, in turn");
        return apiserver::client(config, endpoints);
    }
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
    if !endpoints.is_empty() {
        tracing::info!(apiservers = %apiservers.join(","), "the API server at these addresses, in turn (--apiserver overrides the kubeconfig's server)");
        return apiserver::client(config, endpoints);
    }
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

//! `sliceway-bench`: runs the benchmarks (see the `sliceway_bench` library), writes
//! `report.md`, `report.json` and PNG plots into `--out`, and prints the report;
//! `sliceway-bench scale` measures the controller's CPU per Pod change on a cluster
//! lab filled with many Services and Pods. `cargo xtask bench` builds and runs it.
//! Needs root (BPF, network namespaces).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use sliceway_bench::{self as bench, Config, Mode};

#[derive(Parser)]
#[command(
    name = "sliceway-bench",
    about = "sliceway vs kube-proxy's iptables and nftables rules"
)]
struct Cli {
    /// A run of a few minutes.
    #[arg(long, conflicts_with = "smoke")]
    quick: bool,
    /// Tiny sizes, for the smoke test: checks the harness, measures nothing useful.
    #[arg(long)]
    smoke: bool,
    /// Only these figures (1 to 7), e.g. `--only 1,3`; the others are reported as
    /// not selected.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(1..=7))]
    only: Vec<u8>,
    /// Figure 2's Service counts instead of the mode's, e.g. `--fig2-sizes 100000`.
    #[arg(long, value_delimiter = ',')]
    fig2_sizes: Vec<usize>,
    /// Seconds after which figure 2 kills a baseline's load instead of the mode's (the
    /// quick run's 120, the full run's 900), e.g. to let iptables load 100,000
    /// Services in a quick run.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    fig2_load_limit_s: Option<u64>,
    /// Figure 4's Service counts instead of the mode's, e.g. `--fig4-sizes 100000`.
    #[arg(long, value_delimiter = ',')]
    fig4_sizes: Vec<usize>,
    /// Figure 7's rounds instead of the mode's (the full run's 5 at 10,000 Services
    /// take about an hour on 2 cores: kube-proxy's iptables side alone about 5 minutes
    /// a round).
    #[arg(long)]
    fig7_rounds: Option<usize>,
    /// Figure 7's Service count instead of the mode's (its targets are checked at
    /// 10,000 only).
    #[arg(long)]
    fig7_services: Option<usize>,
    /// Figure 7's time per offered rate in milliseconds instead of the mode's (the
    /// full run's 3,000, the quick run's 500).
    #[arg(long, value_parser = clap::value_parser!(u64).range(100..))]
    fig7_rate_step_ms: Option<u64>,
    /// Leave the cores' idle states alone: by default the run holds
    /// /dev/cpu_dma_latency at 0 µs, so idle cores poll instead of halting and a
    /// wake-up does not wait for a core to come back (see the report's header).
    #[arg(long)]
    idle_states: bool,
    /// Where the report and plots go (and, for `scale`, the cluster's state).
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Also copy report.md and report.json into DIR/<YYYY-MM-DD>-<short commit>[-quick]/
    /// (`cargo xtask bench` passes bench/results), to be committed.
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure sliceway-controller's (or kube-controller-manager's, `--controller`) CPU per Pod change on a control plane filled with
    /// SERVICES Services of PODS_PER_SERVICE ready Pods each (a cluster of its own,
    /// under `--out`/scale, taken down after). Needs the upstream kit and
    /// sliceway-controller built beside this binary (`cargo xtask bench scale` does both).
    Scale {
        #[arg(long, default_value_t = 10_000)]
        services: usize,
        #[arg(long, default_value_t = 10)]
        pods_per_service: usize,
        #[arg(long, default_value_t = 100)]
        nodes: usize,
        #[arg(long, default_value_t = 200)]
        changes: usize,
        /// Record the controller with `perf record --call-graph dwarf` into FILE while the changes run
        /// (needs Debian's linux-perf; read it with `perf report -i FILE`).
        #[arg(long)]
        profile: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The controller measured; kube-controller-manager runs only its endpoints,
        /// endpointslice and endpointslice-mirroring controllers.
        #[arg(long, value_enum, default_value = "sliceway")]
        controller: bench::controller::api::Side,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        bail!("sliceway-bench needs root (BPF programs, network namespaces)");
    }
    if let Some(Cmd::Scale {
        services,
        pods_per_service,
        nodes,
        changes,
        profile,
        json,
        controller,
    }) = cli.command
    {
        let spec = bench::scale::ScaleSpec {
            services,
            pods_per_service,
            nodes,
            changes,
            profile,
            controller,
        };
        let prefix = format!(
            "{}-{}-scale",
            sliceway_lab::cluster::NS_PREFIX,
            std::process::id()
        );
        let r = bench::scale::run(&spec, &cli.out.join("scale"), &prefix)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            print!("{}", r.table());
        }
        return Ok(());
    }
    let mode = match (cli.smoke, cli.quick) {
        (true, _) => Mode::Smoke,
        (false, true) => Mode::Quick,
        (false, false) => Mode::Full,
    };
    let mut config = Config::new(mode);
    if !cli.only.is_empty() {
        config.figures = cli.only;
    }
    if !cli.fig2_sizes.is_empty() {
        config.fig2_sizes = cli.fig2_sizes;
    }
    if let Some(s) = cli.fig2_load_limit_s {
        config.fig2_load_limit_s = s;
    }
    if !cli.fig4_sizes.is_empty() {
        config.fig4_sizes = cli.fig4_sizes;
    }
    if let Some(rounds) = cli.fig7_rounds {
        config.fig7_rounds = rounds.max(1);
    }
    if let Some(services) = cli.fig7_services {
        config.fig7_services = services.max(1);
    }
    if let Some(ms) = cli.fig7_rate_step_ms {
        config.fig7_rate_step_ms = ms;
    }
    config.keep_cores_awake = !cli.idle_states;
    let report = bench::run(&config, &cli.out)?;
    print!(
        "{}",
        std::fs::read_to_string(cli.out.join("report.md")).unwrap_or_default()
    );
    println!(
        "\nWritten: {}/report.md, report.json and the plots.",
        cli.out.display()
    );
    if let Some(results) = &cli.results {
        if let Some(dir) =
            bench::results::save(results, &cli.out, &report.environment, config.mode)?
        {
            println!(
                "Copied report.md and report.json into {} (commit them).",
                dir.display()
            );
        }
    }
    if !report.complete() {
        bail!("some figures could not be measured (see the report)");
    }
    Ok(())
}

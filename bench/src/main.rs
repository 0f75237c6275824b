//! `sliceway-bench`: runs the benchmarks (see the `sliceway_bench` library), writes
//! `report.md`, `report.json` and PNG plots into `--out`, and prints the report.
//! `cargo xtask bench` builds and runs it. Needs root (BPF, network namespaces).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Parser;
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
    /// Only these figures (1 to 5), e.g. `--only 1,3`; the others are reported as
    /// not selected.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(1..=5))]
    only: Vec<u8>,
    /// Where the report and plots go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        bail!("sliceway-bench needs root (BPF programs, network namespaces)");
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
    let report = bench::run(&config, &cli.out)?;
    print!(
        "{}",
        std::fs::read_to_string(cli.out.join("report.md")).unwrap_or_default()
    );
    println!(
        "\nWritten: {}/report.md, report.json and the plots.",
        cli.out.display()
    );
    if !report.complete() {
        bail!("some figures could not be measured (see the report)");
    }
    Ok(())
}

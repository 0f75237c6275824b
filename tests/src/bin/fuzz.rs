//! `sliceway-fuzz` (`cargo xtask fuzz`): the differential fuzzer of the TC program
//! against the reference model, for long runs. Prints progress, the exits seen by
//! reason, the mismatches and the first one as a test to paste. Needs root.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "sliceway-fuzz",
    about = "TC program against the reference model"
)]
struct Args {
    /// Packets to run.
    #[arg(long, default_value_t = 1_000_000)]
    packets: u64,
    /// Seed of the random maps and packets (a run is repeatable by its seed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Packets per episode (a random set of Services, empty tables at its start).
    #[arg(long, default_value_t = 400)]
    episode: u64,
    /// Print every packet with its exit reason.
    #[arg(long)]
    verbose: bool,
    /// Stop at the first mismatch.
    #[arg(long)]
    stop_at_first: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = sliceway_lab::fuzz::Config {
        packets: args.packets,
        seed: args.seed,
        episode: args.episode.max(1),
        verbose: args.verbose,
        stop_at_first: args.stop_at_first,
    };
    let report = sliceway_lab::fuzz::run(&config, |r| {
        eprintln!(
            "{} packets, {} mismatches, {:.0?}",
            r.packets, r.mismatches, r.elapsed
        )
    })?;
    print!("{report}");
    if report.mismatches > 0 {
        std::process::exit(1);
    }
    Ok(())
}

//! `cargo xtask bench`: set up, build the kernel object and the release binaries, then
//! run `sliceway-bench`, which writes `target/bench/report.md`, `report.json` and the
//! plots, copies the two reports into `bench/results/<date>-<commit>[-quick]/` to be
//! committed, and prints the report. `cargo xtask bench scale ...` (also reached as
//! `cargo xtask cluster scale ...`) runs `sliceway-bench scale`, on the cluster lab
//! with upstream's kit and the release controller.

use std::process::Command;

use anyhow::Result;

use super::{build_ebpf, cargo, require_root, run, setup, upstream};

/// Runs `sliceway-bench scale ARGS` (release build of it and of the controller).
pub fn scale(root: &std::path::Path, args: &[String]) -> Result<()> {
    require_root("the cluster lab (network namespaces)")?;
    setup(root)?;
    build_ebpf()?;
    upstream(root)?;
    run(cargo().args([
        "build",
        "--release",
        "--bins",
        "--package",
        "controller",
        "--package",
        "bench",
    ]))?;
    run(Command::new(root.join("target/release/sliceway-bench"))
        .arg("--out")
        .arg(root.join("target/bench"))
        .arg("scale")
        .args(args))
}

/// Runs the benchmarks; `quick` for a run of a few minutes, `only` to pick figures,
/// `extra` flags passed to `sliceway-bench` as they are.
pub fn bench(
    root: &std::path::Path,
    quick: bool,
    only: Option<&str>,
    extra: &[String],
) -> Result<()> {
    require_root("the benchmarks (BPF programs, network namespaces)")?;
    setup(root)?;
    build_ebpf()?;
    // Figures 5 and 7 run upstream's kit: built here, with the rest, so that a first
    // run's figures are not timed beside a build of Kubernetes.
    // An `--only` written after sliceway-bench's own flags reaches it among `extra`;
    // then that one alone selects the figures (and is the only one passed).
    let passed = flag_in(extra, "--only");
    let only = passed.or(only);
    let selected = |n: &str| only.is_none_or(|o| o.split(',').any(|f| f.trim() == n));
    if selected("5") || selected("7") {
        upstream(root)?;
    }
    run(cargo().args([
        "build",
        "--release",
        "--bins",
        "--package",
        "dataplane-user",
        // Figure 5 starts the release sliceway-controller beside kube-controller-manager.
        "--package",
        "controller",
        "--package",
        "bench",
        // Figure 7's cluster lab runs the lab's kubelet stand-in beside the bench.
        "--package",
        "tests",
    ]))?;
    let mut cmd = Command::new(root.join("target/release/sliceway-bench"));
    // An `--out` among `extra` is the one passed (sliceway-bench takes one).
    if flag_in(extra, "--out").is_none() {
        cmd.arg("--out").arg(root.join("target/bench"));
    }
    // The committed copy of the report (bench/results/<date>-<commit>[-quick]/),
    // unless the flags say where.
    if flag_in(extra, "--results").is_none() {
        cmd.arg("--results").arg(root.join("bench/results"));
    }
    if quick {
        cmd.arg("--quick");
    }
    if let Some(only) = only.filter(|_| passed.is_none()) {
        cmd.arg("--only").arg(only);
    }
    run(cmd.args(extra))
}

/// The value of `flag` (`--only N,..` or `--only=N,..`) among `extra`.
fn flag_in<'a>(extra: &'a [String], flag: &str) -> Option<&'a str> {
    extra.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            extra.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(flag)?.strip_prefix('=')
        }
    })
}

#[cfg(test)]
mod tests {
    use super::flag_in;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_flag_among_the_bench_flags_is_found_in_either_spelling() {
        let only = |a: &[&str]| flag_in(&args(a), "--only").map(str::to_owned);
        assert_eq!(
            only(&["--fig7-rounds", "1", "--only", "1,2"]),
            Some("1,2".into())
        );
        assert_eq!(only(&["--fig2-sizes", "100", "--only=6"]), Some("6".into()));
        assert_eq!(only(&["--fig7-rounds", "1"]), None);
        assert_eq!(only(&["--only"]), None);
        // A longer flag that starts with the name is not it.
        assert_eq!(only(&["--only-not=3"]), None);
        assert_eq!(
            flag_in(&args(&["--only", "7", "--out", "target/b7"]), "--out"),
            Some("target/b7")
        );
    }
}

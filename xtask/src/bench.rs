//! `cargo xtask bench`: set up, build the kernel object and the release binaries, then
//! run `sliceway-bench`, which writes `target/bench/report.md`, `report.json` and the
//! plots, and prints the report. `cargo xtask bench scale ...` (also reached as
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
    cmd.arg("--out").arg(root.join("target/bench"));
    if quick {
        cmd.arg("--quick");
    }
    if let Some(only) = only {
        cmd.arg("--only").arg(only);
    }
    run(cmd.args(extra))
}

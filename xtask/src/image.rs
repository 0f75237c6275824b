//! `cargo xtask image`: sliceway's two images, the agent's (the DaemonSet's) and the
//! controller's (the Deployment's), as docker-archive tarballs under the names deploy/
//! uses, without a container engine: the binaries built here with pinned toolchains,
//! the archives written by `scripts/image.sh` on a Debian base.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

/// The stable toolchain the images' binaries are built with. The kernel object inside
/// the agent is built with the dated nightly of `ebpf-toolchain`.
pub const RUST: &str = "1.95.0";

/// The tag of both images: the one deploy/'s manifests ask for.
pub const DEFAULT_TAG: &str = "dev";

/// Builds the release binaries with [`RUST`] into `target/image` and writes
/// `out/sliceway-agent.tar` and `out/sliceway-controller.tar`, tagged `tag`.
pub fn build(root: &Path, out: &Path, tag: &str) -> Result<Vec<PathBuf>> {
    ensure_toolchain()?;
    let target = root.join("target/image");
    super::run(
        super::toolchain_cargo(RUST)
            .args(["build", "--release", "--locked"])
            .args(["--package", "dataplane-user", "--bin", "sliceway-agent"])
            .args(["--package", "controller", "--bin", "sliceway-controller"])
            .env("CARGO_TARGET_DIR", &target),
    )?;
    let release = target.join("release");
    super::run(
        Command::new("bash")
            .arg(root.join("scripts/image.sh"))
            .arg(out)
            .arg(tag)
            .arg(release.join("sliceway-agent"))
            .arg(release.join("sliceway-controller")),
    )?;
    Ok(["sliceway-agent", "sliceway-controller"]
        .iter()
        .map(|name| out.join(format!("{name}.tar")))
        .collect())
}

/// Installs [`RUST`] with rustup when it is missing (a minimal profile, about a minute).
fn ensure_toolchain() -> Result<()> {
    let list = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .context("running rustup toolchain list (the images are built with rustup's toolchains)")?;
    let listed = String::from_utf8_lossy(&list.stdout)
        .lines()
        .any(|l| l.starts_with(&format!("{RUST}-")));
    if !listed {
        eprintln!("image: installing the toolchain {RUST} (about a minute)");
        super::run(Command::new("rustup").args([
            "toolchain",
            "install",
            RUST,
            "--profile",
            "minimal",
        ]))?;
    }
    Ok(())
}

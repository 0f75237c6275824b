//! The previous layout's agent, built from the repository's own history for the
//! upgrade test (`tests/tests/upgrade_lab.rs`): the last commit with pinned layout
//! v1, extracted with `git archive` into `target/v1-agent/<commit>/src` and built
//! there with its own lock file and build script (which builds its kernel object, the
//! command its `cargo xtask build-ebpf` runs). Cached by commit: a second run builds
//! nothing.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

/// The last commit whose agent pins layout v1: the parent of the commit that made
/// conntrack two paired entries (layout v2).
pub const V1_COMMIT: &str = "7b6723636f5dfe320da5c5ffc4b6c4d5842a6494";

/// Builds (once) and returns the v1 agent binary.
pub fn build(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/v1-agent").join(V1_COMMIT);
    let src = dir.join("src");
    let bin = src.join("target/debug/sliceway-agent");
    let stamp = dir.join("built");
    if stamp.is_file() && bin.is_file() {
        eprintln!("v1 agent: cached at {}", bin.display());
        return Ok(bin);
    }
    require_commit(root)?;
    let started = Instant::now();
    eprintln!(
        "v1 agent: extracting commit {} into {}",
        &V1_COMMIT[..12],
        src.display()
    );
    if src.exists() {
        // A half-made tree of an interrupted run: its build cache is kept by cargo
        // under src/target, so only the sources are extracted again.
        for entry in std::fs::read_dir(&src)? {
            let path = entry?.path();
            if path.file_name().is_some_and(|n| n != "target") {
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
        }
    }
    std::fs::create_dir_all(&src)?;
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["archive", "--format=tar", V1_COMMIT])
        .stdout(Stdio::piped())
        .spawn()
        .context("running git archive")?;
    let tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&src)
        .stdin(archive.stdout.take().expect("piped"))
        .status()
        .context("running tar")?;
    let git = archive.wait()?;
    if !git.success() || !tar.success() {
        bail!("extracting commit {V1_COMMIT} failed (git archive {git}, tar {tar})");
    }
    eprintln!(
        "v1 agent: building sliceway-agent and its kernel object (a few minutes the first time)"
    );
    let object = build_object(&src)?;
    let mut cargo = Command::new("cargo");
    // The outer cargo's environment (target dir, flags, toolchain) must not reach
    // the old tree's build, which has its own lock file and toolchain choice.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO")
            || key.starts_with("RUSTC")
            || key == "RUSTUP_TOOLCHAIN"
            || key == "RUSTFLAGS"
        {
            cargo.env_remove(key);
        }
    }
    let status = cargo
        .current_dir(&src)
        .env("SLICEWAY_EBPF_OBJECT", &object)
        // A test's binary, built once: without debug info or incremental state, which
        // it does not need and which slow its build and fill the disk.
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .env("CARGO_INCREMENTAL", "0")
        .args([
            "build",
            "--locked",
            "--package",
            "dataplane-user",
            "--bin",
            "sliceway-agent",
        ])
        .status()
        .context("running cargo for the v1 agent")?;
    if !status.success() || !bin.is_file() {
        bail!(
            "building the v1 agent in {} failed ({status})",
            src.display()
        );
    }
    std::fs::write(&stamp, format!("{V1_COMMIT}\n"))?;
    eprintln!(
        "v1 agent: built in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        bin.display()
    );
    Ok(bin)
}

/// Builds the old tree's kernel object with the pinned nightly of `ebpf-toolchain`
/// (the one the set-up installs with rust-src), with the flags the old build script
/// uses. The old build script asks for an unpinned `+nightly`, which a machine set up
/// by this tree does not have; it takes a prebuilt object from `SLICEWAY_EBPF_OBJECT`.
fn build_object(src: &Path) -> Result<PathBuf> {
    let target_dir = src.join("target/ebpf");
    let status = crate::ebpf_cargo(&target_dir)
        .current_dir(src)
        .status()
        .context("running the pinned nightly's cargo for the v1 kernel object")?;
    let object = target_dir.join("bpfel-unknown-none/release/sliceway");
    if !status.success() || !object.is_file() {
        bail!(
            "building the v1 kernel object in {} with the pinned nightly failed ({status}); \
             `cargo xtask build-ebpf` installs that nightly, rust-src and bpf-linker",
            src.display()
        );
    }
    Ok(object)
}

/// Fails with a clear message when the clone lacks the v1 commit (a shallow clone).
fn require_commit(root: &Path) -> Result<()> {
    let present = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["cat-file", "-e", &format!("{V1_COMMIT}^{{commit}}")])
        .stderr(Stdio::null())
        .status()
        .context("running git cat-file")?
        .success();
    if present {
        return Ok(());
    }
    let shallow = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--is-shallow-repository"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
        .unwrap_or(false);
    if shallow {
        bail!(
            "the upgrade test builds the layout-v1 agent from commit {V1_COMMIT}, which this \
             shallow clone does not have: fetch the whole history (`git fetch --unshallow`) \
             or clone without --depth"
        );
    }
    bail!(
        "the upgrade test builds the layout-v1 agent from commit {V1_COMMIT}, which is not in \
         this repository (is it a clone of sliceway with its history?)"
    )
}

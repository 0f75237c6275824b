//! Builds the kernel object (crate `dataplane-ebpf`) and hands its path to the agent,
//! which embeds it. The same command is `cargo xtask build-ebpf`; it needs the pinned
//! nightly toolchain (the file `ebpf-toolchain` at the root) with rust-src and
//! bpf-linker, which `cargo xtask setup` installs.
use std::{env, path::PathBuf, process::Command};

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("crate lives in the workspace")
        .to_path_buf();
    for dir in ["dataplane-ebpf/src", "dataplane-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for file in [
        "dataplane-ebpf/Cargo.toml",
        "dataplane-common/Cargo.toml",
        "ebpf-toolchain",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    println!("cargo:rerun-if-env-changed=SLICEWAY_EBPF_OBJECT");

    // A prebuilt object may be handed in (packaging, cross builds).
    if let Some(obj) = env::var_os("SLICEWAY_EBPF_OBJECT") {
        println!(
            "cargo:rustc-env=SLICEWAY_EBPF_OBJECT={}",
            PathBuf::from(obj).display()
        );
        return;
    }

    let target_dir = root.join("target").join("ebpf");
    // The dated nightly the kernel crate is built with, pinned in one file: its stack
    // frames are budgeted to the byte, and a moving nightly can break them.
    let toolchain = std::fs::read_to_string(root.join("ebpf-toolchain"))
        .unwrap_or_else(|e| panic!("reading ebpf-toolchain at the workspace root: {e}"));
    let mut cmd = Command::new("cargo");
    // Start from a clean cargo environment: the outer build's variables (its rustc,
    // wrappers such as clippy's, its flags and target) must not leak into the inner one.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO")
            || key.starts_with("RUSTC")
            || key == "RUSTUP_TOOLCHAIN"
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS"
        {
            cmd.env_remove(key.as_ref());
        }
    }
    cmd.current_dir(&root)
        .arg(format!("+{}", toolchain.trim()))
        .args(["build", "--package", "dataplane-ebpf", "--release"])
        .args(["-Z", "build-std=core", "--target", "bpfel-unknown-none"])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf");
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("could not run cargo to build the kernel object ({e}); run `cargo xtask build-ebpf`, which sets up the toolchain")
    });
    if !status.success() {
        panic!(
            "building the kernel object (crate dataplane-ebpf) failed; run `cargo xtask build-ebpf`, \
             which installs the pinned nightly with rust-src and the bpf-linker it needs, and shows the error"
        );
    }
    let obj = target_dir.join("bpfel-unknown-none/release/sliceway");
    println!("cargo:rustc-env=SLICEWAY_EBPF_OBJECT={}", obj.display());
}

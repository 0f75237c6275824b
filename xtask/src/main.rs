//! `cargo xtask`: set-up, kernel object build, lint, generated references, tests and
//! the demo.
//!
//! Kept free of the project's own crates so it builds before the eBPF toolchain is
//! set up; everything else runs as cargo or the set-up script.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod bench;
mod image;
mod v1_agent;
mod vm;

#[derive(Parser)]
#[command(name = "xtask", about = "sliceway's build and test tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (idempotent; quiet when all is there).
    Setup,
    /// Build the kernel object (the nightly of `ebpf-toolchain`, bpfel-unknown-none,
    /// bpf-linker).
    BuildEbpf,
    /// fmt check and clippy with -D warnings, the eBPF crate on its own target.
    Lint,
    /// Regenerate the references under docs/reference (CLI, metrics, kernel exit
    /// reasons) from the code; `tests/tests/reference.rs` fails while they are stale.
    Docs,
    /// Everything but the real-node tests: set-up, lint, unit, program, node-lab and
    /// cluster-lab tests, then the VM tier on Debian's 6.1 kernel.
    Test,
    /// The real-node tests, a suite of their own (the node kit they run is a quarter
    /// of an hour of Go builds on a cold machine): the kit checked without a kubelet
    /// (`tests/tests/node_kit.rs`), then one real node with upstream's kubelet and
    /// containerd serving a ClusterIP to its pods (`tests/tests/real_node.rs`).
    TestReal,
    /// The program fixtures and the node-lab tests that exercise the kernel, on
    /// other kernels under qemu (`scripts/vm.sh`); results in target/vm/<kernel>.
    TestVm {
        /// debian-6.1 (Debian 12's kernel, the default), debian-bpo (the newest of
        /// bookworm-backports), or all.
        #[arg(long)]
        kernel: Option<String>,
    },
    /// Upstream's e2e suite on a 3-node cluster of real nodes in the lab: `[ARGS]`
    /// are `sliceway-cluster e2e`'s (`--proxy`, `--controller`, `--focus`, `--skip`,
    /// `--nodes`, `--procs`). Writes target/e2e/<proxy>-<controller>/ and docs/conformance.md and
    /// prints `N passed, N failed, N skipped` last. Not part of `test` (hours).
    E2e {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the kit of a real node (scripts/node-kit.sh: kubelet, agnhost, containerd,
    /// runc, crictl, the CNI plugins, CoreDNS, pause and the e2e suite's images) into
    /// the version-keyed cache; prints its bin directory. `test` builds it too (without
    /// the e2e suite).
    NodeKit {
        /// Also build upstream's e2e suite (e2e.test; long).
        #[arg(long)]
        e2e: bool,
        /// Then check the kit: one containerd in a network namespace of its own
        /// imports the images and runs agnhost in a pod (no kubelet).
        #[arg(long)]
        check: bool,
    },
    /// Build sliceway's images (the agent's and the controller's) as docker-archive
    /// tarballs that `ctr images import`, `docker load`, `podman load` and `kind load
    /// image-archive` read, tagged with the names deploy/ uses; no container engine
    /// needed. Prints the archives' paths.
    Image {
        /// Where the archives go.
        #[arg(long, default_value = "target/images")]
        out: PathBuf,
        /// The images' tag.
        #[arg(long, default_value = image::DEFAULT_TAG)]
        tag: String,
    },
    /// Build the agent of the previous pinned layout (v1) from this repository's
    /// history, for the upgrade test (cached by commit under target/v1-agent);
    /// prints its path.
    BuildV1Agent,
    /// Set up, build, and show traffic to a ClusterIP spread over three backends.
    Demo {
        /// The same on a two-node cluster lab with the real control plane, a
        /// Deployment and a Service made with kubectl.
        #[arg(long)]
        cluster: bool,
    },
    /// The cluster lab: `up [--nodes N] [--proxy sliceway|iptables|nftables|none]
    /// [--controller sliceway|upstream|none] [--kubelet stand-in|real]`, `down`, `status`,
    /// `exec NS/POD -- CMD`, `client -- CMD`, `node NODE -- CMD`, `kubectl -- ARGS`,
    /// `load-image ARCHIVE...` (real nodes); `scale ...` is `bench scale ...`.
    Cluster {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks against kube-proxy's iptables and nftables rules; writes target/bench
    /// and a copy of the report into bench/results/<date>-<commit>[-quick].
    /// `bench scale [--services N] [--pods-per-service N] [--nodes N] [--changes N]
    /// [--profile FILE] [--json] [--controller sliceway|kube-controller-manager]`: the
    /// controller's CPU per Pod change on the real API server filled with that many
    /// Services and Pods.
    Bench {
        /// A run of a few minutes instead of the full one.
        #[arg(long)]
        quick: bool,
        /// Only these figures, e.g. `--only 1,3`.
        #[arg(long)]
        only: Option<String>,
        /// `scale` and its flags, or flags for `sliceway-bench` (`--fig2-sizes N,..`,
        /// `--fig4-sizes N,..`, `--fig7-rounds N`, `--fig7-services N`,
        /// `--fig7-rate-step-ms MS`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The differential fuzzer: random maps and packets through the TC program,
    /// each result compared with the reference model.
    Fuzz {
        /// Packets to run.
        #[arg(long, default_value_t = 1_000_000)]
        packets: u64,
        /// Seed (a run is repeatable by its seed).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print every packet with its exit reason.
        #[arg(long)]
        verbose: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    env::set_current_dir(&root)?;
    match cli.task {
        Task::Setup => setup(&root),
        Task::BuildEbpf => {
            setup(&root)?;
            build_ebpf()
        }
        Task::Lint => {
            setup(&root)?;
            build_ebpf()?;
            lint()
        }
        Task::Docs => docs(),
        Task::Test => {
            setup(&root)?;
            build_ebpf()?;
            // Upstream's Go builds (a quarter of an hour on a cold machine) run beside
            // the Rust ones, whose links and single-crate tails leave a core idle.
            let upstream = Upstream::start(&root)?;
            lint()?;
            v1_agent(&root)?;
            require_root("`cargo xtask test` (program and node-lab tests)")?;
            build_lab_binaries()?;
            run(cargo().args(["test", "--workspace", "--no-run"]))?;
            upstream.finish()?;
            run(cargo().args(["test", "--workspace", "--no-fail-fast"]))?;
            vm::test_vm(&root, &vm::default_kernels())
        }
        Task::TestReal => {
            require_root("the real-node tests (network namespaces, containerd, kubelet)")?;
            setup(&root)?;
            build_ebpf()?;
            upstream(&root)?;
            let kit = node_kit(&root, false)?;
            let images = root.join("target/images");
            image::build(&root, &images, image::DEFAULT_TAG)?;
            build_lab_binaries()?;
            run(cargo()
                .args(["test", "--package", "tests"])
                .args(["--test", "node_kit", "--test", "real_node"])
                .args(["--", "--ignored", "--test-threads", "1"])
                .env("SLICEWAY_NODE_KIT_BIN", &kit)
                .env("SLICEWAY_IMAGE_DIR", &images))
        }
        Task::TestVm { kernel } => {
            let kernels = vm::parse_kernels(kernel.as_deref())?;
            setup(&root)?;
            build_ebpf()?;
            vm::test_vm(&root, &kernels)
        }
        Task::Demo { cluster } => {
            setup(&root)?;
            build_ebpf()?;
            if cluster {
                upstream(&root)?;
            }
            demo(cluster)
        }
        Task::Cluster { args } if args.first().map(String::as_str) == Some("scale") => {
            bench::scale(&root, &args[1..])
        }
        Task::Cluster { args } => {
            require_root("the cluster lab (network namespaces, BPF programs)")?;
            // Only `up` needs the set-up, the kernel object and the upstream kit;
            // the other commands act on the running lab.
            if args.first().map(String::as_str) == Some("up") {
                setup(&root)?;
                build_ebpf()?;
                upstream(&root)?;
                build_lab_binaries()?;
            }
            let mut cmd = Command::new("target/debug/sliceway-cluster");
            // Real nodes run the node kit: built (once per version) before `up`.
            if args.first().map(String::as_str) == Some("up")
                && (args.windows(2).any(|w| w == ["--kubelet", "real"])
                    || args.iter().any(|a| a == "--kubelet=real"))
            {
                cmd.env("SLICEWAY_NODE_KIT_BIN", node_kit(&root, false)?);
            }
            run(cmd.args(args))
        }
        Task::E2e { args } => {
            require_root("the e2e suite (the cluster lab of real nodes)")?;
            setup(&root)?;
            build_ebpf()?;
            upstream(&root)?;
            let kit = node_kit(&root, true)?;
            build_lab_binaries()?;
            run(Command::new("target/debug/sliceway-cluster")
                .arg("e2e")
                .args(args)
                .env("SLICEWAY_NODE_KIT_BIN", &kit)
                .env("SLICEWAY_E2E_TEST", Path::new(&kit).join("e2e.test"))
                .env("SLICEWAY_GINKGO", Path::new(&kit).join("ginkgo")))
        }
        Task::NodeKit { e2e, check } => {
            if check {
                require_root("the node kit check (network namespaces, containerd)")?;
            }
            let bin = node_kit(&root, e2e)?;
            if check {
                run(cargo()
                    .args(["test", "--package", "tests", "--test", "node_kit"])
                    .args(["--", "--ignored", "--nocapture", "--exact"])
                    .arg("node_kit_runs_agnhost_in_a_pod")
                    .env("SLICEWAY_NODE_KIT_BIN", &bin))?;
            }
            println!("{bin}");
            Ok(())
        }
        Task::Image { out, tag } => {
            require_root("the images' base (mmdebstrap makes it as root)")?;
            setup(&root)?;
            build_ebpf()?;
            for archive in image::build(&root, &out, &tag)? {
                println!("{}", archive.display());
            }
            Ok(())
        }
        Task::BuildV1Agent => {
            setup(&root)?;
            println!("{}", v1_agent::build(&root)?.display());
            Ok(())
        }
        Task::Bench { quick, only, args } => match args.split_first() {
            Some((scale, rest)) if scale == "scale" => bench::scale(&root, rest),
            // Flags of sliceway-bench's own (`--fig2-sizes`, `--fig4-sizes`,
            // `--fig7-rounds`, `--fig7-services`, `--fig7-rate-step-ms`) go to it as
            // they are.
            Some((flag, _)) if flag.starts_with("--") => {
                bench::bench(&root, quick, only.as_deref(), &args)
            }
            Some((other, _)) => bail!("unknown bench command {other:?} (only `scale`)"),
            None => bench::bench(&root, quick, only.as_deref(), &[]),
        },
        Task::Fuzz {
            packets,
            seed,
            verbose,
        } => {
            require_root("the fuzzer (BPF programs)")?;
            setup(&root)?;
            build_ebpf()?;
            build_lab_binaries()?;
            let mut cmd = Command::new("target/debug/sliceway-fuzz");
            cmd.args([
                "--packets",
                &packets.to_string(),
                "--seed",
                &seed.to_string(),
            ]);
            if verbose {
                cmd.arg("--verbose");
            }
            run(&mut cmd)
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// The dated nightly that builds and lints the kernel crate, pinned in one file
/// (`ebpf-toolchain`, also read by the set-up script and the agent's build script):
/// the kernel programs' stack frames are budgeted to the byte.
const EBPF_TOOLCHAIN: &str = include_str!("../../ebpf-toolchain");

/// The pinned nightly's cargo, with the outer cargo's environment removed.
fn nightly_cargo() -> Command {
    toolchain_cargo(EBPF_TOOLCHAIN.trim())
}

/// The cargo of rustup's `toolchain`, with the outer cargo's environment removed.
pub(crate) fn toolchain_cargo(toolchain: &str) -> Command {
    let mut cmd = Command::new("cargo");
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO") || key.starts_with("RUSTC") || key == "RUSTUP_TOOLCHAIN" {
            cmd.env_remove(key);
        }
    }
    cmd.arg(format!("+{toolchain}"));
    cmd
}

fn setup(root: &Path) -> Result<()> {
    run(Command::new("bash").arg(root.join("scripts/setup.sh")))
}

/// Builds upstream's commands for the cluster lab (once per version, cached) and
/// tells the tests where they are.
fn upstream(root: &Path) -> Result<()> {
    Upstream::start(root)?.finish()
}

/// `scripts/upstream.sh` running in the background: its progress lines go to
/// standard error as they come, its bin directory is read at [`Upstream::finish`].
/// Dropped unfinished (another step failed), it is stopped.
struct Upstream(Option<std::process::Child>);

impl Upstream {
    fn start(root: &Path) -> Result<Self> {
        let child = Command::new("bash")
            .arg(root.join("scripts/upstream.sh"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .context("running scripts/upstream.sh")?;
        Ok(Self(Some(child)))
    }

    /// Waits for the build and tells the commands started after where it is.
    fn finish(mut self) -> Result<()> {
        let child = self.0.take().expect("finished once");
        let out = child
            .wait_with_output()
            .context("waiting for scripts/upstream.sh")?;
        if !out.status.success() {
            bail!("scripts/upstream.sh failed ({})", out.status);
        }
        let bin = String::from_utf8(out.stdout)?.trim().to_string();
        // SAFETY: no other thread runs at this point; read by the commands started
        // after.
        unsafe { env::set_var("SLICEWAY_UPSTREAM_BIN", bin) };
        Ok(())
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            eprintln!("upstream: stopping the build (an earlier step failed)");
            // Its `go build` first, then the script (which would start the next).
            let _ = Command::new("pkill")
                .args(["-TERM", "-P", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Builds the kit of a real node (once per version, cached); its bin directory.
fn node_kit(root: &Path, e2e: bool) -> Result<String> {
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("scripts/node-kit.sh"));
    if e2e {
        cmd.arg("--e2e");
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running scripts/node-kit.sh")?;
    if !out.status.success() {
        bail!("scripts/node-kit.sh failed ({})", out.status);
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Builds the layout-v1 agent (once per commit) and tells the upgrade test where it is.
fn v1_agent(root: &Path) -> Result<()> {
    let bin = v1_agent::build(root)?;
    // SAFETY: single-threaded at this point; read by the commands started after.
    unsafe { env::set_var("SLICEWAY_V1_AGENT", bin) };
    Ok(())
}

/// Same build as the agent's build script, so the agent's build finds it up to date.
fn build_ebpf() -> Result<()> {
    run(&mut ebpf_cargo(Path::new("target/ebpf")))?;
    eprintln!("kernel object: target/ebpf/bpfel-unknown-none/release/sliceway");
    Ok(())
}

/// The kernel object's build (crate `dataplane-ebpf`, the pinned nightly, its flags)
/// into `target_dir`, run in the current directory unless the caller says otherwise:
/// this tree's and the layout-v1 tree's (`v1_agent.rs`) alike. The object is
/// `<target_dir>/bpfel-unknown-none/release/sliceway`.
pub(crate) fn ebpf_cargo(target_dir: &Path) -> Command {
    let mut cmd = nightly_cargo();
    cmd.args(["build", "--package", "dataplane-ebpf", "--release"])
        .args(["-Z", "build-std=core", "--target", "bpfel-unknown-none"])
        .env("CARGO_TARGET_DIR", target_dir)
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf");
    cmd
}

fn lint() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(nightly_cargo()
        .args(["clippy", "--package", "dataplane-ebpf", "--release"])
        .args(["-Z", "build-std=core", "--target", "bpfel-unknown-none"])
        .env("CARGO_TARGET_DIR", "target/ebpf")
        .args(["--", "-D", "warnings"]))
}

/// Renders docs/reference from the code: the reference tests of the `tests` crate,
/// told to write the files instead of comparing them (they need no root, no kernel
/// object and no set-up).
fn docs() -> Result<()> {
    run(cargo()
        .args(["test", "--package", "tests", "--test", "reference"])
        .env("SLICEWAY_WRITE_REFERENCE", "1"))?;
    eprintln!("docs/reference: cli.md, metrics.md and exit-reasons.md written; commit them");
    Ok(())
}

fn require_root(what: &str) -> Result<()> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        bail!("{what} needs root (BPF programs, network namespaces): run it as root");
    }
    Ok(())
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

/// The binaries the node-lab tests, the benchmarks' smoke test and the demo start
/// (debug build).
fn build_lab_binaries() -> Result<()> {
    run(cargo().args([
        "build",
        "--bins",
        "--package",
        "dataplane-user",
        "--package",
        "controller",
        "--package",
        "tests",
        "--package",
        "bench",
    ]))
}

fn demo(cluster: bool) -> Result<()> {
    require_root("the demo (it attaches BPF programs in network namespaces)")?;
    build_lab_binaries()?;
    let mut cmd = Command::new("target/debug/sliceway-demo");
    if cluster {
        cmd.arg("--cluster");
    }
    run(&mut cmd)
}

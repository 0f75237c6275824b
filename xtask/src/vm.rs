//! `cargo xtask test-vm [--kernel debian-6.1|debian-bpo|all]`: the program fixtures
//! and the node-lab tests that exercise the kernel, run on other kernels under qemu
//! (`scripts/vm.sh`), on the binaries built here. For each kernel it reports each
//! test's result, `sliceway-agent check` (instructions per program, or the verifier's
//! log of a program the kernel refuses), and keeps both in `target/vm/<kernel>/`
//! (`console.log`, `check.json`), where `cargo xtask bench` finds the counts.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{bail, Context, Result};

use super::{build_lab_binaries, cargo, require_root};

/// The kernels `--kernel all` boots; the first is the default.
pub const KERNELS: &[&str] = &["debian-6.1", "debian-bpo"];

/// Test binaries of the `tests` crate and the tests of each that run in the VM (all
/// when empty). The guest runs under software emulation on hosts without usable KVM,
/// where each load of the datapath costs about 20 s of verifier time: the tier keeps
/// to what the guest's kernel changes, one test per kernel path, and the host runs
/// every test. Kept: the whole fixture table over both families and through XDP (every
/// program's verdicts on this kernel), the pinned-layout refusal, traffic on TC
/// filters (no tcx on 6.1) with checksum offload, SCTP (the host has none), a hitless
/// restart, the attach bookkeeping, the node's sockets (socket programs), the egress
/// program, dual stack, and the uplink programs (TC, native XDP and its forwarding,
/// direct server return, an uplink without an Ethernet header). Left to the host: user-space logic, the
/// Rust-only program tests whose kernel paths the table covers, and the node-lab
/// tests that repeat a path kept here.
const VM_TESTS: &[(&str, &[&str])] = &[
    (
        "program",
        &[
            "packet_fixtures",
            "ipv6_twins::packet_fixtures_over_ipv6",
            "v6::ipv6_only_fixtures",
            "the_xdp_program_decides_every_fixture_packet_as_the_uplink_tc_program_does",
            "xdp_forwarding_sends_translated_frames_by_the_fib_and_passes_the_rest_untouched",
            "a_pinned_map_of_another_layout_is_refused",
        ],
    ),
    (
        "node_lab",
        &[
            "tcp_and_udp_through_the_vip_reach_every_backend",
            "partial_checksums_from_pods_with_tx_offload_are_rewritten_correctly",
            "a_killed_and_restarted_agent_drops_no_connection",
            "tc_filters_follow_interfaces_survive_a_stop_and_are_cleaned_up",
            "sctp_through_the_vip_reaches_every_backend_with_its_port_translated",
            "the_nodes_own_sockets_reach_a_clusterip_and_see_it_as_their_peer",
            "a_host_network_backend_of_this_node_answers_pods_through_the_clusterip",
        ],
    ),
    // A dual-stack Service over both families through the IPv6 programs
    // (tail-called from the entry programs), with real sockets.
    (
        "ipv6_lab",
        &["a_dual_stack_service_is_reached_over_both_families"],
    ),
    // Traffic from outside the node through the uplink program on TC filters, alone
    // and behind native XDP, direct server return's IP option, and a tun uplink.
    (
        "multinode_lab",
        &[
            "tc::an_external_client_reaches_a_node_port_whose_backend_is_on_another_node",
            "xdp::an_external_client_reaches_a_node_port_whose_backend_is_on_another_node",
            "xdp_forward::native",
            "tc::direct_server_return_keeps_a_connection_that_moves_to_another_node",
            "an_uplink_without_an_ethernet_header_is_read_from_its_ip_header",
        ],
    ),
];

/// Test binaries whose tests run one at a time in the VM. The two-node lab's: on
/// Debian's 6.1 under software emulation, two of its labs started side by side once
/// hung both virtual CPUs for the rest of the run (soft lockups in the test threads,
/// not reproduced since); one lab at a time keeps the tier to what it tests.
const SERIAL: &[&str] = &["multinode_lab"];

/// Runs the VM tier on `kernels`; fails if any test failed or any program was refused.
pub fn test_vm(root: &Path, kernels: &[String]) -> Result<()> {
    require_root("the VM tier (qemu, and the tests inside attach BPF programs)")?;
    build_lab_binaries()?;
    let binaries = test_binaries()?;
    let mut failures = Vec::new();
    let mut summary = String::new();
    for kernel in kernels {
        let out = root.join("target/vm").join(kernel);
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out)?;
        let script = out.join("run.sh");
        std::fs::write(&script, guest_script(&out, &binaries))?;
        eprintln!("test-vm: {kernel}: booting (the guest's console follows)");
        let status = Command::new("bash")
            .arg(root.join("scripts/vm.sh"))
            .args(["run", kernel])
            .arg(root)
            .arg(&script)
            .env("SLICEWAY_VM_OUT", &out)
            .status()
            .context("running scripts/vm.sh")?;
        let console = std::fs::read_to_string(out.join("console.log")).unwrap_or_default();
        let (passed, mut failed) = results(&console);
        // A test named here that never reported (renamed, or the guest stopped
        // first) counts as failed: the tier must not shrink unnoticed.
        for name in VM_TESTS.iter().flat_map(|(_, tests)| tests.iter()) {
            if !passed.iter().chain(&failed).any(|t| t == name) {
                failed.push(format!("{name} (never reported)"));
            }
        }
        let _ = writeln!(
            summary,
            "test-vm: {kernel} ({}): {} passed, {} failed{}",
            kernel_release(&console).unwrap_or("kernel unknown"),
            passed.len(),
            failed.len(),
            if status.success() {
                String::new()
            } else {
                format!(" (guest exit: {status})")
            }
        );
        for t in &failed {
            let _ = writeln!(summary, "  FAILED {t}");
        }
        if !status.success() || !failed.is_empty() {
            failures.push(kernel.clone());
        }
    }
    eprint!("{summary}");
    if !failures.is_empty() {
        bail!(
            "the VM tier failed on {} (console logs in target/vm/<kernel>/console.log)",
            failures.join(", ")
        );
    }
    Ok(())
}

/// Builds the test binaries and returns (name, path) for those of [`VM_TESTS`].
fn test_binaries() -> Result<Vec<(String, String)>> {
    let mut cmd = cargo();
    cmd.args(["test", "--package", "tests", "--no-run"]);
    for (name, _) in VM_TESTS {
        cmd.args(["--test", name]);
    }
    let out = cmd.output().context("building the test binaries")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("building the test binaries failed:\n{stderr}");
    }
    // "  Executable tests/program.rs (target/debug/deps/program-0123abcd)"
    let mut found = Vec::new();
    for line in stderr.lines() {
        let Some(rest) = line.trim().strip_prefix("Executable tests/") else {
            continue;
        };
        let Some((file, path)) = rest.split_once(".rs (") else {
            continue;
        };
        found.push((file.to_string(), path.trim_end_matches(')').to_string()));
    }
    for (name, _) in VM_TESTS {
        if !found.iter().any(|(f, _)| f == name) {
            bail!("cargo did not name the test binary of tests/{name}.rs:\n{stderr}");
        }
    }
    Ok(found)
}

/// The script the guest runs in the workspace: `check`, then each test binary with
/// its tests; exits with the number of steps that failed.
fn guest_script(out: &Path, binaries: &[(String, String)]) -> String {
    let mut s = String::from(
        "# Written by `cargo xtask test-vm`; run inside the guest by scripts/vm.sh.\n\
         failed=0\n\
         # Debian's kernels have SCTP: its node-lab test must run, not report its absence.\n\
         export SLICEWAY_REQUIRE_SCTP=1\n\
         # Software emulation verifies the programs tens of times slower: an agent's\n\
         # start, two at a time, took over 90 s on a slow host.\n\
         export SLICEWAY_AGENT_START_SECS=600\n\
         # tun is a module there, and /dev/net/tun appears only once it is loaded (no\n\
         # udev in the guest to make the static node).\n\
         modprobe tun || echo 'test-vm: no tun module: the tun tests will fail'\n\
         echo 'test-vm: sliceway-agent check'\n",
    );
    // Once (it verifies every program, minutes under emulation): the report is kept
    // for `cargo xtask bench` and printed whole only when a program was refused.
    let _ = writeln!(
        s,
        "if ./target/debug/sliceway-agent check -o json > '{0}/check.json'; then\n\
         \x20 echo 'test-vm: check: every program loaded'\n\
         else\n\
         \x20 failed=$((failed + 1)); cat '{0}/check.json'\n\
         fi",
        out.display()
    );
    for (name, tests) in VM_TESTS {
        let (_, path) = binaries
            .iter()
            .find(|(f, _)| f == name)
            .expect("checked in test_binaries");
        let mut filter = if tests.is_empty() {
            String::new()
        } else {
            format!(" --exact {}", tests.join(" "))
        };
        if SERIAL.contains(name) {
            filter.push_str(" --test-threads 1");
        }
        let _ = writeln!(
            s,
            "echo 'test-vm: {name}'\n./{path} --color never{filter} || failed=$((failed + 1))"
        );
    }
    s.push_str("exit $failed\n");
    s
}

/// Tests that passed and failed, from libtest's lines in the console.
fn results(console: &str) -> (Vec<String>, Vec<String>) {
    let (mut passed, mut failed) = (Vec::new(), Vec::new());
    for line in console.lines() {
        let Some(rest) = line.trim().strip_prefix("test ") else {
            continue;
        };
        if let Some(name) = rest.strip_suffix(" ... ok") {
            passed.push(name.to_string());
        } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
            failed.push(name.to_string());
        }
    }
    (passed, failed)
}

/// The guest kernel's release, from the line the guest prints when it is up.
fn kernel_release(console: &str) -> Option<&str> {
    console.lines().find_map(|l| {
        l.split("sliceway-vm: kernel ")
            .nth(1)?
            .trim()
            .strip_suffix(" up")
    })
}

/// The VM tier's default as `cargo xtask test` runs it.
pub fn default_kernels() -> Vec<String> {
    vec![KERNELS[0].to_string()]
}

/// `--kernel` values: a name, or `all`.
pub fn parse_kernels(arg: Option<&str>) -> Result<Vec<String>> {
    match arg {
        None => Ok(default_kernels()),
        Some("all") => Ok(KERNELS.iter().map(|k| k.to_string()).collect()),
        Some(k) if KERNELS.contains(&k) => Ok(vec![k.to_string()]),
        Some(k) => bail!("unknown kernel {k:?}: one of {} or all", KERNELS.join(", ")),
    }
}

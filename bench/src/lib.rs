//! `cargo xtask bench`: sliceway measured side by side with kube-proxy's iptables and
//! nftables rules, on the same machine, in the same run.
//!
//! Figures: (1) kernel cost per packet through BPF_PROG_TEST_RUN, and the cost of
//! collecting expired conntrack entries from a table of a million, (2) new-connection
//! latency through a node lab, (3) programming time, full and for one endpoint
//! change, (4) the agent's memory, (5) the controller's API writes and cold start (in code, and beside
//! kube-controller-manager through the real API server),
//! (6) Maglev tables: build time, memory and what one backend leaving moves.
//! Each figure says how it was measured; runs are repeated and reported as median
//! [min–max]; `report` puts each beside the project's targets. Apart from the
//! figures, [`scale`] measures the controller's CPU per Pod change on the real API
//! server of the cluster lab, filled with many Services and Pods.
//!
//! All traffic stays inside the lab's network namespaces; the baselines' rules are
//! loaded only into the lab's node namespace.

pub mod controller;
pub mod harness;
pub mod kernel_cost;
pub mod kubeproxy;
pub mod maglev;
pub mod model;
pub mod node;
pub mod plot;
pub mod real;
pub mod report;
pub mod results;
pub mod scale;
pub mod stats;
pub mod wake;

use std::{path::Path, time::Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use sliceway_lab::Lab;

/// How long and how large a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Tiny sizes, for the smoke test that keeps the harness from rotting.
    Smoke,
    /// A few minutes.
    Quick,
    /// The full sizes and repetitions.
    Full,
}

/// Sizes and repetitions of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub mode: Mode,
    /// The figures to run (1 to 7); the others are reported as not selected.
    pub figures: Vec<u8>,
    pub fig1_sizes: Vec<usize>,
    /// BPF_PROG_TEST_RUN repeat.
    pub repeat: u32,
    /// Rounds of figure 1 (and the default elsewhere).
    pub rounds: usize,
    /// Distinct tuples of figure 1's cross-check.
    pub fresh_tuples: usize,
    /// Connections (two conntrack entries each) the sweeper's pass is timed over.
    pub gc_connections: u32,
    pub fig2_sizes: Vec<usize>,
    pub fig2_connections: usize,
    /// How figure 2 loads the iptables rules.
    pub fig2_iptables: node::Loader,
    pub fig2_rounds: usize,
    /// A baseline's full load in figure 2 is killed after this many seconds.
    pub fig2_load_limit_s: u64,
    pub fig3_sizes: Vec<usize>,
    pub fig3_endpoints: usize,
    pub fig3_rounds: usize,
    /// Rounds of a baseline load that takes long (`nft -f` of the largest size).
    pub fig3_slow_rounds: usize,
    pub fig3_change_size: usize,
    pub fig3_change_rounds: usize,
    pub fig4_sizes: Vec<usize>,
    pub fig4_rounds: usize,
    pub fig5_pods: usize,
    pub fig5_cold_services: usize,
    pub fig5_cold_pods: usize,
    /// Figure 5 through the API server: Services, Pods each (all replaced in the
    /// rolling update), rounds of both sides (0: not run), seconds of the idle window.
    pub fig5_api_services: usize,
    pub fig5_api_pods: usize,
    pub fig5_api_rounds: usize,
    pub fig5_api_idle_seconds: f64,
    /// Figure 6: Services, backends each, table sizes, rounds, Services a backend
    /// leaves, random flows.
    pub fig6_services: usize,
    pub fig6_backends: usize,
    pub fig6_sizes: Vec<u32>,
    pub fig6_rounds: usize,
    pub fig6_samples: usize,
    pub fig6_flows: usize,
    /// Figure 7: Services in the cluster lab, connections per side per round, rounds.
    pub fig7_services: usize,
    pub fig7_connections: usize,
    pub fig7_rounds: usize,
    /// Seconds of endpoint churn per proxy per round.
    pub fig7_churn_seconds: u64,
    /// Figure 7's new-connection rate: the offered rates tried in turn (connections
    /// a second, rising), each for `fig7_rate_step_ms`, until one is not sustained.
    pub fig7_rates: Vec<u32>,
    pub fig7_rate_step_ms: u64,
    /// Keep idle cores polling for the run ([`wake`]); `--idle-states` turns it off.
    pub keep_cores_awake: bool,
}

/// Every figure.
pub const ALL_FIGURES: [u8; 7] = [1, 2, 3, 4, 5, 6, 7];

impl Config {
    /// Whether figure `n` is to be run.
    pub fn runs(&self, n: u8) -> bool {
        self.figures.contains(&n)
    }

    pub fn new(mode: Mode) -> Self {
        match mode {
            Mode::Smoke => Self {
                mode,
                figures: ALL_FIGURES.to_vec(),
                fig1_sizes: vec![1, 100],
                repeat: 1_000,
                rounds: 2,
                fresh_tuples: 10,
                gc_connections: 1_000,
                fig2_sizes: vec![10],
                fig2_connections: 20,
                fig2_iptables: node::Loader::IptablesRestore,
                fig2_rounds: 2,
                fig2_load_limit_s: 60,
                fig3_sizes: vec![20],
                fig3_endpoints: 3,
                fig3_rounds: 2,
                fig3_slow_rounds: 1,
                fig3_change_size: 20,
                fig3_change_rounds: 2,
                fig4_sizes: vec![20],
                fig4_rounds: 1,
                fig5_pods: 50,
                fig5_cold_services: 10,
                fig5_cold_pods: 100,
                // A control plane of its own costs the smoke run about 30 s (measured on
                // 2 loaded cores): left out; `bench/tests/fig5_api.rs` runs it alone.
                fig5_api_services: 1,
                fig5_api_pods: 2,
                fig5_api_rounds: 0,
                fig5_api_idle_seconds: 0.5,
                fig6_services: 20,
                fig6_backends: 10,
                fig6_sizes: vec![251],
                fig6_rounds: 2,
                fig6_samples: 5,
                fig6_flows: 1_000,
                fig7_services: 10,
                fig7_connections: 20,
                fig7_rounds: 1,
                fig7_churn_seconds: 2,
                fig7_rates: vec![200, 400],
                fig7_rate_step_ms: 250,
                keep_cores_awake: true,
            },
            Mode::Quick => Self {
                mode,
                figures: ALL_FIGURES.to_vec(),
                fig1_sizes: vec![1, 100, 1_000, 10_000, 100_000],
                repeat: 100_000,
                rounds: 5,
                fresh_tuples: 200,
                gc_connections: 500_000,
                fig2_sizes: vec![100, 1_000, 10_000],
                fig2_connections: 300,
                fig2_iptables: node::Loader::IptablesLegacyRestore,
                fig2_rounds: 3,
                fig2_load_limit_s: 120,
                fig3_sizes: vec![1_000, 10_000],
                fig3_endpoints: 10,
                fig3_rounds: 3,
                fig3_slow_rounds: 1,
                fig3_change_size: 10_000,
                fig3_change_rounds: 3,
                fig4_sizes: vec![1_000, 10_000],
                fig4_rounds: 2,
                fig5_pods: 5_000,
                fig5_cold_services: 10_000,
                fig5_cold_pods: 100_000,
                fig5_api_services: 5,
                fig5_api_pods: 20,
                // One round of each side: a control plane of its own and two
                // controllers cost about 100 s for two rounds.
                fig5_api_rounds: 1,
                fig5_api_idle_seconds: 3.0,
                fig6_services: 10_000,
                fig6_backends: 100,
                // 4,093 alone took 25 s of a quick run; the full run has it.
                fig6_sizes: vec![251, 1_021],
                fig6_rounds: 3,
                fig6_samples: 200,
                fig6_flows: 10_000,
                fig7_services: 1_000,
                fig7_connections: 500,
                fig7_rounds: 2,
                fig7_churn_seconds: 10,
                fig7_rates: vec![1_000, 2_000, 4_000, 8_000, 16_000, 32_000],
                // 8,000 connections at 16,000 a second: enough for the 99.9% test.
                fig7_rate_step_ms: 500,
                keep_cores_awake: true,
            },
            Mode::Full => Self {
                mode,
                figures: ALL_FIGURES.to_vec(),
                fig1_sizes: vec![1, 100, 1_000, 10_000, 100_000],
                repeat: 1_000_000,
                rounds: 11,
                fresh_tuples: 1_000,
                gc_connections: 500_000,
                fig2_sizes: vec![100, 1_000, 10_000, 100_000],
                fig2_connections: 2_000,
                fig2_iptables: node::Loader::IptablesLegacyRestore,
                fig2_rounds: 5,
                fig2_load_limit_s: 900,
                fig3_sizes: vec![1_000, 10_000],
                fig3_endpoints: 10,
                fig3_rounds: 5,
                fig3_slow_rounds: 3,
                fig3_change_size: 10_000,
                fig3_change_rounds: 11,
                fig4_sizes: vec![1_000, 10_000, 100_000],
                fig4_rounds: 3,
                fig5_pods: 5_000,
                fig5_cold_services: 10_000,
                fig5_cold_pods: 100_000,
                fig5_api_services: 10,
                fig5_api_pods: 200,
                fig5_api_rounds: 3,
                fig5_api_idle_seconds: 5.0,
                fig6_services: 10_000,
                fig6_backends: 100,
                fig6_sizes: vec![251, 1_021, 4_093, 16_381],
                fig6_rounds: 5,
                fig6_samples: 200,
                fig6_flows: 10_000,
                fig7_services: 10_000,
                fig7_connections: 2_000,
                fig7_rounds: 5,
                fig7_churn_seconds: 30,
                fig7_rates: vec![
                    1_000, 2_000, 3_000, 4_000, 6_000, 8_000, 12_000, 16_000, 24_000, 32_000,
                ],
                fig7_rate_step_ms: 3_000,
                keep_cores_awake: true,
            },
        }
    }

    /// Longest a baseline's full load may take before it is killed and reported as a
    /// lower bound (`iptables-restore` with the nf_tables backend takes many minutes
    /// for 10,000 Services of 10 endpoints).
    pub fn fig3_load_limit(&self) -> std::time::Duration {
        std::time::Duration::from_secs(match self.mode {
            Mode::Smoke => 60,
            // Enough to show the 20x target against sliceway's sub-second full sync.
            Mode::Quick => 20,
            Mode::Full => 1800,
        })
    }

    /// Longest figure 2's load of a baseline's rules may take before it is killed and
    /// that baseline is reported as not loaded at that size (`nft -f` of 100,000
    /// Services in the full run).
    pub fn fig2_load_limit(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.fig2_load_limit_s)
    }

    /// Rounds of a baseline full load: loads of thousands of Services take seconds to
    /// minutes, so a quick run does them once from 1,000 Services (`iptables-restore`
    /// of 1,000 took 20 s for three rounds), and every run does `nft -f` once from
    /// 5,000.
    pub fn fig3_rounds_for(&self, loader: node::Loader, services: usize) -> usize {
        let slow = (self.mode == Mode::Quick && services >= 1_000)
            || (loader == node::Loader::Nft && services >= 5_000);
        if slow {
            self.fig3_slow_rounds
        } else {
            self.fig3_rounds
        }
    }
}

/// Figure 3: sliceway and the baselines.
#[derive(Clone, Debug, Serialize)]
pub struct Fig3 {
    pub method: String,
    pub sliceway: Vec<(usize, kernel_cost::SlicewaySync)>,
    pub baselines: Vec<node::BaselineFull>,
    pub sliceway_change: Option<kernel_cost::SlicewayChange>,
    pub baseline_change: Vec<node::BaselineChange>,
}

/// A figure's result, or why it is missing.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Outcome<T> {
    Done(T),
    Failed { error: String },
}

impl<T> Outcome<T> {
    fn from(r: Result<T>) -> Self {
        match r {
            Ok(v) => Outcome::Done(v),
            Err(e) => Outcome::Failed {
                error: format!("{e:#}"),
            },
        }
    }
    fn not_selected() -> Self {
        Outcome::Failed {
            error: "not selected with --only".into(),
        }
    }
    pub fn ok(&self) -> Option<&T> {
        match self {
            Outcome::Done(v) => Some(v),
            Outcome::Failed { .. } => None,
        }
    }
}

/// Where and on what the run happened.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Environment {
    /// The day the run began, UTC (`YYYY-MM-DD`).
    pub date: String,
    /// The short commit the binaries were built from (`unknown` outside a git
    /// checkout).
    pub commit: String,
    /// Whether the checkout had uncommitted changes to tracked files.
    pub dirty: bool,
    pub kernel: String,
    pub cpus: usize,
    /// The machine's memory (`7.8 GiB`).
    pub memory: String,
    pub iptables: String,
    pub nft: String,
    pub agent_build: String,
    pub seconds: f64,
    /// The cores' idle states over the run ([`wake::AwakeCores::description`]).
    pub idle: String,
}

/// Everything a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub config: Config,
    pub environment: Environment,
    pub fig1: Outcome<kernel_cost::Fig1>,
    /// With figure 1: the conntrack sweeper's pass over a million entries.
    pub conntrack_gc: Outcome<kernel_cost::ConntrackGc>,
    pub fig2: Outcome<node::Fig2>,
    pub fig3: Outcome<Fig3>,
    pub fig4: Outcome<node::Fig4>,
    pub fig5: controller::Fig5,
    pub fig6: Outcome<maglev::Fig6>,
    pub fig7: Outcome<real::Fig7>,
    /// The programs' size and verifier cost on this kernel and on the VM tier's
    /// kernels (`target/vm/<kernel>/check.json` of the last `cargo xtask test-vm`).
    pub programs: Vec<sliceway_agent::kernel::KernelCheck>,
    pub targets: Vec<report::Target>,
}

impl Report {
    /// Whether every selected figure was measured.
    pub fn complete(&self) -> bool {
        let c = &self.config;
        (!c.runs(1) || (self.fig1.ok().is_some() && self.conntrack_gc.ok().is_some()))
            && (!c.runs(2) || self.fig2.ok().is_some())
            && (!c.runs(3) || self.fig3.ok().is_some())
            && (!c.runs(4) || self.fig4.ok().is_some())
            && (!c.runs(5) || c.fig5_api_rounds == 0 || self.fig5.through_api.is_some())
            && (!c.runs(6) || self.fig6.ok().is_some())
            && (!c.runs(7) || self.fig7.ok().is_some())
    }
}

/// `sliceway-agent check` here, then the VM tier's results next to `out`
/// (`target/bench` → `target/vm/*/check.json`), sorted by kernel.
fn program_checks(out: &std::path::Path) -> Vec<sliceway_agent::kernel::KernelCheck> {
    let mut checks = Vec::new();
    match sliceway_agent::kernel::check() {
        Ok(c) => checks.push(c),
        Err(e) => eprintln!("bench: the programs' check on this kernel failed: {e}"),
    }
    let vm = out.parent().map(|t| t.join("vm")).unwrap_or_default();
    let mut files: Vec<_> = std::fs::read_dir(&vm)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join("check.json"))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for file in files {
        match std::fs::read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(c) => checks.push(c),
            Err(e) => eprintln!("bench: {} skipped: {e}", file.display()),
        }
    }
    checks
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "not found".into())
}

/// Prints a step of the run with the seconds since the run began.
pub(crate) fn progress(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(Instant::now);
    eprintln!("bench [{:>5.0} s]: {what}", start.elapsed().as_secs_f64());
}

/// Runs every figure and writes `report.md`, `report.json` and the plots into `out`.
pub fn run(cfg: &Config, out: &Path) -> Result<Report> {
    let started = Instant::now();
    // Held until the report is written; dropping it ends the request.
    let awake = if cfg.keep_cores_awake {
        wake::AwakeCores::hold()
    } else {
        wake::AwakeCores::left_alone()
    };
    progress(&awake.description);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let commit = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let environment = Environment {
        date: command_line("date", &["-u", "+%F"]),
        commit: if commit == "not found" {
            "unknown".into()
        } else {
            commit
        },
        dirty: command_line("git", &["status", "--porcelain", "--untracked-files=no"])
            != "not found",
        kernel: command_line("uname", &["-r"]),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory: std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| results::memory(&m))
            .unwrap_or_else(|| "unknown".into()),
        iptables: command_line("iptables-restore", &["--version"]),
        nft: command_line("nft", &["--version"]),
        agent_build: if cfg!(debug_assertions) {
            "debug".into()
        } else {
            "release".into()
        },
        seconds: 0.0,
        idle: awake.description.clone(),
    };

    let fig1 = if cfg.runs(1) {
        progress("figure 1: kernel cost per packet (BPF_PROG_TEST_RUN)");
        Outcome::from(kernel_cost::per_packet(cfg))
    } else {
        Outcome::not_selected()
    };
    let conntrack_gc = if cfg.runs(1) {
        progress("figure 1: conntrack sweep over a full table");
        Outcome::from(kernel_cost::conntrack_gc(cfg.gc_connections))
    } else {
        Outcome::not_selected()
    };

    // Sliceway's side of figure 3 runs in process, before the lab exists.
    let sliceway_sync = cfg.runs(3).then(|| {
        progress("figure 3: sliceway's full and incremental sync (in process)");
        let full: Result<Vec<_>> = cfg
            .fig3_sizes
            .iter()
            .map(|&n| {
                let services = model::fake_cluster(n, cfg.fig3_endpoints);
                Ok((n, kernel_cost::full_sync(&services, cfg.fig3_rounds)?))
            })
            .collect();
        let services = model::fake_cluster(cfg.fig3_change_size, cfg.fig3_endpoints);
        let after = node::with_one_endpoint_changed(&services, cfg.fig3_change_size / 2);
        let change = kernel_cost::one_endpoint_change(&services, &after, cfg.fig3_change_rounds);
        (full, change)
    });

    let lab = if [2, 3, 4].iter().any(|&n| cfg.runs(n)) {
        progress("building the node lab");
        Lab::new(3)
    } else {
        Err(anyhow::anyhow!(
            "no figure that needs it was selected with --only"
        ))
    };
    let (fig2, fig3, fig4) = match lab {
        Err(e) => {
            let err = format!("the node lab was not built: {e:#}");
            (
                Outcome::Failed { error: err.clone() },
                Outcome::Failed { error: err.clone() },
                Outcome::Failed { error: err },
            )
        }
        Ok(lab) => {
            let scratch = node::Scratch::new(&lab.prefix)?;
            let fig2 = if cfg.runs(2) {
                progress("figure 2: new-connection latency (sliceway, iptables, nftables)");
                Outcome::from(node::connection_latency(&lab, cfg, &scratch))
            } else {
                Outcome::not_selected()
            };
            let fig3 = match sliceway_sync {
                None => Outcome::not_selected(),
                Some((sliceway_full, sliceway_change)) => {
                    progress("figure 3: the baselines' programming time");
                    let loaders = [
                        node::Loader::IptablesRestore,
                        node::Loader::IptablesLegacyRestore,
                        node::Loader::Nft,
                    ];
                    let baselines = node::baseline_programming(&lab, cfg, &scratch, &loaders);
                    node::flush_node(&lab.node.name, true);
                    Outcome::from((|| {
                        let (baselines, baseline_change) = baselines?;
                        Ok(Fig3 {
                            method: report::fig3_method(cfg),
                            sliceway: sliceway_full?,
                            baselines,
                            sliceway_change: Some(sliceway_change?),
                            baseline_change,
                        })
                    })())
                }
            };
            let fig4 = if cfg.runs(4) {
                progress("figure 4: agent memory");
                Outcome::from(node::agent_memory(&lab, cfg, &scratch))
            } else {
                Outcome::not_selected()
            };
            node::flush_node(&lab.node.name, false);
            (fig2, fig3, fig4)
        }
    };

    let fig5 = if cfg.runs(5) {
        progress("figure 5: controller");
        controller::controller(cfg, out)
    } else {
        controller::Fig5::not_selected()
    };

    let fig6 = if cfg.runs(6) {
        progress("figure 6: Maglev tables (in process)");
        Outcome::from(maglev::tables(cfg))
    } else {
        Outcome::not_selected()
    };

    let fig7 = if cfg.runs(7) {
        progress("figure 7: the real proxies in the cluster lab (sliceway, kube-proxy, the floor)");
        let prefix = format!(
            "{}-{}-fig7",
            sliceway_lab::cluster::NS_PREFIX,
            std::process::id()
        );
        Outcome::from(real::real_proxies(cfg, &out.join("fig7-cluster"), &prefix))
    } else {
        Outcome::not_selected()
    };

    let mut report = Report {
        config: cfg.clone(),
        environment: Environment {
            seconds: started.elapsed().as_secs_f64(),
            ..environment
        },
        fig1,
        conntrack_gc,
        fig2,
        fig3,
        fig4,
        fig5,
        fig6,
        fig7,
        programs: program_checks(out),
        targets: Vec::new(),
    };
    report.targets = report::targets(&report);
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let plots = plot::draw_all(&report, out);
    std::fs::write(out.join("report.md"), report::markdown(&report, &plots))?;
    Ok(report)
}

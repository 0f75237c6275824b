//! The report: each figure as a Markdown table with how it was measured, ratios
//! against the baselines, and the project's targets with hit or miss.
//! Each figure's section of the Markdown and its targets are in a module of its
//! own (`fig1` to `fig7`); [`markdown`] and [`targets`] put them together in the
//! figures' order.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Config, Outcome, Report};

mod fig1;
mod fig2;
mod fig3;
mod fig4;
mod fig5;
mod fig6;
mod fig7;

/// A target of the project and whether this run met it.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub figure: u8,
    pub target: String,
    pub measured: String,
    /// `Some(true)` met, `Some(false)` missed, `None` not measured in this run.
    pub met: Option<bool>,
}

fn target(figure: u8, target: &str, measured: Option<(String, bool)>) -> Target {
    match measured {
        Some((m, ok)) => Target {
            figure,
            target: target.into(),
            measured: m,
            met: Some(ok),
        },
        None => Target {
            figure,
            target: target.into(),
            measured: "not measured in this run".into(),
            met: None,
        },
    }
}

pub fn fig3_method(cfg: &Config) -> String {
    format!(
        "N Services with {eps} made-up endpoints each (no traffic). sliceway: in process, \
         objects already parsed (as the agent's stores hold them), `compiler::compile` + \
         `MapWriter::apply` into freshly loaded, empty BPF maps — the agent's sync. Baselines: \
         kube-proxy's rules for the same Services, generated beforehand (generation not \
         timed), loaded into the emptied lab node namespace: wall time of \
         `nsenter --net=NODE iptables-restore --noflush --counters < FILE`, \
         `iptables-legacy-restore` likewise, and `nft -f FILE` (about 1 ms of that is nsenter \
         and process start). {rounds} rounds ({slow} for {slow_which} of 5,000 Services or \
         more), median [min–max]; a load still running after {limit} s is killed and reported as \
         a lower bound. One endpoint change at {change} Services: endpoint 0 of one \
         Service replaced, back and forth, {crounds} rounds; sliceway's map operations and \
         the time of the agent's sync (the changed EndpointSlice into the incremental \
         compiler, recompile of its Service, `MapWriter::apply_changed`), of the map \
         writer alone, and of a recompile of everything with a compare of every frontend; \
         the baselines' kube-proxy sync for that change.",
        eps = cfg.fig3_endpoints,
        rounds = cfg.fig3_rounds,
        slow = cfg.fig3_slow_rounds,
        slow_which = if cfg.mode == super::Mode::Quick {
            "every load"
        } else {
            "`nft -f`"
        },
        change = cfg.fig3_change_size,
        crounds = cfg.fig3_change_rounds,
        limit = cfg.fig3_load_limit().as_secs(),
    )
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}x"))
}

/// Compares the report with the project's targets: each figure's, in the figures'
/// order (figure 6 has none).
pub fn targets(r: &Report) -> Vec<Target> {
    [
        fig1::targets(&r.fig1, &r.conntrack_gc),
        fig2::targets(&r.fig2, r.config.fig2_iptables),
        fig3::targets(&r.fig3),
        fig4::targets(&r.fig4),
        fig5::targets(&r.fig5, r.config.fig5_pods),
        fig7::targets(&r.fig7),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The report's first line: when, at which commit and on what machine it ran.
pub fn header(e: &crate::Environment) -> String {
    format!(
        "Run on {} at commit {}{}; machine: {} CPUs, {} of memory, kernel {}.",
        e.date,
        e.commit,
        if e.dirty {
            " (with uncommitted changes)"
        } else {
            ""
        },
        e.cpus,
        e.memory,
        e.kernel
    )
}

/// The report as Markdown. `plots` are the PNG files written, for links.
pub fn markdown(r: &Report, plots: &[(String, String)]) -> String {
    let mut m = String::new();
    title(&mut m, r);
    targets_met(&mut m, &r.targets);
    programs_per_kernel(&mut m, &r.programs);
    fig1::kernel_cost(&mut m, &r.fig1);
    fig1::conntrack_gc(&mut m, &r.conntrack_gc);
    fig2::latency(&mut m, &r.fig2);
    fig3::programming_time(&mut m, &r.fig3);
    fig4::agent_memory(&mut m, &r.fig4);
    fig5::controller(&mut m, &r.fig5, &r.config);
    fig6::maglev_tables(&mut m, &r.fig6);
    fig7::real_proxies(&mut m, &r.fig7, r.config.fig7_rounds);
    plot_links(&mut m, plots);
    m
}

/// The report's title, then the header and the run's conditions (the idle states
/// among them) in one paragraph, so both are in the report's first lines.
fn title(m: &mut String, r: &Report) {
    let e = &r.environment;
    let _ = writeln!(m, "# sliceway benchmarks ({:?} run)\n", r.config.mode);
    let _ = writeln!(m, "{}", header(e));
    let _ = writeln!(
        m,
        "{}, {}, binaries built as {}; the run took {:.0} s; {}. \
         Every figure is the median of repeated runs with [min–max].\n",
        e.iptables, e.nft, e.agent_build, e.seconds, e.idle
    );
}

/// The targets' section: a line per target with what this run measured and whether
/// it met it.
fn targets_met(m: &mut String, targets: &[Target]) {
    let _ = writeln!(m, "## Targets\n");
    let _ = writeln!(
        m,
        "| fig. | target | measured | result |\n|---|---|---|---|"
    );
    for t in targets {
        let result = match t.met {
            Some(true) => "met",
            Some(false) => "**MISSED**",
            None => "not measured",
        };
        let _ = writeln!(
            m,
            "| {} | {} | {} | {result} |",
            t.figure, t.target, t.measured
        );
    }
}

/// The section of the programs' size and verifier cost per kernel
/// ([`programs_table`]).
fn programs_per_kernel(m: &mut String, checks: &[sliceway_agent::kernel::KernelCheck]) {
    let _ = writeln!(m, "\n## Programs per kernel\n");
    let _ = writeln!(m, "{}", programs_table(checks));
}

/// A figure's result; when it failed, the line that says why instead.
fn measured<'a, T>(m: &mut String, o: &'a Outcome<T>) -> Option<&'a T> {
    match o {
        Outcome::Done(v) => Some(v),
        Outcome::Failed { error } => {
            let _ = writeln!(m, "Not measured: {error}");
            None
        }
    }
}

/// The plots' section, a link per PNG file written; none when there are none.
fn plot_links(m: &mut String, plots: &[(String, String)]) {
    if !plots.is_empty() {
        let _ = writeln!(m, "\n## Plots\n");
        for (file, title) in plots {
            let _ = writeln!(m, "- [{title}]({file})");
        }
    }
}

/// Each program's size and verifier cost per kernel (`sliceway-agent check`): this
/// machine's, then the VM tier's of its last run.
pub fn programs_table(checks: &[sliceway_agent::kernel::KernelCheck]) -> String {
    let mut m = String::from(
        "Instructions as loaded (`xlated`, what `bpftool prog show` counts) and \
         instructions the verifier processed (its complexity measure, limit 1,000,000), \
         from `sliceway-agent check` on this machine and, for other kernels, from the \
         last `cargo xtask test-vm` (`target/vm/<kernel>/check.json`).\n\n\
         | kernel | attach | program | xlated | verified | status |\n|---|---|---|---:|---:|---|\n",
    );
    if checks.is_empty() {
        m.push_str("| (no check ran) | | | | | |\n");
    }
    let n = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    for c in checks {
        for p in &c.programs {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} |",
                c.kernel,
                if c.tcx { "tcx" } else { "tc filter" },
                p.name,
                n(p.xlated_insns),
                n(p.verified_insns),
                if p.error.is_some() {
                    "**refused**"
                } else {
                    "loaded"
                }
            );
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::super::node::{Fig2, Fig2Row, Loader, NotLoaded, Proxy};
    use super::super::real::{Fig7, Fig7Row, Side};
    use super::super::stats::Summary;
    use super::*;

    /// `values` summarised, so each cell shows a median with its spread.
    fn s(values: &[f64]) -> Summary {
        Summary::of(values)
    }

    /// A report with every section's data, and every branch of the sections that
    /// a measured figure can take.
    fn every_section() -> Report {
        let mut config = Config::new(super::super::Mode::Smoke);
        config.fig5_api_rounds = 2;
        config.fig7_rounds = 3;
        Report {
            config,
            environment: crate::Environment {
                date: "2026-12-01".into(),
                commit: "c161e47".into(),
                dirty: true,
                kernel: "6.18.0".into(),
                cpus: 2,
                memory: "7.8 GiB".into(),
                iptables: "iptables v1.8.11 (nf_tables)".into(),
                nft: "nftables v1.1.3".into(),
                agent_build: "release".into(),
                seconds: 1234.5,
                idle: "idle states held off".into(),
            },
            fig1: Outcome::Done(fig1_result()),
            conntrack_gc: Outcome::Done(conntrack_gc_result()),
            fig2: Outcome::Done(fig2_result()),
            fig3: Outcome::Done(fig3_result()),
            fig4: Outcome::Done(fig4_result()),
            fig5: fig5_result(),
            fig6: Outcome::Done(fig6_result()),
            fig7: Outcome::Done(fig7_result()),
            programs: kernel_checks(),
            targets: vec![
                target(1, "a target met", Some(("1.05x".into(), true))),
                target(2, "a target missed", Some(("2.5x".into(), false))),
                target(7, "a target not measured", None),
            ],
        }
    }

    /// Figure 1 at two sizes, one ratio not measured.
    fn fig1_result() -> super::super::kernel_cost::Fig1 {
        use super::super::kernel_cost::{Fig1, Fig1Row};
        let fig1_row = |services, base: f64| Fig1Row {
            services,
            no_match_ns: s(&[base, base + 2.0, base + 1.0]),
            new_flow_ns: s(&[base * 3.0, base * 3.5]),
            established_ns: s(&[base * 2.0]),
            established_without_counters_ns: s(&[base * 1.8]),
            uplink_no_match_tc_ns: s(&[base * 0.5]),
            uplink_no_match_xdp_ns: s(&[base * 0.4]),
            uplink_established_tc_ns: s(&[base * 1.5]),
            uplink_established_xdp_ns: s(&[base * 1.4]),
            established_over_no_match: s(&[2.0]),
            counted_over_uncounted: s(&[1.1]),
            harness_tc_ns: s(&[base * 0.2]),
            harness_xdp_ns: s(&[base * 0.1]),
            new_flow_fresh_tuples_ns: s(&[base * 4.0]),
            no_match_single_run_ns: s(&[base * 1.2]),
            ipv6_no_match_ns: s(&[base * 1.1]),
            ipv6_new_flow_ns: s(&[base * 3.3]),
            ipv6_established_ns: s(&[]),
        };
        Fig1 {
            method: "Figure 1's method.".into(),
            program: "The program.".into(),
            xdp: "The XDP program.".into(),
            repeat: 1000,
            rounds: 2,
            rows: vec![fig1_row(1, 20.0), fig1_row(100, 22.5)],
            ratio_largest_to_smallest: [Some(1.05), None, Some(1.2)],
        }
    }

    /// The conntrack sweeper's pass.
    fn conntrack_gc_result() -> super::super::kernel_cost::ConntrackGc {
        use super::super::kernel_cost::ConntrackGc;
        ConntrackGc {
            method: "The sweeper's method.".into(),
            entries: 2_000_000,
            expired: 1_000_000,
            batch: 4096,
            fill_s: 3.25,
            pass_s: 1.5,
            rounds: 489,
            longest_round_ms: 9.75,
            mean_round_ms: 3.125,
            ns_per_entry: 750.4,
            pass_at_default_interval_s: 489.0,
        }
    }

    /// Figure 2 with the floor, a side on a busy machine, and baselines not loaded.
    fn fig2_result() -> Fig2 {
        let fig2_row = |services, proxy, p50: f64, quiet| Fig2Row {
            services,
            proxy,
            p50_us: s(&[p50, p50 + 4.0]),
            p99_us: s(&[p50 * 2.0]),
            connections: 900,
            failed: 1,
            quiet,
        };
        Fig2 {
            method: "Figure 2's method.".into(),
            ipvs: "IPVS is not measured.".into(),
            rows: vec![
                fig2_row(1000, Proxy::Floor, 50.0, true),
                fig2_row(1000, Proxy::Sliceway, 60.0, true),
                fig2_row(1000, Proxy::Iptables, 90.0, false),
                fig2_row(10_000, Proxy::Sliceway, 61.0, true),
            ],
            not_loaded: vec![
                NotLoaded {
                    services: 10_000,
                    proxy: Proxy::Nftables,
                    loader: Loader::Nft,
                    limit_s: 300,
                    error: None,
                },
                NotLoaded {
                    services: 10_000,
                    proxy: Proxy::Iptables,
                    loader: Loader::IptablesRestore,
                    limit_s: 300,
                    error: Some("line 12 failed".into()),
                },
            ],
        }
    }

    /// Figure 3 with a baseline killed at the limit and the change of one endpoint.
    fn fig3_result() -> super::super::Fig3 {
        use super::super::kernel_cost::{SlicewayChange, SlicewaySync};
        use super::super::node::{BaselineChange, BaselineFull};
        use super::super::Fig3;
        Fig3 {
            method: "Figure 3's method.".into(),
            sliceway: vec![
                (
                    1000,
                    SlicewaySync {
                        full_ms: s(&[12.0, 14.0]),
                        full_apply_ms: s(&[8.0]),
                        full_map_writes: 4000,
                    },
                ),
                (
                    5000,
                    SlicewaySync {
                        full_ms: s(&[60.0]),
                        full_apply_ms: s(&[40.0]),
                        full_map_writes: 20_000,
                    },
                ),
            ],
            baselines: vec![
                BaselineFull {
                    services: 1000,
                    loader: Loader::IptablesRestore,
                    rules_bytes: 2_500_000,
                    ms: s(&[120.0, 130.0]),
                    timed_out: false,
                },
                BaselineFull {
                    services: 5000,
                    loader: Loader::Nft,
                    rules_bytes: 12_000_000,
                    ms: s(&[300_000.0]),
                    timed_out: true,
                },
            ],
            sliceway_change: Some(SlicewayChange {
                services: 1000,
                map_ops: s(&[6.0]),
                sync_ms: s(&[0.05, 0.07]),
                apply_ms: s(&[0.01]),
                compile_and_apply_ms: s(&[15.0]),
            }),
            baseline_change: vec![BaselineChange {
                services: 1000,
                loader: Loader::IptablesLegacyRestore,
                what: "partial sync".into(),
                rules_bytes: 3_500,
                ms: s(&[20.0]),
            }],
        }
    }

    /// Figure 4 with default capacities and capacities raised.
    fn fig4_result() -> super::super::node::Fig4 {
        use super::super::node::{Fig4, Fig4Row};
        Fig4 {
            method: "Figure 4's method.".into(),
            rows: vec![
                Fig4Row {
                    services: 1000,
                    endpoints_per_service: 10,
                    capacities: String::new(),
                    peak_rss_mib: s(&[30.0, 31.0]),
                    rss_mib: s(&[25.0]),
                    map_mib: s(&[12.5]),
                    start_to_synced_ms: s(&[400.0]),
                    agent_sync_ms: s(&[35.5]),
                },
                Fig4Row {
                    services: 100_000,
                    endpoints_per_service: 10,
                    capacities: "--max-services 131072".into(),
                    peak_rss_mib: s(&[300.0]),
                    rss_mib: s(&[250.0]),
                    map_mib: s(&[125.0]),
                    start_to_synced_ms: s(&[4000.0]),
                    agent_sync_ms: s(&[355.0]),
                },
            ],
        }
    }

    /// Figure 5 through the API server and in code, with a part not measured.
    fn fig5_result() -> super::super::controller::Fig5 {
        use super::super::controller::api::{ApiSpec, Side as ApiSide, SideSummary, ThroughApi};
        use super::super::controller::workloads::{ColdStartReport, RollingUpdateReport};
        use super::super::controller::Fig5;
        let api_side = |side, writes: f64| SideSummary {
            side,
            slice_writes: s(&[writes, writes + 10.0]),
            slice_bytes: s(&[writes * 900.0]),
            endpoints_writes: s(&[writes / 2.0]),
            endpoints_bytes: s(&[writes * 400.0]),
            failed_writes: s(&[0.0]),
            cpu_ms: s(&[310.0, 290.5]),
            cpu_net_ms: s(&[250.0]),
            step_ms: s(&[41.5, 39.0]),
            slice_verbs: "POST 3, PUT 40".into(),
            endpoints_verbs: "PUT 20".into(),
        };
        Fig5 {
            method: "Figure 5's method.".into(),
            unavailable: vec![
                "through the API server: not reached".into(),
                "the cold start: skipped".into(),
            ],
            rolling_update: Some(RollingUpdateReport {
                pods: 5000,
                slice_writes: 120,
                slice_bytes: 1_200_000,
                endpoints_writes: 100,
                endpoints_bytes: 9_000_000,
                endpoints_untruncated_writes: 100,
                endpoints_untruncated_bytes: 40_000_000,
                slices_at_end: 50,
            }),
            bytes_ratio: Some(7.5),
            writes_ratio: Some(0.83),
            untruncated_bytes_ratio: Some(33.3),
            untruncated_writes_ratio: None,
            cold_start: Some(ColdStartReport {
                services: 1000,
                pods: 10_000,
                slices: 1000,
                millis: 800.0,
            }),
            cold_start_ms: s(&[800.0, 850.0]),
            through_api: Some(ThroughApi {
                method: "Through the API server's method.".into(),
                spec: ApiSpec {
                    services: 100,
                    pods_per_service: 10,
                    rounds: 2,
                    idle_seconds: 5.0,
                },
                pods_replaced: 1000,
                pod_changes: 4000,
                runs: Vec::new(),
                sliceway: api_side(ApiSide::Sliceway, 1100.0),
                upstream: api_side(ApiSide::KubeControllerManager, 1500.0),
            }),
        }
    }

    /// Figure 6 with the ClusterIP placement and one table size.
    fn fig6_result() -> super::super::maglev::Fig6 {
        use super::super::maglev::{Fig6, Fig6Row};
        Fig6 {
            method: "Figure 6's method.".into(),
            services: 1000,
            backends_per_service: 10,
            rows: vec![
                Fig6Row {
                    table_size: None,
                    tables_ms: s(&[]),
                    apply_ms: s(&[20.0]),
                    writer_heap_mib: s(&[2.0]),
                    slots: 10_000,
                    entries_moved: (0.1, 0.1),
                    flows_moved: (0.1, 0.1),
                    change_map_ops: 11.0,
                },
                Fig6Row {
                    table_size: Some(251),
                    tables_ms: s(&[45.0, 47.0]),
                    apply_ms: s(&[60.0]),
                    writer_heap_mib: s(&[8.0]),
                    slots: 251_000,
                    entries_moved: (0.1012, 0.1195),
                    flows_moved: (0.0998, 0.125),
                    change_map_ops: 27.5,
                },
            ],
        }
    }

    /// Figure 7 with both floors, a side never programmed, one programmed late, the
    /// rate ladder, churn with a wait that did not catch up, and the programs' share.
    fn fig7_result() -> Fig7 {
        use super::super::real::{CatchUp, DatapathShare, RateStep};
        let step = |offered, sustained, clash| RateStep {
            offered,
            connections: 1000,
            failed: if sustained { 0 } else { 30 },
            no_port: if sustained { 0 } else { 2 },
            achieved: f64::from(offered) * 0.99,
            p50_us: 900.0,
            p99_us: 4_500.0,
            busy: 0.42,
            sustained,
            clash,
        };
        let catch_up = |waited_s, caught_up| CatchUp {
            waited_s,
            writes: 3,
            arrived_ms: vec![Some(12.0), None],
            caught_up,
        };
        let fig7_row = |side, p50: f64| Fig7Row {
            side,
            services: 1000,
            p50_us: s(&[p50, p50 + 3.0]),
            p50_all_us: p50,
            p99_all_us: p50 * 3.0,
            p999_all_us: p50 * 6.0,
            samples: 3000,
            failed: 2,
            ..Fig7Row::default()
        };
        Fig7 {
            method: "Figure 7's method.".into(),
            rows: vec![
                fig7_row(Side::Floor, 100.0),
                fig7_row(Side::FloorWide, 110.0),
                Fig7Row {
                    programmed_s: Some(s(&[1.5, 2.0])),
                    own_sync_ms: Some(3.25),
                    own_syncs: Some(12),
                    cpu_ms_per_1k: Some(45.0),
                    churn_changes: Some(600),
                    churn_first_packet_ms: Some((120.0, 480.0)),
                    churn_probes: Some(60),
                    churn_not_seen: Some(1),
                    churn_own_ms: Some((100.0, 250.0)),
                    churn_write_ms: Some((5.0, 20.0)),
                    churn_catch_up: vec![catch_up(1.25, true), catch_up(30.0, false)],
                    rate_steps: vec![
                        vec![
                            step(1000, true, Some((0, 0))),
                            step(2000, false, Some((3, 5))),
                        ],
                        vec![step(1000, true, None), step(2000, true, None)],
                    ],
                    loaded_floor_us: Some((104.0, 190.0)),
                    unloaded_floor_us: Some((101.0, 180.0)),
                    ..fig7_row(Side::Sliceway, 143.0)
                },
                Fig7Row {
                    samples: 0,
                    not_programmed: 2,
                    ..fig7_row(Side::Iptables, 0.0)
                },
                Fig7Row {
                    programmed_s: Some(s(&[4.0])),
                    not_programmed: 1,
                    churn_changes: Some(580),
                    loaded_floor_us: Some((120.0, 230.0)),
                    ..fig7_row(Side::Nftables, 180.0)
                },
            ],
            datapath: Some(DatapathShare {
                connections: 2000,
                programs: [
                    ("sliceway_tc".to_string(), (8000, 4_000_000)),
                    ("sliceway_xdp".to_string(), (0, 0)),
                ]
                .into_iter()
                .collect(),
            }),
            datapath_error: None,
            populate_s: 12.5,
            limit_s: 120,
        }
    }

    /// Two kernels' checks, one program refused.
    fn kernel_checks() -> Vec<sliceway_agent::kernel::KernelCheck> {
        serde_json::from_value(serde_json::json!([{
            "kernel": "6.18.0",
            "tcx": true,
            "programs": [
                {"name": "sliceway_tc", "xlated_insns": 4100, "verified_insns": 90000, "error": null},
                {"name": "sliceway_sock", "xlated_insns": null, "verified_insns": null,
                 "error": "invalid argument"},
            ],
        }, {
            "kernel": "6.1.0",
            "tcx": false,
            "programs": [
                {"name": "sliceway_tc", "xlated_insns": 4000, "verified_insns": null, "error": null},
            ],
        }]))
        .expect("kernel checks")
    }

    /// A report in which no figure was measured: each section says why.
    fn nothing_measured(fig5_api_rounds: usize) -> Report {
        fn failed<T>(why: &str) -> Outcome<T> {
            Outcome::Failed { error: why.into() }
        }
        let mut config = Config::new(super::super::Mode::Smoke);
        config.fig5_api_rounds = fig5_api_rounds;
        Report {
            config,
            environment: crate::Environment::default(),
            fig1: failed("no BPF"),
            conntrack_gc: failed("no BPF either"),
            fig2: failed("no lab"),
            fig3: failed("no nft"),
            fig4: failed("no agent"),
            fig5: super::super::controller::Fig5::not_selected(),
            fig6: failed("not selected with --only"),
            fig7: failed("no cluster"),
            programs: Vec::new(),
            targets: Vec::new(),
        }
    }

    /// Figure 7 measured without the kernel's run statistics and with no side that
    /// saw the loaded floor.
    fn without_run_statistics() -> Report {
        let mut r = every_section();
        if let Outcome::Done(f) = &mut r.fig7 {
            f.datapath = None;
            f.datapath_error = Some("EINVAL".into());
            for row in &mut f.rows {
                row.loaded_floor_us = None;
                row.rate_steps.clear();
                row.churn_catch_up.clear();
            }
        }
        r.fig5.through_api = None;
        r.fig5.rolling_update = None;
        r.fig5.cold_start = None;
        r
    }

    /// The report's headings, in order.
    fn headings(md: &str) -> Vec<&str> {
        md.lines().filter(|l| l.starts_with('#')).collect()
    }

    /// Each of `parts` is in `md`, after the one before it.
    fn in_order(md: &str, parts: &[&str]) {
        let mut from = 0;
        for part in parts {
            let at = md[from..]
                .find(part)
                .unwrap_or_else(|| panic!("{part:?} is not after {from}:\n{md}"));
            from += at + part.len();
        }
    }

    /// The report has every section, in the figures' order, each with its tables
    /// when it was measured and the reason when it was not.
    #[test]
    fn the_report_has_every_section_in_order() {
        let plots = [
            ("fig1.png".to_string(), "Figure 1".to_string()),
            ("fig7-cdf.png".to_string(), "Figure 7's CDF".to_string()),
        ];
        let every = markdown(&every_section(), &plots);
        assert_eq!(
            headings(&every),
            [
                "# sliceway benchmarks (Smoke run)",
                "## Targets",
                "## Programs per kernel",
                "## 1. Kernel cost per packet",
                "### Conntrack garbage collection",
                "## 2. New-connection latency through the node",
                "## 3. Programming time",
                "## 4. Agent memory",
                "## 5. Controller",
                "### Through the API server: sliceway-controller beside kube-controller-manager",
                "### In code, no API server: Endpoints against EndpointSlices",
                "## 6. Maglev tables",
                "## 7. The real proxies in the cluster lab",
                "## Plots",
            ],
            "{every}"
        );
        assert!(!every.contains("Not measured"), "{every}");
        in_order(
            &every,
            &[
                "Run on 2026-12-01 at commit c161e47 (with uncommitted changes)",
                "| 2 | a target missed | 2.5x | **MISSED** |",
                "| 6.18.0 | tcx | sliceway_sock | - | - | **refused** |",
                "Largest over smallest size: no match 1.05x, new flow –, established 1.20x.",
                "| 2000000 | 1000000 | 4096 |",
                "iptables at 1000 Services: measured on a busy machine",
                "| 5000 | nft -f | > 300000 (killed at the limit) |",
                "One endpoint changed at 1000 Services:",
                "| 100000 | 10 | --max-services 131072 |",
                "| controller CPU per Pod change, idle rate taken off (ms) | 0.062 |",
                "Cold start: 1000 Services",
                "- the cold start: skipped",
                "| Maglev table of 251 |",
                "not programmed within 120 s in 2 of 3 rounds",
                "Straight to the backend pods in each proxy's turn",
                "sliceway's programs per connection, from the kernel's run statistics",
                "New-connection rate (open loop;",
                "Under churn (",
                "1 of the churns started with the API server's watch still behind",
                "Creating the 1000 Services and seeing each with its slice took 12.5 s.",
                "- [Figure 7's CDF](fig7-cdf.png)",
            ],
        );

        let nothing = markdown(&nothing_measured(2), &[]);
        let mut expected = headings(&every);
        expected.retain(|h| !h.starts_with("### Through") && *h != "## Plots");
        assert_eq!(headings(&nothing), expected, "{nothing}");
        in_order(
            &nothing,
            &[
                "| (no check ran) |",
                "Not measured: no BPF\n",
                "Not measured: no BPF either\n",
                "Not measured: no lab\n",
                "Not measured: no nft\n",
                "Not measured: no agent\n",
                "Not measured: through the API server: no result\n",
                "- not selected with --only\n",
                "Not measured: not selected with --only\n",
                "Not measured: no cluster\n",
            ],
        );
        let not_run = markdown(&nothing_measured(0), &[]);
        assert!(
            not_run.contains("Not run: through the API server: no result"),
            "{not_run}"
        );

        let without = markdown(&without_run_statistics(), &[]);
        assert!(
            without.contains("\nsliceway's programs per connection: not measured (EINVAL).\n"),
            "{without}"
        );
        for gone in [
            "Straight to the backend pods",
            "New-connection rate",
            "## Plots",
        ] {
            assert!(!without.contains(gone), "{gone}: {without}");
        }
    }

    /// [`every_section`] at the sizes the targets are checked at, so every target is
    /// measured: figure 1 at 1 and 100,000 Services, figures 2, 3, 4 and 7 at 10,000
    /// (figure 2 also at 100,000), figure 5's rolling update of 5,000 pods, and
    /// figure 7 with sliceway's `--socket-lb-pods` mode.
    fn at_target_sizes() -> Report {
        let mut r = every_section();
        r.config.fig5_pods = 5_000;
        if let Outcome::Done(f) = &mut r.fig1 {
            f.rows[1].services = 100_000;
        }
        if let Outcome::Done(f) = &mut r.fig2 {
            let row = |services, proxy, p50: f64| Fig2Row {
                services,
                proxy,
                p50_us: s(&[p50, p50 + 4.0]),
                p99_us: s(&[p50 * 2.0]),
                connections: 900,
                failed: 1,
                quiet: true,
            };
            f.rows.push(row(10_000, Proxy::Iptables, 140.0));
            f.rows.push(row(10_000, Proxy::Nftables, 70.0));
            f.rows.push(row(100_000, Proxy::Sliceway, 64.0));
            f.rows.push(row(100_000, Proxy::Iptables, 900.0));
        }
        if let Outcome::Done(f) = &mut r.fig3 {
            f.sliceway[1].0 = 10_000;
            f.baselines.push(super::super::node::BaselineFull {
                services: 10_000,
                loader: Loader::IptablesRestore,
                rules_bytes: 25_000_000,
                ms: s(&[2_400.0, 2_500.0]),
                timed_out: false,
            });
            if let Some(c) = &mut f.sliceway_change {
                c.services = 10_000;
            }
        }
        if let Outcome::Done(f) = &mut r.fig4 {
            f.rows[0].services = 10_000;
        }
        if let Outcome::Done(f) = &mut r.fig7 {
            let pods = Fig7Row {
                side: Side::SlicewayPods,
                p50_all_us: 104.0,
                p99_all_us: 290.0,
                cpu_ms_per_1k: Some(30.0),
                churn_first_packet_ms: Some((90.0, 700.0)),
                ..f.rows[2].clone()
            };
            f.rows.push(pods);
            for row in &mut f.rows {
                row.services = 10_000;
                if row.side == Side::Nftables {
                    row.cpu_ms_per_1k = Some(60.0);
                    row.churn_first_packet_ms = Some((200.0, 900.0));
                }
            }
        }
        r
    }

    /// [`at_target_sizes`] with other values, so targets met there are missed here
    /// and the other way round: the conntrack sweep not measured, no wide floor in
    /// figure 7 (the floor straight to the pods is the one checked against), and
    /// iptables measured there.
    fn at_target_sizes_other_way() -> Report {
        let mut r = at_target_sizes();
        r.config.fig2_iptables = Loader::IptablesLegacyRestore;
        r.conntrack_gc = Outcome::Failed {
            error: "skipped".into(),
        };
        r.fig5.untruncated_bytes_ratio = Some(80.0);
        r.fig5.bytes_ratio = None;
        if let Outcome::Done(f) = &mut r.fig1 {
            f.rows[1].established_ns = s(&[30.0]);
            f.rows[1].uplink_established_xdp_ns = s(&[150.0]);
            f.rows[0].established_over_no_match = s(&[1.2]);
            f.rows[1].established_over_no_match = s(&[1.4]);
            f.rows[1].counted_over_uncounted = s(&[1.05]);
            f.rows[0].counted_over_uncounted = s(&[1.02]);
        }
        if let Outcome::Done(f) = &mut r.fig2 {
            f.rows
                .retain(|row| !(row.services == 100_000 && row.proxy == Proxy::Iptables));
            for row in &mut f.rows {
                if row.services == 10_000 && row.proxy == Proxy::Nftables {
                    row.p50_us = s(&[50.0]);
                }
            }
        }
        if let Outcome::Done(f) = &mut r.fig3 {
            f.sliceway[1].1.full_ms = s(&[100.0]);
            if let Some(c) = &mut f.sliceway_change {
                c.map_ops = s(&[3.0, 5.0]);
            }
        }
        if let Outcome::Done(f) = &mut r.fig4 {
            f.rows[0].peak_rss_mib = s(&[120.0]);
        }
        if let Outcome::Done(f) = &mut r.fig7 {
            f.rows.retain(|row| row.side != Side::FloorWide);
            for row in &mut f.rows {
                if row.side == Side::Iptables {
                    row.samples = 3000;
                    row.p50_all_us = 400.0;
                    row.p99_all_us = 1400.0;
                    row.cpu_ms_per_1k = Some(20.0);
                    row.churn_first_packet_ms = Some((300.0, 2000.0));
                }
                if row.side == Side::Sliceway {
                    row.p50_all_us = 105.0;
                    row.churn_first_packet_ms = Some((100.0, 1200.0));
                }
            }
        }
        r
    }

    /// Each target's figure, name and result, in the report's order: not measured
    /// when its figure or its size was not, met or missed by the values otherwise.
    #[test]
    fn each_target_is_checked_at_its_size_in_the_figures_order() {
        let names = [
            "per-packet cost flat: 100,000 Services within 1.2x of 1 Service (each path)",
            "an established-flow packet through TC costs at most 1.5x the no-match floor (every size)",
            "an established-flow packet through XDP at most 100 ns (every size)",
            "per-frontend and per-backend counters add at most 10% to an established-flow packet (every size)",
            "conntrack sweep at 1,000,000 entries: every round of the default batch under 100 ms",
            "new-connection latency (p50) at 10,000 Services at most half of iptables'",
            "new-connection latency (p50) at 10,000 Services no worse than nftables'",
            "new-connection latency (p50) at 100,000 Services the same as at 1,000 (within 10%)",
            "full sync of 10,000 Services at least 20x faster than iptables-restore",
            "one endpoint change at 10,000 Services costs at most 5 map writes and 1 ms",
            "agent peak RSS under 100 MB at 10,000 Services (10 endpoints each)",
            "rolling update of a 5,000-pod Service: at least 50x fewer bytes with EndpointSlices",
            "real proxies at 10,000 Services: new-connection p50 within 1.1x of the floor (straight to the pod, at as many pod addresses as Services) and below both kube-proxy modes",
            "real proxies at 10,000 Services: new-connection p99 within 2x of the floor's p99 (straight to the pod, at as many pod addresses as Services)",
            "CPU per new connection at 10,000 Services below both kube-proxy modes",
            "network programming under churn at 10,000 Services: p99 at most 1 s and below both kube-proxy modes",
            "real proxies at 10,000 Services: new-connection p50 within 1.1x of the floor (straight to the pods' own addresses, which the socket connects to) and below both kube-proxy modes (sliceway --socket-lb-pods)",
            "real proxies at 10,000 Services: new-connection p99 within 2x of the floor's p99 (straight to the pods' own addresses, which the socket connects to) (sliceway --socket-lb-pods)",
            "CPU per new connection at 10,000 Services below both kube-proxy modes (sliceway --socket-lb-pods)",
            "network programming under churn at 10,000 Services: p99 at most 1 s and below both kube-proxy modes (sliceway --socket-lb-pods)",
        ];
        let figures = [1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 7, 7, 7, 7, 7, 7, 7, 7];
        let (y, n) = (Some(true), Some(false));
        for (report, met) in [
            (nothing_measured(2), [None; 20]),
            (
                every_section(),
                [
                    None, n, y, y, y, None, None, None, None, None, None, None, None, None, None,
                    None, None, None, None, None,
                ],
            ),
            (
                at_target_sizes(),
                [y, n, y, y, y, y, y, y, y, n, y, n, n, y, y, y, y, y, y, y],
            ),
            (
                at_target_sizes_other_way(),
                [
                    y, y, n, y, None, y, n, y, y, y, n, y, y, y, n, n, y, y, n, y,
                ],
            ),
        ] {
            let t = targets(&report);
            let got: Vec<_> = t
                .iter()
                .map(|t| (t.figure, t.target.as_str(), t.met))
                .collect();
            let want: Vec<_> = (0..names.len())
                .map(|i| (figures[i], names[i], met[i]))
                .collect();
            assert_eq!(got, want);
        }
        let measured = |r: &Report, i: usize| targets(r)[i].measured.clone();
        assert_eq!(
            measured(&nothing_measured(2), 0),
            "not measured in this run"
        );
        assert_eq!(
            measured(&at_target_sizes(), 5),
            "63 µs vs 142 µs (iptables-restore): 0.44x"
        );
        assert_eq!(
            measured(&at_target_sizes_other_way(), 12),
            "105 µs: 1.05x the floor's 100 µs (floor (straight to the pod)); \
             iptables 400 µs, nftables 180 µs"
        );
    }

    #[test]
    fn the_header_names_date_commit_and_machine() {
        let mut e = crate::Environment {
            date: "2026-12-01".into(),
            commit: "c161e47".into(),
            kernel: "6.18.0".into(),
            cpus: 2,
            memory: "7.8 GiB".into(),
            ..Default::default()
        };
        assert_eq!(
            super::header(&e),
            "Run on 2026-12-01 at commit c161e47; machine: 2 CPUs, 7.8 GiB of memory, \
             kernel 6.18.0."
        );
        e.dirty = true;
        assert!(super::header(&e).contains("c161e47 (with uncommitted changes);"));
    }
}

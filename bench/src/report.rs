//! The report: each figure as a Markdown table with how it was measured, ratios
//! against the baselines, and the project's targets with hit or miss.

use std::fmt::Write as _;

use serde::Serialize;

use super::{
    node::{Fig2, Loader, Proxy, QUIET_LIMIT, QUIET_MS_PER_S},
    real::{
        Side, CATCH_UP_BOUND, CATCH_UP_CAP, CATCH_UP_IN_A_ROW, CHURN_PROBE_EVERY, CHURN_RATE,
        RATE_ANSWERED, RATE_P99_MS,
    },
    stats::{ratio, Summary},
    Config, Outcome, Report,
};

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

/// `median [min–max]`, or the median alone when every run gave the same.
fn spread(s: &Summary, digits: usize) -> String {
    if s.runs > 0 && s.min == s.max {
        format!("{:.d$}", s.median, d = digits)
    } else {
        s.show(digits)
    }
}

/// Figure 5's table through the API server: one line per measure, both sides and
/// their ratio.
fn fig5_through_api(m: &mut String, a: &crate::controller::api::ThroughApi) {
    use crate::controller::api::SideSummary;
    let _ = writeln!(
        m,
        "### Through the API server: sliceway-controller beside kube-controller-manager\n\n{}\n",
        a.method
    );
    let _ = writeln!(
        m,
        "| rolling update of {} Services of {} Pods ({} Pods replaced, {} Pod changes) | sliceway-controller | kube-controller-manager | sliceway / kube-controller-manager |\n|---|---:|---:|---:|",
        a.spec.services, a.spec.pods_per_service, a.pods_replaced, a.pod_changes
    );
    let changes = a.pod_changes.max(1) as f64;
    type Pick = fn(&SideSummary) -> Summary;
    let per_change = |s: Summary| Summary {
        median: s.median / changes,
        min: s.min / changes,
        max: s.max / changes,
        runs: s.runs,
    };
    let rows: [(&str, Pick, usize); 9] = [
        ("EndpointSlice writes", |s| s.slice_writes, 0),
        ("EndpointSlice bytes written", |s| s.slice_bytes, 0),
        ("Endpoints writes", |s| s.endpoints_writes, 0),
        ("Endpoints bytes written", |s| s.endpoints_bytes, 0),
        ("of the writes, refused (not 2xx)", |s| s.failed_writes, 0),
        ("controller CPU over the update (ms)", |s| s.cpu_ms, 1),
        ("the same, idle rate taken off (ms)", |s| s.cpu_net_ms, 1),
        (
            "mean time from a step's Pod writes to every Service showing it (ms)",
            |s| s.step_ms,
            1,
        ),
        (
            "controller CPU per Pod change, idle rate taken off (ms)",
            |s| s.cpu_net_ms,
            3,
        ),
    ];
    for (i, (what, pick, digits)) in rows.iter().enumerate() {
        let (mine, theirs) = if i == rows.len() - 1 {
            (per_change(pick(&a.sliceway)), per_change(pick(&a.upstream)))
        } else {
            (pick(&a.sliceway), pick(&a.upstream))
        };
        let _ = writeln!(
            m,
            "| {what} | {} | {} | {} |",
            spread(&mine, *digits),
            spread(&theirs, *digits),
            fmt_ratio(a.ratio(*pick))
        );
    }
    let _ = writeln!(
        m,
        "\nWrites by verb (last round): sliceway-controller EndpointSlices {}, Endpoints {}; kube-controller-manager EndpointSlices {}, Endpoints {}.\n",
        a.sliceway.slice_verbs,
        a.sliceway.endpoints_verbs,
        a.upstream.slice_verbs,
        a.upstream.endpoints_verbs
    );
}

/// Compares the report with the project's targets.
pub fn targets(r: &Report) -> Vec<Target> {
    let mut out = Vec::new();
    let fig1 = r.fig1.ok();
    let largest = fig1.and_then(|f| Some((f.rows.first()?, f.rows.last()?)));
    out.push(target(
        1,
        "per-packet cost flat: 100,000 Services within 1.2x of 1 Service (each path)",
        largest
            .filter(|(a, b)| a.services == 1 && b.services == 100_000)
            .map(|(a, b)| {
                let rs = [
                    ratio(b.no_match_ns.median, a.no_match_ns.median),
                    ratio(b.new_flow_ns.median, a.new_flow_ns.median),
                    ratio(b.established_ns.median, a.established_ns.median),
                ];
                let worst = rs.iter().flatten().cloned().fold(0.0, f64::max);
                (
                    format!(
                        "no match {}, new flow {}, established {}",
                        fmt_ratio(rs[0]),
                        fmt_ratio(rs[1]),
                        fmt_ratio(rs[2])
                    ),
                    worst <= 1.2,
                )
            }),
    ));
    out.push(target(
        1,
        "an established-flow packet through TC costs at most 1.5x the no-match floor (every size)",
        fig1.filter(|f| !f.rows.is_empty()).map(|f| {
            // Each round's ratio, so the machine's speed changing between rounds cancels.
            let worst = f
                .rows
                .iter()
                .map(|row| row.established_over_no_match.median)
                .fold(0.0, f64::max);
            (
                format!("worst {worst:.2}x (median of each round's ratio)"),
                worst <= 1.5,
            )
        }),
    ));
    out.push(target(
        1,
        "an established-flow packet through XDP at most 100 ns (every size)",
        fig1.filter(|f| !f.rows.is_empty()).map(|f| {
            let worst = f
                .rows
                .iter()
                .map(|row| row.uplink_established_xdp_ns.median)
                .fold(0.0, f64::max);
            let tc = f
                .rows
                .iter()
                .map(|row| row.uplink_established_tc_ns.median)
                .fold(0.0, f64::max);
            // The program's own share: each size's figure less the empty XDP program's
            // of the same rounds (shown, not judged: the target is on the figure).
            let own = f
                .rows
                .iter()
                .map(|row| row.uplink_established_xdp_ns.median - row.harness_xdp_ns.median)
                .fold(0.0, f64::max);
            (
                format!(
                    "worst {worst:.0} ns (the uplink's TC program: {tc:.0} ns); less the \
                     harness's empty XDP program, worst {own:.0} ns"
                ),
                worst <= 100.0,
            )
        }),
    ));
    out.push(target(
        1,
        "per-frontend and per-backend counters add at most 10% to an established-flow packet (every size)",
        fig1.filter(|f| !f.rows.is_empty()).map(|f| {
            // Each round's ratio of the two programs run back to back.
            let worst = f
                .rows
                .iter()
                .map(|row| row.counted_over_uncounted.median)
                .fold(0.0, f64::max);
            (
                format!(
                    "worst {worst:.2}x of the program without them (median of each round's ratio)"
                ),
                worst <= 1.1,
            )
        }),
    ));
    out.push(target(
        1,
        "conntrack sweep at 1,000,000 entries: every round of the default batch under 100 ms",
        r.conntrack_gc.ok().map(|g| {
            (
                format!(
                    "{} entries: longest round {:.1} ms, {:.0} ns per entry",
                    g.entries, g.longest_round_ms, g.ns_per_entry
                ),
                g.longest_round_ms < 100.0,
            )
        }),
    ));
    let fig2 = r.fig2.ok();
    let p50 = |n: usize, p: Proxy| {
        fig2?
            .rows
            .iter()
            .find(|row| row.services == n && row.proxy == p)
            .map(|row| row.p50_us.median)
    };
    let at10k = (
        p50(10_000, Proxy::Sliceway),
        p50(10_000, Proxy::Iptables),
        p50(10_000, Proxy::Nftables),
    );
    out.push(target(
        2,
        "new-connection latency (p50) at 10,000 Services at most half of iptables'",
        match at10k {
            (Some(s), Some(i), _) => Some((
                format!(
                    "{s:.0} µs vs {i:.0} µs ({}): {:.2}x",
                    r.config.fig2_iptables.name(),
                    s / i
                ),
                s <= i / 2.0,
            )),
            _ => None,
        },
    ));
    out.push(target(
        2,
        "new-connection latency (p50) at 10,000 Services no worse than nftables'",
        match at10k {
            (Some(s), _, Some(n)) => {
                Some((format!("{s:.0} µs vs {n:.0} µs: {:.2}x", s / n), s <= n))
            }
            _ => None,
        },
    ));
    out.push(target(
        2,
        "new-connection latency (p50) at 100,000 Services the same as at 1,000 (within 10%)",
        match (p50(100_000, Proxy::Sliceway), p50(1_000, Proxy::Sliceway)) {
            (Some(big), Some(small)) => Some((
                format!(
                    "{big:.0} µs vs {small:.0} µs: {:.2}x (iptables with {}: {})",
                    big / small,
                    r.config.fig2_iptables.name(),
                    match (p50(100_000, Proxy::Iptables), p50(1_000, Proxy::Iptables)) {
                        (Some(b), Some(s)) => format!("{b:.0} vs {s:.0} µs, {:.2}x", b / s),
                        _ => "not measured at both sizes".into(),
                    }
                ),
                big <= 1.1 * small,
            )),
            _ => None,
        },
    ));
    let fig3 = r.fig3.ok();
    let sliceway10k = fig3.and_then(|f| {
        f.sliceway
            .iter()
            .find(|(n, _)| *n == 10_000)
            .map(|(_, s)| s.full_ms.median)
    });
    let ipt10k = fig3.and_then(|f| {
        f.baselines
            .iter()
            .find(|b| b.services == 10_000 && b.loader == Loader::IptablesRestore)
            .map(|b| b.ms.median)
    });
    out.push(target(
        3,
        "full sync of 10,000 Services at least 20x faster than iptables-restore",
        match (sliceway10k, ipt10k) {
            (Some(s), Some(i)) => Some((
                format!(
                    "{s:.1} ms vs {i:.1} ms (or more, if killed at the limit): {:.1}x faster",
                    i / s
                ),
                i / s >= 20.0,
            )),
            _ => None,
        },
    ));
    out.push(target(
        3,
        "one endpoint change at 10,000 Services costs at most 5 map writes and 1 ms",
        fig3.and_then(|f| f.sliceway_change.as_ref())
            .filter(|c| c.services == 10_000)
            .map(|c| {
                (
                    format!(
                        "{:.0} map writes+deletes, agent sync {:.3} ms (map writer alone {:.3} ms; \
                         recompile all + compare all {:.1} ms)",
                        c.map_ops.max,
                        c.sync_ms.median,
                        c.apply_ms.median,
                        c.compile_and_apply_ms.median
                    ),
                    c.map_ops.max <= 5.0 && c.sync_ms.median <= 1.0,
                )
            }),
    ));
    out.push(target(
        4,
        "agent peak RSS under 100 MB at 10,000 Services (10 endpoints each)",
        r.fig4
            .ok()
            .and_then(|f| f.rows.iter().find(|row| row.services == 10_000))
            .map(|row| {
                let mb = row.peak_rss_mib.max * 1.048_576;
                (format!("{mb:.1} MB peak (max of runs)"), mb < 100.0)
            }),
    ));
    out.push(target(
        5,
        "rolling update of a 5,000-pod Service: at least 50x fewer bytes with EndpointSlices",
        (r.fig5.rolling_update.is_some() && r.config.fig5_pods == 5_000)
            .then_some((r.fig5.untruncated_bytes_ratio, r.fig5.bytes_ratio))
            .and_then(|(full, truncated)| {
                let full = full?;
                Some((
                    format!(
                        "{full:.1}x fewer bytes than Endpoints with every address ({} than \
                         Endpoints truncated to 1000 addresses)",
                        fmt_ratio(truncated)
                    ),
                    full >= 50.0,
                ))
            }),
    ));
    // Each of sliceway's modes against the same floor and baselines: pods' connects
    // translated at TC (the default) or at the socket (`--socket-lb-pods`).
    // Each against the floor whose client meets the same destinations
    // (`Fig7::floor_for`): the N Services' addresses through TC, the pods' own
    // through the socket.
    for (side, mode, which) in [
        (
            Side::Sliceway,
            "",
            "straight to the pod, at as many pod addresses as Services",
        ),
        (
            Side::SlicewayPods,
            " (sliceway --socket-lb-pods)",
            "straight to the pods' own addresses, which the socket connects to",
        ),
    ] {
        out.push(target(
            7,
            &format!("real proxies at 10,000 Services: new-connection p50 within 1.1x of the floor ({which}) and below both kube-proxy modes{mode}"),
            r.fig7.ok().filter(|f| f.rows.iter().any(|row| row.services == 10_000)).and_then(|f| {
                let p50 = |side| f.row(side).map(|row| row.p50_all_us);
                let at = f.floor_for(side);
                let (floor, s) = (p50(at)?, p50(side)?);
                let (below, modes) = f
                    .baselines(|row| Some(row.p50_all_us))
                    .below(s, f.limit_s, " µs")?;
                let other = [Side::Floor, Side::FloorWide]
                    .into_iter()
                    .find(|o| *o != at)
                    .and_then(|o| p50(o).map(|fl| (o, fl)))
                    .map_or(String::new(), |(o, fl)| {
                        format!("; the {}: {fl:.0} µs, {:.2}x", o.name(), s / fl)
                    });
                Some((
                    format!(
                        "{s:.0} µs: {:.2}x the floor's {floor:.0} µs ({}{other}); {modes}",
                        s / floor,
                        at.name(),
                    ),
                    s <= 1.1 * floor && below,
                ))
            }),
        ));
        out.push(target(
            7,
            &format!("real proxies at 10,000 Services: new-connection p99 within 2x of the floor's p99 ({which}){mode}"),
            r.fig7
                .ok()
                .filter(|f| f.rows.iter().any(|row| row.services == 10_000))
                .and_then(|f| {
                    let p99 = |side| f.row(side).map(|row| row.p99_all_us);
                    let at = f.floor_for(side);
                    let (floor, s) = (p99(at)?, p99(side)?);
                    Some((
                        format!(
                            "{s:.0} µs: {:.2}x the floor's {floor:.0} µs ({})",
                            s / floor,
                            at.name()
                        ),
                        s <= 2.0 * floor,
                    ))
                }),
        ));
        out.push(target(
            7,
            &format!("CPU per new connection at 10,000 Services below both kube-proxy modes{mode}"),
            r.fig7
                .ok()
                .filter(|f| f.rows.iter().any(|row| row.services == 10_000))
                .and_then(|f| {
                    let s = f.row(side).and_then(|row| row.cpu_ms_per_1k)?;
                    let (below, modes) = f
                        .baselines(|row| row.cpu_ms_per_1k)
                        .below(s, f.limit_s, " ms")?;
                    Some((format!("{s:.0} ms per 1,000 connections; {modes}"), below))
                }),
        ));
        out.push(target(
            7,
            &format!("network programming under churn at 10,000 Services: p99 at most 1 s and below both kube-proxy modes{mode}"),
            r.fig7.ok().filter(|f| f.rows.iter().any(|row| row.services == 10_000)).and_then(|f| {
                let p99 = |row: &super::real::Fig7Row| row.churn_first_packet_ms.map(|p| p.1);
                let s = f.row(side).and_then(p99)?;
                let (below, modes) = f.baselines(p99).below(s, f.limit_s, " ms")?;
                Some((
                    format!("change to first packet p99: {s:.0} ms; {modes}"),
                    s <= 1000.0 && below,
                ))
            }),
        ));
    }
    out
}

fn failed<T>(o: &Outcome<T>) -> Option<&str> {
    match o {
        Outcome::Failed { error } => Some(error),
        Outcome::Done(_) => None,
    }
}

fn ns(s: &Summary) -> String {
    s.show(0)
}

/// Figure 2's notes under its table: the sides measured on a busy machine, the
/// baselines not measured and why.
fn fig2_notes(m: &mut String, f: &Fig2) {
    for row in f.rows.iter().filter(|row| !row.quiet) {
        let _ = writeln!(
            m,
            "\n{} at {} Services: measured on a busy machine (still over {} ms of CPU a second after {} s of waiting).",
            row.proxy.name(),
            row.services,
            QUIET_MS_PER_S,
            QUIET_LIMIT.as_secs()
        );
    }
    for x in &f.not_loaded {
        let why = match &x.error {
            None => format!(
                "its rules did not load within {} s (`{}` killed at the limit)",
                x.limit_s,
                x.loader.name()
            ),
            Some(e) => format!("`{}` refused its rules: {e}", x.loader.name()),
        };
        let _ = writeln!(
            m,
            "\n{} at {} Services: not measured, {why}.",
            x.proxy.name(),
            x.services,
        );
    }
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
    let e = &r.environment;
    let _ = writeln!(m, "# sliceway benchmarks ({:?} run)\n", r.config.mode);
    // The header and the run's conditions (the idle states among them) in one
    // paragraph, so both are in the report's first lines.
    let _ = writeln!(m, "{}", header(e));
    let _ = writeln!(
        m,
        "{}, {}, binaries built as {}; the run took {:.0} s; {}. \
         Every figure is the median of repeated runs with [min–max].\n",
        e.iptables, e.nft, e.agent_build, e.seconds, e.idle
    );

    let _ = writeln!(m, "## Targets\n");
    let _ = writeln!(
        m,
        "| fig. | target | measured | result |\n|---|---|---|---|"
    );
    for t in &r.targets {
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

    let _ = writeln!(m, "\n## Programs per kernel\n");
    let _ = writeln!(m, "{}", programs_table(&r.programs));

    let _ = writeln!(m, "\n## 1. Kernel cost per packet\n");
    match &r.fig1 {
        Outcome::Done(f) => {
            let _ = writeln!(m, "{}\n\n{} {}\n", f.method, f.program, f.xdp);
            let _ = writeln!(
                m,
                "| Services | no match (ns) | new flow (ns) | established (ns) | established without flow counters (ns) | new flow, fresh tuples, repeat=1 (ns) | no match, repeat=1 (ns) | uplink TC: no match / established (ns) | uplink XDP: no match / established (ns) | harness's floor, empty program: TC / XDP (ns) | IPv6: no match / new flow / established (ns) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for row in &f.rows {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} / {} / {} |",
                    row.services,
                    ns(&row.no_match_ns),
                    ns(&row.new_flow_ns),
                    ns(&row.established_ns),
                    ns(&row.established_without_counters_ns),
                    ns(&row.new_flow_fresh_tuples_ns),
                    ns(&row.no_match_single_run_ns),
                    ns(&row.uplink_no_match_tc_ns),
                    ns(&row.uplink_established_tc_ns),
                    ns(&row.uplink_no_match_xdp_ns),
                    ns(&row.uplink_established_xdp_ns),
                    ns(&row.harness_tc_ns),
                    ns(&row.harness_xdp_ns),
                    ns(&row.ipv6_no_match_ns),
                    ns(&row.ipv6_new_flow_ns),
                    ns(&row.ipv6_established_ns)
                );
            }
            let [a, b, c] = f.ratio_largest_to_smallest;
            let _ = writeln!(
                m,
                "\nLargest over smallest size: no match {}, new flow {}, established {}.",
                fmt_ratio(a),
                fmt_ratio(b),
                fmt_ratio(c)
            );
        }
        other => {
            let _ = writeln!(m, "Not measured: {}", failed(other).unwrap_or_default());
        }
    }

    let _ = writeln!(m, "\n### Conntrack garbage collection\n");
    match &r.conntrack_gc {
        Outcome::Done(g) => {
            let _ = writeln!(m, "{}\n", g.method);
            let _ = writeln!(
                m,
                "| entries | expired | batch | fill (s) | one pass (s) | rounds | mean round (ms) | longest round (ms) | ns per entry | pass at one round a second (s) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            let _ = writeln!(
                m,
                "| {} | {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.0} | {:.0} |",
                g.entries,
                g.expired,
                g.batch,
                g.fill_s,
                g.pass_s,
                g.rounds,
                g.mean_round_ms,
                g.longest_round_ms,
                g.ns_per_entry,
                g.pass_at_default_interval_s
            );
        }
        other => {
            let _ = writeln!(m, "Not measured: {}", failed(other).unwrap_or_default());
        }
    }

    let _ = writeln!(m, "\n## 2. New-connection latency through the node\n");
    match &r.fig2 {
        Outcome::Done(f) => {
            let _ = writeln!(m, "{}\n\n{}\n", f.method, f.ipvs);
            let _ = writeln!(
                m,
                "| Services | proxy | p50 (µs) | p99 (µs) | p50 vs sliceway | p99 vs sliceway | p50 over the floor (µs) | connections (failed) |\n|---:|---|---:|---:|---:|---:|---:|---:|"
            );
            for row in &f.rows {
                let find = |p| {
                    f.rows
                        .iter()
                        .find(|b| b.services == row.services && b.proxy == p)
                };
                let base = find(Proxy::Sliceway);
                let over = match find(Proxy::Floor) {
                    Some(fl) if row.proxy != Proxy::Floor => {
                        format!("{:.0}", row.p50_us.median - fl.p50_us.median)
                    }
                    _ => "–".into(),
                };
                let (r50, r99) = base.map_or((None, None), |b| {
                    (
                        ratio(row.p50_us.median, b.p50_us.median),
                        ratio(row.p99_us.median, b.p99_us.median),
                    )
                });
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} | {} | {over} | {} ({}) |",
                    row.services,
                    row.proxy.name(),
                    row.p50_us.show(0),
                    row.p99_us.show(0),
                    fmt_ratio(r50),
                    fmt_ratio(r99),
                    row.connections,
                    row.failed
                );
            }
            fig2_notes(&mut m, f);
        }
        other => {
            let _ = writeln!(m, "Not measured: {}", failed(other).unwrap_or_default());
        }
    }

    let _ = writeln!(m, "\n## 3. Programming time\n");
    match &r.fig3 {
        Outcome::Done(f) => {
            let _ = writeln!(m, "{}\n", f.method);
            let _ = writeln!(
                m,
                "| Services | how | time (ms) | vs sliceway | input |\n|---:|---|---:|---:|---|"
            );
            for (n, s) in &f.sliceway {
                let _ = writeln!(
                    m,
                    "| {n} | sliceway full sync (compile + apply) | {} | 1.00x | {} map writes; apply alone {} ms |",
                    s.full_ms.show(1),
                    s.full_map_writes,
                    s.full_apply_ms.show(1)
                );
                for b in f.baselines.iter().filter(|b| b.services == *n) {
                    let time = if b.timed_out {
                        format!("> {:.0} (killed at the limit)", b.ms.median)
                    } else {
                        b.ms.show(1)
                    };
                    let _ = writeln!(
                        m,
                        "| {n} | {} | {time} | {}{} | {:.1} MB of rules |",
                        b.loader.name(),
                        if b.timed_out { "> " } else { "" },
                        fmt_ratio(ratio(b.ms.median, s.full_ms.median)),
                        b.rules_bytes as f64 / 1e6
                    );
                }
            }
            if let Some(c) = &f.sliceway_change {
                let _ = writeln!(
                    m,
                    "\nOne endpoint changed at {} Services:\n\n| how | time (ms) | vs sliceway sync | what is written |\n|---|---:|---:|---|",
                    c.services
                );
                let _ = writeln!(
                    m,
                    "| sliceway agent sync (changed slice, recompile of its Service, `MapWriter::apply_changed`) | {} | 1.00x | {} map writes+deletes |",
                    c.sync_ms.show(3),
                    c.map_ops.show(0)
                );
                let _ = writeln!(
                    m,
                    "| sliceway map writer alone (`MapWriter::apply_changed`) | {} | {} | same map writes |",
                    c.apply_ms.show(3),
                    fmt_ratio(ratio(c.apply_ms.median, c.sync_ms.median))
                );
                let _ = writeln!(
                    m,
                    "| sliceway, recompile all + compare all (`compile` + `MapWriter::apply`) | {} | {} | same map writes |",
                    c.compile_and_apply_ms.show(1),
                    fmt_ratio(ratio(c.compile_and_apply_ms.median, c.sync_ms.median))
                );
                for b in &f.baseline_change {
                    let _ = writeln!(
                        m,
                        "| {}: {} | {} | {} | {:.1} kB of rules |",
                        b.loader.name(),
                        b.what,
                        b.ms.show(1),
                        fmt_ratio(ratio(b.ms.median, c.sync_ms.median)),
                        b.rules_bytes as f64 / 1e3
                    );
                }
            }
        }
        other => {
            let _ = writeln!(m, "Not measured: {}", failed(other).unwrap_or_default());
        }
    }

    let _ = writeln!(m, "\n## 4. Agent memory\n");
    match &r.fig4 {
        Outcome::Done(f) => {
            let _ = writeln!(m, "{}\n", f.method);
            let _ = writeln!(
                m,
                "| Services | endpoints each | capacities | peak RSS (MiB) | RSS after sync (MiB) | BPF maps (MiB) | start to synced (ms) | agent's sync (ms) |\n|---:|---:|---|---:|---:|---:|---:|---:|"
            );
            for row in &f.rows {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.services,
                    row.endpoints_per_service,
                    if row.capacities.is_empty() {
                        "defaults"
                    } else {
                        &row.capacities
                    },
                    row.peak_rss_mib.show(1),
                    row.rss_mib.show(1),
                    row.map_mib.show(1),
                    row.start_to_synced_ms.show(0),
                    row.agent_sync_ms.show(1)
                );
            }
        }
        other => {
            let _ = writeln!(m, "Not measured: {}", failed(other).unwrap_or_default());
        }
    }

    let _ = writeln!(m, "\n## 5. Controller\n");
    let f = &r.fig5;
    if let Some(a) = &f.through_api {
        fig5_through_api(&mut m, a);
    } else if r.config.runs(5) {
        let _ = writeln!(
            m,
            "{}: {}\n",
            if r.config.fig5_api_rounds == 0 {
                "Not run"
            } else {
                "Not measured"
            },
            f.unavailable
                .iter()
                .find(|u| u.starts_with("through the API server"))
                .map_or("through the API server: no result", String::as_str)
        );
    }
    let _ = writeln!(
        m,
        "### In code, no API server: Endpoints against EndpointSlices\n"
    );
    let _ = writeln!(m, "{}\n", f.method);
    if let Some(v) = &f.rolling_update {
        let _ = writeln!(
            m,
            "| rolling update of {} pods | API writes | bytes written | vs EndpointSlices (writes, bytes) |\n|---|---:|---:|---:|\n| EndpointSlices | {} | {} | 1.00x, 1.00x |\n| Endpoints, truncated to 1000 addresses (as upstream writes them) | {} | {} | {}, {} |\n| Endpoints with every address | {} | {} | {}, {} |\n",
            v.pods,
            v.slice_writes,
            v.slice_bytes,
            v.endpoints_writes,
            v.endpoints_bytes,
            fmt_ratio(f.writes_ratio),
            fmt_ratio(f.bytes_ratio),
            v.endpoints_untruncated_writes,
            v.endpoints_untruncated_bytes,
            fmt_ratio(f.untruncated_writes_ratio),
            fmt_ratio(f.untruncated_bytes_ratio)
        );
    }
    if let Some(v) = &f.cold_start {
        let _ = writeln!(
            m,
            "Cold start: {} Services, {} pods, {} EndpointSlices reconciled in {} ms.\n",
            v.services,
            v.pods,
            v.slices,
            f.cold_start_ms.show(1)
        );
    }
    for u in f
        .unavailable
        .iter()
        .filter(|u| !u.starts_with("through the API server"))
    {
        let _ = writeln!(m, "- {u}");
    }

    let _ = writeln!(m, "\n## 6. Maglev tables\n");
    match &r.fig6 {
        Outcome::Done(f) => {
            let _ = writeln!(m, "{}\n", f.method);
            let _ = writeln!(
                m,
                "| slots per frontend | all tables alone (ms) | per table (µs) | writer's full sync (ms) | writer's heap (MiB) | slots (x SLOTS default) | one backend leaving: entries moved, mean / worst | flows moved, mean / worst | map operations |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for row in &f.rows {
                let what = row.table_size.map_or_else(
                    || format!("{} (ClusterIP placement)", f.backends_per_service),
                    |m| format!("Maglev table of {m}"),
                );
                let per_table = if row.tables_ms.runs > 0 {
                    format!(
                        "{:.1}",
                        row.tables_ms.median * 1e3 / f.services.max(1) as f64
                    )
                } else {
                    "–".into()
                };
                let pct = |v: f64| format!("{:.2}%", v * 100.0);
                let _ = writeln!(
                    m,
                    "| {what} | {} | {per_table} | {} | {} | {} ({:.2}x) | {} / {} | {} / {} | {:.1} |",
                    row.tables_ms.show(1),
                    row.apply_ms.show(1),
                    row.writer_heap_mib.show(1),
                    row.slots,
                    row.slots as f64 / f64::from(dataplane_common::capacity::SLOTS),
                    pct(row.entries_moved.0),
                    pct(row.entries_moved.1),
                    pct(row.flows_moved.0),
                    pct(row.flows_moved.1),
                    row.change_map_ops
                );
            }
        }
        other => {
            let _ = writeln!(m, "Not measured: {}", failed(other).unwrap_or_default());
        }
    }

    let _ = writeln!(m, "\n## 7. The real proxies in the cluster lab\n");
    match &r.fig7 {
        Outcome::Done(f) => {
            let _ = writeln!(m, "{}\n", f.method);
            let floor_side = f.floor_side();
            let floor = f.row(floor_side).map(|row| row.p50_all_us);
            let narrow = f.row(Side::Floor).map(|row| row.p50_all_us);
            let _ = writeln!(
                m,
                "The floor of the ratios and the targets: the {}.\n",
                floor_side.name()
            );
            let _ = writeln!(
                m,
                "| side | Services | p50 per round (µs) | p50 (µs) | p99 (µs) | p99.9 (µs) | p50 over the floor (µs) | p50 / floor | p50 / floor to the 3 pod addresses | samples (failed) | programmed (s) | own sync, mean (ms, syncs) | CPU per 1,000 connections (ms) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for row in f.rows.iter().filter(|row| row.samples == 0) {
                let _ = writeln!(
                    m,
                    "| {} | {} | not programmed within {} s in {} of {} rounds: nothing measured |{}",
                    row.side.name(),
                    row.services,
                    f.limit_s,
                    row.not_programmed,
                    r.config.fig7_rounds,
                    " – |".repeat(10)
                );
            }
            for row in f.rows.iter().filter(|row| row.samples > 0) {
                let to_narrow = match narrow {
                    Some(fl) if row.side != Side::Floor => fmt_ratio(ratio(row.p50_all_us, fl)),
                    _ => "–".into(),
                };
                let (over, ratio) = match floor {
                    Some(fl) if row.side != floor_side && row.side != Side::Floor => (
                        format!("{:.0}", row.p50_all_us - fl),
                        fmt_ratio(ratio(row.p50_all_us, fl)),
                    ),
                    _ => ("–".into(), "–".into()),
                };
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {over} | {ratio} | {to_narrow} | {} ({}) | {} | {} | {} |",
                    row.side.name(),
                    row.services,
                    row.p50_us.show(0),
                    row.p50_all_us,
                    row.p99_all_us,
                    row.p999_all_us,
                    row.samples,
                    row.failed,
                    match (&row.programmed_s, row.not_programmed) {
                        (Some(p), 0) => p.show(2),
                        (Some(p), k) => format!(
                            "{}; not within {} s in {k} of {} rounds",
                            p.show(2),
                            f.limit_s,
                            r.config.fig7_rounds
                        ),
                        (None, _) => "–".into(),
                    },
                    match (row.own_sync_ms, row.own_syncs) {
                        (Some(ms), Some(n)) => format!("{ms:.1} ({n})"),
                        _ => "–".into(),
                    },
                    row.cpu_ms_per_1k.map_or("–".into(), |c| format!("{c:.0}")),
                );
            }
            loaded_floor(&mut m, f);
            datapath_share(&mut m, f);
            if f.rows.iter().any(|row| !row.rate_steps.is_empty()) {
                let _ = writeln!(
                    m,
                    "\nNew-connection rate (open loop; sustained: at least {}% answered within \
                     1 s of being due and p99 from due to answer at most {RATE_P99_MS} ms):\n\n\
                     | side | highest sustained (connections/s), per round | at it, last round: achieved/s, p99 (ms), machine busy | first rate missed, per round: answered, p99 (ms), machine busy |\n\
                     |---|---:|---:|---|",
                    RATE_ANSWERED * 100.0
                );
                for row in f.rows.iter().filter(|row| !row.rate_steps.is_empty()) {
                    let at = row
                        .rate_steps
                        .last()
                        .and_then(|r| r.iter().rev().find(|s| s.sustained))
                        .map_or("–".into(), |s| {
                            format!(
                                "{:.0}, {:.1}, {:.0}%",
                                s.achieved,
                                s.p99_us / 1e3,
                                s.busy * 100.0
                            )
                        });
                    let missed: Vec<String> = row
                        .rate_steps
                        .iter()
                        .map(|r| {
                            r.iter().find(|s| !s.sustained).map_or(
                                "none (the ladder's top sustained)".into(),
                                |s| {
                                    format!(
                                        "{}/s: {:.2}%, {:.1}, {:.0}%{}{}",
                                        s.offered,
                                        100.0 * (s.connections - s.failed) as f64
                                            / s.connections.max(1) as f64,
                                        s.p99_us / 1e3,
                                        s.busy * 100.0,
                                        if s.no_port > 0 {
                                            format!(" ({} found no free port)", s.no_port)
                                        } else {
                                            String::new()
                                        },
                                        s.clash.map_or(String::new(), |(dropped, remapped)| {
                                            format!(
                                                "; {dropped} dropped on a reply-tuple clash, \
                                                 {remapped} remapped"
                                            )
                                        })
                                    )
                                },
                            )
                        })
                        .collect();
                    // A round that sustained the ladder's top is a lower bound.
                    let highest: Vec<String> = row
                        .rate_steps
                        .iter()
                        .map(|r| {
                            let h = super::real::highest_sustained(r);
                            if r.iter().all(|s| s.sustained) {
                                format!("≥ {h}")
                            } else {
                                h.to_string()
                            }
                        })
                        .collect();
                    let _ = writeln!(
                        m,
                        "| {} | {} | {at} | {} |",
                        row.side.name(),
                        highest.join(", "),
                        missed.join("; ")
                    );
                }
            }
            let _ = writeln!(
                m,
                "\nUnder churn ({CHURN_RATE} endpoint changes a second through the API, each \
                 moving one of the selector-less Services' endpoint to another backend; every \
                 {CHURN_PROBE_EVERY}th change followed from the client pod until a connection \
                 reaches the new endpoint; the API write is the time from a change's stamp until \
                 the API server answered its write, the API server's share of the other two; \
                 before each churn the figure waited until the API server's watch had caught \
                 up with the sides before, {CATCH_UP_IN_A_ROW} marker changes in a row \
                 delivered to its own watch within {} ms of their write's answer, at most \
                 {} s, per round in the last column):\n\n\
                 | side | changes | followed (not seen in 30 s) | change to first packet, p50 / p99 (ms) | own network-programming histogram, p50 / p99 (ms, bucket bounds) | API write, p50 / p99 (ms) | waited for the API server before, per round (s) |\n\
                 |---|---:|---:|---:|---:|---:|---:|",
                CATCH_UP_BOUND.as_millis(),
                CATCH_UP_CAP.as_secs()
            );
            for row in f.rows.iter().filter(|row| row.churn_changes.is_some()) {
                let pair = |p: Option<(f64, f64)>| {
                    p.map_or("–".into(), |(a, b)| format!("{a:.0} / {b:.0}"))
                };
                let waited: Vec<String> = row
                    .churn_catch_up
                    .iter()
                    .map(|w| {
                        if w.caught_up {
                            format!("{:.1}", w.waited_s)
                        } else {
                            format!("{:.1} (not caught up)", w.waited_s)
                        }
                    })
                    .collect();
                let _ = writeln!(
                    m,
                    "| {} | {} | {} ({}) | {} | {} | {} | {} |",
                    row.side.name(),
                    row.churn_changes.unwrap_or(0),
                    row.churn_probes.unwrap_or(0),
                    row.churn_not_seen.unwrap_or(0),
                    pair(row.churn_first_packet_ms),
                    pair(row.churn_own_ms),
                    pair(row.churn_write_ms),
                    if waited.is_empty() {
                        "–".into()
                    } else {
                        waited.join(", ")
                    },
                );
            }
            let capped = f
                .rows
                .iter()
                .flat_map(|row| &row.churn_catch_up)
                .filter(|w| !w.caught_up)
                .count();
            if capped > 0 {
                let _ = writeln!(
                    m,
                    "\n{capped} of the churns started with the API server's watch still behind \
                     ({} s passed without {CATCH_UP_IN_A_ROW} prompt marker changes in a row): \
                     their figures may carry the sides before.",
                    CATCH_UP_CAP.as_secs()
                );
            }
            let _ = writeln!(
                m,
                "\nCreating the {} Services and seeing each with its slice took {:.1} s.",
                f.rows.first().map_or(0, |row| row.services),
                f.populate_s
            );
        }
        other => {
            let _ = writeln!(m, "Not measured: {}", failed(other).unwrap_or_default());
        }
    }

    if !plots.is_empty() {
        let _ = writeln!(m, "\n## Plots\n");
        for (file, title) in plots {
            let _ = writeln!(m, "- [{title}]({file})");
        }
    }
    m
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

/// Figure 7's connections straight to the pods in each proxy's turn, just before it
/// started and with it loaded, beside the side's own.
fn loaded_floor(m: &mut String, f: &super::real::Fig7) {
    let rows: Vec<_> = f
        .rows
        .iter()
        .filter_map(|row| Some((row, row.loaded_floor_us?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        m,
        "\nStraight to the backend pods in each proxy's turn (the floor's connections): \
         just before the proxy started, on the cleaned node, and right after the \
         proxy's own connections with it still loaded. Loaded less before: what the \
         loaded proxy costs connections that use no Service; the side's own p50 less \
         loaded: what a Service's path adds.\n\n| side | before the proxy, p50 / p99 \
         (µs) | proxy loaded, p50 / p99 (µs) | loaded less before, p50 (µs) | the side's \
         own p50 less loaded (µs) |\n|---|---:|---:|---:|---:|"
    );
    for (row, (p50, p99)) in rows {
        let (before, cost) = match row.unloaded_floor_us {
            Some((b50, b99)) => (format!("{b50:.0} / {b99:.0}"), format!("{:.0}", p50 - b50)),
            None => ("–".into(), "–".into()),
        };
        let _ = writeln!(
            m,
            "| {} | {before} | {p50:.0} / {p99:.0} | {cost} | {:.0} |",
            row.side.name(),
            row.p50_all_us - p50
        );
    }
}

/// sliceway's programs per connection, from the kernel's run statistics, beside
/// sliceway's p50 over the floor: how much of the proxy's cost is its programs'.
fn datapath_share(m: &mut String, f: &super::real::Fig7) {
    let Some(d) = &f.datapath else {
        if let Some(e) = &f.datapath_error {
            let _ = writeln!(
                m,
                "\nsliceway's programs per connection: not measured ({e})."
            );
        }
        return;
    };
    let (rows, all) = d.per_connection();
    let over = match (f.row(Side::Sliceway), f.row(f.floor_side())) {
        (Some(s), Some(fl)) => format!(
            ", against sliceway's p50 over the floor of {:.1} µs (every run of a connection \
             is counted, packets off its critical path too, such as the last ACKs and \
             FINs)",
            s.p50_all_us - fl.p50_all_us
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        m,
        "\nsliceway's programs per connection, from the kernel's run statistics \
         (`BPF_ENABLE_STATS`) over {} connections like the measured ones, run after them \
         with the statistics on (which add two clock reads to every run): {all:.2} µs in \
         all{over}.\n\n| program | runs per connection | µs per connection | ns per run |\n|---|---:|---:|---:|",
        d.connections
    );
    for r in rows {
        let _ = writeln!(
            m,
            "| {} | {:.2} | {:.2} | {:.0} |",
            r.program, r.runs, r.us, r.ns_per_run
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::node::{Fig2Row, NotLoaded};
    use super::super::real::{Fig7, Fig7Row};
    use super::*;

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

    #[test]
    fn figure_2_names_a_side_measured_on_a_busy_machine_and_a_baseline_not_loaded() {
        let row = |proxy, quiet| Fig2Row {
            services: 100_000,
            proxy,
            p50_us: Summary::of(&[60.0]),
            p99_us: Summary::of(&[120.0]),
            connections: 900,
            failed: 0,
            quiet,
        };
        let f = Fig2 {
            method: String::new(),
            ipvs: String::new(),
            rows: vec![row(Proxy::Sliceway, true), row(Proxy::Iptables, false)],
            not_loaded: vec![NotLoaded {
                services: 100_000,
                proxy: Proxy::Nftables,
                loader: Loader::Nft,
                limit_s: 300,
                error: None,
            }],
        };
        let mut m = String::new();
        fig2_notes(&mut m, &f);
        let lines: Vec<&str> = m.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 2, "{m}");
        assert!(
            lines[0].starts_with(&format!(
                "{} at 100000 Services: measured on a busy machine",
                Proxy::Iptables.name()
            )),
            "{m}"
        );
        assert!(lines[0].contains("after 60 s"), "{m}");
        assert!(
            lines[1].contains("not measured, its rules did not load within 300 s"),
            "{m}"
        );
    }

    #[test]
    fn the_loaded_floor_is_set_against_its_turns_floor_before_the_proxy_and_the_sides_own_p50() {
        let row = |side, p50_all_us, loaded_floor_us, unloaded_floor_us| Fig7Row {
            side,
            samples: 10,
            p50_all_us,
            loaded_floor_us,
            unloaded_floor_us,
            ..Fig7Row::default()
        };
        let mut f = Fig7 {
            rows: vec![
                row(Side::Floor, 100.0, None, None),
                row(
                    Side::Sliceway,
                    143.0,
                    Some((120.0, 200.0)),
                    Some((101.0, 190.0)),
                ),
                row(Side::SlicewayPods, 130.0, Some((125.0, 210.0)), None),
                row(Side::Nftables, 150.0, None, None),
            ],
            ..Fig7::default()
        };
        let mut m = String::new();
        loaded_floor(&mut m, &f);
        // Loaded 19 over before, and the Service's path 23 over loaded.
        assert!(
            m.contains("| sliceway | 101 / 190 | 120 / 200 | 19 | 23 |"),
            "{m}"
        );
        // Without its partner, the loaded figure alone.
        assert!(
            m.contains("| sliceway --socket-lb-pods | – | 125 / 210 | – | 5 |"),
            "{m}"
        );
        assert!(
            !m.contains("| kube-proxy nftables |"),
            "not measured, no line: {m}"
        );
        // No side measured it: no table.
        for row in &mut f.rows {
            row.loaded_floor_us = None;
        }
        let mut m = String::new();
        loaded_floor(&mut m, &f);
        assert_eq!(m, "");
    }
}

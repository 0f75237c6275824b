//! Figure 7's section of the report and its targets: the real proxies in the cluster lab.

use std::fmt::Write as _;

use super::{fmt_ratio, measured, target, Target};
use crate::real::{
    Fig7, Fig7Row, Side, CATCH_UP_BOUND, CATCH_UP_CAP, CATCH_UP_IN_A_ROW, CHURN_PROBE_EVERY,
    CHURN_RATE, RATE_ANSWERED, RATE_P99_MS,
};
use crate::stats::ratio;
use crate::Outcome;

/// Figure 7's section: how it was measured, the latency table, the floor with each
/// proxy loaded, sliceway's programs' share, the new-connection rate, the churn and
/// the time to create the Services. `rounds` are the rounds the run asked for.
pub(super) fn real_proxies(m: &mut String, fig7: &Outcome<Fig7>, rounds: usize) {
    let _ = writeln!(m, "\n## 7. The real proxies in the cluster lab\n");
    let Some(f) = measured(m, fig7) else {
        return;
    };
    let _ = writeln!(m, "{}\n", f.method);
    latency_table(m, f, rounds);
    loaded_floor(m, f);
    datapath_share(m, f);
    rate_table(m, f);
    churn_table(m, f);
    let _ = writeln!(
        m,
        "\nCreating the {} Services and seeing each with its slice took {:.1} s.",
        f.rows.first().map_or(0, |row| row.services),
        f.populate_s
    );
}

/// Figure 7's main table: which floor the ratios are taken against, then a line per
/// side, those never programmed within the limit first.
fn latency_table(m: &mut String, f: &Fig7, rounds: usize) {
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
            rounds,
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
                    rounds
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
}

/// Figure 7's connections straight to the pods in each proxy's turn, just before it
/// started and with it loaded, beside the side's own.
fn loaded_floor(m: &mut String, f: &Fig7) {
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
fn datapath_share(m: &mut String, f: &Fig7) {
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

/// Figure 7's new-connection rate: a line per side that climbed the ladder of
/// offered rates; no table when none did.
fn rate_table(m: &mut String, f: &Fig7) {
    if f.rows.iter().all(|row| row.rate_steps.is_empty()) {
        return;
    }
    let _ = writeln!(
        m,
        "\nNew-connection rate (open loop; sustained: at least {}% answered within \
         1 s of being due and p99 from due to answer at most {RATE_P99_MS} ms):\n\n\
         | side | highest sustained (connections/s), per round | at it, last round: achieved/s, p99 (ms), machine busy | first rate missed, per round: answered, p99 (ms), machine busy |\n\
         |---|---:|---:|---|",
        RATE_ANSWERED * 100.0
    );
    for row in f.rows.iter().filter(|row| !row.rate_steps.is_empty()) {
        rate_row(m, row);
    }
}

/// One side's line of the rate table: the highest rate sustained per round, what the
/// last round achieved at it, and the first rate each round missed.
fn rate_row(m: &mut String, row: &Fig7Row) {
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
                        100.0 * (s.connections - s.failed) as f64 / s.connections.max(1) as f64,
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
            let h = crate::real::highest_sustained(r);
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

/// Figure 7 under churn: how it was measured, a line per side that was churned, and
/// a note when a churn started before the API server's watch had caught up.
fn churn_table(m: &mut String, f: &Fig7) {
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
        let pair =
            |p: Option<(f64, f64)>| p.map_or("–".into(), |(a, b)| format!("{a:.0} / {b:.0}"));
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
}

/// Figure 7's targets, four for each of sliceway's modes: new-connection p50 and
/// p99 against the floor (and p50 against kube-proxy's modes), CPU per connection
/// and network programming under churn against kube-proxy's modes.
pub(super) fn targets(fig7: &Outcome<Fig7>) -> Vec<Target> {
    let mut out = Vec::new();
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
            fig7.ok().filter(|f| f.rows.iter().any(|row| row.services == 10_000)).and_then(|f| {
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
            fig7
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
            fig7.ok()
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
            fig7.ok().filter(|f| f.rows.iter().any(|row| row.services == 10_000)).and_then(|f| {
                let p99 = |row: &Fig7Row| row.churn_first_packet_ms.map(|p| p.1);
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

#[cfg(test)]
mod tests {
    use super::*;

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

//! Figure 2's section of the report and its targets: new-connection latency through the node.

use std::fmt::Write as _;

use super::{fmt_ratio, measured, target, Target};
use crate::node::{Fig2, Loader, Proxy, QUIET_LIMIT, QUIET_MS_PER_S};
use crate::stats::ratio;
use crate::Outcome;

/// Figure 2's section: how it was measured, a line per size and proxy against
/// sliceway and the floor, and the notes on the sides measured on a busy machine or
/// not at all.
pub(super) fn latency(m: &mut String, fig2: &Outcome<Fig2>) {
    let _ = writeln!(m, "\n## 2. New-connection latency through the node\n");
    let Some(f) = measured(m, fig2) else {
        return;
    };
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
    notes(m, f);
}

/// Figure 2's notes under its table: the sides measured on a busy machine, the
/// baselines not measured and why.
fn notes(m: &mut String, f: &Fig2) {
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

/// Figure 2's targets: sliceway's new-connection latency at 10,000 Services against
/// the baselines', and at 100,000 against 1,000. `iptables` is the loader the run
/// measured iptables with.
pub(super) fn targets(fig2: &Outcome<Fig2>, iptables: Loader) -> Vec<Target> {
    let fig2 = fig2.ok();
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
    vec![
        target(
            2,
            "new-connection latency (p50) at 10,000 Services at most half of iptables'",
            match at10k {
                (Some(s), Some(i), _) => Some((
                    format!(
                        "{s:.0} µs vs {i:.0} µs ({}): {:.2}x",
                        iptables.name(),
                        s / i
                    ),
                    s <= i / 2.0,
                )),
                _ => None,
            },
        ),
        target(
            2,
            "new-connection latency (p50) at 10,000 Services no worse than nftables'",
            match at10k {
                (Some(s), _, Some(n)) => {
                    Some((format!("{s:.0} µs vs {n:.0} µs: {:.2}x", s / n), s <= n))
                }
                _ => None,
            },
        ),
        target(
            2,
            "new-connection latency (p50) at 100,000 Services the same as at 1,000 (within 10%)",
            match (p50(100_000, Proxy::Sliceway), p50(1_000, Proxy::Sliceway)) {
                (Some(big), Some(small)) => Some((
                    format!(
                        "{big:.0} µs vs {small:.0} µs: {:.2}x (iptables with {}: {})",
                        big / small,
                        iptables.name(),
                        match (p50(100_000, Proxy::Iptables), p50(1_000, Proxy::Iptables)) {
                            (Some(b), Some(s)) => format!("{b:.0} vs {s:.0} µs, {:.2}x", b / s),
                            _ => "not measured at both sizes".into(),
                        }
                    ),
                    big <= 1.1 * small,
                )),
                _ => None,
            },
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Fig2Row, Loader, NotLoaded};
    use crate::stats::Summary;

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
        notes(&mut m, &f);
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
}

//! Figure 3's section of the report and its targets: programming time.

use std::fmt::Write as _;

use super::{fmt_ratio, measured, target, Target};
use crate::kernel_cost::SlicewayChange;
use crate::node::{BaselineChange, Loader};
use crate::stats::ratio;
use crate::{Fig3, Outcome};

/// Figure 3's section: how it was measured, sliceway's full sync beside each
/// baseline's load at every size, and the change of one endpoint.
pub(super) fn programming_time(m: &mut String, fig3: &Outcome<Fig3>) {
    let _ = writeln!(m, "\n## 3. Programming time\n");
    let Some(f) = measured(m, fig3) else {
        return;
    };
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
        one_change(m, c, &f.baseline_change);
    }
}

/// Figure 3's table of one endpoint changed: sliceway's sync, its map writer alone
/// and a recompile of everything, then each baseline's reprogramming, against the
/// sync.
fn one_change(m: &mut String, c: &SlicewayChange, baselines: &[BaselineChange]) {
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
    for b in baselines {
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

/// Figure 3's targets: the full sync of 10,000 Services against iptables-restore's,
/// and the cost of one endpoint change at that size.
pub(super) fn targets(fig3: &Outcome<Fig3>) -> Vec<Target> {
    let fig3 = fig3.ok();
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
    vec![
        target(
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
        ),
        target(
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
        ),
    ]
}

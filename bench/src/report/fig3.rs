//! Figure 3's section of the report: programming time.

use std::fmt::Write as _;

use super::{fmt_ratio, measured};
use crate::kernel_cost::SlicewayChange;
use crate::node::BaselineChange;
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

//! Figure 6's section of the report: Maglev tables.

use std::fmt::Write as _;

use super::measured;
use crate::maglev::Fig6;
use crate::Outcome;

/// Figure 6's section: how it was measured and a line per table size (the
/// ClusterIP placement first).
pub(super) fn maglev_tables(m: &mut String, fig6: &Outcome<Fig6>) {
    let _ = writeln!(m, "\n## 6. Maglev tables\n");
    let Some(f) = measured(m, fig6) else {
        return;
    };
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

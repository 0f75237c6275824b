//! Figure 4's section of the report: the agent's memory.

use std::fmt::Write as _;

use super::measured;
use crate::node::Fig4;
use crate::Outcome;

/// Figure 4's section: how it was measured and a line per size.
pub(super) fn agent_memory(m: &mut String, fig4: &Outcome<Fig4>) {
    let _ = writeln!(m, "\n## 4. Agent memory\n");
    let Some(f) = measured(m, fig4) else {
        return;
    };
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

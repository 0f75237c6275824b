//! Figure 4's section of the report and its target: the agent's memory.

use std::fmt::Write as _;

use super::{measured, target, Target};
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

/// Figure 4's target: the agent's peak memory at 10,000 Services.
pub(super) fn targets(fig4: &Outcome<Fig4>) -> Vec<Target> {
    vec![target(
        4,
        "agent peak RSS under 100 MB at 10,000 Services (10 endpoints each)",
        fig4.ok()
            .and_then(|f| f.rows.iter().find(|row| row.services == 10_000))
            .map(|row| {
                let mb = row.peak_rss_mib.max * 1.048_576;
                (format!("{mb:.1} MB peak (max of runs)"), mb < 100.0)
            }),
    )]
}

//! Figure 1's section of the report: the kernel's cost per packet, and the
//! conntrack sweeper's pass measured with it.

use std::fmt::Write as _;

use super::{fmt_ratio, measured};
use crate::kernel_cost::{ConntrackGc, Fig1};
use crate::stats::Summary;
use crate::Outcome;

/// Figure 1's section: how it was measured, a line per size in nanoseconds per
/// packet, and the largest size over the smallest.
pub(super) fn kernel_cost(m: &mut String, fig1: &Outcome<Fig1>) {
    let _ = writeln!(m, "\n## 1. Kernel cost per packet\n");
    let Some(f) = measured(m, fig1) else {
        return;
    };
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

/// The conntrack sweeper's subsection under figure 1: how it was measured and its
/// one pass over the map.
pub(super) fn conntrack_gc(m: &mut String, gc: &Outcome<ConntrackGc>) {
    let _ = writeln!(m, "\n### Conntrack garbage collection\n");
    let Some(g) = measured(m, gc) else {
        return;
    };
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

/// Nanoseconds: the median with its spread, no decimals.
fn ns(s: &Summary) -> String {
    s.show(0)
}

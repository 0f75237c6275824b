//! Figure 5's section of the report and its target: the controller, through the
//! API server and in code.

use std::fmt::Write as _;

use super::{fmt_ratio, target, Target};
use crate::controller::api::{SideSummary, ThroughApi};
use crate::controller::Fig5;
use crate::stats::Summary;
use crate::Config;

/// Figure 5's section: the table through the API server (or why it is missing,
/// when the run selected the figure), then the rolling update and the cold start in
/// code, and what of them is missing.
pub(super) fn controller(m: &mut String, f: &Fig5, cfg: &Config) {
    let _ = writeln!(m, "\n## 5. Controller\n");
    if let Some(a) = &f.through_api {
        through_api(m, a);
    } else if cfg.runs(5) {
        let _ = writeln!(
            m,
            "{}: {}\n",
            if cfg.fig5_api_rounds == 0 {
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
    in_code(m, f);
}

/// Figure 5's table through the API server: one line per measure, both sides and
/// their ratio.
fn through_api(m: &mut String, a: &ThroughApi) {
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

/// Figure 5 in code, with no API server: the rolling update's writes with Endpoints
/// against EndpointSlices, the cold start, and the parts not measured.
fn in_code(m: &mut String, f: &Fig5) {
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
}

/// `median [min–max]`, or the median alone when every run gave the same.
fn spread(s: &Summary, digits: usize) -> String {
    if s.runs > 0 && s.min == s.max {
        format!("{:.d$}", s.median, d = digits)
    } else {
        s.show(digits)
    }
}

/// Figure 5's target: the bytes a rolling update of a 5,000-pod Service writes,
/// Endpoints against EndpointSlices. `pods` is the size the run asked for.
pub(super) fn targets(f: &Fig5, pods: usize) -> Vec<Target> {
    vec![target(
        5,
        "rolling update of a 5,000-pod Service: at least 50x fewer bytes with EndpointSlices",
        (f.rolling_update.is_some() && pods == 5_000)
            .then_some((f.untruncated_bytes_ratio, f.bytes_ratio))
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
    )]
}

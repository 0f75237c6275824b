//! Smoke test of the benchmark harness: `sliceway-bench --smoke` on tiny sizes must
//! write the report, its JSON and plots, with every figure measured. Benchmarks are
//! not tests; this only keeps the harness from rotting. Needs root, like the other
//! node-lab tests, and the agent built (`cargo xtask test` builds it).

use std::process::Command;

#[test]
fn bench_smoke_writes_every_figure() {
    let out = std::env::temp_dir().join(format!("sliceway-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_sliceway-bench"))
        .args(["--smoke", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "sliceway-bench --smoke failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for heading in [
        "## Targets",
        "## Programs per kernel",
        "## 1. Kernel cost per packet",
        "### Conntrack garbage collection",
        "## 2. New-connection latency through the node",
        "## 3. Programming time",
        "## 4. Agent memory",
        "## 5. Controller",
        "## 6. Maglev tables",
        "## 7. The real proxies in the cluster lab",
    ] {
        assert!(md.contains(heading), "{heading} missing from:\n{md}");
    }
    assert!(!md.contains("Not measured:"), "a figure failed:\n{md}");
    // The run's idle states, in its first lines: held (root, the PM QoS device
    // present) or why not.
    let head: String = md.lines().take(4).collect();
    assert!(
        head.contains("idle cores kept polling") || head.contains("could not be held"),
        "the idle states are not in the report's head:\n{head}"
    );
    // This kernel's row for each program, loaded (issue 18).
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for program in ["sliceway_tc", "sliceway_reject"] {
        assert!(
            md.lines()
                .any(|l| l.starts_with(&format!("| {} |", release.trim()))
                    && l.contains(&format!("| {program} |"))
                    && l.ends_with("| loaded |")),
            "no row for {program} on this kernel:\n{md}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    for fig in [
        "fig1",
        "conntrack_gc",
        "fig2",
        "fig3",
        "fig4",
        "fig5",
        "fig6",
        "fig7",
        "programs",
        "targets",
    ] {
        assert!(json.get(fig).is_some(), "{fig} missing from report.json");
    }
    // Under churn each proxy's side has the API server's share beside it.
    for row in json["fig7"]["rows"].as_array().into_iter().flatten() {
        eprintln!(
            "figure 7, {}: waited for the API server before the churn: {}",
            row["side"], row["churn_catch_up"]
        );
        if row["churn_changes"].as_u64().is_some_and(|n| n > 0) {
            assert!(
                row["churn_write_ms"][0].as_f64().is_some_and(|ms| ms > 0.0),
                "no API write time under churn: {row}"
            );
            // And the wait for the API server before each round's churn.
            assert!(
                row["churn_catch_up"]
                    .as_array()
                    .is_some_and(|w| !w.is_empty() && w.iter().all(|w| w["waited_s"].is_f64())),
                "no catch-up wait before the churn: {row}"
            );
        }
    }
    // Both of sliceway's modes measured connections.
    for side in ["sliceway", "sliceway_pods"] {
        assert!(
            json["fig7"]["rows"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|row| row["side"] == side && row["samples"].as_u64().is_some_and(|n| n > 0)),
            "figure 7 has no {side} row with samples"
        );
    }
    // Each proxy's turn made the floor's connections before it started and loaded.
    for row in json["fig7"]["rows"].as_array().into_iter().flatten() {
        if row["samples"].as_u64().is_some_and(|n| n > 0)
            && !row["side"].as_str().is_some_and(|s| s.starts_with("floor"))
        {
            for pair in ["loaded_floor_us", "unloaded_floor_us"] {
                assert!(
                    row[pair][0].as_f64().is_some_and(|us| us > 0.0),
                    "no {pair}: {row}"
                );
            }
        }
    }
    assert!(
        md.contains("Straight to the backend pods in each proxy's turn"),
        "{md}"
    );
    // sliceway's programs per connection, from the kernel's run statistics: its TC
    // program ran on the connections' packets, at least the SYN and its reply each.
    let datapath = &json["fig7"]["datapath"];
    let connections = datapath["connections"].as_u64().unwrap_or(0);
    let tc_runs = datapath["programs"]["sliceway_tc"][0].as_u64().unwrap_or(0);
    assert!(
        connections > 0 && tc_runs >= 2 * connections,
        "sliceway's programs per connection: {datapath} ({})",
        json["fig7"]["datapath_error"]
    );
    assert!(
        md.contains("sliceway's programs per connection, from the kernel's run statistics"),
        "{md}"
    );
    for png in [
        "fig1-per-packet.png",
        "fig2-connection-latency.png",
        "fig3-programming-time.png",
        "fig4-agent-memory.png",
    ] {
        let p = out.join(png);
        // Plots need a TrueType font; without one the report says they were skipped.
        if md.contains("## Plots") {
            assert!(p.is_file(), "{png} missing");
        }
    }
    std::fs::remove_dir_all(&out).unwrap();
}

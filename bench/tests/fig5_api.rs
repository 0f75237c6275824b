//! Figure 5 through the API server (`controller::api`) works end to end on the
//! smallest workload: both controllers settle, every step of the rolling update
//! reaches the slices and Endpoints, and kube-apiserver counts each side's writes.
//! The smoke run leaves this part out (a control plane of its own costs it about
//! 30 s), so this test keeps it from rotting; it is ignored by default for the same
//! reason: `cargo test -p bench --test fig5_api -- --ignored` runs it. Needs root
//! and sliceway-controller built beside the test binaries (`cargo xtask test` builds
//! it), like the cluster-lab tests.

use sliceway_bench::controller::api::{run, ApiSpec};
use sliceway_lab::cluster;

#[test]
#[ignore = "a control plane of its own: about 30 s; run with --ignored"]
fn figure_5_through_the_api_server_runs_both_sides() -> anyhow::Result<()> {
    let parent = std::env::temp_dir();
    let prefix = format!("{}-{}-fig5", cluster::NS_PREFIX, std::process::id());
    let spec = ApiSpec {
        services: 2,
        pods_per_service: 2,
        rounds: 1,
        idle_seconds: 0.5,
    };
    let r = run(&spec, &parent.join(&prefix), &prefix)?;
    assert_eq!((r.pods_replaced, r.pod_changes, r.runs.len()), (4, 16, 2));
    // Every step is waited for before the next, so no write can cover two: each of
    // the 16 Pod changes changes its Service's slice, and two of each Pod's four (the
    // new Pod ready, the old one terminating) its Endpoints.
    for s in [&r.sliceway, &r.upstream] {
        assert!(s.slice_writes.median >= 16.0, "{s:?}");
        assert!(s.endpoints_writes.median >= 8.0, "{s:?}");
        assert!(s.slice_bytes.median > 0.0 && s.cpu_ms.median > 0.0, "{s:?}");
    }
    Ok(())
}

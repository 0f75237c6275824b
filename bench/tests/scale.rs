//! The controller-at-scale measurement (`sliceway-bench scale`) works end to end on
//! a small cluster: every Service settles and every single-Pod change reaches its
//! slice. Benchmarks are not tests: this only keeps the measurement from rotting
//! (the figures come from `cargo xtask bench scale` at 10,000 Services). Needs root
//! and sliceway-controller built beside the test binaries (`cargo xtask test`
//! builds it), like the cluster-lab tests.

use sliceway_bench::scale::{run, ScaleSpec};
use sliceway_lab::cluster;

#[test]
fn the_scale_measurement_runs_on_a_small_cluster() -> anyhow::Result<()> {
    let parent = std::env::temp_dir();
    let prefix = format!("{}-{}-scale", cluster::NS_PREFIX, std::process::id());
    let spec = ScaleSpec {
        services: 30,
        pods_per_service: 3,
        nodes: 3,
        changes: 12,
        profile: None,
        controller: sliceway_bench::controller::api::Side::Sliceway,
    };
    let r = run(&spec, &parent.join(&prefix), &prefix)?;
    assert_eq!((r.services, r.pods, r.changes), (30, 90, 12));
    assert!(r.cpu_per_change_gross_ms > 0.0, "{r:?}");
    // The controller's own account: its syncs' CPU, and a sync that wrote (`ok`)
    // for every change, each having reached its slice (but perhaps the last, whose
    // write the bench may see before the controller has counted it).
    assert!(r.sync_cpu_per_change_ms.is_some_and(|ms| ms > 0.0), "{r:?}");
    // The syncs as polled hold their own work and more (their writes).
    assert!(
        r.reconcile_cpu_per_change_ms
            .zip(r.sync_cpu_per_change_ms)
            .is_some_and(|(polled, own)| polled > own),
        "{r:?}"
    );
    let ok = r
        .syncs_per_change_by_result
        .get("ok")
        .copied()
        .unwrap_or(0.0);
    assert!(ok * 12.0 >= 11.0 - 1e-9, "{r:?}");
    Ok(())
}

//! Figure 5: the controller's benchmarks. In code, with no API server
//! ([`workloads`], through the `controller` crate as a library): Endpoints against
//! EndpointSlices on a large rolling update, and a cold start. Through the real API
//! server ([`api`]): sliceway-controller beside kube-controller-manager on the same
//! rolling update, writes, bytes and CPU as kube-apiserver and the kernel count them.

pub mod api;
pub mod workloads;

use std::path::Path;

use serde::Serialize;

use crate::{stats::Summary, Config};
use workloads::{ColdStartReport, RollingUpdateReport};

/// Figure 5.
#[derive(Clone, Debug, Serialize)]
pub struct Fig5 {
    pub method: String,
    /// Why a part is missing, if one is.
    pub unavailable: Vec<String>,
    /// The rolling update's writes and bytes.
    pub rolling_update: Option<RollingUpdateReport>,
    /// Bytes written with Endpoints over bytes written with EndpointSlices.
    pub bytes_ratio: Option<f64>,
    /// Writes with Endpoints over writes with EndpointSlices.
    pub writes_ratio: Option<f64>,
    /// Bytes of Endpoints holding every address over bytes with EndpointSlices.
    pub untruncated_bytes_ratio: Option<f64>,
    /// Writes of Endpoints holding every address over writes with EndpointSlices.
    pub untruncated_writes_ratio: Option<f64>,
    /// The cold start (last run).
    pub cold_start: Option<ColdStartReport>,
    /// Cold-start reconcile time over the runs, milliseconds.
    pub cold_start_ms: Summary,
    /// sliceway-controller beside kube-controller-manager through the API server.
    pub through_api: Option<api::ThroughApi>,
}

impl Fig5 {
    /// Figure 5 when `--only` left it out.
    pub fn not_selected() -> Self {
        Self {
            method: String::new(),
            unavailable: vec!["not selected with --only".into()],
            rolling_update: None,
            bytes_ratio: None,
            writes_ratio: None,
            untruncated_bytes_ratio: None,
            untruncated_writes_ratio: None,
            cold_start: None,
            cold_start_ms: Summary::default(),
            through_api: None,
        }
    }
}

/// Runs of the cold start: once in a quick run.
fn cold_start_runs(cfg: &Config) -> usize {
    match cfg.mode {
        crate::Mode::Quick => 1,
        _ => cfg.rounds.min(3),
    }
}

/// Figure 5; the API server's control plane lives under `out`.
pub fn controller(cfg: &Config, out: &Path) -> Fig5 {
    let runs = cold_start_runs(cfg);
    let method = format!(
        "In code: a rolling update of a {pods}-pod Service, pod by pod, reconciled with no API \
         server (`workloads::rolling_update`); API writes and JSON bytes written with \
         EndpointSlices and with Endpoints (each write counted with the JSON of the whole \
         object; deletes count no bytes). The Endpoints controller truncates an object to 1000 \
         addresses, as upstream, so past that size its writes leave most Pods out; a second \
         run with the Endpoints controller alone and no cap counts the Endpoints that carry \
         every address, the same information as the slices, and the target is checked against \
         that. A cold start (`workloads::cold_start`) of {s} Services and {p} Pods: one \
         reconcile pass from nothing, {runs} runs, median [min–max].",
        pods = cfg.fig5_pods,
        s = cfg.fig5_cold_services,
        p = cfg.fig5_cold_pods,
    );
    let r = workloads::rolling_update(cfg.fig5_pods);
    let over = |a: u64, b: u64| crate::stats::ratio(a as f64, b as f64);
    let mut ms = Vec::new();
    let mut cold_start = None;
    for _ in 0..runs {
        let run = workloads::cold_start(cfg.fig5_cold_services, cfg.fig5_cold_pods);
        ms.push(run.millis);
        cold_start = Some(run);
    }
    let spec = api::ApiSpec {
        services: cfg.fig5_api_services,
        pods_per_service: cfg.fig5_api_pods,
        rounds: cfg.fig5_api_rounds,
        idle_seconds: cfg.fig5_api_idle_seconds,
    };
    let prefix = format!(
        "{}-{}-fig5",
        sliceway_lab::cluster::NS_PREFIX,
        std::process::id()
    );
    let mut unavailable = Vec::new();
    let through_api = if spec.rounds == 0 {
        unavailable.push(
            "through the API server: not run at these sizes (0 rounds; the smoke run leaves it \
             out)"
                .into(),
        );
        None
    } else {
        crate::progress(
            "figure 5: sliceway-controller and kube-controller-manager through the API server",
        );
        match api::run(&spec, &out.join("fig5-cluster"), &prefix) {
            Ok(r) => Some(r),
            Err(e) => {
                unavailable.push(format!("through the API server: {e:#}"));
                None
            }
        }
    };
    Fig5 {
        method,
        unavailable,
        through_api,
        bytes_ratio: over(r.endpoints_bytes, r.slice_bytes),
        writes_ratio: over(r.endpoints_writes, r.slice_writes),
        untruncated_bytes_ratio: over(r.endpoints_untruncated_bytes, r.slice_bytes),
        untruncated_writes_ratio: over(r.endpoints_untruncated_writes, r.slice_writes),
        rolling_update: Some(r),
        cold_start,
        cold_start_ms: Summary::of(&ms),
    }
}

//! Figure 5: the controller's benchmarks, run through the `sliceway-controller`
//! binary (`bench-rolling-update`, `bench-cold-start`) when it is built next to this
//! one; reported as not available otherwise.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::{stats::Summary, Config};
use crate::workspace_binary;

/// Figure 5.
#[derive(Clone, Debug, Serialize)]
pub struct Fig5 {
    pub method: String,
    /// Why a part is missing, if one is.
    pub unavailable: Vec<String>,
    /// The binary's JSON for the rolling update.
    pub rolling_update: Option<Value>,
    /// Bytes written with Endpoints over bytes written with EndpointSlices.
    pub bytes_ratio: Option<f64>,
    /// Writes with Endpoints over writes with EndpointSlices.
    pub writes_ratio: Option<f64>,
    /// Bytes of Endpoints holding every address over bytes with EndpointSlices.
    pub untruncated_bytes_ratio: Option<f64>,
    /// Writes of Endpoints holding every address over writes with EndpointSlices.
    pub untruncated_writes_ratio: Option<f64>,
    /// The binary's JSON for the cold start (last run).
    pub cold_start: Option<Value>,
    /// Cold-start reconcile time over the runs, milliseconds.
    pub cold_start_ms: Summary,
}

fn run_json(args: &[String], limit: Duration) -> Result<Value> {
    let bin = workspace_binary("sliceway-controller")?;
    let mut child = Command::new(&bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let start = Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "sliceway-controller {} did not finish within {limit:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "sliceway-controller {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("sliceway-controller printed no JSON")
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
        }
    }
}

/// Runs of the cold start: once in a quick run.
fn cold_start_runs(cfg: &Config) -> usize {
    match cfg.mode {
        super::Mode::Quick => 1,
        _ => cfg.rounds.min(3),
    }
}

/// Longest one controller benchmark may run.
fn limit(cfg: &Config) -> Duration {
    Duration::from_secs(match cfg.mode {
        super::Mode::Smoke => 60,
        super::Mode::Quick => 180,
        super::Mode::Full => 1800,
    })
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key)?.as_f64()
}

/// Figure 5.
pub fn controller(cfg: &Config) -> Fig5 {
    let mut fig = Fig5 {
        method: format!(
            "`sliceway-controller bench-rolling-update --pods {pods} -o json`: a rolling update \
             of a {pods}-pod Service, pod by pod, reconciled in code with no API server; API \
             writes and JSON bytes written with EndpointSlices and with Endpoints (each write \
             counted with the JSON of the whole object; deletes count no bytes). The Endpoints \
             controller truncates an object to 1000 addresses, as upstream, so past that size \
             its writes leave most Pods out; a second run with the Endpoints controller alone \
             and no cap counts the Endpoints that carry every address, the same information \
             as the slices, and the target is checked against that. \
             `sliceway-controller bench-cold-start --services {s} --pods {p} -o json`: one \
             reconcile pass from nothing, {runs} runs, median [min–max].",
            pods = cfg.fig5_pods,
            s = cfg.fig5_cold_services,
            p = cfg.fig5_cold_pods,
            runs = cold_start_runs(cfg),
        ),
        unavailable: Vec::new(),
        rolling_update: None,
        bytes_ratio: None,
        writes_ratio: None,
        untruncated_bytes_ratio: None,
        untruncated_writes_ratio: None,
        cold_start: None,
        cold_start_ms: Summary::default(),
    };
    match run_json(
        &[
            "bench-rolling-update".into(),
            "--pods".into(),
            cfg.fig5_pods.to_string(),
            "-o".into(),
            "json".into(),
        ],
        limit(cfg),
    ) {
        Ok(v) => {
            let get = |k: &str| num(&v, k);
            let over = |a: &str, b: &str| match (get(a), get(b)) {
                (Some(a), Some(b)) => super::stats::ratio(a, b),
                _ => None,
            };
            fig.bytes_ratio = over("endpoints_bytes", "slice_bytes");
            fig.writes_ratio = over("endpoints_writes", "slice_writes");
            fig.untruncated_bytes_ratio = over("endpoints_untruncated_bytes", "slice_bytes");
            fig.untruncated_writes_ratio = over("endpoints_untruncated_writes", "slice_writes");
            fig.rolling_update = Some(v);
        }
        Err(e) => fig
            .unavailable
            .push(format!("rolling update not available: {e:#}")),
    }
    let mut ms = Vec::new();
    for _ in 0..cold_start_runs(cfg) {
        match run_json(
            &[
                "bench-cold-start".into(),
                "--services".into(),
                cfg.fig5_cold_services.to_string(),
                "--pods".into(),
                cfg.fig5_cold_pods.to_string(),
                "-o".into(),
                "json".into(),
            ],
            limit(cfg),
        ) {
            Ok(v) => {
                if let Some(m) = num(&v, "millis") {
                    ms.push(m);
                }
                fig.cold_start = Some(v);
            }
            Err(e) => {
                fig.unavailable
                    .push(format!("cold start not available: {e:#}"));
                break;
            }
        }
    }
    fig.cold_start_ms = Summary::of(&ms);
    fig
}

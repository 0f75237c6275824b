//! sliceway-controller at cluster scale on the real API server: what one Pod change
//! costs the controller in CPU when the cluster holds many Services and Pods
//! (`sliceway-bench scale`, `cargo xtask bench scale`); with `--controller
//! kube-controller-manager`, the same for upstream's endpoint controllers (the whole
//! process). It runs on the cluster lab of the `tests` crate.
//!
//! A control plane without nodes (etcd and kube-apiserver) is filled through the API
//! with Nodes, Services and ready Pods (Pods are created, then given an address and
//! a Ready condition through their status, as a kubelet does); then the controller
//! starts (sliceway-controller with its deployed identity) and reconciles them all. Once every Service has
//! its slice, the controller's CPU time (the sum of its threads' on-CPU nanoseconds
//! from `/proc/PID/task/*/schedstat`) is read around a run of single-Pod changes,
//! each a readiness flip waited for until its slice shows it, and around an idle
//! window of the same length; the cost of a change is the difference over the number
//! of changes. Nothing here depends on wall-clock speed except how long it takes.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use futures::{stream, StreamExt};
use k8s_openapi::api::{
    core::v1::{Node, Pod, Service, ServiceAccount},
    discovery::v1::EndpointSlice,
};
use kube::{
    api::{ListParams, Patch, PatchParams, PostParams},
    Api, Client,
};
use serde::Serialize;
use serde_json::json;

use sliceway_lab::cluster::{Cluster, Controllers, Proxy, Spec};

use crate::controller::api::Side;

/// What to build.
#[derive(Clone, Debug)]
pub struct ScaleSpec {
    pub services: usize,
    pub pods_per_service: usize,
    pub nodes: usize,
    /// Single-Pod changes measured.
    pub changes: usize,
    /// Where to write a `perf record --call-graph dwarf` profile of the controller over the changes.
    pub profile: Option<std::path::PathBuf>,
    /// The controller measured: sliceway-controller, or kube-controller-manager with
    /// only its Endpoints, EndpointSlice and mirroring controllers (the whole process's
    /// CPU), for upstream's figure beside sliceway's.
    pub controller: Side,
}

/// What was measured.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleResult {
    pub controller: Side,
    pub services: usize,
    pub pods: usize,
    pub changes: usize,
    /// Seconds to create the objects through the API.
    pub populate_s: f64,
    /// Seconds from the controller's start until every Service had its slice.
    pub settle_s: f64,
    /// Controller CPU over the changes, the idle share removed, per change.
    pub cpu_per_change_ms: f64,
    /// Controller CPU over the changes, per change, idle share included.
    pub cpu_per_change_gross_ms: f64,
    /// Controller CPU per second while nothing changes.
    pub idle_cpu_ms_per_s: f64,
    /// Mean time from a Pod's status write to its slice showing it.
    pub change_latency_ms: f64,
    /// Of the CPU per change, sliceway-controller's syncs' own work (its
    /// `sync_cpu_seconds_total`: stores read, reconcilers, plan), the rest being
    /// the API edge (watch events decoded, writes encoded and sent, TLS, runtime).
    pub sync_cpu_per_change_ms: Option<f64>,
    /// Of the CPU per change, sliceway-controller's Service syncs as polled
    /// (`reconcile_cpu_seconds_total`): their own work, their events, their writes
    /// built and encoded and the answers read; not the client's HTTP, TLS and socket
    /// work in tasks of its own, the watches or the runtime.
    pub reconcile_cpu_per_change_ms: Option<f64>,
    /// sliceway-controller's Service syncs per change by result (`ok`, `stale`,
    /// `retry`, `error`, `dropped`; `syncs_total`).
    pub syncs_per_change_by_result: BTreeMap<String, f64>,
}

const NS: &str = "scale";
const CONCURRENCY: usize = 48;

pub(crate) fn pod_ip(i: usize) -> String {
    // 10.128.0.0/9: room for 8 million pods, outside the lab's pod and node networks
    // (these pods have no network; only their addresses are written).
    let n = 0x0a80_0000u32 + i as u32 + 1;
    std::net::Ipv4Addr::from(n).to_string()
}

/// Runs `f` on every index with at most [`CONCURRENCY`] requests in flight.
async fn for_each<F, Fut>(what: &str, n: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let start = Instant::now();
    let mut done = 0usize;
    let mut s = stream::iter(0..n).map(&f).buffer_unordered(CONCURRENCY);
    while let Some(r) = s.next().await {
        r.with_context(|| format!("creating {what}"))?;
        done += 1;
        if done.is_multiple_of(10_000) {
            eprintln!(
                "scale: {done}/{n} {what} ({:.0}/s)",
                done as f64 / start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// The controller's CPU time so far: the sum over its threads, nanoseconds.
pub(crate) fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread may end between the listing and the read.
        if let Ok(s) = std::fs::read_to_string(&path) {
            total += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .with_context(|| format!("reading {}", path.display()))?;
        }
    }
    Ok(total)
}

/// Creates namespace `ns`'s `default` ServiceAccount, which a control plane without
/// kube-controller-manager's ServiceAccount controller does not make and Pods need.
pub(crate) async fn default_service_account(client: &Client, ns: &str) -> Result<()> {
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
        )
        .await
        .context("creating the default ServiceAccount")?;
    Ok(())
}

async fn populate(client: &Client, spec: &ScaleSpec) -> Result<()> {
    default_service_account(client, NS).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for_each("nodes", spec.nodes, |i| {
        let nodes = nodes.clone();
        async move {
            let node: Node = serde_json::from_value(json!({"metadata": {
                "name": format!("scale-node-{i}"),
                "labels": {"topology.kubernetes.io/zone": format!("zone-{}", i % 3)},
            }}))?;
            nodes.create(&PostParams::default(), &node).await?;
            Ok(())
        }
    })
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    for_each("services", spec.services, |i| {
        let services = services.clone();
        async move {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": format!("svc-{i}")},
                "spec": {"selector": {"app": format!("app-{i}")},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            }))?;
            services.create(&PostParams::default(), &svc).await?;
            Ok(())
        }
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let total = spec.services * spec.pods_per_service;
    let nodes_n = spec.nodes;
    let per = spec.pods_per_service;
    for_each("pods", total, |i| {
        let pods = pods.clone();
        async move {
            let name = format!("pod-{i}");
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"app": format!("app-{}", i / per)}},
                "spec": {"nodeName": format!("scale-node-{}", i % nodes_n),
                         "containers": [{"name": "c", "image": "lab",
                                         "ports": [{"containerPort": 8080}]}]},
            }))?;
            pods.create(&PostParams::default(), &pod).await?;
            pods.patch_status(&name, &PatchParams::default(), &ready_patch(i, true))
                .await?;
            Ok(())
        }
    })
    .await
}

fn ready_patch(i: usize, ready: bool) -> Patch<serde_json::Value> {
    let status = if ready { "True" } else { "False" };
    Patch::Merge(json!({"status": {
        "phase": "Running",
        "podIP": pod_ip(i),
        "podIPs": [{"ip": pod_ip(i)}],
        "conditions": [{"type": "Ready", "status": status}],
    }}))
}

/// Services that have a slice with all their Pods, of the slices listed in pages.
async fn settled_services(client: &Client, per: usize) -> Result<usize> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let mut by_service: BTreeMap<String, usize> = BTreeMap::new();
    let mut lp = ListParams::default().limit(2000);
    loop {
        let page = slices.list(&lp).await?;
        for s in &page.items {
            if let Some(svc) = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"))
            {
                *by_service.entry(svc.clone()).or_default() += s.endpoints.len();
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    Ok(by_service.values().filter(|n| **n == per).count())
}

/// Whether the slice of Pod `i`'s Service shows it with readiness `ready`.
async fn shows(slices: &Api<EndpointSlice>, i: usize, per: usize, ready: bool) -> Result<bool> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name=svc-{}", i / per));
    let ip = pod_ip(i);
    Ok(slices.list(&lp).await?.items.iter().any(|s| {
        s.endpoints.iter().any(|e| {
            e.addresses.first() == Some(&ip)
                && e.conditions.as_ref().and_then(|c| c.ready) == Some(ready)
        })
    }))
}

/// Builds the cluster under `dir`, measures, and takes it down.
pub fn run(spec: &ScaleSpec, dir: &Path, prefix: &str) -> Result<ScaleResult> {
    ensure!(
        spec.services > 0 && spec.pods_per_service > 0 && spec.nodes > 0 && spec.changes > 0,
        "every count of the scale run must be at least 1"
    );
    // A lab left here by a run killed before its cleanup goes first.
    sliceway_lab::cluster::remove_if_stale(dir)?;
    let cluster = Cluster::up(
        &Spec {
            nodes: 0,
            proxy: Proxy::None,
            controller: Controllers::Sliceway,
            workloads: false,
            apiserver_args: vec![],
            ..Spec::default()
        },
        dir,
        prefix,
    )?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(measure(&cluster, spec))
}

async fn measure(cluster: &Cluster, spec: &ScaleSpec) -> Result<ScaleResult> {
    let client = cluster.client().await?;
    cluster.kubectl(&["create", "namespace", NS])?;
    let t = Instant::now();
    populate(&client, spec).await?;
    let populate_s = t.elapsed().as_secs_f64();
    eprintln!(
        "scale: {} services, {} pods, {} nodes created in {populate_s:.0} s",
        spec.services,
        spec.services * spec.pods_per_service,
        spec.nodes
    );

    let t = Instant::now();
    let metrics_port = crate::controller::api::start(cluster, spec.controller)?;
    let pid = cluster.daemon_pid(spec.controller.daemon())?;
    loop {
        let n = settled_services(&client, spec.pods_per_service).await?;
        if n == spec.services {
            break;
        }
        if t.elapsed() > Duration::from_secs(1800) {
            bail!(
                "only {n} of {} services settled in 30 minutes",
                spec.services
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let settle_s = t.elapsed().as_secs_f64();
    eprintln!("scale: the controller settled in {settle_s:.1} s");
    // Let the last writes' watch events pass.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let per = spec.pods_per_service;
    let total = spec.services * per;
    // Spread over the cluster: a fixed stride through the pods.
    let picks: Vec<usize> = (0..spec.changes).map(|k| (k * 7919 + 13) % total).collect();
    let profiler = match &spec.profile {
        Some(file) => Some(
            std::process::Command::new("perf")
                .args(["record", "--call-graph", "dwarf,16384", "-F", "500", "-o"])
                .arg(file)
                .args(["-p", &pid.to_string()])
                .stdout(std::process::Stdio::null())
                .spawn()
                .context("starting perf record (Debian's linux-perf) for --profile")?,
        ),
        None => None,
    };
    let own0 = metrics_port.map(own_figures).transpose()?;
    let (cpu0, t0) = (cpu_ns(pid)?, Instant::now());
    for (k, &i) in picks.iter().enumerate() {
        // Flip off, then (on the next change of the same pod) on.
        let ready = picks[..k].iter().filter(|&&j| j == i).count() % 2 == 1;
        pods.patch_status(
            &format!("pod-{i}"),
            &PatchParams::default(),
            &ready_patch(i, ready),
        )
        .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !shows(&slices, i, per, ready).await? {
            if Instant::now() > deadline {
                bail!("pod-{i}'s change did not reach its slice in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let (busy_ns, busy) = (cpu_ns(pid)? - cpu0, t0.elapsed());
    let own1 = metrics_port.map(own_figures).transpose()?;
    if let Some(mut perf) = profiler {
        // perf writes its file on SIGINT.
        let _ = std::process::Command::new("kill")
            .args(["-INT", &perf.id().to_string()])
            .status();
        perf.wait().context("waiting for perf record")?;
    }
    // The same span with nothing changing.
    let (cpu1, t1) = (cpu_ns(pid)?, Instant::now());
    tokio::time::sleep(busy.max(Duration::from_secs(5))).await;
    let (idle_ns, idle) = (cpu_ns(pid)? - cpu1, t1.elapsed());
    let idle_rate = idle_ns as f64 / idle.as_secs_f64();
    let net_ns = (busy_ns as f64 - idle_rate * busy.as_secs_f64()).max(0.0);
    let n = spec.changes as f64;
    Ok(ScaleResult {
        controller: spec.controller,
        services: spec.services,
        pods: total,
        changes: spec.changes,
        populate_s,
        settle_s,
        cpu_per_change_ms: net_ns / n / 1e6,
        cpu_per_change_gross_ms: busy_ns as f64 / n / 1e6,
        idle_cpu_ms_per_s: idle_rate / 1e6,
        change_latency_ms: busy.as_secs_f64() * 1e3 / n,
        sync_cpu_per_change_ms: own0
            .as_ref()
            .zip(own1.as_ref())
            .map(|(a, b)| (b.cpu_s - a.cpu_s) * 1e3 / n),
        reconcile_cpu_per_change_ms: own0
            .as_ref()
            .zip(own1.as_ref())
            .map(|(a, b)| (b.polled_s - a.polled_s) * 1e3 / n),
        syncs_per_change_by_result: own0
            .as_ref()
            .zip(own1.as_ref())
            .map(|(a, b)| {
                b.syncs
                    .iter()
                    .map(|(result, after)| {
                        let before = a.syncs.get(result).copied().unwrap_or(0.0);
                        (result.clone(), (after - before) / n)
                    })
                    .filter(|(_, per)| *per > 0.0)
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// The controller's own figures from its `/metrics`.
struct Own {
    /// CPU seconds of its syncs' own work.
    cpu_s: f64,
    /// CPU seconds of its syncs' polls, writes included.
    polled_s: f64,
    /// Syncs by result.
    syncs: BTreeMap<String, f64>,
}

/// Reads [`Own`] from the controller's `/metrics` on the loopback port.
fn own_figures(port: u16) -> Result<Own> {
    use std::io::{Read as _, Write as _};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port))
        .context("connecting to sliceway-controller's /metrics")?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    c.read_to_string(&mut text)?;
    let cpu_s = sliceway_lab::metric_value(&text, "sliceway_controller_sync_cpu_seconds_total")
        .context("sliceway-controller's /metrics has no sync_cpu_seconds_total")?;
    let polled_s =
        sliceway_lab::metric_value(&text, "sliceway_controller_reconcile_cpu_seconds_total")
            .context("sliceway-controller's /metrics has no reconcile_cpu_seconds_total")?;
    let mut syncs = BTreeMap::new();
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("sliceway_controller_syncs_total{") else {
            continue;
        };
        let result = sliceway_lab::sample_label(labels, "result");
        let value = sliceway_lab::sample_value(line).unwrap_or(0.0);
        *syncs.entry(result.to_string()).or_default() += value;
    }
    Ok(Own {
        cpu_s,
        polled_s,
        syncs,
    })
}

impl ScaleResult {
    /// The result as a few lines for people.
    pub fn table(&self) -> String {
        let own = match self.sync_cpu_per_change_ms {
            Some(ms) => format!(
                "of which the syncs as polled, writes built and answers read: {:.3} ms\n\
                 of which the syncs' own work: {ms:.3} ms ({:.2} syncs per change: {})\n",
                self.reconcile_cpu_per_change_ms.unwrap_or(f64::NAN),
                self.syncs_per_change_by_result.values().sum::<f64>(),
                self.syncs_per_change_by_result
                    .iter()
                    .map(|(result, n)| format!("{result} {n:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => String::new(),
        };
        format!(
            "controller {}\n\
             services {}  pods {}  changes {}\n\
             populate {:.0} s  controller settled in {:.1} s\n\
             controller CPU per Pod change: {:.3} ms (gross {:.3} ms, idle {:.3} ms/s)\n\
             {own}\
             mean Pod-status-write to slice: {:.1} ms\n",
            self.controller.name(),
            self.services,
            self.pods,
            self.changes,
            self.populate_s,
            self.settle_s,
            self.cpu_per_change_ms,
            self.cpu_per_change_gross_ms,
            self.idle_cpu_ms_per_s,
            self.change_latency_ms
        )
    }
}

//! Figure 7: the real proxies in the cluster lab. sliceway-agent and upstream's
//! kube-proxy (iptables mode and nftables mode, the binary of the upstream kit) are
//! fed by the same kube-apiserver with the same Services and the same EndpointSlices
//! (written by kube-controller-manager), one proxy at a time on the lab's node, and
//! measured beside the floor: the client connecting straight to the backend pods'
//! addresses, no Service and no proxy. Each round runs every side once, in an order
//! that rotates from round to round, so a drift of the machine's load falls on all
//! of them alike.
//!
//! For each side: new-connection latency (a TCP connect from the client pod to a
//! Service chosen at random, a one-line request and its answer; the backends answer
//! from servers that block in `accept`), p50 per round and p50, p99 and p99.9 over
//! every sample of the run; programming time from the proxy's start until every
//! probed Service answers (the first packet that gets through), and the proxy's own
//! account of its syncs (`kubeproxy_sync_proxy_rules_duration_seconds`,
//! `sliceway_sync_duration_seconds`: mean over the syncs of the run).
//!
//! All traffic stays in the lab's namespaces: the client and backends are pods of
//! the lab's node, and the metrics are read from inside the node's namespace.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use futures::TryStreamExt;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    Api,
};
use serde::Serialize;
use serde_json::json;

use super::{
    node::{busy_ms, connections, realtime, settled, LatencyServers},
    stats::{percentile, Rng, Summary},
    Config,
};
use sliceway_lab::{
    cluster::{Cluster, Controllers, Proxy, Spec},
    in_netns, netns, servers,
};

/// The namespace of the figure's objects.
const NS: &str = "bench";
/// The port the backends' latency servers listen on (their pods' container port is
/// the stand-in's own server, which polls `accept`).
const PORT: u16 = 9090;
/// Backend pods every Service selects.
const BACKENDS: usize = 3;
/// Services whose answers say a proxy is programmed: the first, the last and these
/// many chosen at random.
const PROBES: usize = 8;
/// Services created through the API at once.
const CONCURRENCY: usize = 48;
/// Endpoint changes per second under churn (issue: 50 per second at 10,000 Services).
pub const CHURN_RATE: u32 = 50;
/// Selector-less Services whose slices the churn rewrites (among the figure's N).
const CHURN_SERVICES: usize = 100;
/// Every this many changes, one is followed until the first packet uses it.
pub const CHURN_PROBE_EVERY: usize = 5;
/// New-connection rate: client threads that start the scheduled connections.
pub const RATE_WORKERS: usize = 16;
/// A rate is sustained when at least this share of its connections is answered...
pub const RATE_ANSWERED: f64 = 0.999;
/// ...and the p99 from each connection's scheduled start to its answer is at most
/// this many milliseconds.
pub const RATE_P99_MS: f64 = 10.0;
/// A connection not answered this long after its scheduled start has failed (one not
/// even started by then is counted failed without being tried).
const RATE_TIMEOUT: Duration = Duration::from_secs(1);
/// Between two offered rates, for the queues to drain.
const RATE_PAUSE: Duration = Duration::from_millis(300);
/// The EndpointSlice whose annotation the catch-up wait before each churn rewrites.
/// It is labelled headless, which both proxies' watches leave out (server-side), so
/// no proxy sees it, while it goes through the same watch cache as the churn's slices.
const MARKER: &str = "bench-watch-marker";
/// The annotation the catch-up wait rewrites (a counter).
const MARKER_ANNOTATION: &str = "bench.sliceway.io/marker";
/// The API server has caught up when a marker change reaches the bench's watch within
/// this long of its write's answer...
pub const CATCH_UP_BOUND: Duration = Duration::from_millis(100);
/// ...this many times in a row...
pub const CATCH_UP_IN_A_ROW: usize = 3;
/// ...or, failing that, the churn starts anyway after this long (and says so).
pub const CATCH_UP_CAP: Duration = Duration::from_secs(60);

/// One side of the figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The client to the backend pods' addresses: no Service, no proxy.
    #[default]
    Floor,
    /// The same, to as many addresses as there are Services, all held by the backend
    /// pods ([`wide_floor`]): the client's kernel meets as many destinations as it
    /// does through a proxy.
    #[serde(rename = "floor_wide")]
    FloorWide,
    Sliceway,
    /// sliceway with `--socket-lb-pods`: the client pod's TCP connects translated at
    /// the socket.
    #[serde(rename = "sliceway_pods")]
    SlicewayPods,
    /// kube-proxy, iptables mode.
    Iptables,
    /// kube-proxy, nftables mode.
    Nftables,
}

impl Side {
    pub const ALL: [Side; 6] = [
        Side::Floor,
        Side::FloorWide,
        Side::Sliceway,
        Side::SlicewayPods,
        Side::Iptables,
        Side::Nftables,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Side::Floor => "floor (straight to the pod)",
            Side::FloorWide => "floor at as many pod addresses as Services",
            Side::Sliceway => "sliceway",
            Side::SlicewayPods => "sliceway --socket-lb-pods",
            Side::Iptables => "kube-proxy iptables",
            Side::Nftables => "kube-proxy nftables",
        }
    }

    /// kube-proxy's mode, as the targets name it.
    pub fn mode(self) -> &'static str {
        match self {
            Side::Iptables => "iptables",
            Side::Nftables => "nftables",
            _ => self.name(),
        }
    }

    /// Whether the side is a sliceway agent (either socket mode).
    pub fn is_sliceway(self) -> bool {
        matches!(self, Side::Sliceway | Side::SlicewayPods)
    }

    fn proxy(self) -> Option<Proxy> {
        match self {
            Side::Floor | Side::FloorWide => None,
            Side::Sliceway => Some(Proxy::Sliceway),
            Side::SlicewayPods => Some(Proxy::SlicewayPods),
            Side::Iptables => Some(Proxy::Iptables),
            Side::Nftables => Some(Proxy::Nftables),
        }
    }
}

/// One side's results.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Fig7Row {
    pub side: Side,
    pub services: usize,
    /// p50 of each round, median [min–max] over rounds.
    pub p50_us: Summary,
    /// Over every sample of the run.
    pub p50_all_us: f64,
    pub p99_all_us: f64,
    pub p999_all_us: f64,
    pub samples: usize,
    pub failed: usize,
    /// From the proxy's start until every probed Service answered, per round.
    pub programmed_s: Option<Summary>,
    /// Rounds in which the proxy was not programmed within [`Fig7::limit_s`]: they
    /// measured nothing else of it (its other figures are over the rounds that were).
    pub not_programmed: usize,
    /// The proxy's own mean sync duration over the run, and its syncs.
    pub own_sync_ms: Option<f64>,
    pub own_syncs: Option<u64>,
    /// CPU of the whole machine (user, system, interrupts; from `/proc/stat`) per
    /// 1,000 connections: over the connections, less an equal window with none.
    pub cpu_ms_per_1k: Option<f64>,
    /// Under churn: endpoint changes written, and from a change's write until the
    /// first connection that reaches its new endpoint (a sample of the changes),
    /// p50 and p99 in milliseconds.
    pub churn_changes: Option<usize>,
    pub churn_first_packet_ms: Option<(f64, f64)>,
    pub churn_probes: Option<usize>,
    /// Followed changes no connection reached within 30 s (counted as 30 s above).
    pub churn_not_seen: Option<usize>,
    /// The proxy's own network-programming histogram over the churn
    /// (`*_network_programming_duration_seconds`), p50 and p99 in milliseconds, read
    /// from its buckets (upper bounds).
    pub churn_own_ms: Option<(f64, f64)>,
    /// Under churn: from a change's stamp until the API server answered its write
    /// (every change), p50 and p99 in milliseconds: the API server's share of both
    /// figures above, whichever proxy runs.
    pub churn_write_ms: Option<(f64, f64)>,
    /// Before each round's churn (in round order): the wait until the API server's
    /// watch had caught up with the sides before.
    pub churn_catch_up: Vec<CatchUp>,
    /// The highest offered new-connection rate sustained (connections a second), per
    /// round, median [min–max]; 0 for a round that sustained none.
    pub rate_sustained: Summary,
    /// Some round sustained the highest rate offered: the figure is a lower bound.
    pub rate_capped: bool,
    /// Every offered rate of every round, in order (a round stops at its first miss).
    pub rate_steps: Vec<Vec<RateStep>>,
    /// A proxy's side: connections straight to the backend pods (the floor's
    /// targets) with the proxy loaded, right after its own measured ones; p50 and
    /// p99 over every sample, microseconds. Less [`Fig7Row::unloaded_floor_us`] it is
    /// what the loaded proxy costs connections that use no Service; the side's own
    /// p50 less it, what a Service's path costs beyond that.
    pub loaded_floor_us: Option<(f64, f64)>,
    /// The same connections in the same turn just before the proxy started (the node
    /// cleaned, no proxy), p50 and p99: the loaded floor's partner, so the machine's
    /// drift over a round is not counted as the loaded proxy's cost.
    pub unloaded_floor_us: Option<(f64, f64)>,
    /// Every sample, microseconds, sorted (for the CDF plot; not in the JSON).
    #[serde(skip)]
    pub sorted_us: Vec<f64>,
}

/// sliceway's programs over connections of their own, run with the kernel's run
/// statistics on, after each round's measured connections (which ran without them:
/// the statistics add two clock reads to every program run).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DatapathShare {
    pub connections: usize,
    /// By program name (as the kernel keeps it, 15 bytes): runs and nanoseconds,
    /// summed over the rounds.
    pub programs: BTreeMap<String, (u64, u64)>,
}

impl DatapathShare {
    /// Runs and microseconds per connection of every program, and of all of them.
    pub fn per_connection(&self) -> (Vec<DatapathRow<'_>>, f64) {
        let n = self.connections.max(1) as f64;
        let rows: Vec<DatapathRow<'_>> = self
            .programs
            .iter()
            .filter(|(_, (runs, _))| *runs > 0)
            .map(|(name, &(runs, ns))| DatapathRow {
                program: name.as_str(),
                runs: runs as f64 / n,
                us: ns as f64 / n / 1e3,
                ns_per_run: ns as f64 / runs as f64,
            })
            .collect();
        let all = rows.iter().map(|r| r.us).sum();
        (rows, all)
    }
}

/// One program's line of [`DatapathShare::per_connection`]: runs and µs per
/// connection, and ns per run (from the totals, so a program that ran is never divided
/// by zero).
#[derive(Clone, Debug, PartialEq)]
pub struct DatapathRow<'a> {
    pub program: &'a str,
    pub runs: f64,
    pub us: f64,
    pub ns_per_run: f64,
}

/// Figure 7.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Fig7 {
    pub method: String,
    pub rows: Vec<Fig7Row>,
    /// sliceway's programs per connection (`None` where the kernel's run statistics
    /// could not be turned on; the report says why).
    pub datapath: Option<DatapathShare>,
    pub datapath_error: Option<String>,
    /// Seconds to create the Services and to see every one of them with its slice.
    pub populate_s: f64,
    /// Seconds a proxy is given to be programmed before its round goes on without it.
    pub limit_s: u64,
}

impl Fig7 {
    /// The row of `side`, if it measured connections (a proxy never programmed within
    /// the limit measured none).
    pub fn row(&self, side: Side) -> Option<&Fig7Row> {
        self.rows.iter().find(|r| r.side == side && r.samples > 0)
    }

    /// Of kube-proxy's two modes, `value` of each that measured it, and the name of
    /// each that was never programmed within the limit (for a target's text).
    pub fn baselines(&self, value: impl Fn(&Fig7Row) -> Option<f64>) -> Baselines {
        let mut b = Baselines::default();
        for side in [Side::Iptables, Side::Nftables] {
            match self.row(side).and_then(&value) {
                Some(v) => b.measured.push((side, v)),
                None if self
                    .rows
                    .iter()
                    .any(|r| r.side == side && r.samples == 0 && r.not_programmed > 0) =>
                {
                    b.never_programmed.push(side)
                }
                None => b.missing = true,
            }
        }
        b
    }

    /// The floor the targets are checked against: the wide one, which reaches as many
    /// addresses as the proxies' Services, when it was measured. Whatever the client's
    /// kernel spends on the spread of its destinations (state per destination, its
    /// ports and TIME_WAITs shared among three destinations or among thousands) is
    /// then the same on both sides of the ratio, and not counted as the proxy's.
    pub fn floor_side(&self) -> Side {
        if self.row(Side::FloorWide).is_some() {
            Side::FloorWide
        } else {
            Side::Floor
        }
    }

    /// The floor `side`'s targets are checked against: the one whose client meets the
    /// destinations the side's client meets. Through a proxy that translates packets,
    /// the client's kernel connects to the N Services' addresses ([`Fig7::floor_side`]);
    /// with `--socket-lb-pods` the socket connects to the backend pods' own
    /// addresses, which is the floor straight to the pods.
    pub fn floor_for(&self, side: Side) -> Side {
        if side == Side::SlicewayPods && self.row(Side::Floor).is_some() {
            Side::Floor
        } else {
            self.floor_side()
        }
    }
}

/// kube-proxy's modes for a target: what they measured, and which never got that far.
#[derive(Debug, Default, PartialEq)]
pub struct Baselines {
    pub measured: Vec<(Side, f64)>,
    pub never_programmed: Vec<Side>,
    /// A mode neither measured the value nor was reported not programmed: the target
    /// cannot be checked.
    pub missing: bool,
}

impl Baselines {
    /// Whether `ours` is below every mode that measured it (`None`: a mode is
    /// missing), and the modes in words (`unit` after each value).
    pub fn below(&self, ours: f64, limit_s: u64, unit: &str) -> Option<(bool, String)> {
        if self.missing {
            return None;
        }
        let mut words: Vec<String> = self
            .measured
            .iter()
            .map(|(side, v)| format!("{} {v:.0}{unit}", side.mode()))
            .collect();
        words.extend(self.never_programmed.iter().map(|side| {
            format!(
                "{} not programmed within {limit_s} s in any round",
                side.mode()
            )
        }));
        Some((
            self.measured.iter().all(|(_, v)| ours < *v),
            words.join(", "),
        ))
    }
}

/// The text of `GET path` on a loopback port inside namespace `ns`.
fn http_get(ns: &str, port: u16, path: &str) -> Result<String> {
    let path = path.to_string();
    in_netns(ns, move || -> Result<String> {
        let mut conn = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(2),
        )?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(conn, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut text = String::new();
        conn.read_to_string(&mut text)?;
        Ok(text)
    })?
}

/// The agent serves its metrics on kube-proxy's metrics port (its default
/// `--metrics-bind-address`, `127.0.0.1:10249`).
const AGENT_METRICS_PORT: u16 = 10249;

/// The proxy's own sync account from its metrics: (sum of seconds, count).
fn own_syncs(ns: &str, side: Side) -> Result<Option<(f64, u64)>> {
    let (port, metric) = match side {
        Side::Floor | Side::FloorWide => return Ok(None),
        Side::Sliceway | Side::SlicewayPods => {
            (AGENT_METRICS_PORT, "sliceway_sync_duration_seconds")
        }
        Side::Iptables | Side::Nftables => (10249, "kubeproxy_sync_proxy_rules_duration_seconds"),
    };
    let text = http_get(ns, port, "/metrics")?;
    let sum = summed(&text, &format!("{metric}_sum"));
    let count = summed(&text, &format!("{metric}_count"));
    Ok(sum.zip(count).map(|(s, c)| (s, c as u64)))
}

/// The sum of every sample of metric `name` whatever its labels (a dual-stack
/// kube-proxy keeps a series per IP family); `None` if it has none.
fn summed(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: bench, labels: {role: client}}
spec:
  nodeName: node-1
  containers: [{name: c, image: lab}]
"#;

fn backend_pod(i: usize) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web-{i}, namespace: bench, labels: {{app: web}}}}\n\
         spec:\n  nodeName: node-1\n  containers: [{{name: c, image: lab}}]\n"
    )
}

/// Creates Service `name` of port 80 to the backends' [`PORT`], selecting them or
/// (without `selector`) not; its ClusterIP and port.
async fn create_service(services: &Api<Service>, name: &str, selector: bool) -> Result<SocketAddr> {
    let mut spec = json!({"ports": [{"name": "http", "port": 80, "targetPort": PORT}]});
    if selector {
        spec["selector"] = json!({"app": "web"});
    }
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
    let svc = services
        .create(&PostParams::default(), &svc)
        .await
        .with_context(|| format!("creating Service {name}"))?;
    let ip: IpAddr = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .with_context(|| format!("Service {name} has no ClusterIP"))?
        .parse()?;
    Ok(SocketAddr::new(ip, 80))
}

/// Creates `n` Services selecting the backends and waits until each has a slice
/// with every backend. Returns their ClusterIPs in creation order.
async fn populate(cluster: &Cluster, n: usize) -> Result<Vec<SocketAddr>> {
    use futures::{stream, StreamExt};
    let client = cluster.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let mut created = stream::iter(0..n)
        .map(|i| {
            let services = services.clone();
            async move {
                let vip = create_service(&services, &format!("svc-{i}"), true).await?;
                anyhow::Ok((i, vip))
            }
        })
        .buffer_unordered(CONCURRENCY);
    let mut vips = BTreeMap::new();
    while let Some(r) = created.next().await {
        let (i, vip) = r.context("creating a Service")?;
        vips.insert(i, vip);
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
    let t = Instant::now();
    loop {
        let mut full = std::collections::BTreeSet::new();
        let mut lp = ListParams::default().limit(2000);
        loop {
            let page = slices.list(&lp).await?;
            for s in &page.items {
                let ready = s
                    .endpoints
                    .iter()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                    .count();
                if ready == BACKENDS {
                    if let Some(svc) = s
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kubernetes.io/service-name"))
                    {
                        full.insert(svc.clone());
                    }
                }
            }
            match page.metadata.continue_ {
                Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                _ => break,
            }
        }
        if full.len() >= n {
            break;
        }
        if t.elapsed() > Duration::from_secs(60 + n as u64 / 20) {
            bail!(
                "only {} of {n} Services had a slice with their {BACKENDS} backends",
                full.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(vips.into_values().collect())
}

/// Waits until every probe answers from a backend: the time since `since`, or (the
/// inner error) how many probes still did not answer once `limit` had passed.
fn programmed(
    client_ns: &str,
    probes: &[SocketAddr],
    backends: &[IpAddr],
    since: Instant,
    limit: Duration,
) -> Result<Result<Duration, usize>> {
    let mut left: Vec<SocketAddr> = probes.to_vec();
    while !left.is_empty() {
        let (still, backends) = (left.clone(), backends.to_vec());
        left = in_netns(client_ns, move || {
            still
                .into_iter()
                .filter(|to| {
                    !matches!(servers::tcp_request(*to, Duration::from_millis(200)),
                        Ok(r) if backends.contains(&IpAddr::V4(r.addr)))
                })
                .collect()
        })?;
        if !left.is_empty() && since.elapsed() > limit {
            return Ok(Err(left.len()));
        }
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(Ok(since.elapsed()))
}

/// The cumulative buckets of histogram `name` (upper bound, count), summed over
/// its label sets.
fn buckets(text: &str, name: &str) -> BTreeMap<u64, f64> {
    let prefix = format!("{name}_bucket{{");
    let mut out = BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with(&prefix)) {
        let le = sliceway_lab::sample_label(l, "le");
        let Some(v) = sliceway_lab::sample_value(l).filter(|_| !le.is_empty()) else {
            continue;
        };
        // Upper bounds as integer microseconds keep the map ordered (+Inf last).
        let key = if le == "+Inf" {
            u64::MAX
        } else {
            le.parse::<f64>().map_or(u64::MAX, |s| (s * 1e6) as u64)
        };
        *out.entry(key).or_default() += v;
    }
    out
}

/// Quantile `q` (0 to 1) of the observations between two readings of a cumulative
/// histogram: the upper bound of the bucket it falls in, milliseconds.
fn bucket_quantile(before: &BTreeMap<u64, f64>, after: &BTreeMap<u64, f64>, q: f64) -> Option<f64> {
    let delta: Vec<(u64, f64)> = after
        .iter()
        .map(|(le, v)| (*le, v - before.get(le).copied().unwrap_or(0.0)))
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let (le, _) = delta.iter().find(|(_, c)| *c >= q * total)?;
    Some(if *le == u64::MAX {
        f64::INFINITY
    } else {
        *le as f64 / 1e3
    })
}

/// The proxy's network-programming histogram, read from its metrics.
fn programming_histogram(ns: &str, side: Side) -> Result<Option<BTreeMap<u64, f64>>> {
    let (port, metric) = match side {
        Side::Floor | Side::FloorWide => return Ok(None),
        Side::Sliceway | Side::SlicewayPods => (
            AGENT_METRICS_PORT,
            "sliceway_network_programming_duration_seconds",
        ),
        Side::Iptables | Side::Nftables => {
            (10249, "kubeproxy_network_programming_duration_seconds")
        }
    };
    Ok(Some(buckets(&http_get(ns, port, "/metrics")?, metric)))
}

/// The slice of churn Service `i` with its one endpoint on backend `pod`, stamped
/// with the time of the change as the EndpointSlice controller stamps its writes
/// (kube-proxy's network-programming latency starts there).
fn churn_slice(i: usize, ip: IpAddr) -> Result<EndpointSlice> {
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": format!("churn-{i}-bench"),
            "labels": {
                "kubernetes.io/service-name": format!("churn-{i}"),
                "endpointslice.kubernetes.io/managed-by": "bench.sliceway.io",
            },
            "annotations": {
                "endpoints.kubernetes.io/last-change-trigger-time":
                    k8s_openapi::jiff::Timestamp::now().to_string(),
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
    }))?)
}

/// Creates the selector-less churn Services and their slices (each on backend
/// `i % BACKENDS`); their ClusterIPs.
async fn churn_populate(
    cluster: &Cluster,
    count: usize,
    backends: &[IpAddr],
) -> Result<Vec<SocketAddr>> {
    let client = cluster.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
    let mut vips = Vec::new();
    for i in 0..count {
        vips.push(create_service(&services, &format!("churn-{i}"), false).await?);
        slices
            .create(
                &PostParams::default(),
                &churn_slice(i, backends[i % BACKENDS])?,
            )
            .await?;
    }
    slices
        .create(&PostParams::default(), &marker_slice()?)
        .await
        .context("creating the marker slice")?;
    Ok(vips)
}

/// The marker slice: no endpoints, no `kubernetes.io/service-name`, and labelled
/// headless so neither proxy's watch selects it.
fn marker_slice() -> Result<EndpointSlice> {
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": MARKER,
            "labels": {
                "service.kubernetes.io/headless": "",
                "endpointslice.kubernetes.io/managed-by": "bench.sliceway.io",
            },
            "annotations": {MARKER_ANNOTATION: "0"},
        },
        "addressType": "IPv4",
        "endpoints": [],
    }))?)
}

/// A wait for the API server before a churn.
#[derive(Clone, Debug, Serialize)]
pub struct CatchUp {
    /// From the wait's start until the last marker change needed arrived (or the cap).
    pub waited_s: f64,
    /// Marker changes written.
    pub writes: usize,
    /// Each marker change's time from its write's answer until the bench's watch
    /// delivered it, ms (none: not delivered, its watch failed or the cap passed).
    pub arrived_ms: Vec<Option<f64>>,
    /// False when [`CATCH_UP_CAP`] passed first and the churn started anyway.
    pub caught_up: bool,
}

/// Waits until the API server delivers watch events promptly: rewrites the marker
/// slice's annotation and times from the write's answer until a watch of the bench,
/// opened just before the write from the marker's previous resourceVersion (so it is
/// served from the API server's watch cache, as the proxies' watches are), delivers
/// that change; done when [`CATCH_UP_IN_A_ROW`] changes in a row arrive within
/// [`CATCH_UP_BOUND`], or when [`CATCH_UP_CAP`] has passed. A watch that fails to open
/// or ends without the change counts as a slow arrival.
async fn catch_up(cluster: &Cluster) -> Result<CatchUp> {
    let client = cluster.client().await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
    let started = Instant::now();
    let mut rv = slices
        .get(MARKER)
        .await?
        .metadata
        .resource_version
        .context("the marker slice has no resourceVersion")?;
    let wp = WatchParams::default().fields(&format!("metadata.name={MARKER}"));
    let deadline = tokio::time::Instant::from_std(started + CATCH_UP_CAP);
    let (mut writes, mut fast, mut arrived_ms) = (0, 0, Vec::new());
    while fast < CATCH_UP_IN_A_ROW {
        if started.elapsed() >= CATCH_UP_CAP {
            return Ok(CatchUp {
                waited_s: started.elapsed().as_secs_f64(),
                writes,
                arrived_ms,
                caught_up: false,
            });
        }
        let events = tokio::time::timeout_at(deadline, slices.watch(&wp, &rv)).await;
        writes += 1;
        // Every marker change of the run has a value of its own: a write of the value
        // already there would change nothing and send no event.
        static MARKS: AtomicUsize = AtomicUsize::new(0);
        let value = (MARKS.fetch_add(1, Ordering::SeqCst) + 1).to_string();
        let patch = json!({"metadata": {"annotations": {MARKER_ANNOTATION: &value}}});
        let written = slices
            .patch(MARKER, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .context("writing the marker slice")?;
        let answered = Instant::now();
        rv = written
            .metadata
            .resource_version
            .context("the marker slice has no resourceVersion")?;
        let seen = async {
            let Ok(Ok(events)) = events else {
                return false;
            };
            let mut events = std::pin::pin!(events);
            while let Ok(Some(event)) = events.try_next().await {
                if let WatchEvent::Modified(s) = event {
                    let marked = s.metadata.annotations.as_ref();
                    if marked.and_then(|a| a.get(MARKER_ANNOTATION)) == Some(&value) {
                        return true;
                    }
                }
            }
            false
        };
        let arrived = tokio::time::timeout_at(deadline, seen)
            .await
            .unwrap_or(false)
            .then(|| answered.elapsed());
        arrived_ms.push(arrived.map(|t| t.as_secs_f64() * 1e3));
        let prompt = arrived.is_some_and(|t| t <= CATCH_UP_BOUND);
        fast = if prompt { fast + 1 } else { 0 };
        if !prompt {
            // A watch that would not open or ended at once must not spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(CatchUp {
        waited_s: started.elapsed().as_secs_f64(),
        writes,
        arrived_ms,
        caught_up: true,
    })
}

/// A side's churns over the rounds.
#[derive(Default)]
struct Churned {
    /// Endpoint changes written.
    changes: usize,
    /// Change to first packet of the followed changes, ms.
    first_packet_ms: Vec<f64>,
    /// Followed changes not seen in time.
    not_seen: usize,
    /// From each change's stamp until its write was answered, ms.
    write_ms: Vec<f64>,
    /// The proxy's network-programming histogram's growth, by bucket bound.
    histogram: BTreeMap<u64, f64>,
    /// The waits for the API server before each churn.
    catch_ups: Vec<CatchUp>,
}

/// p50 and p99 of `v`, none if it is empty.
fn p50_p99(v: &[f64]) -> Option<(f64, f64)> {
    (!v.is_empty()).then(|| (percentile(v, 50.0), percentile(v, 99.0)))
}

/// Marks a churn Service free to change again when its probe ends.
struct Unfollow(Arc<Vec<AtomicBool>>, usize);

impl Drop for Unfollow {
    fn drop(&mut self) {
        self.0[self.1].store(false, Ordering::SeqCst);
    }
}

/// How long a followed change may take to reach its first packet before it is
/// counted as not seen (and taken as this long in the percentiles: a lower bound).
const CHURN_PROBE_LIMIT: Duration = Duration::from_secs(30);

/// What a churn run gave.
struct Churn {
    changes: usize,
    /// Change to first packet, ms; [`CHURN_PROBE_LIMIT`] for those not seen.
    first_packet_ms: Vec<f64>,
    not_seen: usize,
    /// From each change's stamp until its write was answered, ms.
    write_ms: Vec<f64>,
}

/// `seconds` of endpoint changes at [`CHURN_RATE`] per second through the API: each
/// moves a churn Service's one endpoint to the next backend (replacing its slice); a
/// tick that finds every Service followed makes no change.
/// Every [`CHURN_PROBE_EVERY`]th change is followed from the client pod until a
/// connection to the Service reaches the new backend. The Services' current backend
/// is kept in `at` across runs.
async fn churn(
    cluster: &Cluster,
    client_ns: &str,
    vips: &[SocketAddr],
    backends: &[IpAddr],
    at: &mut [usize],
    seconds: u64,
    seed: u64,
) -> Result<Churn> {
    let client = cluster.client().await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
    let mut rng = Rng::new(seed);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / CHURN_RATE);
    let total = seconds as usize * CHURN_RATE as usize;
    let mut probes = Vec::new();
    let mut writes = Vec::new();
    // A Service with a write in flight or still followed by a probe is left alone:
    // a later write could land first, or its next change would hide the one being
    // followed.
    let followed: Arc<Vec<AtomicBool>> =
        Arc::new((0..vips.len()).map(|_| AtomicBool::new(false)).collect());
    for k in 0..total {
        tick.tick().await;
        let Some(i) = (0..vips.len())
            .map(|_| rng.below(vips.len()))
            .find(|&i| !followed[i].load(Ordering::SeqCst))
        else {
            continue;
        };
        at[i] = (at[i] + 1) % BACKENDS;
        let ip = backends[at[i]];
        let slice = churn_slice(i, ip)?;
        let slices = slices.clone();
        let started = Instant::now();
        let name = format!("churn-{i}-bench");
        followed[i].store(true, Ordering::SeqCst);
        let done = Unfollow(followed.clone(), i);
        let probed = k % CHURN_PROBE_EVERY == 0;
        let (write_done, probe_done) = if probed {
            (None, Some(done))
        } else {
            (Some(done), None)
        };
        let write = tokio::spawn(async move {
            let _done = write_done;
            slices
                .replace(&name, &PostParams::default(), &slice)
                .await
                .map(|_| started.elapsed().as_secs_f64() * 1e3)
        });
        if let Some(done) = probe_done {
            let (ns, to) = (client_ns.to_string(), vips[i]);
            probes.push(tokio::task::spawn_blocking(
                move || -> Result<Option<f64>> {
                    let _done = done;
                    in_netns(&ns, move || {
                        realtime();
                        let deadline = started + CHURN_PROBE_LIMIT;
                        loop {
                            if let Ok(r) = servers::tcp_request(to, Duration::from_millis(300)) {
                                if IpAddr::V4(r.addr) == ip {
                                    return Some(started.elapsed().as_secs_f64() * 1e3);
                                }
                            }
                            if Instant::now() > deadline {
                                eprintln!(
                                    "bench: {to} did not reach its new endpoint {ip} within \
                                 {CHURN_PROBE_LIMIT:?}"
                                );
                                return None;
                            }
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    })
                },
            ));
        }
        writes.push(write);
    }
    let changes = writes.len();
    let mut write_ms = Vec::with_capacity(changes);
    for w in writes {
        write_ms.push(w.await?.context("writing a churn slice")?);
    }
    let (mut first_packet_ms, mut not_seen) = (Vec::new(), 0);
    for p in probes {
        first_packet_ms.push(p.await??.unwrap_or_else(|| {
            not_seen += 1;
            CHURN_PROBE_LIMIT.as_secs_f64() * 1e3
        }));
    }
    Ok(Churn {
        changes,
        first_packet_ms,
        not_seen,
        write_ms,
    })
}

/// One offered rate of figure 7's new-connection rate.
#[derive(Clone, Debug, Serialize)]
pub struct RateStep {
    /// Connections a second scheduled.
    pub offered: u32,
    pub connections: usize,
    pub failed: usize,
    /// Of the failures, those whose connect found no free local port (the client's
    /// limit, not the proxy's).
    pub no_port: usize,
    /// Answered connections a second, from the first scheduled start to the last answer.
    pub achieved: f64,
    /// From each answered connection's scheduled start to its answer, microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
    /// The whole machine's busy share over the step (all CPUs, /proc/stat), 0 to 1.
    pub busy: f64,
    pub sustained: bool,
    /// sliceway only: new connections its datapath dropped on a reply-tuple clash
    /// (`drop_ct_clash`) and those it gave another source port (`dnat_port_remapped`)
    /// during the step, from the agent's `/metrics`.
    pub clash: Option<(u64, u64)>,
}

/// What one client thread of a rate step saw.
#[derive(Default)]
struct RateWorker {
    latencies_us: Vec<f64>,
    failed: usize,
    no_port: usize,
    last: Option<Instant>,
}

/// Whether `e` is a connect that found no free local port.
fn no_port(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrNotAvailable)
    })
}

/// `offered` new connections a second for `step`, open loop: connection j is due at
/// j / offered seconds, whatever happened to the ones before it, and is started by
/// the first of [`RATE_WORKERS`] client threads (SCHED_FIFO, in `client_ns`) free
/// for it; each is a connect to a target chosen at random, a one-line request and
/// its answer, and its time runs from when it was due, so a client that falls behind
/// shows in the latencies rather than in a slower schedule.
fn rate_step(
    client_ns: &str,
    targets: &[SocketAddr],
    backends: &[IpAddr],
    offered: u32,
    step: Duration,
    seed: u64,
    agent_ns: Option<&str>,
) -> Result<RateStep> {
    ensure!(offered > 0, "an offered rate of 0");
    let clash_before = agent_ns.map(clash_counts).transpose()?;
    let total = ((offered as f64 * step.as_secs_f64()).round() as usize).max(1);
    let next = Arc::new(AtomicUsize::new(0));
    let (b0, began) = (busy_ms()?, Instant::now());
    let t0 = began + Duration::from_millis(20);
    let workers: Vec<_> = (0..RATE_WORKERS)
        .map(|w| {
            let (ns, targets, backends, next) = (
                client_ns.to_string(),
                targets.to_vec(),
                backends.to_vec(),
                next.clone(),
            );
            std::thread::spawn(move || {
                in_netns(&ns, move || {
                    realtime();
                    let mut rng = Rng::new(seed * 1000 + w as u64);
                    let mut out = RateWorker::default();
                    loop {
                        let j = next.fetch_add(1, Ordering::SeqCst);
                        if j >= total {
                            break;
                        }
                        let due = t0 + Duration::from_secs_f64(j as f64 / offered as f64);
                        let now = Instant::now();
                        if now < due {
                            std::thread::sleep(due - now);
                        } else if now - due > RATE_TIMEOUT {
                            out.failed += 1;
                            continue;
                        }
                        let to = targets[rng.below(targets.len())];
                        match servers::tcp_request(to, RATE_TIMEOUT) {
                            Ok(r) if backends.contains(&IpAddr::V4(r.addr)) => {
                                let done = Instant::now();
                                out.latencies_us.push((done - due).as_secs_f64() * 1e6);
                                out.last = out.last.max(Some(done));
                            }
                            Err(e) if no_port(&e) => {
                                out.failed += 1;
                                out.no_port += 1;
                            }
                            _ => out.failed += 1,
                        }
                    }
                    out
                })
            })
        })
        .collect();
    let mut all = RateWorker::default();
    for w in workers {
        let w = w
            .join()
            .map_err(|_| anyhow::anyhow!("a rate client thread panicked"))??;
        all.latencies_us.extend(w.latencies_us);
        all.failed += w.failed;
        all.no_port += w.no_port;
        all.last = all.last.max(w.last);
    }
    let wall = began.elapsed().as_secs_f64().max(1e-3);
    let busy = (busy_ms()? - b0) as f64 / (wall * 1e3 * cpus() as f64);
    let answered = all.latencies_us.len();
    let achieved = all
        .last
        .map_or(0.0, |l| answered as f64 / (l - t0).as_secs_f64().max(1e-3));
    let p99_us = percentile(&all.latencies_us, 99.0);
    let clash = match (agent_ns, clash_before) {
        (Some(ns), Some((d0, r0))) => {
            let (d1, r1) = clash_counts(ns)?;
            Some((d1.saturating_sub(d0), r1.saturating_sub(r0)))
        }
        _ => None,
    };
    Ok(RateStep {
        offered,
        connections: total,
        failed: all.failed,
        no_port: all.no_port,
        achieved,
        p50_us: percentile(&all.latencies_us, 50.0),
        p99_us,
        busy,
        sustained: answered as f64 >= RATE_ANSWERED * total as f64
            && answered > 0
            && p99_us <= RATE_P99_MS * 1e3,
        clash,
    })
}

/// The agent's `drop_ct_clash` and `dnat_port_remapped` packets so far, from its
/// `/metrics` in the node's namespace (the agent reads its counters at each scrape).
fn clash_counts(ns: &str) -> Result<(u64, u64)> {
    let text = http_get(ns, AGENT_METRICS_PORT, "/metrics")?;
    let count = |reason: &str| {
        summed(
            &text,
            &format!("sliceway_datapath_packets{{reason=\"{reason}\"}}"),
        )
        .map(|n| n as u64)
        .with_context(|| format!("the agent's /metrics has no {reason} count"))
    };
    Ok((count("drop_ct_clash")?, count("dnat_port_remapped")?))
}

/// The machine's CPUs.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The offered rates of `cfg.fig7_rates` in turn, until the first not sustained.
fn rate_ramp(
    client_ns: &str,
    targets: &[SocketAddr],
    backends: &[IpAddr],
    cfg: &Config,
    seed: u64,
    agent_ns: Option<&str>,
) -> Result<Vec<RateStep>> {
    let mut steps = Vec::new();
    for (k, &offered) in cfg.fig7_rates.iter().enumerate() {
        let step = rate_step(
            client_ns,
            targets,
            backends,
            offered,
            Duration::from_millis(cfg.fig7_rate_step_ms),
            seed + k as u64,
            agent_ns,
        )?;
        let missed = !step.sustained;
        steps.push(step);
        if missed {
            break;
        }
        std::thread::sleep(RATE_PAUSE);
    }
    Ok(steps)
}

/// The highest rate of a ramp that was sustained, 0 if none.
pub fn highest_sustained(steps: &[RateStep]) -> u32 {
    steps
        .iter()
        .filter(|s| s.sustained)
        .map(|s| s.offered)
        .max()
        .unwrap_or(0)
}

/// Readies the client pod's ports (settings of its own network namespace): the local
/// port range widened (`net.ipv4.ip_local_port_range`), so thousands of connections
/// a second do not run out of ports to the floor's three destinations, and no
/// TIME_WAIT sockets kept (`net.ipv4.tcp_max_tw_buckets` 0: a connection the client
/// closes frees its port at once). A rate ramp would otherwise leave tens of
/// thousands of TIME_WAITs for a minute, which the next side's connects would meet
/// (or wait for: every turn after a ramp waited a minute, and `--quick` took twice its
/// 10 minutes).
fn ready_client_ports(client_ns: &str) -> Result<()> {
    const RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
    const TIME_WAITS: &str = "/proc/sys/net/ipv4/tcp_max_tw_buckets";
    let read = in_netns(client_ns, || -> Result<(String, String)> {
        std::fs::write(RANGE, "1024 65535")?;
        std::fs::write(TIME_WAITS, "0")?;
        Ok((
            std::fs::read_to_string(RANGE)?,
            std::fs::read_to_string(TIME_WAITS)?,
        ))
    })??;
    ensure!(
        read.0.split_whitespace().eq(["1024", "65535"]),
        "the client's port range is {:?} after widening it",
        read.0
    );
    ensure!(
        read.1.trim() == "0",
        "the client keeps {:?} TIME_WAIT sockets after setting none (the kernel's \
         tcp_max_tw_buckets is not its namespace's own)",
        read.1
    );
    Ok(())
}

/// The first address of backend pod `i`'s block for the wide floor: 172.16.0.0/14,
/// 172.20.0.0/14, ... (inside 172.16.0.0/12, apart from the lab's pod and Service
/// ranges), 262,144 addresses each.
fn wide_block(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 16 + 4 * i as u8, 0, 0)
}

/// Gives each backend pod a block of addresses of its own (a `local` route in its
/// network namespace, so its server, listening on any address, answers on every one;
/// a route to the block through the pod on the node) and returns `n` of them, spread
/// over the pods in turn, on the servers' port: the floor that reaches as many
/// addresses as there are Services. The routes go with the namespaces.
fn wide_floor(
    node_ns: &str,
    pods: &[(String, String, IpAddr)],
    n: usize,
) -> Result<Vec<SocketAddr>> {
    ensure!(
        (1..=4).contains(&pods.len()),
        "the wide floor has blocks for 1 to 4 pods, not {}",
        pods.len()
    );
    let per_pod = n.div_ceil(pods.len());
    ensure!(
        per_pod < 1 << 18,
        "{n} addresses do not fit the wide floor's blocks"
    );
    for (i, (name, ns, ip)) in pods.iter().enumerate() {
        let block = format!("{}/14", wide_block(i));
        netns::nsenter(ns, "ip", &["link", "set", "lo", "up"])
            .with_context(|| format!("loopback up in pod {name}"))?;
        netns::nsenter(ns, "ip", &["route", "add", "local", &block, "dev", "lo"])
            .with_context(|| format!("the wide floor's addresses in pod {name}"))?;
        netns::nsenter(
            node_ns,
            "ip",
            &["route", "add", &block, "via", &ip.to_string()],
        )
        .with_context(|| format!("the route to pod {name}'s wide floor addresses"))?;
    }
    Ok((0..n)
        .map(|k| SocketAddr::new(IpAddr::V4(wide_address(k, pods.len())), PORT))
        .collect())
}

/// The wide floor's `k`th address, of `pods` pods: pod `k % pods`, from its block's
/// second address (the first is left alone).
fn wide_address(k: usize, pods: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(wide_block(k % pods)) + 1 + (k / pods) as u32)
}

/// TIME_WAIT sockets the client pod may hold when a side starts measuring, should it
/// keep any: a side's own 2,000 connections would leave as many, harmless in a range
/// of 64,512 ports a destination; a rate ramp tens of thousands.
const TIME_WAIT_LEFT: u64 = 4096;

/// The client pod's TIME_WAIT sockets, from `sockstat` of its network namespace (the
/// kernel counts them per namespace). Through `/proc/thread-self`: `/proc/net` is
/// the process's, and only the thread [`in_netns`] runs on has entered the pod's.
fn time_waits(client_ns: &str) -> Result<u64> {
    let text = in_netns(client_ns, || {
        std::fs::read_to_string("/proc/thread-self/net/sockstat")
    })??;
    parse_time_waits(&text).context("no `tw` on the TCP line of the client's sockstat")
}

/// `tw` of the `TCP:` line of `/proc/net/sockstat`.
fn parse_time_waits(sockstat: &str) -> Option<u64> {
    let line = sockstat.lines().find_map(|l| l.strip_prefix("TCP:"))?;
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == "tw" {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// Waits until the client pod holds at most [`TIME_WAIT_LEFT`] TIME_WAIT sockets,
/// at most 65 s (a TIME_WAIT lasts 60 s): a client whose connections go to the
/// backend pods' own three addresses (the floor, and sliceway's socket mode, which
/// connects there) would search a port range full of them at every connect, a
/// kernel cost of the ramp before that no proxy has. The client keeps none
/// ([`ready_client_ports`]), so this returns at once; it guards the figure should
/// that setting ever not hold. Returns the seconds waited and the TIME_WAITs left.
fn drain_time_waits(client_ns: &str) -> Result<(f64, u64)> {
    let t = Instant::now();
    loop {
        let left = time_waits(client_ns)?;
        if left <= TIME_WAIT_LEFT || t.elapsed() > Duration::from_secs(65) {
            return Ok((t.elapsed().as_secs_f64(), left));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// [`drain_time_waits`] before `side`'s connections, with its progress line.
fn drain_time_waits_before(client_ns: &str, round: usize, side: Side) -> Result<()> {
    let (waited, left) = drain_time_waits(client_ns)
        .with_context(|| format!("{}: the client's TIME_WAITs", side.name()))?;
    if waited >= 1.0 || left > TIME_WAIT_LEFT {
        super::progress(&format!(
            "figure 7: round {}: {}: waited {waited:.0} s for the client's TIME_WAITs \
             ({left} left)",
            round + 1,
            side.name()
        ));
    }
    Ok(())
}

/// Runs figure 7 on a cluster of its own under `dir`, taken down after.
pub fn real_proxies(cfg: &Config, dir: &Path, prefix: &str) -> Result<Fig7> {
    let n = cfg.fig7_services;
    ensure!(n > 0, "figure 7 needs at least one Service");
    // A lab left here by a run killed before its cleanup goes first.
    sliceway_lab::cluster::remove_if_stale(dir)?;
    let cluster = Cluster::up(
        &Spec {
            nodes: 1,
            proxy: Proxy::None,
            controller: Controllers::Upstream,
            workloads: true,
            apiserver_args: vec![],
            ..Spec::default()
        },
        dir,
        prefix,
    )?;
    let measured = measure(&cluster, cfg, n);
    if measured.is_err() {
        // The cluster goes with its directory: keep the last proxy's log beside it.
        let kept = dir.with_file_name("fig7-proxy.log");
        if std::fs::copy(cluster.state.dir.join("logs/proxy-node-1.log"), &kept).is_ok() {
            return measured.with_context(|| format!("the last proxy's log: {}", kept.display()));
        }
    }
    measured
}

/// Figure 7 on a running cluster lab of one node.
fn measure(cluster: &Cluster, cfg: &Config, n: usize) -> Result<Fig7> {
    let mut pods = PODS.to_string();
    for i in 0..BACKENDS {
        pods.push_str(&backend_pod(i));
    }
    cluster.kubectl_stdin(&["apply", "-f", "-"], &pods)?;
    cluster.wait_ready_pods(NS, "app=web", BACKENDS)?;
    cluster.wait_ready_pods(NS, "role=client", 1)?;
    let client_ns = cluster.pod_netns(NS, "client")?;
    ready_client_ports(&client_ns)?;
    let mut backend_pods = Vec::new();
    for i in 0..BACKENDS {
        let name = format!("web-{i}");
        let ns = cluster.pod_netns(NS, &name)?;
        let ip: IpAddr = cluster
            .kubectl(&[
                "-n",
                NS,
                "get",
                "pod",
                &name,
                "-o",
                "jsonpath={.status.podIP}",
            ])?
            .trim()
            .parse()
            .with_context(|| format!("the address of pod {name}"))?;
        backend_pods.push((name, ns, ip));
    }
    let _servers = LatencyServers::start_in(&backend_pods, PORT)?;
    let backends: Vec<IpAddr> = backend_pods.iter().map(|(_, _, ip)| *ip).collect();
    let floor: Vec<SocketAddr> = backends
        .iter()
        .map(|ip| SocketAddr::new(*ip, PORT))
        .collect();
    let wide = wide_floor(&cluster.state.nodes[0].netns, &backend_pods, n)?;

    // Of the N Services, a few are selector-less with slices of the figure's own,
    // which the churn rewrites.
    let churn_n = CHURN_SERVICES.min(n / 2);
    super::progress(&format!(
        "figure 7: creating {n} Services through the API ({churn_n} of them for the churn)"
    ));
    let t = Instant::now();
    let rt = tokio::runtime::Runtime::new()?;
    let vips = rt.block_on(populate(cluster, n - churn_n))?;
    let churn_vips = rt.block_on(churn_populate(cluster, churn_n, &backends))?;
    let mut at: Vec<usize> = (0..churn_n).map(|i| i % BACKENDS).collect();
    let populate_s = t.elapsed().as_secs_f64();
    let mut rng = Rng::new(77);
    let mut probes = vec![vips[0], vips[vips.len() - 1]];
    probes.extend(churn_vips.first().copied());
    probes.extend((0..PROBES).map(|_| vips[rng.below(vips.len())]));
    let node_ns = cluster.state.nodes[0].netns.clone();
    let limit = Duration::from_secs(120 + n as u64 / 50);

    let mut samples: BTreeMap<Side, Vec<f64>> = BTreeMap::new();
    let mut p50s: BTreeMap<Side, Vec<f64>> = BTreeMap::new();
    let mut failed: BTreeMap<Side, usize> = BTreeMap::new();
    let mut programming: BTreeMap<Side, Vec<f64>> = BTreeMap::new();
    // Rounds in which a proxy was not programmed within `limit`.
    let mut not_programmed: BTreeMap<Side, usize> = BTreeMap::new();
    let mut own: BTreeMap<Side, (f64, u64)> = BTreeMap::new();
    // Machine CPU over the connections less an idle window as long (ms), and the
    // connections, by side.
    let mut cpu: BTreeMap<Side, (f64, usize)> = BTreeMap::new();
    let mut churned: BTreeMap<Side, Churned> = BTreeMap::new();
    let mut rates: BTreeMap<Side, Vec<Vec<RateStep>>> = BTreeMap::new();
    // Straight to the pods with each proxy loaded, and just before it started
    // (`Fig7Row::loaded_floor_us`, `Fig7Row::unloaded_floor_us`).
    let mut loaded_floor: BTreeMap<Side, Vec<f64>> = BTreeMap::new();
    let mut unloaded_floor: BTreeMap<Side, Vec<f64>> = BTreeMap::new();
    let (mut datapath, mut datapath_error) = (DatapathShare::default(), None);
    for round in 0..cfg.fig7_rounds {
        // A side's measured connections, and the floor's in a proxy's turn: the
        // same count and seed, to `targets`.
        let measured = |targets: &[SocketAddr]| {
            connections(
                &client_ns,
                targets,
                &backends,
                cfg.fig7_connections,
                1000 + round as u64,
            )
        };
        for k in 0..Side::ALL.len() {
            let side = Side::ALL[(k + round) % Side::ALL.len()];
            cluster.stop_proxies()?;
            // The side's targets, and a proxy's process (read once a turn).
            let (targets, proxy_pid) = match side.proxy() {
                None if side == Side::FloorWide => (&wide, None),
                None => (&floor, None),
                Some(proxy) => {
                    super::progress(&format!("figure 7: round {}: {}", round + 1, side.name()));
                    // The floor's connections on the cleaned node, no proxy yet: the
                    // partner of those made with it loaded, in the same turn.
                    drain_time_waits_before(&client_ns, round, side)?;
                    connections(&client_ns, &floor, &backends, 20, 7)?;
                    let (direct, _) = measured(&floor)?;
                    unloaded_floor.entry(side).or_default().extend(direct);
                    let since = Instant::now();
                    cluster.start_proxies(proxy)?;
                    let took = match programmed(&client_ns, &probes, &backends, since, limit)
                        .with_context(|| format!("{} at {n} Services", side.name()))?
                    {
                        Ok(took) => took,
                        Err(left) => {
                            // A result of its own, not a broken run: the side's round
                            // ends here, the others go on.
                            super::progress(&format!(
                                "figure 7: round {}: {}: {left} of {} probed Services still \
                                 did not answer after {} s: not programmed in time, the rest \
                                 of its round skipped",
                                round + 1,
                                side.name(),
                                probes.len(),
                                limit.as_secs()
                            ));
                            *not_programmed.entry(side).or_default() += 1;
                            continue;
                        }
                    };
                    programming
                        .entry(side)
                        .or_default()
                        .push(took.as_secs_f64());
                    let pid = cluster.daemon_pid("proxy-node-1")?;
                    settled(pid, limit).with_context(|| side.name())?;
                    (&vips, Some(pid))
                }
            };
            // The side before may have ended with a rate ramp.
            drain_time_waits_before(&client_ns, round, side)?;
            // Warm up (neighbours, the servers' threads), then measure.
            connections(&client_ns, targets, &backends, 20, 7)?;
            let (b0, t0) = (busy_ms()?, Instant::now());
            let (l, f) = measured(targets)?;
            let (b1, took) = (busy_ms()?, t0.elapsed());
            // The same time with nothing sent: what the rest of the machine spends.
            std::thread::sleep(took);
            let b2 = busy_ms()?;
            let e = cpu.entry(side).or_default();
            e.0 += (b1 - b0) as f64 - (b2 - b1) as f64;
            e.1 += l.len() + f;
            if side.proxy().is_some() {
                // The floor's own connections, this proxy loaded: what it costs
                // connections that use no Service (its programs on every packet, its
                // rules, its process beside them).
                let (direct, _) = measured(&floor)?;
                loaded_floor.entry(side).or_default().extend(direct);
            }
            if side == Side::Sliceway && datapath_error.is_none() {
                match datapath_pass(&client_ns, targets, &backends, cfg, 2000 + round as u64) {
                    Ok(pass) => {
                        datapath.connections += pass.connections;
                        for (name, (runs, ns)) in pass.programs {
                            let e = datapath.programs.entry(name).or_default();
                            e.0 += runs;
                            e.1 += ns;
                        }
                    }
                    Err(e) => datapath_error = Some(format!("{e:#}")),
                }
            }
            // Failures are reported (a column of their own); only many mean a broken run.
            ensure!(
                f * 20 <= cfg.fig7_connections,
                "{}: {f} of {} connections failed",
                side.name(),
                cfg.fig7_connections
            );
            if side.proxy().is_some() && !churn_vips.is_empty() {
                // The sides before may have left the API server's watches behind.
                let waited = rt.block_on(catch_up(cluster)).with_context(|| {
                    format!(
                        "{}: waiting for the API server before the churn",
                        side.name()
                    )
                })?;
                super::progress(&format!(
                    "figure 7: round {}: {}: {} {:.1} s for the API server's watch ({} marker changes)",
                    round + 1,
                    side.name(),
                    if waited.caught_up {
                        "waited"
                    } else {
                        "not caught up after"
                    },
                    waited.waited_s,
                    waited.writes
                ));
                churned.entry(side).or_default().catch_ups.push(waited);
                super::progress(&format!(
                    "figure 7: round {}: {}: {} s of {CHURN_RATE} endpoint changes a second",
                    round + 1,
                    side.name(),
                    cfg.fig7_churn_seconds
                ));
                let before = programming_histogram(&node_ns, side)?;
                let c = rt
                    .block_on(churn(
                        cluster,
                        &client_ns,
                        &churn_vips,
                        &backends,
                        &mut at,
                        cfg.fig7_churn_seconds,
                        500 + round as u64,
                    ))
                    .with_context(|| format!("{} under churn", side.name()))?;
                let after = programming_histogram(&node_ns, side)?;
                let e = churned.entry(side).or_default();
                e.changes += c.changes;
                e.first_packet_ms.extend(c.first_packet_ms);
                e.not_seen += c.not_seen;
                e.write_ms.extend(c.write_ms);
                if let (Some(b), Some(a)) = (before, after) {
                    for (le, v) in a {
                        *e.histogram.entry(le).or_default() +=
                            v - b.get(&le).copied().unwrap_or(0.0);
                    }
                }
            }
            // The ramp last: it saturates the machine (and, were the client to keep
            // TIME_WAITs, would leave tens of thousands, which the churn's probes
            // would meet). A proxy still working off the churn first finishes.
            if !cfg.fig7_rates.is_empty() {
                if let Some(pid) = proxy_pid {
                    if let Err(e) = settled(pid, limit) {
                        super::progress(&format!(
                            "figure 7: round {}: {}: {e:#} after the churn; its new-connection \
                             rate is measured nonetheless",
                            round + 1,
                            side.name()
                        ));
                    }
                }
                super::progress(&format!(
                    "figure 7: round {}: {}: new-connection rate",
                    round + 1,
                    side.name()
                ));
                let agent_ns = side.is_sliceway().then_some(node_ns.as_str());
                let steps = rate_ramp(
                    &client_ns,
                    targets,
                    &backends,
                    cfg,
                    3000 + round as u64,
                    agent_ns,
                )
                .with_context(|| format!("{}: new-connection rate", side.name()))?;
                rates.entry(side).or_default().push(steps);
            }
            if let Some((sum, count)) = own_syncs(&node_ns, side)? {
                let e = own.entry(side).or_default();
                e.0 += sum;
                e.1 += count;
            }
            p50s.entry(side).or_default().push(percentile(&l, 50.0));
            samples.entry(side).or_default().extend(l);
            *failed.entry(side).or_default() += f;
        }
    }
    cluster.stop_proxies()?;

    let rows = Side::ALL
        .iter()
        .map(|&side| {
            let mut all = samples.remove(&side).unwrap_or_default();
            all.sort_by(f64::total_cmp);
            let rate_steps = rates.remove(&side).unwrap_or_default();
            let top = cfg.fig7_rates.iter().copied().max().unwrap_or(0);
            let highest: Vec<f64> = rate_steps
                .iter()
                .map(|r| f64::from(highest_sustained(r)))
                .collect();
            Fig7Row {
                side,
                services: n,
                p50_us: p50s
                    .get(&side)
                    .map_or_else(Summary::default, |v| Summary::of(v)),
                p50_all_us: percentile(&all, 50.0),
                p99_all_us: percentile(&all, 99.0),
                p999_all_us: percentile(&all, 99.9),
                samples: all.len(),
                failed: failed.get(&side).copied().unwrap_or(0),
                programmed_s: programming.get(&side).map(|v| Summary::of(v)),
                not_programmed: not_programmed.get(&side).copied().unwrap_or(0),
                own_sync_ms: own
                    .get(&side)
                    .filter(|(_, c)| *c > 0)
                    .map(|(s, c)| s * 1e3 / *c as f64),
                own_syncs: own.get(&side).map(|(_, c)| *c),
                cpu_ms_per_1k: cpu
                    .get(&side)
                    .filter(|(_, n)| *n > 0)
                    .map(|(ms, n)| ms * 1000.0 / *n as f64),
                churn_changes: churned.get(&side).map(|c| c.changes),
                churn_probes: churned.get(&side).map(|c| c.first_packet_ms.len()),
                churn_not_seen: churned.get(&side).map(|c| c.not_seen),
                churn_first_packet_ms: churned.get(&side).and_then(|c| p50_p99(&c.first_packet_ms)),
                churn_own_ms: churned.get(&side).and_then(|c| {
                    let none = BTreeMap::new();
                    Some((
                        bucket_quantile(&none, &c.histogram, 0.5)?,
                        bucket_quantile(&none, &c.histogram, 0.99)?,
                    ))
                }),
                churn_write_ms: churned.get(&side).and_then(|c| p50_p99(&c.write_ms)),
                churn_catch_up: churned
                    .get_mut(&side)
                    .map(|c| std::mem::take(&mut c.catch_ups))
                    .unwrap_or_default(),
                rate_sustained: Summary::of(&highest),
                rate_capped: top > 0 && highest.iter().any(|&h| h >= f64::from(top)),
                rate_steps,
                loaded_floor_us: loaded_floor.get(&side).and_then(|v| p50_p99(v)),
                unloaded_floor_us: unloaded_floor.get(&side).and_then(|v| p50_p99(v)),
                sorted_us: all,
            }
        })
        .collect();
    Ok(Fig7 {
        method: format!(
            "The cluster lab: etcd, kube-apiserver, kube-controller-manager (which writes \
             the EndpointSlices) and kube-scheduler of the upstream kit, one node with the \
             lab's kubelet stand-in, a client pod and {BACKENDS} backend pods on it, each \
             answering from a server that blocks in accept. {n} Services created through \
             the API: {selecting} selecting the backends, whose slices \
             kube-controller-manager writes and which the connections go to, and \
             {churn_n} without a selector, whose one-endpoint slices the figure writes \
             itself and rewrites under churn ({CHURN_RATE} changes a second for \
             {churn_s} s per proxy per round, after the connections and before the \
             new-connection rate). Before each \
             proxy's churn the figure waits for the API server to catch up with the sides \
             before: it rewrites an annotation of a slice of its own (labelled headless, \
             so neither proxy's watch selects it, while it passes the same watch cache as \
             the churn's slices) and times from the write's answer until a watch it \
             opened just before the write, from the slice's previous resourceVersion, \
             delivers the change; the churn starts once {in_a_row} changes in a row \
             arrive within {bound} ms, or after {cap} s whether or not (the report says \
             which). Per round, each side in turn (the order \
             rotates by round), on a node cleaned between sides (pins, iptables, nft and \
             conntrack flushed): sliceway-agent, sliceway-agent --socket-lb-pods (the client's TCP \
             connects translated at its socket), kube-proxy --proxy-mode=iptables, \
             kube-proxy --proxy-mode=nftables (upstream's binary, fed by the same API \
             server), and two floors, no Service and no proxy running: the client \
             straight to the backend pods' own addresses, and the client straight to \
             {n} addresses the backend pods hold besides (a block of its own for each \
             pod, a local route in the pod and a route to it on the node), so the \
             client's kernel meets as many destinations as through a proxy; the ratios \
             and the targets use the second when it was measured (--socket-lb-pods's use the first, \
             the addresses its client's socket connects to). Each sample is a TCP connect to a Service chosen at \
             random, a one-line request and its one-line answer, wall clock in the client; \
             {conns} connections per side per round after 20 warm-up connections, \
             {rounds} rounds, measured once the proxy is idle (under 2% of a core over a \
             second); the client keeps no TIME_WAIT sockets (`net.ipv4.tcp_max_tw_buckets` \
             0 in its namespace: a port is free once its connection closes), so no side \
             meets the TIME_WAITs of the rate ramp before it, where a client connecting to \
             the pods' own three addresses would search a port range full of them at \
             every connect (a guard still waits, at most 65 s, until it holds at most \
             {TIME_WAIT_LEFT}); the client and the servers run at SCHED_FIFO priority 10, so other \
             work on the machine delays their wake-ups less, and unless the run says \
             otherwise (its first line) idle cores poll rather than halt, so a wake-up \
             does not wait for a core to come back. p50 per round as median \
             [min–max]; p50, p99 and p99.9 over every sample of the run. In each proxy's \
             turn, the floor's own connections (straight to the backend pods, the same \
             seeds, as many) twice more: on the cleaned node just before the proxy \
             starts, and right after the proxy's own connections with it still loaded; \
             their difference is what the loaded proxy costs connections that use no \
             Service, and the side's own p50 less the loaded one what a Service's path \
             adds. Programmed: from the proxy's start until the first, \
             the last and {PROBES} random Services all answer; a proxy not programmed \
             within {limit_s} s (120 s and one more for every 50 Services) is reported so \
             for that round, which then goes on with the next side. Own sync: the proxy's \
             mean sync duration from its metrics (`kubeproxy_sync_proxy_rules_duration_seconds`, \
             `sliceway_sync_duration_seconds`). CPU per 1,000 connections: the whole \
             machine's busy time from /proc/stat over the connections (client, servers, \
             kernel, proxy) less an equal window with none right after, so the floor's \
             is the cost of the connections themselves and a proxy's excess over it is its \
             own. New-connection rate (last, per side per round, a proxy idle again after \
             its churn): offered \
             rates of {rates} connections a second in turn, {step_ms} ms each, open loop \
             (connection j is due at j / rate s and its time runs from then, whatever \
             became of the ones before it), started by the first free of {RATE_WORKERS} \
             client threads at SCHED_FIFO to a Service (the floors: a pod address) chosen \
             at random; a rate is sustained when at least {answered}% of its connections \
             are answered within {timeout} s of being due and their p99 from due to answer \
             is at most {RATE_P99_MS} ms; a round stops at its first rate not sustained \
             and gives the highest sustained (a lower bound when it is the last offered). \
             The client's local port range is widened to 1024-65535; connects that found \
             no free port are counted apart. The servers are the same one-thread-per-pod \
             servers, and client, servers and proxy share the machine's cores: the busy \
             share of the whole machine at the first rate missed says whether the cores \
             ran out.",
            conns = cfg.fig7_connections,
            rounds = cfg.fig7_rounds,
            selecting = n - churn_n,
            churn_s = cfg.fig7_churn_seconds,
            in_a_row = CATCH_UP_IN_A_ROW,
            bound = CATCH_UP_BOUND.as_millis(),
            cap = CATCH_UP_CAP.as_secs(),
            rates = cfg
                .fig7_rates
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            step_ms = cfg.fig7_rate_step_ms,
            answered = RATE_ANSWERED * 100.0,
            timeout = RATE_TIMEOUT.as_secs(),
            limit_s = limit.as_secs(),
        ),
        rows,
        datapath: (datapath.connections > 0).then_some(datapath),
        datapath_error,
        populate_s,
        limit_s: limit.as_secs(),
    })
}

/// sliceway's programs over `cfg.fig7_connections` connections like the measured
/// ones, with the kernel's run statistics on: the runs and nanoseconds of each
/// program, from the kernel's counts before and after.
fn datapath_pass(
    client_ns: &str,
    targets: &[SocketAddr],
    backends: &[IpAddr],
    cfg: &Config,
    seed: u64,
) -> Result<DatapathShare> {
    let on = sliceway_agent::kernel::enable_run_stats()?;
    let before = sliceway_agent::kernel::program_runs(PROGRAM_PREFIX);
    ensure!(
        !before.is_empty(),
        "no program named {PROGRAM_PREFIX}* is loaded"
    );
    let (l, f) = connections(client_ns, targets, backends, cfg.fig7_connections, seed)?;
    let after = sliceway_agent::kernel::program_runs(PROGRAM_PREFIX);
    drop(on);
    let programs = after
        .into_iter()
        .map(|(name, (runs, ns))| {
            let (r0, n0) = before.get(&name).copied().unwrap_or_default();
            (name, (runs.saturating_sub(r0), ns.saturating_sub(n0)))
        })
        .collect();
    Ok(DatapathShare {
        connections: l.len() + f,
        programs,
    })
}

/// The names of sliceway's programs start with this.
const PROGRAM_PREFIX: &str = "sliceway_";

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs root (a network namespace of its own): a TIME_WAIT made in the client's
    /// namespace is counted there, not the process's own namespace's.
    #[test]
    fn time_waits_are_counted_in_the_clients_own_namespace() {
        let ns = sliceway_lab::Netns::create(&format!(
            "{}-tw-{}",
            sliceway_lab::NS_PREFIX,
            std::process::id()
        ))
        .expect("a network namespace (needs root)");
        assert_eq!(time_waits(&ns.name).unwrap(), 0, "a new namespace has none");
        in_netns(&ns.name, || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            // The side that closes first keeps the TIME_WAIT.
            drop(client);
            let mut rest = Vec::new();
            std::io::Read::read_to_end(&mut &server, &mut rest).unwrap();
            drop(server);
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while time_waits(&ns.name).unwrap() != 1 {
            assert!(
                Instant::now() < deadline,
                "no TIME_WAIT counted in {}",
                ns.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            drain_time_waits(&ns.name).unwrap().1,
            1,
            "one is few enough at once"
        );
    }

    #[test]
    fn time_waits_are_read_from_the_tcp_line_of_sockstat() {
        let sockstat = "sockets: used 130\nTCP: inuse 5 orphan 0 tw 31337 alloc 7 mem 1\n\
                        UDP: inuse 2 mem 0\n";
        assert_eq!(parse_time_waits(sockstat), Some(31337));
        assert_eq!(
            parse_time_waits("TCP6: inuse 1\nUDP: inuse 2 mem 0\n"),
            None
        );
        assert_eq!(parse_time_waits("TCP: inuse 5 orphan 0 tw\n"), None);
    }

    #[test]
    fn a_mode_never_programmed_is_named_and_the_others_still_compared() {
        let b = Baselines {
            measured: vec![(Side::Nftables, 72.0)],
            never_programmed: vec![Side::Iptables],
            missing: false,
        };
        assert_eq!(
            b.below(65.0, 320, " µs"),
            Some((
                true,
                "nftables 72 µs, iptables not programmed within 320 s in any round".into()
            ))
        );
        assert_eq!(b.below(80.0, 320, " µs").map(|(met, _)| met), Some(false));
        let missing = Baselines {
            missing: true,
            ..Baselines::default()
        };
        assert_eq!(missing.below(1.0, 320, ""), None);
    }

    #[test]
    fn the_socket_mode_is_held_to_the_floor_its_client_connects_like() {
        let measured = |side| Fig7Row {
            side,
            samples: 10,
            ..Fig7Row::default()
        };
        let mut f = Fig7 {
            rows: vec![measured(Side::Floor), measured(Side::FloorWide)],
            ..Fig7::default()
        };
        assert_eq!(f.floor_for(Side::Sliceway), Side::FloorWide);
        assert_eq!(f.floor_for(Side::SlicewayPods), Side::Floor);
        // Without the narrow floor, the one there is.
        f.rows.remove(0);
        assert_eq!(f.floor_for(Side::SlicewayPods), Side::FloorWide);
        // Without the wide floor, the narrow one for all.
        f.rows = vec![measured(Side::Floor)];
        assert_eq!(f.floor_for(Side::Sliceway), Side::Floor);
    }

    #[test]
    fn the_datapath_share_divides_each_program_by_the_connections() {
        let share = DatapathShare {
            connections: 4,
            programs: BTreeMap::from([
                ("sliceway_tc".to_string(), (40, 8_000)),
                ("sliceway_connect4".to_string(), (4, 400)),
                ("sliceway_xdp".to_string(), (0, 0)),
            ]),
        };
        let (rows, all) = share.per_connection();
        assert_eq!(
            rows,
            vec![
                DatapathRow {
                    program: "sliceway_connect4",
                    runs: 1.0,
                    us: 0.1,
                    ns_per_run: 100.0
                },
                DatapathRow {
                    program: "sliceway_tc",
                    runs: 10.0,
                    us: 2.0,
                    ns_per_run: 200.0
                }
            ],
            "a program that never ran is left out"
        );
        assert!((all - 2.1).abs() < 1e-9, "{all}");
    }

    #[test]
    fn the_wide_floor_gives_each_pod_its_own_block_and_every_address_once() {
        let ranges = [
            ("172.16.0.0", "172.19.255.255"),
            ("172.20.0.0", "172.23.255.255"),
            ("172.24.0.0", "172.27.255.255"),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for k in 0..100_000 {
            let a = wide_address(k, 3);
            let (lo, hi) = ranges[k % 3];
            let (lo, hi): (Ipv4Addr, Ipv4Addr) = (lo.parse().unwrap(), hi.parse().unwrap());
            assert!(a > lo && a <= hi, "address {k} is {a}, outside {lo}-{hi}");
            assert!(seen.insert(a), "address {k} ({a}) twice");
        }
        assert_eq!(wide_address(0, 3), Ipv4Addr::new(172, 16, 0, 1));
        assert_eq!(wide_address(4, 3), Ipv4Addr::new(172, 20, 0, 2));
    }

    #[test]
    fn a_datapath_count_is_read_by_its_whole_series_and_missing_ones_are_none() {
        let text = "# HELP sliceway_datapath_packets Packets seen\n\
                    sliceway_datapath_packets{reason=\"drop_ct_clash\"} 17\n\
                    sliceway_datapath_packets{reason=\"drop_ct_clash_other\"} 5\n\
                    sliceway_datapath_packets{reason=\"dnat_port_remapped\"} 2048\n";
        let series = |r: &str| format!("sliceway_datapath_packets{{reason=\"{r}\"}}");
        assert_eq!(summed(text, &series("drop_ct_clash")), Some(17.0));
        assert_eq!(summed(text, &series("dnat_port_remapped")), Some(2048.0));
        assert_eq!(summed(text, &series("dnat_new")), None);
    }

    #[test]
    fn a_sum_covers_every_series_of_a_metric_and_no_longer_name() {
        let text = "m_sum{ip_family=\"4\"} 1.5\nm_sum{ip_family=\"6\"} 0.5\nm_sum_other 9\n";
        assert_eq!(summed(text, "m_sum"), Some(2.0));
        assert_eq!(summed(text, "m_count"), None);
    }
}

//! Figure 5 through the real API server: sliceway-controller beside
//! kube-controller-manager on the same rolling update, in one control plane of the
//! cluster lab (etcd and kube-apiserver of the upstream kit, no nodes).
//!
//! Each round runs both sides, in an order that alternates by round, and each side
//! starts from the same state: an empty namespace is filled through the API with
//! Services and ready Pods (no controller running), the side's controller starts and
//! is waited for until every Service's EndpointSlices and Endpoints show its Pods,
//! then the rolling update runs: for every Service at once, Pod by Pod, a new Pod is
//! created and given an address and a Ready condition through its status (as a
//! kubelet does), then an old Pod is deleted with a grace period (terminating), made
//! not ready through its status, and deleted for good (the kubelet's last delete).
//! After each of these four steps the harness waits until every Service's slices
//! and Endpoints show what upstream's rules give for that step, so both sides do the
//! same work. Writes and bytes come from kube-apiserver itself (its `/metrics`, read
//! before and after); CPU from the controller process's threads
//! (`/proc/PID/task/*/schedstat`). The controller is then stopped and the namespace
//! emptied for the next side.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::{
    core::v1::{Endpoints, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    Api, Client,
};
use serde::Serialize;
use serde_json::json;

use sliceway_lab::cluster::{Cluster, Controllers, Proxy, Spec};
use sliceway_lab::{sample_label, sample_value};

use crate::stats::{ratio, Summary};

/// The namespace every side's objects live in (emptied between sides).
const NS: &str = "fig5";
/// Nodes the Pods are spread over (the EndpointSlice controller skips a Pod whose
/// Node does not exist).
const NODES: usize = 3;
/// Longest wait for one step to show in the slices and Endpoints.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct ApiSpec {
    pub services: usize,
    pub pods_per_service: usize,
    pub rounds: usize,
    /// Seconds of the idle window whose CPU rate is taken off the update's.
    pub idle_seconds: f64,
}

/// The two controllers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    Sliceway,
    KubeControllerManager,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Sliceway => "sliceway-controller",
            Side::KubeControllerManager => "kube-controller-manager",
        }
    }
    /// The name the cluster lab knows its process by.
    pub fn daemon(self) -> &'static str {
        match self {
            Side::Sliceway => "sliceway-controller",
            Side::KubeControllerManager => "kube-controller-manager",
        }
    }
}

/// Write requests to one resource, from kube-apiserver's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ResourceWrites {
    /// Requests by verb as the API server counts them (POST, PUT, PATCH, APPLY,
    /// DELETE), whatever their answer.
    pub by_verb: BTreeMap<String, u64>,
    /// Of those, answered with a code other than 2xx (conflicts, mostly).
    pub failed: u64,
    /// Request body bytes (the sum of `apiserver_request_body_size_bytes`).
    pub bytes: u64,
}

impl ResourceWrites {
    pub fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }
    fn minus(&self, before: &Self) -> Self {
        Self {
            by_verb: self
                .by_verb
                .iter()
                .map(|(k, v)| (k.clone(), v - before.by_verb.get(k).copied().unwrap_or(0)))
                .filter(|(_, v)| *v > 0)
                .collect(),
            failed: self.failed - before.failed,
            bytes: self.bytes - before.bytes,
        }
    }
    /// `POST 3, PUT 40` style.
    pub fn verbs(&self) -> String {
        if self.by_verb.is_empty() {
            return "none".into();
        }
        self.by_verb
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Writes to EndpointSlices and to Endpoints.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Writes {
    pub endpointslices: ResourceWrites,
    pub endpoints: ResourceWrites,
}

impl Writes {
    fn minus(&self, before: &Self) -> Self {
        Self {
            endpointslices: self.endpointslices.minus(&before.endpointslices),
            endpoints: self.endpoints.minus(&before.endpoints),
        }
    }
}

/// One side of one round.
#[derive(Clone, Debug, Serialize)]
pub struct SideRun {
    pub side: Side,
    pub round: usize,
    /// Seconds from the controller's start until the initial state showed.
    pub settle_s: f64,
    /// What the update wrote.
    pub writes: Writes,
    /// Controller CPU over the update (every thread of the process), milliseconds.
    pub cpu_ms: f64,
    /// Controller CPU per second while nothing changed, milliseconds.
    pub idle_cpu_ms_per_s: f64,
    /// `cpu_ms` less the idle rate over the update's length.
    pub cpu_net_ms: f64,
    /// Seconds the update took.
    pub update_s: f64,
    /// Mean time from a step's Pod writes until every Service showed it.
    pub step_ms: f64,
}

/// One side over the rounds: median [min–max].
#[derive(Clone, Debug, Serialize)]
pub struct SideSummary {
    pub side: Side,
    pub slice_writes: Summary,
    pub slice_bytes: Summary,
    pub endpoints_writes: Summary,
    pub endpoints_bytes: Summary,
    pub failed_writes: Summary,
    pub cpu_ms: Summary,
    pub cpu_net_ms: Summary,
    pub step_ms: Summary,
    /// The verbs of the last round, per resource.
    pub slice_verbs: String,
    pub endpoints_verbs: String,
}

/// Figure 5 through the API server.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughApi {
    pub method: String,
    pub spec: ApiSpec,
    /// Pods replaced (one per Service per step).
    pub pods_replaced: usize,
    /// Pod changes the controllers had to act on: four per replaced Pod (new Pod
    /// ready; old Pod terminating, not ready, gone).
    pub pod_changes: usize,
    pub runs: Vec<SideRun>,
    pub sliceway: SideSummary,
    pub upstream: SideSummary,
}

impl ThroughApi {
    /// sliceway over kube-controller-manager, of the medians picked by `f`.
    pub fn ratio(&self, f: impl Fn(&SideSummary) -> Summary) -> Option<f64> {
        ratio(f(&self.sliceway).median, f(&self.upstream).median)
    }
}

/// What a Pod is at a step, for the slices' and Endpoints' expected contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodState {
    Ready,
    /// Deleted with a grace period, still ready.
    TerminatingReady,
    /// Deleted with a grace period, not ready.
    TerminatingNotReady,
}

impl PodState {
    /// An EndpointSlice endpoint's (ready, serving, terminating): serving is the Pod's
    /// readiness, terminating its deletion, ready both serving and not terminating
    /// (upstream's `podToEndpoint`,
    /// <https://github.com/kubernetes/endpointslice/blob/v0.37.2/utils.go>).
    fn conditions(self) -> (bool, bool, bool) {
        match self {
            PodState::Ready => (true, true, false),
            PodState::TerminatingReady => (false, true, true),
            PodState::TerminatingNotReady => (false, false, true),
        }
    }
}

/// Per Service, per Pod address: its state.
type Expected = BTreeMap<String, BTreeMap<String, PodState>>;

fn svc(s: usize) -> String {
    format!("svc-{s}")
}

fn old_pod(s: usize, k: usize) -> String {
    format!("p{s}-old-{k}")
}

fn new_pod(s: usize, k: usize) -> String {
    format!("p{s}-new-{k}")
}

/// Pod addresses: the old Pods first, then the new ones; the same on every side.
fn ip(spec: &ApiSpec, s: usize, k: usize, new: bool) -> String {
    let per = spec.pods_per_service;
    let i = s * per + k + if new { spec.services * per } else { 0 };
    crate::scale::pod_ip(i)
}

fn status(ip: &str, ready: bool) -> Patch<serde_json::Value> {
    let ready = if ready { "True" } else { "False" };
    Patch::Merge(json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": ready}],
    }}))
}

async fn create_pod(pods: &Api<Pod>, name: &str, s: usize, k: usize, ip: &str) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": format!("app-{s}")}},
        "spec": {"nodeName": format!("fig5-node-{}", k % NODES),
                 "containers": [{"name": "c", "image": "lab",
                                 "ports": [{"containerPort": 8080}]}]},
    }))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating Pod {name}"))?;
    pods.patch_status(name, &PatchParams::default(), &status(ip, true))
        .await
        .with_context(|| format!("writing Pod {name}'s status"))?;
    Ok(())
}

/// Runs `f` on every Service index at once (at most 32 requests in flight).
async fn each_service<F, Fut>(n: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    stream::iter(0..n)
        .map(f)
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The write counters of EndpointSlices and Endpoints in kube-apiserver's
/// `/metrics` now: `apiserver_request_total{verb,resource,code}` and the sum of the
/// histogram `apiserver_request_body_size_bytes{resource,verb}` (the body as read by
/// the handler, <https://github.com/kubernetes/apiserver/blob/v0.37.2/pkg/endpoints/handlers/metrics/metrics.go>).
async fn writes(client: &Client) -> Result<Writes> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(req)
        .await
        .context("reading kube-apiserver's /metrics")?;
    Ok(parse_writes(&text))
}

fn parse_writes(metrics: &str) -> Writes {
    let mut w = Writes::default();
    for line in metrics.lines() {
        let counter = line.starts_with("apiserver_request_total{");
        let bytes = line.starts_with("apiserver_request_body_size_bytes_sum{");
        if !counter && !bytes {
            continue;
        }
        let r = match sample_label(line, "resource") {
            "endpointslices" => &mut w.endpointslices,
            "endpoints" => &mut w.endpoints,
            _ => continue,
        };
        if counter {
            let verb = sample_label(line, "verb");
            if sample_label(line, "subresource").is_empty()
                && ["POST", "PUT", "PATCH", "APPLY", "DELETE"].contains(&verb)
            {
                let n = sample_value(line).unwrap_or(0.0) as u64;
                *r.by_verb.entry(verb.to_string()).or_default() += n;
                if !sample_label(line, "code").starts_with('2') {
                    r.failed += n;
                }
            }
        } else {
            r.bytes += sample_value(line).unwrap_or(0.0) as u64;
        }
    }
    w
}

/// Waits until the write counters stop moving (no write for a second).
async fn quiet(client: &Client) -> Result<Writes> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut last = writes(client).await?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = writes(client).await?;
        if now == last {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!("the controller kept writing for {STEP_TIMEOUT:?}");
        }
        last = now;
    }
}

/// The first Service whose slices or Endpoints differ from `expected`, described.
async fn difference(client: &Client, expected: &Expected) -> Result<Option<String>> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), NS);
    let mut in_slices: BTreeMap<String, BTreeMap<String, (bool, bool, bool)>> = BTreeMap::new();
    let mut duplicated = BTreeSet::new();
    for s in slices.list(&ListParams::default()).await?.items {
        let Some(service) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
        else {
            continue;
        };
        let seen = in_slices.entry(service.clone()).or_default();
        for e in &s.endpoints {
            let c = e.conditions.clone().unwrap_or_default();
            let cond = (
                c.ready.unwrap_or(false),
                c.serving.unwrap_or(false),
                c.terminating.unwrap_or(false),
            );
            for a in &e.addresses {
                if seen.insert(a.clone(), cond).is_some() {
                    duplicated.insert(service.clone());
                }
            }
        }
    }
    let mut in_endpoints: BTreeMap<String, (BTreeSet<String>, usize)> = BTreeMap::new();
    for e in endpoints.list(&ListParams::default()).await?.items {
        let name = e.metadata.name.clone().unwrap_or_default();
        let entry = in_endpoints.entry(name).or_default();
        for subset in e.subsets.iter().flatten() {
            entry
                .0
                .extend(subset.addresses.iter().flatten().map(|a| a.ip.clone()));
            entry.1 += subset.not_ready_addresses.as_ref().map_or(0, Vec::len);
        }
    }
    for (service, pods) in expected {
        if duplicated.contains(service) {
            return Ok(Some(format!("{service}: an address in two slices")));
        }
        let want: BTreeMap<String, (bool, bool, bool)> = pods
            .iter()
            .map(|(ip, st)| (ip.clone(), st.conditions()))
            .collect();
        let got = in_slices.get(service).cloned().unwrap_or_default();
        if got != want {
            return Ok(Some(format!(
                "{service}'s slices show {got:?}, expected {want:?}"
            )));
        }
        // Endpoints list ready Pods that are not terminating; terminating Pods are
        // left out (upstream's `ShouldPodBeInEndpoints` without publishNotReadyAddresses,
        // <https://github.com/kubernetes/endpointslice/blob/v0.37.2/util/controller_utils.go>).
        let want: BTreeSet<String> = pods
            .iter()
            .filter(|(_, st)| **st == PodState::Ready)
            .map(|(ip, _)| ip.clone())
            .collect();
        let got = in_endpoints.get(service).cloned().unwrap_or_default();
        if got != (want.clone(), 0) {
            return Ok(Some(format!(
                "{service}'s Endpoints show {got:?}, expected {want:?} and no address not ready"
            )));
        }
    }
    Ok(None)
}

/// Waits until the slices and Endpoints show `expected`.
async fn settled(client: &Client, expected: &Expected, what: &str) -> Result<()> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let Some(diff) = difference(client, expected).await? else {
            return Ok(());
        };
        if Instant::now() > deadline {
            bail!("{what} did not show in {STEP_TIMEOUT:?}: {diff}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Deletes every Service, Pod, EndpointSlice and Endpoints of the namespace (with no
/// controller running) and waits until none is left.
async fn empty_namespace(client: &Client) -> Result<()> {
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let lp = ListParams::default();
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete_collection(&now, &lp)
        .await
        .context("deleting the Pods")?;
    // Services have no delete-collection: one by one.
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    for s in services.list(&lp).await?.items {
        if let Some(name) = s.metadata.name {
            services.delete(&name, &now).await?;
        }
    }
    Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .delete_collection(&now, &lp)
        .await
        .context("deleting the EndpointSlices")?;
    Api::<Endpoints>::namespaced(client.clone(), NS)
        .delete_collection(&now, &lp)
        .await
        .context("deleting the Endpoints")?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let left = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&lp)
            .await?
            .items
            .len()
            + services.list(&lp).await?.items.len()
            + Api::<EndpointSlice>::namespaced(client.clone(), NS)
                .list(&lp)
                .await?
                .items
                .len()
            + Api::<Endpoints>::namespaced(client.clone(), NS)
                .list(&lp)
                .await?
                .items
                .len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} objects of namespace {NS} still there after {STEP_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fills the namespace with the Services and their ready old Pods.
async fn populate(client: &Client, spec: &ApiSpec) -> Result<Expected> {
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    each_service(spec.services, |s| {
        let services = services.clone();
        async move {
            let service: Service = serde_json::from_value(json!({
                "metadata": {"name": svc(s)},
                "spec": {"selector": {"app": format!("app-{s}")},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            }))?;
            services
                .create(&PostParams::default(), &service)
                .await
                .with_context(|| format!("creating Service {}", svc(s)))?;
            Ok(())
        }
    })
    .await?;
    let per = spec.pods_per_service;
    stream::iter((0..spec.services).flat_map(|s| (0..per).map(move |k| (s, k))))
        .map(|(s, k)| {
            let pods = pods.clone();
            async move { create_pod(&pods, &old_pod(s, k), s, k, &ip(spec, s, k, false)).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((0..spec.services)
        .map(|s| {
            (
                svc(s),
                (0..per)
                    .map(|k| (ip(spec, s, k, false), PodState::Ready))
                    .collect(),
            )
        })
        .collect())
}

/// Starts the side's controller on `cluster`'s control plane; for
/// sliceway-controller, the loopback port of its `/metrics`.
pub(crate) fn start(cluster: &Cluster, side: Side) -> Result<Option<u16>> {
    match side {
        Side::Sliceway => cluster.start_sliceway_controller().map(Some),
        Side::KubeControllerManager => cluster.start_endpoint_controllers_upstream().map(|()| None),
    }
}

/// One side of one round, from an empty namespace back to an empty namespace.
async fn run_side(
    cluster: &Cluster,
    client: &Client,
    spec: &ApiSpec,
    side: Side,
    round: usize,
) -> Result<SideRun> {
    let mut expected = populate(client, spec).await?;
    let t = Instant::now();
    start(cluster, side)?;
    let pid = cluster.daemon_pid(side.daemon())?;
    settled(client, &expected, "the initial state").await?;
    let settle_s = t.elapsed().as_secs_f64();
    quiet(client).await?;

    let (cpu0, t0) = (crate::scale::cpu_ns(pid)?, Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(spec.idle_seconds)).await;
    let idle_rate = (crate::scale::cpu_ns(pid)? - cpu0) as f64 / t0.elapsed().as_secs_f64();

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let before = writes(client).await?;
    let (cpu0, t0) = (crate::scale::cpu_ns(pid)?, Instant::now());
    let mut step_time = Duration::ZERO;
    let mut steps = 0u32;
    for k in 0..spec.pods_per_service {
        let graceful = DeleteParams {
            grace_period_seconds: Some(30),
            ..Default::default()
        };
        let at_once = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        for step in 0..4 {
            let t = Instant::now();
            each_service(spec.services, |s| {
                let (pods, graceful, at_once) = (pods.clone(), graceful.clone(), at_once.clone());
                async move {
                    let old = old_pod(s, k);
                    let old_ip = ip(spec, s, k, false);
                    match step {
                        0 => create_pod(&pods, &new_pod(s, k), s, k, &ip(spec, s, k, true)).await,
                        1 => pods
                            .delete(&old, &graceful)
                            .await
                            .map(|_| ())
                            .map_err(Into::into),
                        2 => pods
                            .patch_status(&old, &PatchParams::default(), &status(&old_ip, false))
                            .await
                            .map(|_| ())
                            .map_err(Into::into),
                        _ => pods
                            .delete(&old, &at_once)
                            .await
                            .map(|_| ())
                            .map_err(Into::into),
                    }
                }
            })
            .await
            .with_context(|| format!("step {step} of Pod {k}"))?;
            for s in 0..spec.services {
                let service = expected.entry(svc(s)).or_default();
                let old_ip = ip(spec, s, k, false);
                match step {
                    0 => {
                        service.insert(ip(spec, s, k, true), PodState::Ready);
                    }
                    1 => {
                        service.insert(old_ip, PodState::TerminatingReady);
                    }
                    2 => {
                        service.insert(old_ip, PodState::TerminatingNotReady);
                    }
                    _ => {
                        service.remove(&old_ip);
                    }
                }
            }
            settled(client, &expected, &format!("step {step} of Pod {k}")).await?;
            step_time += t.elapsed();
            steps += 1;
        }
    }
    let after = quiet(client).await?;
    let (cpu_ns, update) = (crate::scale::cpu_ns(pid)? - cpu0, t0.elapsed());
    cluster.stop(side.daemon());
    empty_namespace(client).await?;
    let cpu_ms = cpu_ns as f64 / 1e6;
    Ok(SideRun {
        side,
        round,
        settle_s,
        writes: after.minus(&before),
        cpu_ms,
        idle_cpu_ms_per_s: idle_rate / 1e6,
        cpu_net_ms: (cpu_ms - idle_rate / 1e6 * update.as_secs_f64()).max(0.0),
        update_s: update.as_secs_f64(),
        step_ms: step_time.as_secs_f64() * 1e3 / f64::from(steps.max(1)),
    })
}

fn summary(side: Side, runs: &[SideRun]) -> SideSummary {
    let mine: Vec<&SideRun> = runs.iter().filter(|r| r.side == side).collect();
    let of =
        |f: &dyn Fn(&SideRun) -> f64| Summary::of(&mine.iter().map(|r| f(r)).collect::<Vec<_>>());
    let last = mine.last();
    SideSummary {
        side,
        slice_writes: of(&|r| r.writes.endpointslices.total() as f64),
        slice_bytes: of(&|r| r.writes.endpointslices.bytes as f64),
        endpoints_writes: of(&|r| r.writes.endpoints.total() as f64),
        endpoints_bytes: of(&|r| r.writes.endpoints.bytes as f64),
        failed_writes: of(&|r| (r.writes.endpointslices.failed + r.writes.endpoints.failed) as f64),
        cpu_ms: of(&|r| r.cpu_ms),
        cpu_net_ms: of(&|r| r.cpu_net_ms),
        step_ms: of(&|r| r.step_ms),
        slice_verbs: last.map_or_else(String::new, |r| r.writes.endpointslices.verbs()),
        endpoints_verbs: last.map_or_else(String::new, |r| r.writes.endpoints.verbs()),
    }
}

/// Builds the control plane under `dir`, runs every round, and takes it down.
pub fn run(spec: &ApiSpec, dir: &std::path::Path, prefix: &str) -> Result<ThroughApi> {
    ensure!(
        spec.services > 0 && spec.pods_per_service > 0 && spec.rounds > 0,
        "figure 5 through the API needs at least one Service, one Pod and one round"
    );
    // A lab left here by a run killed before its cleanup goes first.
    sliceway_lab::cluster::remove_if_stale(dir)?;
    let cluster = Cluster::up(
        &Spec {
            nodes: 0,
            proxy: Proxy::None,
            // Neither controller runs until a side starts it.
            controller: Controllers::Upstream,
            workloads: false,
            apiserver_args: vec![],
            ..Spec::default()
        },
        dir,
        prefix,
    )?;
    let rt = tokio::runtime::Runtime::new()?;
    let runs = rt.block_on(async {
        let client = cluster.client().await?;
        cluster.kubectl(&["create", "namespace", NS])?;
        crate::scale::default_service_account(&client, NS).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        for i in 0..NODES {
            let node: Node = serde_json::from_value(json!({"metadata": {
                "name": format!("fig5-node-{i}"),
                "labels": {"topology.kubernetes.io/zone": format!("zone-{i}")},
            }}))?;
            nodes.create(&PostParams::default(), &node).await?;
        }
        let mut runs = Vec::new();
        for round in 0..spec.rounds {
            let order = if round % 2 == 0 {
                [Side::Sliceway, Side::KubeControllerManager]
            } else {
                [Side::KubeControllerManager, Side::Sliceway]
            };
            for side in order {
                crate::progress(&format!(
                    "figure 5: round {}: {} through the API server",
                    round + 1,
                    side.name()
                ));
                let r = run_side(&cluster, &client, spec, side, round).await;
                // Stopped on success already; on failure, so that the next start is clean.
                cluster.stop(side.daemon());
                runs.push(r.with_context(|| format!("{} in round {}", side.name(), round + 1))?);
            }
        }
        anyhow::Ok(runs)
    })?;
    let pods_replaced = spec.services * spec.pods_per_service;
    Ok(ThroughApi {
        method: method(spec),
        spec: spec.clone(),
        pods_replaced,
        pod_changes: 4 * pods_replaced,
        sliceway: summary(Side::Sliceway, &runs),
        upstream: summary(Side::KubeControllerManager, &runs),
        runs,
    })
}

fn method(spec: &ApiSpec) -> String {
    format!(
        "Through the real API server: one control plane of the cluster lab (the upstream kit's \
         etcd and kube-apiserver, no nodes), {s} Services of {p} Pods each in one namespace, and \
         the same rolling update applied once with sliceway-controller ({build} build, its \
         deployed identity) and once with kube-controller-manager running only its endpoints, \
         endpointslice and endpointslice-mirroring controllers, {r} round(s), the order \
         alternating by round, each side from the same state (the namespace emptied, filled \
         with the Services and ready Pods, the side's controller started and waited for until \
         every slice and Endpoints showed them, and until the API server counted no write for a \
         second). The update, every Service at once, Pod by Pod: a new Pod created and given an \
         address and Ready through its status, as a kubelet does; an old Pod deleted with a \
         grace period (terminating), made not ready through its status, and deleted for good; \
         after each of these four steps the harness waits until every Service's EndpointSlices \
         (ready, serving, terminating per address) and Endpoints show it. Writes are \
         kube-apiserver's own counts (`apiserver_request_total` by verb and resource, every \
         answer), bytes the sum of its `apiserver_request_body_size_bytes` histogram (request \
         bodies as read: sliceway-controller sends JSON, kube-controller-manager protobuf, its \
         default `--kube-api-content-type`), both read from `/metrics` before and after the \
         update. CPU is the controller process's (the sum of its threads' on-CPU time from \
         `/proc/PID/task/*/schedstat`) over the update; for kube-controller-manager that is the \
         whole process, its shared informers, client and health server included, with only the \
         three controllers started; the net figure takes off the rate of a {idle:.1}-second idle \
         window before the update. Median [min–max] over the rounds; the ratio is sliceway's \
         median over kube-controller-manager's.",
        s = spec.services,
        p = spec.pods_per_service,
        r = spec.rounds,
        idle = spec.idle_seconds,
        build = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_counters_by_resource_and_verb() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="resource",subresource="",verb="PUT",version="v1"} 10
apiserver_request_total{code="409",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="resource",subresource="",verb="PUT",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="namespace",subresource="",verb="LIST",version="v1"} 99
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="endpoints",scope="resource",subresource="",verb="PUT",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_body_size_bytes_sum{group="discovery.k8s.io",resource="endpointslices",verb="update"} 1200
apiserver_request_body_size_bytes_sum{group="discovery.k8s.io",resource="endpointslices",verb="create"} 300
apiserver_request_body_size_bytes_count{group="discovery.k8s.io",resource="endpointslices",verb="create"} 3
apiserver_request_body_size_bytes_sum{group="",resource="endpoints",verb="update"} 4.5e+02
"#;
        let w = parse_writes(text);
        assert_eq!(w.endpointslices.total(), 15);
        assert_eq!(w.endpointslices.failed, 2);
        assert_eq!(w.endpointslices.bytes, 1500);
        assert_eq!(w.endpointslices.verbs(), "POST 3, PUT 12");
        assert_eq!((w.endpoints.total(), w.endpoints.bytes), (4, 450));
        let d = w.minus(&Writes::default());
        assert_eq!(d, w);
    }
}

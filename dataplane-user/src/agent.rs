//! The agent loop: take objects from a source (a manifest directory, or the API server
//! through reflectors), compile, write the difference to the maps, publish metrics.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::SocketAddr,
    path::PathBuf,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use dataplane_common::{map_name, stat};
use tracing::{info, warn};

use crate::{
    compiler::{self, Skipped},
    kernel::{Attached, Capacities, Datapath, PinDir},
    kube_source::{KubeSource, KubeSourceConfig},
    local::{ManifestDir, Objects},
    metrics::Metrics,
    writer::MapWriter,
};

/// Where objects come from.
pub enum Source {
    /// A directory of YAML, checked every `poll`.
    Manifests { dir: PathBuf, poll: Duration },
    /// The API server; changes are batched for `batch`.
    Kubernetes {
        client: kube::Client,
        batch: Duration,
    },
}

/// Settings of `sliceway-agent run`.
pub struct Settings {
    pub source: Source,
    pub interfaces: Vec<String>,
    pub compiler: compiler::Options,
    pub capacities: Capacities,
    /// Where maps and links are pinned; `None` keeps them private to this process
    /// (programs detach when it exits).
    pub pins: Option<PinDir>,
    /// Address for `/metrics` and `/healthz`; `None` serves nothing.
    pub metrics_addr: Option<SocketAddr>,
}

/// Per-sync state that outlives one sync.
struct Syncer {
    writer: MapWriter,
    reported: BTreeSet<Skipped>,
    syncs: u64,
    metrics: Arc<Metrics>,
    /// Last `last-change-trigger-time` seen per slice, for programming latency.
    triggers: HashMap<(String, String), String>,
}

const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

impl Syncer {
    fn sync(&mut self, objects: &Objects, dp: &mut Datapath, opts: &compiler::Options) {
        let started = Instant::now();
        let compiled = compiler::compile(&objects.services, &objects.slices, opts);
        // Say each problem once, not at every sync.
        let now: BTreeSet<Skipped> = compiled.skipped.iter().cloned().collect();
        for s in now.difference(&self.reported) {
            warn!(object = %s.object, "skipped: {}", s.reason);
        }
        self.reported = now;
        let report = self.writer.apply(&compiled.frontends, &mut dp.maps);
        let written = SystemTime::now();
        for (service, reason) in &report.rejected {
            warn!(%service, "kept its previous state: {reason}");
            self.metrics.rejected.inc();
        }
        for e in &report.errors {
            warn!("map write failed: {e}");
        }
        self.syncs += 1;
        self.observe(objects, &compiled, dp, written, started.elapsed());
        info!(
            sync = self.syncs,
            services = objects.services.len(),
            slices = objects.slices.len(),
            frontends = self.writer.programmed().len(),
            backends = self.writer.backend_count(),
            writes = report.map_writes,
            deletes = report.map_deletes,
            skipped = compiled.skipped.len(),
            micros = started.elapsed().as_micros() as u64,
            "synced"
        );
    }

    fn observe(
        &mut self,
        objects: &Objects,
        compiled: &compiler::Compiled,
        dp: &Datapath,
        written: SystemTime,
        took: Duration,
    ) {
        let m = &self.metrics;
        m.syncs.inc();
        m.sync_duration.observe(took.as_secs_f64());
        let mut skipped: BTreeMap<(String, String), i64> = BTreeMap::new();
        for s in &compiled.skipped {
            *skipped
                .entry((s.object.kind.to_string(), s.code.to_string()))
                .or_default() += 1;
        }
        let ignored = &compiled.ignored;
        for (code, n) in [
            ("other_proxy", ignored.other_proxy),
            ("headless", ignored.headless),
            ("external_name", ignored.external_name),
            ("ipv6", ignored.ipv6),
        ] {
            skipped.insert(("ignored".into(), code.into()), n as i64);
        }
        m.set_skipped(&skipped);
        let limits = dp.limits();
        m.set_map(
            map_name::SERVICES,
            self.writer.programmed().len() as u64,
            limits.services,
        );
        m.set_map(
            map_name::BACKENDS,
            self.writer.backend_count() as u64,
            limits.backends,
        );
        m.set_map(map_name::SLOTS, self.writer.slot_count(), limits.slots);
        if let Ok(stats) = dp.stats() {
            for (i, v) in stats.iter().enumerate() {
                m.set_datapath(stat::NAMES[i], *v);
            }
        }
        // Network programming latency, as kube-proxy reports it: for each slice whose
        // trigger time changed, from that time to this write. The first sync only
        // records what it saw (those changes happened before the agent started).
        let first = self.syncs == 1;
        for slice in &objects.slices {
            let Some(t) = slice
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TRIGGER_TIME))
            else {
                continue;
            };
            let key = (
                slice.metadata.namespace.clone().unwrap_or_default(),
                slice.metadata.name.clone().unwrap_or_default(),
            );
            if self.triggers.get(&key) == Some(t) {
                continue;
            }
            self.triggers.insert(key, t.clone());
            if first {
                continue;
            }
            if let Ok(ts) = t.parse::<k8s_openapi::jiff::Timestamp>() {
                let at = SystemTime::from(ts);
                if let Ok(latency) = written.duration_since(at) {
                    m.programming_latency.observe(latency.as_secs_f64());
                }
            }
        }
        m.synced.store(true, Ordering::SeqCst);
    }
}

/// Loads the datapath (adopting pinned state) and attaches it.
fn start_datapath(settings: &Settings) -> anyhow::Result<(Datapath, MapWriter)> {
    let mut dp = Datapath::load(&settings.capacities, settings.pins.as_ref())
        .context("loading the datapath")?;
    // Adopt what an earlier run left in pinned maps: the first sync then writes only
    // the difference and flushes nothing (conntrack included).
    let writer = match &settings.pins {
        Some(pins) => {
            let state = dp.maps.state();
            info!(
                dir = %pins.dir().display(),
                frontends = state.services.len(),
                backends = state.backends.len(),
                "adopted pinned maps"
            );
            MapWriter::restore(dp.limits(), state)
        }
        None => MapWriter::new(dp.limits()),
    };
    for iface in &settings.interfaces {
        let how = dp
            .attach(iface)
            .with_context(|| format!("attaching to {iface}"))?;
        match how {
            Attached::NewPinned => info!(interface = %iface, "attached (pinned link)"),
            Attached::Replaced => info!(interface = %iface, "took over the pinned link"),
            Attached::Unpinned => info!(interface = %iface, "attached (until the agent exits)"),
        }
    }
    Ok((dp, writer))
}

/// Runs until `shutdown` resolves.
pub async fn run(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = settings.metrics_addr {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(addr, m).await {
                warn!(%addr, "metrics server stopped: {e}");
            }
        });
    }
    let (mut dp, writer) = start_datapath(&settings)?;
    let mut syncer = Syncer {
        writer,
        reported: BTreeSet::new(),
        syncs: 0,
        metrics,
        triggers: HashMap::new(),
    };
    tokio::pin!(shutdown);
    match &settings.source {
        Source::Manifests { dir, poll } => {
            let mut manifests = ManifestDir::new(dir);
            loop {
                match manifests.rescan() {
                    Ok(scan) => {
                        for p in &scan.new_problems {
                            warn!(file = %p.file.display(), "{}", p.reason);
                        }
                        if scan.changed || syncer.syncs == 0 {
                            syncer.sync(&manifests.objects(), &mut dp, &settings.compiler);
                        }
                    }
                    Err(e) => {
                        warn!(dir = %dir.display(), "cannot read the manifest directory: {e}; keeping the current state")
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(*poll) => {}
                    _ = &mut shutdown => break,
                }
            }
        }
        Source::Kubernetes { client, batch } => {
            let cfg = KubeSourceConfig {
                node_name: settings.compiler.node_name.clone(),
                proxy_name: settings.compiler.proxy_name.clone(),
            };
            let (mut source, task) = KubeSource::start(client.clone(), &cfg)?;
            // Nothing is written before every cache has listed once: a restart never
            // shrinks a Service to the first slice seen.
            info!("waiting for Services, EndpointSlices and the Node to sync");
            tokio::select! {
                r = source.wait_synced() => r?,
                _ = &mut shutdown => { task.abort(); return Ok(()); }
            }
            loop {
                syncer.sync(&source.snapshot(), &mut dp, &settings.compiler);
                tokio::select! {
                    r = source.next_batch(*batch) => { r?; }
                    _ = &mut shutdown => break,
                }
            }
            task.abort();
        }
    }
    info!("shutting down; pinned programs and maps stay for the next agent");
    Ok(())
}

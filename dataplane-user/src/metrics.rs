//! Prometheus metrics and health, served on `/metrics`, `/healthz` and `/livez` (port
//! 10256 as kube-proxy, on localhost unless told otherwise), and `/audit`, which asks
//! the agent loop for a drift audit (`sliceway-agent audit`).
//!
//! Values that live in the kernel (the datapath's counters) are read by the agent
//! loop on a timer and again when `/metrics` is scraped: the endpoint asks the loop
//! ([`Ask::Refresh`]) and serves the last values if the loop does not answer in time.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, OnceLock},
    time::Instant,
};

use tokio::sync::{mpsc, oneshot};

use crate::{audit::AuditReport, health::Health};

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};

type Labels = Vec<(String, String)>;

/// The agent's metrics.
pub struct Metrics {
    registry: Registry,
    pub syncs: Counter,
    pub sync_duration: Histogram,
    pub skipped: Family<Labels, Gauge>,
    pub map_entries: Family<Labels, Gauge>,
    pub map_capacity: Family<Labels, Gauge>,
    pub datapath_packets: Family<Labels, Gauge>,
    pub programming_latency: Histogram,
    pub rejected: Counter,
    pub interfaces: Gauge,
    pub sctp_without_kernel_sctp: Gauge,
    pub drift_entries: Family<Labels, Gauge>,
    pub drift_repaired: Counter,
    pub audits: Counter,
    /// What `/healthz` and `/livez` say.
    pub health: Health,
    /// The agent loop, for what the endpoint asks of it.
    asks: OnceLock<mpsc::Sender<Ask>>,
}

/// What the HTTP endpoint asks of the agent loop.
#[derive(Debug)]
pub enum Ask {
    /// Read the kernel's counters into the metrics now.
    Refresh(oneshot::Sender<()>),
    /// Audit the maps for drift now and repair it.
    Audit(oneshot::Sender<Result<AuditReport, String>>),
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(crate::health::DEFAULT_TIMEOUT)
    }
}

impl Metrics {
    /// Metrics, with health judged against `health_timeout`.
    pub fn new(health_timeout: std::time::Duration) -> Self {
        let mut registry = Registry::with_prefix("sliceway");
        let syncs = Counter::default();
        registry.register(
            "syncs",
            "Syncs of the maps with the desired state",
            syncs.clone(),
        );
        let sync_duration = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
            "sync_duration_seconds",
            "Time to compile and write one sync",
            sync_duration.clone(),
        );
        let skipped = Family::<Labels, Gauge>::default();
        registry.register(
            "objects_skipped",
            "Objects (or parts) the last sync could not use, by kind and reason",
            skipped.clone(),
        );
        let map_entries = Family::<Labels, Gauge>::default();
        registry.register(
            "map_entries",
            "Entries in each BPF map, as the writer knows them",
            map_entries.clone(),
        );
        let map_capacity = Family::<Labels, Gauge>::default();
        registry.register(
            "map_capacity",
            "Capacity of each BPF map",
            map_capacity.clone(),
        );
        let datapath_packets = Family::<Labels, Gauge>::default();
        registry.register(
            "datapath_packets",
            "Packets seen by the datapath, by verdict and reason (summed over CPUs)",
            datapath_packets.clone(),
        );
        // kube-proxy's network_programming_duration_seconds: from the EndpointSlice's
        // endpoints.kubernetes.io/last-change-trigger-time to the map write.
        let programming_latency = Histogram::new(exponential_buckets(0.001, 2.0, 20));
        registry.register(
            "network_programming_duration_seconds",
            "From an endpoint change (last-change-trigger-time) to the map write",
            programming_latency.clone(),
        );
        let rejected = Counter::default();
        registry.register(
            "frontends_rejected",
            "Frontend changes that did not fit the maps",
            rejected.clone(),
        );
        let interfaces = Gauge::default();
        registry.register(
            "attached_interfaces",
            "Interfaces the TC program is attached to by this agent",
            interfaces.clone(),
        );
        let sctp_without_kernel_sctp = Gauge::default();
        registry.register(
            "sctp_frontends_without_kernel_sctp",
            "SCTP frontends programmed on a node whose kernel has no SCTP sockets",
            sctp_without_kernel_sctp.clone(),
        );
        let drift_entries = Family::<Labels, Gauge>::default();
        registry.register(
            "drift_entries",
            "Entries of each service map that differed from what the agent wrote, at the last audit (repaired)",
            drift_entries.clone(),
        );
        let drift_repaired = Counter::default();
        registry.register(
            "drift_repaired",
            "Map operations that repaired drift",
            drift_repaired.clone(),
        );
        let audits = Counter::default();
        registry.register("audits", "Drift audits of the service maps", audits.clone());
        Self {
            registry,
            syncs,
            sync_duration,
            skipped,
            map_entries,
            map_capacity,
            datapath_packets,
            programming_latency,
            rejected,
            interfaces,
            sctp_without_kernel_sctp,
            drift_entries,
            drift_repaired,
            audits,
            health: Health::new(health_timeout),
            asks: OnceLock::new(),
        }
    }

    /// Where the endpoint's asks go; the agent loop reads the other end. Set once.
    pub fn answer_asks(&self, to: mpsc::Sender<Ask>) {
        let _ = self.asks.set(to);
    }

    /// Sends `ask` to the agent loop; `None` if no loop reads asks.
    fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Ask) -> Option<oneshot::Receiver<T>> {
        let (tx, rx) = oneshot::channel();
        self.asks.get()?.try_send(make(tx)).ok()?;
        Some(rx)
    }

    /// Replaces the skipped-object gauges with `counts` (kind, reason) → n.
    pub fn set_skipped(&self, counts: &BTreeMap<(String, String), i64>) {
        self.skipped.clear();
        for ((kind, reason), n) in counts {
            self.skipped
                .get_or_create(&vec![
                    ("kind".into(), kind.clone()),
                    ("reason".into(), reason.clone()),
                ])
                .set(*n);
        }
    }

    pub fn set_map(&self, map: &str, entries: u64, capacity: u32) {
        let labels = vec![("map".to_string(), map.to_string())];
        self.map_entries.get_or_create(&labels).set(entries as i64);
        self.map_capacity
            .get_or_create(&labels)
            .set(capacity as i64);
    }

    pub fn set_datapath(&self, name: &str, packets: u64) {
        self.datapath_packets
            .get_or_create(&vec![("reason".to_string(), name.to_string())])
            .set(packets as i64);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl conventions::http::Status for Metrics {
    fn metrics(&self) -> String {
        self.render()
    }
    fn health(&self) -> Result<(), String> {
        self.health.healthz_at(Instant::now())
    }
    fn live(&self) -> Result<(), String> {
        self.health.livez_at(Instant::now())
    }
    fn refresh(&self) -> conventions::http::Reply<'_, ()> {
        let answer = self.ask(Ask::Refresh);
        Box::pin(async move {
            if let Some(rx) = answer {
                let _ = rx.await;
            }
        })
    }
    fn extra(&self, path: &str) -> Option<conventions::http::Reply<'_, Result<String, String>>> {
        if path != "/audit" {
            return None;
        }
        let answer = self.ask(Ask::Audit);
        Some(Box::pin(async move {
            let report = answer
                .ok_or("the agent loop takes no requests")?
                .await
                .map_err(|_| "the agent loop stopped".to_string())??;
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())
        }))
    }
}

/// Serves `/metrics`, `/healthz`, `/livez` and `/audit` until the task is dropped.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /livez and /audit");
    conventions::http::serve_on(listener, metrics).await
}

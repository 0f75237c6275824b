//! Prometheus metrics of the controller and the health `/healthz` reports, served
//! by `conventions::http` (`/metrics`, `/healthz`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::plan::Plan;
use crate::store::Outcome;

type Labels = Vec<(String, String)>;

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Syncs by controller and result.
    pub syncs: Family<Labels, Counter>,
    /// Object writes by kind and operation (create, update, delete).
    pub changes: Family<Labels, Counter>,
    /// Desired endpoints per Service.
    pub endpoints_desired: Family<Labels, Gauge>,
    /// EndpointSlices per Service.
    pub slices: Family<Labels, Gauge>,
    /// Objects or files skipped, by reason.
    pub skipped: Family<Labels, Counter>,
    /// CPU seconds of the syncs' own work (see [`Metrics::sync_cpu`]).
    pub sync_cpu: Counter<f64, std::sync::atomic::AtomicU64>,
    /// CPU seconds spent polling the Service syncs (see [`Metrics::reconcile_cpu`]).
    pub reconcile_cpu: Counter<f64, std::sync::atomic::AtomicU64>,
    /// What `/healthz` answers.
    pub health: Arc<Health>,
}

/// How long a watch or the Lease may keep failing before `/healthz` says so.
pub const UNHEALTHY_AFTER: Duration = Duration::from_secs(60);

/// The health `/healthz` reports: unhealthy while a watch (or the leader Lease's
/// renewal) has failed without a success for longer than [`UNHEALTHY_AFTER`].
#[derive(Debug, Default)]
pub struct Health {
    failing_since: Mutex<HashMap<String, Instant>>,
}

impl Health {
    /// Records an outcome of `source` (a watch by kind, or "lease") at `now`.
    pub fn observe(&self, source: &str, ok: bool, now: Instant) {
        let mut failing = self.failing_since.lock().expect("health");
        if ok {
            failing.remove(source);
        } else {
            failing.entry(source.to_string()).or_insert(now);
        }
    }

    /// `None` when healthy at `now`, else what has been failing and for how long.
    pub fn problem(&self, now: Instant) -> Option<String> {
        let failing = self.failing_since.lock().expect("health");
        let mut bad: Vec<String> = failing
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) > UNHEALTHY_AFTER)
            .map(|(source, since)| {
                format!(
                    "{source} failing for {} s",
                    now.saturating_duration_since(*since).as_secs()
                )
            })
            .collect();
        bad.sort();
        (!bad.is_empty()).then(|| bad.join(", "))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sliceway_controller");
        let syncs = Family::<Labels, Counter>::default();
        let changes = Family::<Labels, Counter>::default();
        let endpoints_desired = Family::<Labels, Gauge>::default();
        let slices = Family::<Labels, Gauge>::default();
        let skipped = Family::<Labels, Counter>::default();
        let sync_cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        let reconcile_cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "syncs",
            "Service syncs by controller and result",
            syncs.clone(),
        );
        registry.register(
            "changes",
            "Objects written, by kind and operation",
            changes.clone(),
        );
        registry.register(
            "endpoints_desired",
            "Endpoints desired per Service",
            endpoints_desired.clone(),
        );
        registry.register(
            "endpointslices",
            "EndpointSlices per Service",
            slices.clone(),
        );
        registry.register(
            "skipped",
            "Objects or manifest files skipped, by reason",
            skipped.clone(),
        );
        registry.register(
            "sync_cpu_seconds",
            "CPU seconds of the Service syncs' own work: reading the stores, the \
             reconcilers and the plan, not the API writes, watches or runtime",
            sync_cpu.clone(),
        );
        registry.register(
            "reconcile_cpu_seconds",
            "CPU seconds spent polling the Service syncs: their own work, their events, \
             building and encoding their writes and reading the answers; not the \
             connections' HTTP, TLS and socket work, the watches or the runtime",
            reconcile_cpu.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            syncs,
            changes,
            endpoints_desired,
            slices,
            skipped,
            sync_cpu,
            reconcile_cpu,
            health: Arc::default(),
        }
    }

    /// Drops the per-Service series of a deleted Service.
    pub fn forget_service(&self, ns: &str, name: &str) {
        let l = labels(&[("namespace", ns), ("service", name)]);
        self.endpoints_desired.remove(&l);
        self.slices.remove(&l);
    }

    /// Measures the calling thread's CPU time until the guard is dropped and adds it
    /// to `sync_cpu_seconds_total`. Only for work with no `.await` inside, so that
    /// no other task runs on the thread meanwhile.
    pub fn sync_cpu(&self) -> CpuGuard {
        CpuGuard {
            counter: self.sync_cpu.clone(),
            start: thread_cpu(),
        }
    }

    /// `fut` with the CPU time of its polls (the polling thread's, from before each
    /// poll to after it) added to `reconcile_cpu_seconds_total`: the whole sync,
    /// writes included, as far as it runs in its own task. What the client does in
    /// tasks of its own (the request queue, HTTP, TLS, the socket) is not in it.
    pub fn reconcile_cpu<F: Future>(&self, fut: F) -> PollCpu<F> {
        PollCpu {
            fut: Box::pin(fut),
            counter: self.reconcile_cpu.clone(),
        }
    }

    /// Counts one sync.
    pub fn sync(&self, result: &str) {
        self.syncs
            .get_or_create(&labels(&[
                ("controller", "endpointslice"),
                ("result", result),
            ]))
            .inc();
    }

    /// Counts the writes of an applied plan.
    pub fn applied(&self, plan: &Plan) {
        for (op, list) in [
            ("create", &plan.create),
            ("update", &plan.update),
            ("delete", &plan.delete),
        ] {
            for obj in list {
                self.changes
                    .get_or_create(&labels(&[("kind", obj.kind()), ("operation", op)]))
                    .inc();
            }
        }
    }

    /// Records the per-Service figures of a pass.
    pub fn record_pass(&self, outcome: &Outcome, rejected: &[crate::local::Rejected]) {
        for ((ns, name), r) in &outcome.services {
            let l = labels(&[("namespace", ns), ("service", name)]);
            self.endpoints_desired
                .get_or_create(&l)
                .set(r.endpoints_desired as i64);
            self.slices.get_or_create(&l).set(r.slices as i64);
        }
        // Manifests skipped, by the reader's reason.
        for r in rejected {
            self.skipped
                .get_or_create(&labels(&[("reason", r.code)]))
                .inc();
        }
        if !outcome.retry.is_empty() {
            self.skipped
                .get_or_create(&labels(&[("reason", "pod_node_unknown")]))
                .inc_by(outcome.retry.len() as u64);
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Metrics with one series in every family, each made by the code that makes it
    /// in the controller: the generated metrics reference
    /// (`docs/reference/metrics.md`) is rendered from them, since a family without a
    /// series is not encoded.
    pub fn with_one_series_each() -> Self {
        let m = Self::new();
        m.sync("ok");
        m.applied(&Plan {
            create: vec![crate::plan::Object::Endpoints(Default::default())],
            ..Default::default()
        });
        let mut outcome = Outcome::default();
        outcome.services.insert(
            ("default".into(), "web".into()),
            crate::store::ServiceReport::default(),
        );
        outcome
            .retry
            .push((("default".into(), "web".into()), "pod_node_unknown".into()));
        m.record_pass(&outcome, &[]);
        m.sync_cpu.inc_by(1.0);
        m.reconcile_cpu.inc_by(1.0);
        m
    }
}

impl conventions::http::Status for Metrics {
    fn metrics(&self) -> String {
        self.render()
    }
    fn health(&self) -> std::result::Result<(), String> {
        match self.health.problem(Instant::now()) {
            None => Ok(()),
            Some(problem) => Err(problem),
        }
    }
}

/// Serves `/metrics` and `/healthz` on the address until the task is dropped
/// (`conventions::http`, the agent's endpoint too).
pub async fn serve(addr: std::net::SocketAddr, metrics: Metrics) -> crate::Result<()> {
    conventions::http::serve(addr, Arc::new(metrics))
        .await
        .map_err(|source| crate::Error::Io {
            path: addr.to_string(),
            source,
        })
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given; the clock exists
    // on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// See [`Metrics::reconcile_cpu`].
pub struct PollCpu<F> {
    fut: Pin<Box<F>>,
    counter: Counter<f64, std::sync::atomic::AtomicU64>,
}

impl<F: Future> Future for PollCpu<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let start = thread_cpu();
        let out = self.fut.as_mut().poll(cx);
        charge_since(&self.counter, start);
        out
    }
}

/// See [`Metrics::sync_cpu`].
pub struct CpuGuard {
    counter: Counter<f64, std::sync::atomic::AtomicU64>,
    start: Duration,
}

impl Drop for CpuGuard {
    fn drop(&mut self) {
        charge_since(&self.counter, self.start);
    }
}

/// Adds the calling thread's CPU time since `start` to `counter`.
fn charge_since(counter: &Counter<f64, std::sync::atomic::AtomicU64>, start: Duration) {
    counter.inc_by(thread_cpu().saturating_sub(start).as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until this thread has used `d` more CPU.
    fn burn(d: Duration) {
        let until = thread_cpu() + d;
        while thread_cpu() < until {
            std::hint::black_box(0u64);
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reconcile_cpu_counts_the_polls_and_not_the_waits() {
        let m = Metrics::new();
        // Two polls that work 20 ms each, a 200 ms wait between them.
        m.reconcile_cpu(async {
            burn(Duration::from_millis(20));
            tokio::time::sleep(Duration::from_millis(200)).await;
            burn(Duration::from_millis(20));
        })
        .await;
        let spent = m.reconcile_cpu.get();
        assert!(
            (0.040..0.100).contains(&spent),
            "40 ms of work in two polls counted as {spent} s"
        );
        // Meanwhile another task on the thread works: not counted.
        let other = tokio::spawn(async { burn(Duration::from_millis(50)) });
        m.reconcile_cpu(tokio::time::sleep(Duration::from_millis(100)))
            .await;
        other.await.expect("the other task");
        let waited = m.reconcile_cpu.get() - spent;
        assert!(
            waited < 0.010,
            "a sync that only waited counted {waited} s while another task worked 50 ms"
        );
    }

    #[test]
    fn health_turns_bad_only_after_a_failure_outlasts_the_threshold() {
        let h = Health::default();
        let t0 = Instant::now();
        assert_eq!(h.problem(t0), None);
        h.observe("pods", false, t0);
        h.observe("pods", false, t0 + Duration::from_secs(30));
        assert_eq!(h.problem(t0 + Duration::from_secs(59)), None);
        let p = h.problem(t0 + Duration::from_secs(61)).expect("unhealthy");
        assert!(p.contains("pods failing for 61 s"), "{p}");
        h.observe("pods", true, t0 + Duration::from_secs(62));
        assert_eq!(h.problem(t0 + Duration::from_secs(62)), None);
    }

    #[test]
    fn deleted_services_leave_no_series() {
        let m = Metrics::new();
        let l = labels(&[("namespace", "default"), ("service", "web")]);
        m.slices.get_or_create(&l).set(2);
        assert!(m.render().contains("service=\"web\""));
        m.forget_service("default", "web");
        assert!(!m.render().contains("service=\"web\""), "{}", m.render());
    }

    /// The reference's example has a series in every family the controller
    /// registers (the registry's debug form lists each registration; a family without
    /// a series would be missing from `docs/reference/metrics.md`), and each family's
    /// series carry one set of labels.
    #[test]
    fn the_reference_example_has_a_series_in_every_family() {
        let m = Metrics::with_one_series_each();
        let registered = format!("{:?}", m.registry).matches("Descriptor {").count();
        let checked = conventions::exposition::check_one_series_each(registered, &m.render());
        assert_eq!(checked, Ok(()));
    }

    #[test]
    fn renders_registered_metrics() {
        let m = Metrics::new();
        m.sync("ok");
        let text = m.render();
        assert!(text.contains("sliceway_controller_syncs_total"), "{text}");
    }
}

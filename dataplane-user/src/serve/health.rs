//! What `/healthz` and `/livez` say.
//!
//! The sync rule is kube-proxy's proxy health server
//! (pkg/proxy/healthcheck/proxy_health.go, `QueuedUpdate`, `Updated`, `Health`;
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/healthcheck/proxy_health.go>):
//! a change that arrived is "queued" until a sync writes it; the agent is unhealthy
//! when the oldest queued change has waited `timeout` or longer (kube-proxy's
//! timeout is twice its sync period, 2 × 30 s by default; ours is
//! `--healthz-timeout-seconds`, 60 by default). Both of kube-proxy's endpoints apply
//! that rule, and so do ours.
//!
//! Beyond kube-proxy, `/healthz` also fails when a watch of the API server has been
//! failing for `timeout` or longer: the agent then programs an old view of the
//! cluster, and a load balancer's health check should prefer another node. `/livez`
//! does not: a restart does not bring an API server back, so the process stays live
//! while it works (it answers, and its syncs keep up with what it receives).
//!
//! A sync whose map writes failed leaves the change queued; the drift audit that
//! repairs the maps counts as the sync that writes it.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

/// kube-proxy's default health timeout: twice its default sync period of 30 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The watches of the API server that are failing: since when, and the last error.
/// The Kubernetes source reports into it; [`Health`] reads it.
#[derive(Debug, Default)]
pub struct Watches {
    failing: Mutex<BTreeMap<&'static str, (Instant, String)>>,
}

impl Watches {
    /// The watch of `kind` failed: it counts as failing from its first failure.
    pub fn failed(&self, kind: &'static str, error: &dyn std::fmt::Display) {
        let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = failing
            .entry(kind)
            .or_insert_with(|| (Instant::now(), String::new()));
        entry.1 = error.to_string();
    }

    /// The watch of `kind` delivered an event again.
    pub fn recovered(&self, kind: &'static str) {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(kind);
    }

    /// The kinds whose watch is failing.
    pub fn failing_kinds(&self) -> Vec<&'static str> {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
    }

    /// The watch failing the longest: its kind, since when, its last error.
    pub fn longest(&self) -> Option<(&'static str, Instant, String)> {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .min_by_key(|(_, (since, _))| *since)
            .map(|(kind, (since, error))| (*kind, *since, error.clone()))
    }
}

#[derive(Debug, Default)]
struct State {
    /// Whether a sync has written the first full state.
    synced: bool,
    /// The oldest change not yet written (kube-proxy's `oldestPendingQueued`).
    pending_since: Option<Instant>,
}

/// The agent's health, shared by the agent loop (which reports) and the HTTP
/// endpoint (which asks).
#[derive(Debug)]
pub struct Health {
    timeout: Duration,
    state: Mutex<State>,
    watches: Mutex<Option<Arc<Watches>>>,
}

impl Health {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            state: Mutex::default(),
            watches: Mutex::new(None),
        }
    }

    /// Follow these watches (the Kubernetes source's) in `/healthz`.
    pub fn follow(&self, watches: Arc<Watches>) {
        *self.watches.lock().unwrap_or_else(PoisonError::into_inner) = Some(watches);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A change arrived that the next sync must write (kube-proxy's `QueuedUpdate`):
    /// the oldest such change is kept.
    pub fn queued(&self) {
        self.state().pending_since.get_or_insert_with(Instant::now);
    }

    /// Everything received is written (kube-proxy's `Updated`).
    pub fn updated(&self) {
        let mut s = self.state();
        s.synced = true;
        s.pending_since = None;
    }

    /// kube-proxy's rule, at `now`: `Err` when a queued change has waited `timeout`.
    fn syncs_keep_up(&self, now: Instant) -> Result<(), String> {
        match self.state().pending_since {
            Some(since) if now.saturating_duration_since(since) >= self.timeout => Err(format!(
                "a change has waited {}s for a sync that writes it (the limit is {}s)",
                now.saturating_duration_since(since).as_secs(),
                self.timeout.as_secs()
            )),
            _ => Ok(()),
        }
    }

    /// `/healthz` at `now`.
    pub fn healthz_at(&self, now: Instant) -> Result<(), String> {
        if !self.state().synced {
            return Err("not synced yet".into());
        }
        self.syncs_keep_up(now)?;
        let watches = self
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some((kind, since, error)) = watches.and_then(|w| w.longest()) {
            let failing = now.saturating_duration_since(since);
            if failing >= self.timeout {
                return Err(format!(
                    "the watch of {kind} has failed for {}s (the limit is {}s): {error}",
                    failing.as_secs(),
                    self.timeout.as_secs()
                ));
            }
        }
        Ok(())
    }

    /// `/livez` at `now`.
    pub fn livez_at(&self, now: Instant) -> Result<(), String> {
        self.syncs_keep_up(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(60);

    #[test]
    fn not_healthy_before_the_first_sync_but_live() {
        let h = Health::new(T);
        let now = Instant::now();
        assert_eq!(h.healthz_at(now), Err("not synced yet".into()));
        assert_eq!(h.livez_at(now), Ok(()));
        h.updated();
        assert_eq!(h.healthz_at(now), Ok(()));
    }

    /// kube-proxy's TestHealthzServer steps: a queued update younger than the timeout
    /// is healthy, one as old as the timeout is not, an update clears it.
    #[test]
    fn a_queued_change_older_than_the_timeout_fails_both() {
        let h = Health::new(T);
        h.updated();
        h.queued();
        let queued = h.state().pending_since.unwrap();
        assert_eq!(h.healthz_at(queued + T - Duration::from_secs(1)), Ok(()));
        let late = queued + T;
        assert!(h.healthz_at(late).unwrap_err().contains("waited 60s"));
        assert!(h.livez_at(late).is_err());
        // A later change does not move the oldest one.
        h.queued();
        assert_eq!(h.state().pending_since, Some(queued));
        h.updated();
        assert_eq!(h.healthz_at(late), Ok(()));
        assert_eq!(h.livez_at(late), Ok(()));
    }

    #[test]
    fn a_watch_failing_for_the_timeout_fails_healthz_only() {
        let h = Health::new(T);
        h.updated();
        let w = Arc::new(Watches::default());
        h.follow(w.clone());
        w.failed("Service", &"connection refused");
        let (_, since, _) = w.longest().unwrap();
        w.failed("Service", &"connection reset");
        assert_eq!(w.longest().unwrap().1, since, "the first failure counts");
        assert_eq!(h.healthz_at(since + T - Duration::from_secs(1)), Ok(()));
        let why = h.healthz_at(since + T).unwrap_err();
        assert!(
            why.contains("watch of Service") && why.contains("connection reset"),
            "{why}"
        );
        assert_eq!(h.livez_at(since + T), Ok(()));
        w.recovered("Service");
        assert_eq!(h.healthz_at(since + T), Ok(()));
    }
}

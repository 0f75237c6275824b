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
//!
//! `/healthz` also fails while the own Node is not eligible for load balancers
//! (being deleted, or tainted `ToBeDeletedByClusterAutoscaler`: kube-proxy's
//! `NodeEligible`, KEP-3836); `/livez` does not, as kube-proxy's. A Node never seen
//! (local mode without one) counts as eligible: kube-proxy waits for its Node at
//! start. Both answer with kube-proxy's JSON body ([`Health::page`]); the
//! healthCheckNodePort servers read [`Health::proxy_healthy_at`], which leaves
//! the Node out, as kube-proxy's `serviceProxyHealthy` does.
//!
//! When kube-proxy is found at work on the node ([`crate::kube_proxy`]),
//! `/healthz`'s body names what was found (`kubeProxy`) and its status stays the
//! rule's: while kube-proxy is being replaced every node has both for a while, and a
//! failing `/healthz` there would take every node out of load balancers at once.
//!
//! `/readyz` (sliceway's own; kube-proxy has none) is what the DaemonSet's
//! readiness probe asks: the proxier's rule of `/healthz` (synced once, syncs
//! keeping up, the watches working), the Node left out, and every program the agent
//! needs attached ([`Health::not_attached`]): the socket programs when socket load
//! balancing is on, and the TC program on every interface selected. An agent that
//! serves its pods but not the node's own sockets is not ready, rather than ready
//! and half-working.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime},
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
    /// When everything received was last written (kube-proxy's `lastUpdated`).
    last_updated: Option<SystemTime>,
    /// Whether the own Node is eligible for load balancers; `None` without one.
    node_eligible: Option<bool>,
    /// Programs the agent needs that are not attached: what, and why not.
    unattached: BTreeMap<String, String>,
    /// Signs of kube-proxy on the node ([`crate::kube_proxy`]).
    kube_proxy: Vec<String>,
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
        s.last_updated = Some(SystemTime::now());
    }

    /// What the source says of the own Node's eligibility ([`crate::model::NodeInfo::eligible`]).
    pub fn set_node_eligible(&self, eligible: Option<bool>) {
        self.state().node_eligible = eligible;
    }

    /// The signs of kube-proxy last seen on the node: `/healthz`'s body names them
    /// (`kubeProxy`), its status stays the sync rule's.
    pub fn set_kube_proxy(&self, signs: Vec<String>) {
        self.state().kube_proxy = signs;
    }

    /// A program the agent needs is not attached to `what` (`socket programs`,
    /// `interface eth0`): `/readyz` fails with `why` until [`Health::attached`].
    pub fn not_attached(&self, what: impl Into<String>, why: impl std::fmt::Display) {
        self.state().unattached.insert(what.into(), why.to_string());
    }

    /// What [`Health::not_attached`] named is attached now, or no longer needed.
    pub fn attached(&self, what: &str) {
        self.state().unattached.remove(what);
    }

    /// `/readyz` at `now`: [`Health::proxy_healthy_at`], and every program the agent
    /// needs attached.
    pub fn readyz_at(&self, now: Instant) -> Result<(), String> {
        self.proxy_healthy_at(now)?;
        let s = self.state();
        if s.unattached.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = s
            .unattached
            .iter()
            .map(|(what, why)| format!("{what}: {why}"))
            .collect();
        Err(format!("not attached: {}", list.join("; ")))
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

    /// `/healthz` at `now`: [`Health::proxy_healthy_at`], and the own Node
    /// eligible for load balancers.
    pub fn healthz_at(&self, now: Instant) -> Result<(), String> {
        self.proxy_healthy_at(now)?;
        if self.state().node_eligible == Some(false) {
            return Err(format!(
                "the Node is being deleted or is tainted {}: load balancers are to send elsewhere",
                crate::model::TO_BE_DELETED_TAINT
            ));
        }
        Ok(())
    }

    /// Whether the agent keeps the datapath up to date at `now` (synced once, syncs
    /// keeping up, the watches working), the Node left out: what the
    /// healthCheckNodePort servers report as `serviceProxyHealthy`.
    pub fn proxy_healthy_at(&self, now: Instant) -> Result<(), String> {
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

    /// The body of `/healthz` (`live`: of `/livez`) at `now` (`wall` is the same
    /// moment by the wall clock), and whether it is healthy: kube-proxy's
    /// `ProxyHealth` JSON (`lastUpdated`, `currentTime`, `nodeEligible` for
    /// `/healthz` only, `healthy`, and `status` per family, one sync serving both
    /// here), with `reason` added when unhealthy. As kube-proxy's handlers,
    /// `lastUpdated` is the current time when healthy, for clients of older
    /// releases that read it as "the sync loop ran".
    pub fn page(&self, live: bool, now: Instant, wall: SystemTime) -> (bool, String) {
        let verdict = if live {
            self.livez_at(now)
        } else {
            self.healthz_at(now)
        };
        let (last_updated, eligible, kube_proxy) = {
            let s = self.state();
            (
                s.last_updated,
                s.node_eligible.unwrap_or(true),
                s.kube_proxy.clone(),
            )
        };
        let healthy = verdict.is_ok();
        // Go's zero time, as kube-proxy's JSON shows a proxier that never synced.
        let time = |t: Option<SystemTime>| {
            t.and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
                .map_or_else(|| "0001-01-01T00:00:00Z".to_string(), |t| t.to_string())
        };
        // `healthy` in the body is the proxier's, the Node left out (kube-proxy's
        // `Health().Healthy`); the status code is both.
        let proxy = if live {
            healthy
        } else {
            self.proxy_healthy_at(now).is_ok()
        };
        let family = serde_json::json!({"lastUpdated": time(last_updated), "healthy": proxy});
        let mut page = serde_json::json!({
            "lastUpdated": time(if healthy { Some(wall) } else { last_updated }),
            "currentTime": time(Some(wall)),
            "healthy": proxy,
            "status": {"IPv4": family, "IPv6": family},
        });
        if !live {
            page["nodeEligible"] = eligible.into();
            if !kube_proxy.is_empty() {
                page["kubeProxy"] = kube_proxy.into();
            }
        }
        if let Err(why) = verdict {
            page["reason"] = why.into();
        }
        (healthy, page.to_string())
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

    /// kube-proxy's TestHealthzServer node cases: a Node being deleted, or tainted
    /// by the cluster autoscaler, fails `/healthz` (503) but not `/livez`; the body
    /// says `nodeEligible: false` and the proxier itself healthy.
    #[test]
    fn a_node_leaving_fails_healthz_alone_with_kube_proxys_body() {
        let h = Health::new(T);
        h.updated();
        let (now, wall) = (Instant::now(), SystemTime::now());
        let page = |live| {
            let (ok, body) = h.page(live, now, wall);
            (
                ok,
                serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            )
        };
        let (ok, body) = page(false);
        assert!(ok, "{body}");
        assert_eq!(body["nodeEligible"], true);
        assert_eq!(body["healthy"], true);
        assert_eq!(
            body["lastUpdated"], body["currentTime"],
            "now, when healthy"
        );
        assert_eq!(body["status"]["IPv4"]["healthy"], true);
        assert!(body.get("reason").is_none(), "{body}");
        h.set_node_eligible(Some(false));
        let (ok, body) = page(false);
        assert!(!ok);
        assert_eq!(body["nodeEligible"], false);
        assert_eq!(body["healthy"], true, "the proxier is");
        assert!(body["reason"]
            .as_str()
            .unwrap()
            .contains(crate::model::TO_BE_DELETED_TAINT));
        assert_eq!(
            h.proxy_healthy_at(now),
            Ok(()),
            "health checks leave the Node out"
        );
        let (ok, body) = page(true);
        assert!(ok, "{body}");
        assert!(
            body.get("nodeEligible").is_none(),
            "/livez does not say: {body}"
        );
        // No Node object: eligible.
        h.set_node_eligible(None);
        assert!(page(false).0);
    }

    /// Issue 47: `/readyz` waits for the first sync and for every program the agent
    /// needs, and leaves the Node's eligibility to `/healthz`.
    #[test]
    fn readyz_fails_until_synced_and_while_a_needed_program_is_not_attached() {
        let h = Health::new(T);
        let now = Instant::now();
        assert_eq!(h.readyz_at(now), Err("not synced yet".into()));
        h.updated();
        assert_eq!(h.readyz_at(now), Ok(()));
        h.not_attached("socket programs", "attaching to /sys/fs/cgroup: EPERM");
        h.not_attached("interface veth1", "no such device");
        assert_eq!(
            h.readyz_at(now),
            Err(
                "not attached: interface veth1: no such device; socket programs: \
                 attaching to /sys/fs/cgroup: EPERM"
                    .into()
            )
        );
        assert_eq!(h.healthz_at(now), Ok(()), "/healthz is the proxier's rule");
        h.attached("socket programs");
        h.attached("interface veth1");
        assert_eq!(h.readyz_at(now), Ok(()));
        h.set_node_eligible(Some(false));
        assert_eq!(h.readyz_at(now), Ok(()), "the Node is for load balancers");
        h.queued();
        let late = now + T + Duration::from_secs(1);
        assert!(h.readyz_at(late).unwrap_err().contains("waited"));
    }

    /// Issue 47: signs of kube-proxy are named in `/healthz`'s body, its status
    /// unchanged; `/livez` leaves them out.
    #[test]
    fn kube_proxy_s_signs_are_named_in_healthz_body_only() {
        let h = Health::new(T);
        h.updated();
        let (now, wall) = (Instant::now(), SystemTime::now());
        let body = |live| -> (bool, serde_json::Value) {
            let (ok, body) = h.page(live, now, wall);
            (ok, serde_json::from_str(&body).unwrap())
        };
        assert!(body(false).1.get("kubeProxy").is_none());
        h.set_kube_proxy(vec!["nftables table ip kube-proxy".into()]);
        let (ok, page) = body(false);
        assert!(ok, "{page}");
        assert_eq!(page["kubeProxy"][0], "nftables table ip kube-proxy");
        assert!(body(true).1.get("kubeProxy").is_none());
        h.set_kube_proxy(Vec::new());
        assert!(body(false).1.get("kubeProxy").is_none());
    }

    #[test]
    fn before_the_first_sync_the_body_shows_go_s_zero_time() {
        let h = Health::new(T);
        let (ok, body) = h.page(false, Instant::now(), SystemTime::now());
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(!ok);
        assert_eq!(body["lastUpdated"], "0001-01-01T00:00:00Z");
        assert_eq!(body["reason"], "not synced yet");
    }
}

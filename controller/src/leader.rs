//! Leader election with a coordination.k8s.io Lease, so two replicas never both
//! write: a replica acts only while it holds the Lease and renews it in time.
//!
//! Expiry follows client-go's leaderelection package (k8s.io/client-go/tools/
//! leaderelection/leaderelection.go): a contender never trusts the holder's clock.
//! It remembers when it last saw the Lease record change (holder, renew time,
//! duration) on its own monotonic clock, and takes the Lease only once
//! `leaseDurationSeconds` have passed since then without a change. A holder that
//! stops gracefully releases the Lease (`ReleaseOnCancel`), so a successor need not
//! wait for it to expire.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

/// A Lease held by one identity.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    observed: std::sync::Arc<std::sync::Mutex<Option<Observed>>>,
    health: Option<std::sync::Arc<crate::metrics::Health>>,
}

/// The Lease record last seen, and when (on this replica's monotonic clock).
#[derive(Clone, Debug)]
struct Observed {
    record: (String, Option<String>, Option<i32>),
    at: tokio::time::Instant,
}

impl LeaseLock {
    /// A lock on the Lease `name` reachable through `api`.
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        LeaseLock {
            api,
            name: name.into(),
            identity: identity.into(),
            duration,
            observed: Default::default(),
            health: None,
        }
    }

    /// Reports every renewal to `health` (failing renewals turn `/healthz` bad).
    pub fn with_health(mut self, health: std::sync::Arc<crate::metrics::Health>) -> Self {
        self.health = Some(health);
        self
    }

    /// How long a holder keeps the Lease without renewing it.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    fn spec(&self, now: Timestamp, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: Some(acquire.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Takes or renews the Lease at time `now`; true while this identity holds it.
    /// Writes carry the read resourceVersion, so of two contenders one wins.
    pub async fn try_acquire_or_renew(&self, now: Timestamp) -> crate::Result<bool> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        let transitions = spec.lease_transitions.unwrap_or(0);
        if holder == self.identity {
            lease.spec = Some(self.spec(now, spec.acquire_time.clone(), transitions));
        } else {
            if !holder.is_empty() && !self.expired(&spec) {
                return Ok(false);
            }
            lease.spec = Some(self.spec(now, None, transitions + 1));
        }
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the record in `spec` has gone unchanged for its whole duration since
    /// this replica first saw it.
    fn expired(&self, spec: &LeaseSpec) -> bool {
        let record = (
            spec.holder_identity.clone().unwrap_or_default(),
            spec.renew_time.as_ref().map(|t| t.0.to_string()),
            spec.lease_duration_seconds,
        );
        let now = tokio::time::Instant::now();
        let mut observed = self.observed.lock().expect("observed lease");
        let at = match observed.as_ref() {
            Some(o) if o.record == record => o.at,
            _ => {
                *observed = Some(Observed { record, at: now });
                now
            }
        };
        let secs = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
        at + Duration::from_secs(secs) <= now
    }

    /// Gives the Lease up if this identity holds it: the holder is cleared, so a
    /// waiting replica takes over at its next try instead of after the expiry.
    pub async fn release(&self) -> crate::Result<()> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }

    /// Waits until this identity holds the Lease.
    pub async fn acquire(&self) -> crate::Result<()> {
        loop {
            match self.try_acquire_or_renew(Timestamp::now()).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.duration / 4).await;
        }
    }

    /// Renews the Lease until it is lost (returns `Error::NotLeader`).
    pub async fn keep(&self) -> crate::Result<()> {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            let renewed = self.try_acquire_or_renew(Timestamp::now()).await;
            if let Some(h) = &self.health {
                h.observe("lease", renewed.is_ok(), std::time::Instant::now());
            }
            match renewed {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return Err(crate::Error::NotLeader),
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the lease");
                    if last_ok.elapsed() > self.duration * 2 / 3 {
                        return Err(crate::Error::NotLeader);
                    }
                }
            }
        }
    }
}

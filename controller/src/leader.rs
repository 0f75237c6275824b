//! Leader election with a coordination.k8s.io Lease, so two replicas never both
//! write: a replica acts only while it holds the Lease and renews it in time.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

/// A Lease held by one identity.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseLock {
    /// A lock on the Lease `name` reachable through `api`.
    pub fn new(api: Api<Lease>, name: &str, identity: &str, duration: Duration) -> Self {
        LeaseLock {
            api,
            name: name.into(),
            identity: identity.into(),
            duration,
        }
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
            let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0));
            let expired = match &spec.renew_time {
                Some(t) => t.0 + SignedDuration::from_secs(secs) < now,
                None => true,
            };
            if !holder.is_empty() && !expired {
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
            match self.try_acquire_or_renew(Timestamp::now()).await {
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

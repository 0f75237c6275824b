//! Retries: per-Service backoff and the overall rate limit of the work queue, as
//! upstream's controllers configure theirs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::{publish, Context};
use crate::Error;

/// How often a Service is retried before it is dropped from the queue (upstream's
/// `maxRetries` in pkg/controller/endpointslice/endpointslice_controller.go); a
/// later change of the Service or its Pods queues it again.
pub const MAX_RETRIES: u32 = 15;

/// Upstream's rate limiter for this controller's queue: the larger of a per-item
/// exponential backoff (1 s doubling up to 1000 s) and an overall token bucket of 10
/// retries per second with a burst of 100 (`NewTypedMaxOfRateLimiter` of
/// `ItemExponentialFailureRateLimiter(1s, 1000s)` and `BucketRateLimiter(10, 100)`).
#[derive(Debug)]
pub struct RateLimiter {
    failures: HashMap<String, u32>,
    tokens: f64,
    last: std::time::Instant,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self {
            failures: HashMap::new(),
            tokens: BUCKET_BURST,
            last: std::time::Instant::now(),
        }
    }
}

const BUCKET_RATE: f64 = 10.0;
const BUCKET_BURST: f64 = 100.0;

/// What to do after a failed sync.
#[derive(Debug, PartialEq)]
pub enum Retry {
    /// Retry after this delay (this is retry number `n`).
    After(Duration, u32),
    /// Retried [`MAX_RETRIES`] times: drop it until something changes.
    Drop,
}

impl RateLimiter {
    /// The decision for `key`'s next failure at `now`.
    pub fn failed(&mut self, key: &str, now: std::time::Instant) -> Retry {
        let n = self.failures.entry(key.to_string()).or_insert(0);
        if *n >= MAX_RETRIES {
            self.failures.remove(key);
            return Retry::Drop;
        }
        *n += 1;
        let n = *n;
        // Token bucket with reservations: a retry past the burst waits its turn.
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * BUCKET_RATE).min(BUCKET_BURST) - 1.0;
        let bucket = if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / BUCKET_RATE)
        };
        Retry::After(backoff(n).max(bucket), n)
    }

    /// A successful sync forgets the key's failures (the queue's `Forget`).
    pub fn forget(&mut self, key: &str) {
        self.failures.remove(key);
    }
}

/// Retries with upstream's rate limiter; after [`MAX_RETRIES`] the Service is dropped
/// with an event until it changes again.
pub fn error_policy(svc: Arc<Service>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
    let decision = ctx
        .failures
        .lock()
        .expect("failures")
        .failed(&key, std::time::Instant::now());
    match decision {
        Retry::After(delay, n) => {
            tracing::warn!(service = %key, error = %err, retry = n, retry_in = ?delay, "sync failed");
            Action::requeue(delay)
        }
        Retry::Drop => {
            tracing::error!(service = %key, error = %err, "sync failed {MAX_RETRIES} times: dropped until it changes");
            ctx.metrics.sync("dropped");
            let note = format!("dropped after {MAX_RETRIES} failed syncs: {err}");
            let regarding = svc.object_ref(&());
            tokio::spawn(async move {
                publish(&ctx, &regarding, "FailedToSyncService", &note).await;
            });
            Action::await_change()
        }
    }
}

/// The per-item delay before the `n`th retry: 1 s doubling up to 1000 s.
pub fn backoff(n: u32) -> Duration {
    let secs = 1u64.checked_shl(n.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_secs(secs.min(1000))
}

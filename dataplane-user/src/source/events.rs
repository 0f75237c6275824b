//! Kubernetes Events about objects the agent cannot program: a Service that asks for
//! another's frontend, a port or field it does not take, a frontend that does not
//! fit the maps. Recorded on the object (`kubectl describe service` shows them) with
//! kube-rs's recorder (events.k8s.io/v1, which folds repeats into a series), once per
//! problem as the log says it, and rate-limited: a burst of [`BURST`], then one every
//! [`REFILL`]; what the limit holds back is counted and said in the log.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    runtime::events::{Event, EventType, Recorder, Reporter},
    Client,
};
use tracing::{debug, warn};

/// Events sent at once before the limit applies.
pub const BURST: u32 = 10;
/// One more event may go every `REFILL`.
pub const REFILL: Duration = Duration::from_secs(6);

/// Something the agent could not program, about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `Service` or `EndpointSlice`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// snake_case code (the metrics' reason).
    pub code: String,
    pub message: String,
}

/// A token bucket.
#[derive(Debug)]
pub struct Limit {
    tokens: u32,
    last: Instant,
    held: u64,
}

impl Limit {
    pub fn new(now: Instant) -> Self {
        Self {
            tokens: BURST,
            last: now,
            held: 0,
        }
    }

    /// Whether one more event may go at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let refills =
            (now.saturating_duration_since(self.last).as_millis() / REFILL.as_millis()) as u32;
        if refills > 0 {
            self.tokens = (self.tokens + refills).min(BURST);
            self.last += REFILL * refills;
        }
        if self.tokens == 0 {
            self.held += 1;
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// Events held back so far.
    pub fn held(&self) -> u64 {
        self.held
    }
}

/// `frontend_conflict` → `FrontendConflict` (an Event's reason is PascalCase).
pub fn reason(code: &str) -> String {
    code.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

/// Records Events through the API server.
pub struct Events {
    recorder: Arc<Recorder>,
    limit: Limit,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("limit", &self.limit)
            .finish()
    }
}

impl Events {
    /// Events reported as `sliceway-agent` on `node`.
    pub fn new(client: Client, node: Option<&str>) -> Self {
        let reporter = Reporter {
            controller: "sliceway-agent".into(),
            instance: node.map(str::to_string),
        };
        Self {
            recorder: Arc::new(Recorder::new(client, reporter)),
            limit: Limit::new(Instant::now()),
        }
    }

    /// Records `problem` on `object` (with its uid, so `kubectl describe` finds it),
    /// unless the limit holds it back. Sent on a task of its own: the agent loop never
    /// waits for the API server.
    pub fn record(&mut self, problem: &Problem, object: ObjectReference) {
        if !self.limit.take(Instant::now()) {
            debug!(
                held = self.limit.held(),
                "event rate limit: not recording {} on {}/{}",
                problem.code,
                problem.namespace,
                problem.name
            );
            return;
        }
        let recorder = self.recorder.clone();
        let event = Event {
            type_: EventType::Warning,
            reason: reason(&problem.code),
            note: Some(problem.message.chars().take(1024).collect()),
            action: "Program".into(),
            secondary: None,
        };
        let what = format!("{}/{}", problem.namespace, problem.name);
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &object).await {
                warn!(object = %what, "recording an event failed: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_refill() {
        let t0 = Instant::now();
        let mut l = Limit::new(t0);
        for _ in 0..BURST {
            assert!(l.take(t0));
        }
        assert!(!l.take(t0));
        assert!(!l.take(t0 + REFILL - Duration::from_millis(1)));
        assert!(l.take(t0 + REFILL));
        assert!(!l.take(t0 + REFILL));
        assert_eq!(l.held(), 3);
        // A long quiet time refills the burst, no more.
        let later = t0 + REFILL * 100;
        for _ in 0..BURST {
            assert!(l.take(later));
        }
        assert!(!l.take(later));
    }

    #[test]
    fn reasons_are_pascal_case() {
        assert_eq!(reason("frontend_conflict"), "FrontendConflict");
        assert_eq!(reason("map_full"), "MapFull");
    }
}

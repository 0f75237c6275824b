//! The last-change trigger time of a Service's endpoints.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::pod_ready_transition;

/// Formats a trigger time as upstream does (RFC 3339 with nanoseconds, UTC).
pub fn format_time(t: &Time) -> String {
    // jiff prints RFC 3339 in UTC with only the significant fractional digits,
    // as Go's time.RFC3339Nano does.
    t.0.to_string()
}

/// Per-Service state of the last-change trigger time (upstream's TriggerTimeTracker):
/// the annotation says when the change that caused this write happened.
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/util/endpoint/trigger_time_tracker.go>
#[derive(Debug, Default, Clone)]
pub struct TriggerTimeTracker {
    states: HashMap<String, TriggerState>,
}

#[derive(Debug, Default, Clone)]
struct TriggerState {
    pods: HashMap<String, Time>,
    service: Option<Time>,
}

impl TriggerTimeTracker {
    /// The earliest trigger time among Pods and the Service that changed since the
    /// last call for this Service; `None` for a Service seen the first time.
    pub fn compute(&mut self, svc: &Service, pods: &[&Pod]) -> Option<Time> {
        let key = format!(
            "{}/{}",
            svc.metadata.namespace.as_deref().unwrap_or(""),
            svc.metadata.name.as_deref().unwrap_or("")
        );
        let old = self.states.get(&key);
        let was_known = old.is_some();
        let mut new = TriggerState::default();
        let mut min: Option<Time> = None;
        let consider = |t: &Time, min: &mut Option<Time>| {
            if min.as_ref().is_none_or(|m| t.0 < m.0) {
                *min = Some(t.clone());
            }
        };
        for pod in pods {
            if let Some(t) = pod_ready_transition(pod) {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let before = old.and_then(|o| o.pods.get(&name));
                if before.is_none_or(|b| t.0 > b.0) {
                    consider(&t, &mut min);
                }
                new.pods.insert(name, t);
            }
        }
        let svc_time = svc.metadata.creation_timestamp.clone();
        if let Some(t) = &svc_time {
            if old
                .and_then(|o| o.service.as_ref())
                .is_none_or(|b| t.0 > b.0)
            {
                consider(t, &mut min);
            }
        }
        new.service = svc_time;
        self.states.insert(key, new);
        if was_known {
            min
        } else {
            None
        }
    }

    /// Forgets a deleted Service.
    pub fn delete(&mut self, namespace: &str, name: &str) {
        self.states.remove(&format!("{namespace}/{name}"));
    }
}

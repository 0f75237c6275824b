//! Warnings the reconcilers report as Kubernetes Events, typed: what they are about,
//! upstream's reason, and the note. The kube edge publishes them, local mode logs
//! them.

use std::fmt;

/// The object an event is recorded on: upstream's EndpointSlice controller reports
/// on the Service, the mirroring controller on the Endpoints it mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Regarding {
    Service,
    Endpoints,
}

impl fmt::Display for Regarding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Regarding::Service => "Service",
            Regarding::Endpoints => "Endpoints",
        })
    }
}

/// A warning event: upstream's reason (`TopologyAwareHintsDisabled`,
/// `InvalidIPAddress`, ...) and its note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub reason: &'static str,
    pub note: String,
}

impl Warning {
    pub fn new(reason: &'static str, note: impl Into<String>) -> Self {
        Self {
            reason,
            note: note.into(),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.note)
    }
}

//! sliceway-controller: the controllers kube-controller-manager runs for Services
//! (EndpointSlice, Endpoints and EndpointSlice mirroring), with upstream semantics.
//!
//! Pure cores, thin edges: [`reconciler`], [`endpoints`] and [`mirroring`] are pure
//! functions from objects to a [`plan::Plan`]; [`store`] runs them over a snapshot of
//! the cluster; [`local`] (a directory of YAML) and [`controller`] (a real API server
//! through kube-rs) are the edges that feed snapshots in and apply plans out.

pub mod cli;
pub mod controller;
pub mod endpoints;
pub mod events;
pub mod leader;
pub mod local;
pub mod metrics;
pub mod mirroring;
pub mod plan;
pub mod reconciler;
pub mod store;
pub mod topology;
pub mod util;

#[cfg(test)]
pub(crate) mod fixtures;

/// Errors of the library; the binary wraps them with anyhow.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Reading or writing a manifest file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Writing one object of a plan failed; the objects before it were written, the
    /// rest were not (the sync is retried).
    #[error("{op} {kind} {namespace}/{name}: {source}")]
    Write {
        /// `create`, `update` or `delete`.
        op: &'static str,
        /// `EndpointSlice` or `Endpoints`.
        kind: &'static str,
        /// Namespace of the object.
        namespace: String,
        /// Name of the object (its `generateName` prefix when it has none yet).
        name: String,
        /// The API error.
        source: Box<kube::Error>,
    },
    /// A manifest could not be parsed.
    #[error("{path}: {reason}")]
    Manifest {
        /// The file.
        path: String,
        /// Why it was rejected.
        reason: String,
    },
    /// Serializing an object failed.
    #[error("serialize: {0}")]
    Serialize(String),
    /// The EndpointSlice cache holds older generations than this controller wrote.
    #[error("EndpointSlice informer cache is out of date for {0}")]
    StaleCache(String),
    /// Some Pods could not be placed (their Node is unknown); the Service is retried.
    #[error("{0}")]
    Retry(String),
    /// An invalid option.
    #[error("invalid option: {0}")]
    Options(String),
    /// This replica does not hold the leader Lease.
    #[error("not the leader")]
    NotLeader,
}

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

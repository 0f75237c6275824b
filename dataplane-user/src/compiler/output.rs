//! What the compiler gives: frontends (a Service port, its backends and policy), what
//! it skipped and why, and what it left alone on purpose.

use std::{collections::BTreeMap, fmt, sync::Arc};

use dataplane_common::{Backend, Backend6, ServiceKey, ServiceKey6};

use crate::compiler::categorize::EmptyVerdict;

/// A Service port as kube-proxy names it: `namespace/name:port`. Its names are
/// shared, not copied, by the frontends of the port, the compiler's claims and the
/// writer's mirror (at 10,000 Services, three copies of three strings for each of
/// 20,000 frontends took about 6 MB).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port: Arc<str>,
}

impl ServicePortName {
    /// Parses the `Display` form back (names read from the kernel's maps).
    pub fn parse(s: &str) -> Self {
        let (namespace, rest) = s.split_once('/').unwrap_or(("", s));
        let (name, port) = rest.split_once(':').unwrap_or((rest, ""));
        Self {
            namespace: namespace.into(),
            name: name.into(),
            port: port.into(),
        }
    }

    /// The name of a frontend found in the maps without one.
    pub fn unknown() -> Self {
        Self {
            namespace: "".into(),
            name: "?".into(),
            port: "".into(),
        }
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As kube-proxy prints it: no colon for an unnamed port.
        if self.port.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
        }
    }
}

/// One frontend to program: the Service port it belongs to and its backends, sorted
/// and without duplicates. `B` is the family's backend and `A` its address as the
/// maps hold it: [`Frontend`] is IPv4's, [`Frontend6`] IPv6's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend<B = Backend, A = u32> {
    pub service: ServicePortName,
    pub backends: Vec<B>,
    pub policy: FrontendPolicy,
    /// `loadBalancerSourceRanges` of a load-balancer IP (network address in network
    /// byte order, prefix length), sorted; empty: every source (and no check).
    pub source_ranges: Vec<(A, u8)>,
}

/// An IPv6 frontend: its backends are IPv6 endpoints only, from the Service's
/// `addressType: IPv6` slices.
pub type Frontend6 = Frontend<Backend6, [u32; 4]>;

/// A frontend's key in either family's map (`SERVICES` or `SERVICES6`). IPv4's sort
/// first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKey {
    V4(ServiceKey),
    V6(ServiceKey6),
}

impl FrontendKey {
    /// `SCOPE_ANY` or `SCOPE_EXTERNAL`.
    pub fn scope(&self) -> u8 {
        match self {
            Self::V4(k) => k.scope,
            Self::V6(k) => k.scope,
        }
    }

    /// Host-order port (0 for a ClusterIP marker).
    pub fn port(&self) -> u16 {
        match self {
            Self::V4(k) => u16::from_be(k.port_be),
            Self::V6(k) => u16::from_be(k.port_be),
        }
    }

    pub fn proto(&self) -> u8 {
        match self {
            Self::V4(k) => k.proto,
            Self::V6(k) => k.proto,
        }
    }

    /// The frontend's address.
    pub fn ip(&self) -> std::net::IpAddr {
        match self {
            Self::V4(k) => std::net::Ipv4Addr::from(u32::from_be(k.addr_be)).into(),
            Self::V6(k) => std::net::Ipv6Addr::from(dataplane_common::octets_of(k.addr_be)).into(),
        }
    }
}

impl From<ServiceKey> for FrontendKey {
    fn from(k: ServiceKey) -> Self {
        Self::V4(k)
    }
}

impl From<ServiceKey6> for FrontendKey {
    fn from(k: ServiceKey6) -> Self {
        Self::V6(k)
    }
}

/// A frontend of either family, as a Service claims it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnyFrontend {
    V4(Frontend),
    V6(Frontend6),
}

impl AnyFrontend {
    pub fn service(&self) -> &ServicePortName {
        match self {
            Self::V4(f) => &f.service,
            Self::V6(f) => &f.service,
        }
    }
}

/// What a frontend does besides picking among its backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontendPolicy {
    /// What a new flow meets when there is no backend.
    pub on_empty: EmptyVerdict,
    /// `sessionAffinity: ClientIP`: the timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// New connections only from `Frontend::source_ranges`.
    pub source_ranges: bool,
    /// The slots are a Maglev table of this size ([`crate::writer::maglev`]): set for the
    /// frontends traffic from outside reaches, when they have backends.
    pub maglev: Option<crate::writer::maglev::TableSize>,
    /// Direct server return for connections from outside the node that would be
    /// masqueraded (`SVC_F_DSR`).
    pub dsr: bool,
    /// Pods' new connections masqueraded to the node's address (`SVC_F_MASQ_PODS`):
    /// an external address of a Service with `externalTrafficPolicy: Cluster`.
    pub masq_pods: bool,
}

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds`
/// (`v1.DefaultClientIPServiceAffinitySeconds`, three hours).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;
/// The API's largest timeout (`v1.MaxClientIPServiceAffinitySeconds`, one day).
pub const MAX_AFFINITY_TIMEOUT: i32 = 86_400;

impl FrontendPolicy {
    /// The `SERVICES` value of a frontend with this policy.
    pub fn service_value(&self, id: u32, count: u32) -> dataplane_common::ServiceValue {
        let mut flags = 0;
        if self.on_empty == EmptyVerdict::Drop {
            flags |= dataplane_common::SVC_F_DROP_EMPTY;
        }
        if self.affinity_timeout.is_some() {
            flags |= dataplane_common::SVC_F_AFFINITY;
        }
        if self.source_ranges {
            flags |= dataplane_common::SVC_F_SOURCE_RANGES;
        }
        if self.maglev.is_some() {
            flags |= dataplane_common::SVC_F_MAGLEV;
        }
        if self.dsr {
            flags |= dataplane_common::SVC_F_DSR;
        }
        if self.masq_pods {
            flags |= dataplane_common::SVC_F_MASQ_PODS;
        }
        dataplane_common::ServiceValue {
            id,
            count,
            flags,
            affinity_timeout_s: self.affinity_timeout.unwrap_or(0),
        }
    }

    /// The policy a `SERVICES` value carries (read back from pinned maps).
    pub fn of(v: &dataplane_common::ServiceValue) -> Self {
        Self {
            on_empty: if v.flags & dataplane_common::SVC_F_DROP_EMPTY != 0 {
                EmptyVerdict::Drop
            } else {
                EmptyVerdict::Reject
            },
            affinity_timeout: (v.flags & dataplane_common::SVC_F_AFFINITY != 0)
                .then_some(v.affinity_timeout_s),
            source_ranges: v.flags & dataplane_common::SVC_F_SOURCE_RANGES != 0,
            maglev: (v.flags & dataplane_common::SVC_F_MAGLEV != 0 && v.count > 0)
                .then(|| crate::writer::maglev::TableSize::restored(v.count)),
            dsr: v.flags & dataplane_common::SVC_F_DSR != 0,
            masq_pods: v.flags & dataplane_common::SVC_F_MASQ_PODS != 0,
        }
    }
}

/// Which object a message is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    /// An object of `kind` by its metadata: namespace `default` when unset.
    pub(super) fn new(kind: &'static str, namespace: Option<&str>, name: Option<&str>) -> Self {
        Self {
            kind,
            namespace: namespace.unwrap_or("default").into(),
            name: name.unwrap_or_default().into(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Something the compiler could not use, and why. The rest still compiles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Skipped {
    pub object: ObjectRef,
    /// A short, stable name of the reason, for metrics.
    pub code: &'static str,
    pub reason: String,
}

/// Objects deliberately left alone (not an error): another proxy's, headless, and the
/// like. Counted so that `list` and metrics can say why a Service has no frontend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ignored {
    pub other_proxy: usize,
    pub headless: usize,
    pub external_name: usize,
    /// Addresses of a family the Service has no ClusterIP of (kube-proxy's proxier
    /// of that family leaves the Service alone): its external and load-balancer IPs
    /// of that family.
    pub other_family: usize,
}

/// kube-proxy's health check of a Service that needs one (a `LoadBalancer` with
/// `externalTrafficPolicy: Local`): a port on the node that says whether the node
/// has ready endpoints of the Service (pkg/proxy/healthcheck/service_health.go).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthCheck {
    /// `healthCheckNodePort`.
    pub port: u16,
    /// Ready IPv4 endpoints of the Service on this node, counted by address
    /// (kube-proxy's `LocalReadyEndpoints`: one Pod serving two ports is one);
    /// `None` when the Service has no IPv4 ClusterIP. kube-proxy runs one proxier
    /// per family, each with its own health server on its family's wildcard
    /// address counting its family's endpoints; so do these.
    pub local4: Option<u32>,
    /// The same for IPv6.
    pub local6: Option<u32>,
}

/// The compiler's output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compiled {
    pub frontends: BTreeMap<ServiceKey, Frontend>,
    /// IPv6 frontends (`SERVICES6`).
    pub frontends6: BTreeMap<ServiceKey6, Frontend6>,
    pub skipped: Vec<Skipped>,
    pub ignored: Ignored,
    /// Health checks by Service (namespace, name).
    pub health_checks: BTreeMap<(String, String), HealthCheck>,
}

impl Compiled {
    /// Both families' frontends, as the map writer takes them.
    pub fn desired(&self) -> crate::writer::Desired<'_> {
        crate::writer::Desired {
            v4: &self.frontends,
            v6: &self.frontends6,
        }
    }

    /// Puts a frontend in its family's map; a key and frontend of different
    /// families (never made by the compiler) are left out.
    pub(super) fn insert(&mut self, key: FrontendKey, frontend: AnyFrontend) {
        match (key, frontend) {
            (FrontendKey::V4(k), AnyFrontend::V4(f)) => {
                self.frontends.insert(k, f);
            }
            (FrontendKey::V6(k), AnyFrontend::V6(f)) => {
                self.frontends6.insert(k, f);
            }
            _ => {}
        }
    }
}

impl Ignored {
    pub(super) fn add(&mut self, o: &Ignored) {
        self.other_proxy += o.other_proxy;
        self.headless += o.headless;
        self.external_name += o.external_name;
        self.other_family += o.other_family;
    }
    pub(super) fn sub(&mut self, o: &Ignored) {
        self.other_proxy -= o.other_proxy;
        self.headless -= o.headless;
        self.external_name -= o.external_name;
        self.other_family -= o.other_family;
    }
}

/// Service ports with a `Local` traffic policy and no usable endpoint on this node
/// while other nodes have some (their traffic of that policy is dropped), by
/// family: kube-proxy's `sync_proxy_rules_no_local_endpoints_total`, counted as its
/// proxiers count `serviceNoLocalEndpointsTotalInternal`/`External`
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go>).
/// Index 0 is IPv4, 1 IPv6.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    /// `internalTrafficPolicy: Local`.
    pub internal: [usize; 2],
    /// `externalTrafficPolicy: Local` of an externally accessible Service.
    pub external: [usize; 2],
}

impl NoLocalEndpoints {
    pub(super) fn add(&mut self, o: &NoLocalEndpoints) {
        for i in 0..2 {
            self.internal[i] += o.internal[i];
            self.external[i] += o.external[i];
        }
    }
    pub(super) fn sub(&mut self, o: &NoLocalEndpoints) {
        for i in 0..2 {
            self.internal[i] -= o.internal[i];
            self.external[i] -= o.external[i];
        }
    }
}

/// A backend of either family: the writer's mirror holds both (backend ids are one
/// space; an id is in `BACKENDS` or in `BACKENDS6`, never both).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AnyBackend {
    V4(Backend),
    V6(Backend6),
}

impl From<Backend> for AnyBackend {
    fn from(b: Backend) -> Self {
        Self::V4(b)
    }
}

impl From<Backend6> for AnyBackend {
    fn from(b: Backend6) -> Self {
        Self::V6(b)
    }
}

impl AnyBackend {
    pub fn port(&self) -> u16 {
        match self {
            Self::V4(b) => u16::from_be(b.port_be),
            Self::V6(b) => u16::from_be(b.port_be),
        }
    }

    pub fn proto(&self) -> u8 {
        match self {
            Self::V4(b) => b.proto,
            Self::V6(b) => b.proto,
        }
    }

    pub fn ip(&self) -> std::net::IpAddr {
        match self {
            Self::V4(b) => std::net::Ipv4Addr::from(u32::from_be(b.addr_be)).into(),
            Self::V6(b) => std::net::Ipv6Addr::from(dataplane_common::octets_of(b.addr_be)).into(),
        }
    }
}

//! The agent loop: a source (a manifest directory, or the API server through
//! reflectors) hands the objects that changed to the incremental compiler, which
//! recompiles the Services they belong to; the writer writes the difference to the
//! maps; metrics are published. One loop for either source ([`follow`]).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    future::Future,
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use dataplane_common::{map_name, stat};
use tracing::{debug, error, info, warn};

use crate::{
    compiler::{self, Skipped},
    kernel::interfaces::{self, Selection},
    kernel::{AttachMode, Attached, Capacities, Datapath, KernelError, PinDir, XdpChoice},
    serve::metrics::{Ask, Metrics},
    source::{
        self,
        kube::{ApiSource, KubeSourceConfig},
        local::{LocalSource, ManifestDir},
        Fed,
    },
    writer::audit::AuditReport,
    writer::{ApplyReport, MapOps, MapWriter},
};

/// Where objects come from.
pub enum Source {
    /// A directory of YAML, checked every `poll`.
    Manifests { dir: PathBuf, poll: Duration },
    /// The API server; changes are batched for `batch`.
    Kubernetes {
        client: kube::Client,
        batch: Duration,
    },
}

/// Why the agent could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the datapath")]
    Load(#[source] Box<KernelError>),
    #[error("writing the conntrack timeouts")]
    CtTimeouts(#[source] Box<KernelError>),
    #[error("listing network interfaces")]
    ListInterfaces(#[source] std::io::Error),
    #[error(
        "attaching to {0}: no such interface (an exact name must exist at start; \
         a pattern such as {0}* also takes interfaces that appear later)"
    )]
    NoSuchInterface(String),
    #[error("attaching to {0}")]
    Attach(String, #[source] Box<KernelError>),
    #[error("removing stale pinned links")]
    UnpinLinks(#[source] Box<KernelError>),
    #[error("choosing how to attach")]
    ChooseAttach(#[source] Box<KernelError>),
    #[error("{0}")]
    Requirements(String),
    #[error(transparent)]
    Kubernetes(#[from] source::kube::Error),
}

impl From<std::convert::Infallible> for Error {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// Settings of `sliceway-agent run`.
pub struct Settings {
    pub source: Source,
    /// Where the TC programs go: exact names and patterns, pods' interfaces and the
    /// node's uplinks.
    pub interfaces: Selection,
    /// Source ports of masqueraded connections (`--snat-ports`).
    pub snat_ports: (u16, u16),
    /// `--masquerade-all`: pods' new connections to ClusterIPs are masqueraded.
    pub masquerade_all: bool,
    /// The pods' addresses (`--cluster-cidr` with `--detect-local-mode
    /// ClusterCIDR`): a pod interface's new connection to a ClusterIP from outside
    /// them is masqueraded. Empty: none is.
    pub local_cidrs: Vec<(std::net::IpAddr, u8)>,
    /// `--detect-local-mode NodeCIDR`: the local CIDRs are this node's pod CIDRs
    /// (its Node object's `spec.podCIDRs`), written as they change; `local_cidrs`
    /// is then empty.
    pub local_from_node: bool,
    /// How often the interfaces are listed again, for patterns (and for exact names
    /// whose interface goes away and comes back).
    pub interface_scan: Duration,
    pub compiler: compiler::Options,
    pub capacities: Capacities,
    /// Where maps and links are pinned; `None` keeps them private to this process
    /// (programs detach when it exits).
    pub pins: Option<PinDir>,
    /// tcx, a TC filter, or whichever the kernel has.
    pub attach: AttachMode,
    /// Whether, and how, the XDP program goes on the uplinks (`--xdp`).
    pub xdp: XdpChoice,
    /// Whether the XDP program forwards what it translated between the uplinks it
    /// is on (`--xdp-forward`), instead of passing it to the stack.
    pub xdp_forward: bool,
    /// The cgroup the socket programs go on, for the node's own sockets; `None`: no
    /// socket load balancing.
    pub socket_lb: Option<std::path::PathBuf>,
    /// Address for `/healthz` and `/livez`; `None` serves no health.
    pub healthz_addr: Option<SocketAddr>,
    /// Address for `/metrics` and `/audit`; `None` serves neither.
    pub metrics_addr: Option<SocketAddr>,
    /// Serve `/audit` on a metrics address that is not loopback too
    /// (`--audit-on-non-loopback`).
    pub audit_on_non_loopback: bool,
    /// Conntrack timeouts and sweeping.
    pub conntrack: crate::writer::conntrack::Settings,
    /// netfilter's conntrack, set as kube-proxy sets it (`--conntrack-max-per-core`,
    /// ...).
    pub netfilter: crate::kernel::netfilter::Conntrack,
    /// How long a change may wait for its sync, and a watch of the API server fail,
    /// before `/healthz` answers 503 (kube-proxy's rule; see [`crate::serve::health`]).
    pub health_timeout: Duration,
    /// How often the datapath's counters are read into the metrics (also at every
    /// scrape).
    pub counters_interval: Duration,
    /// How often the service maps are audited for drift; `None`: only when asked.
    pub audit_interval: Option<Duration>,
    /// Whether `/metrics` has per-backend series (one per backend of the cluster).
    pub backend_metrics: bool,
}

/// The pure part of a sync: the incremental compiler and the map writer. Objects go
/// into the compiler as the sources see them change; [`Pipeline::sync`] recompiles the
/// Services they belong to and writes the frontends that changed.
#[derive(Debug)]
pub struct Pipeline {
    pub compiler: compiler::Incremental,
    pub writer: MapWriter,
    /// `loadBalancerSourceRanges`, written around the map writer's apply.
    pub ranges: crate::writer::ranges::RangeWriter,
    /// IPv6's, in `SOURCE_RANGES6`.
    pub ranges6: crate::writer::ranges::RangeWriter<crate::writer::ranges::V6>,
    /// The ServiceCIDRs' prefixes, written after the map writer's apply.
    pub cidrs: crate::writer::cidrs::CidrWriter,
    /// Whether the writer has done one full apply.
    applied: bool,
}

/// What one [`Pipeline::sync`] did.
#[derive(Debug)]
pub struct Synced {
    pub report: ApplyReport,
    /// Frontends the compile said were added, changed or removed.
    pub changed: usize,
    /// Whether every frontend was compared (the first sync), not only the changed ones.
    pub full: bool,
}

impl Pipeline {
    pub fn new(compiler: compiler::Incremental, writer: MapWriter) -> Self {
        Self {
            compiler,
            writer,
            ranges: Default::default(),
            ranges6: Default::default(),
            cidrs: Default::default(),
            applied: false,
        }
    }

    /// Recompiles what changed and writes it. The first sync compares every frontend
    /// (a writer that adopted pinned maps brings them to the desired state and cleans
    /// what an earlier run left); later ones look only at the frontends that changed.
    pub fn sync<M>(&mut self, maps: &mut M) -> Synced
    where
        M: MapOps + crate::writer::ranges::RangeOps + crate::writer::cidrs::CidrOps,
    {
        let changed = self.compiler.compile();
        let full = !self.applied;
        // The source ranges of every frontend at the first sync, of the changed ones
        // after: new ones before the writer publishes, stale ones after.
        let (range_keys, range_keys6) = if full {
            (
                self.compiler.frontends().keys().copied().collect(),
                self.compiler.frontends6().keys().copied().collect(),
            )
        } else {
            let mut v4 = BTreeSet::new();
            let mut v6 = BTreeSet::new();
            for key in &changed {
                match key {
                    compiler::FrontendKey::V4(k) => v4.insert(*k),
                    compiler::FrontendKey::V6(k) => v6.insert(*k),
                };
            }
            (v4, v6)
        };
        let desired = self.compiler.desired();
        let mut range_errors = self.ranges.before(desired, &range_keys, maps);
        range_errors.extend(self.ranges6.before(desired, &range_keys6, maps));
        let report = if full {
            self.applied = true;
            self.writer.apply(desired, maps)
        } else {
            self.writer.apply_changed(desired, &changed, maps)
        };
        range_errors.extend(self.ranges.after(desired, &range_keys, maps));
        range_errors.extend(self.ranges6.after(desired, &range_keys6, maps));
        for e in range_errors {
            warn!("{e}; written again at that Service's next change");
        }
        // After the apply: a new Service's ClusterIP is marked before a new prefix
        // around it drops what is sent to it.
        for e in self.cidrs.sync(self.compiler.service_cidrs(), maps) {
            warn!("{e}; tried again at the next sync");
        }
        Synced {
            report,
            changed: changed.len(),
            full,
        }
    }
}

/// Per-sync state that outlives one sync.
struct Syncer {
    pipeline: Pipeline,
    reported: BTreeSet<Skipped>,
    syncs: u64,
    metrics: Arc<Metrics>,
    /// Last `last-change-trigger-time` seen per slice, for programming latency.
    triggers: HashMap<(String, String), String>,
    /// Why this kernel opens no SCTP socket, if it opens none.
    no_kernel_sctp: Option<String>,
    /// SCTP frontends already reported on such a kernel.
    sctp_reported: BTreeSet<compiler::FrontendKey>,
    /// Whether a map write of a sync failed since the maps were last known whole:
    /// the change stays queued for `/healthz` until an audit repairs the maps.
    writes_failed: bool,
    /// Whether per-backend counters are published.
    per_backend: bool,
    /// Problems first met in the last sync, for the source to record as Events.
    problems: Vec<source::events::Problem>,
    /// kube-proxy's Service health checks (`healthCheckNodePort`), kept in step with
    /// the compiler after every sync.
    health_checks: crate::serve::healthcheck::ServiceHealth,
    /// Health checks whose port could not be listened on at the last sync.
    health_check_failed: BTreeSet<((String, String), u16)>,
    /// Frontends rejected by the last sync (service, reason): a rejection is
    /// reported when it first happens, not at every retry.
    rejected: BTreeSet<(String, String)>,
    /// What the source's reader refused, by reason, as of the last feed.
    source_skipped: BTreeMap<String, i64>,
    /// The masquerade source ports (`--snat-ports`).
    snat_ports: (u16, u16),
    /// `--masquerade-all`.
    masquerade_all: bool,
    /// NodeCIDR detection: the node's pod CIDRs last written to `MASQ_SOURCES`
    /// (`None`: not written yet); without it, `None` for good.
    node_cidrs: Option<Option<crate::model::PodCidrs>>,
    /// The masquerade settings last written to the datapath.
    nat: Option<dataplane_common::NatConfig>,
    /// IPv6's, last written (`NAT_CONFIG6`).
    nat6: Option<dataplane_common::NatConfig6>,
}

impl Syncer {
    /// On a kernel without SCTP, says once per SCTP frontend that it is programmed
    /// although no pod of this node can open an SCTP socket (the datapath translates
    /// SCTP whatever the kernel; the pods cannot speak it), and counts them.
    fn report_sctp(&mut self) {
        let Some(why) = &self.no_kernel_sctp else {
            return;
        };
        let sctp: BTreeSet<compiler::FrontendKey> = self
            .pipeline
            .writer
            .programmed()
            .keys()
            .filter(|k| k.proto() == dataplane_common::PROTO_SCTP)
            .copied()
            .collect();
        for key in sctp.difference(&self.sctp_reported) {
            let service = self
                .pipeline
                .writer
                .programmed()
                .get(key)
                .map(|p| p.service.to_string())
                .unwrap_or_default();
            warn!(
                frontend = %compiler::any_frontend_addr(key),
                %service,
                "an SCTP frontend on a kernel without SCTP ({why}): it is translated, but no pod on this node can open an SCTP association"
            );
        }
        self.metrics.sctp_without_kernel_sctp.set(sctp.len() as i64);
        self.sctp_reported = sctp;
    }

    /// Opens and closes the Services' health-check servers as the compile says; a
    /// port that cannot be listened on is said (once per Service and port, as an
    /// Event too: kube-proxy's `FailedToStartServiceHealthcheck`) and tried again at
    /// the next sync.
    fn sync_health_checks(&mut self) {
        let failed = self
            .health_checks
            .sync(self.pipeline.compiler.health_checks());
        let mut now = BTreeSet::new();
        for f in failed {
            let key = (f.service.clone(), f.port);
            if !self.health_check_failed.contains(&key) {
                let message = format!(
                    "failed to start the health check of {}/{} on port {}: {}",
                    f.service.0, f.service.1, f.port, f.error
                );
                error!("{message}");
                self.problems.push(source::events::Problem {
                    kind: "Service",
                    namespace: f.service.0.clone(),
                    name: f.service.1.clone(),
                    code: "failed_to_start_service_healthcheck".into(),
                    message,
                });
            }
            now.insert(key);
        }
        self.health_check_failed = now;
        self.metrics
            .health_checks
            .set(self.health_checks.open_count() as i64);
    }

    /// Writes what the programs masquerade with when it changed (clients from
    /// outside the node, and pods as kube-proxy masquerades them): the node's
    /// primary address (its Node object), else the first address of an uplink the
    /// agent attached to; none while neither is known (such connections are then
    /// dropped and counted, `drop_no_node_addr`). IPv4 (`NAT_CONFIG`) and IPv6
    /// (`NAT_CONFIG6`) are decided apart ([`nat_writes`]).
    fn sync_nat(&mut self, dp: &mut Datapath) {
        let uplinks: Vec<String> = dp
            .attached()
            .into_iter()
            .filter(|(_, (_, role))| *role == interfaces::Role::External)
            .map(|(name, _)| name)
            .collect();
        // Pods' connections to a NodePort, an external or a load-balancer IP of a
        // `Cluster` policy are masqueraded on every node, uplinks or none: IPv4's
        // settings are always written, IPv6's wherever its maps are loaded.
        let wants6 = dp.has_ipv6_maps();
        let addr = self.pipeline.compiler.node_ip().or_else(|| {
            interfaces::ipv4_addresses_by_interface()
                .ok()?
                .into_iter()
                .find(|(name, _)| uplinks.contains(name))
                .map(|(_, a)| a)
        });
        let nat = Some(dataplane_common::NatConfig {
            node_addr_be: addr.map_or(0, |a| u32::from(a).to_be()),
            port_min: self.snat_ports.0,
            port_max: self.snat_ports.1,
        });
        let addr6 = wants6.then(|| self.node_addr6(&uplinks)).flatten();
        let nat6 = wants6.then(|| dataplane_common::NatConfig6 {
            node_addr_be: addr6.map_or([0; 4], |a| dataplane_common::addr_of(a.octets())),
            port_min: self.snat_ports.0,
            port_max: self.snat_ports.1,
        });
        let (nat, nat6) = nat_writes((self.nat, self.nat6), (nat, nat6));
        if let Some(nat) = nat {
            if self.nat.is_none() {
                warn_if_local_ports_overlap(self.snat_ports);
            }
            match dp.set_nat(nat) {
                Ok(()) => {
                    match addr {
                        Some(a) => info!(address = %a, ports = ?self.snat_ports, "masquerading to this address"),
                        // Without an uplink only pods' connections to external
                        // frontends of a `Cluster` policy need it: said, not warned.
                        None if uplinks.is_empty() => info!("no address of the node is known (no Node object with one, no uplink): pods' connections to NodePorts, external and load-balancer IPs of a Cluster policy are dropped until one is (drop_no_node_addr)"),
                        None => warn!("no address of the node is known (no Node object with one, no address on an uplink): connections that need masquerading (from outside the node, and pods' to NodePorts, external and load-balancer IPs of a Cluster policy) are dropped"),
                    }
                    self.nat = Some(nat);
                }
                Err(e) => {
                    warn!("writing the masquerade settings: {e}; trying again at the next sync")
                }
            }
        }
        if let Some(nat6) = nat6 {
            match dp.set_nat6(nat6) {
                Ok(()) => {
                    match addr6 {
                        Some(a) => info!(address = %a, ports = ?self.snat_ports, "masquerading IPv6 connections to this address"),
                        // An IPv4-only node, as most are: said once, not a problem.
                        None => info!("no IPv6 address of the node is known (no Node object with one, no global IPv6 address on an uplink): IPv6 connections that need masquerading are dropped"),
                    }
                    self.nat6 = Some(nat6);
                }
                Err(e) => {
                    warn!(
                        "writing the IPv6 masquerade settings: {e}; trying again at the next sync"
                    )
                }
            }
        }
    }

    /// With `--detect-local-mode NodeCIDR`: writes this node's pod CIDRs (its Node
    /// object's `spec.podCIDRs`, each family's first) as the local-traffic CIDRs of
    /// `MASQ_SOURCES` when they changed, as kube-proxy's `NodeCIDR` detector takes
    /// them (`getLocalDetectors`,
    /// https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server_linux.go).
    /// kube-proxy waits up to five minutes for them at start and exits when they
    /// change; here a node without them masquerades none of its pods' ClusterIP
    /// connections (kube-proxy's no-op detector) until they come, and a change is
    /// written at the next sync.
    fn sync_node_cidrs(&mut self, dp: &mut Datapath) {
        let Some(written) = &self.node_cidrs else {
            return;
        };
        let now = self.pipeline.compiler.pod_cidrs();
        if written.as_ref() == Some(now) {
            return;
        }
        for bad in &now.bad {
            warn!(cidr = %bad, "this node's spec.podCIDRs has an entry that is no CIDR; it is left out (--detect-local-mode NodeCIDR)");
        }
        let (masq, masq6) = masq_sources(self.masquerade_all, &now.cidrs);
        if let Err(e) = dp.set_masq_sources(&masq, &masq6) {
            warn!("writing this node's pod CIDRs as the local traffic (--detect-local-mode NodeCIDR): {e}; tried again at the next sync");
            return;
        }
        if now.cidrs.is_empty() {
            warn!("--detect-local-mode NodeCIDR: this node has no pod CIDRs (spec.podCIDRs of its Node) yet; pods' connections to ClusterIPs are not masqueraded until it has");
        } else {
            let cidrs: Vec<String> = now.cidrs.iter().map(|(a, l)| format!("{a}/{l}")).collect();
            info!(pod_cidrs = ?cidrs, "--detect-local-mode NodeCIDR: pods' connections to ClusterIPs from sources outside this node's pod CIDRs are masqueraded");
        }
        self.node_cidrs = Some(Some(now.clone()));
    }

    /// IPv6's masquerade source for [`sync_nat`](Self::sync_nat): the node's primary
    /// IPv6 address, else the first global IPv6 address of an uplink (a link-local
    /// one is never a masquerade source: replies from other links could not reach
    /// it).
    fn node_addr6(&self, uplinks: &[String]) -> Option<std::net::Ipv6Addr> {
        self.pipeline.compiler.node_ip6().or_else(|| {
            interfaces::ipv6_addresses_by_interface()
                .ok()?
                .into_iter()
                .filter(|(_, a)| usable_node_addr6(a))
                .find(|(name, _)| uplinks.iter().any(|u| u == name))
                .map(|(_, a)| a)
        })
    }

    /// Reads the addresses of the node's interfaces for NodePorts in CIDR mode (at
    /// every sync, and when the kernel says an address changed: cheap); whether the
    /// NodePort addresses changed.
    fn read_node_port_addrs(&mut self) -> bool {
        if let crate::compiler::NodePortAddresses::Primary =
            self.pipeline.compiler.options().node_port_addresses
        {
            return false;
        }
        let mut changed = false;
        match interfaces::ipv4_addresses() {
            Ok(addrs) => changed |= self.pipeline.compiler.set_interface_addrs(&addrs),
            Err(e) => warn!("listing the node's addresses for NodePorts: {e}"),
        }
        match interfaces::ipv6_addresses_by_interface() {
            Ok(addrs) => {
                let addrs: Vec<std::net::Ipv6Addr> = addrs.into_iter().map(|(_, a)| a).collect();
                changed |= self.pipeline.compiler.set_interface_addrs6(&addrs);
            }
            Err(e) => warn!("listing the node's IPv6 addresses for NodePorts: {e}"),
        }
        changed
    }

    fn sync(&mut self, dp: &mut Datapath) {
        let started = Instant::now();
        self.read_node_port_addrs();
        let synced = self.pipeline.sync(&mut dp.maps);
        if !synced.report.stale_udp.is_empty() {
            let pairs: BTreeSet<(u32, u32)> = synced.report.stale_udp.iter().copied().collect();
            let removed =
                crate::writer::conntrack::remove_udp_connections(dp.conntrack_map(), &pairs);
            if removed > 0 {
                debug!(
                    connections = removed,
                    "UDP connections of backends that left their Service removed"
                );
                self.metrics.stale_udp_removed.inc_by(removed as u64);
            }
        }
        self.sync_nat(dp);
        self.sync_node_cidrs(dp);
        let report = &synced.report;
        let written = SystemTime::now();
        let skipped = self.pipeline.compiler.skipped();
        // Say each problem once, not at every sync.
        let now: BTreeSet<Skipped> = skipped.iter().cloned().collect();
        for s in now.difference(&self.reported) {
            warn!(object = %s.object, "skipped: {}", s.reason);
            self.problems.push(source::events::Problem {
                kind: s.object.kind,
                namespace: s.object.namespace.clone(),
                name: s.object.name.clone(),
                code: s.code.to_string(),
                message: s.reason.clone(),
            });
        }
        self.reported = now;
        self.sync_health_checks();
        let mut rejected = BTreeSet::new();
        for (service, reason) in &report.rejected {
            warn!(%service, "kept its previous state: {reason}");
            self.metrics.rejected.inc();
            let entry = (service.to_string(), reason.to_string());
            if !self.rejected.contains(&entry) {
                self.problems.push(source::events::Problem {
                    kind: "Service",
                    namespace: service.namespace.to_string(),
                    name: service.name.to_string(),
                    code: "frontend_rejected".into(),
                    message: format!("{service} kept its previous state: {reason}"),
                });
            }
            rejected.insert(entry);
        }
        self.rejected = rejected;
        for e in &report.errors {
            warn!("map write failed (the next drift audit writes it again): {e}");
        }
        if report.errors.is_empty() && !self.writes_failed {
            self.metrics.health.updated();
        } else {
            self.writes_failed = true;
        }
        self.report_sctp();
        self.syncs += 1;
        let writer = &self.pipeline.writer;
        // Service ports, and apart from them the ClusterIPs marked for rejecting
        // their undeclared ports (both are SERVICES entries).
        let clusterips = writer
            .programmed()
            .keys()
            .filter(|k| crate::compiler::is_any_clusterip_marker(k))
            .count();
        let frontends = writer.programmed().len() - clusterips;
        self.metrics.frontends.set(frontends as i64);
        self.metrics.map_writes.inc_by(report.map_writes as u64);
        self.metrics.map_deletes.inc_by(report.map_deletes as u64);
        self.observe(&skipped, dp, written, started.elapsed());
        let report = &synced.report;
        let writer = &self.pipeline.writer;
        info!(
            sync = self.syncs,
            services = self.pipeline.compiler.service_count(),
            slices = self.pipeline.compiler.slice_count(),
            frontends,
            clusterips,
            backends = writer.backend_count(),
            changed = synced.changed,
            writes = report.map_writes,
            deletes = report.map_deletes,
            skipped = skipped.len(),
            micros = started.elapsed().as_micros() as u64,
            "synced"
        );
    }

    fn observe(&mut self, skipped: &[Skipped], dp: &Datapath, written: SystemTime, took: Duration) {
        let m = &self.metrics;
        m.sync_duration.observe(took.as_secs_f64());
        m.kubeproxy.synced(took.as_secs_f64(), written);
        m.kubeproxy.changes_synced();
        m.kubeproxy
            .no_local_endpoints(self.pipeline.compiler.no_local_endpoints());
        let mut counts: BTreeMap<(String, String), i64> = BTreeMap::new();
        for s in skipped {
            *counts
                .entry((s.object.kind.to_string(), s.code.to_string()))
                .or_default() += 1;
        }
        let ignored = self.pipeline.compiler.ignored();
        for (code, n) in [
            ("other_proxy", ignored.other_proxy),
            ("headless", ignored.headless),
            ("external_name", ignored.external_name),
            ("other_family", ignored.other_family),
        ] {
            counts.insert(("ignored".into(), code.into()), n as i64);
        }
        // Files, documents and objects the source's reader refused.
        for (code, n) in &self.source_skipped {
            counts.insert(("manifest".into(), code.clone()), *n);
        }
        m.set_skipped(&counts);
        let limits = dp.limits();
        let writer = &self.pipeline.writer;
        m.set_map(
            map_name::SERVICES,
            writer.programmed().len() as u64,
            limits.services,
        );
        m.set_map(
            map_name::BACKENDS,
            writer.backend_count() as u64,
            limits.backends,
        );
        m.set_map(map_name::SLOTS, writer.slot_count(), limits.slots);
        publish_counters(dp, m, writer, self.per_backend);
        let first = self.syncs == 1;
        let taken = self.pipeline.compiler.take_trigger_times();
        observe_programming(m, &mut self.triggers, taken, first, written);
        // Last: a reader that sees the sync counted sees everything above.
        m.syncs.inc();
    }

    fn publish_counters(&self, dp: &Datapath) {
        publish_counters(dp, &self.metrics, &self.pipeline.writer, self.per_backend);
    }

    /// Compares the service maps with what the writer wrote and repairs what differs
    /// (see [`crate::writer::audit`]). Before the first sync there is nothing to compare.
    fn audit(&mut self, dp: &mut Datapath) -> Result<AuditReport, String> {
        if self.syncs == 0 {
            return Err("not synced yet: nothing to audit".into());
        }
        let actual = dp.maps.state();
        let mut report = crate::writer::audit::audit(&self.pipeline.writer, &actual, &mut dp.maps);
        self.pipeline.ranges.audit(&mut dp.maps, &mut report);
        for d in &report.drift {
            warn!(
                map = %d.map,
                entry = %d.entry,
                kind = ?d.kind,
                service = d.service.as_deref().unwrap_or("-"),
                "drift: the kernel map differs from what the agent wrote; rewritten"
            );
        }
        for e in &report.errors {
            warn!("repairing drift failed (the next audit tries again): {e}");
        }
        let m = &self.metrics;
        m.audits.inc();
        m.drift_repaired.inc_by(report.repaired as u64);
        for (map, n) in report.per_map() {
            m.set_drift(&map, n as i64);
        }
        if report.errors.is_empty() && std::mem::take(&mut self.writes_failed) {
            m.health.updated();
        }
        Ok(report)
    }
}

/// Network programming latency, as kube-proxy reports it: for each slice whose
/// `endpoints.kubernetes.io/last-change-trigger-time` changed (`taken`, with the
/// slice's family), from that time to `written`, the map write. The first sync
/// only records what it saw (those changes happened before the agent started).
/// `triggers` holds the last time seen per slice.
fn observe_programming(
    m: &Metrics,
    triggers: &mut HashMap<(String, String), String>,
    taken: Vec<((String, String), String, &'static str)>,
    first: bool,
    written: SystemTime,
) {
    for (key, t, family) in taken {
        if triggers.get(&key) == Some(&t) {
            continue;
        }
        if !first {
            if let Ok(ts) = t.parse::<k8s_openapi::jiff::Timestamp>() {
                let at = SystemTime::from(ts);
                if let Ok(latency) = written.duration_since(at) {
                    debug!(slice = ?key, trigger = %t, millis = latency.as_millis() as u64, "programmed");
                    m.programming_latency.observe(latency.as_secs_f64());
                    m.kubeproxy.programmed(family, latency.as_secs_f64());
                }
            }
        }
        // Recorded last, so the key and time move in rather than being copied.
        triggers.insert(key, t);
    }
}

/// Reads the datapath's counters into the metrics: exits by reason, and what each
/// frontend and (unless `per_backend` is off) each backend the writer wrote has seen.
fn publish_counters(dp: &Datapath, m: &Metrics, writer: &MapWriter, per_backend: bool) {
    use crate::serve::metrics::{BackendCount, FrontendCount};
    match dp.stats() {
        Ok(stats) => {
            for (i, v) in stats.iter().enumerate() {
                m.set_datapath(stat::NAMES[i], *v);
            }
        }
        Err(e) => debug!("reading the datapath counters: {e}"),
    }
    let programmed = writer.programmed();
    let ports = || {
        programmed
            .iter()
            .filter(|(k, _)| !compiler::is_any_clusterip_marker(k))
    };
    let ids = ports().map(|(_, p)| p.id + 1).max().unwrap_or(0);
    let counts = dp.maps.frontend_counters(ids);
    // Labels are made only for the frontends and backends that need them.
    let frontends = ports().filter_map(|(key, p)| {
        Some(FrontendCount {
            identity: crate::serve::metrics::identity((key, &p.service)),
            labels: move || {
                crate::serve::metrics::frontend_labels(
                    &p.service.namespace,
                    &p.service.name,
                    &p.service.port,
                    &compiler::any_frontend_addr(key),
                )
            },
            counts: *counts.get(p.id as usize)?,
        })
    });
    let backend_counts = per_backend.then(|| {
        let ids = writer.backends().map(|(id, _)| id + 1).max().unwrap_or(0);
        dp.maps.backend_counters(ids)
    });
    let backends = backend_counts.as_ref().map(|counts| {
        writer.backends().filter_map(|(id, b)| {
            Some(BackendCount {
                identity: crate::serve::metrics::identity(b),
                labels: move || {
                    crate::serve::metrics::backend_labels(
                        &compiler::any_backend_addr(b),
                        compiler::proto_name(b.proto()),
                    )
                },
                counts: *counts.get(id as usize)?,
            })
        })
    });
    m.publish_flows(frontends, backends);
}

/// Loads the datapath (adopting pinned state) and attaches it to the selected
/// interfaces. An exact name that does not exist is an error; pinned links of
/// interfaces no longer there (or no longer selected) are removed.
fn start_datapath(
    settings: &Settings,
    finder: &mut PodFinder,
    m: &Metrics,
) -> Result<(Datapath, MapWriter), Error> {
    let mut dp = Datapath::load(&settings.capacities, settings.pins.as_ref())
        .map_err(|e| Error::Load(e.into()))?;
    dp.set_xdp_forward(settings.xdp_forward);
    dp.set_ct_timeouts(&settings.conntrack.timeouts.0)
        .map_err(|e| Error::CtTimeouts(e.into()))?;
    let cpus = crate::cmd::config::online_cpus() as u64;
    let netfilter = dp.set_netfilter_conntrack(&settings.netfilter, cpus);
    for line in &netfilter.set {
        info!("netfilter's conntrack set as kube-proxy sets it: {line}");
    }
    for line in &netfilter.left {
        warn!("netfilter's conntrack: {line}");
    }
    if !netfilter.absent.is_empty() {
        info!(settings = ?netfilter.absent, "netfilter's conntrack is not loaded: nothing of it to set");
    }
    let (masq, masq6) = masq_sources(settings.masquerade_all, &settings.local_cidrs);
    if let Err(e) = dp.set_masq_sources(&masq, &masq6) {
        // Pods' ClusterIP connections then keep their sources; everything else works.
        warn!("writing which pods' sources are masqueraded (--masquerade-all, --cluster-cidr): {e}; pods' connections to ClusterIPs keep their sources");
    } else if !masq.is_empty() || !masq6.is_empty() {
        info!(
            all = settings.masquerade_all,
            local = ?settings.local_cidrs,
            "masquerading pods' connections to ClusterIPs from sources not local"
        );
    }
    // Adopt what an earlier run left in pinned maps: the first sync then writes only
    // the difference and flushes nothing (conntrack included).
    let (writer, maps) = match &settings.pins {
        Some(pins) => {
            let state = dp.maps.state();
            info!(
                dir = %pins.dir().display(),
                frontends = state.services.len(),
                backends = state.backends.len(),
                "adopted pinned maps"
            );
            let maps = if dp.adopted_pins() { "adopted" } else { "new" };
            (
                MapWriter::restore(dp.limits(), state).with_limits6(dp.limits6()),
                maps,
            )
        }
        None => (
            MapWriter::new(dp.limits()).with_limits6(dp.limits6()),
            "none",
        ),
    };
    let path = dp
        .choose_attach(settings.attach)
        .map_err(|e| Error::ChooseAttach(e.into()))?;
    info!(path = %path.as_str(), "attach path");
    let sockets = match attach_sockets(&mut dp, settings.socket_lb.as_deref(), m) {
        "attached" if settings.capacities.socket_lb_pods => {
            info!("the socket programs translate pods' TCP connects too (--socket-lb-pods)");
            "pods"
        }
        other => other,
    };
    m.set_datapath_info(path.as_str(), maps, sockets);
    let selection = &finder.selection(&settings.interfaces);
    if !selection.is_empty() {
        let present = interfaces::list().map_err(Error::ListInterfaces)?;
        for name in selection.exact() {
            if !present.iter().any(|(_, n)| n == name) {
                return Err(Error::NoSuchInterface(name.to_string()));
            }
        }
    }
    if dp.migration_pending() {
        // The v1 program keeps translating with v1's maps until the first sync has
        // filled this layout's; then `migrate` switches the links.
        info!("attaching after the first sync, once layout v1 is migrated");
        m.set_migration(1, "pending");
        return Ok((dp, writer));
    }
    attach_selected(&mut dp, selection, settings.xdp, m)?;
    Ok((dp, writer))
}

/// Probes the kernel and the node for what these settings need, before anything is
/// loaded: a missing piece the agent cannot run without stops it with one message
/// naming every such piece; one it runs without is said as a warning with what the
/// agent does instead (the step that needs it then says so again as it happens).
fn check_requirements(settings: &Settings) -> Result<(), Error> {
    use crate::kernel::requirements::{self, Weight};
    let needs = requirements::Needs {
        pins: settings.pins.as_ref().map(|p| p.base.clone()),
        attach: settings.attach,
        xdp: settings.xdp,
        socket_lb: settings.socket_lb.clone(),
    };
    let found = requirements::probe(&needs);
    let reqs = requirements::assess(&needs, &found);
    for r in reqs.iter().filter(|r| !r.present) {
        match r.weight {
            Weight::Required => {}
            Weight::Degrades => warn!(requirement = %r.name, "missing: {}", r.detail),
            Weight::Note => info!(requirement = %r.name, "absent: {}", r.detail),
        }
    }
    if let Some(msg) = requirements::refusal(&reqs) {
        return Err(Error::Requirements(msg));
    }
    info!(kernel = %found.kernel, "kernel requirements probed: nothing the agent needs is missing");
    Ok(())
}

/// Attaches the socket programs to `cgroup` (or removes what an earlier run pinned,
/// without one). A failure leaves the node's own sockets without Services and is said
/// as an error; pods' traffic is unaffected. Returns `attached`, `off` or `failed`.
fn attach_sockets(
    dp: &mut Datapath,
    cgroup: Option<&std::path::Path>,
    m: &Metrics,
) -> &'static str {
    let Some(cgroup) = cgroup else {
        match dp.unpin_sock_links() {
            Ok(removed) => {
                for hook in removed {
                    info!(
                        hook,
                        "removed the socket link an earlier run pinned (--no-socket-lb)"
                    );
                }
            }
            Err(e) => warn!("removing pinned socket links: {e}"),
        }
        return "off";
    };
    match dp.attach_sockets(cgroup) {
        Ok(hooks) => {
            for h in hooks {
                info!(cgroup = %dp.sock_cgroup().map_or(cgroup, |c| c.as_path()).display(), hook = h.hook, how = h.how.as_str(), "socket program attached");
                m.set_socket_link(h.hook, h.how.as_str());
            }
            "attached"
        }
        Err(e) => {
            error!(
                "{e}; the node's own sockets do not reach Services (pods' traffic is \
                 translated as usual); /readyz answers 503 until an agent attaches them"
            );
            m.health.not_attached(SOCKET_PROGRAMS, &e);
            "failed"
        }
    }
}

/// Says when the masquerade ports overlap the node's own local port range
/// (`net.ipv4.ip_local_port_range`): a translated tuple could then take the port of
/// one of the node's own connections to the same backend, whose replies the uplink
/// program would translate as the masqueraded connection's.
fn warn_if_local_ports_overlap((min, max): (u16, u16)) {
    let Ok(text) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return;
    };
    let mut it = text
        .split_whitespace()
        .filter_map(|p| p.parse::<u16>().ok());
    if let (Some(lo), Some(hi)) = (it.next(), it.next()) {
        if min <= hi && lo <= max {
            warn!(
                snat_ports = %format!("{min}-{max}"),
                local_ports = %format!("{lo}-{hi}"),
                "--snat-ports overlaps net.ipv4.ip_local_port_range: choose ports outside it (or reserve them with net.ipv4.ip_local_reserved_ports)"
            );
        }
    }
}

/// Attaches to the selected interfaces that exist (an exact name that fails is an
/// error) and removes what earlier runs left elsewhere.
fn attach_selected(
    dp: &mut Datapath,
    selection: &Selection,
    xdp: XdpChoice,
    m: &Metrics,
) -> Result<(), Error> {
    if !selection.is_empty() {
        let present = interfaces::list().map_err(Error::ListInterfaces)?;
        let plan = interfaces::plan(selection, &dp.attached(), &present);
        for (iface, _, role) in &plan.attach {
            match dp.attach(iface, *role) {
                Ok(how) => {
                    attached(dp, iface, how, m);
                    attach_xdp(dp, iface, *role, xdp, m);
                }
                Err(e) if selection.exact().any(|n| n == iface) => {
                    return Err(Error::Attach(iface.clone(), e.into()));
                }
                // Matched by a pattern only: it may have gone since the listing; the
                // next scan tries again.
                Err(e) => {
                    m.health.not_attached(interface_program(iface), &e);
                    m.set_not_served(iface, Some(not_served_reason(&e)));
                    warn!(interface = %iface, "not attached: {e}");
                }
            }
        }
    }
    for iface in dp
        .unpin_other_links()
        .map_err(|e| Error::UnpinLinks(e.into()))?
    {
        info!(interface = %iface, "removed the pinned link or TC filter of an interface that is gone or not selected, or of the other attach path");
        m.forget_link(&iface);
        m.links_removed.inc();
    }
    Ok(())
}

/// After the first sync, with layout v1 pinned beside this one: moves its
/// connections and links over without a failed connection (`kernel/migrate.rs`),
/// attaches as at any start, and removes v1's pins. A failure is reported with what
/// was left: the v1 pins stay for the next start to try again.
fn migrate(dp: &mut Datapath, selection: &Selection, xdp: XdpChoice, m: &Metrics) {
    let started = std::time::Instant::now();
    let migrated = match dp.migrate_from_v1() {
        Ok(m) => {
            info!(
                copied = m.before_switch.copied + m.after_switch.copied,
                links = m.links.len(),
                "layout v1 migrated: connections copied, links switched in place"
            );
            true
        }
        Err(e) => {
            error!(
                "migrating layout v1 failed: {e}; attaching anyway (v1 links not yet \
                 switched keep the v1 program), the v1 pins stay for the next start"
            );
            false
        }
    };
    if let Err(e) = attach_selected(dp, selection, xdp, m) {
        error!("attaching after the v1 migration: {e:#}; the v1 pins stay for the next start");
        dp.keep_v1();
        m.set_migration(1, "failed");
        return;
    }
    if !migrated {
        dp.keep_v1();
        m.set_migration(1, "failed");
        return;
    }
    match dp.finish_migration() {
        Ok(()) => {
            info!(
                took_ms = started.elapsed().as_millis() as u64,
                "layout v1 migration complete"
            );
            m.set_migration(1, "complete");
        }
        Err(e) => {
            error!("{e}; the links run this agent's program, only the pins are left");
            m.set_migration(1, "failed");
        }
    }
}

/// Why an interface is not served, as `sliceway_interface_not_served` says it.
fn not_served_reason(e: &KernelError) -> &'static str {
    match e {
        KernelError::NotEthernet { .. } => "not_ethernet",
        _ => "attach_failed",
    }
}

/// `--interfaces auto`: finds the pod interfaces at each look (`kernel/pod_links.rs`)
/// and says what it found, and what looked like a pod's but was passed over, once
/// per change.
pub struct PodFinder {
    /// `--cluster-cidr`: host routes count only within it, when given.
    cluster: Vec<(std::net::IpAddr, u8)>,
    pods: BTreeMap<String, crate::kernel::pod_links::Found>,
    passed: BTreeMap<String, crate::kernel::pod_links::Passed>,
}

impl PodFinder {
    pub fn new(cluster: Vec<(std::net::IpAddr, u8)>) -> Self {
        Self {
            cluster,
            pods: BTreeMap::new(),
            passed: BTreeMap::new(),
        }
    }

    /// `given` with the pod interfaces found now, when it says `auto`; a failed look
    /// keeps what the last one found.
    fn selection(&mut self, given: &Selection) -> Selection {
        use crate::kernel::pod_links::{self, Found, Passed};
        if !given.is_auto() {
            return given.clone();
        }
        let found = match pod_links::dump() {
            Ok((links, routes)) => {
                pod_links::find(&links, &routes, &self.cluster, |n| given.is_external(n))
            }
            Err(e) => {
                warn!("--interfaces auto: reading the interfaces and routes failed ({e}); keeping the pod interfaces found before");
                return given.with_found(self.pods.keys().cloned());
            }
        };
        for (name, how) in &found.pods {
            if self.pods.get(name) != Some(how) {
                let how = match how {
                    Found::Veth => "a veth whose peer is in another network namespace",
                    Found::HostRoute => "the node routes a pod's address to it",
                };
                info!(interface = %name, "pod interface found (--interfaces auto): {how}");
            }
        }
        for (name, why) in &found.passed {
            if self.passed.get(name) != Some(why) {
                let why = match why {
                    Passed::Uplink => "--external-interfaces names it an uplink",
                    Passed::DefaultRoute => {
                        "it carries a default route, so it is taken for an uplink (name it in --external-interfaces for the uplink program)"
                    }
                    Passed::Bridge => "a bridge: its ports are the pods' interfaces",
                };
                info!(interface = %name, "not a pod interface (--interfaces auto): {why}");
            }
        }
        self.pods = found.pods;
        self.passed = found.passed;
        given.with_found(self.pods.keys().cloned())
    }
}

/// What `/readyz` names while the TC program is not attached to `iface`.
fn interface_program(iface: &str) -> String {
    format!("the TC program on interface {iface}")
}

/// What `/readyz` names while the socket programs are not attached.
const SOCKET_PROGRAMS: &str = "the socket programs";

/// Says that `iface` was attached, `how`: in the log and in the metrics.
fn attached(dp: &Datapath, iface: &str, how: Attached, m: &Metrics) {
    m.set_link(
        iface,
        how.as_str(),
        dp.program_on(iface).unwrap_or("unknown"),
    );
    m.health.attached(&interface_program(iface));
    if let Err(e) = dp.accept_local(iface) {
        warn!(interface = %iface, "cannot set accept_local ({e}): replies of this interface's pods' connections to a NodePort on the node's own address are dropped as martians");
    }
    match how {
        Attached::NewPinned => info!(interface = %iface, "attached (pinned link)"),
        Attached::Replaced => info!(interface = %iface, "took over the pinned link"),
        Attached::NewFilter => {
            info!(interface = %iface, "attached (TC filter, kept across restarts)")
        }
        Attached::ReplacedFilter => {
            info!(interface = %iface, "replaced the program of the TC filter")
        }
        Attached::Unpinned => info!(interface = %iface, "attached (until the agent exits)"),
    }
}

/// Puts the XDP program on an uplink just attached, as `--xdp` says. A refusal is
/// logged and counted in the metrics; the uplink keeps its TC program, which decides
/// every packet XDP would have.
fn attach_xdp(dp: &mut Datapath, iface: &str, role: interfaces::Role, xdp: XdpChoice, m: &Metrics) {
    if role != interfaces::Role::External {
        return;
    }
    match dp.attach_xdp(iface, xdp) {
        Ok(Some(how)) => {
            m.set_xdp(iface, Some(how.as_str()));
            info!(interface = %iface, mode = how.as_str(), "XDP fast path attached");
        }
        Ok(None) => {}
        Err(e) => {
            m.set_xdp(iface, None);
            warn!("{e}");
        }
    }
}

/// What the agent does between syncs: follows the interfaces of the namespace
/// (attaches to new ones that match, drops the links of those that went away), sweeps
/// conntrack, reads the datapath's counters, audits the maps for drift, and answers
/// what the HTTP endpoint asks.
struct Scanner {
    /// The selection as given; with `auto`, completed at each look by `finder`.
    selection: Selection,
    finder: PodFinder,
    /// `--xdp`, for uplinks that appear.
    xdp: XdpChoice,
    tick: Option<tokio::time::Interval>,
    /// The kernel's link notifications, so a new interface is attached at once (the
    /// scan timer stays, for anything missed).
    links: Option<interfaces::LinkEvents>,
    /// Attach failures already reported, per interface incarnation (name, ifindex):
    /// retried at every scan, reported once.
    failed: BTreeSet<(String, u32)>,
    metrics: Arc<Metrics>,
    /// The conntrack sweeper, run between the same waits.
    sweep: crate::writer::conntrack::SweepTask,
    counters: tokio::time::Interval,
    audit: Option<tokio::time::Interval>,
    asks: tokio::sync::mpsc::Receiver<Ask>,
}

/// A timer that does not catch up on missed ticks and waits one period first.
fn every(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

impl Scanner {
    fn new(settings: &Settings, finder: PodFinder, metrics: Arc<Metrics>) -> Self {
        let tick = (!settings.interfaces.is_empty()).then(|| {
            let mut tick = tokio::time::interval(settings.interface_scan);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        });
        // A handful of asks may wait; more are answered "busy" by the endpoint.
        let (ask, asks) = tokio::sync::mpsc::channel(16);
        metrics.answer_asks(ask);
        let links = match settings.interfaces.is_empty() {
            true => None,
            // `auto` also follows routes: a CNI may route a pod's address to its
            // interface after making it.
            false => interfaces::LinkEvents::open(settings.interfaces.is_auto())
                .inspect_err(|e| {
                    warn!("no link notifications ({e}); new interfaces are found by the scan")
                })
                .ok(),
        };
        Self {
            selection: settings.interfaces.clone(),
            finder,
            xdp: settings.xdp,
            tick,
            links,
            failed: BTreeSet::new(),
            metrics,
            sweep: crate::writer::conntrack::SweepTask::new(&settings.conntrack),
            counters: every(settings.counters_interval),
            audit: settings.audit_interval.map(every),
            asks,
        }
    }

    /// Resolves when the kernel says a link changed; never without notifications. A
    /// failing subscription is dropped with a warning (the scan timer goes on).
    async fn link_changed(links: &mut Option<interfaces::LinkEvents>) {
        let Some(events) = links else {
            return std::future::pending().await;
        };
        if let Err(e) = events.changed().await {
            warn!("link notifications failed ({e}); new interfaces are found by the scan");
            *links = None;
        }
    }

    /// Resolves at the next tick of `tick`; never without one.
    async fn due(tick: &mut Option<tokio::time::Interval>) {
        match tick {
            Some(tick) => {
                tick.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    fn answer(&mut self, ask: Ask, dp: &mut Datapath, syncer: &mut Syncer) {
        match ask {
            Ask::Refresh(done) => {
                syncer.publish_counters(dp);
                let _ = done.send(());
            }
            Ask::Audit(done) => {
                let _ = done.send(syncer.audit(dp));
            }
        }
    }

    fn rescan(&mut self, dp: &mut Datapath) {
        if dp.migration_pending() {
            // Links wait for the v1 migration after the first sync.
            return;
        }
        let present = match interfaces::list() {
            Ok(present) => present,
            Err(e) => {
                warn!("cannot list network interfaces: {e}; keeping the current links");
                return;
            }
        };
        let selection = self.finder.selection(&self.selection);
        let plan = interfaces::plan(&selection, &dp.attached(), &present);
        for iface in &plan.detach {
            match dp.detach(iface) {
                Ok(_) => {
                    info!(interface = %iface, "interface gone or re-created: dropped its link");
                    self.metrics.forget_link(iface);
                    self.metrics.links_removed.inc();
                }
                Err(e) => warn!(interface = %iface, "dropping the link: {e}"),
            }
        }
        for (iface, index, role) in &plan.attach {
            match dp.attach(iface, *role) {
                Ok(how) => {
                    attached(dp, iface, how, &self.metrics);
                    attach_xdp(dp, iface, *role, self.xdp, &self.metrics);
                    self.failed.remove(&(iface.clone(), *index));
                    self.metrics.set_not_served(iface, None);
                }
                Err(e) => {
                    self.metrics
                        .health
                        .not_attached(interface_program(iface), &e);
                    self.metrics
                        .set_not_served(iface, Some(not_served_reason(&e)));
                    if self.failed.insert((iface.clone(), *index)) {
                        warn!(interface = %iface, "not attached (retrying at every scan): {e}");
                    }
                }
            }
        }
        let (metrics, health) = (&self.metrics, &self.metrics.health);
        self.failed.retain(|(name, index)| {
            let here = present.iter().any(|(i, n)| n == name && i == index);
            // Gone, or no longer selected (`auto` finds it no more): no longer a
            // program the agent needs.
            let wanted = here && selection.matches(name);
            if !wanted {
                health.attached(&interface_program(name));
                metrics.set_not_served(name, None);
            }
            wanted
        });
        self.metrics.interfaces.set(dp.attached().len() as i64);
    }

    /// A link or address changed, or the scan is due: interfaces attached and
    /// detached; with `addresses`, an address that came or went moves NodePorts at
    /// once, not at the next change of a Service (after the first sync only: nothing
    /// is written before every source has synced once).
    fn look_again(&mut self, dp: &mut Datapath, syncer: &mut Syncer, addresses: bool) {
        self.rescan(dp);
        if addresses && syncer.syncs > 0 && syncer.read_node_port_addrs() {
            syncer.sync(dp);
        }
    }

    /// Waits for `fut`, doing the work between syncs meanwhile. `None` if `shutdown`
    /// came first.
    async fn during<F: Future>(
        &mut self,
        fut: F,
        dp: &mut Datapath,
        syncer: &mut Syncer,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> Option<F::Output> {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                out = &mut fut => return Some(out),
                // Addresses are re-read at a scan only without notifications.
                _ = Self::due(&mut self.tick) => {
                    let addresses = self.links.is_none();
                    self.look_again(dp, syncer, addresses)
                }
                _ = Self::link_changed(&mut self.links) => self.look_again(dp, syncer, true),
                _ = self.sweep.due() => self.sweep.run(dp, &self.metrics),
                _ = self.counters.tick() => syncer.publish_counters(dp),
                _ = Self::due(&mut self.audit) => {
                    let _ = syncer.audit(dp);
                }
                Some(ask) = self.asks.recv() => self.answer(ask, dp, syncer),
                _ = &mut *shutdown => return None,
            }
        }
    }
}

/// Runs until `shutdown` resolves.
pub async fn run(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    // Before anything is served, loaded or attached.
    check_requirements(&settings)?;
    let metrics = Arc::new(Metrics::new(settings.health_timeout));
    if let Some(addr) = settings.healthz_addr {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::serve::metrics::serve_health(addr, m).await {
                warn!(%addr, "health server stopped: {e}");
            }
        });
    }
    if let Some(addr) = settings.metrics_addr {
        let m = metrics.clone();
        let audit = settings.audit_on_non_loopback;
        tokio::spawn(async move {
            if let Err(e) = crate::serve::metrics::serve_metrics(addr, m, audit).await {
                warn!(%addr, "metrics server stopped: {e}");
            }
        });
    }
    // Signs of kube-proxy, looked for at start and every minute; said, never fatal.
    let kube_proxy = tokio::spawn(crate::kube_proxy::watch(metrics.clone()));
    let _stop_looking = AbortOnDrop(kube_proxy);
    let mut finder = PodFinder::new(settings.local_cidrs.clone());
    let (mut dp, writer) = start_datapath(&settings, &mut finder, &metrics)?;
    metrics.interfaces.set(dp.attached().len() as i64);
    let mut scanner = Scanner::new(&settings, finder, metrics.clone());
    let health_checks = crate::serve::healthcheck::ServiceHealth::new(metrics.clone());
    let mut syncer = Syncer {
        pipeline: Pipeline::new(
            compiler::Incremental::new(settings.compiler.clone()),
            writer,
        ),
        reported: BTreeSet::new(),
        syncs: 0,
        metrics,
        triggers: HashMap::new(),
        no_kernel_sctp: crate::kernel::probe_sctp().err().map(|e| e.to_string()),
        sctp_reported: BTreeSet::new(),
        writes_failed: false,
        per_backend: settings.backend_metrics,
        problems: Vec::new(),
        health_checks,
        health_check_failed: BTreeSet::new(),
        rejected: BTreeSet::new(),
        source_skipped: BTreeMap::new(),
        snat_ports: settings.snat_ports,
        masquerade_all: settings.masquerade_all,
        node_cidrs: settings.local_from_node.then_some(None),
        nat: None,
        nat6: None,
    };
    tokio::pin!(shutdown);
    match &settings.source {
        Source::Manifests { dir, poll } => {
            let dir = ManifestDir::new(dir, settings.compiler.node_name.clone());
            let source = LocalSource::new(dir, *poll);
            follow(source, &mut syncer, &mut scanner, &mut dp, &mut shutdown).await?;
        }
        Source::Kubernetes { client, batch } => {
            let cfg = KubeSourceConfig {
                node_name: settings.compiler.node_name.clone(),
                proxy_name: settings.compiler.proxy_name.clone(),
            };
            let source = ApiSource::start(client.clone(), &cfg, *batch)?;
            syncer.metrics.health.follow(source.watches());
            follow(source, &mut syncer, &mut scanner, &mut dp, &mut shutdown).await?;
        }
    }
    info!("shutting down; pinned programs and maps stay for the next agent");
    Ok(())
}

/// Aborts a task when dropped: the look for kube-proxy ends with [`run`].
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The agent loop, the same for either source: wait for the source (following the
/// interfaces and sweeping conntrack meanwhile), let it hand what changed to the
/// compiler, sync. Returns when `shutdown` resolves.
async fn follow<S: source::Source>(
    mut source: S,
    syncer: &mut Syncer,
    scanner: &mut Scanner,
    dp: &mut Datapath,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<(), S::Error> {
    loop {
        // The wait lives across scans: it is not cancel-safe.
        match scanner.during(source.wait(), dp, syncer, shutdown).await {
            Some(r) => r?,
            None => return Ok(()),
        }
        // Something may have changed: it counts as queued until a sync writes it.
        syncer.metrics.health.queued();
        let fed = source.feed(&mut syncer.pipeline.compiler);
        let changes = syncer.pipeline.compiler.take_changes();
        syncer
            .metrics
            .kubeproxy
            .changes_seen(changes.services, changes.endpoints);
        syncer
            .metrics
            .health
            .set_node_eligible(source.node_eligible());
        match fed {
            Fed::Failed => {}
            // The first sync writes even an empty state, and says the agent is ready.
            Fed::Unchanged if syncer.syncs > 0 => {
                if !syncer.writes_failed {
                    syncer.metrics.health.updated();
                }
            }
            Fed::Changed | Fed::Unchanged => {
                syncer.source_skipped = source.skipped_by_reason();
                syncer.sync(dp);
                source.report(&std::mem::take(&mut syncer.problems));
                if dp.migration_pending() {
                    let selection = scanner.finder.selection(&scanner.selection);
                    migrate(dp, &selection, scanner.xdp, &scanner.metrics);
                    scanner.metrics.interfaces.set(dp.attached().len() as i64);
                }
            }
        }
    }
}

/// Whether an IPv6 address of an interface may be the masquerade source: global
/// unicast (not loopback, link-local, multicast or unspecified).
fn usable_node_addr6(a: &std::net::Ipv6Addr) -> bool {
    !(a.is_loopback()
        || a.is_unspecified()
        || a.is_multicast()
        || a.segments()[0] & 0xffc0 == 0xfe80)
}

/// One `MASQ_SOURCES` entry: prefix length, IPv4 address (network byte order), value.
pub type MasqSource = (u32, u32, u8);
/// One `MASQ_SOURCES6` entry.
pub type MasqSource6 = (u32, [u32; 4], u8);

/// The entries of `MASQ_SOURCES` and `MASQ_SOURCES6` (prefix length, address in
/// network byte order, 1 masquerade or 0 keep): with `all` (`--masquerade-all`),
/// every source of both families; else with `local` CIDRs (ClusterCIDR detection),
/// every source of a family that has one, except those within it, as kube-proxy's
/// detector of that family; a family without one masquerades nothing (kube-proxy's
/// no-op detector).
pub fn masq_sources(
    all: bool,
    local: &[(std::net::IpAddr, u8)],
) -> (Vec<MasqSource>, Vec<MasqSource6>) {
    use std::net::IpAddr;
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    if all {
        return (vec![(0, 0, 1)], vec![(0, [0; 4], 1)]);
    }
    for (net, len) in local {
        match net {
            IpAddr::V4(a) => {
                v4.push((0, 0, 1));
                v4.push((u32::from(*len), u32::from(*a).to_be(), 0));
            }
            IpAddr::V6(a) => {
                v6.push((0, [0; 4], 1));
                v6.push((u32::from(*len), dataplane_common::addr_of(a.octets()), 0));
            }
        }
    }
    (v4, v6)
}

/// The masquerade settings [`Syncer::sync_nat`] writes, IPv4's and IPv6's: what is
/// wanted where it differs from what was last written (`None` wanted: that family
/// has nothing to write now). Each family is decided on its own: IPv4's settings
/// being unchanged says nothing of IPv6's (issue 46: an IPv6 node address that
/// appeared after the IPv4 one never reached `NAT_CONFIG6`).
fn nat_writes<A: PartialEq, B: PartialEq>(
    written: (Option<A>, Option<B>),
    wanted: (Option<A>, Option<B>),
) -> (Option<A>, Option<B>) {
    let (written, written6) = written;
    let (wanted, wanted6) = wanted;
    (
        wanted.filter(|n| written.as_ref() != Some(n)),
        wanted6.filter(|n| written6.as_ref() != Some(n)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use dataplane_common::{NatConfig, NatConfig6};

    /// Issue 46: `--masquerade-all` masquerades every source of both families; a
    /// cluster CIDR masquerades its family's sources outside it only; neither, none.
    #[test]
    fn masq_sources_follow_kube_proxys_detectors() {
        assert_eq!(
            masq_sources(true, &[("10.244.0.0".parse().unwrap(), 16)]),
            (vec![(0, 0, 1)], vec![(0, [0; 4], 1)])
        );
        let v6: std::net::Ipv6Addr = "fd00:244::".parse().unwrap();
        let (v4s, v6s) = masq_sources(
            false,
            &[
                ("10.244.0.0".parse().unwrap(), 16),
                (std::net::IpAddr::V6(v6), 56),
            ],
        );
        let net = u32::from(std::net::Ipv4Addr::new(10, 244, 0, 0)).to_be();
        assert_eq!(v4s, [(0, 0, 1), (16, net, 0)]);
        assert_eq!(
            v6s,
            [
                (0, [0; 4], 1),
                (56, dataplane_common::addr_of(v6.octets()), 0)
            ]
        );
        let (v4s, v6s) = masq_sources(false, &[(std::net::IpAddr::V6(v6), 56)]);
        assert!(v4s.is_empty() && v6s.len() == 2);
        assert_eq!(masq_sources(false, &[]), (vec![], vec![]));
    }

    fn nat(addr: [u8; 4]) -> NatConfig {
        NatConfig {
            node_addr_be: u32::from(std::net::Ipv4Addr::from(addr)).to_be(),
            port_min: 61_000,
            port_max: 65_535,
        }
    }

    fn nat6(addr: &str) -> NatConfig6 {
        let a: std::net::Ipv6Addr = addr.parse().unwrap();
        NatConfig6 {
            node_addr_be: dataplane_common::addr_of(a.octets()),
            port_min: 61_000,
            port_max: 65_535,
        }
    }

    /// Issue 46: the IPv4 settings unchanged, the node's IPv6 address that appeared
    /// since must still be written to `NAT_CONFIG6`.
    #[test]
    fn an_ipv6_node_address_is_written_while_ipv4_s_settings_are_unchanged() {
        let v4 = nat([192, 0, 2, 10]);
        let unknown6 = nat6("::");
        let known6 = nat6("2001:db8::10");
        assert_eq!(
            nat_writes((Some(v4), Some(unknown6)), (Some(v4), Some(known6))),
            (None, Some(known6))
        );
    }

    /// Issue 46: no IPv4 settings to write at all (no uplink yet, none written),
    /// IPv6's are still decided on their own.
    #[test]
    fn ipv6_settings_are_written_when_ipv4_has_none_to_write() {
        let known6 = nat6("2001:db8::10");
        assert_eq!(
            nat_writes::<NatConfig, _>((None, None), (None, Some(known6))),
            (None, Some(known6))
        );
    }

    #[test]
    fn each_family_is_written_once_and_again_only_when_it_changes() {
        let (a, b) = (nat([192, 0, 2, 10]), nat([192, 0, 2, 11]));
        let (a6, b6) = (nat6("2001:db8::10"), nat6("2001:db8::11"));
        assert_eq!(
            nat_writes((None, None), (Some(a), Some(a6))),
            (Some(a), Some(a6))
        );
        assert_eq!(
            nat_writes((Some(a), Some(a6)), (Some(a), Some(a6))),
            (None, None)
        );
        assert_eq!(
            nat_writes((Some(a), Some(a6)), (Some(b), Some(a6))),
            (Some(b), None)
        );
        assert_eq!(
            nat_writes((Some(a), Some(a6)), (Some(a), Some(b6))),
            (None, Some(b6))
        );
        // No IPv6 maps: nothing of IPv6 is wanted, so nothing is written.
        assert_eq!(
            nat_writes::<_, NatConfig6>((Some(a), None), (Some(b), None)),
            (Some(b), None)
        );
    }

    /// kube-proxy's network programming duration comes from an EndpointSlice's
    /// `endpoints.kubernetes.io/last-change-trigger-time`: nothing at the first
    /// sync (the change is older than the agent), nothing for a slice changed again
    /// under a time seen before, and from a new time to the write, under the
    /// slice's family.
    #[test]
    fn programming_duration_is_observed_from_the_trigger_annotation() {
        use crate::compiler::Incremental;
        use crate::source::local::parse_file_model;
        let slice = |at: &str, addr: &str| {
            format!(
                r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-6
  namespace: default
  labels: {{kubernetes.io/service-name: web}}
  annotations: {{endpoints.kubernetes.io/last-change-trigger-time: "{at}"}}
addressType: IPv6
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: [{{addresses: ["{addr}"]}}]
"#
            )
        };
        let put = |c: &mut Incremental, at: &str, addr: &str| {
            let (objects, problems) =
                parse_file_model(std::path::Path::new("a.yaml"), &slice(at, addr));
            assert!(problems.is_empty(), "{problems:?}");
            let s = objects.unwrap().slices.remove(0);
            assert!(c.put_slice(crate::model::Origin::default(), s));
            c.take_trigger_times()
        };
        let name = "kubeproxy_network_programming_duration_seconds";
        let count = |m: &Metrics| {
            let text = m.render();
            let line = format!("{name}_count{{ip_family=\"IPv6\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(line.as_str()).map(str::to_owned))
        };
        let m = Metrics::default();
        let mut triggers = HashMap::new();
        let mut c = Incremental::new(crate::compiler::Options::default());
        let t0 = "2026-01-01T00:00:00Z";
        let at = |secs: u64| {
            SystemTime::from(t0.parse::<k8s_openapi::jiff::Timestamp>().unwrap())
                + Duration::from_secs(secs)
        };
        observe_programming(&m, &mut triggers, put(&mut c, t0, "fd00::1"), true, at(1));
        assert_eq!(count(&m), None);
        observe_programming(&m, &mut triggers, put(&mut c, t0, "fd00::2"), false, at(2));
        assert_eq!(count(&m), None);
        let t1 = "2026-01-01T00:00:10Z";
        observe_programming(&m, &mut triggers, put(&mut c, t1, "fd00::3"), false, at(13));
        assert_eq!(count(&m).as_deref(), Some("1"));
        let text = m.render();
        assert!(
            text.contains(&format!("{name}_sum{{ip_family=\"IPv6\"}} 3.0\n")),
            "{text}"
        );
        assert!(text.contains(&format!(
            "{name}_bucket{{le=\"2.0\",ip_family=\"IPv6\"}} 0\n{name}_bucket{{le=\"3.0\",ip_family=\"IPv6\"}} 1\n"
        )));
    }
}

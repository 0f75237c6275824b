//! Prometheus metrics and health, served as kube-proxy serves them on two listeners:
//! `/healthz` and `/livez` on the health address (`0.0.0.0:10256` by default), and
//! `/metrics` on the metrics address (`127.0.0.1:10249`) with `/audit`, which asks
//! the agent loop for a drift audit (`sliceway-agent audit`) and is served only on
//! loopback unless told otherwise ([`audit_refusal`]).
//!
//! Values that live in the kernel (the datapath's counters) are read by the agent
//! loop on a timer and again when `/metrics` is scraped: the endpoint asks the loop
//! ([`Ask::Refresh`]) and serves the last values if the loop does not answer in time.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::SocketAddr,
    sync::{atomic::AtomicU64, Arc, Mutex, OnceLock, PoisonError},
    time::Instant,
};

use tokio::sync::{mpsc, oneshot};

use crate::{serve::health::Health, writer::audit::AuditReport};

use prometheus_client::{
    encoding::text::{encode_eof, encode_registry},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};

/// A series' labels, in order.
pub type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The labels of a frontend's counters.
pub fn frontend_labels(namespace: &str, service: &str, port: &str, frontend: &str) -> Labels {
    labels(&[
        ("namespace", namespace),
        ("service", service),
        ("port", port),
        ("frontend", frontend),
    ])
}

/// The labels of a backend's counters.
pub fn backend_labels(backend: &str, protocol: &str) -> Labels {
    labels(&[("backend", backend), ("protocol", protocol)])
}

fn link_labels(iface: &str, how: &str, program: &str) -> Labels {
    vec![
        ("interface".into(), iface.into()),
        ("how".into(), how.into()),
        ("program".into(), program.into()),
    ]
}

fn migration_labels(from: u32, state: &str) -> Labels {
    vec![
        ("from".into(), from.to_string()),
        ("state".into(), state.into()),
    ]
}

/// Warnings and errors logged, by level: one counter for the process, shared by
/// every registry (the log is the process's, too). Fed by [`LogCounter`].
static LOG_MESSAGES: std::sync::LazyLock<Family<Labels, Counter>> =
    std::sync::LazyLock::new(Family::default);

/// A tracing layer that counts the warnings and errors logged, so an operator (and a
/// test) sees from `/metrics` that something went wrong without reading the log.
pub struct LogCounter;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogCounter {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let level = match *event.metadata().level() {
            tracing::Level::WARN => "warn",
            tracing::Level::ERROR => "error",
            _ => return,
        };
        LOG_MESSAGES
            .get_or_create(&labels(&[("level", level)]))
            .inc();
    }
}

/// The agent's metrics.
pub struct Metrics {
    registry: Registry,
    pub syncs: Counter,
    pub sync_duration: Histogram,
    pub frontends: Gauge,
    pub map_writes: Counter,
    pub map_deletes: Counter,
    pub skipped: Family<Labels, Gauge>,
    pub map_entries: Family<Labels, Gauge>,
    pub map_capacity: Family<Labels, Gauge>,
    pub datapath_packets: Family<Labels, Gauge>,
    pub programming_latency: Histogram,
    pub rejected: Counter,
    pub interfaces: Gauge,
    pub sctp_without_kernel_sctp: Gauge,
    pub drift_entries: Family<Labels, Gauge>,
    pub drift_repaired: Counter,
    /// UDP connections removed because their backend left their Service.
    pub stale_udp_removed: Counter,
    pub audits: Counter,
    /// How the datapath runs: attach path and whether pinned maps were adopted.
    pub datapath_info: Family<Labels, Gauge>,
    /// One series per interface the program is attached to, with how.
    pub links: Family<Labels, Gauge>,
    /// One series per socket program attached (node's own sockets), with how.
    pub socket_links: Family<Labels, Gauge>,
    /// Services' health-check servers open (`healthCheckNodePort`).
    pub health_checks: Gauge,
    /// Links and TC filters removed (interface gone, not selected, other path).
    pub links_removed: Counter,
    /// Selected interfaces the TC program could not be attached to, with why.
    pub not_served: Family<Labels, Gauge>,
    /// A migration from an older pinned layout, by state.
    pub migration: Family<Labels, Gauge>,
    /// Signs of kube-proxy on the node (value 1 when seen), by what was found.
    pub kube_proxy_detected: Family<Labels, Gauge>,
    /// Per-frontend and per-backend counters, from the kernel.
    pub flows: Mutex<FlowCounters>,
    /// kube-proxy's names for the figures both have.
    pub kubeproxy: KubeProxyMetrics,
    /// What `/healthz` and `/livez` say.
    pub health: Health,
    /// The agent loop, for what the endpoint asks of it.
    asks: OnceLock<mpsc::Sender<Ask>>,
}

/// What the HTTP endpoint asks of the agent loop.
#[derive(Debug)]
pub enum Ask {
    /// Read the kernel's counters into the metrics now.
    Refresh(oneshot::Sender<()>),
    /// Audit the maps for drift now and repair it.
    Audit(oneshot::Sender<Result<AuditReport, String>>),
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(crate::serve::health::DEFAULT_TIMEOUT)
    }
}

impl Metrics {
    /// Metrics, with health judged against `health_timeout`.
    pub fn new(health_timeout: std::time::Duration) -> Self {
        let mut registry = Registry::with_prefix("sliceway");
        let syncs = Counter::default();
        registry.register(
            "syncs",
            "Syncs of the maps with the desired state",
            syncs.clone(),
        );
        let sync_duration = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        registry.register(
            "sync_duration_seconds",
            "Time to compile and write one sync",
            sync_duration.clone(),
        );
        let frontends = Gauge::default();
        registry.register(
            "frontends",
            "Service frontends (address, port and protocol) programmed by the last sync",
            frontends.clone(),
        );
        let map_writes = Counter::default();
        registry.register(
            "map_writes",
            "BPF map entries written (added or changed) by syncs",
            map_writes.clone(),
        );
        let map_deletes = Counter::default();
        registry.register(
            "map_deletes",
            "BPF map entries deleted by syncs",
            map_deletes.clone(),
        );
        let skipped = Family::<Labels, Gauge>::default();
        registry.register(
            "objects_skipped",
            "Objects (or parts) the last sync could not use, by kind and reason",
            skipped.clone(),
        );
        let map_entries = Family::<Labels, Gauge>::default();
        registry.register(
            "map_entries",
            "Entries in each BPF map, as the writer knows them",
            map_entries.clone(),
        );
        let map_capacity = Family::<Labels, Gauge>::default();
        registry.register(
            "map_capacity",
            "Capacity of each BPF map",
            map_capacity.clone(),
        );
        let datapath_packets = Family::<Labels, Gauge>::default();
        registry.register(
            "datapath_packets",
            "Packets seen by the datapath, by verdict and reason (summed over CPUs)",
            datapath_packets.clone(),
        );
        // kube-proxy's network_programming_duration_seconds: from the EndpointSlice's
        // endpoints.kubernetes.io/last-change-trigger-time to the map write.
        let programming_latency = Histogram::new(exponential_buckets(0.001, 2.0, 20));
        registry.register(
            "network_programming_duration_seconds",
            "From an endpoint change (last-change-trigger-time) to the map write",
            programming_latency.clone(),
        );
        let rejected = Counter::default();
        registry.register(
            "frontends_rejected",
            "Frontend changes that did not fit the maps",
            rejected.clone(),
        );
        let interfaces = Gauge::default();
        registry.register(
            "attached_interfaces",
            "Interfaces the TC program is attached to by this agent",
            interfaces.clone(),
        );
        let sctp_without_kernel_sctp = Gauge::default();
        registry.register(
            "sctp_frontends_without_kernel_sctp",
            "SCTP frontends programmed on a node whose kernel has no SCTP sockets",
            sctp_without_kernel_sctp.clone(),
        );
        let drift_entries = Family::<Labels, Gauge>::default();
        registry.register(
            "drift_entries",
            "Entries of each service map that differed from what the agent wrote, at the last audit (repaired)",
            drift_entries.clone(),
        );
        let drift_repaired = Counter::default();
        registry.register(
            "drift_repaired",
            "Map operations that repaired drift",
            drift_repaired.clone(),
        );
        let stale_udp_removed = Counter::default();
        registry.register(
            "conntrack_stale_udp_removed",
            "UDP connections whose backend left their Service while still a backend of another, removed so their next datagram picks anew",
            stale_udp_removed.clone(),
        );
        let audits = Counter::default();
        registry.register("audits", "Drift audits of the service maps", audits.clone());
        let datapath_info = Family::<Labels, Gauge>::default();
        registry.register(
            "datapath_info",
            "The datapath of this agent (value 1): attach path (tcx or tc), pinned maps (adopted from an earlier run, new, or none when not pinned) and the socket programs (attached, off or failed)",
            datapath_info.clone(),
        );
        let links = Family::<Labels, Gauge>::default();
        registry.register(
            "interface_link",
            "Interfaces a TC program is attached to (value 1), with how (new_link, took_over_link, new_filter, replaced_filter, unpinned) and which program (sliceway_tc on pods' interfaces, sliceway_tc_ext on the node's uplinks; sliceway_l3 and sliceway_l3_ext on interfaces without an Ethernet header; sliceway_xdp beside it with --xdp, how native, generic or refused)",
            links.clone(),
        );
        let socket_links = Family::<Labels, Gauge>::default();
        registry.register(
            "socket_link",
            "Socket programs attached for the node's own sockets (value 1), by hook (sock-connect4, sock-sendmsg4, sock-recvmsg4, sock-getpeername4 and their IPv6 twins sock-connect6, sock-sendmsg6, sock-recvmsg6, sock-getpeername6) and how (new_link, took_over_link, unpinned)",
            socket_links.clone(),
        );
        let health_checks = Gauge::default();
        registry.register(
            "service_health_checks",
            "Health-check servers open for Services (healthCheckNodePort of a LoadBalancer with externalTrafficPolicy Local)",
            health_checks.clone(),
        );
        let links_removed = Counter::default();
        registry.register(
            "links_removed",
            "Links and TC filters removed because their interface went away, is not selected, or uses the other attach path",
            links_removed.clone(),
        );
        let not_served = Family::<Labels, Gauge>::default();
        registry.register(
            "interface_not_served",
            "Interfaces selected as pods' or uplinks (by name, pattern or --interfaces auto) that no TC program could be attached to (value 1 while so), by interface and reason (not_ethernet: a link type that is neither Ethernet nor plain IP; attach_failed: the kernel refused the attach); retried at every scan",
            not_served.clone(),
        );
        let migration = Family::<Labels, Gauge>::default();
        registry.register(
            "layout_migration",
            "A migration from an older pinned layout (value 1): from which layout, and its state (pending, complete, failed)",
            migration.clone(),
        );
        registry.register(
            "log_messages",
            "Messages this process logged, by level (warn, error)",
            LOG_MESSAGES.clone(),
        );
        let kube_proxy_detected = Family::<Labels, Gauge>::default();
        registry.register(
            "kube_proxy_detected",
            "Signs of kube-proxy at work on this node (1 when seen, 0 when not, looked for at start and every minute), by what was found: nftables_ip and nftables_ip6 (its nftables tables), iptables_legacy, iptables_nft, ip6tables_legacy and ip6tables_nft (its chains, by backend), port_10249 and port_10256 (another process listening on its ports)",
            kube_proxy_detected.clone(),
        );
        let flows = FlowCounters::register(&mut registry);
        Self {
            registry,
            syncs,
            sync_duration,
            frontends,
            map_writes,
            map_deletes,
            skipped,
            map_entries,
            map_capacity,
            datapath_packets,
            programming_latency,
            rejected,
            interfaces,
            sctp_without_kernel_sctp,
            drift_entries,
            drift_repaired,
            stale_udp_removed,
            audits,
            datapath_info,
            links,
            socket_links,
            health_checks,
            links_removed,
            not_served,
            migration,
            kube_proxy_detected,
            flows: Mutex::new(flows),
            kubeproxy: KubeProxyMetrics::new(),
            health: Health::new(health_timeout),
            asks: OnceLock::new(),
        }
    }

    /// Records that `iface` has the program attached, `how`, replacing what was said
    /// of it before.
    pub fn set_link(&self, iface: &str, how: &str, program: &str) {
        self.forget_link(iface);
        self.links
            .get_or_create(&link_labels(iface, how, program))
            .set(1);
    }

    /// Records how the XDP program went on uplink `iface` (`native`, `generic`), or
    /// that it was refused (`None`: a series with how `refused`).
    pub fn set_xdp(&self, iface: &str, how: Option<&str>) {
        self.forget_xdp(iface);
        self.links
            .get_or_create(&link_labels(
                iface,
                how.unwrap_or("refused"),
                crate::kernel::XDP_PROGRAM,
            ))
            .set(1);
    }

    fn forget_xdp(&self, iface: &str) {
        for how in crate::kernel::XdpAttached::ALL
            .iter()
            .map(|h| h.as_str())
            .chain(["refused"])
        {
            self.links
                .remove(&link_labels(iface, how, crate::kernel::XDP_PROGRAM));
        }
    }

    /// Records that `iface` no longer has the program attached by this agent.
    pub fn forget_link(&self, iface: &str) {
        self.forget_xdp(iface);
        for how in crate::kernel::Attached::ALL {
            for program in crate::kernel::TC_PROGRAMS {
                self.links
                    .remove(&link_labels(iface, how.as_str(), program));
            }
        }
    }

    /// Records that `iface` could not be served, for `reason` (`not_ethernet`,
    /// `attach_failed`); `None`: it is served, or gone.
    pub fn set_not_served(&self, iface: &str, reason: Option<&str>) {
        let labels = |r: &str| -> Labels {
            vec![
                ("interface".into(), iface.into()),
                ("reason".into(), r.into()),
            ]
        };
        for r in ["not_ethernet", "attach_failed"] {
            self.not_served.remove(&labels(r));
        }
        if let Some(r) = reason {
            self.not_served.get_or_create(&labels(r)).set(1);
        }
    }

    /// Records the state of a migration from pinned layout `from`.
    pub fn set_migration(&self, from: u32, state: &str) {
        for s in ["pending", "complete", "failed"] {
            self.migration.remove(&migration_labels(from, s));
        }
        self.migration
            .get_or_create(&migration_labels(from, state))
            .set(1);
    }

    /// Records how the datapath runs: attach path (`tcx`, `tc`), pinned maps
    /// (`adopted`, `new`, `none`) and the socket programs.
    pub fn set_datapath_info(&self, attach_path: &str, pinned_maps: &str, socket_lb: &str) {
        self.datapath_info
            .get_or_create(&labels(&[
                ("attach_path", attach_path),
                ("pinned_maps", pinned_maps),
                ("socket_lb", socket_lb),
            ]))
            .set(1);
    }

    /// Records that the socket program of `hook` is attached, `how`.
    pub fn set_socket_link(&self, hook: &str, how: &str) {
        self.socket_links
            .get_or_create(&labels(&[("hook", hook), ("how", how)]))
            .set(1);
    }

    /// Records the entries of `map` the last audit found differing.
    pub fn set_drift(&self, map: &str, entries: i64) {
        self.drift_entries
            .get_or_create(&labels(&[("map", map)]))
            .set(entries);
    }

    /// Where the endpoint's asks go; the agent loop reads the other end. Set once.
    pub fn answer_asks(&self, to: mpsc::Sender<Ask>) {
        let _ = self.asks.set(to);
    }

    /// Sends `ask` to the agent loop; `None` if no loop reads asks.
    fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Ask) -> Option<oneshot::Receiver<T>> {
        let (tx, rx) = oneshot::channel();
        self.asks.get()?.try_send(make(tx)).ok()?;
        Some(rx)
    }

    /// Replaces the skipped-object gauges with `counts` (kind, reason) → n.
    pub fn set_skipped(&self, counts: &BTreeMap<(String, String), i64>) {
        self.skipped.clear();
        for ((kind, reason), n) in counts {
            self.skipped
                .get_or_create(&labels(&[("kind", kind), ("reason", reason)]))
                .set(*n);
        }
    }

    pub fn set_map(&self, map: &str, entries: u64, capacity: u32) {
        let labels = labels(&[("map", map)]);
        self.map_entries.get_or_create(&labels).set(entries as i64);
        self.map_capacity
            .get_or_create(&labels)
            .set(capacity as i64);
    }

    /// What the last look for kube-proxy found ([`crate::kube_proxy::look`]): every
    /// sign's series, 1 for those in `signs`; `/healthz`'s body names them.
    pub fn set_kube_proxy(&self, signs: &[crate::kube_proxy::Sign]) {
        for found in crate::kube_proxy::SIGNS {
            let seen = signs.iter().any(|s| s.found == found);
            self.kube_proxy_detected
                .get_or_create(&labels(&[("found", found)]))
                .set(i64::from(seen));
        }
        self.health
            .set_kube_proxy(signs.iter().map(|s| s.detail.clone()).collect());
    }

    pub fn set_datapath(&self, name: &str, packets: u64) {
        self.datapath_packets
            .get_or_create(&labels(&[("reason", name)]))
            .set(packets as i64);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &self.kubeproxy.registry);
        let _ = encode_eof(&mut out);
        out
    }

    /// Metrics with one series in every family, each made by the code that makes it
    /// in the agent: the generated metrics reference (`docs/reference/metrics.md`)
    /// is rendered from them, since a family without a series is not encoded.
    pub fn with_one_series_each() -> Self {
        let m = Self::default();
        m.syncs.inc();
        m.sync_duration.observe(0.01);
        m.frontends.set(1);
        m.map_writes.inc();
        m.map_deletes.inc();
        m.set_skipped(&[(("Service".into(), "bad_port".into()), 1)].into());
        m.set_map("SERVICES", 1, 10);
        m.set_datapath(dataplane_common::stat::NAMES[0], 1);
        m.programming_latency.observe(0.01);
        m.rejected.inc();
        m.interfaces.set(1);
        m.sctp_without_kernel_sctp.set(1);
        m.set_drift("SERVICES", 1);
        m.drift_repaired.inc();
        m.stale_udp_removed.inc();
        m.audits.inc();
        m.set_datapath_info("tcx", "new", "attached");
        m.set_link("eth0", "new_link", "sliceway_tc");
        m.set_xdp("eth1", Some("native"));
        m.set_socket_link("sock-connect4", "new_link");
        m.health_checks.set(1);
        m.links_removed.inc();
        m.set_not_served("lo", Some("not_ethernet"));
        m.set_migration(1, "pending");
        m.kubeproxy.synced(0.01, std::time::SystemTime::now());
        m.kubeproxy.programmed("IPv4", 0.5);
        m.kubeproxy.changes_seen(1, 1);
        m.kubeproxy.changes_synced();
        m.kubeproxy
            .no_local_endpoints(&crate::compiler::NoLocalEndpoints::default());
        m.kubeproxy.healthz(200);
        m.kubeproxy.livez(200);
        m.set_kube_proxy(&[]);
        let _ = LOG_MESSAGES.get_or_create(&labels(&[("level", "warn")]));
        let counts = dataplane_common::FrontendCounters {
            new: 1,
            packets: 1,
            bytes: 1,
            drops: 1,
            rejects: 1,
        };
        let front = FrontendCount {
            identity: 1,
            labels: || frontend_labels("default", "web", "http", "10.96.0.10:80/TCP"),
            counts,
        };
        let back = BackendCount {
            identity: 2,
            labels: || backend_labels("10.0.0.1:8080", "TCP"),
            counts: dataplane_common::BackendCounters {
                new: 1,
                packets: 1,
                bytes: 1,
            },
        };
        m.publish_flows([front], Some([back]));
        m
    }
}

/// kube-proxy's metrics for the figures sliceway has too, with kube-proxy's names,
/// types, help, buckets and labels, so dashboards and alerts made for kube-proxy
/// work unchanged:
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/metrics/metrics.go>.
/// One sync programs both IP families, so the `ip_family` series of a sync move
/// together.
pub struct KubeProxyMetrics {
    registry: Registry,
    sync_duration: Histograms,
    last_sync: Family<Labels, Gauge<f64, AtomicU64>>,
    programming: Histograms,
    endpoint_changes_pending: Gauge,
    endpoint_changes: Counter,
    service_changes_pending: Gauge,
    service_changes: Counter,
    no_local_endpoints: Family<Labels, Gauge>,
    healthz: Family<Labels, Counter>,
    livez: Family<Labels, Counter>,
}

/// The IP families, as kube-proxy's `ip_family` label names them.
pub const IP_FAMILIES: [&str; 2] = ["IPv4", "IPv6"];

fn family(f: &str) -> Labels {
    labels(&[("ip_family", f)])
}

/// kube-proxy's network programming buckets: 0.25 s and 0.5 s, each second to 59 s,
/// each 5 s to 115 s, each 30 s to 5 min.
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

impl KubeProxyMetrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("kubeproxy");
        let sync_duration: Histograms =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 15)));
        registry.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            sync_duration.clone(),
        );
        let last_sync = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            last_sync.clone(),
        );
        let programming: Histograms =
            Family::new_with_constructor(|| Histogram::new(programming_buckets()));
        registry.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            programming.clone(),
        );
        let endpoint_changes_pending = Gauge::default();
        registry.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            endpoint_changes_pending.clone(),
        );
        let endpoint_changes = Counter::default();
        registry.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            endpoint_changes.clone(),
        );
        let service_changes_pending = Gauge::default();
        registry.register(
            "sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            service_changes_pending.clone(),
        );
        let service_changes = Counter::default();
        registry.register(
            "sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            service_changes.clone(),
        );
        // A gauge despite its `_total`, as upstream.
        let no_local_endpoints = Family::<Labels, Gauge>::default();
        registry.register(
            "sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            no_local_endpoints.clone(),
        );
        let healthz = Family::<Labels, Counter>::default();
        registry.register(
            "proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            healthz.clone(),
        );
        let livez = Family::<Labels, Counter>::default();
        registry.register(
            "proxy_livez",
            "Cumulative proxy livez HTTP status",
            livez.clone(),
        );
        Self {
            registry,
            sync_duration,
            last_sync,
            programming,
            endpoint_changes_pending,
            endpoint_changes,
            service_changes_pending,
            service_changes,
            no_local_endpoints,
            healthz,
            livez,
        }
    }

    /// A sync that took `seconds` and finished writing `at`.
    pub fn synced(&self, seconds: f64, at: std::time::SystemTime) {
        let at = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        for f in IP_FAMILIES {
            self.sync_duration
                .get_or_create(&family(f))
                .observe(seconds);
            self.last_sync.get_or_create(&family(f)).set(at);
        }
    }

    /// A change of `ip_family` programmed `seconds` after its trigger time.
    pub fn programmed(&self, ip_family: &str, seconds: f64) {
        self.programming
            .get_or_create(&family(ip_family))
            .observe(seconds);
    }

    /// Service and EndpointSlice changes seen, not yet synced.
    pub fn changes_seen(&self, services: u64, endpoints: u64) {
        self.service_changes.inc_by(services);
        self.endpoint_changes.inc_by(endpoints);
        self.service_changes_pending.inc_by(services as i64);
        self.endpoint_changes_pending.inc_by(endpoints as i64);
    }

    /// Every change seen is synced.
    pub fn changes_synced(&self) {
        self.service_changes_pending.set(0);
        self.endpoint_changes_pending.set(0);
    }

    /// Service ports with a `Local` traffic policy and no endpoint on this node
    /// while others have some, per family, after a sync: `traffic_policy` is
    /// `internal` or `external`, as upstream's proxiers set it.
    pub fn no_local_endpoints(&self, counts: &crate::compiler::NoLocalEndpoints) {
        for (i, f) in IP_FAMILIES.iter().enumerate() {
            for (policy, n) in [
                ("internal", counts.internal[i]),
                ("external", counts.external[i]),
            ] {
                self.no_local_endpoints
                    .get_or_create(&labels(&[("ip_family", f), ("traffic_policy", policy)]))
                    .set(n as i64);
            }
        }
    }

    /// `/healthz` answered with `code`.
    pub fn healthz(&self, code: u16) {
        self.healthz
            .get_or_create(&labels(&[("code", &code.to_string())]))
            .inc();
    }

    /// `/livez` answered with `code`.
    pub fn livez(&self, code: u16) {
        self.livez
            .get_or_create(&labels(&[("code", &code.to_string())]))
            .inc();
    }
}

type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// A counter family whose values are read from the kernel: each read adds the
/// growth since the last one. A value below the last (the id was given to a new
/// frontend or backend with the same labels, and its counts started again at zero)
/// adds the whole value.
struct KernelCounter {
    family: Family<Labels, Counter>,
    last: HashMap<Labels, u64>,
}

impl KernelCounter {
    fn register(registry: &mut Registry, name: &str, help: &str) -> Self {
        let family = Family::<Labels, Counter>::default();
        registry.register(name, help, family.clone());
        Self {
            family,
            last: HashMap::new(),
        }
    }

    /// Sets the series of `labels` to the kernel's count. A series starts at its
    /// first count above zero: a frontend or backend nothing went through yet has
    /// none, so /metrics holds series for the traffic there was, not one per
    /// frontend and backend the maps can hold (at 10,000 Services of 10 endpoints,
    /// 140,000 series took 70 MB of the agent's heap).
    fn set(&mut self, labels: &Labels, value: u64) {
        if value == 0 && !self.last.contains_key(labels) {
            return;
        }
        let last = self.last.insert(labels.clone(), value).unwrap_or(0);
        let add = if value >= last { value - last } else { value };
        self.family.get_or_create(labels).inc_by(add);
    }

    /// Whether `labels` has a series.
    fn has(&self, labels: &Labels) -> bool {
        self.last.contains_key(labels)
    }

    /// Drops the series whose labels are not in `keep` (a frontend or backend gone).
    fn retain(&mut self, keep: &HashSet<Labels>) {
        let family = &self.family;
        self.last.retain(|labels, _| {
            let kept = keep.contains(labels);
            if !kept {
                family.remove(labels);
            }
            kept
        });
    }
}

/// One frontend's counts. Its labels are made only when they are needed (a count
/// above zero, or a series it may have): at 10,000 Services of 10 endpoints, making
/// the labels of every frontend and backend at each scrape took 27 MB of the agent's
/// heap for a moment, most of it for counts of zero.
pub struct FrontendCount<L> {
    /// A hash of what the labels are made of ([`identity`]): equal labels, equal
    /// identity.
    pub identity: u64,
    pub labels: L,
    pub counts: dataplane_common::FrontendCounters,
}

/// One backend's counts, its labels made as a frontend's are.
pub struct BackendCount<L> {
    pub identity: u64,
    pub labels: L,
    pub counts: dataplane_common::BackendCounters,
}

/// The identity of a series' labels: a hash of what they are made of, the same in
/// every process (a collision only makes labels that were not needed).
pub fn identity(parts: impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(parts)
}

/// The per-frontend and per-backend counter families.
pub struct FlowCounters {
    connections: KernelCounter,
    packets: KernelCounter,
    bytes: KernelCounter,
    drops: KernelCounter,
    rejects: KernelCounter,
    backend_connections: KernelCounter,
    backend_packets: KernelCounter,
    backend_bytes: KernelCounter,
    /// Identities of the frontends and backends that have a series: of those alone,
    /// counts of zero need their labels (to keep the series).
    frontend_series: HashSet<u64>,
    backend_series: HashSet<u64>,
}

impl FlowCounters {
    fn register(r: &mut Registry) -> Self {
        Self {
            connections: KernelCounter::register(
                r,
                "frontend_connections",
                "New connections (flows) given a backend, per frontend",
            ),
            packets: KernelCounter::register(
                r,
                "frontend_packets",
                "Packets from clients translated to a backend, per frontend",
            ),
            bytes: KernelCounter::register(
                r,
                "frontend_bytes",
                "Bytes of those packets (frame length), per frontend",
            ),
            drops: KernelCounter::register(
                r,
                "frontend_drops",
                "New flows dropped, per frontend and reason",
            ),
            rejects: KernelCounter::register(
                r,
                "frontend_rejects",
                "New flows refused, per frontend and reason",
            ),
            backend_connections: KernelCounter::register(
                r,
                "backend_connections",
                "New connections given to a backend, through any frontend",
            ),
            backend_packets: KernelCounter::register(
                r,
                "backend_packets",
                "Packets from clients translated to a backend",
            ),
            backend_bytes: KernelCounter::register(
                r,
                "backend_bytes",
                "Bytes of those packets (frame length)",
            ),
            frontend_series: HashSet::new(),
            backend_series: HashSet::new(),
        }
    }

    /// Publishes the counts read from the kernel; series of frontends and backends
    /// not in the lists go. A frontend or backend whose counts are zero and that has
    /// no series is passed over without making its labels: it would make no series,
    /// and no series has its labels to keep.
    pub fn publish<F, B>(
        &mut self,
        frontends: impl IntoIterator<Item = FrontendCount<F>>,
        backends: Option<impl IntoIterator<Item = BackendCount<B>>>,
    ) where
        F: FnOnce() -> Labels,
        B: FnOnce() -> Labels,
    {
        let mut keep = HashSet::new();
        let mut keep_reason = HashSet::new();
        let mut series = HashSet::new();
        for f in frontends {
            let c = f.counts;
            let zero =
                c.new == 0 && c.packets == 0 && c.bytes == 0 && c.drops == 0 && c.rejects == 0;
            if zero && !self.frontend_series.contains(&f.identity) {
                continue;
            }
            let labels = (f.labels)();
            self.connections.set(&labels, c.new);
            self.packets.set(&labels, c.packets);
            self.bytes.set(&labels, c.bytes);
            let with = |reason: &str| {
                let mut l = labels.clone();
                l.push(("reason".into(), reason.into()));
                l
            };
            let (dropped, refused) = (with("no_local_backend"), with("no_backend"));
            self.drops.set(&dropped, c.drops);
            self.rejects.set(&refused, c.rejects);
            if [&self.connections, &self.packets, &self.bytes]
                .iter()
                .any(|k| k.has(&labels))
                || self.drops.has(&dropped)
                || self.rejects.has(&refused)
            {
                series.insert(f.identity);
            }
            keep_reason.insert(dropped);
            keep_reason.insert(refused);
            keep.insert(labels);
        }
        for c in [&mut self.connections, &mut self.packets, &mut self.bytes] {
            c.retain(&keep);
        }
        self.drops.retain(&keep_reason);
        self.rejects.retain(&keep_reason);
        self.frontend_series = series;
        let mut keep = HashSet::new();
        let mut series = HashSet::new();
        for b in backends.into_iter().flatten() {
            let c = b.counts;
            if c.new == 0
                && c.packets == 0
                && c.bytes == 0
                && !self.backend_series.contains(&b.identity)
            {
                continue;
            }
            let labels = (b.labels)();
            self.backend_connections.set(&labels, c.new);
            self.backend_packets.set(&labels, c.packets);
            self.backend_bytes.set(&labels, c.bytes);
            if [
                &self.backend_connections,
                &self.backend_packets,
                &self.backend_bytes,
            ]
            .iter()
            .any(|k| k.has(&labels))
            {
                series.insert(b.identity);
            }
            keep.insert(labels);
        }
        for c in [
            &mut self.backend_connections,
            &mut self.backend_packets,
            &mut self.backend_bytes,
        ] {
            c.retain(&keep);
        }
        self.backend_series = series;
    }
}

impl Metrics {
    /// See [`FlowCounters::publish`].
    pub fn publish_flows<F, B>(
        &self,
        frontends: impl IntoIterator<Item = FrontendCount<F>>,
        backends: Option<impl IntoIterator<Item = BackendCount<B>>>,
    ) where
        F: FnOnce() -> Labels,
        B: FnOnce() -> Labels,
    {
        self.flows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .publish(frontends, backends);
    }
}

impl conventions::http::Status for Metrics {
    fn metrics(&self) -> String {
        self.render()
    }
    fn health(&self) -> Result<(), String> {
        self.health.healthz_at(Instant::now())
    }
    fn live(&self) -> Result<(), String> {
        self.health.livez_at(Instant::now())
    }
    fn ready(&self) -> Option<Result<(), String>> {
        Some(self.health.readyz_at(Instant::now()))
    }
    fn health_json(&self, live: bool) -> Option<(bool, String)> {
        let (healthy, body) = self
            .health
            .page(live, Instant::now(), std::time::SystemTime::now());
        // kube-proxy's codes: 200, or 503 when unhealthy.
        let code = if healthy { 200 } else { 503 };
        if live {
            self.kubeproxy.livez(code);
        } else {
            self.kubeproxy.healthz(code);
        }
        Some((healthy, body))
    }
    fn refresh(&self) -> conventions::http::Reply<'_, ()> {
        let answer = self.ask(Ask::Refresh);
        Box::pin(async move {
            if let Some(rx) = answer {
                let _ = rx.await;
            }
        })
    }
    fn extra(&self, path: &str) -> Option<conventions::http::Reply<'_, Result<String, String>>> {
        if path != "/audit" {
            return None;
        }
        let answer = self.ask(Ask::Audit);
        Some(Box::pin(async move {
            let report = answer
                .ok_or("the agent loop is not taking requests (busy, or not started)")?
                .await
                .map_err(|_| "the agent loop stopped".to_string())??;
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())
        }))
    }
}

/// Why `/audit` is not served on the metrics address `addr`, or `None` where it is:
/// on a loopback address, or on any with `beyond_loopback`
/// (`--audit-on-non-loopback`). `/audit` writes the service maps and asks for no
/// credentials, so a host that reaches it must be one that could run the agent.
pub fn audit_refusal(addr: SocketAddr, beyond_loopback: bool) -> Option<String> {
    (!beyond_loopback && !addr.ip().to_canonical().is_loopback()).then(|| {
        format!(
            "/audit is served only on a loopback --metrics-bind-address, and this agent's \
             is {addr}: it repairs the service maps without authorization (pass \
             --audit-on-non-loopback to serve it there anyway)"
        )
    })
}

/// The metrics listener's side of [`Metrics`]: `/metrics`, and `/audit` unless it is
/// refused there.
struct MetricsPage {
    metrics: Arc<Metrics>,
    audit_refused: Option<String>,
}

impl conventions::http::Status for MetricsPage {
    fn metrics(&self) -> String {
        self.metrics.render()
    }
    fn health(&self) -> Result<(), String> {
        conventions::http::Status::health(&*self.metrics)
    }
    fn refresh(&self) -> conventions::http::Reply<'_, ()> {
        conventions::http::Status::refresh(&*self.metrics)
    }
    fn forbidden(&self, path: &str) -> Option<String> {
        self.audit_refused.clone().filter(|_| path == "/audit")
    }
    fn extra(&self, path: &str) -> Option<conventions::http::Reply<'_, Result<String, String>>> {
        conventions::http::Status::extra(&*self.metrics, path)
    }
}

/// How long a server waits before binding again, as kube-proxy's
/// (`wait.UntilWithContext` every 5 s in `serveHealthz` and `serveMetrics`,
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server.go>):
/// a port still held (by a kube-proxy being replaced) is taken once it is free.
pub const BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Binds `addr`, again every [`BIND_RETRY`] until it succeeds, saying each failure.
async fn bind(addr: SocketAddr, what: &str) -> tokio::net::TcpListener {
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) => {
                tracing::error!(
                    %addr,
                    "binding the {what} server failed: {e}; trying again in {} s",
                    BIND_RETRY.as_secs()
                );
                tokio::time::sleep(BIND_RETRY).await;
            }
        }
    }
}

/// Serves `/healthz` and `/livez` on `addr` (`--healthz-bind-address`) until the
/// task is dropped.
pub async fn serve_health(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = bind(addr, "health").await;
    tracing::info!(%addr, "serving /healthz and /livez");
    serve_health_on(listener, metrics).await
}

/// [`serve_health`] on a listener already bound.
pub async fn serve_health_on(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
) -> std::io::Result<()> {
    conventions::http::serve_paths_on(listener, metrics, conventions::http::Paths::Health).await
}

/// Serves `/metrics`, and `/audit` where [`audit_refusal`] allows, on `addr`
/// (`--metrics-bind-address`) until the task is dropped.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    audit_beyond_loopback: bool,
) -> std::io::Result<()> {
    let refused = audit_refusal(addr, audit_beyond_loopback);
    if let Some(why) = &refused {
        tracing::warn!(%addr, "not serving /audit: {why}");
    }
    let listener = bind(addr, "metrics").await;
    match refused {
        None => tracing::info!(%addr, "serving /metrics and /audit"),
        Some(_) => tracing::info!(%addr, "serving /metrics"),
    }
    serve_metrics_on(listener, metrics, refused).await
}

/// [`serve_metrics`] on a listener already bound; `audit_refused`: why `/audit`
/// is refused there ([`audit_refusal`]), or `None` to serve it.
pub async fn serve_metrics_on(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    audit_refused: Option<String>,
) -> std::io::Result<()> {
    let page = Arc::new(MetricsPage {
        metrics,
        audit_refused,
    });
    conventions::http::serve_paths_on(listener, page, conventions::http::Paths::Metrics).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frontend nothing went through has no series; its series starts with its
    /// first count and stays while the frontend does, also through a count that
    /// starts again from zero (an id given anew), and goes with it.
    type NoLabels = fn() -> Labels;
    const NO_BACKENDS: Option<Vec<BackendCount<NoLabels>>> = None;

    /// The series of one family in the exposition, by their lines.
    fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .collect()
    }

    /// kube-proxy's names, types and labels are in the exposition after a sync,
    /// beside sliceway's own, and their values move as kube-proxy's do: pending
    /// changes drop to 0 at the sync while the totals stay, the last sync's time is
    /// the write's, and a programming latency lands in kube-proxy's buckets.
    #[test]
    fn kube_proxy_names_are_served_and_move_with_syncs() {
        let m = Metrics::new(std::time::Duration::from_secs(60));
        m.kubeproxy.changes_seen(2, 3);
        let before = m.render();
        assert!(lines_of(
            &before,
            "kubeproxy_sync_proxy_rules_service_changes_pending"
        )
        .contains(&"kubeproxy_sync_proxy_rules_service_changes_pending 2"));
        assert!(lines_of(
            &before,
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
        )
        .contains(&"kubeproxy_sync_proxy_rules_endpoint_changes_pending 3"));
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        m.kubeproxy.synced(0.003, at);
        m.kubeproxy.changes_synced();
        m.kubeproxy.programmed("IPv6", 0.3);
        let text = m.render();
        for (name, kind) in [
            ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
            ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"),
            (
                "kubeproxy_network_programming_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "gauge",
            ),
            ("kubeproxy_sync_proxy_rules_endpoint_changes", "counter"),
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "gauge",
            ),
            ("kubeproxy_sync_proxy_rules_service_changes", "counter"),
            ("sliceway_syncs", "counter"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind} in:\n{text}"
            );
        }
        assert_eq!(text.matches("# EOF").count(), 1);
        let pending = |n: &str| lines_of(&text, n).join("\n");
        assert_eq!(
            pending("kubeproxy_sync_proxy_rules_service_changes_pending"),
            "kubeproxy_sync_proxy_rules_service_changes_pending 0"
        );
        assert_eq!(
            pending("kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0"
        );
        assert!(text.contains("kubeproxy_sync_proxy_rules_service_changes_total 2\n"));
        assert!(text.contains("kubeproxy_sync_proxy_rules_endpoint_changes_total 3\n"));
        for f in ["IPv4", "IPv6"] {
            assert!(text.contains(&format!(
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family=\"{f}\"}} 1800000000.0\n"
            )));
            // 3 ms: above kube-proxy's 2 ms bucket, within its 4 ms one.
            assert!(text.contains(&format!(
                "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"0.002\",ip_family=\"{f}\"}} 0\n"
            )));
            assert!(text.contains(&format!(
                "kubeproxy_sync_proxy_rules_duration_seconds_bucket{{le=\"0.004\",ip_family=\"{f}\"}} 1\n"
            )));
        }
        // kube-proxy's first programming buckets are 0.25 s and 0.5 s; its last, 300 s.
        let programming = lines_of(
            &text,
            "kubeproxy_network_programming_duration_seconds_bucket",
        );
        assert!(programming.contains(
            &"kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\",ip_family=\"IPv6\"} 0"
        ));
        assert!(programming.contains(
            &"kubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\",ip_family=\"IPv6\"} 1"
        ));
        assert!(programming.contains(
            &"kubeproxy_network_programming_duration_seconds_bucket{le=\"300.0\",ip_family=\"IPv6\"} 1"
        ));
        // 2 + 59 + 12 + 7 buckets and +Inf.
        assert_eq!(programming.len(), 81, "{programming:#?}");
    }

    /// `/healthz` and `/livez` count their answers by code, as kube-proxy's
    /// `proxy_healthz_total` and `proxy_livez_total`.
    /// kube-proxy's `sync_proxy_rules_no_local_endpoints_total`: a gauge (despite
    /// its name) by `ip_family` and `traffic_policy`, set anew at every sync.
    #[test]
    fn no_local_endpoints_are_a_gauge_by_family_and_policy() {
        let m = Metrics::default();
        m.kubeproxy
            .no_local_endpoints(&crate::compiler::NoLocalEndpoints {
                internal: [2, 0],
                external: [1, 3],
            });
        let name = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
        let text = m.render();
        assert!(text.contains(&format!(
            "# HELP {name} Number of services with a Local traffic policy and no endpoints.\n# TYPE {name} gauge\n"
        )));
        let mut got = lines_of(&text, name);
        got.sort();
        let want = [
            ("IPv4", "external", 1),
            ("IPv4", "internal", 2),
            ("IPv6", "external", 3),
            ("IPv6", "internal", 0),
        ]
        .map(|(f, p, n)| format!("{name}{{ip_family=\"{f}\",traffic_policy=\"{p}\"}} {n}"));
        assert_eq!(got, want);
        m.kubeproxy
            .no_local_endpoints(&crate::compiler::NoLocalEndpoints::default());
        let text = m.render();
        let values = lines_of(&text, name);
        assert_eq!(values.len(), 4);
        assert!(values.iter().all(|l| l.ends_with(" 0")), "{values:?}");
    }

    #[test]
    fn health_answers_are_counted_by_code() {
        use conventions::http::Status;
        let m = Metrics::new(std::time::Duration::from_secs(60));
        assert_eq!(m.health_json(false).map(|(ok, _)| ok), Some(false));
        assert_eq!(m.health_json(true).map(|(ok, _)| ok), Some(true));
        m.health.updated();
        assert_eq!(m.health_json(false).map(|(ok, _)| ok), Some(true));
        let text = m.render();
        for line in [
            "# TYPE kubeproxy_proxy_healthz counter",
            "kubeproxy_proxy_healthz_total{code=\"503\"} 1",
            "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
            "# TYPE kubeproxy_proxy_livez counter",
            "kubeproxy_proxy_livez_total{code=\"200\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn flow_series_start_with_their_first_count() {
        let m = Metrics::new(std::time::Duration::from_secs(60));
        let labels: Labels = vec![("frontend".into(), "10.96.0.10:80/TCP".into())];
        let front = |new: u64| FrontendCount {
            identity: identity(&labels),
            labels: || labels.clone(),
            counts: dataplane_common::FrontendCounters {
                new,
                ..Default::default()
            },
        };
        let series = |m: &Metrics| {
            m.render()
                .lines()
                .filter(|l| l.starts_with("sliceway_frontend_connections_total{"))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        m.publish_flows([front(0)], NO_BACKENDS);
        assert_eq!(series(&m), Vec::<String>::new());
        m.publish_flows([front(3)], NO_BACKENDS);
        assert_eq!(
            series(&m),
            ["sliceway_frontend_connections_total{frontend=\"10.96.0.10:80/TCP\"} 3"]
        );
        m.publish_flows([front(0)], NO_BACKENDS);
        assert_eq!(series(&m).len(), 1, "kept once it exists");
        m.publish_flows(Vec::<FrontendCount<NoLabels>>::new(), NO_BACKENDS);
        assert_eq!(series(&m), Vec::<String>::new());
    }

    /// The reference's example has a series in every family the agent registers in
    /// either registry (a registry's debug form lists each registration; a family without a series
    /// would be missing from `docs/reference/metrics.md`), and each family's series
    /// carry one set of labels.
    #[test]
    fn the_reference_example_has_a_series_in_every_family() {
        let m = Metrics::with_one_series_each();
        let registered = [
            format!("{:?}", m.registry),
            format!("{:?}", m.kubeproxy.registry),
        ]
        .iter()
        .map(|r| r.matches("Descriptor {").count())
        .sum();
        let checked = conventions::exposition::check_one_series_each(registered, &m.render());
        assert_eq!(checked, Ok(()));
    }

    /// A scrape of a large idle cluster makes no labels: a frontend or backend with
    /// counts of zero and no series is passed over before its labels are made.
    #[test]
    fn idle_frontends_and_backends_make_no_labels() {
        let m = Metrics::new(std::time::Duration::from_secs(60));
        let made = std::cell::Cell::new(0);
        let labels = |name: &str| -> Labels {
            made.set(made.get() + 1);
            vec![("frontend".into(), name.into())]
        };
        let front = |name: &'static str, new: u64| FrontendCount {
            identity: identity(name),
            labels: move || labels(name),
            counts: dataplane_common::FrontendCounters {
                new,
                ..Default::default()
            },
        };
        let back = |name: &'static str| BackendCount {
            identity: identity(name),
            labels: move || labels(name),
            counts: dataplane_common::BackendCounters::default(),
        };
        m.publish_flows((0..1000).map(|_| front("idle", 0)), Some([back("b")]));
        assert_eq!(made.get(), 0);
        m.publish_flows([front("busy", 2), front("idle", 0)], Some([back("b")]));
        assert_eq!(made.get(), 1, "only the frontend with a count");
        // Once it has a series, a frontend's labels are made whatever its counts.
        m.publish_flows([front("busy", 0), front("idle", 0)], Some([back("b")]));
        assert_eq!(made.get(), 2);
        assert!(m
            .render()
            .contains("sliceway_frontend_connections_total{frontend=\"busy\"} 2"));
    }

    /// `GET path` on `addr`: the whole response.
    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).await.unwrap();
        out
    }

    /// Issue 47: the health port (which other hosts reach) answers `/healthz` and
    /// `/livez`, never `/metrics` or `/audit`; the metrics port answers `/metrics`
    /// and not health.
    #[tokio::test]
    async fn the_health_port_serves_health_only() {
        let metrics = Arc::new(Metrics::new(std::time::Duration::from_secs(60)));
        let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let health_addr = health.local_addr().unwrap();
        let page = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let page_addr = page.local_addr().unwrap();
        let servers = [
            tokio::spawn(serve_health_on(health, metrics.clone())),
            tokio::spawn(serve_metrics_on(page, metrics, None)),
        ];
        for (addr, path, code) in [
            (health_addr, "/healthz", "503"), // not synced yet: kube-proxy's 503
            (health_addr, "/livez", "200"),
            (health_addr, "/readyz", "503"),
            (health_addr, "/metrics", "404"),
            (health_addr, "/audit", "404"),
            (page_addr, "/metrics", "200"),
            (page_addr, "/healthz", "404"),
            (page_addr, "/livez", "404"),
            (page_addr, "/readyz", "404"),
        ] {
            let reply = get(addr, path).await;
            assert!(
                reply.starts_with(&format!("HTTP/1.1 {code} ")),
                "{path}: {reply}"
            );
        }
        // Served on loopback: the loop answers it (here there is none).
        let audit = get(page_addr, "/audit").await;
        assert!(
            audit.contains("the agent loop is not taking requests"),
            "{audit}"
        );
        for s in servers {
            s.abort();
        }
    }

    /// Issue 47: `/audit` is refused (403, saying why and what to pass) on a metrics
    /// address other hosts can reach, unless `--audit-on-non-loopback` says so.
    #[tokio::test]
    async fn audit_is_refused_on_a_metrics_address_beyond_loopback() {
        for addr in ["0.0.0.0:10249", "[::]:10249", "10.0.0.1:10249"] {
            let why = audit_refusal(addr.parse().unwrap(), false).expect(addr);
            assert!(why.contains("--audit-on-non-loopback"), "{why}");
            assert_eq!(audit_refusal(addr.parse().unwrap(), true), None);
        }
        for addr in [
            "127.0.0.1:10249",
            "127.0.0.2:10249",
            "[::1]:10249",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert_eq!(audit_refusal(addr.parse().unwrap(), false), None, "{addr}");
        }
        let metrics = Arc::new(Metrics::new(std::time::Duration::from_secs(60)));
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let refused = audit_refusal(listener.local_addr().unwrap(), false);
        assert!(refused.is_some());
        let server = tokio::spawn(serve_metrics_on(listener, metrics, refused));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let audit = get(addr, "/audit").await;
        assert!(audit.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{audit}");
        assert!(audit.contains("--audit-on-non-loopback"), "{audit}");
        assert!(get(addr, "/metrics").await.starts_with("HTTP/1.1 200 "));
        server.abort();
    }
}

//! The `sliceway-agent` command line, in the library so that tests (and the
//! deployment manifests' check) parse arguments with the same definition as the
//! binary.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use clap::{Parser, Subcommand};

use crate::{
    compiler::NodePortAddresses,
    kernel::interfaces::{Selection, SelectionError},
    kernel::{AttachMode, Capacities, XdpChoice},
    serve::bind::{self, BindAddress},
    writer::Limits,
};

#[derive(Parser)]
#[command(
    name = "sliceway-agent",
    version,
    about = "sliceway node agent: Kubernetes Services in BPF maps"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// `--logging-format` and `-v`, as Kubernetes components take them.
    #[command(flatten)]
    pub log: conventions::logging::LogArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Program the datapath and keep it in sync.
    Run(Box<RunArgs>),
    /// Show what the kernel holds: frontends, backends, counters (from pinned maps).
    List {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
        /// Only the frontends of this Service (`namespace/name`) and their backends.
        #[arg(long)]
        service: Option<String>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Where would this packet go, and why? Runs one crafted packet through the
    /// programs (BPF_PROG_TEST_RUN); nothing is attached and no traffic is sent.
    Trace(TraceArgs),
    /// The connections the datapath tracks (from the pinned conntrack map), or with
    /// `--flush-backend` forget every connection to one backend.
    Conntrack {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
        /// Only the connections of this Service (`namespace/name`).
        #[arg(long)]
        service: Option<String>,
        /// Remove every connection to this backend (`IP:PORT` or `[IPv6]:PORT`):
        /// their next packets pick a backend again.
        #[arg(long, value_name = "IP:PORT", value_parser = socket_addr)]
        flush_backend: Option<SocketAddr>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Load the programs into this kernel and report each one's instructions and
    /// verifier cost, or the verifier's log where the kernel refuses one; and
    /// whether the agent would attach with tcx or a TC filter. Nothing is attached.
    Check {
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Ask the running agent to compare the service maps in the kernel with what it
    /// wrote, entry by entry, and to repair what differs (it also does so every
    /// --audit-interval-seconds). Prints what differed.
    Audit {
        /// The running agent's --metrics-bind-address (where it serves /audit).
        #[arg(long, default_value_t = crate::serve::bind::DEFAULT_METRICS, value_parser = socket_addr)]
        metrics_bind_address: SocketAddr,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// The busiest frontends (new connections, packets, bytes and refused flows per
    /// second), refreshed like `top`; from the pinned maps of the running agent.
    Top {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
        /// Time between screens, in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..))]
        interval_ms: u64,
        /// Stop after this many screens (0: until interrupted).
        #[arg(long, default_value_t = 0)]
        iterations: u64,
        /// Frontends shown per screen.
        #[arg(long, default_value_t = 20)]
        rows: usize,
    },
    /// Remove all pinned maps and links and sliceway's TC filters: programs detach,
    /// conntrack is dropped. With `--all`, for uninstalling: also put back what the
    /// agent changed on the node.
    Cleanup {
        #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
        /// Leave the node as before sliceway: also restore the sysctls the agent
        /// changed to the values they had before it first changed them, remove the
        /// clsact qdiscs it added (where no other program's filter is on them) and
        /// unmount the file systems it mounted (as recorded under
        /// `<bpffs-dir>/record`), then remove the bpffs directory. Without it the
        /// record is kept, for an agent that starts again (after a layout change).
        #[arg(long)]
        all: bool,
    },
    /// `completions SHELL` and `man`, generated from this definition.
    #[command(flatten)]
    Generate(conventions::clidoc::Generate),
}

pub const DEFAULT_BPFFS_DIR: &str = "/sys/fs/bpf/sliceway";

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(clap::Args)]
pub struct TraceArgs {
    /// Compile this manifest directory with private maps; without it, trace against
    /// the live pinned maps.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Source address: IP, IP:PORT or [IPv6]:PORT, of --dst's family.
    #[arg(long, value_parser = trace_source)]
    pub src: TraceSource,
    /// Destination IP:PORT or [IPv6]:PORT.
    #[arg(long, value_parser = socket_addr)]
    pub dst: SocketAddr,
    #[arg(long, value_enum, default_value_t = Proto::Tcp)]
    pub proto: Proto,
    /// Where the packet arrives: from a pod (a pod-facing interface), from the node
    /// itself (`host`) or from outside the node (`external`, its uplink;
    /// `external-xdp`: an uplink with `--xdp`, the XDP program first and the TC
    /// program for what it leaves).
    #[arg(long, value_enum, default_value_t = From::Pod)]
    pub from: From,
    /// This node's name: its Node object in the directory gives the zone topology
    /// hints are read against; internalTrafficPolicy: Local keeps its endpoints.
    #[arg(long, env = "NODE_NAME")]
    pub node: Option<String>,
    /// Handle Services labelled service.kubernetes.io/service-proxy-name with this
    /// value, as `run` does with the same flag.
    #[arg(long)]
    pub service_proxy_name: Option<String>,
    #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
    pub bpffs_dir: PathBuf,
    #[arg(short, long, value_enum, default_value_t = Output::Json)]
    pub output: Output,
    /// Maglev tables as `run` builds them (same flags).
    #[command(flatten)]
    pub maglev: MaglevArgs,
    /// The uplink's translation as `run` does it (same flag).
    #[command(flatten)]
    pub external: ExternalArgs,
}

/// Maglev consistent hashing for the frontends traffic from outside reaches.
#[derive(clap::Args, Clone, Copy)]
pub struct MaglevArgs {
    /// Entries of the Maglev table of each NodePort, external-IP and load-balancer-IP
    /// frontend (its slots), so every node picks the same backend for a flow: one
    /// of the primes 251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071.
    /// Each table takes this many slots of --max-slots.
    #[arg(long, default_value_t = crate::writer::maglev::TableSize::DEFAULT)]
    pub maglev_table_size: crate::writer::maglev::TableSize,
    /// No Maglev tables: those frontends place their backends as ClusterIPs do (one
    /// slot each, fewest moves on a change), which differs from node to node.
    #[arg(long, conflicts_with = "maglev_table_size")]
    pub no_maglev: bool,
}

/// How the uplink program translates a connection from outside that it does not
/// keep on this node's endpoints (`externalTrafficPolicy: Cluster`).
#[derive(clap::Args, Clone, Copy)]
pub struct ExternalArgs {
    /// `masquerade`: the backend sees the node's address and answers through this
    /// node, as with kube-proxy. `dsr`: direct server return, the backend sees the
    /// client's address; the packet carries the frontend in an IPv4 option (IPv6: a
    /// destination options header) to the backend's node, whose agent (in either mode) records the connection, and the
    /// backend's replies go from there straight to the client with the frontend as
    /// their source (so the node network must let a node send from a frontend's
    /// address).
    /// With Maglev, a connection that arrives at another node later goes on. Not
    /// for SCTP (masqueraded).
    #[arg(long, value_enum, default_value_t = ExternalMode::Masquerade)]
    pub external_mode: ExternalMode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExternalMode {
    Masquerade,
    Dsr,
}

impl ExternalArgs {
    /// The compiler's `dsr` option.
    pub fn dsr(&self) -> bool {
        self.external_mode == ExternalMode::Dsr
    }
}

impl MaglevArgs {
    /// The compiler's `maglev` option.
    pub fn table_size(&self) -> Option<crate::writer::maglev::TableSize> {
        (!self.no_maglev).then_some(self.maglev_table_size)
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

/// Where a traced packet arrives.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum From {
    Pod,
    /// A pod's socket where the agent runs with `--socket-lb-pods`.
    PodSocket,
    Host,
    External,
    ExternalXdp,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// kube-proxy's configuration file: a KubeProxyConfiguration
    /// (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON) as kube-proxy v1.37.2 reads
    /// it, such as the `config.conf` of kubeadm's `kube-proxy` ConfigMap. Its fields
    /// set the flags of the same meaning (`healthzBindAddress`, `hostnameOverride`,
    /// `nodePortAddresses`, `conntrack.*`, `logging`, ...); a flag given on the command
    /// line wins. A field sliceway does not honour is named in a warning; an unknown
    /// field or a malformed value stops the agent.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of Kubernetes YAML (Services, EndpointSlices, Nodes) to take objects
    /// from instead of an API server. Watched for changes.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Kubeconfig for the API server (default: in-cluster config, then KUBECONFIG).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's addresses, comma-separated or repeated, tried in order
    /// when a connection fails (kube-proxy's `--master`, as a list): HOST, HOST:PORT
    /// (6443 when not given), [IPv6]:PORT or https://HOST:PORT. A name is resolved
    /// by the system's resolver (/etc/hosts, then the resolvers of
    /// /etc/resolv.conf), never through a Service. Overrides the server of
    /// --kubeconfig; credentials and CA come from it, or from the pod's service
    /// account.
    #[arg(long = "apiserver", visible_alias = "master", env = "SLICEWAY_APISERVER", value_delimiter = ',', value_parser = apiserver_entry)]
    pub apiserver: Vec<String>,
    /// How long a burst of API changes is collected into one sync, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub batch_delay_ms: u64,
    /// Where /healthz and /livez are served, as kube-proxy's flag: IP:PORT, or an
    /// IP with --healthz-port's port. Every address by default, so that load
    /// balancers and probes from other hosts reach it; only health is served there.
    #[arg(long, default_value_t = BindAddress::IpPort(bind::DEFAULT_HEALTHZ), value_parser = bind::healthz)]
    pub healthz_bind_address: BindAddress,
    /// The health port of a --healthz-bind-address given without one (kube-proxy's
    /// older flag); 0: no health server.
    #[arg(long, default_value_t = bind::HEALTHZ_PORT)]
    pub healthz_port: u16,
    /// Where /metrics (and /audit, on loopback) is served, as kube-proxy's flag:
    /// IP:PORT, or an IP with --metrics-port's port. Loopback by default; set
    /// 0.0.0.0:10249 or [::]:10249 for every address.
    #[arg(long, default_value_t = BindAddress::IpPort(bind::DEFAULT_METRICS), value_parser = bind::metrics)]
    pub metrics_bind_address: BindAddress,
    /// The metrics port of a --metrics-bind-address given without one (kube-proxy's
    /// older flag); 0: no metrics server (and no /audit).
    #[arg(long, default_value_t = bind::METRICS_PORT)]
    pub metrics_port: u16,
    /// Serve /audit on a --metrics-bind-address that is not loopback too. /audit
    /// repairs the service maps and asks for no credentials: without this flag
    /// it is refused (403) there, and the agent says so at start.
    #[arg(long)]
    pub audit_on_non_loopback: bool,
    /// /healthz answers 503 when a change has waited this long for a sync that
    /// writes it (kube-proxy's rule, with twice its 30 s sync period), or a watch of
    /// the API server has failed this long; /livez only on the former.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub healthz_timeout_seconds: u64,
    /// How often the datapath's counters are read into /metrics (also at each scrape).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..))]
    pub counters_interval_ms: u64,
    /// The program counts nothing per frontend or backend (the counting code is
    /// left out of the verified program; `list` and `top` show zeros, /metrics none).
    #[arg(long)]
    pub no_flow_counters: bool,
    /// No per-backend series in /metrics (one per backend of the cluster; the
    /// per-frontend ones stay).
    #[arg(long)]
    pub no_backend_metrics: bool,
    /// How often the service maps are audited for drift and repaired; 0: only when
    /// asked (`sliceway-agent audit`).
    #[arg(long, default_value_t = 60)]
    pub audit_interval_seconds: u64,
    /// Pod-facing interfaces to attach the TC program to, comma-separated: exact
    /// names (must exist at start), glob patterns with `*` and `?` (`veth*`,
    /// `cali*`, `lxc*`), matched again every --interface-scan-interval-ms, or
    /// `auto`: whatever the CNI names them, every veth whose peer is in another
    /// network namespace and every interface the node routes a single pod address
    /// to (within --cluster-cidr when given), never the loopback, a bridge, an
    /// uplink (--external-interfaces) or an interface with a default route.
    #[arg(long, value_delimiter = ',', value_parser = interface_entry)]
    pub interfaces: Vec<String>,
    /// The node's uplinks, comma-separated, as --interfaces: clients outside the
    /// node reach NodePorts, external and load-balancer IPs (and ClusterIPs routed
    /// here) through them, masqueraded to the node's address unless the Service says
    /// `externalTrafficPolicy: Local`; replies of masqueraded connections from other
    /// nodes come back through them. An interface named by both is an uplink.
    #[arg(long, value_delimiter = ',', value_parser = interface_entry)]
    pub external_interfaces: Vec<String>,
    /// kube-proxy's `--masquerade-all`: every new connection of a pod to a ClusterIP
    /// is masqueraded to the node's address (as the uplinks' clients are), whatever
    /// --detect-local-mode says. Not with --socket-lb-pods, which translates pods'
    /// connections at the socket, where no source can be rewritten.
    #[arg(long, conflicts_with = "socket_lb_pods")]
    pub masquerade_all: bool,
    /// kube-proxy's `--cluster-cidr`: the pods' addresses, one CIDR or one of each
    /// family, comma-separated. With --detect-local-mode ClusterCIDR, a new
    /// connection to a ClusterIP arriving on a pod interface from a source outside
    /// them is masqueraded to the node's address.
    #[arg(long, value_name = "CIDR[,CIDR]", value_parser = cluster_cidrs)]
    pub cluster_cidr: Option<ClusterCidrs>,
    /// kube-proxy's `--detect-local-mode`, how traffic from this node's pods is
    /// told apart: `ClusterCIDR` (by source, --cluster-cidr), `InterfaceNamePrefix`
    /// (--pod-interface-name-prefix: the pod interfaces are `PREFIX*` unless
    /// --interfaces names them), `BridgeInterface` (--pod-bridge-interface) and
    /// `NodeCIDR` (by source, this node's pod CIDRs: its Node object's
    /// `spec.podCIDRs`, followed as they change).
    #[arg(long, value_enum, default_value_t = LocalMode::ClusterCidr)]
    pub detect_local_mode: LocalMode,
    /// kube-proxy's `--pod-bridge-interface`, for --detect-local-mode
    /// BridgeInterface: the pods' bridge. The programs attach to the pods' own
    /// interfaces (--interfaces, such as the bridge's veth ports), not to it.
    #[arg(long, value_name = "NAME")]
    pub pod_bridge_interface: Option<String>,
    /// kube-proxy's `--pod-interface-name-prefix`, for --detect-local-mode
    /// InterfaceNamePrefix: the pod interfaces are `PREFIX*` when --interfaces is
    /// not given.
    #[arg(long, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,
    /// Source ports masqueraded connections are given, MIN-MAX: keep them out of
    /// the node's own local port range (`net.ipv4.ip_local_port_range`) and the
    /// NodePort range. Two connections never share a translated tuple; when every
    /// port tried is taken the new connection is dropped (`drop_snat_exhausted`).
    #[arg(long, default_value = "61000-65535", value_parser = snat_ports)]
    pub snat_ports: (u16, u16),
    /// Where NodePorts are served, as kube-proxy's flag: `primary` (the node's
    /// primary address, from its Node object; kube-proxy's nftables default), or
    /// comma-separated CIDRs and the keywords `all` and `localhost` (every address
    /// of the node's interfaces within them; a family given none gets all of its
    /// addresses). Loopback addresses never serve NodePorts.
    #[arg(long, default_value = "primary", value_parser = node_port_addresses)]
    pub nodeport_addresses: NodePortAddresses,
    /// How often to look for new and removed interfaces, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub interface_scan_interval_ms: u64,
    /// This node's name (for internalTrafficPolicy: Local). Also taken as
    /// kube-proxy's `--hostname-override`, and trimmed and lowercased as that is.
    #[arg(long, env = "NODE_NAME", visible_alias = "hostname-override", value_parser = node_name)]
    pub node: Option<String>,
    /// Handle Services labelled service.kubernetes.io/service-proxy-name with this value.
    #[arg(long)]
    pub service_proxy_name: Option<String>,
    /// How often to check the manifest directory, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub poll_interval_ms: u64,
    /// Capacity of the services map (frontends).
    #[arg(long, default_value_t = Limits::default().services)]
    pub max_services: u32,
    /// Capacity of the backends map.
    #[arg(long, default_value_t = Limits::default().backends)]
    pub max_backends: u32,
    /// Capacity of IPv6's frontends map (`SERVICES6`; the names map holds both
    /// families' frontends: --max-services plus this). Preallocated on every node,
    /// IPv4-only ones too: lower it there.
    #[arg(long, default_value_t = crate::writer::Limits6::default().services)]
    pub max_services6: u32,
    /// Capacity of IPv6's backends map (`BACKENDS6`).
    #[arg(long, default_value_t = crate::writer::Limits6::default().backends)]
    pub max_backends6: u32,
    /// Capacity of the slots map (sum of backends over frontends).
    #[arg(long, default_value_t = Limits::default().slots)]
    pub max_slots: u32,
    /// Capacity of the conntrack map (LRU; two entries per connection).
    #[arg(long, default_value_t = Capacities::default().conntrack)]
    pub max_conntrack: u32,
    /// A conntrack idle timeout, STATE=SECONDS (repeatable); states: tcp_syn_sent,
    /// tcp_established, tcp_fin_wait, tcp_time_wait, tcp_close, udp_unreplied,
    /// udp_replied, other. Defaults in the README.
    #[arg(long)]
    pub conntrack_timeout: Vec<String>,
    /// netfilter's conntrack table, sized as kube-proxy sizes it for the traffic
    /// sliceway does not translate: `nf_conntrack_max` raised to this times the node's
    /// CPUs (at least --conntrack-min, at most 1,048,576), and the module's hashsize
    /// to a quarter of it; 0 leaves both as they are. Not the Services' connections:
    /// those are in sliceway's own table (--max-conntrack).
    #[arg(long, default_value_t = crate::kernel::netfilter::Conntrack::default().max_per_core)]
    pub conntrack_max_per_core: u32,
    /// The least `nf_conntrack_max` (see --conntrack-max-per-core).
    #[arg(long, default_value_t = crate::kernel::netfilter::Conntrack::default().min)]
    pub conntrack_min: u32,
    /// netfilter's `nf_conntrack_tcp_timeout_established`, as kube-proxy sets it (a
    /// duration, whole seconds); 0 leaves it as it is.
    #[arg(long, default_value = "24h", value_parser = go_seconds)]
    pub conntrack_tcp_timeout_established: u64,
    /// netfilter's `nf_conntrack_tcp_timeout_close_wait`; 0 leaves it as it is.
    #[arg(long, default_value = "1h", value_parser = go_seconds)]
    pub conntrack_tcp_timeout_close_wait: u64,
    /// Sets netfilter's `nf_conntrack_tcp_be_liberal` to 1, as kube-proxy does with it.
    #[arg(long)]
    pub conntrack_tcp_be_liberal: bool,
    /// netfilter's `nf_conntrack_udp_timeout`; 0 leaves it as it is.
    #[arg(long, default_value = "0", value_parser = go_seconds)]
    pub conntrack_udp_timeout: u64,
    /// netfilter's `nf_conntrack_udp_timeout_stream`; 0 leaves it as it is.
    #[arg(long, default_value = "0", value_parser = go_seconds)]
    pub conntrack_udp_timeout_stream: u64,
    /// Time between rounds of the conntrack sweeper, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub conntrack_sweep_interval_ms: u64,
    /// Conntrack keys the sweeper looks at per round.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub conntrack_sweep_batch: u64,
    /// bpffs directory for pinned maps and links (kept across restarts).
    #[arg(long, default_value = DEFAULT_BPFFS_DIR)]
    pub bpffs_dir: PathBuf,
    /// Do not pin: maps are private and programs detach when the agent exits.
    #[arg(long)]
    pub no_pin: bool,
    /// How the TC program is attached: tcx (Linux 6.6+), a clsact qdisc with a TC
    /// filter (`tc`, any kernel), or `auto`: tcx where the kernel has it.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub attach: AttachMode,
    /// The XDP fast path on the uplinks (--external-interfaces): the uplink
    /// program's decisions made before the kernel builds an skb, over the same maps;
    /// ICMP errors, SCTP and rejects are still decided at TC. `native`: in the
    /// driver, where it has XDP (TC alone elsewhere); `generic`: in the kernel's
    /// receive path (any interface, saves little); `auto`: native, else generic.
    /// Assumes complete checksums, as packets from the wire carry.
    #[arg(long, value_enum, default_value_t = XdpChoice::Off)]
    pub xdp: XdpChoice,
    /// With --xdp: the XDP program forwards what it translated (NodePort,
    /// external-IP and load-balancer connections to backends on other nodes, and
    /// their replies) out of the uplinks it is on, from the kernel's FIB, with
    /// XDP_TX or XDP_REDIRECT, instead of passing it to the stack; what it cannot
    /// finish (no neighbour entry yet, fragments, TTL 1, over the MTU, a route out
    /// of another interface) still goes to the stack. Off by default: forwarded
    /// frames skip netfilter's forward and postrouting hooks, qdiscs and packet
    /// captures on the node.
    #[arg(long, requires = "xdp")]
    pub xdp_forward: bool,
    /// The cgroup (v2) whose processes' sockets reach Services through the socket
    /// programs (connect, sendmsg, recvmsg, getpeername), for the node's own traffic:
    /// node processes, the kubelet, hostNetwork pods. Only sockets of the agent's
    /// network namespace are translated; pods' traffic is translated at TC. `auto`:
    /// the root of the cgroup v2 hierarchy (`/sys/fs/cgroup`, or
    /// `/sys/fs/cgroup/unified` on a hybrid host; mounted at `/run/sliceway/cgroupv2`
    /// where none is). A DIR that holds a cgroup v2 hierarchy at `DIR/unified` (a
    /// hybrid host's root) means that one.
    #[arg(long, default_value = "auto")]
    pub socket_lb_cgroup: PathBuf,
    /// No socket programs: the node's own sockets do not reach ClusterIPs (links an
    /// earlier run pinned are removed).
    #[arg(long)]
    pub no_socket_lb: bool,
    /// Pods' TCP connections too: a pod's connect to a frontend with backends,
    /// without session affinity or source ranges, is translated once at the socket
    /// (as Cilium's socket LB), and its packets go straight to the backend past the
    /// TC program's translation and conntrack; everything else of pods stays with
    /// TC. Off by default: a sidecar proxy that routes by the address the
    /// application connected to (a service mesh) would see the backend's.
    #[arg(long, conflicts_with = "no_socket_lb")]
    pub socket_lb_pods: bool,
    #[command(flatten)]
    pub maglev: MaglevArgs,
    #[command(flatten)]
    pub external: ExternalArgs,
}

impl RunArgs {
    /// Where the health server listens (`--healthz-bind-address` with
    /// `--healthz-port`); `None`: nowhere.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz_bind_address.resolve(self.healthz_port)
    }

    /// Where the metrics server listens (`--metrics-bind-address` with
    /// `--metrics-port`); `None`: nowhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_bind_address.resolve(self.metrics_port)
    }
}

/// A traced packet's source as given: an address, and a port if one was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceSource {
    pub ip: IpAddr,
    pub port: Option<u16>,
}

/// `--src`: `IP`, `IP:PORT`, an IPv6 address alone (bare or in brackets) or
/// `[IPv6]:PORT`.
fn trace_source(s: &str) -> Result<TraceSource, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(TraceSource {
            ip: a.ip(),
            port: Some(a.port()),
        });
    }
    let bare = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    match bare.parse::<IpAddr>() {
        Ok(ip) if bare == s || ip.is_ipv6() => Ok(TraceSource { ip, port: None }),
        _ => Err(format!(
            "{s:?}: expected IP, IP:PORT or [IPv6]:PORT, such as 10.244.1.2, \
             10.244.1.2:40000, fd00:244::2 or [fd00:244::2]:40000"
        )),
    }
}

/// A Go duration (`24h`, `1h30m`, `0`) in whole seconds, truncated as kube-proxy
/// truncates it (`int(d / time.Second)`); never negative.
fn go_seconds(s: &str) -> Result<u64, String> {
    let ns = super::config::parse_go_duration(s)?;
    if ns < 0 {
        return Err(format!("{s:?}: must be greater than or equal to 0"));
    }
    u64::try_from(ns / 1_000_000_000).map_err(|_| format!("{s:?}: too long"))
}

/// `IP:PORT` or `[IPv6]:PORT`.
fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        format!("{s:?}: expected IP:PORT or [IPv6]:PORT, such as 10.96.0.10:80 or [fd00::10]:80")
    })
}

/// `MIN-MAX`, 1024 <= MIN <= MAX.
fn snat_ports(s: &str) -> Result<(u16, u16), String> {
    let (min, max) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected MIN-MAX, such as 61000-65535"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .map_err(|e| format!("{p:?} is not a port: {e}"))
    };
    let (min, max) = (port(min)?, port(max)?);
    if min < 1024 || min > max {
        return Err(format!(
            "{s:?}: the range must be within 1024-65535 and MIN <= MAX"
        ));
    }
    Ok((min, max))
}

fn node_port_addresses(s: &str) -> Result<NodePortAddresses, String> {
    NodePortAddresses::parse(s)
}

/// `--node` (`--hostname-override`): trimmed and lowercased, as kube-proxy's
/// `processHostnameOverrideFlag`; only spaces is refused. Empty stays empty.
fn node_name(s: &str) -> Result<String, String> {
    let name = s.trim();
    if name.is_empty() && !s.is_empty() {
        return Err("an empty node name is invalid".into());
    }
    Ok(name.to_lowercase())
}

/// kube-proxy's `--detect-local-mode` values
/// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/types.go).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LocalMode {
    #[default]
    #[value(name = "ClusterCIDR")]
    ClusterCidr,
    #[value(name = "NodeCIDR")]
    NodeCidr,
    #[value(name = "BridgeInterface")]
    BridgeInterface,
    #[value(name = "InterfaceNamePrefix")]
    InterfaceNamePrefix,
}

/// `--cluster-cidr`: none, one CIDR, or one of each family, as (network address,
/// prefix length) with the host bits cleared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterCidrs(pub Vec<(IpAddr, u8)>);

/// `--cluster-cidr`'s value, checked as kube-proxy's validation checks
/// `clusterCIDR` ([`crate::cmd::config::parse_cluster_cidrs`]).
fn cluster_cidrs(s: &str) -> Result<ClusterCidrs, String> {
    crate::cmd::config::parse_cluster_cidrs(s).map(ClusterCidrs)
}

/// How the agent tells traffic from this node's pods apart, and which of it it
/// masquerades: the flags `--masquerade-all`, `--cluster-cidr`,
/// `--detect-local-mode` and its two companions, checked together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalDetection {
    /// Every pod's connection to a ClusterIP is masqueraded.
    pub masquerade_all: bool,
    /// A pod interface's connection to a ClusterIP from outside these is
    /// masqueraded (ClusterCIDR mode with --cluster-cidr); empty: none is.
    pub local_cidrs: Vec<(IpAddr, u8)>,
    /// NodeCIDR mode: the local CIDRs are this node's pod CIDRs, read from its Node
    /// object (`spec.podCIDRs`) as they change; `local_cidrs` is empty.
    pub from_node: bool,
    /// The pod interfaces InterfaceNamePrefix selects (`PREFIX*`), when
    /// --interfaces names none.
    pub interfaces: Option<String>,
    /// What of the flags is taken differently from kube-proxy, to be said once.
    pub notes: Vec<String>,
}

impl RunArgs {
    /// The flags of local-traffic detection, checked together as kube-proxy's
    /// `getLocalDetectors` takes them
    /// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/server_linux.go):
    /// a mode that needs its companion flag without it is an error.
    pub fn local_detection(&self) -> Result<LocalDetection, String> {
        let mut out = LocalDetection {
            masquerade_all: self.masquerade_all,
            ..LocalDetection::default()
        };
        match self.detect_local_mode {
            LocalMode::ClusterCidr => {
                out.local_cidrs = self.cluster_cidr.clone().unwrap_or_default().0;
            }
            // The node's pod CIDRs come with its Node object, and follow it.
            LocalMode::NodeCidr => out.from_node = true,
            LocalMode::BridgeInterface => {
                let bridge = self.pod_bridge_interface.as_deref().unwrap_or("").trim();
                if bridge.is_empty() {
                    return Err("--detect-local-mode BridgeInterface needs \
                                --pod-bridge-interface (the pods' bridge)"
                        .into());
                }
                out.notes.push(format!(
                    "--detect-local-mode BridgeInterface: the programs attach to the pods' \
                     own interfaces (--interfaces, such as {bridge}'s veth ports), not to \
                     the bridge"
                ));
            }
            LocalMode::InterfaceNamePrefix => {
                let prefix = self
                    .pod_interface_name_prefix
                    .as_deref()
                    .unwrap_or("")
                    .trim();
                if prefix.is_empty() {
                    return Err("--detect-local-mode InterfaceNamePrefix needs \
                                --pod-interface-name-prefix"
                        .into());
                }
                let pattern = format!("{prefix}*");
                Selection::parse(&[&pattern])
                    .map_err(|e| format!("--pod-interface-name-prefix {prefix:?}: {e}"))?;
                if self.interfaces.is_empty() {
                    out.interfaces = Some(pattern);
                }
            }
        }
        Ok(out)
    }
}

/// One `--apiserver` entry, checked as [`crate::source::apiserver::parse_endpoint`]
/// takes it.
fn apiserver_entry(entry: &str) -> Result<String, String> {
    crate::source::apiserver::parse_endpoint(entry)?;
    Ok(entry.trim().to_string())
}

/// One `--interfaces` entry, checked as [`Selection::parse`] will take it.
fn interface_entry(entry: &str) -> Result<String, SelectionError> {
    Selection::parse(&[entry])?;
    Ok(entry.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_args(extra: &[&str]) -> Result<TraceArgs, clap::Error> {
        let mut args = vec!["sliceway-agent", "trace"];
        args.extend_from_slice(extra);
        match Cli::try_parse_from(args)?.command {
            Command::Trace(t) => Ok(t),
            _ => unreachable!("parsed as trace"),
        }
    }

    /// Issue 12: `trace` takes IPv6 destinations and sources, bracketed with a port.
    #[test]
    fn trace_takes_both_families() {
        let t = trace_args(&["--src", "10.244.1.2", "--dst", "10.96.0.10:80"]).unwrap();
        assert_eq!(t.dst, "10.96.0.10:80".parse::<SocketAddr>().unwrap());
        let v4: IpAddr = "10.244.1.2".parse().unwrap();
        assert_eq!(t.src, TraceSource { ip: v4, port: None });
        let t = trace_args(&["--src", "[fd00:244::2]:41000", "--dst", "[fd00::10]:80"]).unwrap();
        assert_eq!(t.dst, "[fd00::10]:80".parse::<SocketAddr>().unwrap());
        let v6: IpAddr = "fd00:244::2".parse().unwrap();
        assert_eq!(
            t.src,
            TraceSource {
                ip: v6,
                port: Some(41000)
            }
        );
        for bare in ["fd00:244::2", "[fd00:244::2]"] {
            let t = trace_args(&["--src", bare, "--dst", "[fd00::10]:80"]).unwrap();
            assert_eq!(t.src, TraceSource { ip: v6, port: None }, "{bare}");
        }
    }

    /// A malformed `--src` or `--dst` is refused with the forms it takes.
    #[test]
    fn trace_refuses_malformed_addresses_with_the_expected_form() {
        for (src, dst, wanted) in [
            (
                "10.244.1.2",
                "fd00::10:80",
                "expected IP:PORT or [IPv6]:PORT",
            ),
            (
                "10.244.1.2",
                "10.96.0.10",
                "expected IP:PORT or [IPv6]:PORT",
            ),
            (
                "10.244.1.2",
                "[fd00::10]",
                "expected IP:PORT or [IPv6]:PORT",
            ),
            (
                "[10.244.1.2]",
                "10.96.0.10:80",
                "expected IP, IP:PORT or [IPv6]:PORT",
            ),
            (
                "pod-a",
                "10.96.0.10:80",
                "expected IP, IP:PORT or [IPv6]:PORT",
            ),
            (
                "fd00::2]:80",
                "[fd00::10]:80",
                "expected IP, IP:PORT or [IPv6]:PORT",
            ),
        ] {
            let err = trace_args(&["--src", src, "--dst", dst])
                .err()
                .unwrap_or_else(|| panic!("{src} {dst} parsed"))
                .to_string();
            assert!(err.contains(wanted), "{src} {dst}: {err}");
        }
    }

    /// `conntrack --flush-backend` takes an IPv6 backend too.
    #[test]
    fn flush_backend_takes_both_families() {
        for backend in ["10.244.1.2:8080", "[fd00:244:1::60]:8080"] {
            let cli =
                Cli::try_parse_from(["sliceway-agent", "conntrack", "--flush-backend", backend])
                    .unwrap();
            let Command::Conntrack { flush_backend, .. } = cli.command else {
                unreachable!("parsed as conntrack");
            };
            assert_eq!(flush_backend, Some(backend.parse().unwrap()));
        }
    }

    fn run_args(extra: &[&str]) -> RunArgs {
        let mut args = vec!["sliceway-agent", "run"];
        args.extend_from_slice(extra);
        match Cli::try_parse_from(args).unwrap().command {
            Command::Run(r) => *r,
            _ => unreachable!("parsed as run"),
        }
    }

    /// Issue 47: health and metrics on kube-proxy's defaults, health on every
    /// address and metrics on loopback; `audit` asks where metrics are.
    #[test]
    fn health_and_metrics_default_to_kube_proxys_addresses() {
        let run = run_args(&[]);
        assert_eq!(run.healthz_addr(), Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(run.metrics_addr(), Some("127.0.0.1:10249".parse().unwrap()));
        assert!(!run.audit_on_non_loopback);
        let Command::Audit {
            metrics_bind_address,
            ..
        } = Cli::try_parse_from(["sliceway-agent", "audit"])
            .unwrap()
            .command
        else {
            unreachable!("parsed as audit");
        };
        assert_eq!(metrics_bind_address, "127.0.0.1:10249".parse().unwrap());
    }

    /// kube-proxy's forms: IP:PORT, an IP with the port flag, port 0 for none.
    #[test]
    fn bind_addresses_take_kube_proxys_forms() {
        let run = run_args(&[
            "--healthz-bind-address=10.0.0.1",
            "--healthz-port=8080",
            "--metrics-bind-address=[::]:9100",
        ]);
        assert_eq!(run.healthz_addr(), Some("10.0.0.1:8080".parse().unwrap()));
        assert_eq!(run.metrics_addr(), Some("[::]:9100".parse().unwrap()));
        let run = run_args(&["--healthz-port=0", "--metrics-port=0"]);
        assert_eq!((run.healthz_addr(), run.metrics_addr()), (None, None));
        let err = Cli::try_parse_from(["sliceway-agent", "run", "--metrics-bind-address=10249"])
            .err()
            .expect("a port alone is not an address")
            .to_string();
        assert!(err.contains("expected IP or IP:PORT"), "{err}");
    }

    /// Issue 47: the generated man page and shell completions name every subcommand.
    #[test]
    fn man_page_and_completions_name_the_subcommands() {
        use clap::CommandFactory as _;
        let cmd = Cli::command();
        let names = conventions::clidoc::subcommand_names(&cmd);
        for name in [
            "run",
            "list",
            "trace",
            "audit",
            "cleanup",
            "completions",
            "man",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        conventions::clidoc::check_names_subcommands(&cmd).unwrap();
    }
}

//! The node lab: a Kubernetes node built from network namespaces, for end-to-end
//! tests and the demo.
//!
//! ```text
//!   client pod ──veth── node ──veth── backend pods (3, each answering with its name)
//!   (ns PREFIX-c1)      (ns PREFIX-node: the agent attaches here, on v*)
//! ```
//!
//! Every namespace carries a prefix unique to the process, and no namespace has a
//! link to the root namespace: test traffic cannot leave the lab. Namespaces are
//! deleted on drop, on panic too; leftovers of killed runs are removed at start.
//! Namespaces are entered with `setns` (threads) or `nsenter --net` (processes),
//! never `ip netns exec`, which remounts `/sys` and hides `/sys/fs/bpf`.

pub mod cluster;
pub mod datapath_model;
pub mod fuzz;
pub mod http_load;
pub mod netns;
pub mod nodes;
pub mod servers;

use std::{
    fs,
    io::{BufRead, BufReader},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

pub use netns::{in_netns, Netns};
pub use servers::{BackendServers, Reply};

/// Port the backend servers listen on (TCP and UDP).
pub const BACKEND_PORT: u16 = 8080;

/// How long an agent may take to load, attach and sync once: a second or two on a
/// machine of its own, so [`AGENT_START_DEFAULT`] is far more than that. Under the VM
/// tier's software emulation, with two agents loading at once (each verifies the
/// programs and allocates its per-CPU counters), starts took over 90 s on CI's
/// host, so the tier's guest sets `SLICEWAY_AGENT_START_SECS` (see
/// `cargo xtask test-vm`). A budget only: a test waits as long as its agent takes.
pub fn agent_start() -> Duration {
    agent_start_from(std::env::var("SLICEWAY_AGENT_START_SECS").ok().as_deref())
}

/// [`agent_start`] for a value of `SLICEWAY_AGENT_START_SECS`: whole seconds, or
/// the default when unset; a value that is not a number is reported and ignored.
pub fn agent_start_from(value: Option<&str>) -> Duration {
    match value.map(|v| v.trim().parse::<u64>()) {
        None => AGENT_START_DEFAULT,
        Some(Ok(secs)) if secs > 0 => Duration::from_secs(secs),
        Some(_) => {
            eprintln!(
                "SLICEWAY_AGENT_START_SECS={:?} is not a positive number of seconds; \
                 using {AGENT_START_DEFAULT:?}",
                value.unwrap_or_default()
            );
            AGENT_START_DEFAULT
        }
    }
}

/// [`agent_start`] when `SLICEWAY_AGENT_START_SECS` is not set.
pub const AGENT_START_DEFAULT: Duration = Duration::from_secs(90);

/// A pod: its namespace, its address, and the node-side interface it hangs off.
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub ns: String,
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address in a dual-stack lab ([`Lab::dual_stack`]).
    pub ip6: Option<Ipv6Addr>,
    pub node_iface: String,
}

/// A node with one client pod and `n` backend pods.
pub struct Lab {
    pub prefix: String,
    pub node: Netns,
    pub client: Pod,
    pub backends: Vec<Pod>,
    pods: Vec<Netns>,
    pub manifests: PathBuf,
    /// bpffs directory the lab's agents pin under; removed on drop.
    pub bpffs: PathBuf,
    servers: Option<BackendServers>,
    /// Servers of backends added after the lab was built, by pod namespace.
    added_servers: Vec<(String, BackendServers)>,
    /// Whether the pods' interfaces keep veth's TX checksum offload.
    pod_offload: bool,
    /// Whether pods get an IPv6 address beside their IPv4 one.
    dual_stack: bool,
    /// More arguments for the agents the lab starts (`--attach tc`, say).
    pub agent_args: Vec<String>,
}

/// Prefix of every namespace a lab makes.
pub const NS_PREFIX: &str = "slw";

impl Lab {
    /// Builds the namespaces, links and addresses, and starts a server in each backend.
    /// TX checksum offload is off everywhere, so every packet carries a full checksum
    /// that the receiver verifies.
    pub fn new(backends: usize) -> Result<Self> {
        Self::build(backends, false, false)
    }

    /// Like [`Lab::new`], but the pods send as they do in a cluster: veth's TX
    /// checksum offload stays on in the pods, so their packets reach the node's
    /// programs with a partial checksum (only the pseudo-header sum in the L4
    /// checksum field). The node's interfaces keep offload off, so the kernel
    /// completes the checksum in software when it forwards a packet, and the
    /// receiving pod verifies it: a wrong update of the partial checksum is caught.
    pub fn with_pod_checksum_offload(backends: usize) -> Result<Self> {
        Self::build(backends, true, false)
    }

    /// Like [`Lab::new`], with pods of both families, as a dual-stack cluster has
    /// them: each pod also gets `fd00:10:244:N::2/64` (its node side `::1`) and a
    /// default IPv6 route through the node, which forwards IPv6. With `pod_offload`,
    /// the pods keep veth's TX checksum offload ([`Lab::with_pod_checksum_offload`]).
    pub fn dual_stack(backends: usize, pod_offload: bool) -> Result<Self> {
        Self::build(backends, pod_offload, true)
    }

    fn build(backends: usize, pod_offload: bool, dual_stack: bool) -> Result<Self> {
        netns::remove_stale(NS_PREFIX);
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let prefix = format!("{NS_PREFIX}-{}-{n}", std::process::id());
        let node = Netns::create(&format!("{prefix}-node"))?;
        let manifests = std::env::temp_dir().join(format!("{prefix}-manifests"));
        let _ = fs::remove_dir_all(&manifests);
        fs::create_dir_all(&manifests)?;
        let mut lab = Lab {
            prefix: prefix.clone(),
            node,
            client: Pod {
                name: String::new(),
                ns: String::new(),
                ip: Ipv4Addr::UNSPECIFIED,
                ip6: None,
                node_iface: String::new(),
            },
            backends: Vec::new(),
            pods: Vec::new(),
            manifests,
            bpffs: PathBuf::from(format!("/sys/fs/bpf/{prefix}")),
            servers: None,
            added_servers: Vec::new(),
            pod_offload,
            dual_stack,
            agent_args: Vec::new(),
        };
        node_sysctls(&lab.node.name)?;
        if dual_stack {
            netns::nsenter(
                &lab.node.name,
                "sysctl",
                &["-qw", "net.ipv6.conf.all.forwarding=1"],
            )?;
            no_dad(&lab.node.name)?;
        }
        lab.client = lab.add_pod("client", 1)?;
        for i in 0..backends {
            let pod = lab.add_pod(&format!("backend-{}", i + 1), 11 + i as u8)?;
            lab.backends.push(pod);
        }
        lab.servers = Some(BackendServers::start(&lab.backends, BACKEND_PORT)?);
        Ok(lab)
    }

    /// A pod namespace linked to the node by a veth pair; pod address 10.244.N.2/24,
    /// node side 10.244.N.1/24, default route via the node.
    fn add_pod(&mut self, name: &str, subnet: u8) -> Result<Pod> {
        self.add_pod_on(name, subnet, &format!("v{subnet}"))
    }

    /// [`Lab::add_pod`] with the node's side of the pair named `node_iface`, as a
    /// CNI names it (`eni…`, `cali…`, `lxc…`); no server runs in it.
    pub fn add_pod_on(&mut self, name: &str, subnet: u8, node_iface: &str) -> Result<Pod> {
        let ns = Netns::create(&format!("{}-{name}", self.prefix))?;
        if self.dual_stack {
            no_dad(&ns.name)?;
        }
        let node_iface = node_iface.to_string();
        let pod_ip = Ipv4Addr::new(10, 244, subnet, 2);
        let node_ip = Ipv4Addr::new(10, 244, subnet, 1);
        // Both ends are created directly inside their namespaces.
        netns::veth_pair(&node_iface, &self.node.name, &ns.name)?;
        self.node.run(
            "ip",
            &["addr", "add", &format!("{node_ip}/24"), "dev", &node_iface],
        )?;
        self.node.run("ip", &["link", "set", &node_iface, "up"])?;
        // veth's TX checksum offload would hide checksum bugs: compute them in full.
        // (Pods may keep it: see `with_pod_checksum_offload`.)
        self.node
            .run("ethtool", &["-K", &node_iface, "tx", "off"])?;
        ns.run(
            "ip",
            &["addr", "add", &format!("{pod_ip}/24"), "dev", "eth0"],
        )?;
        ns.run("ip", &["link", "set", "lo", "up"])?;
        ns.run("ip", &["link", "set", "eth0", "up"])?;
        ns.run(
            "ip",
            &["route", "add", "default", "via", &node_ip.to_string()],
        )?;
        if !self.pod_offload {
            ns.run("ethtool", &["-K", "eth0", "tx", "off"])?;
        }
        let ip6 = if self.dual_stack {
            Some(pod_ipv6(
                &self.node,
                &node_iface,
                &ns,
                &format!("fd00:10:244:{subnet}"),
            )?)
        } else {
            None
        };
        let pod = Pod {
            name: name.to_string(),
            ns: ns.name.clone(),
            ip: pod_ip,
            ip6,
            node_iface,
        };
        self.pods.push(ns);
        Ok(pod)
    }

    /// Adds a backend pod (with its server) to a built lab, as a CNI does when a pod
    /// starts: `backend-N` on interface `v1N`, N one more than the backends there are.
    /// A backend removed with [`Lab::remove_backend`] comes back under the same names.
    pub fn add_backend(&mut self) -> Result<Pod> {
        let n = self.backends.len();
        let pod = self.add_pod(&format!("backend-{}", n + 1), 11 + n as u8)?;
        let server = BackendServers::start(std::slice::from_ref(&pod), BACKEND_PORT)?;
        self.added_servers.push((pod.ns.clone(), server));
        self.backends.push(pod.clone());
        Ok(pod)
    }

    /// Removes the last backend pod, as a CNI does when a pod is deleted: its server
    /// stops, its node-side interface is deleted, its namespace goes.
    pub fn remove_backend(&mut self) -> Result<Pod> {
        let pod = self.backends.pop().context("no backend to remove")?;
        self.added_servers.retain(|(ns, _)| ns != &pod.ns);
        self.node.run("ip", &["link", "del", &pod.node_iface])?;
        self.pods.retain(|ns| ns.name != pod.ns);
        Ok(pod)
    }

    /// Starts SCTP servers in every backend on [`BACKEND_PORT`] (the kernel must
    /// have SCTP: `sliceway_agent::kernel::probe_sctp`).
    pub fn start_sctp_servers(&mut self) -> Result<()> {
        for pod in &self.backends {
            let server = BackendServers::start_sctp(std::slice::from_ref(pod), BACKEND_PORT)?;
            self.added_servers.push((pod.ns.clone(), server));
        }
        Ok(())
    }

    /// One SCTP request from the client pod: the answering backend.
    pub fn sctp_request(&self, vip: SocketAddrV4) -> Result<Reply> {
        in_netns(&self.client.ns, move || {
            servers::sctp_request(vip, Duration::from_secs(3))
        })?
    }

    /// Node-side interfaces of all pods: where the agent attaches.
    pub fn pod_interfaces(&self) -> Vec<String> {
        std::iter::once(&self.client)
            .chain(&self.backends)
            .map(|p| p.node_iface.clone())
            .collect()
    }

    /// Writes a manifest file into the lab's manifest directory (atomically).
    pub fn write_manifest(&self, file: &str, yaml: &str) -> Result<()> {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        fs::write(&tmp, yaml)?;
        fs::rename(&tmp, self.manifests.join(file))?;
        Ok(())
    }

    pub fn remove_manifest(&self, file: &str) -> Result<()> {
        fs::remove_file(self.manifests.join(file))?;
        Ok(())
    }

    /// Starts the agent in the node namespace, on the pods' interfaces, and waits for
    /// its first sync.
    pub fn start_agent(&self) -> Result<Agent> {
        let bin = workspace_binary("sliceway-agent")?;
        self.start_manifests_agent(&bin, &self.pod_interfaces())
    }

    /// [`Lab::start_agent`] with another build of the agent (an older release, for
    /// upgrade tests).
    pub fn start_agent_binary(&self, bin: &Path) -> Result<Agent> {
        self.start_manifests_agent(bin, &self.pod_interfaces())
    }

    /// Starts the agent in the node namespace with `--interfaces` built from
    /// `interfaces` (exact names or patterns), and waits for its first sync.
    pub fn start_agent_with(&self, interfaces: &[&str]) -> Result<Agent> {
        let bin = workspace_binary("sliceway-agent")?;
        let interfaces: Vec<String> = interfaces.iter().map(|s| s.to_string()).collect();
        self.start_manifests_agent(&bin, &interfaces)
    }

    /// The agent at `bin` on the lab's manifest directory and `interfaces`, with the
    /// lab's extra arguments; waits for its first sync.
    fn start_manifests_agent(&self, bin: &Path, interfaces: &[String]) -> Result<Agent> {
        let source = [
            "--manifests".into(),
            self.manifests.clone().into_os_string(),
        ];
        let agent = Agent::start_binary(
            bin,
            &self.node.name,
            &source,
            interfaces,
            &self.bpffs,
            &self.agent_args,
        )?;
        agent.wait_for_sync(1, agent_start())?;
        Ok(agent)
    }

    /// A cgroup of the lab's own for pod processes, with the lab's agents set to put
    /// their socket programs on it and translate pods' TCP connects there
    /// (`--socket-lb-pods`); requests from it through [`PodCgroup::requests`].
    pub fn socket_lb_pods(&mut self) -> Result<PodCgroup> {
        let cgroup = PodCgroup::new(&self.prefix)?;
        self.agent_args.extend([
            "--socket-lb-pods".into(),
            "--socket-lb-cgroup".into(),
            cgroup.dir.to_string_lossy().into_owned(),
        ]);
        Ok(cgroup)
    }

    /// One TCP request from the pod namespace `ns`: the answering backend.
    pub fn tcp_request_from(&self, ns: &str, vip: impl Into<SocketAddr>) -> Result<Reply> {
        let vip = vip.into();
        in_netns(ns, move || {
            servers::tcp_request(vip, Duration::from_secs(2))
        })?
    }

    /// Another pod namespace of this lab (deleted with it), `PREFIX-name`.
    pub fn extra_netns(&mut self, name: &str) -> Result<String> {
        let ns = Netns::create(&format!("{}-{name}", self.prefix))?;
        let n = ns.name.clone();
        self.pods.push(ns);
        Ok(n)
    }

    /// One TCP request from the client pod: the answering backend.
    pub fn tcp_request(&self, vip: impl Into<SocketAddr>) -> Result<Reply> {
        let vip = vip.into();
        in_netns(&self.client.ns, move || {
            servers::tcp_request(vip, Duration::from_secs(2))
        })?
    }

    /// SYNs the client pod's kernel has retransmitted so far (`TCPSynRetrans` of its
    /// network namespace). The datapath tracks a retransmitted SYN as a new
    /// connection on its tuple, so counts of new connections allow one more for each.
    pub fn syn_retransmits(&self) -> Result<u64> {
        in_netns(&self.client.ns, || -> Result<u64> {
            // thread-self: /proc/net follows the process's first thread, not this one.
            let text = std::fs::read_to_string("/proc/thread-self/net/netstat")?;
            nodes::tcp_ext(&text, "TCPSynRetrans")
        })?
    }

    /// One UDP request from the client pod: the answering backend.
    pub fn udp_request(&self, vip: impl Into<SocketAddr>) -> Result<Reply> {
        let vip = vip.into();
        in_netns(&self.client.ns, move || {
            servers::udp_request(vip, Duration::from_secs(1))
        })?
    }

    /// A TCP transfer of `bytes` from a backend to the client through `vip`; checks
    /// every byte and returns the backend.
    pub fn tcp_stream(&self, vip: impl Into<SocketAddr>, bytes: usize) -> Result<Reply> {
        let vip = vip.into();
        in_netns(&self.client.ns, move || {
            servers::tcp_stream(vip, bytes, Duration::from_secs(20))
        })?
    }

    /// A Service with one TCP and one UDP port and an EndpointSlice for `backends`
    /// (by index into `self.backends`), as ordinary Kubernetes YAML.
    pub fn service_yaml(&self, name: &str, vip: Ipv4Addr, port: u16, backends: &[usize]) -> String {
        let mut eps = String::new();
        for &i in backends {
            let pod = &self.backends[i];
            eps.push_str(&format!(
                "  - addresses: [\"{}\"]\n    conditions: {{ready: true}}\n    nodeName: node-1\n    targetRef: {{kind: Pod, namespace: default, name: {}}}\n",
                pod.ip, pod.name
            ));
        }
        if backends.is_empty() {
            eps.push_str("  []\n");
        }
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: ClusterIP\n  clusterIP: {vip}\n  clusterIPs: [{vip}]\n  selector: {{app: {name}}}\n  ports:\n  - {{name: http, port: {port}, protocol: TCP, targetPort: {BACKEND_PORT}}}\n  - {{name: dns, port: {port}, protocol: UDP, targetPort: {BACKEND_PORT}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abcde\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\n    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io\naddressType: IPv4\nports:\n- {{name: http, port: {BACKEND_PORT}, protocol: TCP}}\n- {{name: dns, port: {BACKEND_PORT}, protocol: UDP}}\nendpoints:\n{eps}"
        )
    }
}

impl Lab {
    /// A network namespace one hop behind backend pod `pod`, for path-MTU tests: the
    /// pod routes to it over a link whose pod end has MTU `mtu`, the far end keeps
    /// 1,500 (so it offers full-size segments), and the node routes to it through
    /// the pod. On 10.244.111.0/24, or fd00:10:244:111::/64 with `v6`. Returns the
    /// namespace (deleted on drop) and the address of the far end.
    pub fn server_behind(
        &self,
        pod: &Pod,
        v6: bool,
        mtu: u16,
    ) -> Result<(Netns, std::net::IpAddr)> {
        let far = Netns::create(&format!("{}-far", self.prefix))?;
        netns::ip(&[
            "link", "add", "far0", "netns", &pod.ns, "type", "veth", "peer", "name", "eth0",
            "netns", &far.name,
        ])?;
        let mtu = mtu.to_string();
        let (net, router, far_ip, via) = if v6 {
            let via = pod
                .ip6
                .context("the pod has no IPv6 address (a dual-stack lab)")?;
            (
                "fd00:10:244:111::/64",
                "fd00:10:244:111::1/64",
                "fd00:10:244:111::2",
                via.to_string(),
            )
        } else {
            (
                "10.244.111.0/24",
                "10.244.111.1/24",
                "10.244.111.2",
                pod.ip.to_string(),
            )
        };
        let (family, forwarding, nodad): (&[&str], _, &[&str]) = if v6 {
            (&["-6"], "net.ipv6.conf.all.forwarding=1", &["nodad"])
        } else {
            (&[], "net.ipv4.ip_forward=1", &[])
        };
        let far_prefix = format!("{far_ip}/{}", if v6 { 64 } else { 24 });
        let router_ip = router.split('/').next().unwrap_or_default();
        let in_pod: [Vec<&str>; 4] = [
            vec!["sysctl", "-qw", forwarding],
            [
                &["ip"],
                family,
                &["addr", "add", router, "dev", "far0"],
                nodad,
            ]
            .concat(),
            vec!["ip", "link", "set", "far0", "mtu", &mtu, "up"],
            vec!["ethtool", "-K", "far0", "tx", "off"],
        ];
        for cmd in &in_pod {
            netns::nsenter(&pod.ns, cmd[0], &cmd[1..])?;
        }
        let in_far: [Vec<&str>; 5] = [
            vec!["sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0"],
            [
                &["ip"],
                family,
                &["addr", "add", &far_prefix, "dev", "eth0"],
                nodad,
            ]
            .concat(),
            vec!["ip", "link", "set", "eth0", "up"],
            vec!["ethtool", "-K", "eth0", "tx", "off"],
            [
                &["ip"],
                family,
                &["route", "add", "default", "via", router_ip],
            ]
            .concat(),
        ];
        for cmd in &in_far {
            far.run(cmd[0], &cmd[1..])?;
        }
        self.node.run(
            "ip",
            &[family, &["route", "add", net, "via", &via]].concat(),
        )?;
        Ok((far, far_ip.parse()?))
    }

    /// A Service of the families of `vips` (one ClusterIP each, the first the
    /// primary, as the API server orders `clusterIPs` and `ipFamilies`) with one TCP
    /// and one UDP port, and one EndpointSlice per family for `backends`, as the
    /// EndpointSlice controller writes them: a dual-stack Service with
    /// `ipFamilyPolicy: RequireDualStack`, a single one `SingleStack`.
    pub fn service_yaml_families(
        &self,
        name: &str,
        vips: &[std::net::IpAddr],
        port: u16,
        backends: &[usize],
    ) -> Result<String> {
        let family = |ip: &std::net::IpAddr| if ip.is_ipv4() { "IPv4" } else { "IPv6" };
        let ips: Vec<String> = vips.iter().map(|ip| ip.to_string()).collect();
        let families: Vec<&str> = vips.iter().map(family).collect();
        let policy = if vips.len() > 1 {
            "RequireDualStack"
        } else {
            "SingleStack"
        };
        let mut yaml = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  type: ClusterIP\n  clusterIP: {}\n  clusterIPs: [{}]\n  ipFamilies: [{}]\n  ipFamilyPolicy: {policy}\n  selector: {{app: {name}}}\n  ports:\n  - {{name: http, port: {port}, protocol: TCP, targetPort: {BACKEND_PORT}}}\n  - {{name: dns, port: {port}, protocol: UDP, targetPort: {BACKEND_PORT}}}\n",
            ips.first().context("a Service needs a ClusterIP")?,
            ips.join(", "),
            families.join(", "),
        );
        for ip in vips {
            let mut eps = String::new();
            for &i in backends {
                let pod = &self.backends[i];
                let addr = if ip.is_ipv4() {
                    pod.ip.to_string()
                } else {
                    pod.ip6
                        .context("an IPv6 endpoint needs a dual-stack lab")?
                        .to_string()
                };
                eps.push_str(&format!(
                    "  - addresses: [\"{addr}\"]\n    conditions: {{ready: true}}\n    nodeName: node-1\n    targetRef: {{kind: Pod, namespace: default, name: {}}}\n",
                    pod.name
                ));
            }
            if backends.is_empty() {
                eps.push_str("  []\n");
            }
            let fam = family(ip);
            yaml.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-{}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\n    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io\naddressType: {fam}\nports:\n- {{name: http, port: {BACKEND_PORT}, protocol: TCP}}\n- {{name: dns, port: {BACKEND_PORT}, protocol: UDP}}\nendpoints:\n{eps}",
                fam.to_lowercase()
            ));
        }
        Ok(yaml)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.servers.take();
        self.added_servers.clear();
        // Unpinning the links detaches the programs; then the namespaces go.
        let _ = fs::remove_dir_all(&self.bpffs);
        self.pods.clear();
        let _ = fs::remove_dir_all(&self.manifests);
    }
}

/// No duplicate address detection on the interfaces made in `ns` from now on
/// (before they are made: each copies the namespace's defaults). Without it, an
/// interface's link-local address is tentative for its first second, and until then
/// the kernel sends no neighbour solicitation for packets it forwards out of it
/// (it has no source address for one): the first datagrams through a new pod's
/// interface would wait a second or more, longer than a UDP request's timeout.
/// Addresses added with `nodad` are usable at once, link-local ones are not.
/// Gives a pod IPv6 beside IPv4: `{net}::2/64` on its `eth0`, `{net}::1/64` on the
/// node's end `node_iface`, a default route through the node; `nodad`, so the
/// addresses are usable at once, not tentative for a second. The pod's address.
pub(crate) fn pod_ipv6(node: &Netns, node_iface: &str, pod: &Netns, net: &str) -> Result<Ipv6Addr> {
    let (pod_ip6, gw6) = (format!("{net}::2"), format!("{net}::1"));
    for (ns, addr, dev) in [(node, &gw6, node_iface), (pod, &pod_ip6, "eth0")] {
        let cidr = format!("{addr}/64");
        ns.run("ip", &["-6", "addr", "add", &cidr, "dev", dev, "nodad"])?;
    }
    pod.run("ip", &["-6", "route", "add", "default", "via", &gw6])?;
    Ok(pod_ip6.parse()?)
}

pub(crate) fn no_dad(ns: &str) -> Result<()> {
    for key in [
        "net.ipv6.conf.all.accept_dad=0",
        "net.ipv6.conf.default.accept_dad=0",
    ] {
        netns::nsenter(ns, "sysctl", &["-qw", key])?;
    }
    Ok(())
}

pub(crate) fn node_sysctls(ns: &str) -> Result<()> {
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        // Replies are reverse-NATed to the VIP before routing; the VIP has no route on
        // the node, so strict reverse-path filtering would drop them.
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
    ] {
        netns::nsenter(ns, "sysctl", &["-qw", &format!("{key}={value}")])?;
    }
    Ok(())
}

/// What a node process's `connect()` to a Service without endpoints, or to a
/// ClusterIP's undeclared port, fails with on this kernel: ECONNREFUSED where the
/// socket programs can set the error (`bpf_set_retval`), EPERM where they cannot.
pub fn socket_refusal() -> std::io::ErrorKind {
    if sliceway_agent::kernel::probe_set_retval() {
        std::io::ErrorKind::ConnectionRefused
    } else {
        std::io::ErrorKind::PermissionDenied
    }
}

/// `sliceway-agent ARGS` as a user runs it, its JSON output parsed (`-o json` among
/// the arguments); panics with its stderr when it fails.
pub fn agent_cli(args: &[&str]) -> serde_json::Value {
    let out = Command::new(workspace_binary("sliceway-agent").expect("the agent binary"))
        .args(args)
        .output()
        .expect("running sliceway-agent");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `sliceway-agent conntrack --flush-backend BACKEND` on the pinned maps under
/// `bpffs`: it must say it removed the one connection to `backend`, and the table
/// must be empty afterwards. Panics with what went wrong.
pub fn flush_the_one_connection_to(bpffs: &str, backend: &str) {
    let out = Command::new(workspace_binary("sliceway-agent").expect("the agent binary"))
        .args([
            "conntrack",
            "--bpffs-dir",
            bpffs,
            "--flush-backend",
            backend,
        ])
        .output()
        .expect("running sliceway-agent");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("removed 1 connections to {backend}")
    );
    let after = agent_cli(&["conntrack", "--bpffs-dir", bpffs, "-o", "json"]);
    assert_eq!(after, serde_json::json!([]), "{after}");
}

/// Runs `cmd` with `input` on its standard input; its standard output, or an error
/// saying `what` failed, with its standard error.
pub fn output_with_input(cmd: &mut Command, input: &str, what: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    child
        .stdin
        .take()
        .context("the child's standard input")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Mounts bpffs at `/sys/fs/bpf` from the test itself when the host has none there, so
/// that no agent of a test mounts it and records the mount as its own: `cleanup --all`
/// of that agent would unmount it under the agents of tests running beside it.
pub fn ensure_host_bpffs() -> Result<()> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    let mounted = mounts.lines().any(|l| {
        let mut fields = l.split_whitespace().skip(1);
        fields.next() == Some("/sys/fs/bpf") && fields.next() == Some("bpf")
    });
    if !mounted {
        let out = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "mounting bpffs at /sys/fs/bpf failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

/// Path of a binary of this workspace, built by `cargo build --bins`.
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/debug/deps/<test> or target/debug/<bin>
    for dir in exe.ancestors().skip(1).take(3) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "binary {name} not found next to {}: run `cargo build --bins` (cargo xtask test does)",
        exe.display()
    )
}

/// Whether the agent at `bin` serves health and metrics on two addresses
/// (`--healthz-bind-address`, `--metrics-bind-address`); a build older than those
/// flags has one `--metrics-addr`. Read from its `run --help`.
/// Asked once per binary: agents start many times in a test run.
fn two_servers(bin: &Path) -> Result<bool> {
    static KNOWN: Mutex<Vec<(PathBuf, bool)>> = Mutex::new(Vec::new());
    if let Some((_, two)) = KNOWN.lock().unwrap().iter().find(|(b, _)| b == bin) {
        return Ok(*two);
    }
    let out = Command::new(bin)
        .args(["run", "--help"])
        .output()
        .with_context(|| format!("running {} run --help", bin.display()))?;
    let two = String::from_utf8_lossy(&out.stdout).contains("--healthz-bind-address");
    KNOWN.lock().unwrap().push((bin.to_path_buf(), two));
    Ok(two)
}

/// A running `sliceway-agent`, its log captured. Stopped on drop. Its state (syncs,
/// frontends, map writes) is read from its `/metrics`, served on a loopback port of
/// its own inside its network namespace; the log is for messages and for failures.
pub struct Agent {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    /// The network namespace the agent runs in.
    ns: String,
    /// Its `--healthz-bind-address`, inside that namespace.
    healthz_addr: SocketAddrV4,
    /// Its `--metrics-bind-address`, inside that namespace.
    metrics_addr: SocketAddrV4,
}

/// The first health and metrics ports of the lab's agents; each agent of a process
/// takes the next of each, so two agents in one node namespace never share one.
const AGENT_HEALTHZ_PORT: u16 = 20256;
const AGENT_METRICS_PORT: u16 = 21249;

/// A cgroup (v2) of the lab's own for "pod" processes, under the root of the
/// hierarchy the agent would attach to; removed on drop. Socket programs attached to
/// it act on its processes' sockets only, so a lab's agent translating pods' sockets
/// leaves every other lab's (and the machine's) alone.
pub struct PodCgroup {
    pub dir: PathBuf,
}

impl PodCgroup {
    pub fn new(prefix: &str) -> Result<Self> {
        let root = sliceway_agent::kernel::resolve_cgroup(Path::new("auto"))
            .map_err(|e| anyhow::anyhow!("finding the cgroup v2 hierarchy: {e}"))?;
        let dir = root.join(format!("{prefix}-pods"));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { dir })
    }

    /// `count` TCP or UDP (`proto`) requests from a process in this cgroup and in
    /// `netns`, one after the other: each one's answer (the backend's `NAME ADDR
    /// PEER` and the socket's peer name) or its error's kind (`ConnectionRefused`).
    pub fn requests(
        &self,
        netns: &str,
        proto: &str,
        to: SocketAddr,
        count: usize,
    ) -> Result<Vec<std::result::Result<(Reply, SocketAddr), String>>> {
        let bin = workspace_binary("sliceway-lab-connect")?;
        let out = Command::new(&bin)
            .args([netns, &self.dir.to_string_lossy(), proto])
            .arg(to.to_string())
            .arg(count.to_string())
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        if !out.status.success() {
            bail!("{} failed: {}", bin.display(), out.status);
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| match line.split_once(' ') {
                Some(("ok", rest)) => {
                    let (answer, peer) = rest.rsplit_once(' ').context("no peer name")?;
                    Ok(Ok((servers::parse_ident(answer)?, peer.parse()?)))
                }
                Some(("err", kind)) => Ok(Err(kind.to_string())),
                _ => bail!("unexpected line {line:?}"),
            })
            .collect()
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        // Empty once its processes have exited (they are waited for); the kernel
        // may take a moment to let go of them.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.dir.display());
    }
}

/// The backends that answered one round of the node's own sockets to `vip` (run in
/// the node's namespace): a TCP connection, a connected UDP socket and an
/// unconnected one bound to `bind` (an address of `vip`'s family, or `[::]` for an
/// IPv4-mapped `vip`). Each must see `vip` as its peer (getpeername) or as a reply's
/// source (recvmsg), as the socket programs promise. Panics with what went wrong.
pub fn node_socket_round(vip: SocketAddr, bind: SocketAddr, timeout: Duration) -> [String; 3] {
    use std::{
        io::Write as _,
        net::{TcpStream, UdpSocket},
    };
    let first_word = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let conn = TcpStream::connect_timeout(&vip, timeout).unwrap();
    assert_eq!(conn.peer_addr().unwrap(), vip, "TCP getpeername");
    conn.set_read_timeout(Some(timeout)).unwrap();
    (&conn).write_all(b"hello\n").unwrap();
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).unwrap();
    let tcp = first_word(line.as_bytes());

    let mut buf = [0u8; 1500];
    let socket = UdpSocket::bind(bind).unwrap();
    socket.set_read_timeout(Some(timeout)).unwrap();
    socket.connect(vip).unwrap();
    assert_eq!(socket.peer_addr().unwrap(), vip, "UDP getpeername");
    socket.send(b"hello").unwrap();
    let n = socket.recv(&mut buf).unwrap();
    let udp = first_word(&buf[..n]);

    // Unconnected: the reply's source is the frontend (recvmsg).
    let socket = UdpSocket::bind(bind).unwrap();
    socket.set_read_timeout(Some(timeout)).unwrap();
    socket.send_to(b"hello", vip).unwrap();
    let (n, from) = socket.recv_from(&mut buf).unwrap();
    assert_eq!(from, vip, "a datagram's source");
    [tcp, udp, first_word(&buf[..n])]
}

/// The value of label `name` on one sample line of a Prometheus text exposition
/// (`code` of `apiserver_request_total{code="200",verb="PUT"} 7` is `200`), empty
/// when the line has no such label.
pub fn sample_label<'a>(line: &'a str, name: &str) -> &'a str {
    line.split(&format!("{name}=\""))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_default()
}

/// The value of one sample line of a Prometheus text exposition (its last field),
/// `None` when it is not a number.
pub fn sample_value(line: &str) -> Option<f64> {
    line.rsplit(' ').next().and_then(|v| v.parse().ok())
}

/// The value of the sample `series` in a Prometheus text exposition: the metric's
/// name with its labels as printed (`sliceway_map_entries{map="SERVICES"}`).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// `GET path` on `addr` from inside network namespace `ns`: the whole response,
/// status line first.
pub fn http_get(ns: &str, addr: SocketAddrV4, path: &str) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    in_netns(ns, move || -> Result<String> {
        let timeout = Duration::from_secs(5);
        let mut c = std::net::TcpStream::connect_timeout(&addr.into(), timeout)?;
        c.set_read_timeout(Some(timeout))?;
        c.write_all(request.as_bytes())?;
        let mut response = String::new();
        c.read_to_string(&mut response)?;
        Ok(response)
    })?
}

impl Agent {
    /// Starts the agent in `node_ns` with `source` arguments (`--manifests DIR` or
    /// `--kubeconfig FILE`).
    pub fn start(
        node_ns: &str,
        source: &[std::ffi::OsString],
        interfaces: &[String],
        bpffs: &Path,
    ) -> Result<Self> {
        Self::start_with_args(node_ns, source, interfaces, bpffs, &[])
    }

    /// [`Agent::start`] with more arguments for `sliceway-agent run`.
    pub fn start_with_args(
        node_ns: &str,
        source: &[std::ffi::OsString],
        interfaces: &[String],
        bpffs: &Path,
        extra: &[String],
    ) -> Result<Self> {
        let bin = workspace_binary("sliceway-agent")?;
        Self::start_binary(&bin, node_ns, source, interfaces, bpffs, extra)
    }

    /// [`Agent::start_with_args`] with the agent binary at `bin`.
    pub fn start_binary(
        bin: &Path,
        node_ns: &str,
        source: &[std::ffi::OsString],
        interfaces: &[String],
        bpffs: &Path,
        extra: &[String],
    ) -> Result<Self> {
        static PORTS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let n = PORTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let metrics_addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, AGENT_METRICS_PORT + n);
        // An agent of an older build (the upgrade tests' previous layout) serves health
        // and metrics on one `--metrics-addr`.
        let (healthz_addr, servers): (SocketAddrV4, Vec<String>) = if two_servers(bin)? {
            let healthz = SocketAddrV4::new(Ipv4Addr::LOCALHOST, AGENT_HEALTHZ_PORT + n);
            (
                healthz,
                vec![
                    "--healthz-bind-address".into(),
                    healthz.to_string(),
                    "--metrics-bind-address".into(),
                    metrics_addr.to_string(),
                ],
            )
        } else {
            (
                metrics_addr,
                vec!["--metrics-addr".into(), metrics_addr.to_string()],
            )
        };
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{node_ns}"))
            .arg(bin)
            .arg("run")
            .args(source)
            .arg("--interfaces")
            .arg(interfaces.join(","))
            .args(if extra.iter().any(|a| a == "--node") {
                &[][..]
            } else {
                &["--node", "node-1"][..]
            })
            .args(["--poll-interval-ms", "100"])
            .arg("--bpffs-dir")
            .arg(bpffs)
            .args(&servers)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting sliceway-agent")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("SLICEWAY_AGENT_LOG").is_some() {
                    eprintln!("agent: {line}");
                }
                sink.lock().unwrap().push(line);
            }
        });
        Ok(Self {
            child,
            log,
            ns: node_ns.to_string(),
            healthz_addr,
            metrics_addr,
        })
    }

    /// The log so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Where the agent serves `/metrics` and `/audit` (its `--metrics-bind-address`,
    /// inside its namespace).
    pub fn metrics_addr(&self) -> SocketAddrV4 {
        self.metrics_addr
    }

    /// Where the agent serves `/healthz` and `/livez` (its `--healthz-bind-address`,
    /// inside its namespace).
    pub fn healthz_addr(&self) -> SocketAddrV4 {
        self.healthz_addr
    }

    /// `GET path` on the agent's server for it: `/healthz`, `/livez` and `/readyz` on its
    /// health address, the rest on its metrics address. The whole response.
    pub fn http(&self, path: &str) -> Result<String> {
        let addr = match path {
            "/healthz" | "/livez" | "/readyz" => self.healthz_addr,
            _ => self.metrics_addr,
        };
        http_get(&self.ns, addr, path)
    }

    /// The agent's `/metrics` now.
    pub fn metrics(&self) -> Result<String> {
        let response = self.http("/metrics")?;
        match response.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
            _ => bail!("the agent's /metrics answered:\n{response}"),
        }
    }

    /// The value of one sample of the agent's `/metrics` (see [`metric_value`]); `None`
    /// when the agent does not show it (yet).
    pub fn metric(&self, name: &str) -> Result<Option<f64>> {
        Ok(metric_value(&self.metrics()?, name))
    }

    /// Packets the datapath counted for exit `reason` (`sliceway_datapath_packets`);
    /// 0 when none was. Panics if `/metrics` cannot be read.
    pub fn packets(&self, reason: &str) -> f64 {
        self.metric(&format!("sliceway_datapath_packets{{reason=\"{reason}\"}}"))
            .expect("the agent's /metrics")
            .unwrap_or(0.0)
    }

    /// The value of label `label` of the first sample of `/metrics` whose series
    /// starts with `prefix` (a metric's name and its first labels as printed:
    /// `sliceway_interface_link{interface="veth1",`); `None` when there is none.
    pub fn metric_label(&self, prefix: &str, label: &str) -> Result<Option<String>> {
        let text = self.metrics()?;
        let needle = format!("{label}=\"");
        Ok(text.lines().find_map(|l| {
            let labels = l.strip_prefix(prefix)?;
            let (_, rest) = labels.split_once(&needle)?;
            Some(rest.split('"').next()?.to_string())
        }))
    }

    /// How the agent attached its program to `iface` (`new_link`, `took_over_link`,
    /// `new_filter`, `replaced_filter`, `unpinned`: `sliceway_interface_link`), or
    /// `None` if it has not.
    pub fn link(&self, iface: &str) -> Result<Option<String>> {
        self.metric_label(
            &format!("sliceway_interface_link{{interface=\"{iface}\","),
            "how",
        )
    }

    /// The agent's attach path, `tcx` or `tc` (`sliceway_datapath_info`).
    pub fn attach_path(&self) -> Result<Option<String>> {
        self.metric_label("sliceway_datapath_info{", "attach_path")
    }

    /// Warnings and errors the agent has logged (`sliceway_log_messages_total`).
    pub fn problems_logged(&self) -> Result<u64> {
        let text = self.metrics()?;
        Ok(["warn", "error"]
            .iter()
            .filter_map(|l| {
                metric_value(
                    &text,
                    &format!("sliceway_log_messages_total{{level=\"{l}\"}}"),
                )
            })
            .sum::<f64>() as u64)
    }

    /// Syncs the agent has made (`sliceway_syncs_total`).
    pub fn syncs(&self) -> Result<u64> {
        Ok(self.metric("sliceway_syncs_total")?.unwrap_or(0.0) as u64)
    }

    /// Waits until the agent has made `n` syncs.
    pub fn wait_for_sync(&self, n: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            // Until its metrics server is up, the agent has not synced.
            match self.syncs() {
                Ok(syncs) if syncs >= n => return Ok(()),
                Ok(syncs) => last = Some(format!("{syncs} syncs")),
                Err(e) => last = Some(format!("{e:#}")),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "the agent did not reach sync {n} within {timeout:?} ({}); its log:\n{}",
            last.unwrap_or_default(),
            self.log().join("\n")
        )
    }

    /// Runs `change` (a manifest written or removed) and waits until the agent has
    /// synced after it, so what follows sees the change applied.
    pub fn applies(&self, change: impl FnOnce() -> Result<()>) -> Result<()> {
        let before = self.syncs()?;
        change()?;
        // A bound, not a figure: a sync takes milliseconds, but a loaded machine
        // (every test binary at once, a large file to read again) can hold it up.
        self.wait_for_sync(before + 1, Duration::from_secs(60))
    }

    /// Whether a log line contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Whether a log line contains `needle` within `timeout`: the agent's output is
    /// read by a thread of the lab, so a line written just before a sync the test
    /// waited for may not have been read yet.
    pub fn logs_within(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.logged(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the agent exited, if it did.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL: no chance to clean anything up, as in a crash or an OOM kill.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stop(&mut self) {
        // SIGTERM first, so the agent exits cleanly.
        // SAFETY: plain syscall on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_start_budget_is_read_from_its_variable_in_whole_seconds() {
        assert_eq!(agent_start_from(None), AGENT_START_DEFAULT);
        assert_eq!(agent_start_from(Some("600")), Duration::from_secs(600));
        assert_eq!(agent_start_from(Some(" 120\n")), Duration::from_secs(120));
        for bad in ["", "0", "-5", "1.5", "ten"] {
            assert_eq!(agent_start_from(Some(bad)), AGENT_START_DEFAULT, "{bad:?}");
        }
    }
}

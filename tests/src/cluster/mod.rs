//! The cluster lab: a kind-like Kubernetes cluster made of network namespaces, with
//! the real control plane built from upstream's Go modules (`scripts/upstream.sh`).
//!
//! ```text
//!  root namespace (loopback only)         lab namespaces (PREFIX-...)
//!  etcd, kube-apiserver :P ◄── forwarder ── node-N: 127.0.0.1:6443, eth0 10.100.0.1N
//!  kube-controller-manager                  │        proxy: sliceway-agent | kube-proxy
//!  kube-scheduler, sliceway-controller      │        pods: PREFIX-node-N-pXXXXXXXX
//!  kubelet stand-ins (one per node)      net: bridge br0 10.100.0.0/24 ── client 10.100.0.100
//! ```
//!
//! Every server of the control plane listens on the root namespace's loopback; the
//! nodes reach the API server through a forwarder each kubelet stand-in opens on the
//! node's own loopback. No lab namespace has a link to the root namespace, so test
//! traffic cannot leave the lab. Processes run in their own sessions with their pids
//! and logs in the cluster's directory, so a cluster outlives the command that made it
//! (`cargo xtask cluster up`) and [`down`] removes everything: processes, namespaces,
//! bpffs pins, files.

pub mod api;
pub mod e2e;
pub mod forward;
pub mod gateway;
pub mod guard;
pub mod kubelet;
pub mod pki;
pub mod real;

pub use forward::Forwarder;

use std::{
    fs,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::{netns, workspace_binary};

/// Prefix of every namespace a cluster lab makes.
pub const NS_PREFIX: &str = "slwk";
/// The Service CIDRs (the cluster is dual-stack, IPv4 first: a Service is IPv4 unless
/// it asks for IPv6) and the `kubernetes` Service's address.
pub const SERVICE_CIDR: &str = "10.96.0.0/16,fd00:10:96::/112";
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The cluster's pod CIDRs; node N gets 10.244.N.0/24 and fd00:10:244:N::/64.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16,fd00:10:244::/56";
/// Address the API server advertises (for the `kubernetes` Service): on the node
/// network, owned by nobody, so nothing outside the lab is ever named.
pub const ADVERTISE_ADDRESS: &str = "10.100.0.2";
/// The external client's address on the node network.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 100);
/// The IPv6 twin of a lab IPv4 address: `a.b.c.d` is `fd00:a:b:c::d` with each
/// decimal number written as is (10.244.1.5 is fd00:10:244:1::5), so the two
/// families of a node, a pod or a CIDR read alike. Every IPv6 address of the lab is
/// made this way, all in fd00::/8 (unique local), inside the lab's namespaces.
pub fn lab_v6(v4: Ipv4Addr) -> std::net::Ipv6Addr {
    let as_written = |n: u8| u16::from_str_radix(&n.to_string(), 16).expect("decimal digits");
    let [a, b, c, d] = v4.octets();
    std::net::Ipv6Addr::new(
        0xfd00,
        as_written(a),
        as_written(b),
        as_written(c),
        0,
        0,
        0,
        as_written(d),
    )
}

/// Zones the nodes are spread over.
pub const ZONES: [&str; 2] = ["zone-a", "zone-b"];

/// Which proxy runs on every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Proxy {
    Sliceway,
    /// sliceway with `--socket-lb-pods`: pods' TCP connects translated at the socket.
    #[serde(rename = "sliceway-pods")]
    #[value(name = "sliceway-pods")]
    SlicewayPods,
    Iptables,
    Nftables,
    None,
}

/// What runs a node's pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kubelet {
    /// The lab's stand-in: pods are network namespaces with servers of the lab's own.
    #[default]
    StandIn,
    /// Upstream's kubelet and containerd from the node kit: real containers.
    Real,
}

/// Which controller writes EndpointSlices and Endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Controllers {
    Sliceway,
    Upstream,
    /// kube-controller-manager without its EndpointSlice, mirroring and Endpoints
    /// controllers, and no controller of the lab's: for installing deploy/'s.
    None,
}

/// What to start.
#[derive(Clone, Debug)]
pub struct Spec {
    pub nodes: usize,
    pub proxy: Proxy,
    pub controller: Controllers,
    pub kubelet: Kubelet,
    /// Start kube-controller-manager and kube-scheduler (off for API-only tests).
    pub workloads: bool,
    /// Flags added to kube-apiserver's.
    pub apiserver_args: Vec<String>,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            nodes: 2,
            proxy: Proxy::Sliceway,
            controller: Controllers::Sliceway,
            kubelet: Kubelet::StandIn,
            workloads: true,
            apiserver_args: Vec::new(),
        }
    }
}

/// One node of the lab.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub netns: String,
    pub ip: Ipv4Addr,
    pub pod_cidr: Ipv4Addr,
    pub zone: String,
    pub bpffs: PathBuf,
}

/// What a running cluster is: written to `DIR/cluster.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    pub prefix: String,
    pub dir: PathBuf,
    pub version: String,
    pub bin: PathBuf,
    pub apiserver_port: u16,
    pub kubeconfig: PathBuf,
    pub nodes: Vec<NodeInfo>,
    pub net_ns: String,
    pub client_ns: String,
    pub proxy: Proxy,
    pub controller: Controllers,
    #[serde(default)]
    pub kubelet: Kubelet,
    /// The control-plane namespace (real nodes): the gateway at [`ADVERTISE_ADDRESS`].
    #[serde(default)]
    pub cp_ns: String,
    /// The node kit's commands (real nodes).
    #[serde(default)]
    pub kit_bin: Option<PathBuf>,
}

/// A running cluster lab. One made by [`Cluster::up`] is taken down on drop; one
/// found by [`Cluster::load`] is left running.
pub struct Cluster {
    pub state: State,
    owned: bool,
}

fn say(msg: &str) {
    eprintln!("cluster: {msg}");
}

/// The directory of the upstream commands, built (once per version) by the set-up.
pub fn upstream_bin() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SLICEWAY_UPSTREAM_BIN") {
        return Ok(dir.into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/upstream.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: the upstream commands are not built",
            script.display()
        );
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Starts `cmd` in its own session, output to `DIR/logs/NAME.log`, pid to
/// `DIR/pids/NAME`.
fn daemon(dir: &Path, name: &str, cmd: &mut Command) -> Result<u32> {
    fs::create_dir_all(dir.join("logs"))?;
    fs::create_dir_all(dir.join("pids"))?;
    let log = fs::File::create(dir.join("logs").join(format!("{name}.log")))?;
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .env("NO_COLOR", "1");
    // SAFETY: setsid is async-signal-safe; it detaches the child from our terminal
    // and process group so that it outlives `cluster up`.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {name} ({cmd:?})"))?;
    fs::write(dir.join("pids").join(name), child.id().to_string())?;
    Ok(child.id())
}

/// Stops the daemon `name` of the cluster in `dir` (SIGTERM, then SIGKILL).
fn stop_daemon(dir: &Path, name: &str) {
    let file = dir.join("pids").join(name);
    let Some(pid) = fs::read_to_string(&file)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    else {
        return;
    };
    // SAFETY: plain syscalls on a pid this lab started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && alive(pid) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        // SAFETY: `kill` takes no pointers; the pid is the one this lab recorded when
        // it started the process, which has not been reaped yet (`alive`).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = fs::remove_file(file);
}

fn alive(pid: i32) -> bool {
    // Reap it if it is our child; then see whether it still exists (and is no zombie).
    // SAFETY: `waitpid` may take a null status pointer (the status is not wanted), and
    // WNOHANG makes it return at once whether or not `pid` is a child of ours.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The last lines of the log of the lab's process `name`, in the lab at `dir`.
fn log_tail_in(dir: &Path, name: &str) -> String {
    let text = fs::read_to_string(dir.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "last lines of {name}'s log:\n{}",
        lines[lines.len().saturating_sub(30)..].join("\n")
    )
}

/// Polls `f` every 200 ms until it holds, for at most `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("{what} did not happen within {timeout:?}")
}

fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(500),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200")
}

impl Cluster {
    /// Makes and starts a cluster in `dir` with namespaces named `prefix-...`.
    pub fn up(spec: &Spec, dir: &Path, prefix: &str) -> Result<Self> {
        if dir.join("cluster.json").exists() {
            bail!(
                "a cluster lab already runs from {} (take it down first)",
                dir.display()
            );
        }
        let bin = upstream_bin()?;
        let version = bin
            .parent()
            .and_then(|p| p.file_name())
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        let kit = match spec.kubelet {
            Kubelet::Real => Some(real::Kit::find()?),
            Kubelet::StandIn => None,
        };
        fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let state = State {
            prefix: prefix.to_string(),
            dir: dir.clone(),
            version,
            bin,
            apiserver_port: free_port()?,
            kubeconfig: dir.join("admin.kubeconfig"),
            nodes: (1..=spec.nodes)
                .map(|i| NodeInfo {
                    name: format!("node-{i}"),
                    netns: format!("{prefix}-node-{i}"),
                    ip: Ipv4Addr::new(10, 100, 0, 10 + i as u8),
                    pod_cidr: Ipv4Addr::new(10, 244, i as u8, 0),
                    zone: ZONES[(i - 1) % ZONES.len()].to_string(),
                    bpffs: PathBuf::from(format!("/sys/fs/bpf/{prefix}-node-{i}")),
                })
                .collect(),
            net_ns: format!("{prefix}-net"),
            client_ns: format!("{prefix}-client"),
            proxy: spec.proxy,
            controller: spec.controller,
            kubelet: spec.kubelet,
            cp_ns: format!("{prefix}-cp"),
            kit_bin: kit.as_ref().map(|k| k.bin.clone()),
        };
        fs::write(
            dir.join("cluster.json"),
            serde_json::to_string_pretty(&state)?,
        )?;
        let cluster = Cluster { state, owned: true };
        // On any error below, drop takes down what was started.
        cluster.start(spec, kit.as_ref())?;
        Ok(cluster)
    }

    /// The cluster running from `dir`, left running when dropped.
    pub fn load(dir: &Path) -> Result<Self> {
        let text = fs::read_to_string(dir.join("cluster.json"))
            .with_context(|| format!("no cluster lab runs from {}", dir.display()))?;
        Ok(Cluster {
            state: serde_json::from_str(&text)?,
            owned: false,
        })
    }

    /// Leaves the cluster running after this value is gone (`cluster up`).
    pub fn detach(mut self) {
        self.owned = false;
    }

    fn dir(&self) -> &Path {
        &self.state.dir
    }

    fn start(&self, spec: &Spec, kit: Option<&real::Kit>) -> Result<()> {
        let s = &self.state;
        guard::install(&s.prefix)?;
        let pki = s.dir.join("pki");
        say(&format!("keys and certificates in {}", pki.display()));
        pki::make(&pki, KUBERNETES_SERVICE_IP, ADVERTISE_ADDRESS)?;
        let server = format!("https://127.0.0.1:{}", s.apiserver_port);
        for id in pki::IDENTITIES {
            pki::kubeconfig(
                &pki,
                &s.dir.join(format!("{}.kubeconfig", id.file)),
                &server,
                Some(id.file),
                None,
            )?;
        }
        self.start_etcd()?;
        let mut apiserver_args = spec.apiserver_args.clone();
        if s.kubelet == Kubelet::Real {
            apiserver_args.extend(self.apiserver_real_node_args()?);
        }
        self.start_apiserver(&apiserver_args)?;
        // The API server makes the `kubernetes` Service shortly after it answers; on a
        // loaded machine, seconds after.
        wait_until(
            "the kubernetes Service made by kube-apiserver",
            Duration::from_secs(60),
            || {
                self.kubectl(&["-n", "default", "get", "svc", "kubernetes"])
                    .is_ok()
            },
        )
        .with_context(|| self.log_tail("kube-apiserver"))?;
        if spec.workloads {
            self.start_controller_manager()?;
            self.start_scheduler()?;
            // Pods are refused until the namespace's default ServiceAccount exists.
            wait_until(
                "the default ServiceAccount made by kube-controller-manager",
                Duration::from_secs(60),
                || self.kubectl(&["get", "serviceaccount", "default"]).is_ok(),
            )
            .with_context(|| self.log_tail("kube-controller-manager"))?;
        }
        if spec.nodes > 0 {
            self.build_network()?;
            match kit {
                Some(kit) => {
                    self.start_gateway()?;
                    let server = format!("https://{ADVERTISE_ADDRESS}:{}", s.apiserver_port);
                    for node in &s.nodes {
                        self.register_real_node(node)?;
                        real::start_node(s, node, kit, &server)?;
                    }
                }
                None => {
                    for node in &s.nodes {
                        self.start_kubelet(node)?;
                    }
                }
            }
            self.wait_nodes_ready()?;
        }
        if spec.workloads && spec.controller == Controllers::Sliceway {
            self.start_sliceway_controller()?;
        }
        self.start_proxies(s.proxy)?;
        if let (Some(kit), true) = (kit, spec.nodes > 0 && spec.workloads) {
            self.start_cluster_dns(kit)?;
        }
        say(&format!(
            "up: Kubernetes {}, {} node(s), proxy {:?}, controller {:?}",
            s.version,
            s.nodes.len(),
            s.proxy,
            s.controller
        ));
        Ok(())
    }

    fn start_etcd(&self) -> Result<()> {
        let client = free_port()?;
        let peer = free_port()?;
        let data = self.dir().join("etcd");
        say("starting etcd");
        daemon(
            self.dir(),
            "etcd",
            Command::new(self.state.bin.join("etcd"))
                .arg(format!("--data-dir={}", data.display()))
                .arg("--name=lab")
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster=lab=http://127.0.0.1:{peer}"))
                .arg("--unsafe-no-fsync")
                .arg("--log-level=warn"),
        )?;
        fs::write(self.dir().join("etcd.port"), client.to_string())?;
        wait_until("etcd answering /health", Duration::from_secs(30), || {
            http_ok(client, "/health")
        })
        .with_context(|| self.log_tail("etcd"))
    }

    fn start_apiserver(&self, extra_args: &[String]) -> Result<()> {
        let s = &self.state;
        let pki = s.dir.join("pki");
        let etcd: u16 = fs::read_to_string(s.dir.join("etcd.port"))?
            .trim()
            .parse()?;
        say(&format!(
            "starting kube-apiserver {} on 127.0.0.1:{}",
            s.version, s.apiserver_port
        ));
        let p = |f: &str| pki.join(f).display().to_string();
        daemon(
            &s.dir,
            "kube-apiserver",
            Command::new(s.bin.join("kube-apiserver"))
                .arg(format!("--etcd-servers=http://127.0.0.1:{etcd}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", s.apiserver_port))
                .arg(format!("--advertise-address={ADVERTISE_ADDRESS}"))
                .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
                .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
                .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
                .arg(format!("--client-ca-file={}", p("ca.crt")))
                .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
                .arg(format!("--service-account-key-file={}", p("sa.pub")))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    p("sa.key")
                ))
                .arg("--authorization-mode=Node,RBAC")
                .arg("--allow-privileged=true")
                .arg("--profiling=false")
                .arg("--v=1")
                .args(extra_args),
        )?;
        wait_until("kube-apiserver ready", Duration::from_secs(90), || {
            self.kubectl(&["get", "--raw=/readyz"]).is_ok()
        })
        .with_context(|| self.log_tail("kube-apiserver"))
    }

    fn start_controller_manager(&self) -> Result<()> {
        // Node lifecycle is off with stand-ins: they report Ready once and do not
        // heartbeat. Real kubelets do, and node lifecycle lifts the not-ready taint.
        let mut controllers = String::from(match self.state.kubelet {
            Kubelet::StandIn => "*,-node-lifecycle-controller",
            Kubelet::Real => "*",
        });
        if self.state.controller != Controllers::Upstream {
            controllers.push_str(
                ",-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller",
            );
        }
        self.start_controller_manager_with(&controllers)
    }

    /// Starts kube-controller-manager with only its Endpoints, EndpointSlice and
    /// EndpointSlice mirroring controllers (what sliceway-controller replaces), for a
    /// control plane started without workloads. The names are those of
    /// `cmd/kube-controller-manager/names/controller_names.go` at the pinned version
    /// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-controller-manager/names/controller_names.go>).
    pub fn start_endpoint_controllers_upstream(&self) -> Result<()> {
        self.start_controller_manager_with(
            "endpoints-controller,endpointslice-controller,endpointslice-mirroring-controller",
        )
    }

    /// Stops a process the lab started (`kube-controller-manager`,
    /// `sliceway-controller`, ...): SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&self, name: &str) {
        stop_daemon(self.dir(), name);
    }

    fn start_controller_manager_with(&self, controllers: &str) -> Result<()> {
        let s = &self.state;
        let pki = s.dir.join("pki");
        say(&format!("starting kube-controller-manager ({controllers})"));
        let kc = s.dir.join("controller-manager.kubeconfig");
        daemon(
            &s.dir,
            "kube-controller-manager",
            Command::new(s.bin.join("kube-controller-manager"))
                .arg(format!("--kubeconfig={}", kc.display()))
                .arg(format!("--authentication-kubeconfig={}", kc.display()))
                .arg(format!("--authorization-kubeconfig={}", kc.display()))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", free_port()?))
                .arg(format!("--controllers={controllers}"))
                .arg(format!(
                    "--service-account-private-key-file={}",
                    pki.join("sa.key").display()
                ))
                .arg(format!("--root-ca-file={}", pki.join("ca.crt").display()))
                .arg("--use-service-account-credentials=true")
                .arg(format!("--cluster-cidr={CLUSTER_CIDR}"))
                .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
                .arg("--leader-elect=false")
                .arg("--profiling=false")
                .arg("--v=1"),
        )?;
        Ok(())
    }

    fn start_scheduler(&self) -> Result<()> {
        let s = &self.state;
        say("starting kube-scheduler");
        let kc = s.dir.join("scheduler.kubeconfig");
        daemon(
            &s.dir,
            "kube-scheduler",
            Command::new(s.bin.join("kube-scheduler"))
                .arg(format!("--kubeconfig={}", kc.display()))
                .arg(format!("--authentication-kubeconfig={}", kc.display()))
                .arg(format!("--authorization-kubeconfig={}", kc.display()))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", free_port()?))
                .arg("--leader-elect=false")
                .arg("--profiling=false")
                .arg("--v=1"),
        )?;
        Ok(())
    }

    /// The node network: a bridge in its own namespace, every node and the external
    /// client on it, routes from each node to every other node's pod CIDR.
    fn build_network(&self) -> Result<()> {
        let s = &self.state;
        say(&format!(
            "building the node network ({} nodes and a client)",
            s.nodes.len()
        ));
        let net = netns::Netns::create(&s.net_ns)?;
        std::mem::forget(net); // deleted by `down`
        netns::nsenter(&s.net_ns, "ip", &["link", "add", "br0", "type", "bridge"])?;
        netns::nsenter(&s.net_ns, "ip", &["link", "set", "br0", "up"])?;
        let mut hosts: Vec<(String, String, Ipv4Addr)> = s
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.netns.clone(), format!("n{}", i + 1), n.ip))
            .collect();
        hosts.push((s.client_ns.clone(), "client".into(), CLIENT_IP));
        let advertised: Ipv4Addr = ADVERTISE_ADDRESS.parse()?;
        if s.kubelet == Kubelet::Real {
            hosts.push((s.cp_ns.clone(), "cp".into(), advertised));
        }
        for (ns, port, ip) in &hosts {
            std::mem::forget(netns::Netns::create(ns)?);
            netns::ip(&[
                "link", "add", port, "netns", &s.net_ns, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ])?;
            netns::nsenter(
                &s.net_ns,
                "ip",
                &["link", "set", port, "master", "br0", "up"],
            )?;
            netns::nsenter(
                ns,
                "ip",
                &["addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            )?;
            netns::nsenter(
                ns,
                "ip",
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{}/64", lab_v6(*ip)),
                    "dev",
                    "eth0",
                    "nodad",
                ],
            )?;
            netns::nsenter(ns, "ip", &["link", "set", "eth0", "up"])?;
            netns::nsenter(ns, "ethtool", &["-K", "eth0", "tx", "off"])?;
        }
        if s.kubelet == Kubelet::Real {
            // The control plane's namespace answers pods (the `kubernetes` Service)
            // and reaches them (the API server's proxy subresources); the client's
            // reaches them as upstream's e2e suite, run there, expects of its host.
            for (ns, node) in s
                .nodes
                .iter()
                .flat_map(|n| [(&s.cp_ns, n), (&s.client_ns, n)])
            {
                netns::nsenter(
                    ns,
                    "ip",
                    &[
                        "route",
                        "add",
                        &format!("{}/24", node.pod_cidr),
                        "via",
                        &node.ip.to_string(),
                    ],
                )?;
                netns::nsenter(
                    ns,
                    "ip",
                    &[
                        "-6",
                        "route",
                        "add",
                        &format!("{}/64", lab_v6(node.pod_cidr)),
                        "via",
                        &lab_v6(node.ip).to_string(),
                    ],
                )?;
            }
        }
        for node in &s.nodes {
            for (key, value) in [
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
                ("net.ipv4.conf.eth0.rp_filter", "0"),
                ("net.ipv6.conf.all.forwarding", "1"),
            ] {
                netns::nsenter(&node.netns, "sysctl", &["-qw", &format!("{key}={value}")])?;
            }
            for other in s.nodes.iter().filter(|o| o.name != node.name) {
                netns::nsenter(
                    &node.netns,
                    "ip",
                    &[
                        "route",
                        "add",
                        &format!("{}/24", other.pod_cidr),
                        "via",
                        &other.ip.to_string(),
                    ],
                )?;
                netns::nsenter(
                    &node.netns,
                    "ip",
                    &[
                        "-6",
                        "route",
                        "add",
                        &format!("{}/64", lab_v6(other.pod_cidr)),
                        "via",
                        &lab_v6(other.ip).to_string(),
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// The pod-facing interfaces of a node, as the agent's `--interfaces`: the
    /// stand-in's pod links, or the ptp plugin's host-side veths.
    fn pod_interfaces(&self) -> &'static str {
        match self.state.kubelet {
            Kubelet::StandIn => "p*",
            Kubelet::Real => "veth*",
        }
    }

    /// kube-apiserver's flags for real nodes: its `cluster` egress (kubelets, pods,
    /// Services) through the lab's gateway ([`gateway`]), its client certificate
    /// towards kubelets, and nodes reached by address (the gateway names no hosts).
    fn apiserver_real_node_args(&self) -> Result<Vec<String>> {
        let s = &self.state;
        let egress = s.dir.join("egress-selector.yaml");
        fs::write(
            &egress,
            format!(
                "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
                s.dir.join("egress.sock").display()
            ),
        )?;
        let pki = s.dir.join("pki");
        Ok(vec![
            format!("--egress-selector-config-file={}", egress.display()),
            format!(
                "--kubelet-client-certificate={}",
                pki.join("apiserver-kubelet-client.crt").display()
            ),
            format!(
                "--kubelet-client-key={}",
                pki.join("apiserver-kubelet-client.key").display()
            ),
            "--kubelet-preferred-address-types=InternalIP".into(),
        ])
    }

    /// Starts the gateway in the control-plane namespace ([`gateway`]).
    fn start_gateway(&self) -> Result<()> {
        let s = &self.state;
        say(&format!(
            "starting the gateway at {ADVERTISE_ADDRESS}:{} in {}",
            s.apiserver_port, s.cp_ns
        ));
        let advertised: Ipv4Addr = ADVERTISE_ADDRESS.parse()?;
        let mut cmd = Command::new(workspace_binary("sliceway-lab-gateway")?);
        cmd.args(["--netns", &s.cp_ns])
            .args(["--listen", &format!("{advertised}:{}", s.apiserver_port)])
            .args([
                "--listen",
                &format!("[{}]:{}", lab_v6(advertised), s.apiserver_port),
            ])
            .args(["--apiserver-port", &s.apiserver_port.to_string()])
            .arg("--egress-socket")
            .arg(s.dir.join("egress.sock"))
            .env("RUST_LOG", "info");
        for net in guard::LAB_NETWORKS {
            cmd.args(["--allow", net]);
        }
        daemon(&s.dir, "gateway", &mut cmd)?;
        let sock = s.dir.join("egress.sock");
        wait_until("the gateway listening", Duration::from_secs(30), || {
            sock.exists()
        })
        .with_context(|| self.log_tail("gateway"))
    }

    /// Makes `node`'s Node object before its kubelet registers, with the pod CIDRs the
    /// lab's routes and CNI configuration use (kubelet keeps them) and its zone.
    fn register_real_node(&self, node: &NodeInfo) -> Result<()> {
        let manifest = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": {"topology.kubernetes.io/zone": node.zone}
            },
            "spec": {
                "podCIDR": format!("{}/24", node.pod_cidr),
                "podCIDRs": [
                    format!("{}/24", node.pod_cidr),
                    format!("{}/64", lab_v6(node.pod_cidr)),
                ]
            }
        });
        self.kubectl_stdin(&["apply", "-f", "-"], &manifest.to_string())?;
        Ok(())
    }

    /// CoreDNS as the cluster DNS ([`real::coredns_manifest`]), ready; with no proxy
    /// or no controller in the lab it cannot reach the API server or be reached yet,
    /// so it is only applied (as on a cluster waiting for its proxy):
    /// [`Cluster::wait_cluster_dns`] waits for it once they are installed.
    fn start_cluster_dns(&self, kit: &real::Kit) -> Result<()> {
        let (_, image) = kit.image("registry.k8s.io/coredns/coredns:")?;
        say(&format!("starting CoreDNS at {}", real::CLUSTER_DNS));
        self.kubectl_stdin(&["apply", "-f", "-"], &real::coredns_manifest(image))?;
        if self.state.proxy == Proxy::None || self.state.controller == Controllers::None {
            say("CoreDNS applied; it becomes ready once a proxy and a controller run");
            return Ok(());
        }
        self.wait_cluster_dns()
    }

    /// Waits until CoreDNS's Deployment is rolled out.
    pub fn wait_cluster_dns(&self) -> Result<()> {
        self.kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/coredns",
            "--timeout=180s",
        ])
        .context("CoreDNS did not become ready")?;
        Ok(())
    }

    fn start_kubelet(&self, node: &NodeInfo) -> Result<()> {
        let s = &self.state;
        let bin = workspace_binary("sliceway-lab-kubelet")?;
        daemon(
            &s.dir,
            &format!("kubelet-{}", node.name),
            Command::new(bin)
                .arg("--kubeconfig")
                .arg(&s.kubeconfig)
                .args(["--node", &node.name, "--netns", &node.netns])
                .args(["--ip", &node.ip.to_string()])
                .args(["--pod-cidr", &node.pod_cidr.to_string()])
                .args(["--zone", &node.zone])
                .args(["--apiserver-port", &s.apiserver_port.to_string()])
                .env("RUST_LOG", "info"),
        )?;
        Ok(())
    }

    fn wait_nodes_ready(&self) -> Result<()> {
        let want = self.state.nodes.len();
        let timeout = match self.state.kubelet {
            Kubelet::StandIn => Duration::from_secs(30),
            Kubelet::Real => Duration::from_secs(180),
        };
        wait_until("every Node registered and Ready", timeout, || {
            self.kubectl(&[
                "get", "nodes", "-o",
                "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ])
            .is_ok_and(|out| out.lines().filter(|l| *l == "True").count() == want)
        })
        .with_context(|| self.log_tail("kubelet-node-1"))
    }

    /// Starts sliceway-controller with its deployed identity and waits for it to be
    /// healthy (the lab does so itself when it runs workloads with it). Returns the
    /// loopback port of its `/metrics` and `/healthz`.
    pub fn start_sliceway_controller(&self) -> Result<u16> {
        let s = &self.state;
        // The ServiceAccount and its RBAC, not the Deployment: the lab has no
        // container runtime and starts the controller itself.
        let kc = self.identity_kubeconfig(
            "sliceway-controller.yaml",
            "Deployment",
            "sliceway-controller",
            &format!("https://127.0.0.1:{}", s.apiserver_port),
            &s.dir.join("sliceway-controller.kubeconfig"),
        )?;
        say("starting sliceway-controller");
        let port = free_port()?;
        daemon(
            &s.dir,
            "sliceway-controller",
            Command::new(workspace_binary("sliceway-controller")?)
                .arg("run")
                .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
                .env("KUBECONFIG", kc)
                .env("RUST_LOG", "info"),
        )?;
        wait_until(
            "sliceway-controller healthy",
            Duration::from_secs(30),
            || http_ok(port, "/healthz"),
        )
        .with_context(|| self.log_tail("sliceway-controller"))?;
        Ok(port)
    }

    /// Starts `proxy` on every node (after [`Cluster::stop_proxies`] for a switch).
    pub fn start_proxies(&self, proxy: Proxy) -> Result<()> {
        let names: Vec<String> = self.state.nodes.iter().map(|n| n.name.clone()).collect();
        self.start_proxies_on(proxy, &names)
    }

    /// Starts `proxy` on the nodes named, and waits until each is healthy.
    pub fn start_proxies_on(&self, proxy: Proxy, names: &[String]) -> Result<()> {
        let s = &self.state;
        if proxy == Proxy::None || names.is_empty() {
            return Ok(());
        }
        let server = match s.kubelet {
            // The stand-in's forwarder on each node's loopback.
            Kubelet::StandIn => format!("https://127.0.0.1:{}", kubelet::NODE_APISERVER_PORT),
            // The gateway, as the node's kubelet reaches it.
            Kubelet::Real => format!("https://{ADVERTISE_ADDRESS}:{}", s.apiserver_port),
        };
        let pki = s.dir.join("pki");
        let kubeconfig = match proxy {
            Proxy::Sliceway | Proxy::SlicewayPods => {
                self.agent_kubeconfig(&server, &s.dir.join("node-sliceway-agent.kubeconfig"))?
            }
            _ => pki::kubeconfig(
                &pki,
                &s.dir.join("node-kube-proxy.kubeconfig"),
                &server,
                Some("kube-proxy"),
                None,
            )?,
        };
        let nodes: Vec<&NodeInfo> = s.nodes.iter().filter(|n| names.contains(&n.name)).collect();
        for node in &nodes {
            let name = format!("proxy-{}", node.name);
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net=/var/run/netns/{}", node.netns));
            match proxy {
                Proxy::Sliceway | Proxy::SlicewayPods => {
                    say(&format!("starting sliceway-agent on {}", node.name));
                    cmd.arg(workspace_binary("sliceway-agent")?)
                        .arg("run")
                        .arg("--kubeconfig")
                        .arg(&kubeconfig)
                        .args(["--node", &node.name, "--interfaces", self.pod_interfaces()])
                        .args(["--external-interfaces", "eth0"])
                        .arg("--bpffs-dir")
                        .arg(&node.bpffs)
                        .args(["--interface-scan-interval-ms", "200"])
                        .env("RUST_LOG", "info");
                    if proxy == Proxy::SlicewayPods {
                        cmd.arg("--socket-lb-pods");
                    }
                }
                Proxy::Iptables | Proxy::Nftables => {
                    let mode = if proxy == Proxy::Iptables {
                        "iptables"
                    } else {
                        "nftables"
                    };
                    say(&format!(
                        "starting kube-proxy {} ({mode}) on {}",
                        s.version, node.name
                    ));
                    cmd.arg(s.bin.join("kube-proxy"))
                        .arg(format!("--kubeconfig={}", kubeconfig.display()))
                        .arg(format!("--hostname-override={}", node.name))
                        .arg(format!("--proxy-mode={mode}"))
                        .arg(format!("--cluster-cidr={CLUSTER_CIDR}"))
                        // Conntrack sysctls are the root namespace's: leave them.
                        .arg("--conntrack-max-per-core=0")
                        .arg("--conntrack-tcp-timeout-established=0")
                        .arg("--conntrack-tcp-timeout-close-wait=0")
                        .arg("--metrics-bind-address=127.0.0.1:10249")
                        .arg("--healthz-bind-address=127.0.0.1:10256")
                        .arg("--v=1");
                }
                Proxy::None => unreachable!(),
            }
            daemon(&s.dir, &name, &mut cmd)?;
        }
        // Ready when each proxy's health endpoint (in its node) says so.
        for node in &nodes {
            let ns = node.netns.clone();
            wait_until(
                &format!("the proxy on {} healthy", node.name),
                Duration::from_secs(60),
                || {
                    let ns = ns.clone();
                    netns::in_netns(&ns, || http_ok(10256, "/healthz")).unwrap_or(false)
                },
            )
            .with_context(|| self.log_tail(&format!("proxy-{}", node.name)))?;
        }
        Ok(())
    }

    /// Applies the agent's ServiceAccount and RBAC from `deploy/sliceway-agent.yaml`
    /// (not its DaemonSet: the lab starts agents itself) and writes to `path` a
    /// kubeconfig of that identity for the API server at `server`.
    pub fn agent_kubeconfig(&self, server: &str, path: &Path) -> Result<PathBuf> {
        self.identity_kubeconfig(
            "sliceway-agent.yaml",
            "DaemonSet",
            "sliceway-agent",
            server,
            path,
        )
    }

    /// Applies every document of `deploy/MANIFEST` except those of `skip` (what the
    /// lab runs itself), and writes to `path` a kubeconfig with a token of the
    /// ServiceAccount `kube-system/ACCOUNT` for the API server at `server`.
    fn identity_kubeconfig(
        &self,
        manifest: &str,
        skip: &str,
        account: &str,
        server: &str,
        path: &Path,
    ) -> Result<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        {
            // Tests of one process apply the same objects at once; two concurrent
            // `kubectl apply` can both try to create one (AlreadyExists).
            static APPLY: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _one = APPLY
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.kubectl_stdin(
                &["apply", "-f", "-"],
                &manifest_without(&root.join("deploy").join(manifest), skip)?,
            )?;
        }
        let token = self.kubectl(&[
            "-n",
            "kube-system",
            "create",
            "token",
            account,
            "--duration=48h",
        ])?;
        pki::kubeconfig(
            &self.state.dir.join("pki"),
            path,
            server,
            None,
            Some(token.trim()),
        )
    }

    /// Stops the proxies and removes what they left in the nodes (pins, rules).
    pub fn stop_proxies(&self) -> Result<()> {
        for node in &self.state.nodes {
            stop_daemon(self.dir(), &format!("proxy-{}", node.name));
            let _ = fs::remove_dir_all(&node.bpffs);
            let _ = netns::nsenter(&node.netns, "iptables", &["-t", "nat", "-F"]);
            let _ = netns::nsenter(&node.netns, "iptables", &["-t", "filter", "-F"]);
            let _ = netns::nsenter(&node.netns, "ip6tables", &["-t", "nat", "-F"]);
            let _ = netns::nsenter(&node.netns, "ip6tables", &["-t", "filter", "-F"]);
            let _ = netns::nsenter(&node.netns, "nft", &["flush", "ruleset"]);
            let _ = netns::nsenter(&node.netns, "conntrack", &["-F"]);
        }
        Ok(())
    }

    /// Runs the kit's kubectl as the cluster's admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_stdin(args, "")
    }

    /// Runs kubectl with `input` on its standard input.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Result<String> {
        crate::output_with_input(
            Command::new(self.state.bin.join("kubectl"))
                .arg(format!("--kubeconfig={}", self.state.kubeconfig.display()))
                .args(args),
            input,
            &format!("kubectl {}", args.join(" ")),
        )
    }

    /// The network namespace of pod `namespace/name` (the stand-in annotates it).
    pub fn pod_netns(&self, namespace: &str, name: &str) -> Result<String> {
        let ns = self.kubectl(&[
            "-n",
            namespace,
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.metadata.annotations.lab\\.sliceway\\.io/netns}",
        ])?;
        if ns.trim().is_empty() {
            bail!("pod {namespace}/{name} is not running on a lab node (yet)");
        }
        Ok(ns.trim().to_string())
    }

    /// Waits until `n` pods matching `selector` in `namespace` are Ready, and returns
    /// their names.
    pub fn wait_ready_pods(
        &self,
        namespace: &str,
        selector: &str,
        n: usize,
    ) -> Result<Vec<String>> {
        let mut names = Vec::new();
        wait_until(
            &format!("{n} ready pods {selector}"),
            Duration::from_secs(60),
            || {
                let Ok(out) = self.kubectl(&[
                "-n", namespace, "get", "pods", "-l", selector, "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ]) else {
                return false;
            };
                names = out
                    .lines()
                    .filter_map(|l| {
                        let f: Vec<&str> = l.split(' ').collect();
                        (f.len() == 3 && f[1].is_empty() && f[2] == "True")
                            .then(|| f[0].to_string())
                    })
                    .collect();
                names.len() == n
            },
        )?;
        Ok(names)
    }

    /// The last lines of a component's log, for error messages.
    pub fn log_tail(&self, name: &str) -> String {
        log_tail_in(self.dir(), name)
    }

    /// Components, nodes and pods, for `cluster status`.
    pub fn status(&self) -> Result<String> {
        let s = &self.state;
        let mut out = format!(
            "Kubernetes {} from {}\nkubeconfig: {}\nproxy: {:?}, controller: {:?}\n\ncomponents:\n",
            s.version,
            s.bin.display(),
            s.kubeconfig.display(),
            s.proxy,
            s.controller
        );
        let mut names: Vec<String> = fs::read_dir(s.dir.join("pids"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        for name in names {
            let pid: i32 = fs::read_to_string(s.dir.join("pids").join(&name))?
                .trim()
                .parse()
                .unwrap_or(0);
            let up = if alive(pid) { "running" } else { "NOT RUNNING" };
            out.push_str(&format!("  {name:<28} pid {pid:<8} {up}\n"));
        }
        out.push_str("\nnodes:\n");
        for n in &s.nodes {
            out.push_str(&format!(
                "  {:<8} {:<14} pods {}/24  {}  netns {}\n",
                n.name, n.ip, n.pod_cidr, n.zone, n.netns
            ));
        }
        out.push_str(&format!(
            "  client   {:<14} netns {}\n\npods:\n",
            CLIENT_IP, s.client_ns
        ));
        out.push_str(&self.kubectl(&[
            "get", "pods", "-A", "-o",
            "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP,READY:.status.conditions[?(@.type==\"Ready\")].status",
        ])?);
        Ok(out)
    }
}

/// The documents of the manifest `path` except those of `kind`.
pub fn manifest_without(path: &Path, kind: &str) -> Result<String> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let kept: Vec<&str> = text
        .split("\n---")
        .filter(|doc| !doc.lines().any(|l| l.trim() == format!("kind: {kind}")))
        .collect();
    Ok(kept.join("\n---"))
}

/// Takes down the cluster running from `dir`: processes, namespaces, pins, files.
pub fn down(dir: &Path) -> Result<()> {
    let Ok(cluster) = Cluster::load(dir) else {
        bail!("no cluster lab runs from {}", dir.display());
    };
    let s = &cluster.state;
    let mut left = Vec::new();
    if s.kubelet == Kubelet::Real {
        // Their pods first, through the runtime, while the proxies still run.
        for node in &s.nodes {
            left.extend(real::stop_node(s, node, s.kit_bin.as_deref()));
        }
    }
    // Proxies and controllers first, the control plane last.
    let mut names: Vec<String> = fs::read_dir(dir.join("pids"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let rank = |n: &str| match n {
        "etcd" => 3,
        "kube-apiserver" => 2,
        _ if n.starts_with("kubelet-") => 1,
        _ => 0,
    };
    names.sort_by_key(|n| rank(n));
    for name in names {
        stop_daemon(dir, &name);
    }
    for node in &s.nodes {
        let _ = fs::remove_dir_all(&node.bpffs);
    }
    if let Ok(list) = netns::ip(&["netns", "list"]) {
        for line in list.lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if name.starts_with(&format!("{}-", s.prefix)) {
                let _ = netns::ip(&["netns", "delete", name]);
            }
        }
    }
    let escaped = guard::escaped(&s.prefix);
    let _ = guard::remove(&s.prefix);
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    if !left.is_empty() {
        bail!("the lab is down, but these are left: {left:?}");
    }
    match escaped {
        Ok(0) | Err(_) => Ok(()),
        Ok(n) => bail!(
            "the root namespace tried to send {n} packet(s) to the lab's networks \
             (dropped by the lab's guard): a lab address was used outside the lab"
        ),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = down(&self.state.dir) {
                eprintln!("cluster: taking the lab down: {e:#}");
            }
        }
    }
}

/// Whether `name` (`slwk-PID...`) names a process that no longer runs.
fn owner_gone(name: &str) -> bool {
    name.strip_prefix(&format!("{NS_PREFIX}-"))
        .and_then(|p| p.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Takes down clusters of test runs that were killed before their cleanup: those in
/// `parent/slwk-PID` whose PID no longer runs.
pub fn remove_stale(parent: &Path) {
    let Ok(dir) = fs::read_dir(parent) else {
        return;
    };
    for entry in dir.filter_map(|e| e.ok()) {
        if owner_gone(&entry.file_name().to_string_lossy()) {
            let _ = down(&entry.path());
        }
    }
}

/// Takes down the cluster lab in `dir` if the process that made it no longer runs
/// (a run killed before its cleanup left its processes, namespaces and state); a
/// lab whose maker still runs is left alone.
pub fn remove_if_stale(dir: &Path) -> Result<()> {
    let Ok(cluster) = Cluster::load(dir) else {
        return Ok(());
    };
    if owner_gone(&cluster.state.prefix) {
        say(&format!(
            "taking down the lab {} left in {} by a run that no longer runs",
            cluster.state.prefix,
            dir.display()
        ));
        down(dir)?;
    }
    Ok(())
}

/// A cluster for a test: its own directory and namespaces named after this process.
pub fn for_test(spec: &Spec) -> Result<Cluster> {
    for_test_named(spec, "")
}

/// Like [`for_test`], for a test that runs several clusters at once: `name` tells
/// them apart.
pub fn for_test_named(spec: &Spec, name: &str) -> Result<Cluster> {
    let parent = std::env::temp_dir();
    remove_stale(&parent);
    let mut prefix = format!("{NS_PREFIX}-{}", std::process::id());
    if !name.is_empty() {
        prefix.push('-');
        prefix.push_str(name);
    }
    Cluster::up(spec, &parent.join(&prefix), &prefix)
}

/// Which backends answered `n` new TCP connections from the network namespace
/// `netns` to `to` (either family), with how many connections each; failed
/// connections are counted under `"(failed)"`.
pub fn tcp_spread(
    netns: &str,
    to: impl Into<SocketAddr>,
    n: usize,
) -> Result<std::collections::BTreeMap<String, usize>> {
    let to = to.into();
    spread(netns, n, move || {
        crate::servers::tcp_request(to, Duration::from_secs(2))
    })
}

/// The same for UDP: one datagram per request, each from a new socket.
pub fn udp_spread(
    netns: &str,
    to: impl Into<SocketAddr>,
    n: usize,
) -> Result<std::collections::BTreeMap<String, usize>> {
    let to = to.into();
    spread(netns, n, move || {
        crate::servers::udp_request(to, Duration::from_millis(500))
    })
}

fn spread(
    netns: &str,
    n: usize,
    request: impl Fn() -> Result<crate::servers::Reply> + Send + 'static,
) -> Result<std::collections::BTreeMap<String, usize>> {
    netns::in_netns(netns, move || {
        let mut seen = std::collections::BTreeMap::new();
        for _ in 0..n {
            let who = match request() {
                Ok(reply) => reply.backend,
                Err(_) => "(failed)".to_string(),
            };
            *seen.entry(who).or_insert(0) += 1;
        }
        seen
    })
}

impl Cluster {
    /// The IPv4 ClusterIP of Service `namespace/name` ([`Self::cluster_ips`]).
    pub fn cluster_ip(&self, namespace: &str, name: &str) -> Result<Ipv4Addr> {
        self.cluster_ips(namespace, name)?
            .into_iter()
            .find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            })
            .with_context(|| format!("Service {namespace}/{name} has no IPv4 ClusterIP"))
    }

    /// Every ClusterIP of Service `namespace/name` (`spec.clusterIPs`: one per
    /// family, the primary family's first).
    pub fn cluster_ips(&self, namespace: &str, name: &str) -> Result<Vec<IpAddr>> {
        let ips = self.kubectl(&[
            "-n",
            namespace,
            "get",
            "svc",
            name,
            "-o",
            "jsonpath={.spec.clusterIPs[*]}",
        ])?;
        ips.split_whitespace()
            .map(|ip| {
                ip.parse()
                    .with_context(|| format!("Service {namespace}/{name}: ClusterIP {ip:?}"))
            })
            .collect()
    }

    /// The pid of a process the lab started (`kube-apiserver`, `sliceway-controller`, ...).
    pub fn daemon_pid(&self, name: &str) -> Result<u32> {
        let file = self.dir().join("pids").join(name);
        fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{} holds no pid", file.display()))
    }

    /// Restarts the proxy on `node` (SIGKILL, as a crash, then a new process).
    pub fn kill_proxy(&self, node: &str) -> Result<()> {
        let file = self.dir().join("pids").join(format!("proxy-{node}"));
        let pid: i32 = fs::read_to_string(&file)?.trim().parse()?;
        // SAFETY: a pid this lab started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_until("the proxy gone", Duration::from_secs(10), || !alive(pid))?;
        Ok(())
    }
}

/// A control plane (etcd and kube-apiserver only, no nodes) shared by the tests of
/// one test binary: started by the first test that asks, taken down when the process
/// exits (an `atexit` handler; test binaries end with `exit`).
pub fn shared_control_plane() -> Result<&'static Cluster> {
    shared_control_plane_with(&[])
}

/// [`shared_control_plane`] with flags added to kube-apiserver's. Every caller in one
/// test binary must ask for the same flags (the first call starts the control plane).
pub fn shared_control_plane_with(apiserver_args: &[&str]) -> Result<&'static Cluster> {
    type Shared = (Vec<String>, std::result::Result<Cluster, String>);
    static CP: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
    extern "C" fn take_down() {
        if let Some((_, Ok(c))) = CP.get() {
            let _ = down(&c.state.dir);
        }
    }
    let args: Vec<String> = apiserver_args.iter().map(|a| a.to_string()).collect();
    let (started_with, c) = CP.get_or_init(|| {
        let spec = Spec {
            nodes: 0,
            proxy: Proxy::None,
            controller: Controllers::Upstream,
            workloads: false,
            apiserver_args: args.clone(),
            ..Spec::default()
        };
        let parent = std::env::temp_dir();
        remove_stale(&parent);
        let prefix = format!("{NS_PREFIX}-{}", std::process::id());
        let c = match Cluster::up(&spec, &parent.join(&prefix), &prefix) {
            Ok(mut c) => {
                c.owned = false;
                // SAFETY: registers a plain function; it runs once at exit.
                unsafe { libc::atexit(take_down) };
                Ok(c)
            }
            Err(e) => Err(format!("{e:#}")),
        };
        (args.clone(), c)
    });
    if *started_with != args {
        bail!("the shared control plane runs with kube-apiserver flags {started_with:?}, not {args:?}");
    }
    c.as_ref()
        .map_err(|e| anyhow::anyhow!("the shared control plane did not start: {e}"))
}

impl Cluster {
    /// A kube-rs client for the cluster's admin (the same identity as `kubectl`).
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.state.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The API server's URL on the root namespace's loopback.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.state.apiserver_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lab_is_stale_only_when_the_process_in_its_name_is_gone() {
        let me = std::process::id();
        assert!(!owner_gone(&format!("{NS_PREFIX}-{me}-fig7")));
        assert!(!owner_gone(&format!("{NS_PREFIX}-{me}")));
        // Above the kernel's largest PID (2^22): never a running process.
        assert!(owner_gone(&format!("{NS_PREFIX}-4194305-fig7")));
        // Not a lab's name, or no PID in it: never taken down.
        assert!(!owner_gone("other-4194305-fig7"));
        assert!(!owner_gone(&format!("{NS_PREFIX}-fig7")));
    }

    #[test]
    fn remove_if_stale_leaves_a_directory_without_a_lab_alone() {
        let dir = std::env::temp_dir().join(format!("slw-no-lab-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        remove_if_stale(&dir).unwrap();
        assert!(dir.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_ipv6_twin_reads_like_its_ipv4_address() {
        assert_eq!(
            lab_v6(Ipv4Addr::new(10, 244, 1, 5)).to_string(),
            "fd00:10:244:1::5"
        );
        assert_eq!(
            lab_v6(Ipv4Addr::new(10, 100, 0, 11)).to_string(),
            "fd00:10:100:0:0:0:0:11"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .to_string()
        );
        assert_eq!(lab_v6(Ipv4Addr::new(10, 244, 2, 254)).segments()[7], 0x254);
    }
}

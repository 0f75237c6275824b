//! The node-lab figures: new-connection latency through the node (figure 2), the
//! baselines' programming time (figure 3) and the agent's memory (figure 4).
//!
//! Everything runs inside the lab's namespaces: the agent and every `iptables-restore`,
//! `nft` and `conntrack` command are started with `nsenter --net` into the lab's node
//! namespace, whose name is checked to carry the lab prefix first. The root
//! namespace's rules are never read or written.

use std::{
    fs,
    io::{BufRead, BufReader},
    net::SocketAddrV4,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;

use super::{
    kubeproxy::{self, Nfacct},
    model::{self, Svc},
    stats::{percentile, Rng, Summary},
    Config,
};
use sliceway_lab::{in_netns, metric_value, servers, Agent, Lab, NS_PREFIX};

/// The proxies compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proxy {
    Sliceway,
    Iptables,
    Nftables,
    /// No proxy: the client straight to the backend pods, the figure's floor.
    Floor,
}

impl Proxy {
    pub fn name(self) -> &'static str {
        match self {
            Proxy::Sliceway => "sliceway",
            Proxy::Iptables => "iptables",
            Proxy::Nftables => "nftables",
            Proxy::Floor => "floor (straight to the pod)",
        }
    }
}

/// A command run in the lab's node namespace, and nowhere else.
fn node_command(ns: &str, program: &str) -> Result<Command> {
    ensure!(
        ns.starts_with(&format!("{NS_PREFIX}-")),
        "refusing to run {program} outside a lab namespace ({ns:?})"
    );
    let path = format!("/var/run/netns/{ns}");
    ensure!(Path::new(&path).exists(), "no namespace {ns}");
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={path}")).arg(program);
    Ok(cmd)
}

/// Runs `program args < stdin` in the node namespace; returns its wall time.
fn in_node(ns: &str, program: &str, args: &[&str], stdin: Option<&Path>) -> Result<Duration> {
    in_node_limited(ns, program, args, stdin, None)?
        .context("no time limit was set, yet the command timed out")
}

/// As `in_node`, killing the command after `limit`: `None` when it did not finish.
fn in_node_limited(
    ns: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&Path>,
    limit: Option<Duration>,
) -> Result<Option<Duration>> {
    let mut cmd = node_command(ns, program)?;
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    match stdin {
        Some(p) => {
            cmd.stdin(fs::File::open(p).with_context(|| format!("opening {}", p.display()))?)
        }
        None => cmd.stdin(Stdio::null()),
    };
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    if let Some(limit) = limit {
        while child.try_wait()?.is_none() {
            if start.elapsed() > limit {
                // nsenter --net execs the program in place: this is the program.
                let _ = child.kill();
                let _ = child.wait();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err: String = err.chars().take(2000).collect();
        bail!("{program} {args:?} in {ns} failed: {}", err.trim());
    }
    Ok(Some(took))
}

/// Removes every rule and tracked connection from the node namespace (only there).
pub fn flush_node(ns: &str, legacy_used: bool) {
    let _ = in_node(ns, "nft", &["flush", "ruleset"], None);
    if legacy_used {
        for table in ["nat", "filter", "mangle"] {
            let _ = in_node(ns, "iptables-legacy", &["-t", table, "-F"], None);
            let _ = in_node(ns, "iptables-legacy", &["-t", table, "-X"], None);
        }
    }
    let _ = in_node(ns, "conntrack", &["-F"], None);
}

/// kube-proxy's nfacct counters made in the node namespace `ns` as kube-proxy makes
/// them in its own, so its INVALID drop rule loads in the form it has on this kernel
/// ([`Nfacct`]).
fn node_nfacct(ns: &str) -> Result<Nfacct> {
    in_netns(ns, kubeproxy::ensure_nfacct_counters)?
        .with_context(|| format!("kube-proxy's nfacct counters in namespace {ns}"))
}

/// A scratch directory for rule files and manifests, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(prefix: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("{prefix}-bench"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
    pub fn file(&self, name: &str, text: &str) -> Result<PathBuf> {
        let p = self.0.join(name);
        fs::write(&p, text)?;
        Ok(p)
    }
    /// A fresh, empty manifest directory.
    pub fn manifests(&self, name: &str) -> Result<PathBuf> {
        let p = self.0.join(name);
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p)?;
        Ok(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A `sliceway-agent run` in the node namespace, started by the lab's `Agent` with
/// `--no-pin` (its maps stay private and its programs detach when it exits, so each
/// proxy starts from a clean node), with its start time and memory at hand.
pub struct AgentProc {
    agent: Agent,
    started: Instant,
}

/// Samples `used` (CPU time so far, ns) once a second until a second used under
/// `under_ns`: the time waited, or `None` once `limit` has passed without one.
fn idle_within(
    limit: Duration,
    under_ns: u64,
    mut used: impl FnMut() -> Result<u64>,
) -> Result<Option<Duration>> {
    let t = Instant::now();
    let mut last = used()?;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = used()?;
        if now.saturating_sub(last) < under_ns {
            return Ok(Some(t.elapsed()));
        }
        if t.elapsed() > limit {
            return Ok(None);
        }
        last = now;
    }
}

/// Waits until the proxy `pid` is idle (under 20 ms of CPU in a second: its start-up
/// syncs done, and the answers to the metrics polls that watched for them), at most
/// `limit`; the time waited. Measured while a proxy was still busy, every side's p99,
/// even the floor's run beside it, carried its CPU: connections waited about 10 ms for
/// a core (softirq work deferred to ksoftirqd on 2 cores).
pub fn settled(pid: u32, limit: Duration) -> Result<Duration> {
    idle_within(limit, 20_000_000, || super::scale::cpu_ns(pid))?
        .with_context(|| format!("the proxy was still busy after {limit:?}"))
}

/// The machine's busy CPU time so far, milliseconds: `/proc/stat`'s user, nice,
/// system, irq, softirq and steal of all CPUs (USER_HZ is 100 on Linux).
pub fn busy_ms() -> Result<u64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let cpu = stat
        .lines()
        .next()
        .filter(|l| l.starts_with("cpu "))
        .context("/proc/stat has no cpu line")?;
    let v: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    ensure!(v.len() >= 8, "/proc/stat's cpu line is short: {cpu}");
    Ok((v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) * 10)
}

/// The most CPU the whole machine may use in a second for it to count as quiet.
pub const QUIET_MS_PER_S: u64 = 50;

/// Waits until the machine is quiet (under [`QUIET_MS_PER_S`] of CPU in a second, all
/// cores together), at most `limit`; whether it got so. After a baseline's load the
/// kernel goes on working for a while (freeing the rules it replaced, deferred
/// work), and a side measured in that time carries it.
pub fn quiet_machine(limit: Duration) -> Result<bool> {
    Ok(idle_within(limit, QUIET_MS_PER_S * 1_000_000, || {
        Ok(busy_ms()? * 1_000_000)
    })?
    .is_some())
}

/// A sync, as the agent's metrics show it.
#[derive(Clone, Copy, Debug)]
pub struct Synced {
    /// From the agent's start to its metrics showing the sync.
    pub since_start: Duration,
    /// The agent's own measure of its syncs until then (compile + map writes, from
    /// `sliceway_sync_duration_seconds`), microseconds: the first sync programs the
    /// whole manifest directory, so this is that one sync.
    pub micros: u64,
}

impl AgentProc {
    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.agent.pid()
    }

    /// Starts the agent on `manifests` with `extra` arguments for `run` (the
    /// capacities of [`capacity_args`]).
    pub fn start(lab: &Lab, manifests: &Path, extra: &[String]) -> Result<Self> {
        let started = Instant::now();
        let source = [
            "--manifests".into(),
            manifests.as_os_str().to_owned(),
            "--no-pin".into(),
        ];
        let agent = Agent::start_with_args(
            &lab.node.name,
            &source,
            &lab.pod_interfaces(),
            &lab.bpffs,
            extra,
        )?;
        Ok(Self { agent, started })
    }

    /// Waits for a sync that programmed `frontends` frontends.
    pub fn wait_synced(&mut self, frontends: usize, timeout: Duration) -> Result<Synced> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            // Until its metrics server is up, the agent has programmed nothing.
            if let Ok(metrics) = self.agent.metrics() {
                let programmed = metric_value(&metrics, "sliceway_frontends");
                if programmed == Some(frontends as f64) {
                    let seconds = metric_value(&metrics, "sliceway_sync_duration_seconds_sum")
                        .context("no sliceway_sync_duration_seconds_sum in the agent's metrics")?;
                    return Ok(Synced {
                        since_start: self.started.elapsed(),
                        micros: (seconds * 1e6) as u64,
                    });
                }
            }
            if let Some(status) = self.agent.exit_status() {
                bail!(
                    "the agent exited ({status}); its log:\n{}",
                    self.agent.log().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!(
            "the agent did not program {frontends} frontends within {timeout:?}; its log:\n{}",
            self.agent.log().join("\n")
        )
    }

    /// Peak and current resident set size, in KiB (`VmHWM`, `VmRSS`). `nsenter --net`
    /// execs the agent in place, so the child's pid is the agent's.
    pub fn memory_kib(&self) -> Result<(u64, u64)> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.agent.pid()))?;
        let get = |key: &str| {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("no {key} in /proc/PID/status"))
        };
        Ok((get("VmHWM:")?, get("VmRSS:")?))
    }

    /// Kernel memory of the BPF maps the agent holds open, in KiB: the `memlock`
    /// of each map in `/proc/PID/fdinfo` (what `bpftool map show` prints), each map
    /// once (`map_id`) however many descriptors it has.
    pub fn map_memory_kib(&self) -> Result<u64> {
        let dir = format!("/proc/{}/fdinfo", self.agent.pid());
        let mut maps = std::collections::BTreeMap::new();
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
            let Ok(info) = fs::read_to_string(entry?.path()) else {
                continue;
            };
            let field = |key: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let (Some(id), Some(bytes)) = (field("map_id:"), field("memlock:")) {
                maps.insert(id, bytes);
            }
        }
        if maps.is_empty() {
            bail!("no BPF map among the agent's descriptors ({dir})");
        }
        Ok(maps.values().sum::<u64>() / 1024)
    }

    pub fn stop(&mut self) {
        self.agent.stop();
    }
}

/// The agent's capacity flags for `services` Services of one port each, `backends`
/// distinct backends and `slots` backend slots in all: none while the defaults hold
/// them, else each map that must grow at the next power of two. Each Service takes two
/// entries of the frontends map (its port and its ClusterIP's marker), so the default
/// of 131,072 holds about 65,000 Services.
pub fn capacity_args(services: usize, backends: usize, slots: usize) -> Vec<String> {
    use dataplane_common::capacity;
    let mut args = Vec::new();
    for (flag, needed, default) in [
        ("--max-services", 2 * services, capacity::SERVICES),
        ("--max-backends", backends, capacity::BACKENDS),
        ("--max-slots", slots, capacity::SLOTS),
    ] {
        if needed > default as usize {
            args.push(flag.to_string());
            args.push(needed.next_power_of_two().to_string());
        }
    }
    args
}

/// Services per manifest file: two documents each, well within the agent's cap on
/// documents per file (100,000, `conventions::manifests::MAX_DOCUMENTS`; the rest of
/// a longer file is skipped).
const SERVICES_PER_FILE: usize = 10_000;

/// Writes `services` into manifest directory `dir` as files of at most
/// [`SERVICES_PER_FILE`] Services.
fn write_manifests(dir: &Path, services: &[Svc]) -> Result<()> {
    for (i, chunk) in services.chunks(SERVICES_PER_FILE).enumerate() {
        fs::write(
            dir.join(format!("services-{i:03}.yaml")),
            model::yaml(chunk),
        )?;
    }
    Ok(())
}

/// Timeout for a sync of `n` Services (YAML parsing dominates).
fn sync_timeout(n: usize) -> Duration {
    Duration::from_secs(30 + (n / 100) as u64)
}

// ---------------------------------------------------------------- figure 2

/// Port of figure 2's backend servers.
pub const LATENCY_PORT: u16 = 9090;

/// A server per backend pod that answers as the lab's servers do (`NAME IP`), but
/// blocks in `accept` and answers on the accepting thread, so its own latency is a few
/// microseconds (the lab's servers poll `accept` every 5 ms, which would hide the
/// proxies' differences). It closes only after the client has: the TIME_WAIT of each
/// connection stays with the client, whose port choice avoids it. Closing first, the
/// servers kept one for every recent client port, and with NAT a new connection
/// from a port whose old one went to another Service met it (its SYN taken for an old
/// duplicate, answered with an ACK, retried a second later). Servers and client run at
/// SCHED_FIFO ([`realtime`]). Stopped on drop.
pub struct LatencyServers {
    stop: Arc<std::sync::atomic::AtomicBool>,
    port: u16,
    threads: Vec<(String, std::thread::JoinHandle<()>)>,
}

impl LatencyServers {
    /// Figure 2's: the lab's backend pods, on [`LATENCY_PORT`].
    pub fn start(lab: &Lab) -> Result<Self> {
        let pods: Vec<(String, String, std::net::IpAddr)> = lab
            .backends
            .iter()
            .map(|p| (p.name.clone(), p.ns.clone(), p.ip.into()))
            .collect();
        Self::start_in(&pods, LATENCY_PORT)
    }

    /// One in each pod (name, network namespace, address) on `port`.
    pub fn start_in(pods: &[(String, String, std::net::IpAddr)], port: u16) -> Result<Self> {
        use std::io::{Read as _, Write as _};
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut threads = Vec::new();
        for (name, ns, ip) in pods {
            let listener = in_netns(ns, move || std::net::TcpListener::bind(("0.0.0.0", port)))?
                .with_context(|| format!("listening on :{port} in pod {name}"))?;
            let ident = format!("{name} {ip}\n");
            let stop = stop.clone();
            let t = std::thread::spawn(move || {
                realtime();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let Ok((conn, _)) = listener.accept() else {
                        continue;
                    };
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut reader = BufReader::new(&conn);
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_ok()
                        && (&conn).write_all(ident.as_bytes()).is_ok()
                    {
                        // Until the client's FIN (or the timeout).
                        let _ = reader.read_to_end(&mut Vec::new());
                    }
                }
            });
            threads.push((ns.clone(), t));
        }
        Ok(Self {
            stop,
            port,
            threads,
        })
    }
}

impl Drop for LatencyServers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let port = self.port;
        for (ns, t) in self.threads.drain(..) {
            // Wake the blocked accept from inside the pod.
            let _ = in_netns(&ns, move || {
                std::net::TcpStream::connect(("127.0.0.1", port))
            });
            let _ = t.join();
        }
    }
}

/// Puts the calling thread in SCHED_FIFO (a low real-time priority), so a busy
/// machine's other work cannot hold it off the CPU until the next scheduler tick
/// when its packet arrives. Whether it took.
pub fn realtime() -> bool {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: plain syscall on the calling thread (pid 0) with a valid parameter.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}

/// One (size, proxy) cell of figure 2.
#[derive(Clone, Debug, Serialize)]
pub struct Fig2Row {
    pub services: usize,
    pub proxy: Proxy,
    pub p50_us: Summary,
    pub p99_us: Summary,
    pub connections: usize,
    pub failed: usize,
    /// Whether the machine was quiet when this side started ([`quiet_machine`]);
    /// `false`: still busy after [`QUIET_LIMIT`], measured anyway.
    pub quiet: bool,
}

/// Figure 2.
#[derive(Clone, Debug, Serialize)]
pub struct Fig2 {
    pub method: String,
    pub ipvs: String,
    pub rows: Vec<Fig2Row>,
    /// Baselines whose rules did not load (not measured).
    pub not_loaded: Vec<NotLoaded>,
}

/// A baseline of figure 2 whose rules did not load: killed at the time limit, or
/// refused (`error`, the loader's own words).
#[derive(Clone, Debug, Serialize)]
pub struct NotLoaded {
    pub services: usize,
    pub proxy: Proxy,
    pub loader: Loader,
    pub limit_s: u64,
    pub error: Option<String>,
}

/// `count` connections from the client pod to Services chosen at random; each is a
/// TCP connect plus `hello` and its one-line answer. Microseconds, and failures.
fn latencies(
    lab: &Lab,
    targets: &[SocketAddrV4],
    count: usize,
    seed: u64,
) -> Result<(Vec<f64>, usize)> {
    let targets: Vec<std::net::SocketAddr> = targets.iter().map(|t| (*t).into()).collect();
    let backends: Vec<std::net::IpAddr> = lab.backends.iter().map(|b| b.ip.into()).collect();
    connections(&lab.client.ns, &targets, &backends, count, seed)
}

/// `count` connections from network namespace `client_ns` to targets chosen at
/// random (a seeded sequence): a TCP connect, `hello` and the one-line answer, on a
/// SCHED_FIFO thread ([`realtime`]). Microseconds of those a backend of `backends`
/// answered, and the failures. Figures 2 and 7.
pub fn connections(
    client_ns: &str,
    targets: &[std::net::SocketAddr],
    backends: &[std::net::IpAddr],
    count: usize,
    seed: u64,
) -> Result<(Vec<f64>, usize)> {
    let (targets, backends) = (targets.to_vec(), backends.to_vec());
    in_netns(client_ns, move || {
        if !realtime() {
            eprintln!(
                "bench: the client could not take SCHED_FIFO: {}",
                std::io::Error::last_os_error()
            );
        }
        let mut rng = Rng::new(seed);
        let mut out = Vec::with_capacity(count);
        let mut failed = 0;
        for _ in 0..count {
            let to = targets[rng.below(targets.len())];
            let start = Instant::now();
            match servers::tcp_request(to, Duration::from_secs(2)) {
                Ok(reply) if backends.contains(&reply.addr.into()) => {
                    out.push(start.elapsed().as_secs_f64() * 1e6)
                }
                _ => failed += 1,
            }
        }
        (out, failed)
    })
}

/// Checks that no VIP answers: nothing of the previous proxy is left.
fn assert_nothing_answers(lab: &Lab, services: &[Svc]) -> Result<()> {
    let s = &services[0];
    let to = SocketAddrV4::new(s.vip, s.port);
    let r = in_netns(&lab.client.ns, move || {
        servers::tcp_request(to, Duration::from_millis(300))
    })?;
    if let Ok(reply) = r {
        bail!("{to} answers ({reply:?}) before the proxy is loaded: the node is not clean");
    }
    Ok(())
}

/// How long figure 2 waits for a quiet machine before each side ([`quiet_machine`]).
pub const QUIET_LIMIT: Duration = Duration::from_secs(60);

fn measure_latency(lab: &Lab, cfg: &Config, services: &[Svc], proxy: Proxy) -> Result<Fig2Row> {
    let n = services.len();
    let targets: Vec<SocketAddrV4> = if proxy == Proxy::Floor {
        lab.backends
            .iter()
            .map(|b| SocketAddrV4::new(b.ip, LATENCY_PORT))
            .collect()
    } else {
        services
            .iter()
            .map(|s| SocketAddrV4::new(s.vip, s.port))
            .collect()
    };
    let services = &targets;
    let quiet = quiet_machine(QUIET_LIMIT)?;
    if !quiet {
        super::progress(&format!(
            "figure 2: {n} Services: {}: the machine was still busy after {QUIET_LIMIT:?}; measuring anyway",
            proxy.name()
        ));
    }
    // Warm up (ARP, the backends' accept threads), then measure.
    let _ = latencies(lab, services, 20, 7)?;
    let (mut p50, mut p99, mut total, mut failed) = (vec![], vec![], 0, 0);
    for round in 0..cfg.fig2_rounds {
        let (l, f) = latencies(lab, services, cfg.fig2_connections, 1000 + round as u64)?;
        ensure!(
            f * 100 <= cfg.fig2_connections,
            "{}: {f} of {} connections failed",
            proxy.name(),
            cfg.fig2_connections
        );
        p50.push(percentile(&l, 50.0));
        p99.push(percentile(&l, 99.0));
        total += l.len() + f;
        failed += f;
    }
    Ok(Fig2Row {
        services: n,
        proxy,
        p50_us: Summary::of(&p50),
        p99_us: Summary::of(&p99),
        connections: total,
        failed,
        quiet,
    })
}

/// Figure 2.
pub fn connection_latency(lab: &Lab, cfg: &Config, scratch: &Scratch) -> Result<Fig2> {
    let ns = lab.node.name.clone();
    let legacy = cfg.fig2_iptables == Loader::IptablesLegacyRestore;
    let _servers = LatencyServers::start(lab)?;
    let mut rows = Vec::new();
    let mut not_loaded = Vec::new();
    for &n in &cfg.fig2_sizes {
        let services = model::cluster(n, |_| {
            lab.backends.iter().map(|b| (b.ip, LATENCY_PORT)).collect()
        });
        flush_node(&ns, legacy);
        assert_nothing_answers(lab, &services)?;

        // The floor: no proxy, the client straight to the backend pods.
        super::progress(&format!("figure 2: {n} Services: the floor"));
        rows.push(measure_latency(lab, cfg, &services, Proxy::Floor)?);

        super::progress(&format!("figure 2: {n} Services: sliceway"));
        // sliceway: the real agent, attached to the pods' interfaces.
        let dir = scratch.manifests(&format!("fig2-{n}"))?;
        write_manifests(&dir, &services)?;
        let backends = lab.backends.len();
        let capacities = capacity_args(n, backends, n * backends);
        let mut agent = AgentProc::start(lab, &dir, &capacities)?;
        agent.wait_synced(n, sync_timeout(n))?;
        // Measured once the agent is idle, as figure 7 measures every proxy: at
        // 100,000 Services its sync's tail and the answers to the polls that watched
        // for it keep a core busy for seconds, longer than a quick run's connections.
        settled(agent.pid(), sync_timeout(n)).context("sliceway-agent settling after its sync")?;
        let row = measure_latency(lab, cfg, &services, Proxy::Sliceway);
        agent.stop();
        rows.push(row?);
        assert_nothing_answers(lab, &services)?;

        super::progress(&format!("figure 2: {n} Services: iptables"));
        // iptables, as kube-proxy loads it.
        let nfacct = node_nfacct(&ns)?;
        let rules = scratch.file(
            "iptables.rules",
            &kubeproxy::iptables_full_with(&services, true, nfacct),
        )?;
        let limit = cfg.fig2_load_limit();
        // A baseline's rules loaded within the limit are measured; others, killed at
        // the limit or refused by the loader (the kernel's or the tool's limits at
        // that size), are reported as not loaded and the other sides go on. The node
        // is flushed after either.
        let mut baseline = |proxy: Proxy, loader: Loader, rules: &Path, legacy: bool| {
            let refused = match loader.load_limited(&ns, rules, Some(limit)) {
                Ok(Some(_)) => {
                    let row = measure_latency(lab, cfg, &services, proxy);
                    flush_node(&ns, legacy);
                    rows.push(row?);
                    return anyhow::Ok(());
                }
                Ok(None) => None,
                Err(e) => {
                    let e = format!("{e:#}");
                    super::progress(&format!(
                        "figure 2: {n} Services: {} refused the rules: {e}",
                        loader.name()
                    ));
                    Some(e)
                }
            };
            flush_node(&ns, legacy);
            not_loaded.push(NotLoaded {
                services: n,
                proxy,
                loader,
                limit_s: limit.as_secs(),
                error: refused,
            });
            anyhow::Ok(())
        };
        baseline(Proxy::Iptables, cfg.fig2_iptables, &rules, legacy)?;
        assert_nothing_answers(lab, &services)?;

        super::progress(&format!("figure 2: {n} Services: nftables"));
        // nftables, as kube-proxy loads it.
        let rules = scratch.file("nft.rules", &kubeproxy::nft_full(&services))?;
        baseline(Proxy::Nftables, Loader::Nft, &rules, false)?;
    }
    Ok(Fig2 {
        method: format!(
            "From the client pod's namespace, through the lab node to the 3 backend pods: each \
             sample is a TCP connect to a Service chosen at random plus a one-line request and \
             its one-line answer (wall clock in the client). Every Service has the same 3 \
             backend pods, each answering from a server that blocks in accept. {conns} connections per round after 20 warm-up connections, \
             {rounds} rounds; p50 and p99 of each round, median [min–max] over rounds. \
             sliceway: the sliceway-agent binary attached to the node's pod interfaces, \
             measured once it is idle after its sync (under 20 ms of CPU in a second); \
             every side, the floor too, once the machine is quiet (under 50 ms of CPU in \
             a second over both cores, waited for up to 60 s, as after a baseline's load \
             the kernel goes on working for a while); \
             iptables / nftables: kube-proxy's rule layouts for the same Services, \
             generated here as kube-proxy v1.37.2 writes them (not kube-proxy itself, \
             which figure 7 runs in that version, and a test compares the two; \
             generated, they load 10,000 Services without an \
             API server and time the rules alone; above 1,000 endpoints in all, that is \
             at every size here, in kube-proxy's large cluster mode, without the endpoint \
             rules' comments) and loaded into the \
             node namespace (iptables rules with `{iptables}`), with the agent stopped (its \
             programs detach when it exits) and the rules and conntrack flushed between \
             proxies. The floor: the client straight to the backend pods' addresses, no \
             Service and no rules, in the same run. A baseline whose rules do not load \
             within {limit} s is killed and reported as not loaded, as is one whose \
             loader refuses them (with its error); above 65,000 Services \
             the agent runs with its frontends map raised (two entries per Service: its \
             port and its ClusterIP).{why}",
            limit = cfg.fig2_load_limit().as_secs(),
            conns = cfg.fig2_connections,
            rounds = cfg.fig2_rounds,
            iptables = cfg.fig2_iptables.name(),
            why = if legacy {
                " The iptables rules are loaded with the legacy (x_tables) backend: \
                 `iptables-restore` with the nf_tables backend takes minutes to load 10,000 \
                 Services, and the legacy backend keeps kube-proxy's linear KUBE-SERVICES \
                 chain the same series at every size."
            } else {
                ""
            },
        ),
        ipvs: "IPVS is not built into this kernel (no ip_vs module): kube-proxy's IPVS mode \
               cannot be measured here."
            .into(),
        rows,
        not_loaded,
    })
}

// ---------------------------------------------------------------- figure 3

/// A baseline loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Loader {
    /// `iptables-restore` (the distribution's default: the nf_tables backend here).
    #[serde(rename = "iptables-restore")]
    IptablesRestore,
    /// `iptables-legacy-restore` (the x_tables backend).
    #[serde(rename = "iptables-legacy-restore")]
    IptablesLegacyRestore,
    #[serde(rename = "nft -f")]
    Nft,
}

impl Loader {
    pub fn name(self) -> &'static str {
        match self {
            Loader::IptablesRestore => "iptables-restore",
            Loader::IptablesLegacyRestore => "iptables-legacy-restore",
            Loader::Nft => "nft -f",
        }
    }

    fn load(self, ns: &str, file: &Path) -> Result<Duration> {
        self.load_limited(ns, file, None)?
            .context("no time limit was set, yet the load timed out")
    }

    /// Loads `file`; `None` when it did not finish within `limit` (it is killed).
    fn load_limited(
        self,
        ns: &str,
        file: &Path,
        limit: Option<Duration>,
    ) -> Result<Option<Duration>> {
        let restore = ["--noflush", "--counters"];
        match self {
            Loader::IptablesRestore => {
                in_node_limited(ns, "iptables-restore", &restore, Some(file), limit)
            }
            Loader::IptablesLegacyRestore => {
                in_node_limited(ns, "iptables-legacy-restore", &restore, Some(file), limit)
            }
            Loader::Nft => {
                in_node_limited(ns, "nft", &["-f", &file.to_string_lossy()], None, limit)
            }
        }
    }

    fn full_text(self, services: &[Svc], nfacct: Nfacct) -> String {
        match self {
            Loader::Nft => kubeproxy::nft_full(services),
            _ => kubeproxy::iptables_full_with(services, true, nfacct),
        }
    }

    fn change_text(self, services: &[Svc], changed: usize, stale: &Svc, nfacct: Nfacct) -> String {
        match self {
            Loader::Nft => kubeproxy::nft_partial(services, changed),
            _ => kubeproxy::iptables_partial_with(services, changed, stale, nfacct),
        }
    }
}

/// A baseline's full load at one size.
#[derive(Clone, Debug, Serialize)]
pub struct BaselineFull {
    pub services: usize,
    pub loader: Loader,
    pub rules_bytes: usize,
    pub ms: Summary,
    /// The load was killed at the time limit: `ms` is a lower bound.
    pub timed_out: bool,
}

/// A baseline's reprogramming after one endpoint changed.
#[derive(Clone, Debug, Serialize)]
pub struct BaselineChange {
    pub services: usize,
    pub loader: Loader,
    /// What is loaded: kube-proxy's partial sync, or a full resync.
    pub what: String,
    pub rules_bytes: usize,
    pub ms: Summary,
}

/// The same cluster with endpoint 0 of Service `changed` replaced by a new address.
pub fn with_one_endpoint_changed(services: &[Svc], changed: usize) -> Vec<Svc> {
    let mut after = services.to_vec();
    let ep = &mut after[changed].endpoints[0];
    ep.0 = std::net::Ipv4Addr::new(10, 127, 255, 254);
    after[changed].endpoints.sort();
    after
}

/// Figure 3's baselines: full loads at each size, then the one-endpoint change at
/// `cfg.fig3_change_size`.
pub fn baseline_programming(
    lab: &Lab,
    cfg: &Config,
    scratch: &Scratch,
    loaders: &[Loader],
) -> Result<(Vec<BaselineFull>, Vec<BaselineChange>)> {
    let ns = lab.node.name.clone();
    let mut full = Vec::new();
    let mut change = Vec::new();
    let legacy = loaders.contains(&Loader::IptablesLegacyRestore);
    let nfacct = node_nfacct(&ns)?;
    let mut sizes = cfg.fig3_sizes.clone();
    if !sizes.contains(&cfg.fig3_change_size) {
        sizes.push(cfg.fig3_change_size);
    }
    for &n in &sizes {
        let services = model::fake_cluster(n, cfg.fig3_endpoints);
        for &loader in loaders {
            super::progress(&format!("figure 3: {n} Services: {}", loader.name()));
            let text = loader.full_text(&services, nfacct);
            let file = scratch.file("full.rules", &text)?;
            let rounds = cfg.fig3_rounds_for(loader, n);
            let mut ms = Vec::new();
            let mut timed_out = false;
            for _ in 0..rounds {
                flush_node(&ns, legacy);
                match loader.load_limited(&ns, &file, Some(cfg.fig3_load_limit()))? {
                    Some(d) => ms.push(d.as_secs_f64() * 1e3),
                    None => {
                        timed_out = true;
                        ms = vec![cfg.fig3_load_limit().as_secs_f64() * 1e3];
                        break;
                    }
                }
            }
            if cfg.fig3_sizes.contains(&n) {
                full.push(BaselineFull {
                    services: n,
                    loader,
                    rules_bytes: text.len(),
                    ms: Summary::of(&ms),
                    timed_out,
                });
            }
            if n != cfg.fig3_change_size || timed_out {
                continue;
            }
            // The rules of `services` are loaded: change one endpoint back and forth.
            let changed = n / 2;
            let after = with_one_endpoint_changed(&services, changed);
            let forward = loader.change_text(&after, changed, &services[changed], nfacct);
            let backward = loader.change_text(&services, changed, &after[changed], nfacct);
            let (f, b) = (
                scratch.file("fwd.rules", &forward)?,
                scratch.file("back.rules", &backward)?,
            );
            let mut ms = Vec::new();
            for _ in 0..cfg.fig3_change_rounds {
                ms.push(loader.load(&ns, &f)?.as_secs_f64() * 1e3);
                loader.load(&ns, &b)?;
            }
            change.push(BaselineChange {
                services: n,
                loader,
                what: match loader {
                    Loader::Nft => "kube-proxy's transaction for the change (the Service chain flushed and its one DNAT rule written anew; no endpoint chains without session affinity)".into(),
                    _ if kubeproxy::large_cluster(&services) => "kube-proxy's partial restore in large cluster mode (KUBE-SERVICES in full, the changed Service's chains; the stale endpoint chain left for the clean-up once a sync period)".into(),
                    _ => "kube-proxy's partial restore (KUBE-SERVICES in full, the changed Service's chains, the stale endpoint chain deleted)".into(),
                },
                rules_bytes: forward.len(),
                ms: Summary::of(&ms),
            });
            if loader != Loader::Nft {
                // A full resync with the change (kube-proxy before 1.27, and its
                // periodic full syncs since, except in large cluster mode, where only a
                // restart, a failed restore, a topology change or its canary chain gone
                // make one).
                let text = kubeproxy::iptables_full_with(&after, false, nfacct);
                let back_text = kubeproxy::iptables_full_with(&services, false, nfacct);
                let (f, b) = (
                    scratch.file("fwd-full.rules", &text)?,
                    scratch.file("back-full.rules", &back_text)?,
                );
                let mut ms = Vec::new();
                for _ in 0..cfg.fig3_rounds_for(loader, n) {
                    ms.push(loader.load(&ns, &f)?.as_secs_f64() * 1e3);
                    loader.load(&ns, &b)?;
                }
                change.push(BaselineChange {
                    services: n,
                    loader,
                    what: "a full restore with the change".into(),
                    rules_bytes: text.len(),
                    ms: Summary::of(&ms),
                });
            }
        }
        flush_node(&ns, legacy);
    }
    Ok((full, change))
}

// ---------------------------------------------------------------- figure 4

/// One size of figure 4.
#[derive(Clone, Debug, Serialize)]
pub struct Fig4Row {
    pub services: usize,
    pub endpoints_per_service: usize,
    /// The agent's capacity flags beyond its defaults ([`capacity_args`]), if any.
    pub capacities: String,
    /// Peak resident set size (`VmHWM`), MiB.
    pub peak_rss_mib: Summary,
    /// Resident set size after the first sync (`VmRSS`), MiB.
    pub rss_mib: Summary,
    /// Kernel memory of the agent's BPF maps (`memlock`), MiB.
    pub map_mib: Summary,
    /// From the agent's start to its metrics showing its first full sync, milliseconds.
    pub start_to_synced_ms: Summary,
    /// The agent's own measure of that sync (compile + map writes), milliseconds.
    pub agent_sync_ms: Summary,
}

/// Figure 4.
#[derive(Clone, Debug, Serialize)]
pub struct Fig4 {
    pub method: String,
    pub rows: Vec<Fig4Row>,
}

/// Figure 4.
pub fn agent_memory(lab: &Lab, cfg: &Config, scratch: &Scratch) -> Result<Fig4> {
    flush_node(&lab.node.name, false);
    let mut rows = Vec::new();
    for &n in &cfg.fig4_sizes {
        let services = model::fake_cluster(n, cfg.fig3_endpoints);
        let dir = scratch.manifests(&format!("fig4-{n}"))?;
        write_manifests(&dir, &services)?;
        let (mut peak, mut rss, mut start, mut sync) = (vec![], vec![], vec![], vec![]);
        let mut maps = vec![];
        let endpoints = n * cfg.fig3_endpoints;
        let capacities = capacity_args(n, endpoints, endpoints);
        for _ in 0..cfg.fig4_rounds {
            let mut agent = AgentProc::start(lab, &dir, &capacities)?;
            let synced = agent.wait_synced(n, sync_timeout(n))?;
            // Let the first sync's temporaries go, then read.
            std::thread::sleep(Duration::from_millis(300));
            let (hwm, now) = agent.memory_kib()?;
            let map_kib = agent.map_memory_kib()?;
            agent.stop();
            maps.push(map_kib as f64 / 1024.0);
            peak.push(hwm as f64 / 1024.0);
            rss.push(now as f64 / 1024.0);
            start.push(synced.since_start.as_secs_f64() * 1e3);
            sync.push(synced.micros as f64 / 1e3);
        }
        rows.push(Fig4Row {
            services: n,
            endpoints_per_service: cfg.fig3_endpoints,
            capacities: capacities.join(" "),
            peak_rss_mib: Summary::of(&peak),
            rss_mib: Summary::of(&rss),
            map_mib: Summary::of(&maps),
            start_to_synced_ms: Summary::of(&start),
            agent_sync_ms: Summary::of(&sync),
        });
    }
    Ok(Fig4 {
        method: format!(
            "The sliceway-agent binary in the lab node, attached to the pods' interfaces, with \
             N Services of {} endpoints each as YAML in its manifest directory; VmHWM (peak \
             resident set) and VmRSS read from /proc/PID/status 300 ms after its first sync; \
             {} runs, median [min–max]. BPF map memory is kernel memory, charged to the memory \
             cgroup, not to the RSS: the memlock of each map the agent holds open, from \
             /proc/PID/fdinfo (what bpftool map show prints), at the agent's default \
             capacities where they hold the Services, else with the maps that must grow \
             raised to the next power of two (the capacities column); the maps are \
             allocated whole at load, so it does not grow with the Services until a \
             capacity must.",
            cfg.fig3_endpoints, cfg.fig4_rounds
        ),
        rows,
    })
}

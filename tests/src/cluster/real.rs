//! Real nodes of the cluster lab (`--kubelet real`): on every node, containerd and
//! upstream's kubelet from the node kit (`scripts/node-kit.sh`), with real containers,
//! pod networking through the ptp CNI plugin from the node's pod CIDRs, `kubectl
//! exec`, `logs` and `port-forward`, and hostNetwork pods in the node's namespace.
//!
//! Each node's containerd and kubelet share a mount namespace and a UTS namespace of
//! their own (the node's hostname is its name, as hostNetwork pods see it), entered
//! after the node's network namespace (`nsenter --net`, so the host's cgroup mounts
//! stay visible). In the mount namespace:
//! - `/run`, `/var/lib` and `/var/log` are fresh tmpfs mounts, so what containerd,
//!   libcni and kubelet write at fixed host paths (`/run/containerd`, `/var/lib/cni`,
//!   `/var/log/containers`) stays with the node and vanishes with it;
//! - the kernel tunables kubelet insists on (`setupKernelTunables` of
//!   <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/kubelet/cm/container_manager_linux.go>:
//!   `kernel.panic_on_oops=1`, `kernel.panic=10`, `vm.overcommit_memory=1`, ...) are
//!   files bind-mounted over their `/proc/sys` entries, holding the values kubelet
//!   wants. Kubelet reads them, finds nothing to change, and never writes the host's
//!   real, machine-wide values: a kernel oops on this machine must not panic it.
//!
//! Every node has a cgroup of its own in every hierarchy (`/PREFIX-NODE`, kubelet's
//! `cgroupRoot`); this machine has cgroup v1 only, so kubelet runs with
//! `failCgroupV1: false`. [`stop_node`] removes all of it: pods, shims, processes,
//! cgroups, directories.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use super::{daemon, lab_v6, log_tail_in, say, stop_daemon, wait_until, NodeInfo, State};

/// The cluster's DNS Service address (kubeadm's and kind's choice in their Service
/// CIDR: the tenth address).
pub const CLUSTER_DNS: &str = "10.96.0.10";
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The kernel tunables kubelet sets at start and the values it wants, from
/// `setupKernelTunables` (link above) and
/// <https://github.com/kubernetes/component-helpers/blob/v0.37.2/node/util/sysctl/sysctl.go>.
pub const KUBELET_TUNABLES: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The node kit: its commands and image archives.
#[derive(Clone, Debug)]
pub struct Kit {
    pub bin: PathBuf,
    /// (archive, image name), from `images/names.txt`.
    pub images: Vec<(PathBuf, String)>,
}

impl Kit {
    /// The kit in `SLICEWAY_NODE_KIT_BIN`, else where scripts/node-kit.sh puts it for
    /// the Kubernetes version pinned in upstream/node/kubernetes/go.mod.
    pub fn find() -> Result<Self> {
        let bin = match std::env::var_os("SLICEWAY_NODE_KIT_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let go_mod = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../upstream/node/kubernetes/go.mod");
                let text = fs::read_to_string(&go_mod)
                    .with_context(|| format!("reading {}", go_mod.display()))?;
                let version = text
                    .lines()
                    .find_map(|l| {
                        let l = l.trim();
                        l.strip_prefix("require ")
                            .unwrap_or(l)
                            .strip_prefix("k8s.io/kubernetes ")
                    })
                    .map(str::trim)
                    .context(
                        "no k8s.io/kubernetes requirement in upstream/node/kubernetes/go.mod",
                    )?;
                let cache = match std::env::var_os("SLICEWAY_CACHE") {
                    Some(c) => PathBuf::from(c),
                    None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
                        .join(".cache/sliceway"),
                };
                cache.join("node").join(version).join("bin")
            }
        };
        for c in [
            "kubelet",
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "runc",
            "crictl",
            "ptp",
            "host-local",
            "portmap",
            "loopback",
        ] {
            if !bin.join(c).is_file() {
                bail!(
                    "the node kit in {} has no {c}: run `cargo xtask node-kit` first",
                    bin.display()
                );
            }
        }
        let dir = bin.with_file_name("images");
        let list = dir.join("names.txt");
        let text = fs::read_to_string(&list).with_context(|| {
            format!(
                "reading {}: run `cargo xtask node-kit` first",
                list.display()
            )
        })?;
        let images = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(file, name)| (dir.join(file), name.to_string()))
            .collect();
        Ok(Self { bin, images })
    }

    /// The image whose name starts with `prefix` (`registry.k8s.io/pause:`).
    pub fn image(&self, prefix: &str) -> Result<&(PathBuf, String)> {
        self.images
            .iter()
            .find(|(_, name)| name.starts_with(prefix))
            .with_context(|| format!("the node kit's images/names.txt lists no {prefix}... image"))
    }
}

/// A node's directory in the lab.
pub fn node_dir(state: &State, node: &NodeInfo) -> PathBuf {
    state.dir.join("nodes").join(&node.name)
}

/// A node's cgroup (its kubelet's `cgroupRoot`), in every hierarchy.
pub fn node_cgroup(state: &State, node: &NodeInfo) -> String {
    format!("{}-{}", state.prefix, node.name)
}

/// Host paths a node's mount namespace covers with tmpfs; a lab directory below one
/// of them would vanish from the node's view.
const PRIVATE_MOUNTS: [&str; 3] = ["/run", "/var/lib", "/var/log"];

/// containerd's configuration for a node whose directory is `d`: its state under
/// `d`, the kit's runc and CNI plugins from `bin`, `pause` as the sandbox image.
pub fn containerd_config(d: &Path, bin: &Path, pause: &str) -> String {
    let d = d.display();
    let b = bin.display();
    format!(
        r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/containerd/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{b}/runc"
      Root = "{d}/containerd/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{b}"]
    conf_dir = "{d}/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
    )
}

/// ptp: a veth per pod, addresses from the node's pod CIDRs of both families, no
/// masquerade (the proxy's business).
fn cni_config(d: &Path, node: &NodeInfo) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "lab",
        "plugins": [
            {"type": "ptp", "ipMasq": false, "mtu": 1500, "ipam": {
                "type": "host-local",
                "dataDir": format!("{}/cni/networks", d.display()),
                "ranges": [
                    [{"subnet": format!("{}/24", node.pod_cidr)}],
                    [{"subnet": format!("{}/64", lab_v6(node.pod_cidr))}]
                ],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
}

fn kubelet_config(d: &Path, ca: &Path, cgroup: &str) -> String {
    let d = d.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{d}/containerd.sock
clusterDNS: [{CLUSTER_DNS}]
clusterDomain: {CLUSTER_DOMAIN}
resolvConf: {d}/resolv.conf
podLogsDir: {d}/pod-logs
volumePluginDir: {d}/volume-plugins
# No registry: the kit's images are imported, never pulled, so never collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
serializeImagePulls: false
shutdownGracePeriod: 0s
"#,
        ca = ca.display()
    )
}

/// What a node's mount namespace is set up with before containerd starts in it.
fn mount_script(d: &Path, node: &str, containerd: &Path, config: &Path) -> String {
    let mut s = format!("set -e\nhostname '{node}'\nmount --make-rshared /\n");
    for m in PRIVATE_MOUNTS {
        s.push_str(&format!("mount -t tmpfs -o mode=0755 lab-node {m}\n"));
    }
    // A BPF file system of the node's own, as every machine has: what a pod pins
    // there (deploy/'s DaemonSet mounts the node's /sys/fs/bpf) is this node's only, and
    // goes with the node's mount namespace.
    s.push_str("mount -t bpf lab-node /sys/fs/bpf\n");
    for (key, value) in KUBELET_TUNABLES {
        let file = d.join("tunables").join(key.replace('/', "."));
        s.push_str(&format!(
            "printf '%s\\n' {value} > '{f}'\nmount --bind '{f}' /proc/sys/{key}\n",
            f = file.display()
        ));
    }
    s.push_str(&format!(
        "exec '{}' --config '{}'\n",
        containerd.display(),
        config.display()
    ));
    s
}

/// Runs the kit's `ctr` against the containerd at `socket`, in Kubernetes' namespace.
/// Imports the image archive `tar` (docker-archive, as the node kit and `cargo xtask
/// image` write them) into the `k8s.io` namespace of the containerd at `socket`, where
/// a kubelet's CRI finds it, unpacked for the overlayfs snapshotter.
pub fn import_image(bin: &Path, socket: &Path, tar: &Path) -> Result<()> {
    let tar = tar.to_string_lossy();
    ctr(
        bin,
        socket,
        &[
            "images",
            "import",
            "--digests",
            "--snapshotter=overlayfs",
            &tar,
        ],
    )
    .map(drop)
}

fn ctr(bin: &Path, socket: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(bin.join("ctr"))
        .arg("--address")
        .arg(socket)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .context("running ctr")?;
    if !out.status.success() {
        bail!(
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Imports image archives (`(archive, what to call it in messages)`) into the
/// containerd of `node` at `socket`, where its kubelet finds them.
fn import_images(
    bin: &Path,
    socket: &Path,
    node: &str,
    archives: &[(PathBuf, String)],
) -> Result<()> {
    let start = std::time::Instant::now();
    for (tar, name) in archives {
        import_image(bin, socket, tar)
            .with_context(|| format!("importing {name} from {} into {node}", tar.display()))?;
    }
    say(&format!(
        "imported {} images into {node} in {:.1} s",
        archives.len(),
        start.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The network namespace of the pod `namespace/name` on `node`, as a path the test
/// can `setns` into (`/proc/PID/ns/net` of its sandbox's pause process, which
/// containerd's CRI reports); the pod must be running.
pub fn pod_netns(
    state: &State,
    node: &NodeInfo,
    kit: &Kit,
    namespace: &str,
    name: &str,
) -> Result<PathBuf> {
    let endpoint = format!(
        "unix://{}",
        node_dir(state, node).join("containerd.sock").display()
    );
    let crictl = |args: &[&str]| -> Result<String> {
        let out = Command::new(kit.bin.join("crictl"))
            .args(["--runtime-endpoint", &endpoint, "--timeout", "20s"])
            .args(args)
            .output()
            .context("running crictl")?;
        if !out.status.success() {
            bail!(
                "crictl {args:?} on {}: {}",
                node.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let ids = crictl(&[
        "pods",
        "--namespace",
        namespace,
        "--name",
        name,
        "--state",
        "ready",
        "-q",
    ])?;
    // --name is a pattern: keep the sandbox whose name is exactly `name`.
    for id in ids.split_whitespace() {
        let info: serde_json::Value = serde_json::from_str(&crictl(&["inspectp", id])?)
            .with_context(|| format!("crictl inspectp {id} on {}", node.name))?;
        if info["status"]["metadata"]["name"] != name {
            continue;
        }
        let pid = info["info"]["pid"]
            .as_u64()
            .with_context(|| format!("crictl inspectp {id} on {} gives no pid", node.name))?;
        return Ok(PathBuf::from(format!("/proc/{pid}/ns/net")));
    }
    bail!("no ready pod sandbox {namespace}/{name} on {}", node.name)
}

/// Imports image archives into the containerd of every node of a running lab of real
/// nodes (`cargo xtask cluster load-image`), so pods find them without a registry.
pub fn load_images(state: &State, kit: &Kit, archives: &[PathBuf]) -> Result<()> {
    if state.kubelet != super::Kubelet::Real {
        bail!("the lab's nodes are stand-ins, which run no containers: bring it up with --kubelet real");
    }
    let named: Vec<(PathBuf, String)> = archives
        .iter()
        .map(|a| {
            if a.is_file() {
                Ok((a.clone(), a.display().to_string()))
            } else {
                bail!("no image archive at {}", a.display())
            }
        })
        .collect::<Result<_>>()?;
    for node in &state.nodes {
        let socket = node_dir(state, node).join("containerd.sock");
        import_images(&kit.bin, &socket, &node.name, &named)?;
    }
    Ok(())
}

/// Starts containerd and kubelet on `node`, with the kit's images imported.
pub fn start_node(state: &State, node: &NodeInfo, kit: &Kit, apiserver: &str) -> Result<()> {
    let d = node_dir(state, node);
    for m in PRIVATE_MOUNTS {
        if d.starts_with(m) {
            bail!(
                "the lab's directory {} is under {m}, which a real node covers with a \
                 mount of its own: choose another (SLICEWAY_CLUSTER_DIR)",
                state.dir.display()
            );
        }
    }
    for sub in [
        "cni/net.d",
        "cni/networks",
        "containerd",
        "kubelet",
        "pod-logs",
        "volume-plugins",
        "tunables",
    ] {
        fs::create_dir_all(d.join(sub))?;
    }
    let (_, pause) = kit.image("registry.k8s.io/pause:")?;
    let config = d.join("containerd.toml");
    fs::write(&config, containerd_config(&d, &kit.bin, pause))?;
    fs::write(
        d.join("cni/net.d/10-lab.conflist"),
        serde_json::to_vec_pretty(&cni_config(&d, node))?,
    )?;
    // Pods of dnsPolicy Default resolve with this: nothing outside the lab.
    fs::write(
        d.join("resolv.conf"),
        "# the lab's nodes resolve nothing outside the lab\n",
    )?;
    let pki = state.dir.join("pki");
    fs::write(
        d.join("kubelet.yaml"),
        kubelet_config(&d, &pki.join("ca.crt"), &node_cgroup(state, node)),
    )?;
    let node_id = format!("node-{}", node.name);
    super::pki::client(
        &pki,
        &node_id,
        &format!("system:node:{}", node.name),
        &["system:nodes"],
    )?;
    let kubeconfig = super::pki::kubeconfig(
        &pki,
        &d.join("kubelet.kubeconfig"),
        apiserver,
        Some(&node_id),
        None,
    )?;
    make_cgroup(&node_cgroup(state, node))?;

    say(&format!("starting containerd on {}", node.name));
    let path = format!(
        "{}:{}",
        kit.bin.display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    );
    let pid = daemon(
        &state.dir,
        &format!("containerd-{}", node.name),
        Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", node.netns))
            .args([
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "sh",
                "-c",
            ])
            .arg(mount_script(
                &d,
                &node.name,
                &kit.bin.join("containerd"),
                &config,
            ))
            .env("PATH", &path),
    )?;
    let socket = d.join("containerd.sock");
    wait_until(
        &format!("containerd on {} answering", node.name),
        Duration::from_secs(60),
        || ctr(&kit.bin, &socket, &["version"]).is_ok(),
    )
    .with_context(|| log_tail_in(&state.dir, &format!("containerd-{}", node.name)))?;
    let own = fs::read_link("/proc/self/ns/mnt")?;
    let theirs = fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .with_context(|| format!("containerd on {} (pid {pid}) is gone", node.name))?;
    if own == theirs {
        bail!(
            "containerd on {} runs in this process's mount namespace",
            node.name
        );
    }
    import_images(&kit.bin, &socket, &node.name, &kit.images)?;

    say(&format!("starting kubelet on {}", node.name));
    let kubelet_log = d.join("kubelet");
    daemon(
        &state.dir,
        &format!("kubelet-{}", node.name),
        Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", node.netns))
            .arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .arg(format!("--uts=/proc/{pid}/ns/uts"))
            .arg(kit.bin.join("kubelet"))
            .arg(format!("--config={}", d.join("kubelet.yaml").display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}", kubelet_log.display()))
            .arg(format!("--hostname-override={}", node.name))
            .arg(format!("--node-ip={},{}", node.ip, lab_v6(node.ip)))
            .arg(format!(
                "--node-labels=topology.kubernetes.io/zone={}",
                node.zone
            ))
            .arg("--v=1")
            .env("PATH", &path),
    )?;
    Ok(())
}

/// The host's own values of the tunables kubelet wants ([`KUBELET_TUNABLES`]): a
/// real node must leave them as they were.
pub fn host_tunables() -> Vec<(String, String)> {
    KUBELET_TUNABLES
        .iter()
        .map(|(key, _)| {
            (
                key.to_string(),
                fs::read_to_string(format!("/proc/sys/{key}"))
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            )
        })
        .collect()
}

/// Stops `node`'s kubelet, its pods, containerd and every process they left, and
/// removes the node's cgroups. Returns what could not be removed.
pub fn stop_node(state: &State, node: &NodeInfo, kit_bin: Option<&Path>) -> Vec<String> {
    let d = node_dir(state, node);
    stop_daemon(&state.dir, &format!("kubelet-{}", node.name));
    let socket = d.join("containerd.sock");
    if let (Some(bin), true) = (kit_bin, socket.exists()) {
        // Through the runtime first, so that it tears down the pods' networks.
        let endpoint = format!("unix://{}", socket.display());
        let crictl = |args: &[&str]| {
            Command::new(bin.join("crictl"))
                .args(["--runtime-endpoint", &endpoint, "--timeout", "20s"])
                .args(args)
                .output()
        };
        if let Ok(out) = crictl(&["pods", "-q"]) {
            for pod in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = crictl(&["stopp", pod]);
                let _ = crictl(&["rmp", "-f", pod]);
            }
        }
    }
    stop_daemon(&state.dir, &format!("containerd-{}", node.name));
    let cgroup = node_cgroup(state, node);
    let marker = d.to_string_lossy().into_owned();
    kill_node_processes(&marker, &cgroup);
    let mut left: Vec<String> = processes_mentioning(&marker)
        .into_iter()
        .map(|p| format!("process {p} of {}", node.name))
        .collect();
    for mount in mounts_under(&d) {
        let c = std::ffi::CString::new(mount.as_str()).expect("no NUL in a mount point");
        // SAFETY: umount2 on a mount point read from mountinfo, under this node's dir.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            left.push(format!(
                "mount {mount}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    left.extend(remove_cgroup(&cgroup));
    left
}

/// The cgroup hierarchies of this machine (v1 controllers and the unified one).
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect()
}

/// Makes `cgroup` at the top of every hierarchy; a new cpuset gets its parent's
/// CPUs and memory nodes, without which no process may join it.
pub fn make_cgroup(cgroup: &str) -> Result<()> {
    for h in hierarchies() {
        let dir = h.join(cgroup);
        fs::create_dir_all(&dir).with_context(|| format!("making cgroup {}", dir.display()))?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = fs::read_to_string(h.join(f)) {
                if fs::read_to_string(dir.join(f))
                    .unwrap_or_default()
                    .trim()
                    .is_empty()
                {
                    fs::write(dir.join(f), v.trim())
                        .with_context(|| format!("writing {}", dir.join(f).display()))?;
                }
            }
        }
    }
    Ok(())
}

/// Kills (SIGKILL) every process whose command line mentions `marker` (a node's
/// directory: its shims) or that runs in `cgroup` (the node's pods), until none is left
/// or five seconds have passed; what is left the caller reports.
pub fn kill_node_processes(marker: &str, cgroup: &str) {
    for _ in 0..50 {
        let mut pids = processes_mentioning(marker);
        pids.extend(cgroup_processes(cgroup));
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: kill(2) on a process of this node (found by its directory or cgroup).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Process ids whose command line mentions `marker`, this process excepted.
pub fn processes_mentioning(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .collect()
}

/// Process ids in `cgroup` or below it, in any hierarchy.
pub fn cgroup_processes(cgroup: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for h in hierarchies() {
        let mut stack = vec![h.join(cgroup)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.filter_map(|e| e.ok()) {
                if e.path().is_dir() {
                    stack.push(e.path());
                }
            }
            if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(
                    procs
                        .split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    pids
}

/// Whether `cgroup` exists in any hierarchy.
pub fn cgroup_exists(cgroup: &str) -> bool {
    hierarchies().iter().any(|h| h.join(cgroup).exists())
}

/// Removes `cgroup` depth first in every hierarchy; returns what stayed.
pub fn remove_cgroup(cgroup: &str) -> Vec<String> {
    fn remove(dir: &Path, left: &mut Vec<String>) {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.filter_map(|e| e.ok()) {
                if e.path().is_dir() {
                    remove(&e.path(), left);
                }
            }
        }
        if dir.exists() {
            if let Err(e) = fs::remove_dir(dir) {
                left.push(format!("cgroup {}: {e}", dir.display()));
            }
        }
    }
    let mut left = Vec::new();
    for h in hierarchies() {
        remove(&h.join(cgroup), &mut left);
    }
    left
}

/// Mount points at or under `dir` in this mount namespace, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    let mut found: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m == &prefix || m.starts_with(&format!("{prefix}/")))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.len()));
    found.dedup();
    found
}

/// CoreDNS as the cluster DNS, the shape of upstream's add-on
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/cluster/addons/dns/coredns/coredns.yaml.in>):
/// ServiceAccount, ClusterRole and binding, the Corefile, one replica, and the
/// `kube-dns` Service at [`CLUSTER_DNS`]. The Corefile has no `forward`: names
/// outside the cluster are never asked of anything outside the lab.
pub fn coredns_manifest(image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects:
- {{kind: ServiceAccount, name: coredns, namespace: kube-system}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:53 {{
        errors
        health {{
            lameduck 5s
        }}
        ready
        kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }}
        cache 30
        loop
        reload
        loadbalance
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {{matchLabels: {{k8s-app: kube-dns}}}}
  template:
    metadata: {{labels: {{k8s-app: kube-dns}}}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations:
      - {{key: CriticalAddonsOnly, operator: Exists}}
      - {{key: node-role.kubernetes.io/control-plane, effect: NoSchedule}}
      containers:
      - name: coredns
        image: {image}
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        volumeMounts:
        - {{name: config-volume, mountPath: /etc/coredns, readOnly: true}}
        ports:
        - {{containerPort: 53, name: dns, protocol: UDP}}
        - {{containerPort: 53, name: dns-tcp, protocol: TCP}}
        - {{containerPort: 9153, name: metrics, protocol: TCP}}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {{add: [NET_BIND_SERVICE], drop: [ALL]}}
          readOnlyRootFilesystem: true
        livenessProbe:
          httpGet: {{path: /health, port: 8080}}
          initialDelaySeconds: 60
          timeoutSeconds: 5
        readinessProbe:
          httpGet: {{path: /ready, port: 8181}}
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items: [{{key: Corefile, path: Corefile}}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns, kubernetes.io/name: CoreDNS}}
spec:
  selector: {{k8s-app: kube-dns}}
  clusterIP: {CLUSTER_DNS}
  ports:
  - {{name: dns, port: 53, protocol: UDP}}
  - {{name: dns-tcp, port: 53, protocol: TCP}}
  - {{name: metrics, port: 9153, protocol: TCP}}
"#
    )
}

/// kube-proxy as kubeadm installs it
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kubeadm/app/phases/addons/proxy/manifests.go>
/// and `proxy.go` beside it): the `kube-proxy` ServiceAccount bound to the
/// `system:node-proxier` ClusterRole, the `kube-proxy` ConfigMap (`kubeconfig.conf`
/// naming the control plane at `server` with the pod's service account token and CA,
/// `config.conf` a KubeProxyConfiguration in `mode` for `cluster_cidr`), and the
/// `kube-proxy` DaemonSet running `image` with kubeadm's command, mounts and
/// tolerations. The configuration leaves netfilter's conntrack sysctls as they are
/// (`maxPerCore: 0` and the zero timeouts): a lab node's network namespace cannot set
/// the machine-wide ones.
pub fn kube_proxy_manifest(image: &str, server: &str, cluster_cidr: &str, mode: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: kube-proxy, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "kubeadm:node-proxier"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-proxier"}}
subjects:
- {{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}}
---
kind: ConfigMap
apiVersion: v1
metadata:
  name: kube-proxy
  namespace: kube-system
  labels: {{app: kube-proxy}}
data:
  kubeconfig.conf: |-
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: {server}
      name: default
    contexts:
    - context:
        cluster: default
        namespace: default
        user: default
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
  config.conf: |-
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    bindAddress: 0.0.0.0
    clientConnection:
      kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
    clusterCIDR: {cluster_cidr}
    conntrack:
      maxPerCore: 0
      tcpEstablishedTimeout: 0s
      tcpCloseWaitTimeout: 0s
    mode: "{mode}"
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels: {{k8s-app: kube-proxy}}
  name: kube-proxy
  namespace: kube-system
spec:
  selector:
    matchLabels: {{k8s-app: kube-proxy}}
  updateStrategy: {{type: RollingUpdate}}
  template:
    metadata:
      labels: {{k8s-app: kube-proxy}}
    spec:
      priorityClassName: system-node-critical
      containers:
      - name: kube-proxy
        image: {image}
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=$(NODE_NAME)
        securityContext:
          privileged: true
        volumeMounts:
        - {{mountPath: /var/lib/kube-proxy, name: kube-proxy}}
        - {{mountPath: /run/xtables.lock, name: xtables-lock, readOnly: false}}
        - {{mountPath: /lib/modules, name: lib-modules, readOnly: true}}
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef: {{fieldPath: spec.nodeName}}
      hostNetwork: true
      serviceAccountName: kube-proxy
      volumes:
      - name: kube-proxy
        configMap: {{name: kube-proxy}}
      - name: xtables-lock
        hostPath: {{path: /run/xtables.lock, type: FileOrCreate}}
      - name: lib-modules
        hostPath: {{path: /lib/modules}}
      tolerations:
      - operator: Exists
      nodeSelector:
        kubernetes.io/os: linux
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_script_covers_every_tunable_before_containerd_starts() {
        let s = mount_script(
            Path::new("/lab/nodes/node-1"),
            "node-1",
            Path::new("/kit/containerd"),
            Path::new("/lab/nodes/node-1/containerd.toml"),
        );
        let exec = s
            .find("exec '/kit/containerd'")
            .expect("containerd is exec'd");
        for (key, value) in KUBELET_TUNABLES {
            let bind = s
                .find(&format!("/proc/sys/{key}\n"))
                .unwrap_or_else(|| panic!("{key} is not covered"));
            assert!(bind < exec, "{key} is covered after containerd starts");
            assert!(s.contains(&format!("printf '%s\\n' {value} >")));
        }
        for m in PRIVATE_MOUNTS {
            assert!(s.contains(&format!(" {m}\n")), "{m} is not private");
        }
    }
}

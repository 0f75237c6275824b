//! The real-node kit of scripts/node-kit.sh works, with no kubelet (issue 45): in a
//! network namespace of its own, with no route out, one containerd with its own root,
//! state and socket imports the pause and agnhost archives, lists them under the names
//! the e2e suite asks for, and runs a pod sandbox and an agnhost container through
//! crictl with the ptp CNI configuration; the container answers `crictl exec` and an
//! HTTP request from the node namespace. Everything is removed afterwards (processes,
//! mounts, cgroups, namespace, directories), on failure too, and the test checks that.
//!
//! Run by `cargo xtask node-kit --check`, which builds the kit first and passes its bin
//! directory in `SLICEWAY_NODE_KIT_BIN`.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use sliceway_lab::{
    cluster::real::{
        containerd_config, import_image, kill_node_processes, mounts_under, processes_mentioning,
        remove_cgroup, Kit,
    },
    netns::{self, Netns},
};

/// One containerd in the namespace, and everything it made, removed by [`Node::remove`]
/// or on drop.
struct Node {
    ns: Option<Netns>,
    dir: PathBuf,
    cgroup: String,
    bin: PathBuf,
    containerd: Option<Child>,
    /// Directories of the host that containerd and libcni make at fixed places (the
    /// shims' sockets, the CNI result cache) and that did not exist before: removed
    /// again when empty.
    host_dirs: Vec<PathBuf>,
    /// The CNI network's name: the cache's result files start with it.
    network: String,
    removed: bool,
}

impl Node {
    /// A network namespace with loopback only and one containerd in it, configured as a
    /// node of the cluster lab is (`pause` its sandbox image, ptp for pods), answering.
    /// `tag` keeps two of one test process apart.
    fn start(bin: &Path, pause: &str, tag: &str) -> Result<Self> {
        netns::remove_stale("slkit");
        let pid = std::process::id();
        let id = format!("slkit-{pid}-{tag}");
        let dir = std::env::temp_dir().join(&id);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("cni/net.d"))?;
        let mut node = Node {
            ns: Some(Netns::create(&id)?),
            dir: dir.clone(),
            cgroup: id.clone(),
            bin: bin.to_path_buf(),
            containerd: None,
            host_dirs: HOST_DIRS
                .iter()
                .map(PathBuf::from)
                .filter(|d| !d.exists())
                .collect(),
            network: id.clone(),
            removed: false,
        };
        // The namespace has loopback only: nothing in it has a route out of it.
        let routes = node
            .ns
            .as_ref()
            .unwrap()
            .run("ip", &["route", "show", "table", "all"])?;
        assert!(
            !routes.lines().any(|l| l.starts_with("default")),
            "the node namespace must have no default route: {routes}"
        );

        let d = dir.display();
        // The configuration a real node of the cluster lab runs with.
        fs::write(dir.join("config.toml"), containerd_config(&dir, bin, pause))?;
        // ptp as the lab's nodes will use it: a veth per pod, addresses from the node's
        // pod CIDR, no masquerade.
        let cni = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": id,
            "plugins": [
                {"type": "ptp", "ipMasq": false, "mtu": 1500, "ipam": {
                    "type": "host-local",
                    "dataDir": format!("{d}/cni/networks"),
                    "ranges": [[{"subnet": "10.244.1.0/24"}]],
                    "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        fs::write(
            dir.join("cni/net.d/10-slkit.conflist"),
            serde_json::to_vec_pretty(&cni)?,
        )?;

        let log = fs::File::create(dir.join("containerd.log"))?;
        node.containerd = Some(
            Command::new("nsenter")
                .arg(format!("--net=/var/run/netns/{id}"))
                .arg(bin.join("containerd"))
                .arg("--config")
                .arg(dir.join("config.toml"))
                .env("PATH", path_with(bin))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting containerd")?,
        );
        wait_for("containerd", Duration::from_secs(30), || {
            node.ctr(&["version"]).is_ok()
        })?;
        Ok(node)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn ns(&self) -> &str {
        &self
            .ns
            .as_ref()
            .expect("namespace present until removed")
            .name
    }

    /// Runs a kit command in the node namespace, with the kit first on PATH.
    fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let out = Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", self.ns()))
            .arg(self.bin.join(program))
            .args(args)
            .env("PATH", path_with(&self.bin))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {program}"))?;
        if !out.status.success() {
            bail!(
                "{program} {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn ctr(&self, args: &[&str]) -> Result<String> {
        let socket = self.socket();
        let mut all = vec!["--address", socket.to_str().unwrap(), "-n", "k8s.io"];
        all.extend_from_slice(args);
        self.run("ctr", &all)
    }

    fn crictl(&self, args: &[&str]) -> Result<String> {
        let endpoint = format!("unix://{}", self.socket().display());
        let mut all = vec![
            "--runtime-endpoint",
            endpoint.as_str(),
            "--image-endpoint",
            endpoint.as_str(),
            "--timeout",
            "60s",
        ];
        all.extend_from_slice(args);
        self.run("crictl", &all)
    }

    /// Removes everything and reports what could not be removed.
    fn remove(&mut self) -> Vec<String> {
        if self.removed {
            return Vec::new();
        }
        self.removed = true;
        let mut left = Vec::new();
        if self.containerd.is_some() {
            // Best effort through the runtime first, so it unmounts and tears down CNI.
            if let Ok(pods) = self.crictl(&["pods", "-q"]) {
                for pod in pods.split_whitespace() {
                    let _ = self.crictl(&["stopp", pod]);
                    let _ = self.crictl(&["rmp", "-f", pod]);
                }
            }
        }
        if let Some(mut child) = self.containerd.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Shims and what runs in the pod's cgroups: found by this node's directory and
        // cgroup, so nothing else is touched.
        let marker = self.dir.to_string_lossy().into_owned();
        kill_node_processes(&marker, &self.cgroup);
        for pid in processes_mentioning(&marker) {
            left.push(format!("process {pid}"));
        }
        for mount in mounts_under(&self.dir) {
            let c = std::ffi::CString::new(mount.as_str()).expect("no NUL in a mount point");
            // SAFETY: umount2 on a mount point read from mountinfo, under this node's dir.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                left.push(format!(
                    "mount {mount}: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        left.extend(remove_cgroup(&self.cgroup));
        if let Ok(entries) = fs::read_dir(CNI_RESULTS) {
            for e in entries.filter_map(|e| e.ok()) {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", self.network))
                {
                    if let Err(err) = fs::remove_file(e.path()) {
                        left.push(format!("CNI result {}: {err}", e.path().display()));
                    }
                }
            }
        }
        for dir in &self.host_dirs {
            if dir.exists() {
                if let Err(e) = fs::remove_dir(dir) {
                    left.push(format!("directory {}: {e}", dir.display()));
                }
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            if self.dir.exists() {
                left.push(format!("directory {}: {e}", self.dir.display()));
            }
        }
        if let Some(ns) = self.ns.take() {
            let name = ns.name.clone();
            drop(ns);
            if Path::new("/var/run/netns").join(&name).exists() {
                left.push(format!("namespace {name}"));
            }
        }
        left
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for what in self.remove() {
            eprintln!("node kit check: could not remove {what}");
        }
    }
}

/// libcni's result cache (its default cache directory, which containerd does not let
/// a configuration move).
const CNI_RESULTS: &str = "/var/lib/cni/results";

/// The host directories containerd and libcni make at fixed places, deepest first.
const HOST_DIRS: [&str; 4] = [
    "/run/containerd/s",
    "/run/containerd",
    CNI_RESULTS,
    "/var/lib/cni",
];

fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    )
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > timeout {
            bail!("{what}: not ready after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// GET `path` from `addr`, from inside namespace `ns`; the body.
fn http_get(ns: &str, addr: SocketAddr, path: &str) -> Result<String> {
    let path = path.to_string();
    netns::in_netns(ns, move || -> Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
            bail!("{addr}{path} answered {head:?}");
        }
        Ok(body.to_string())
    })?
}

#[test]
#[ignore = "needs scripts/node-kit.sh (run by cargo xtask node-kit --check) and root"]
fn node_kit_runs_agnhost_in_a_pod() -> Result<()> {
    // Kit::find checks every command this test runs.
    let kit = Kit::find()?;
    let bin = kit.bin.clone();
    let image = |prefix: &str| kit.image(prefix).cloned();
    let (pause_tar, pause) = image("registry.k8s.io/pause:")?;
    let (agnhost_tar, agnhost) = image("registry.k8s.io/e2e-test-images/agnhost:")?;

    let mut node = Node::start(&bin, &pause, "node")?;
    let dir = node.dir.clone();
    let name = node.ns().to_string();
    let pid = std::process::id();
    let d = dir.display();
    let result = (|| -> Result<()> {
        for tar in [&pause_tar, &agnhost_tar] {
            import_image(&node.bin, &node.socket(), tar)
                .with_context(|| format!("importing {}", tar.display()))?;
        }
        let listed = node.ctr(&["images", "list", "-q"])?;
        for want in [&pause, &agnhost] {
            assert!(
                listed.lines().any(|l| l.trim() == want),
                "ctr images list has no {want}: {listed}"
            );
        }
        let cri_images = node.crictl(&["images"])?;
        assert!(
            cri_images.contains(agnhost.rsplit_once(':').unwrap().0),
            "crictl images: {cri_images}"
        );

        let pod = serde_json::json!({
            "metadata": {"name": "kit", "namespace": "default", "uid": format!("slkit-{pid}"), "attempt": 0},
            "hostname": "kit-pod",
            "log_directory": format!("{d}/pods"),
            "linux": {"cgroup_parent": format!("/{}", node.cgroup)}
        });
        let container = serde_json::json!({
            "metadata": {"name": "agnhost"},
            "image": {"image": agnhost},
            "args": ["netexec", "--http-port=8080"],
            "log_path": "agnhost.log",
            "linux": {}
        });
        fs::write(dir.join("pod.json"), serde_json::to_vec(&pod)?)?;
        fs::write(dir.join("container.json"), serde_json::to_vec(&container)?)?;
        let pod_json = dir.join("pod.json");
        let pod_json = pod_json.to_str().unwrap();
        let sandbox = node.crictl(&["runp", pod_json])?.trim().to_string();
        let ctr_json = dir.join("container.json");
        let id = node
            .crictl(&["create", &sandbox, ctr_json.to_str().unwrap(), pod_json])?
            .trim()
            .to_string();
        node.crictl(&["start", &id])?;

        let help = node.crictl(&["exec", &id, "/agnhost", "--help"])?;
        assert!(
            help.contains("netexec"),
            "agnhost --help in the container: {help}"
        );

        let inspect: serde_json::Value =
            serde_json::from_str(&node.crictl(&["inspectp", &sandbox])?)?;
        let ip = inspect["status"]["network"]["ip"]
            .as_str()
            .context("crictl inspectp shows no pod IP")?
            .to_string();
        let addr: SocketAddr = format!("{ip}:8080").parse().context("the pod IP")?;
        let mut body = String::new();
        wait_for(
            "agnhost netexec",
            Duration::from_secs(30),
            || match http_get(node.ns(), addr, "/hostname") {
                Ok(b) => {
                    body = b;
                    true
                }
                Err(_) => false,
            },
        )?;
        assert_eq!(
            body.trim(),
            "kit-pod",
            "netexec /hostname from the node namespace"
        );
        Ok(())
    })();
    if result.is_err() {
        if let Ok(text) = fs::read_to_string(dir.join("containerd.log")) {
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!(
                "containerd's last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    let host_dirs = node.host_dirs.clone();
    let left = node.remove();
    result?;
    assert!(left.is_empty(), "left after removal: {left:?}");
    assert!(processes_mentioning(&dir.to_string_lossy()).is_empty());
    assert!(mounts_under(&dir).is_empty());
    assert!(!dir.exists());
    assert!(!Path::new("/var/run/netns").join(&name).exists());
    for dir in &host_dirs {
        assert!(!dir.exists(), "{} is left", dir.display());
    }
    Ok(())
}

/// The images of `cargo xtask image` (issue 47): containerd imports both archives under
/// the names deploy/ uses, and a container of each, started as kubelet starts one (the
/// image's own entrypoint, only arguments given), runs its binary: the same version
/// as the binary built here.
#[test]
#[ignore = "needs the node kit and sliceway's images (run by cargo xtask test-real) and root"]
fn sliceways_images_run_their_binaries_in_a_pod() -> Result<()> {
    let kit = Kit::find()?;
    let images = std::env::var_os("SLICEWAY_IMAGE_DIR")
        .map(PathBuf::from)
        .context(
            "SLICEWAY_IMAGE_DIR names no directory of images: cargo xtask test-real builds \
             them (cargo xtask image) and sets it",
        )?;
    let (pause_tar, pause) = kit.image("registry.k8s.io/pause:")?.clone();
    let mut node = Node::start(&kit.bin, &pause, "images")?;
    let dir = node.dir.clone();
    let result = (|| -> Result<()> {
        import_image(&node.bin, &node.socket(), &pause_tar)?;
        let pod = serde_json::json!({
            "metadata": {"name": "images", "namespace": "default",
                         "uid": format!("slkit-{}-images", std::process::id()), "attempt": 0},
            "log_directory": format!("{}/pods", dir.display()),
            "linux": {"cgroup_parent": format!("/{}", node.cgroup)}
        });
        let pod_json = dir.join("pod.json");
        fs::write(&pod_json, serde_json::to_vec(&pod)?)?;
        let pod_json = pod_json.to_str().unwrap();
        let sandbox = node.crictl(&["runp", pod_json])?.trim().to_string();
        for name in ["sliceway-agent", "sliceway-controller"] {
            let tar = images.join(format!("{name}.tar"));
            import_image(&node.bin, &node.socket(), &tar)
                .with_context(|| format!("importing {}", tar.display()))?;
            // A docker-archive's `name:tag` is Docker Hub's library name to containerd,
            // the name kubelet looks for when a pod asks for `name:tag`.
            let reference = format!("docker.io/library/{name}:dev");
            let listed = node.ctr(&["images", "list", "-q"])?;
            assert!(
                listed.lines().any(|l| l.trim() == reference),
                "ctr images list has no {reference}: {listed}"
            );
            let container = serde_json::json!({
                "metadata": {"name": name},
                "image": {"image": reference},
                "args": ["--version"],
                "log_path": format!("{name}.log"),
                "linux": {}
            });
            let ctr_json = dir.join(format!("{name}.json"));
            fs::write(&ctr_json, serde_json::to_vec(&container)?)?;
            let id = node
                .crictl(&["create", &sandbox, ctr_json.to_str().unwrap(), pod_json])?
                .trim()
                .to_string();
            node.crictl(&["start", &id])?;
            let mut status = serde_json::Value::Null;
            wait_for(
                &format!("{name} --version to exit"),
                Duration::from_secs(60),
                || match node
                    .crictl(&["inspect", &id])
                    .map(|s| serde_json::from_str(&s))
                {
                    Ok(Ok(v)) => {
                        status = v;
                        status["status"]["state"] == "CONTAINER_EXITED"
                    }
                    _ => false,
                },
            )?;
            assert_eq!(
                status["status"]["exitCode"], 0,
                "{name} --version in its image: {status}"
            );
            // CRI's log format: `<time> stdout F <line>`.
            let log = fs::read_to_string(dir.join("pods").join(format!("{name}.log")))?;
            let printed: Vec<&str> = log
                .lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3))
                .collect();
            let here = Command::new(sliceway_lab::workspace_binary(name)?)
                .arg("--version")
                .output()?;
            let here = String::from_utf8(here.stdout)?;
            assert_eq!(
                printed,
                here.lines().collect::<Vec<_>>(),
                "{name} --version in its image and here"
            );
        }
        Ok(())
    })();
    let left = node.remove();
    result?;
    assert!(left.is_empty(), "left after removal: {left:?}");
    assert!(!dir.exists());
    Ok(())
}

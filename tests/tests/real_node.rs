//! A real node (issue 45): the cluster lab with upstream's kubelet and containerd from
//! the node kit on one node, sliceway-agent as its proxy and sliceway-controller
//! writing the EndpointSlices. Real pods made with kubectl answer through a ClusterIP
//! and its DNS name (CoreDNS), and so does a hostNetwork pod of the same node;
//! `kubectl exec` and `kubectl logs` work; the host's kernel tunables are the ones it
//! had before kubelet started; the root namespace sent nothing to the lab; and taking
//! the lab down leaves no process, namespace, cgroup, mount or file of it.
//!
//! Others install deploy/ on two real nodes from sliceway's images, and run kube-proxy
//! as kubeadm runs it and remove it with deploy/kube-proxy/'s cleanup.
//!
//! Needs root and the node kit: `cargo xtask test-real` builds it and the images,
//! passes their directories in `SLICEWAY_NODE_KIT_BIN` and `SLICEWAY_IMAGE_DIR` and
//! runs these tests (ignored otherwise: the kit is a suite of its own, not part of
//! `cargo xtask test`).

use std::{collections::BTreeSet, path::Path};

use anyhow::{Context, Result};
use sliceway_lab::cluster::{self, guard, real, Controllers, Kubelet, Proxy, Spec};

const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:";

/// Where containerd, libcni and kubelet write on a host of their own: a lab node
/// keeps them in its own mount namespace.
const HOST_PATHS: [&str; 4] = [
    "/run/containerd",
    "/var/lib/cni",
    "/var/log/containers",
    "/var/log/pods",
];

#[test]
#[ignore = "needs the node kit: cargo xtask test-real"]
fn a_real_node_serves_a_cluster_ip_to_its_pods() -> Result<()> {
    let kit = real::Kit::find()?;
    let (_, agnhost) = kit.image(AGNHOST)?;
    let tunables = real::host_tunables();
    let host_paths_before = HOST_PATHS.map(|p| Path::new(p).exists());
    let spec = Spec {
        nodes: 1,
        proxy: Proxy::Sliceway,
        kubelet: Kubelet::Real,
        ..Spec::default()
    };
    let lab = cluster::for_test_named(&spec, "real")?;
    let prefix = lab.state.prefix.clone();
    let dir = lab.state.dir.clone();
    let node = lab.state.nodes[0].clone();
    let cgroup = real::node_cgroup(&lab.state, &node);
    assert_eq!(
        real::host_tunables(),
        tunables,
        "kubelet changed the host's kernel tunables"
    );
    assert!(real::cgroup_exists(&cgroup), "no cgroup {cgroup}");

    let k = |args: &[&str]| lab.kubectl(args);
    // curl in the client pod, through `kubectl exec`.
    let curl = |flags: &str, url: &str| {
        k(&[
            "exec",
            "client",
            "--",
            "curl",
            flags,
            "--max-time",
            "5",
            url,
        ])
        .with_context(|| format!("curl {url} in the client pod"))
    };
    create_web(&lab, agnhost)?;
    k(&[
        "run",
        "client",
        &format!("--image={agnhost}"),
        "--restart=Never",
        "--",
        "pause",
    ])?;
    // A backend in the host network of the client's own node: its replies leave the
    // node's own stack, which only the egress program sees.
    lab.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hostnet, labels: {{app: hostnet}}}}\n\
             spec:\n  hostNetwork: true\n  containers:\n  - {{name: a, image: \"{agnhost}\", \
             args: [netexec, --http-port=9090]}}\n---\napiVersion: v1\nkind: Service\n\
             metadata: {{name: hostnet}}\nspec:\n  selector: {{app: hostnet}}\n  \
             ports: [{{port: 80, targetPort: 9090}}]\n"
        ),
    )?;
    k(&[
        "wait",
        "--for=condition=Ready",
        "pod",
        "--all",
        "--timeout=120s",
    ])?;
    // Real containers: the web pods' names, as each container's hostname.
    let pods = web_pods(&lab)?;
    let ip = lab.cluster_ip("default", "web")?;

    // The ClusterIP and the Service's name, from a pod, through `kubectl exec`: every
    // answer is one of the web pods, and both answer.
    let seen = web_answers(ip, &pods, "the client pod", |url| curl("-s", url))?;
    assert_eq!(seen, pods, "both backends answer through the ClusterIP");
    // The hostNetwork pod answers with its node's hostname: the node's name.
    let answer = curl("-s", "http://hostnet/hostname")?;
    assert_eq!(answer.trim(), node.name, "the hostNetwork backend's answer");
    // The `kubernetes` Service from a pod, through the proxy and the lab's gateway.
    let version = curl("-sk", "https://kubernetes.default/version")?;
    assert!(
        version.contains("\"gitVersion\""),
        "the API server from a pod: {version}"
    );
    let logs = k(&["logs", "deployment/web"])?;
    assert!(
        logs.contains("GET /hostname"),
        "kubectl logs of a web pod: {logs}"
    );
    assert_eq!(
        guard::escaped(&prefix)?,
        0,
        "the root namespace sent packets to the lab's networks"
    );
    assert_eq!(
        real::host_tunables(),
        tunables,
        "the host's kernel tunables changed while the node ran"
    );

    drop(lab);
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(
        real::processes_mentioning(&dir.to_string_lossy()).is_empty(),
        "processes of the lab are left"
    );
    assert!(!real::cgroup_exists(&cgroup), "cgroup {cgroup} is left");
    assert!(real::mounts_under(&dir).is_empty(), "mounts are left");
    let namespaces = sliceway_lab::netns::ip(&["netns", "list"])?;
    assert!(
        !namespaces.contains(&format!("{prefix}-")),
        "namespaces are left: {namespaces}"
    );
    assert!(
        guard::escaped(&prefix).is_err(),
        "the lab's guard table is left"
    );
    for (host, existed) in HOST_PATHS.iter().zip(host_paths_before) {
        assert!(
            existed || !Path::new(host).exists(),
            "{host} was made on the host"
        );
    }
    Ok(())
}

/// deploy/ as an operator applies it and takes it out again (issue 47): a cluster of
/// two real nodes with no proxy and no EndpointSlice controller, sliceway's images
/// (`cargo xtask image`) loaded into every node's containerd, the API server's address
/// in the ConfigMap the DaemonSet reads, then `kubectl apply` of
/// deploy/sliceway-agent.yaml and deploy/sliceway-controller.yaml unchanged: every
/// agent pod becomes Ready, the controller holds its Lease, CoreDNS (waiting until
/// then) becomes ready, and a ClusterIP and its DNS name answer from a pod on every
/// node, only from the Service's pods. Then the uninstall of docs/deploy.md: the
/// manifests deleted (the programs stay attached), deploy/uninstall/ applied, rolled
/// out and deleted; on every node no sliceway program is attached (the kernel's ids of
/// the links the agent pinned are gone, `bpftool net show` lists no sliceway program),
/// nothing is under /sys/fs/bpf/sliceway, every interface's `accept_local` is what it
/// was before the install, and the ClusterIP is no longer translated.
#[test]
#[ignore = "needs the node kit and sliceway's images: cargo xtask test-real"]
fn deploy_installs_and_uninstalls_sliceway_on_a_cluster_without_a_proxy() -> Result<()> {
    let (lab, agnhost) = lab_for_sliceways_images("deploy")?;
    let agnhost = agnhost.as_str();
    let prefix = lab.state.prefix.clone();
    let k = |args: &[&str]| lab.kubectl(args);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let accept_local_before: Vec<_> = lab
        .state
        .nodes
        .iter()
        .map(|node| accept_local(&lab, node))
        .collect::<Result<_>>()?;
    install(&lab)?;
    let agents = k(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=sliceway-agent",
        "-o",
        "jsonpath={range .items[*]}{.spec.nodeName} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
    ])?;
    let ready: BTreeSet<&str> = agents
        .lines()
        .filter_map(|l| l.strip_suffix(" True"))
        .collect();
    let nodes: BTreeSet<&str> = lab.state.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(ready, nodes, "a Ready agent pod on every node: {agents}");
    lease_holder(&lab)?;
    lab.wait_cluster_dns()?;

    let (pods, ip) = web_from_every_node(&lab, &nodes, agnhost)?;

    // A node whose maps are empty (new, or rebooted) comes up again from nothing: its
    // agent reaches the API server at the ConfigMap's address, as no Service (cluster
    // DNS among them) is translated on the node yet. The pins of node-1 are removed
    // (plain `cleanup`, from the agent's own pod), the pod deleted, and the
    // DaemonSet's next pod must make the node serve again.
    let first = &lab.state.nodes[0];
    let old_agent = agent_pod_on(&lab, &first.name)?;
    k(&[
        "-n",
        "kube-system",
        "exec",
        &old_agent,
        "--",
        "sliceway-agent",
        "cleanup",
        "--bpffs-dir=/sys/fs/bpf/sliceway",
    ])?;
    let left = pinned_links(&lab, first)?;
    assert!(left.is_empty(), "pins left after cleanup: {left:?}");
    k(&[
        "-n",
        "kube-system",
        "delete",
        "pod",
        &old_agent,
        "--wait=true",
    ])?;
    rolled_out(&lab, "daemonset/sliceway-agent", 180)?;
    let new_agent = agent_pod_on(&lab, &first.name)?;
    assert_ne!(new_agent, old_agent, "the DaemonSet made no new pod");
    assert!(
        !settled_links(&lab, first)?.is_empty(),
        "the new agent on {} pinned no link",
        first.name
    );
    let client = format!("client-{}", first.name);
    let seen = web_answers(ip, &pods, &client, |url| {
        k(&["exec", &client, "--", "curl", "-s", "--max-time", "5", url])
            .with_context(|| format!("curl {url} in {client} after the restart"))
    })?;
    assert_eq!(
        seen, pods,
        "both backends answer on {} after its agent started from empty maps",
        first.name
    );

    // Uninstalling, as docs/deploy.md says (foreground deletion: kubectl returns once
    // the pods are gone too). The controller first: its pods' interfaces go with them,
    // and the agents, still running, let go of the links they had there.
    let delete = |manifest: &str| {
        k(&[
            "delete",
            "--cascade=foreground",
            "-f",
            &deploy.join(manifest).to_string_lossy(),
        ])
    };
    delete("sliceway-controller.yaml")?;
    // The links the agents pinned, by the kernel's ids, once each agent has let go of
    // the gone pods' links: they must stay attached when the agents go, and go at
    // cleanup.
    let links: Vec<Vec<u64>> = lab
        .state
        .nodes
        .iter()
        .map(|node| settled_links(&lab, node))
        .collect::<Result<_>>()?;
    for (node, ids) in lab.state.nodes.iter().zip(&links) {
        assert!(!ids.is_empty(), "no pinned link on {}", node.name);
    }
    delete("sliceway-agent.yaml")?;
    k(&[
        "-n",
        "kube-system",
        "delete",
        "configmap",
        "sliceway-agent-apiserver",
    ])?;
    let agent_pods = k(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=sliceway-agent",
        "-o",
        "name",
    ])?;
    assert_eq!(agent_pods.trim(), "", "agent pods left after the delete");
    for (node, ids) in lab.state.nodes.iter().zip(&links) {
        assert!(
            ids.iter().all(|id| link_exists(*id)),
            "the agent's links stay attached after the agent on {} went",
            node.name
        );
    }
    // And the nodes keep translating with the last maps written: both backends still
    // answer the ClusterIP from a pod on each node.
    for node in &nodes {
        let client = format!("client-{node}");
        let seen = web_answers(ip, &pods, &client, |url| {
            k(&["exec", &client, "--", "curl", "-s", "--max-time", "5", url])
                .with_context(|| format!("curl {url} in {client} with no agent running"))
        })?;
        assert_eq!(
            seen, pods,
            "both backends answer on {node} with no agent running"
        );
    }
    let cleanup = deploy.join("uninstall/sliceway-cleanup.yaml");
    let cleanup = cleanup.to_string_lossy();
    k(&["apply", "-f", &cleanup])?;
    rolled_out(&lab, "daemonset/sliceway-cleanup", 180)?;
    let cleaners = k(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=sliceway-cleanup",
        "-o",
        "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name}{\"\\n\"}{end}",
    ])?;
    let mut cleaned = BTreeSet::new();
    for line in cleaners.lines() {
        let Some((node, pod)) = line.split_once(' ') else {
            continue;
        };
        let log = k(&["-n", "kube-system", "logs", pod, "-c", "cleanup"])?;
        assert!(
            log.contains("removed pinned maps and links under /sys/fs/bpf/sliceway"),
            "the cleanup on {node}: {log}"
        );
        cleaned.insert(node.to_string());
    }
    assert_eq!(
        cleaned.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        nodes,
        "a cleanup pod on every node: {cleaners}"
    );
    k(&["delete", "--cascade=foreground", "-f", &cleanup])?;
    for ((node, ids), before) in lab.state.nodes.iter().zip(&links).zip(&accept_local_before) {
        for id in ids {
            assert!(!link_exists(*id), "link {id} is left on {}", node.name);
        }
        assert!(
            !sliceway_attached(&lab, node)?,
            "a sliceway program is left on {}",
            node.name
        );
        let pins = on_node(&lab, node, "ls", &["-A", "/sys/fs/bpf"])?;
        assert!(
            !pins.lines().any(|l| l == "sliceway"),
            "/sys/fs/bpf/sliceway is left on {}",
            node.name
        );
        // Each interface as it was, or (a pod's, made since) as the default was.
        let default = before.get("default").cloned().unwrap_or_default();
        for (iface, value) in accept_local(&lab, node)? {
            let want = before.get(&iface).unwrap_or(&default);
            assert_eq!(
                &value, want,
                "net.ipv4.conf.{iface}.accept_local on {}",
                node.name
            );
        }
    }
    // No proxy is left: the ClusterIP is not translated any more.
    let client = format!("client-{}", lab.state.nodes[0].name);
    let url = format!("http://{ip}/hostname");
    assert!(
        k(&["exec", &client, "--", "curl", "-s", "--max-time", "3", &url]).is_err(),
        "{url} still answers after the uninstall"
    );
    assert_eq!(
        guard::escaped(&prefix)?,
        0,
        "the root namespace sent packets to the lab's networks"
    );
    Ok(())
}

/// kubeadm's `kube-proxy` ConfigMap, as kubeadm writes it
/// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kubeadm/app/phases/addons/proxy/manifests.go):
/// `config.conf` (a KubeProxyConfiguration naming the kubeconfig) and
/// `kubeconfig.conf` (the control plane's address, the pod's service account token and
/// CA). deploy/kubeadm/'s patch mounts it where kubeadm mounts it for kube-proxy and
/// gives the agent `--config`: the agents reach the API server through it, with no
/// `sliceway-agent-apiserver` ConfigMap, and Services answer from a pod on each node.
#[test]
#[ignore = "needs the node kit and sliceway's images: cargo xtask test-real"]
fn deploy_reads_kubeadms_kube_proxy_configmap() -> Result<()> {
    let (lab, agnhost) = lab_for_sliceways_images("kubeadm")?;
    let agnhost = agnhost.as_str();
    let prefix = lab.state.prefix.clone();
    let k = |args: &[&str]| lab.kubectl(args);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let config = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         bindAddress: 0.0.0.0\nclientConnection:\n  kubeconfig: \
         /var/lib/kube-proxy/kubeconfig.conf\nclusterCIDR: {}\nmode: \"\"\n",
        cluster::CLUSTER_CIDR
    );
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority: \
         /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n    server: \
         https://{}:{}\n  name: default\ncontexts:\n- context:\n    cluster: default\n    \
         namespace: default\n    user: default\n  name: default\ncurrent-context: default\n\
         users:\n- name: default\n  user:\n    tokenFile: \
         /var/run/secrets/kubernetes.io/serviceaccount/token\n",
        cluster::ADVERTISE_ADDRESS,
        lab.state.apiserver_port
    );
    k(&[
        "-n",
        "kube-system",
        "create",
        "configmap",
        "kube-proxy",
        &format!("--from-literal=config.conf={config}"),
        &format!("--from-literal=kubeconfig.conf={kubeconfig}"),
    ])?;
    k(&[
        "apply",
        "-f",
        &deploy.join("sliceway-agent.yaml").to_string_lossy(),
    ])?;
    k(&[
        "-n",
        "kube-system",
        "patch",
        "daemonset",
        "sliceway-agent",
        "--type=json",
        "--patch-file",
        &deploy
            .join("kubeadm/agent-reads-kube-proxy-configmap.json")
            .to_string_lossy(),
    ])?;
    k(&[
        "apply",
        "-f",
        &deploy.join("sliceway-controller.yaml").to_string_lossy(),
    ])?;
    rolled_out(&lab, "daemonset/sliceway-agent", 300)?;
    rolled_out(&lab, "deployment/sliceway-controller", 300)?;
    let nodes: BTreeSet<&str> = lab.state.nodes.iter().map(|n| n.name.as_str()).collect();
    for node in &nodes {
        let agent = agent_pod_on(&lab, node)?;
        let args = k(&[
            "-n",
            "kube-system",
            "get",
            "pod",
            &agent,
            "-o",
            "jsonpath={.spec.containers[0].args}",
        ])?;
        assert!(
            args.contains("--config=/var/lib/kube-proxy/config.conf"),
            "{agent}: {args}"
        );
    }
    lab.wait_cluster_dns()?;
    web_from_every_node(&lab, &nodes, agnhost)?;
    assert_eq!(
        guard::escaped(&prefix)?,
        0,
        "the root namespace sent packets to the lab's networks"
    );
    Ok(())
}

/// Runs `program` on `node` (its network and mount namespaces, where kubelet and
/// containerd run); its output.
fn on_node(
    lab: &cluster::Cluster,
    node: &cluster::NodeInfo,
    program: &str,
    args: &[&str],
) -> Result<String> {
    let pid = lab.daemon_pid(&format!("containerd-{}", node.name))?;
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", node.netns))
        .arg(format!("--mount=/proc/{pid}/ns/mnt"))
        .arg(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} on {}", node.name))?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {args:?} on {}: {}",
        node.name,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `net.ipv4.conf.*.accept_local` of `node`, by interface (and `all`, `default`).
fn accept_local(
    lab: &cluster::Cluster,
    node: &cluster::NodeInfo,
) -> Result<std::collections::BTreeMap<String, String>> {
    let out = on_node(
        lab,
        node,
        "sh",
        &[
            "-c",
            "for f in /proc/sys/net/ipv4/conf/*/accept_local; do \
             d=${f%/accept_local}; echo \"${d##*/} $(cat $f)\"; done",
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(i, v)| (i.to_string(), v.to_string()))
        .collect())
}

/// The kernel's ids of the links pinned under `node`'s /sys/fs/bpf/sliceway (tcx
/// links of every interface, the socket programs').
/// [`pinned_links`] once the agent of `node` has settled: two readings two seconds
/// apart (the DaemonSet's interface scan runs every second) agree, and no link is on
/// an interface that has gone (a tcx link's `ifindex` is 0 then, until its pin goes).
fn settled_links(lab: &cluster::Cluster, node: &cluster::NodeInfo) -> Result<Vec<u64>> {
    let mut last = pinned_links(lab, node)?;
    for _ in 0..30 {
        std::thread::sleep(std::time::Duration::from_secs(2));
        let now = pinned_links(lab, node)?;
        if now == last && now.iter().all(|(_, ifindex)| *ifindex != Some(0)) {
            return Ok(now.into_iter().map(|(id, _)| id).collect());
        }
        last = now;
    }
    anyhow::bail!(
        "the pinned links of {} did not settle in 60 s: {last:?}",
        node.name
    )
}

/// The kernel's id of every link pinned under `/sys/fs/bpf/sliceway` of `node`, with
/// its interface index where the link has one (tcx; not the socket programs'), sorted.
fn pinned_links(
    lab: &cluster::Cluster,
    node: &cluster::NodeInfo,
) -> Result<Vec<(u64, Option<u64>)>> {
    let pins = on_node(
        lab,
        node,
        "find",
        &[
            "/sys/fs/bpf/sliceway",
            "(",
            "-name",
            "link-*",
            "-o",
            "-name",
            "egress-*",
            "-o",
            "-name",
            "sock-*",
            ")",
        ],
    )?;
    let mut ids = Vec::new();
    for pin in pins.lines() {
        let info = on_node(lab, node, "bpftool", &["-j", "link", "show", "pinned", pin])?;
        let info: serde_json::Value =
            serde_json::from_str(&info).with_context(|| format!("bpftool on {pin}: {info}"))?;
        ids.push((
            info["id"].as_u64().context("a link id")?,
            info["ifindex"].as_u64(),
        ));
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Whether the kernel has a link of id `id` (ids are the whole machine's).
fn link_exists(id: u64) -> bool {
    std::process::Command::new("bpftool")
        .args(["link", "show", "id", &id.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `bpftool net show` lists a sliceway program in `node`'s network namespace:
/// TC filters and XDP (Debian 12's bpftool, 7.1, lists no tcx links; those the test
/// follows by their ids).
fn sliceway_attached(lab: &cluster::Cluster, node: &cluster::NodeInfo) -> Result<bool> {
    Ok(on_node(lab, node, "bpftool", &["net", "show"])?.contains("sliceway"))
}

/// The Service `web` (port 80) over a Deployment of two agnhost `netexec` pods.
fn create_web(lab: &cluster::Cluster, agnhost: &str) -> Result<()> {
    lab.kubectl(&[
        "create",
        "deployment",
        "web",
        &format!("--image={agnhost}"),
        "--replicas=2",
        "--",
        "/agnhost",
        "netexec",
        "--http-port=8080",
    ])?;
    lab.kubectl(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ])?;
    Ok(())
}

/// The names of `web`'s two pods: real containers answer `/hostname` with them.
fn web_pods(lab: &cluster::Cluster) -> Result<BTreeSet<String>> {
    let pods = web_pods_now(lab)?;
    assert_eq!(pods.len(), 2, "web pods: {pods:?}");
    Ok(pods)
}

/// The names of `web`'s pods, as many as there are.
fn web_pods_now(lab: &cluster::Cluster) -> Result<BTreeSet<String>> {
    let pods: BTreeSet<String> = lab
        .kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    Ok(pods)
}

/// Ten requests for `/hostname` to `web`'s ClusterIP `ip` and ten to its DNS name,
/// through `get` (a curl from `client`): every answer one of `pods`; the answers
/// seen.
fn web_answers(
    ip: std::net::Ipv4Addr,
    pods: &BTreeSet<String>,
    client: &str,
    get: impl Fn(&str) -> Result<String>,
) -> Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    for target in [ip.to_string(), "web.default.svc.cluster.local".to_string()] {
        for _ in 0..10 {
            let answer = get(&format!("http://{target}/hostname"))?;
            assert!(
                pods.contains(answer.trim()),
                "{target} answered {answer:?} in {client}, not a web pod ({pods:?})"
            );
            seen.insert(answer.trim().to_string());
        }
    }
    Ok(seen)
}

/// Waits up to `seconds` for `what` (`daemonset/NAME`, `deployment/NAME`) of
/// kube-system to roll out; the error lists kube-system's pods.
fn rolled_out(lab: &cluster::Cluster, what: &str, seconds: u32) -> Result<()> {
    let timeout = format!("--timeout={seconds}s");
    lab.kubectl(&["-n", "kube-system", "rollout", "status", what, &timeout])
        .map(drop)
        .with_context(|| {
            format!(
                "{what} did not roll out: {}",
                lab.kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"])
                    .unwrap_or_default()
            )
        })
}

/// Steps 2 and 3 of docs/deploy.md's installation: the API server's address (as the
/// nodes reach it) in the ConfigMap the DaemonSet reads, then deploy/'s agent and
/// controller manifests applied unchanged and rolled out.
fn install(lab: &cluster::Cluster) -> Result<()> {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    lab.kubectl(&[
        "-n",
        "kube-system",
        "create",
        "configmap",
        "sliceway-agent-apiserver",
        &format!("--from-literal=host={}", cluster::ADVERTISE_ADDRESS),
        &format!("--from-literal=port={}", lab.state.apiserver_port),
    ])?;
    for (manifest, what) in [
        ("sliceway-agent.yaml", "daemonset/sliceway-agent"),
        ("sliceway-controller.yaml", "deployment/sliceway-controller"),
    ] {
        lab.kubectl(&["apply", "-f", &deploy.join(manifest).to_string_lossy()])?;
        rolled_out(lab, what, 300)?;
    }
    Ok(())
}

/// The names of kube-system's pods labelled `app.kubernetes.io/name=NAME`.
fn pods_named(lab: &cluster::Cluster, name: &str) -> Result<BTreeSet<String>> {
    let selector = format!("app.kubernetes.io/name={name}");
    Ok(lab
        .kubectl(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            &selector,
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// Waits up to 120 s for the `sliceway-controller` Lease to be held by one of the
/// controller pods that exist then; the holder's pod.
fn lease_holder(lab: &cluster::Cluster) -> Result<String> {
    let mut holder = String::new();
    let mut controllers = BTreeSet::new();
    sliceway_lab::cluster::wait_until(
        "the sliceway-controller Lease held by a controller pod",
        std::time::Duration::from_secs(120),
        || {
            controllers = pods_named(lab, "sliceway-controller").unwrap_or_default();
            holder = lab
                .kubectl(&[
                    "-n",
                    "kube-system",
                    "get",
                    "lease",
                    "sliceway-controller",
                    "-o",
                    "jsonpath={.spec.holderIdentity}",
                ])
                .unwrap_or_default();
            controllers.iter().any(|c| holder.starts_with(c.as_str()))
        },
    )
    .with_context(|| format!("holder {holder:?}, controller pods {controllers:?}"))?;
    Ok(controllers
        .into_iter()
        .find(|c| holder.starts_with(c.as_str()))
        .expect("checked by the wait"))
}

/// The name of the sliceway-agent pod on node `node`.
fn agent_pod_on(lab: &cluster::Cluster, node: &str) -> Result<String> {
    let selector = format!("spec.nodeName={node}");
    let name = lab.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=sliceway-agent",
        "--field-selector",
        &selector,
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    let names: Vec<&str> = name.split_whitespace().collect();
    anyhow::ensure!(names.len() == 1, "agent pods on {node}: {names:?}");
    Ok(names[0].to_string())
}

/// A cluster of two real nodes without a proxy or controllers, named `name`, with
/// sliceway's images (from `SLICEWAY_IMAGE_DIR`) loaded into every node, and the name
/// of the kit's agnhost image: where the deploy tests install sliceway.
fn lab_for_sliceways_images(name: &str) -> Result<(cluster::Cluster, String)> {
    lab_with_sliceways_images(name, Controllers::None)
}

/// [`lab_for_sliceways_images`] with `controller` writing the EndpointSlices.
fn lab_with_sliceways_images(
    name: &str,
    controller: Controllers,
) -> Result<(cluster::Cluster, String)> {
    let kit = real::Kit::find()?;
    let (_, agnhost) = kit.image(AGNHOST)?;
    let agnhost = agnhost.clone();
    let images = std::path::PathBuf::from(std::env::var_os("SLICEWAY_IMAGE_DIR").context(
        "SLICEWAY_IMAGE_DIR names no directory of images: cargo xtask test-real builds \
         them (cargo xtask image) and sets it",
    )?);
    let spec = Spec {
        nodes: 2,
        proxy: Proxy::None,
        controller,
        kubelet: Kubelet::Real,
        ..Spec::default()
    };
    let lab = cluster::for_test_named(&spec, name)?;
    real::load_images(
        &lab.state,
        &kit,
        &[
            images.join("sliceway-agent.tar"),
            images.join("sliceway-controller.tar"),
        ],
    )?;
    Ok((lab, agnhost))
}

/// The Service `web` ([`create_web`]) and a client pod on each of `nodes`; both web
/// pods must answer the ClusterIP and the Service's name from every client. The web
/// pods' names and the ClusterIP.
fn web_from_every_node(
    lab: &cluster::Cluster,
    nodes: &BTreeSet<&str>,
    agnhost: &str,
) -> Result<(BTreeSet<String>, std::net::Ipv4Addr)> {
    create_web(lab, agnhost)?;
    for node in nodes {
        lab.kubectl_stdin(
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: client-{node}}}\nspec:\n  \
                 nodeName: {node}\n  containers:\n  - {{name: a, image: \"{agnhost}\", \
                 args: [pause]}}\n"
            ),
        )?;
    }
    lab.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod",
        "--all",
        "--timeout=180s",
    ])?;
    let pods = web_pods(lab)?;
    let ip = lab.cluster_ip("default", "web")?;
    for node in nodes {
        let client = format!("client-{node}");
        let seen = web_answers(ip, &pods, &client, |url| {
            lab.kubectl(&["exec", &client, "--", "curl", "-s", "--max-time", "5", url])
                .with_context(|| format!("curl {url} in {client}"))
        })?;
        assert_eq!(seen, pods, "both backends answer on {node}");
    }
    Ok((pods, ip))
}

/// The controller's Deployment through a node drain and a rolling update, as an
/// operator meets them (issue 47): deploy/ installed on two real nodes without a
/// proxy or kube-controller-manager's EndpointSlice controllers. `kubectl drain
/// node-1` evicts through the PodDisruptionBudget (one replica stays up), `web`'s
/// pods move to node-2, and `web`'s ClusterIP answers from a pod on node-2 from both
/// new pods only, with the Lease held by a running controller pod; node-1
/// uncordoned, `kubectl rollout restart` replaces both replicas, a new pod takes the
/// Lease, and `web` scaled to three answers from all three.
#[test]
#[ignore = "needs the node kit and sliceway's images: cargo xtask test-real"]
fn the_controller_writes_endpointslices_through_a_drain_and_a_rolling_update() -> Result<()> {
    let (lab, agnhost) = lab_for_sliceways_images("drain")?;
    let prefix = lab.state.prefix.clone();
    let k = |args: &[&str]| lab.kubectl(args);
    install(&lab)?;
    lease_holder(&lab)?;
    lab.wait_cluster_dns()?;
    let nodes: BTreeSet<&str> = lab.state.nodes.iter().map(|n| n.name.as_str()).collect();
    let (before, ip) = web_from_every_node(&lab, &nodes, &agnhost)?;
    let (drained, kept) = (&lab.state.nodes[0].name, &lab.state.nodes[1].name);
    let client = format!("client-{kept}");
    // Every one of `pods` answers `web`'s ClusterIP and name from `client`: up to 120
    // requests, so a backend missing from the EndpointSlices cannot go unnoticed.
    let all_answer = |pods: &BTreeSet<String>, when: &str| -> Result<()> {
        let mut seen = BTreeSet::new();
        for _ in 0..6 {
            seen.extend(web_answers(ip, pods, &client, |url| {
                k(&["exec", &client, "--", "curl", "-s", "--max-time", "5", url])
                    .with_context(|| format!("curl {url} in {client} {when}"))
            })?);
            if &seen == pods {
                return Ok(());
            }
        }
        anyhow::bail!("{when}: only {seen:?} of {pods:?} answered")
    };

    let on_drained = format!("spec.nodeName={drained}");
    let evicted: BTreeSet<String> = k(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "--field-selector",
        &on_drained,
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?
    .split_whitespace()
    .map(str::to_string)
    .collect();
    // --force: the client pods have no controller; client-{drained} goes with the drain.
    k(&[
        "drain",
        drained,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=300s",
    ])?;
    k(&["rollout", "status", "deployment/web", "--timeout=180s"])?;
    rolled_out(&lab, "deployment/sliceway-controller", 300)?;
    let left = k(&[
        "get",
        "pods",
        "--all-namespaces",
        "--field-selector",
        &on_drained,
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}",
    ])?;
    assert!(
        left.split_whitespace()
            .all(|p| p.starts_with("kube-system/sliceway-agent-")),
        "pods left on {drained} after the drain: {left}"
    );
    let moved = web_pods(&lab)?;
    // Only the pods that ran on the drained node are replaced; the scheduler may
    // have put both on one node.
    assert!(
        moved.is_disjoint(&evicted) && moved.is_superset(&(&before - &evicted)),
        "web's pods after the drain {moved:?}, before {before:?}, on {drained} {evicted:?}"
    );
    lease_holder(&lab)?;
    all_answer(&moved, "after the drain")?;

    k(&["uncordon", drained])?;
    let old_controllers = pods_named(&lab, "sliceway-controller")?;
    k(&[
        "-n",
        "kube-system",
        "rollout",
        "restart",
        "deployment/sliceway-controller",
    ])?;
    rolled_out(&lab, "deployment/sliceway-controller", 300)?;
    let mut holder = lease_holder(&lab)?;
    // The old pods are gone once the rollout is complete; the Lease may still name
    // one for an instant before its release reaches the API server.
    for _ in 0..30 {
        if !old_controllers.contains(&holder) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        holder = lease_holder(&lab)?;
    }
    assert!(
        !old_controllers.contains(&holder),
        "the Lease is still held by {holder}, a pod of before the rolling update"
    );
    k(&["scale", "deployment/web", "--replicas=3"])?;
    k(&["rollout", "status", "deployment/web", "--timeout=180s"])?;
    let scaled = web_pods_now(&lab)?;
    assert_eq!(scaled.len(), 3, "web's pods: {scaled:?}");
    all_answer(&scaled, "after the rolling update")?;
    assert_eq!(
        guard::escaped(&prefix)?,
        0,
        "the root namespace sent packets to the lab's networks"
    );
    Ok(())
}

/// kube-proxy as kubeadm runs it (the DaemonSet of [`real::kube_proxy_manifest`] with
/// the kit's kube-proxy image, iptables mode) serves a ClusterIP from a pod on each of
/// two real nodes; once its DaemonSet is deleted, deploy/kube-proxy/'s cleanup
/// DaemonSet removes its rules from every node and the ClusterIP answers no more: the
/// cluster that sliceway replaces kube-proxy on, and the step that removes kube-proxy.
#[test]
#[ignore = "needs the node kit: cargo xtask test-real"]
fn kube_proxy_runs_as_kubeadm_runs_it_and_its_cleanup_removes_its_rules() -> Result<()> {
    let kit = real::Kit::find()?;
    let agnhost = kit.image(AGNHOST)?.1.clone();
    let kube_proxy = kit.image("registry.k8s.io/kube-proxy:")?.1.clone();
    let spec = Spec {
        nodes: 2,
        proxy: Proxy::None,
        controller: Controllers::Upstream,
        kubelet: Kubelet::Real,
        ..Spec::default()
    };
    let lab = cluster::for_test_named(&spec, "kproxy")?;
    let prefix = lab.state.prefix.clone();
    let k = |args: &[&str]| lab.kubectl(args);
    let server = format!(
        "https://{}:{}",
        cluster::ADVERTISE_ADDRESS,
        lab.state.apiserver_port
    );
    lab.kubectl_stdin(
        &["apply", "-f", "-"],
        &real::kube_proxy_manifest(&kube_proxy, &server, cluster::CLUSTER_CIDR, "iptables"),
    )?;
    rolled_out(&lab, "daemonset/kube-proxy", 300)?;
    lab.wait_cluster_dns()?;
    let nodes: BTreeSet<&str> = lab.state.nodes.iter().map(|n| n.name.as_str()).collect();
    let (_, ip) = web_from_every_node(&lab, &nodes, &agnhost)?;
    for node in &lab.state.nodes {
        let rules = on_node(&lab, node, "nft", &["list", "ruleset"])?;
        assert!(
            rules.contains("KUBE-SERVICES") && rules.contains("KUBE-SVC-"),
            "kube-proxy's chains on {}: {rules}",
            node.name
        );
    }
    k(&[
        "-n",
        "kube-system",
        "delete",
        "--cascade=foreground",
        "daemonset",
        "kube-proxy",
    ])?;
    let cleanup =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kube-proxy/kube-proxy-cleanup.yaml");
    let cleanup = cleanup.to_string_lossy();
    k(&["apply", "-f", &cleanup])?;
    rolled_out(&lab, "daemonset/kube-proxy-cleanup", 180)?;
    for node in &lab.state.nodes {
        let rules = on_node(&lab, node, "nft", &["list", "ruleset"])?;
        assert!(
            !rules.contains("KUBE-SERVICES") && !rules.contains("KUBE-SVC-"),
            "kube-proxy's chains left on {}: {rules}",
            node.name
        );
    }
    k(&["delete", "--cascade=foreground", "-f", &cleanup])?;
    for node in &nodes {
        let client = format!("client-{node}");
        let url = format!("http://{ip}/hostname");
        assert!(
            k(&["exec", &client, "--", "curl", "-s", "--max-time", "3", &url]).is_err(),
            "{url} still answers in {client} after kube-proxy's cleanup"
        );
    }
    assert_eq!(
        guard::escaped(&prefix)?,
        0,
        "the root namespace sent packets to the lab's networks"
    );
    Ok(())
}

/// The steps of docs/deploy.md's "Replacing a running kube-proxy", and its way back,
/// on two real nodes under load: kube-proxy as kubeadm runs it (iptables mode) serves
/// the Service `web`; from a pod on each node, a new connection every 25 ms and three
/// connections kept open (a request every 100 ms each) ask `web`'s ClusterIP; then
/// sliceway is installed beside kube-proxy (with kubeadm's ConfigMap), kube-proxy is
/// deleted and its rules removed by deploy/kube-proxy/'s cleanup, and the way back:
/// kube-proxy applied again beside sliceway, sliceway deleted and deploy/uninstall/'s
/// cleanup run. First kube-proxy is made liberal (`conntrack.tcpBeLiberal`): without
/// it, kube-proxy drops what netfilter finds INVALID, and that is every reply sliceway
/// translated before netfilter saw it: every new connection fails while both run.
/// Each phase's failed requests are counted (the table goes to stderr and
/// `target/real-node/kube-proxy-replacement.md`): none may fail while one proxy runs,
/// or both; at a switch no client's new connections fail twice in a row and an open
/// connection breaks at most once.
#[test]
#[ignore = "needs the node kit and sliceway's images: cargo xtask test-real"]
fn sliceway_replaces_a_running_kube_proxy_under_load_and_back() -> Result<()> {
    use sliceway_lab::http_load::{self, Load};
    use std::time::Duration;

    let (lab, agnhost) = lab_with_sliceways_images("replace", Controllers::Upstream)?;
    let kit = real::Kit::find()?;
    let kube_proxy_image = kit.image("registry.k8s.io/kube-proxy:")?.1.clone();
    let prefix = lab.state.prefix.clone();
    let k = |args: &[&str]| lab.kubectl(args);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let file = |f: &str| deploy.join(f).to_string_lossy().into_owned();
    let server = format!(
        "https://{}:{}",
        cluster::ADVERTISE_ADDRESS,
        lab.state.apiserver_port
    );
    let kube_proxy = real::kube_proxy_manifest(
        &kube_proxy_image,
        &server,
        cluster::CLUSTER_CIDR,
        "iptables",
    );
    lab.kubectl_stdin(&["apply", "-f", "-"], &kube_proxy)?;
    rolled_out(&lab, "daemonset/kube-proxy", 300)?;
    lab.wait_cluster_dns()?;
    let nodes: BTreeSet<&str> = lab.state.nodes.iter().map(|n| n.name.as_str()).collect();
    let (pods, ip) = web_from_every_node(&lab, &nodes, &agnhost)?;
    let pods: Vec<String> = pods.into_iter().collect();
    let kube_proxy_rules = |want: bool| -> Result<()> {
        for node in &lab.state.nodes {
            for _ in 0..60 {
                let rules = on_node(&lab, node, "nft", &["list", "ruleset"])?;
                if rules.contains("KUBE-SVC-") == want {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            let rules = on_node(&lab, node, "nft", &["list", "ruleset"])?;
            anyhow::ensure!(
                rules.contains("KUBE-SVC-") == want,
                "kube-proxy's Service chains on {} (wanted: {want}): {rules}",
                node.name
            );
        }
        Ok(())
    };

    let mut load = Load::new();
    for node in &lab.state.nodes {
        let client = format!("client-{}", node.name);
        let netns = real::pod_netns(&lab.state, node, &kit, "default", &client)?;
        load.client(
            &client,
            &netns,
            std::net::SocketAddr::from((ip, 80)),
            Duration::from_millis(25),
            3,
            &pods,
        )?;
    }
    let steady = || std::thread::sleep(Duration::from_secs(5));
    load.phase("kube-proxy");
    steady();

    // kube-proxy's iptables mode drops INVALID packets unless netfilter is liberal
    // (`syncProxyRules`, pkg/proxy/iptables/proxier.go); the replies sliceway
    // translates before netfilter sees them are INVALID to netfilter, so the two
    // can run side by side only once kube-proxy runs with `conntrack.tcpBeLiberal`.
    for node in &lab.state.nodes {
        let rules = on_node(&lab, node, "nft", &["list", "ruleset"])?;
        anyhow::ensure!(
            rules.contains("ct state invalid"),
            "kube-proxy drops no INVALID packets on {}: {rules}",
            node.name
        );
    }
    load.phase("kube-proxy made liberal");
    let liberal = kube_proxy.replace(
        "    conntrack:\n",
        "    conntrack:\n      tcpBeLiberal: true\n",
    );
    anyhow::ensure!(
        liberal != kube_proxy,
        "no conntrack section in {kube_proxy}"
    );
    let kube_proxy = liberal;
    lab.kubectl_stdin(&["apply", "-f", "-"], &kube_proxy)?;
    k(&[
        "-n",
        "kube-system",
        "rollout",
        "restart",
        "daemonset/kube-proxy",
    ])?;
    rolled_out(&lab, "daemonset/kube-proxy", 300)?;
    for node in &lab.state.nodes {
        let mut rules = String::new();
        for _ in 0..60 {
            rules = on_node(&lab, node, "nft", &["list", "ruleset"])?;
            if !rules.contains("ct state invalid") {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        anyhow::ensure!(
            !rules.contains("ct state invalid") && rules.contains("KUBE-SVC-"),
            "kube-proxy still drops INVALID packets on {}: {rules}",
            node.name
        );
    }
    load.phase("kube-proxy, liberal");
    steady();

    load.phase("sliceway installed beside kube-proxy");
    k(&["apply", "-f", &file("sliceway-agent.yaml")])?;
    k(&[
        "-n",
        "kube-system",
        "patch",
        "daemonset",
        "sliceway-agent",
        "--type=json",
        "--patch-file",
        &file("kubeadm/agent-reads-kube-proxy-configmap.json"),
    ])?;
    // While kube-proxy holds port 10256 the agents cannot serve /readyz there: they
    // roll out once kube-proxy is gone. Attached is what this phase waits for.
    for node in &lab.state.nodes {
        for _ in 0..90 {
            let pinned = on_node(&lab, node, "test", &["-d", "/sys/fs/bpf/sliceway"]).is_ok();
            if pinned && !pinned_links(&lab, node)?.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        let links = settled_links(&lab, node)?;
        anyhow::ensure!(!links.is_empty(), "no sliceway link on {}", node.name);
    }
    load.phase("kube-proxy and sliceway");
    steady();

    load.phase("kube-proxy removed");
    k(&[
        "-n",
        "kube-system",
        "delete",
        "--cascade=foreground",
        "daemonset",
        "kube-proxy",
    ])?;
    let kube_proxy_cleanup = file("kube-proxy/kube-proxy-cleanup.yaml");
    k(&["apply", "-f", &kube_proxy_cleanup])?;
    rolled_out(&lab, "daemonset/kube-proxy-cleanup", 180)?;
    k(&["delete", "--cascade=foreground", "-f", &kube_proxy_cleanup])?;
    kube_proxy_rules(false)?;
    rolled_out(&lab, "daemonset/sliceway-agent", 300)?;
    load.phase("sliceway");
    steady();

    load.phase("kube-proxy installed beside sliceway");
    lab.kubectl_stdin(&["apply", "-f", "-"], &kube_proxy)?;
    rolled_out(&lab, "daemonset/kube-proxy", 300)?;
    kube_proxy_rules(true)?;
    load.phase("sliceway and kube-proxy");
    steady();

    load.phase("sliceway removed");
    k(&[
        "delete",
        "--cascade=foreground",
        "-f",
        &file("sliceway-agent.yaml"),
    ])?;
    let sliceway_cleanup = file("uninstall/sliceway-cleanup.yaml");
    k(&["apply", "-f", &sliceway_cleanup])?;
    rolled_out(&lab, "daemonset/sliceway-cleanup", 180)?;
    k(&["delete", "--cascade=foreground", "-f", &sliceway_cleanup])?;
    for node in &lab.state.nodes {
        anyhow::ensure!(
            !sliceway_attached(&lab, node)?,
            "a sliceway program is left on {}",
            node.name
        );
    }
    load.phase("kube-proxy again");
    steady();

    let outcome = load.stop();
    let figures = outcome.figures();
    let table = http_load::table(&figures);
    let mut report = format!(
        "# Replacing kube-proxy under load, and back\n\n{} requests from {} clients.\n\n\
         {table}\nFailed requests:\n\n```\n{}```\n",
        outcome.requests.len(),
        lab.state.nodes.len(),
        outcome.failures(20)
    );
    report.push('\n');
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/real-node");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("kube-proxy-replacement.md"), &report)?;
    eprintln!("{report}");
    // Steady phases (even) lose nothing. A switch (odd) may break a new connection
    // whose handshake it meets, never two of a client in a row (an outage), and each
    // open connection at most once: one opened again after a failure goes through
    // the proxy now in charge.
    let open_connections = 3 * lab.state.nodes.len();
    for (i, (phase, f)) in figures.iter().enumerate() {
        assert!(f.new > 0 && f.open > 0, "no requests in phase {phase:?}");
        if i % 2 == 0 {
            assert_eq!(
                (f.new_failed, f.open_failed),
                (0, 0),
                "requests failed in {phase:?}:\n{table}"
            );
        } else {
            assert!(
                f.new_failed_in_a_row <= 1,
                "new connections failed in a row in {phase:?}:\n{table}"
            );
            assert!(
                f.open_failed <= open_connections,
                "open connections failed more than once in {phase:?}:\n{table}"
            );
        }
    }
    assert_eq!(
        guard::escaped(&prefix)?,
        0,
        "the root namespace sent packets to the lab's networks"
    );
    Ok(())
}

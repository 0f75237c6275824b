//! A real node (issue 45): the cluster lab with upstream's kubelet and containerd from
//! the node kit on one node, sliceway-agent as its proxy and sliceway-controller
//! writing the EndpointSlices. Real pods made with kubectl answer through a ClusterIP
//! and its DNS name (CoreDNS), and so does a hostNetwork pod of the same node;
//! `kubectl exec` and `kubectl logs` work; the host's kernel tunables are the ones it
//! had before kubelet started; the root namespace sent nothing to the lab; and taking
//! the lab down leaves no process, namespace, cgroup, mount or file of it.
//!
//! Needs root and the node kit: `cargo xtask test-real` builds it, passes its bin
//! directory in `SLICEWAY_NODE_KIT_BIN` and runs this test (ignored otherwise: the
//! kit is a suite of its own, not part of `cargo xtask test`).

use std::{collections::BTreeSet, path::Path};

use anyhow::{Context, Result};
use sliceway_lab::cluster::{self, guard, real, Kubelet, Proxy, Spec};

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
    k(&[
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
    k(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ])?;
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
    let pods: BTreeSet<String> = k(&[
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
    assert_eq!(pods.len(), 2, "web pods: {pods:?}");
    let ip = lab.cluster_ip("default", "web")?;

    // The ClusterIP and the Service's name, from a pod, through `kubectl exec`: every
    // answer is one of the web pods, and both answer.
    let mut seen = BTreeSet::new();
    for target in [ip.to_string(), "web.default.svc.cluster.local".to_string()] {
        for _ in 0..10 {
            let answer = curl("-s", &format!("http://{target}/hostname"))?;
            assert!(
                pods.contains(answer.trim()),
                "{target} answered {answer:?}, not a web pod ({pods:?})"
            );
            seen.insert(answer.trim().to_string());
        }
    }
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

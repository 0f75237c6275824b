//! The deployment files in `deploy/` cannot drift from the agent: every document of
//! `deploy/*.yaml` is read into its typed Kubernetes object (and must come back the
//! same, so a misspelt field fails), and the DaemonSet's arguments are parsed by the
//! agent's own command-line definition.

use std::{collections::BTreeSet, net::SocketAddr, path::PathBuf};

use clap::Parser;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        core::v1::{PodSpec, ServiceAccount},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_yaml_ng::Value;
use sliceway_agent::{
    cmd::cli::{Cli, Command, RunArgs},
    kernel::interfaces::{Role as IfaceRole, Selection},
};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crate lives in the workspace")
        .join("deploy")
}

#[derive(Default)]
struct Manifests {
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    daemon_sets: Vec<DaemonSet>,
    deployments: Vec<Deployment>,
    disruption_budgets: Vec<PodDisruptionBudget>,
}

/// Reads `value` as a `T` and checks that nothing was lost on the way: a field the
/// type does not know (a typo, a wrong level) would be dropped silently otherwise.
fn typed<T: DeserializeOwned + Serialize>(value: Value, what: &str) -> T {
    let object: T = serde_yaml_ng::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid object: {e}"));
    let back = serde_yaml_ng::to_value(&object).unwrap();
    assert_eq!(
        back, value,
        "{what}: fields were lost reading it as a typed object (unknown or misplaced)"
    );
    object
}

fn load() -> Manifests {
    load_dir(&deploy_dir())
}

/// Every manifest of `dir` (not of its subdirectories, as `kubectl apply -f DIR`).
fn load_dir(dir: &std::path::Path) -> Manifests {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let mut m = Manifests::default();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{} document {i}: {e}", file.display()));
            if value.is_null() {
                continue;
            }
            let kind = value["kind"].as_str().unwrap_or_default().to_string();
            let what = format!("{} document {i} ({kind})", file.display());
            match kind.as_str() {
                "ServiceAccount" => m.service_accounts.push(typed(value, &what)),
                "ClusterRole" => m.cluster_roles.push(typed(value, &what)),
                "ClusterRoleBinding" => m.bindings.push(typed(value, &what)),
                "Role" => m.roles.push(typed(value, &what)),
                "RoleBinding" => m.role_bindings.push(typed(value, &what)),
                "DaemonSet" => m.daemon_sets.push(typed(value, &what)),
                "Deployment" => m.deployments.push(typed(value, &what)),
                "PodDisruptionBudget" => m.disruption_budgets.push(typed(value, &what)),
                other => panic!("{what}: kind {other:?} is not checked by this test"),
            }
        }
    }
    m
}

fn pod_spec<'a>(template: Option<&'a PodSpec>, what: &str) -> &'a PodSpec {
    template.unwrap_or_else(|| panic!("{what}: no pod spec"))
}

/// Both workloads run on Linux nodes only; the controller is ready when its
/// `/healthz` is, and a drain keeps one of its replicas (the Lease's holder or the
/// one that takes over).
#[test]
fn both_run_on_linux_and_the_controller_survives_a_drain() {
    let m = load();
    let linux = Some(std::collections::BTreeMap::from([(
        "kubernetes.io/os".to_string(),
        "linux".to_string(),
    )]));
    let ds = &m.daemon_sets[0];
    let agent = pod_spec(
        ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
        "DaemonSet",
    );
    assert_eq!(agent.node_selector, linux, "the agent");
    assert_eq!(m.deployments.len(), 1, "one Deployment");
    let deployment = &m.deployments[0];
    let spec = deployment.spec.as_ref().expect("a Deployment spec");
    let controller = pod_spec(spec.template.spec.as_ref(), "Deployment");
    assert_eq!(controller.node_selector, linux, "the controller");
    let probe = controller.containers[0]
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .expect("the controller has an HTTP readiness probe");
    assert_eq!(probe.path.as_deref(), Some("/healthz"));
    assert_eq!(m.disruption_budgets.len(), 1, "one PodDisruptionBudget");
    let pdb = m.disruption_budgets[0].spec.as_ref().unwrap();
    assert_eq!(pdb.min_available, Some(IntOrString::Int(1)));
    assert!(
        spec.replicas.unwrap_or(1) > 1,
        "a budget of one needs two replicas"
    );
    assert_eq!(
        pdb.selector.as_ref().and_then(|s| s.match_labels.clone()),
        spec.selector.match_labels,
        "the budget selects the controller's pods"
    );
}

/// The agent container's arguments, parsed as the binary parses them.
fn agent_args(ds: &DaemonSet) -> (Vec<String>, RunArgs) {
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let container = pod
        .containers
        .iter()
        .find(|c| c.name == "sliceway-agent")
        .expect("a container named sliceway-agent");
    let command = container.command.clone().unwrap_or_default();
    assert_eq!(command, ["sliceway-agent"], "the container runs the agent");
    let argv: Vec<String> = command
        .into_iter()
        .chain(container.args.clone().unwrap_or_default())
        .collect();
    let cli = Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("the DaemonSet's arguments {argv:?} do not parse: {e}"));
    match cli.command {
        Command::Run(run) => (argv, *run),
        _ => panic!("the DaemonSet does not run `sliceway-agent run`: {argv:?}"),
    }
}

/// Issue 47: `deploy/uninstall/` (which `kubectl apply -f deploy/` does not read) holds
/// a DaemonSet that runs `sliceway-agent cleanup --all` on every node the agent ran
/// on, from the agent's image, on the agent's bpffs directory, with the node's
/// network namespace and bpffs as the agent has them, and privileged as it is.
#[test]
fn the_cleanup_daemon_set_runs_cleanup_all_where_the_agent_ran() {
    let agent = load();
    let (_, run) = agent_args(&agent.daemon_sets[0]);
    let agent_pod = agent.daemon_sets[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .unwrap();
    let m = load_dir(&deploy_dir().join("uninstall"));
    assert_eq!(m.daemon_sets.len(), 1, "one DaemonSet in deploy/uninstall/");
    let ds = &m.daemon_sets[0];
    assert_eq!(ds.metadata.namespace.as_deref(), Some("kube-system"));
    let pod = pod_spec(
        ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
        "the cleanup DaemonSet",
    );
    assert_eq!(pod.host_network, Some(true), "the node's network namespace");
    assert_eq!(
        pod.tolerations, agent_pod.tolerations,
        "every node the agent ran on"
    );
    assert_eq!(pod.node_selector, agent_pod.node_selector);
    let inits = pod.init_containers.as_deref().unwrap_or_default();
    assert_eq!(inits.len(), 1, "one init container, the cleanup");
    let cleanup = &inits[0];
    assert_eq!(
        cleanup.image, agent_pod.containers[0].image,
        "the agent's image"
    );
    assert_eq!(
        cleanup.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let argv: Vec<String> = cleanup
        .command
        .clone()
        .unwrap_or_default()
        .into_iter()
        .chain(cleanup.args.clone().unwrap_or_default())
        .collect();
    let cli = Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("the cleanup's arguments {argv:?} do not parse: {e}"));
    match cli.command {
        Command::Cleanup { bpffs_dir, all } => {
            assert!(all, "cleanup --all: {argv:?}");
            assert_eq!(bpffs_dir, run.bpffs_dir, "the agent's --bpffs-dir");
        }
        _ => panic!("the init container does not run `sliceway-agent cleanup`: {argv:?}"),
    }
    // The node's bpffs, mounted where the agent has it.
    let mount = |pod: &PodSpec, c: &k8s_openapi::api::core::v1::Container| {
        let m = c
            .volume_mounts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|m| m.mount_path == "/sys/fs/bpf")
            .cloned()
            .expect("/sys/fs/bpf mounted");
        let volume = pod
            .volumes
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|v| v.name == m.name)
            .and_then(|v| v.host_path.clone())
            .expect("a hostPath volume");
        (volume.path, m.mount_propagation)
    };
    assert_eq!(
        mount(pod, cleanup),
        mount(agent_pod, &agent_pod.containers[0])
    );
    // Nothing of deploy/uninstall/ is in deploy/ itself.
    assert!(agent
        .daemon_sets
        .iter()
        .all(|d| d.metadata.name != ds.metadata.name));
}

#[test]
fn the_parser_used_below_rejects_what_the_agent_rejects() {
    // Guards the test itself: a misspelt flag or a bad interface entry must fail.
    assert!(Cli::try_parse_from(["sliceway-agent", "run", "--interface", "eth0"]).is_err());
    assert!(Cli::try_parse_from(["sliceway-agent", "run", "--interfaces", "a,,b"]).is_err());
    assert!(Cli::try_parse_from(["sliceway-agent", "run", "--interfaces", "veth*"]).is_ok());
}

#[test]
fn the_daemon_set_runs_the_agent_with_arguments_it_accepts() {
    let m = load();
    assert_eq!(m.daemon_sets.len(), 1, "one DaemonSet");
    let ds = &m.daemon_sets[0];
    let (argv, run) = agent_args(ds);

    // API source; pod interfaces found without a name (issue 47), whatever the CNI.
    assert!(
        run.manifests.is_none() && run.kubeconfig.is_none(),
        "{argv:?}"
    );
    let selection = Selection::parse(&run.interfaces)
        .unwrap()
        .with_external(&run.external_interfaces)
        .unwrap();
    assert!(selection.is_auto(), "{argv:?}");
    let pod_ifaces = [
        "veth1a2b3c",
        "cali0123456789a",
        "lxc12ab",
        "eni1a2b3c4d5e6",
        "azv0123456789a",
        "gke0123456789a",
    ];
    let selection = selection.with_found(pod_ifaces.map(String::from));
    for pod_iface in pod_ifaces {
        assert_eq!(
            selection.role(pod_iface),
            Some(IfaceRole::Pods),
            "{pod_iface}"
        );
    }
    // The usual names of a node's uplink get the uplink program.
    for uplink in ["eth0", "ens5", "enp1s0", "eno1", "bond0"] {
        assert_eq!(
            selection.role(uplink),
            Some(IfaceRole::External),
            "{uplink}"
        );
    }
    assert!(
        selection.exact().next().is_none(),
        "only patterns: a node without one of the interfaces must still start ({argv:?})"
    );

    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.host_network, Some(true));
    let container = &pod.containers[0];

    // The node name comes from the downward API, as --node's NODE_NAME.
    let env = container.env.clone().unwrap_or_default();
    let node = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    // The API server's real addresses, from the ConfigMap: a list (`servers`, read
    // as --apiserver), or one host and port; either key may be left out.
    for (name, key) in [
        ("SLICEWAY_APISERVER", "servers"),
        ("KUBERNETES_SERVICE_HOST", "host"),
        ("KUBERNETES_SERVICE_PORT", "port"),
    ] {
        let from = env
            .iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.config_map_key_ref.as_ref())
            .unwrap_or_else(|| panic!("{name}: from a ConfigMap"));
        assert_eq!(from.name, "sliceway-agent-apiserver", "{name}");
        assert_eq!(from.key, key, "{name}");
        assert_eq!(from.optional, Some(true), "{name}");
    }
    // The env --apiserver reads, parsed as the agent parses it.
    let with_list = Cli::try_parse_from([
        "sliceway-agent",
        "run",
        "--apiserver",
        "10.0.0.1,cp.example:6443",
    ])
    .unwrap();
    match with_list.command {
        sliceway_agent::cmd::cli::Command::Run(r) => {
            assert_eq!(r.apiserver, ["10.0.0.1", "cp.example:6443"])
        }
        _ => unreachable!(),
    }
    // Names of the API server are resolved by the node's own resolver and
    // /etc/hosts, not by the cluster's DNS, which needs the agent's Services.
    assert_eq!(pod.dns_policy.as_deref(), Some("Default"));

    // The liveness probe reaches /livez and the readiness probe /readyz where the
    // agent serves them: the kubelet probes from the node's namespace, which is the
    // agent's (hostNetwork). Health is on kube-proxy's address, which load balancers
    // probe from other hosts; metrics and /audit only on loopback (issue 47).
    let healthz = run.healthz_addr().expect("a health server");
    assert_eq!(healthz, "0.0.0.0:10256".parse::<SocketAddr>().unwrap());
    let metrics = run.metrics_addr().expect("a metrics server");
    assert!(
        metrics.ip().is_loopback(),
        "metrics and /audit on {metrics}"
    );
    assert!(!run.audit_on_non_loopback);
    let ports = container.ports.clone().unwrap_or_default();
    for (probe, path) in [
        (&container.liveness_probe, "/livez"),
        (&container.readiness_probe, "/readyz"),
    ] {
        let probe = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("an HTTP probe of {path}"));
        assert_eq!(probe.path.as_deref(), Some(path));
        let port = match &probe.port {
            IntOrString::Int(p) => *p,
            IntOrString::String(name) => {
                ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .unwrap_or_else(|| panic!("{path}'s probe names port {name}, not declared"))
                    .container_port
            }
        };
        assert_eq!(port, i32::from(healthz.port()), "{path}");
        if let Some(host) = &probe.host {
            assert!(
                healthz.ip().is_unspecified() || host == &healthz.ip().to_string(),
                "{path} probed on {host}, served on {healthz}"
            );
        }
    }

    // Pins live on the node's bpffs.
    assert!(!run.no_pin);
    let mounts = container.volume_mounts.clone().unwrap_or_default();
    let bpf = mounts
        .iter()
        .find(|v| run.bpffs_dir.starts_with(&v.mount_path))
        .unwrap_or_else(|| panic!("no volume holds --bpffs-dir {}", run.bpffs_dir.display()));
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == bpf.name)
        .expect("the bpffs volume");
    assert_eq!(
        volume.host_path.as_ref().map(|h| h.path.as_str()),
        Some("/sys/fs/bpf")
    );
    assert_eq!(bpf.mount_propagation.as_deref(), Some("Bidirectional"));
    assert_eq!(
        container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged),
        Some(true),
        "bidirectional propagation needs a privileged container"
    );

    // Every node.
    assert!(pod
        .tolerations
        .iter()
        .flatten()
        .any(|t| t.key.is_none() && t.operator.as_deref() == Some("Exists") && t.effect.is_none()));

    // deploy/kind.sh builds and loads the image the DaemonSet runs.
    let image = container.image.as_deref().unwrap();
    let kind_sh = std::fs::read_to_string(deploy_dir().join("kind.sh")).unwrap();
    assert!(
        kind_sh.contains(&format!("IMAGE={image}")),
        "kind.sh builds {image}"
    );
}

#[test]
fn the_agent_may_list_and_watch_what_it_reads() {
    let m = load();
    let ds = &m.daemon_sets[0];
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let namespace = ds.metadata.namespace.clone().expect("a namespace");
    let account = pod.service_account_name.clone().expect("a service account");
    assert!(m
        .service_accounts
        .iter()
        .any(|sa| sa.metadata.name.as_deref() == Some(&account)
            && sa.metadata.namespace.as_deref() == Some(&namespace)));
    let binding = m
        .bindings
        .iter()
        .find(|b| {
            b.subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == account
                    && s.namespace.as_deref() == Some(&namespace)
            })
        })
        .expect("a binding for the agent's service account");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    let role = m
        .cluster_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(&binding.role_ref.name))
        .expect("the bound ClusterRole");
    let granted = granted(role.rules.iter().flatten());
    // What the API source watches: Services, EndpointSlices and the agent's own Node.
    for (group, resource) in [
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
        ("", "nodes"),
    ] {
        for verb in ["list", "watch"] {
            assert!(
                granted.contains(&(group.into(), resource.into(), verb.into())),
                "{verb} {resource} ({group:?}) not granted"
            );
        }
    }
}

/// (API group, resource, verb) for every grant of `rules`.
fn granted<'a>(rules: impl Iterator<Item = &'a PolicyRule>) -> BTreeSet<(String, String, String)> {
    let mut granted = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    granted.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    granted
}

#[test]
fn the_controller_may_read_and_write_what_it_reconciles() {
    let m = load();
    let account = "sliceway-controller";
    let bound = |kind: &str, name: &str| {
        m.bindings.iter().any(|b| {
            b.role_ref.kind == kind
                && b.role_ref.name == name
                && b.subjects.iter().flatten().any(|s| s.name == account)
        }) || m.role_bindings.iter().any(|b| {
            b.role_ref.kind == kind
                && b.role_ref.name == name
                && b.subjects.iter().flatten().any(|s| s.name == account)
        })
    };
    let cluster_wide = granted(
        m.cluster_roles
            .iter()
            .filter(|r| {
                bound(
                    "ClusterRole",
                    r.metadata.name.as_deref().unwrap_or_default(),
                )
            })
            .flat_map(|r| r.rules.iter().flatten()),
    );
    let in_namespace = granted(
        m.roles
            .iter()
            .filter(|r| bound("Role", r.metadata.name.as_deref().unwrap_or_default()))
            .flat_map(|r| r.rules.iter().flatten()),
    );
    let has = |set: &BTreeSet<(String, String, String)>, g: &str, r: &str, v: &str| {
        set.contains(&(g.to_string(), r.to_string(), v.to_string()))
    };
    for (group, resource) in [("", "services"), ("", "pods"), ("", "nodes")] {
        for verb in ["list", "watch"] {
            assert!(
                has(&cluster_wide, group, resource, verb),
                "{verb} {resource}"
            );
        }
    }
    for (group, resource) in [("discovery.k8s.io", "endpointslices"), ("", "endpoints")] {
        for verb in ["list", "watch", "create", "update", "delete"] {
            assert!(
                has(&cluster_wide, group, resource, verb),
                "{verb} {resource}"
            );
        }
    }
    assert!(has(&cluster_wide, "", "events", "create"), "create events");
    // Two replicas under leader election, each knowing its own name for the Lease.
    let d = m
        .deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some(account))
        .expect("the controller's Deployment");
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(account));
    let env: Vec<&str> = pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(
        env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"),
        "{env:?}"
    );
    for verb in ["get", "create", "update"] {
        assert!(
            has(&in_namespace, "coordination.k8s.io", "leases", verb),
            "{verb} leases"
        );
    }
}

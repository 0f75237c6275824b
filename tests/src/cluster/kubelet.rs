//! The cluster lab's kubelet stand-in: one process per node, in the root network
//! namespace (where the API server listens on loopback).
//!
//! - Registers its Node (addresses, zone label, pod CIDR, capacity, `Ready`).
//! - Forwards `127.0.0.1:6443` inside the node's network namespace to the API
//!   server, so the proxies in the node (sliceway-agent or kube-proxy) reach it without
//!   any route out of the lab.
//! - For each Pod bound to its node: a pod network namespace linked to the node by a
//!   veth pair (address from the node's pod CIDR, routes both ways), a server on every
//!   declared container port (80 and 8080 when none is declared), TCP and UDP,
//!   answering with the pod's name ([`crate::servers`]), and the Pod's status (podIP,
//!   phase, conditions).
//! - Readiness follows the annotation [`READY_ANNOTATION`] (`"false"` makes the pod
//!   unready). A deleted pod keeps serving, ready, while it terminates, until its
//!   deletion timestamp (the grace period) passes; then its namespace goes and the Pod
//!   is removed with a zero grace period, as the kubelet does.

use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::watcher,
    Api, Client,
};
use serde_json::json;
use tokio::sync::Mutex;

use crate::{netns, servers::BackendServers, Pod as LabPod};

/// Annotation the stand-in honours: `"false"` makes the pod's Ready condition false.
pub const READY_ANNOTATION: &str = "lab.sliceway.io/ready";
/// Annotation the stand-in writes: the pod's network namespace.
pub const NETNS_ANNOTATION: &str = "lab.sliceway.io/netns";
/// Port the API server forwarder listens on inside the node's namespace.
pub const NODE_APISERVER_PORT: u16 = 6443;

/// What the stand-in needs to know about its node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub name: String,
    /// The node's network namespace.
    pub netns: String,
    /// Prefix of the pod namespaces this node makes.
    pub prefix: String,
    pub ip: Ipv4Addr,
    /// The node's pod CIDR, a /24: pods get .2 to .254, the node side of every pod
    /// link is .1.
    pub pod_cidr: Ipv4Addr,
    pub zone: String,
    /// The API server on the root namespace's loopback.
    pub apiserver_port: u16,
}

struct Running {
    uid: String,
    netns: netns::Netns,
    ip: Ipv4Addr,
    iface: String,
    _servers: Vec<BackendServers>,
}

struct State {
    pods: HashMap<String, Running>,
    used: Vec<bool>,
}

/// Runs the stand-in until the process is killed.
pub async fn run(cfg: NodeConfig, client: Client) -> Result<()> {
    forward_apiserver(&cfg).await?;
    register_node(&cfg, &client).await?;
    tracing::info!(node = %cfg.name, "node registered");
    let state = Arc::new(Mutex::new(State {
        pods: HashMap::new(),
        used: vec![false; 256],
    }));
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.name));
    let mut stream = watcher(pods.clone(), config).boxed();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut known: BTreeMap<String, Pod> = BTreeMap::new();
    loop {
        tokio::select! {
            event = stream.next() => {
                match event {
                    Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                        known.insert(key(&pod), pod.clone());
                        if let Err(e) = sync_pod(&cfg, &client, &state, &pod).await {
                            tracing::warn!(pod = %key(&pod), "{e:#}");
                        }
                    }
                    Some(Ok(watcher::Event::Delete(pod))) => {
                        known.remove(&key(&pod));
                        teardown(&state, &key(&pod)).await;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!("pod watch: {e}"),
                    None => anyhow::bail!("the pod watch ended"),
                }
            }
            _ = tick.tick() => {
                // Graceful deletions whose time has come, and pods whose set-up failed.
                for pod in known.values() {
                    if let Err(e) = sync_pod(&cfg, &client, &state, pod).await {
                        tracing::warn!(pod = %key(pod), "{e:#}");
                    }
                }
            }
        }
    }
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Listens on 127.0.0.1:6443 inside the node's namespace; every connection is
/// forwarded to the API server on the root namespace's loopback. The forwarder lives
/// as long as the process.
async fn forward_apiserver(cfg: &NodeConfig) -> Result<()> {
    let forwarder =
        super::Forwarder::start(Some(&cfg.netns), NODE_APISERVER_PORT, cfg.apiserver_port)
            .context("forwarding 127.0.0.1:6443 in the node to the API server")?;
    std::mem::forget(forwarder);
    Ok(())
}

async fn register_node(cfg: &NodeConfig, client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let cidr = format!("{}/24", cfg.pod_cidr);
    let cidr6 = format!("{}/64", super::lab_v6(cfg.pod_cidr));
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": cfg.name,
            "labels": {
                "kubernetes.io/hostname": cfg.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": cfg.zone,
            }
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr, cidr6]}
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("creating the Node"),
    }
    let now = Timestamp::now().to_string();
    let status = json!({"status": {
        "addresses": [
            {"type": "InternalIP", "address": cfg.ip.to_string()},
            {"type": "InternalIP", "address": super::lab_v6(cfg.ip).to_string()},
            {"type": "Hostname", "address": cfg.name},
        ],
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "lab kubelet stand-in is running",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
            "osImage": "sliceway cluster lab", "containerRuntimeVersion": "lab://0",
            "kubeletVersion": "lab", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }});
    nodes
        .patch_status(&cfg.name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .context("writing the Node's status")?;
    // The API server taints a new Node not-ready; node lifecycle, which would lift the
    // taint once the node reports Ready, is off in the lab (the stand-in does not
    // heartbeat), so the stand-in lifts it itself.
    nodes
        .patch(
            &cfg.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .context("removing the not-ready taint")?;
    Ok(())
}

async fn sync_pod(
    cfg: &NodeConfig,
    client: &Client,
    state: &Mutex<State>,
    pod: &Pod,
) -> Result<()> {
    let k = key(pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    if let Some(deletion) = &pod.metadata.deletion_timestamp {
        // Terminating: keep serving until the grace period is over.
        if deletion.0 > Timestamp::now() && state.lock().await.pods.contains_key(&k) {
            return Ok(());
        }
        teardown(state, &k).await;
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e).context("removing the terminated pod"),
        }
        return Ok(());
    }
    let (ip, netns_name) = {
        let mut st = state.lock().await;
        if st.pods.get(&k).is_some_and(|r| r.uid != uid) {
            // Same name, new pod: the old one is gone.
            let old = st.pods.remove(&k).expect("checked");
            st.used[old.ip.octets()[3] as usize] = false;
            drop(old);
        }
        if !st.pods.contains_key(&k) {
            let running = start_pod(cfg, &mut st, pod, &uid)?;
            tracing::info!(pod = %k, ip = %running.ip, netns = %running.netns.name, "pod started");
            st.pods.insert(k.clone(), running);
        }
        let r = &st.pods[&k];
        (r.ip, r.netns.name.clone())
    };
    let ready = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(READY_ANNOTATION))
        .is_none_or(|v| v != "false");
    let status = pod.status.as_ref();
    let ready_now = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| (c.status == "True") == ready);
    let ip_now = status.and_then(|s| s.pod_ip.as_deref()) == Some(ip.to_string().as_str());
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NETNS_ANNOTATION))
        .is_some_and(|v| *v == netns_name);
    if !annotated {
        let patch = json!({"metadata": {"annotations": {NETNS_ANNOTATION: netns_name}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .context("annotating the pod with its namespace")?;
    }
    if ready_now && ip_now {
        return Ok(());
    }
    let now = Timestamp::now().to_string();
    let flag = if ready { "True" } else { "False" };
    let containers: Vec<_> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(),
                "imageID": "", "containerID": format!("lab://{}", c.name),
                "ready": ready, "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let patch = json!({"status": {
        "phase": "Running",
        "hostIP": cfg.ip.to_string(),
        "hostIPs": [{"ip": cfg.ip.to_string()}],
        "podIP": ip.to_string(),
        "podIPs": [{"ip": ip.to_string()}, {"ip": super::lab_v6(ip).to_string()}],
        "startTime": status.and_then(|s| s.start_time.as_ref()).map(|t| t.0.to_string()).unwrap_or(now.clone()),
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ],
        "containerStatuses": containers,
    }});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .context("writing the pod's status")?;
    Ok(())
}

/// Short, stable name for a pod's namespace and node-side link.
fn pod_tag(uid: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in uid.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x01000193);
    }
    format!("{h:08x}")
}

fn start_pod(cfg: &NodeConfig, st: &mut State, pod: &Pod, uid: &str) -> Result<Running> {
    let slot = (2..255)
        .find(|i| !st.used[*i])
        .context("the node's pod CIDR is full")?;
    let [a, b, c, _] = cfg.pod_cidr.octets();
    let ip = Ipv4Addr::new(a, b, c, slot as u8);
    let gw = Ipv4Addr::new(a, b, c, 1);
    let tag = pod_tag(uid);
    let iface = format!("p{tag}");
    let ns = netns::Netns::create(&format!("{}-p{tag}", cfg.prefix))?;
    netns::ip(&[
        "link", "add", &iface, "netns", &cfg.netns, "type", "veth", "peer", "name", "eth0",
        "netns", &ns.name,
    ])?;
    let node = |args: &[&str]| netns::nsenter(&cfg.netns, "ip", args);
    node(&["addr", "add", &format!("{gw}/32"), "dev", &iface])?;
    node(&["link", "set", &iface, "up"])?;
    node(&["route", "add", &format!("{ip}/32"), "dev", &iface])?;
    // Offload off: a wrong checksum written by a proxy breaks the test.
    netns::nsenter(&cfg.netns, "ethtool", &["-K", &iface, "tx", "off"])?;
    ns.run("ip", &["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
    ns.run("ip", &["link", "set", "eth0", "up"])?;
    ns.run("ip", &["route", "add", &gw.to_string(), "dev", "eth0"])?;
    ns.run("ip", &["route", "add", "default", "via", &gw.to_string()])?;
    // The same in IPv6: the pod's address and the node side's, both /128.
    let (ip6, gw6) = (super::lab_v6(ip), super::lab_v6(gw));
    node(&[
        "-6",
        "addr",
        "add",
        &format!("{gw6}/128"),
        "dev",
        &iface,
        "nodad",
    ])?;
    node(&["-6", "route", "add", &format!("{ip6}/128"), "dev", &iface])?;
    ns.run(
        "ip",
        &[
            "-6",
            "addr",
            "add",
            &format!("{ip6}/128"),
            "dev",
            "eth0",
            "nodad",
        ],
    )?;
    ns.run(
        "ip",
        &["-6", "route", "add", &format!("{gw6}/128"), "dev", "eth0"],
    )?;
    ns.run(
        "ip",
        &["-6", "route", "add", "default", "via", &gw6.to_string()],
    )?;
    ns.run("ethtool", &["-K", "eth0", "tx", "off"])?;
    let lab_pod = LabPod {
        name: pod.metadata.name.clone().unwrap_or_default(),
        ns: ns.name.clone(),
        ip,
        ip6: Some(ip6),
        node_iface: iface.clone(),
    };
    let mut ports: Vec<u16> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .collect();
    if ports.is_empty() {
        // A container that declares no port (`kubectl create deployment` without
        // `--port`) answers where Services usually send: 80 and 8080.
        ports = vec![80, 8080];
    }
    ports.sort_unstable();
    ports.dedup();
    let mut servers = Vec::new();
    for port in ports {
        servers.push(BackendServers::start(std::slice::from_ref(&lab_pod), port)?);
    }
    st.used[slot] = true;
    Ok(Running {
        uid: uid.to_string(),
        netns: ns,
        ip,
        iface,
        _servers: servers,
    })
}

async fn teardown(state: &Mutex<State>, key: &str) {
    let mut st = state.lock().await;
    if let Some(r) = st.pods.remove(key) {
        st.used[r.ip.octets()[3] as usize] = false;
        tracing::info!(pod = %key, iface = %r.iface, "pod stopped");
        // Servers stop, then the namespace (and with it the veth pair) goes.
        drop(r);
    }
}

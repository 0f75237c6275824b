//! `sliceway-cluster`: the cluster lab's command line (`cargo xtask cluster ...`).
//! up, down, status, and commands run inside a pod, the external client or a node.

use std::{os::unix::process::CommandExt, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use sliceway_lab::cluster::{self, Cluster, Controllers, Kubelet, Proxy, Spec};

#[derive(Parser)]
#[command(
    name = "sliceway-cluster",
    about = "A Kubernetes cluster made of network namespaces"
)]
struct Args {
    /// Where the running cluster keeps its state (keys, logs, pids, kubeconfigs).
    #[arg(long, env = "SLICEWAY_CLUSTER_DIR", default_value = "target/cluster")]
    dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start etcd, the control plane, N nodes with their kubelets, the proxy on
    /// every node and the EndpointSlice controllers (and CoreDNS on real nodes).
    Up {
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        #[arg(long, value_enum, default_value_t = Proxy::Sliceway)]
        proxy: Proxy,
        #[arg(long, value_enum, default_value_t = Controllers::Sliceway)]
        controller: Controllers,
        /// What runs the pods: the lab's stand-in, or upstream's kubelet and
        /// containerd from the node kit (`cargo xtask node-kit`).
        #[arg(long, value_enum, default_value_t = Kubelet::StandIn)]
        kubelet: Kubelet,
    },
    /// Stop everything and remove processes, namespaces, pins and files.
    Down,
    /// Components, nodes and pods with their addresses.
    Status,
    /// Run CMD in pod NAMESPACE/POD's network namespace.
    Exec {
        pod: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Run CMD in the external client's network namespace.
    Client {
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Run CMD in NODE's host network namespace.
    Node {
        node: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Run the lab's kubectl as the cluster's admin.
    Kubectl {
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn exec_in(netns: &str, cmd: &[String]) -> Result<()> {
    let err = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{netns}"))
        .args(cmd)
        .exec();
    bail!("running {cmd:?} in {netns}: {err}")
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = &args.dir;
    match args.command {
        Cmd::Up {
            nodes,
            proxy,
            controller,
            kubelet,
        } => {
            let spec = Spec {
                nodes,
                proxy,
                controller,
                kubelet,
                workloads: true,
                apiserver_args: Vec::new(),
            };
            let cluster = Cluster::up(&spec, dir, &format!("{}-lab", cluster::NS_PREFIX))?;
            let kubeconfig = cluster.state.kubeconfig.clone();
            let kubectl = cluster.state.bin.join("kubectl");
            cluster.detach();
            println!("kubeconfig: {}", kubeconfig.display());
            println!("  export KUBECONFIG={}", kubeconfig.display());
            println!(
                "  export PATH={}:$PATH   # kubectl of the same version",
                kubectl.parent().unwrap_or(dir).display()
            );
            println!(
                "then: kubectl get nodes; cargo xtask cluster status; cargo xtask cluster down"
            );
            Ok(())
        }
        Cmd::Down => {
            cluster::down(dir)?;
            println!("cluster lab removed");
            Ok(())
        }
        Cmd::Status => {
            print!("{}", Cluster::load(dir)?.status()?);
            Ok(())
        }
        Cmd::Exec { pod, cmd } => {
            let c = Cluster::load(dir)?;
            let (ns, name) = pod.split_once('/').unwrap_or(("default", pod.as_str()));
            exec_in(&c.pod_netns(ns, name)?, &cmd)
        }
        Cmd::Client { cmd } => exec_in(&Cluster::load(dir)?.state.client_ns, &cmd),
        Cmd::Node { node, cmd } => {
            let c = Cluster::load(dir)?;
            let n = c
                .state
                .nodes
                .iter()
                .find(|n| n.name == node)
                .with_context(|| format!("no node {node} in the lab"))?;
            exec_in(&n.netns, &cmd)
        }
        Cmd::Kubectl { args } => {
            let c = Cluster::load(dir)?;
            let err = Command::new(c.state.bin.join("kubectl"))
                .arg(format!("--kubeconfig={}", c.state.kubeconfig.display()))
                .args(&args)
                .exec();
            bail!("running kubectl: {err}")
        }
    }
}

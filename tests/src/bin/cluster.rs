//! `sliceway-cluster`: the cluster lab's command line (`cargo xtask cluster ...`).
//! up, down, status, and commands run inside a pod, the external client or a node.

use std::{os::unix::process::CommandExt, path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use sliceway_lab::cluster::{self, e2e, Cluster, Controllers, Kubelet, Proxy, Spec};

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
    /// Bring up a cluster of real nodes, run upstream's e2e suite (`e2e.test`) on it
    /// from inside the lab, write its report to OUT/<proxy>-<controller>/ and the
    /// page of every run's results (docs/conformance.md), and take the cluster down.
    E2e {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, value_enum, default_value_t = Proxy::Sliceway)]
        proxy: Proxy,
        #[arg(long, value_enum, default_value_t = Controllers::Sliceway)]
        controller: Controllers,
        /// Specs to run (ginkgo's --focus); the default selection when not given.
        #[arg(long)]
        focus: Option<String>,
        /// Specs to leave out (ginkgo's --skip); the default skips when not given.
        #[arg(long)]
        skip: Option<String>,
        /// The whole run's limit (ginkgo's --timeout, e.g. 90m).
        #[arg(long, default_value = "6h")]
        timeout: String,
        /// upstream's e2e.test (`cargo xtask node-kit --e2e` builds it).
        #[arg(long, env = "SLICEWAY_E2E_TEST")]
        e2e_test: PathBuf,
        /// How many processes of e2e.test run the specs side by side (ginkgo's
        /// --procs; the selection has no [Serial] spec); 1 runs e2e.test alone.
        #[arg(long, default_value_t = 4)]
        procs: usize,
        /// ginkgo's command, needed when --procs is over 1 (`cargo xtask node-kit
        /// --e2e` builds it beside e2e.test).
        #[arg(long, env = "SLICEWAY_GINKGO")]
        ginkgo: Option<PathBuf>,
        /// Where the runs' reports go.
        #[arg(long, default_value = "target/e2e")]
        out: PathBuf,
        /// The page written from every run under OUT.
        #[arg(long, default_value = "docs/conformance.md")]
        page: PathBuf,
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
    /// Import image archives (docker-archive or OCI tarballs, e.g. those of `cargo xtask
    /// image`) into every real node's containerd, where kubelet finds them.
    LoadImage {
        #[arg(required = true)]
        archives: Vec<PathBuf>,
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
        Cmd::E2e {
            nodes,
            proxy,
            controller,
            focus,
            skip,
            timeout,
            e2e_test,
            procs,
            ginkgo,
            out,
            page,
        } => {
            let runner = match (procs, &ginkgo) {
                (0 | 1, _) => e2e::Runner::Serial,
                (procs, Some(ginkgo)) => e2e::Runner::Parallel { ginkgo, procs },
                (_, None) => anyhow::bail!(
                    "--procs {procs} needs ginkgo's command (--ginkgo or SLICEWAY_GINKGO); \
                     nothing was started"
                ),
            };
            let focus = focus.unwrap_or_else(|| e2e::DEFAULT_FOCUS.to_string());
            let skip = skip.unwrap_or_else(e2e::default_skip);
            let spec = Spec {
                nodes,
                proxy,
                controller,
                kubelet: Kubelet::Real,
                workloads: true,
                apiserver_args: Vec::new(),
            };
            let cluster = Cluster::up(&spec, dir, &format!("{}-e2e", cluster::NS_PREFIX))?;
            let name = format!("{proxy:?}-{controller:?}").to_lowercase();
            let run = e2e::run(
                &cluster,
                &e2e_test,
                runner,
                &focus,
                &skip,
                &timeout,
                &out.join(&name),
            );
            drop(cluster);
            let run = run?;
            let runs = e2e::read_runs(&out)?;
            std::fs::write(&page, e2e::conformance_page(&runs))
                .with_context(|| format!("writing {}", page.display()))?;
            println!("wrote {}", page.display());
            for s in run.specs.iter().filter(|s| s.status == "failed") {
                println!("failed: {} ({})", s.name, s.message);
            }
            println!("report: {}", out.join(&name).display());
            println!("{}", run.summary());
            if run.count("failed") > 0 {
                std::process::exit(1);
            }
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
        Cmd::LoadImage { archives } => {
            let c = Cluster::load(dir)?;
            cluster::real::load_images(&c.state, &cluster::real::Kit::find()?, &archives)?;
            println!(
                "loaded {} image archive(s) into {} node(s)",
                archives.len(),
                c.state.nodes.len()
            );
            Ok(())
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

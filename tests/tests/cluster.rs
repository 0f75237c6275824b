//! End-to-end tests in the cluster lab: the real control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler built from upstream's Go modules), two
//! nodes made of network namespaces with the lab's kubelet stand-in, sliceway-agent on
//! every node and sliceway-controller writing the EndpointSlices. Then the same
//! Services, Pods and flows with upstream's kube-proxy on every node (iptables mode,
//! then nftables mode) and with sliceway again: the backends each flow reaches must
//! be the same. Every Service is dual-stack and every flow runs over IPv4 and IPv6,
//! so both proxies compile each family from its own EndpointSlices (`addressType`),
//! as kube-proxy runs one proxier per family
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/metaproxier/meta_proxier.go#L85-L96>).
//!
//! One cluster serves every step (starting one costs about 20 s), so the steps run in
//! order inside one test.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use sliceway_lab::{
    cluster::{self, tcp_spread, udp_spread, Cluster, Proxy, Spec},
    servers::EchoConn,
};

/// Connections per flow: with 4 backends the chance that one is never picked is
/// 4 * (3/4)^64, about 4e-8.
const FLOWS: usize = 64;
/// How long a change may take to reach the datapath (the network-programming budget
/// these tests allow; upstream's scale tests gate kube-proxy at far more).
const BUDGET: Duration = Duration::from_secs(15);

const CLIENTS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: client-1, labels: {app: client}}
spec:
  nodeName: node-1
  containers: [{name: c, image: lab}]
---
apiVersion: v1
kind: Pod
metadata: {name: client-2, labels: {app: client}}
spec:
  nodeName: node-2
  containers: [{name: c, image: lab}]
"#;

/// Pod name -> node name, for the pods of `selector` that are ready and not
/// terminating.
fn placement(c: &Cluster, selector: &str) -> Result<BTreeMap<String, String>> {
    let out = c.kubectl(&[
        "get", "pods", "-l", selector, "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.deletionTimestamp} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
    ])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 4 && f[2].is_empty() && f[3] == "True")
                .then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect())
}

fn backends(spread: &BTreeMap<String, usize>) -> BTreeSet<String> {
    spread.keys().cloned().collect()
}

/// Retries `f` until it holds or `BUDGET` passes; the error names the last result.
fn eventually<T: std::fmt::Debug>(
    what: &str,
    mut f: impl FnMut() -> Result<(bool, T)>,
) -> Result<T> {
    let deadline = Instant::now() + BUDGET;
    loop {
        let (ok, last) = f()?;
        if ok {
            return Ok(last);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {BUDGET:?}; last seen {last:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// One flow: a client pod, a Service address (either family) and a protocol.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Flow {
    client: String,
    service: String,
    to: SocketAddr,
    udp: bool,
}

/// What makes a Service made by `kubectl expose` (IPv4, the cluster's first family)
/// dual-stack: the API server gives it an IPv6 ClusterIP beside its IPv4 one.
const DUAL_STACK: &str = r#""ipFamilyPolicy":"RequireDualStack","ipFamilies":["IPv4","IPv6"]"#;

/// Both ClusterIPs of a dual-stack Service, IPv4's first.
fn dual_stack_ips(c: &Cluster, name: &str) -> Result<[IpAddr; 2]> {
    let ips = c.cluster_ips("default", name)?;
    match ips[..] {
        [v4 @ IpAddr::V4(_), v6 @ IpAddr::V6(_)] => Ok([v4, v6]),
        _ => bail!("Service {name} is not dual-stack, IPv4 first: ClusterIPs {ips:?}"),
    }
}

/// The backends `FLOWS` new TCP connections from `netns` reach, by ClusterIP.
fn tcp_by_family(
    netns: &str,
    ips: [IpAddr; 2],
    port: u16,
) -> Result<BTreeMap<IpAddr, BTreeSet<String>>> {
    ips.iter()
        .map(|ip| Ok((*ip, backends(&tcp_spread(netns, (*ip, port), FLOWS)?))))
        .collect()
}

/// The backends each flow reaches (over `FLOWS` new connections).
fn reach(c: &Cluster, flows: &[Flow]) -> Result<BTreeMap<Flow, BTreeSet<String>>> {
    let mut out = BTreeMap::new();
    for f in flows {
        let ns = c.pod_netns("default", &f.client)?;
        let spread = if f.udp {
            udp_spread(&ns, f.to, FLOWS)?
        } else {
            tcp_spread(&ns, f.to, FLOWS)?
        };
        out.insert(f.clone(), backends(&spread));
    }
    Ok(out)
}

#[test]
fn cluster_lab_sliceway_end_to_end_and_same_backends_as_kube_proxy() -> Result<()> {
    let c = cluster::for_test(&Spec::default())?;

    // A Deployment and Services made with kubectl, as a user would (no container
    // port declared: the stand-in's pods answer on 80 and 8080).
    c.kubectl(&["create", "deployment", "web", "--image=lab", "--replicas=4"])?;
    c.kubectl(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ])?;
    c.kubectl(&[
        "expose",
        "deployment",
        "web",
        "--name=web-udp",
        "--port=53",
        "--target-port=8080",
        "--protocol=UDP",
    ])?;
    c.kubectl(&[
        "expose",
        "deployment",
        "web",
        "--name=web-local",
        "--port=81",
        "--target-port=8080",
    ])?;
    c.kubectl(&[
        "patch",
        "svc",
        "web-local",
        "-p",
        &format!(r#"{{"spec":{{"internalTrafficPolicy":"Local",{DUAL_STACK}}}}}"#),
    ])?;
    for name in ["web", "web-udp"] {
        c.kubectl(&[
            "patch",
            "svc",
            name,
            "-p",
            &format!(r#"{{"spec":{{{DUAL_STACK}}}}}"#),
        ])?;
    }
    c.kubectl_stdin(&["apply", "-f", "-"], CLIENTS)?;
    c.wait_ready_pods("default", "app=web", 4)?;
    c.wait_ready_pods("default", "app=client", 2)?;
    let web = dual_stack_ips(&c, "web")?;
    let web_udp = dual_stack_ips(&c, "web-udp")?;
    let web_local = dual_stack_ips(&c, "web-local")?;

    // Each ClusterIP, of either family, from pods on both nodes reaches every pod on
    // both nodes.
    let pods = placement(&c, "app=web")?;
    let mut flows = Vec::new();
    for client in ["client-1", "client-2"] {
        for (service, ips, port, udp) in [
            ("web", web, 80, false),
            ("web-udp", web_udp, 53, true),
            ("web-local", web_local, 81, false),
        ] {
            for ip in ips {
                flows.push(Flow {
                    client: client.into(),
                    service: service.into(),
                    to: SocketAddr::new(ip, port),
                    udp,
                });
            }
        }
    }
    let expected = |f: &Flow| eligible(&pods, f);
    eventually(
        "every flow reaches its eligible backends over sliceway",
        || {
            let got = reach(&c, &flows)?;
            let ok = flows.iter().all(|f| {
                got[f] == expected(f)
                    || (expected(f).is_empty() && got[f].len() == 1 && got[f].contains("(failed)"))
            });
            Ok((ok, got))
        },
    )?;

    // Scale up: the new pod gets traffic within the budget, over both families (each
    // from its own EndpointSlice).
    let ns1 = c.pod_netns("default", "client-1")?;
    c.kubectl(&["scale", "deployment", "web", "--replicas=5"])?;
    c.wait_ready_pods("default", "app=web", 5)?;
    let five: BTreeSet<String> = placement(&c, "app=web")?.keys().cloned().collect();
    eventually("the new pod receives connections", || {
        let got = tcp_by_family(&ns1, web, 80)?;
        Ok((got.values().all(|b| *b == five), got))
    })?;

    // A deleted pod gets no new connections once it is terminating.
    let victim = five.iter().next().cloned().context("a web pod")?;
    c.kubectl(&["delete", "pod", &victim, "--grace-period=3", "--wait=false"])?;
    eventually("the deleted pod receives no new connections", || {
        let got = tcp_by_family(&ns1, web, 80)?;
        let ok = got
            .values()
            .all(|b| !b.contains(&victim) && !b.contains("(failed)"));
        Ok((ok, got))
    })?;

    // Scale down: the pods that go get no new connections.
    c.kubectl(&["scale", "deployment", "web", "--replicas=3"])?;
    c.wait_ready_pods("default", "app=web", 3)?;
    let three: BTreeSet<String> = placement(&c, "app=web")?.keys().cloned().collect();
    eventually("only the remaining pods receive connections", || {
        let got = tcp_by_family(&ns1, web, 80)?;
        Ok((got.values().all(|b| *b == three), got))
    })?;

    // An established connection of each family survives a crash and restart of the
    // agent on its node.
    let mut conns = web
        .iter()
        .map(|ip| cluster_echo(&ns1, SocketAddr::new(*ip, 80)))
        .collect::<Result<Vec<_>>>()?;
    for conn in &mut conns {
        conn.roundtrip("before the restart")?;
    }
    c.kill_proxy("node-1")?;
    c.start_proxies_on(Proxy::Sliceway, &["node-1".to_string()])?;
    for (conn, ip) in conns.iter_mut().zip(web) {
        conn.roundtrip("after the restart").with_context(|| {
            format!("the established connection to {ip} did not survive the agent's restart")
        })?;
    }
    drop(conns);

    // Deleting the Service stops its traffic, in both families.
    c.kubectl(&["delete", "svc", "web-udp"])?;
    eventually("the deleted Service answers no more", || {
        let mut got = BTreeMap::new();
        for ip in web_udp {
            got.insert(ip, backends(&udp_spread(&ns1, (ip, 53), 4)?));
        }
        let failed = BTreeSet::from(["(failed)".to_string()]);
        Ok((got.values().all(|b| *b == failed), got))
    })?;
    // Made again with the same ClusterIPs, so the flows stay as they were; this time
    // dual-stack from the start (PreferDualStack: both families, as the cluster has
    // both).
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web-udp}}\nspec:\n  selector: {{app: web}}\n  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: {0}\n  clusterIPs: [{0}, {1}]\n  ports: [{{port: 53, targetPort: 8080, protocol: UDP}}]\n",
            web_udp[0], web_udp[1]
        ),
    )?;
    ensure!(
        dual_stack_ips(&c, "web-udp")? == web_udp,
        "web-udp made again with other ClusterIPs"
    );

    // The same flows with upstream's kube-proxy on every node, in iptables mode and
    // in nftables mode, then with sliceway again.
    let pods = placement(&c, "app=web")?;
    let expected_now = |f: &Flow| eligible(&pods, f);
    let mut seen = BTreeMap::new();
    for proxy in [Proxy::Iptables, Proxy::Nftables, Proxy::Sliceway] {
        c.stop_proxies()?;
        c.start_proxies(proxy)?;
        let what = format!("every flow reaches its eligible backends over {proxy:?}");
        let got = eventually(&what, || {
            let got = reach(&c, &flows)?;
            let ok = flows
                .iter()
                .all(|f| !expected_now(f).is_empty() && got[f] == expected_now(f));
            Ok((ok, got))
        })?;
        seen.insert(format!("{proxy:?}"), got);
    }
    let mut differ = Vec::new();
    for f in &flows {
        let sliceway = &seen["Sliceway"][f];
        for upstream in ["Iptables", "Nftables"] {
            if &seen[upstream][f] != sliceway {
                differ.push(format!(
                    "{} -> {} ({}): kube-proxy {upstream} {:?}, sliceway {:?}",
                    f.client, f.service, f.to, seen[upstream][f], sliceway
                ));
            }
        }
    }
    ensure!(
        differ.is_empty(),
        "flows that differ:\n{}",
        differ.join("\n")
    );
    eprintln!(
        "{} flows ({} over IPv6) reach the same backends over sliceway and kube-proxy (iptables, nftables)",
        flows.len(),
        flows.iter().filter(|f| f.to.is_ipv6()).count()
    );
    Ok(())
}

fn cluster_echo(netns: &str, to: SocketAddr) -> Result<EchoConn> {
    sliceway_lab::netns::in_netns(netns, move || EchoConn::open(to, Duration::from_secs(3)))?
}

/// The backends a flow may reach: the ready web pods, only those on the client's
/// node for the `internalTrafficPolicy: Local` Service.
fn eligible(pods: &BTreeMap<String, String>, f: &Flow) -> BTreeSet<String> {
    let node = if f.client == "client-1" {
        "node-1"
    } else {
        "node-2"
    };
    pods.iter()
        .filter(|(_, n)| f.service != "web-local" || n.as_str() == node)
        .map(|(p, _)| p.clone())
        .collect()
}

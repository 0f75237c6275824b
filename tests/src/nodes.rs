//! The two-node lab: two nodes on a routed node network, pods on each, and clients
//! outside the cluster, for traffic that crosses nodes or comes from outside.
//!
//! ```text
//!   client   10.100.1.100 ─┐                    node-1 10.100.1.1 ── pods 10.244.1N.2
//!   client-2 10.100.1.101 ─┤── br0 (ns PREFIX-net) ─┤
//!                          │                    node-2 10.100.1.2 ── pods 10.245.1N.2
//! ```
//!
//! Each node routes the other's pod network through it; the clients know only the
//! node network (and a load-balancer address routed to a node of the test's choice,
//! as a cloud load balancer sends to one node). [`TwoNodes::dual_stack`] adds IPv6
//! beside every address: the node network `fd00:100:1::/64` (nodes `::1`, `::2`,
//! clients `::100`, `::101`), pods `fd00:10:24{3+k}:{11+i}::2/64`. Namespaces carry a prefix unique to
//! the process and none has a link to the root namespace; they are deleted on drop.

use std::{
    fs,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, Result};

use crate::{
    agent_start, in_netns, netns, servers, workspace_binary, Agent, BackendServers, Netns, Pod,
    Reply, NS_PREFIX,
};

/// A client outside the cluster.
pub struct Client {
    pub ns: Netns,
    pub ip: Ipv4Addr,
    /// Its IPv6 address in a dual-stack lab.
    pub ip6: Option<Ipv6Addr>,
}

impl Client {
    /// One TCP request: who answered, and how it saw the client.
    pub fn tcp(&self, to: impl Into<SocketAddr>) -> Result<Reply> {
        let to = to.into();
        in_netns(&self.ns.name, move || {
            servers::tcp_request(to, Duration::from_secs(2))
        })?
    }

    /// SYNs this client's kernel has retransmitted so far (`TCPSynRetrans` of its
    /// network namespace). The datapath tracks a retransmitted SYN as a new connection
    /// on its tuple, so counts of new connections allow one more for each.
    pub fn syn_retransmits(&self) -> Result<u64> {
        in_netns(&self.ns.name, || -> Result<u64> {
            // thread-self: /proc/net follows the process's first thread, not this one.
            let text = std::fs::read_to_string("/proc/thread-self/net/netstat")?;
            tcp_ext(&text, "TCPSynRetrans")
        })?
    }

    /// One UDP request.
    pub fn udp(&self, to: impl Into<SocketAddr>) -> Result<Reply> {
        let to = to.into();
        in_netns(&self.ns.name, move || {
            servers::udp_request(to, Duration::from_secs(1))
        })?
    }

    /// One UDP request from source port `port`. A random port may be one an
    /// earlier request of the test took, whose flow the datapath still tracks: a
    /// test that counts new flows gives each request a port of its own.
    pub fn udp_from(&self, port: u16, to: impl Into<SocketAddr>) -> Result<Reply> {
        let to = to.into();
        in_netns(&self.ns.name, move || {
            servers::udp_request_from(port, to, Duration::from_secs(1))
        })?
    }

    /// An HTTP GET of `path`: the whole answer.
    pub fn http_get(&self, to: SocketAddrV4, path: &str) -> Result<String> {
        crate::http_get(&self.ns.name, to, path)
    }

    /// Routes `addr` (a load-balancer address) through `node`'s address, replacing
    /// an earlier route; both of one family.
    pub fn route_via(
        &self,
        addr: impl Into<std::net::IpAddr>,
        node: impl Into<std::net::IpAddr>,
    ) -> Result<()> {
        let (addr, node) = (addr.into(), node.into());
        let (family, len) = if addr.is_ipv4() {
            ("-4", 32)
        } else {
            ("-6", 128)
        };
        self.ns.run(
            "ip",
            &[
                family,
                "route",
                "replace",
                &format!("{addr}/{len}"),
                "via",
                &node.to_string(),
            ],
        )?;
        Ok(())
    }
}

/// One node: its namespace, its address on the node network, its pods (each
/// answering on [`crate::BACKEND_PORT`]) and its manifest directory.
pub struct Node {
    pub name: String,
    pub ns: Netns,
    pub ip: Ipv4Addr,
    /// Its IPv6 address on the node network in a dual-stack lab.
    pub ip6: Option<Ipv6Addr>,
    pub pods: Vec<Pod>,
    pod_ns: Vec<Netns>,
    servers: Option<BackendServers>,
    pub manifests: PathBuf,
    pub bpffs: PathBuf,
}

/// The lab.
pub struct TwoNodes {
    pub prefix: String,
    pub nodes: Vec<Node>,
    /// Allowed and blocked clients, as a test sees fit.
    pub clients: Vec<Client>,
    /// `--xdp` for the agents (`None`: the uplinks' TC program alone).
    pub xdp: Option<&'static str>,
    /// IPv6 beside IPv4 everywhere ([`TwoNodes::dual_stack`]).
    pub dual_stack: bool,
    /// Namespace of the node network's bridge; dropped last.
    net: Netns,
}

/// The node network's IPv6 address with host part `host` (a node's index, or a
/// client's 100 and 101).
fn net6(host: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x100, 1, 0, 0, 0, 0, host)
}

impl TwoNodes {
    /// Two nodes with `pods` pods each, two clients, everything up and routed.
    pub fn new(pods: usize) -> Result<Self> {
        Self::build(pods, false)
    }

    /// [`TwoNodes::new`] with IPv6 beside IPv4 on every link, as a dual-stack
    /// cluster has it (see the module's text for the addresses); nodes forward IPv6,
    /// no address waits for duplicate address detection.
    pub fn dual_stack(pods: usize) -> Result<Self> {
        Self::build(pods, true)
    }

    fn build(pods: usize, dual_stack: bool) -> Result<Self> {
        netns::remove_stale(NS_PREFIX);
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let prefix = format!("{NS_PREFIX}-{}-m{n}", std::process::id());
        let net = Netns::create(&format!("{prefix}-net"))?;
        net.run("ip", &["link", "add", "br0", "type", "bridge"])?;
        net.run("ip", &["link", "set", "br0", "up"])?;
        let mut lab = TwoNodes {
            prefix: prefix.clone(),
            nodes: Vec::new(),
            clients: Vec::new(),
            xdp: None,
            dual_stack,
            net,
        };
        for k in 1..=2u8 {
            let ns = Netns::create(&format!("{prefix}-n{k}"))?;
            let ip = Ipv4Addr::new(10, 100, 1, k);
            crate::node_sysctls(&ns.name)?;
            let ip6 = dual_stack.then(|| net6(k.into()));
            if dual_stack {
                netns::nsenter(
                    &ns.name,
                    "sysctl",
                    &["-qw", "net.ipv6.conf.all.forwarding=1"],
                )?;
            }
            lab.plug(&ns, &format!("n{k}"), ip, ip6)?;
            let manifests = std::env::temp_dir().join(format!("{prefix}-n{k}-manifests"));
            let _ = fs::remove_dir_all(&manifests);
            fs::create_dir_all(&manifests)?;
            let mut node = Node {
                name: format!("node-{k}"),
                ns,
                ip,
                ip6,
                pods: Vec::new(),
                pod_ns: Vec::new(),
                servers: None,
                manifests,
                bpffs: PathBuf::from(format!("/sys/fs/bpf/{prefix}-n{k}")),
            };
            for i in 0..pods {
                node.add_pod(&prefix, k, i, dual_stack)?;
            }
            node.servers = Some(BackendServers::start(&node.pods, crate::BACKEND_PORT)?);
            lab.nodes.push(node);
        }
        // Each node reaches the other's pods through it.
        let (a, b) = (lab.nodes[0].ip.to_string(), lab.nodes[1].ip.to_string());
        lab.nodes[0]
            .ns
            .run("ip", &["route", "add", "10.245.0.0/16", "via", &b])?;
        lab.nodes[1]
            .ns
            .run("ip", &["route", "add", "10.244.0.0/16", "via", &a])?;
        if dual_stack {
            let (a, b) = (net6(1).to_string(), net6(2).to_string());
            lab.nodes[0]
                .ns
                .run("ip", &["-6", "route", "add", "fd00:10:245::/48", "via", &b])?;
            lab.nodes[1]
                .ns
                .run("ip", &["-6", "route", "add", "fd00:10:244::/48", "via", &a])?;
        }
        for (i, ip) in [(0u8, 100u8), (1, 101)] {
            let ns = Netns::create(&format!("{prefix}-c{i}"))?;
            let ip = Ipv4Addr::new(10, 100, 1, ip);
            let ip6 = dual_stack.then(|| net6(ip.octets()[3].into()));
            lab.plug(&ns, &format!("c{i}"), ip, ip6)?;
            lab.clients.push(Client { ns, ip, ip6 });
        }
        Ok(lab)
    }

    /// Links `ns` to the bridge: `eth0` in `ns` with `ip`/24 (and `ip6`/64), `tag` on
    /// the bridge.
    fn plug(&self, ns: &Netns, tag: &str, ip: Ipv4Addr, ip6: Option<Ipv6Addr>) -> Result<()> {
        let outer = format!("b-{tag}");
        if ip6.is_some() {
            crate::no_dad(&ns.name)?;
        }
        netns::veth_pair(&outer, &self.net.name, &ns.name)?;
        self.net
            .run("ip", &["link", "set", &outer, "master", "br0"])?;
        self.net.run("ip", &["link", "set", &outer, "up"])?;
        ns.run("ip", &["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        if let Some(ip6) = ip6 {
            ns.run(
                "ip",
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip6}/64"),
                    "dev",
                    "eth0",
                    "nodad",
                ],
            )?;
        }
        ns.run("ip", &["link", "set", "eth0", "up"])?;
        // Checksums in full, as in the single-node lab.
        ns.run("ethtool", &["-K", "eth0", "tx", "off"])?;
        Ok(())
    }

    /// Turns GRO on at the bridge's side of every node's uplink. A veth hands a
    /// frame its XDP program sends (`XDP_TX`, or `XDP_REDIRECT` into it) only to a
    /// peer whose receive queue runs NAPI, which GRO (or an XDP program of its own)
    /// turns on; without it native XDP forwarding's frames are dropped at the peer.
    pub fn napi_on_uplink_peers(&self) -> Result<()> {
        for k in 1..=self.nodes.len() {
            self.net
                .run("ethtool", &["-K", &format!("b-n{k}"), "gro", "on"])?;
        }
        Ok(())
    }

    /// The node named `node-K`.
    pub fn node(&self, k: usize) -> &Node {
        &self.nodes[k - 1]
    }

    /// Writes `yaml` as `file` into every node's manifest directory (atomically).
    pub fn write_manifest(&self, file: &str, yaml: &str) -> Result<()> {
        for node in &self.nodes {
            let tmp = node.manifests.join(format!(".{file}.tmp"));
            fs::write(&tmp, yaml)?;
            fs::rename(&tmp, node.manifests.join(file))?;
        }
        Ok(())
    }

    /// Writes `yaml` as `file` into node `k`'s manifest directory only (nodes that saw
    /// different histories).
    pub fn write_manifest_on(&self, k: usize, file: &str, yaml: &str) -> Result<()> {
        let dir = &self.node(k).manifests;
        let tmp = dir.join(format!(".{file}.tmp"));
        fs::write(&tmp, yaml)?;
        fs::rename(&tmp, dir.join(file))?;
        Ok(())
    }

    /// The Node objects of both nodes, their InternalIP the node network address
    /// (both families' in a dual-stack lab).
    pub fn node_objects(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let v6 = n.ip6.map_or(String::new(), |a| {
                    format!(", {{type: InternalIP, address: \"{a}\"}}")
                });
                format!(
                    "apiVersion: v1\nkind: Node\nmetadata: {{name: {}}}\nstatus:\n  addresses: [{{type: InternalIP, address: {}}}{v6}]\n",
                    n.name, n.ip
                )
            })
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// Starts the agent of node `k` on its pods' interfaces (`p*`) and its uplink
    /// (`eth0`, with `--xdp` if the lab says so), with `extra` arguments; waits for
    /// its first sync.
    pub fn start_agent(&self, k: usize, extra: &[&str]) -> Result<Agent> {
        let agent = self.spawn_agent(k, extra)?;
        agent.wait_for_sync(1, agent_start())?;
        Ok(agent)
    }

    /// [`TwoNodes::start_agent`] for both nodes with the same `extra` arguments,
    /// started together: their programs are verified side by side (the most of a
    /// start under the VM tier's emulation) before both first syncs are awaited.
    pub fn start_agents(&self, extra: &[&str]) -> Result<(Agent, Agent)> {
        let a1 = self.spawn_agent(1, extra)?;
        let a2 = self.spawn_agent(2, extra)?;
        a1.wait_for_sync(1, agent_start())?;
        a2.wait_for_sync(1, agent_start())?;
        Ok((a1, a2))
    }

    /// The agent of node `k` started, not yet synced.
    fn spawn_agent(&self, k: usize, extra: &[&str]) -> Result<Agent> {
        let node = self.node(k);
        let bin = workspace_binary("sliceway-agent")?;
        let mut args: Vec<String> = vec![
            "--node".into(),
            node.name.clone(),
            "--external-interfaces".into(),
            "eth0".into(),
        ];
        if let Some(xdp) = self.xdp {
            args.extend(["--xdp".to_string(), xdp.to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Agent::start_binary(
            &bin,
            &node.ns.name,
            &[
                "--manifests".into(),
                node.manifests.clone().into_os_string(),
            ],
            &["p*".to_string()],
            &node.bpffs,
            &args,
        )
    }

    /// An EndpointSlice entry for pod `i` of node `k`.
    pub fn endpoint(&self, k: usize, i: usize) -> String {
        let pod = &self.node(k).pods[i];
        Self::endpoint_of(k, &pod.ip.to_string(), &pod.name)
    }

    /// An IPv6 EndpointSlice entry for pod `i` of node `k` (a dual-stack lab).
    pub fn endpoint6(&self, k: usize, i: usize) -> String {
        let pod = &self.node(k).pods[i];
        let ip6 = pod.ip6.expect("a dual-stack lab");
        Self::endpoint_of(k, &ip6.to_string(), &pod.name)
    }

    fn endpoint_of(k: usize, address: &str, pod: &str) -> String {
        format!(
            "- addresses: [\"{address}\"]\n  conditions: {{ready: true}}\n  nodeName: node-{k}\n  targetRef: {{kind: Pod, namespace: default, name: {pod}}}\n"
        )
    }
}

impl Node {
    /// Pod `i` of node `k`: `n{k}-pod-{i}`, 10.24{3+k}.{11+i}.2/24 behind the node's
    /// interface `p{11+i}` (10.24{3+k}.{11+i}.1); with `dual_stack` also
    /// fd00:10:24{3+k}:{11+i}::2/64 (the node's side `::1`).
    fn add_pod(&mut self, prefix: &str, k: u8, i: usize, dual_stack: bool) -> Result<()> {
        let name = format!("n{k}-pod-{}", i + 1);
        let ns = Netns::create(&format!("{prefix}-{name}"))?;
        if dual_stack {
            crate::no_dad(&ns.name)?;
        }
        let subnet = 11 + i as u8;
        let iface = format!("p{subnet}");
        let pod_ip = Ipv4Addr::new(10, 243 + k, subnet, 2);
        let gw = Ipv4Addr::new(10, 243 + k, subnet, 1);
        netns::veth_pair(&iface, &self.ns.name, &ns.name)?;
        self.ns
            .run("ip", &["addr", "add", &format!("{gw}/24"), "dev", &iface])?;
        self.ns.run("ip", &["link", "set", &iface, "up"])?;
        self.ns.run("ethtool", &["-K", &iface, "tx", "off"])?;
        ns.run(
            "ip",
            &["addr", "add", &format!("{pod_ip}/24"), "dev", "eth0"],
        )?;
        ns.run("ip", &["link", "set", "eth0", "up"])?;
        ns.run("ip", &["route", "add", "default", "via", &gw.to_string()])?;
        ns.run("ethtool", &["-K", "eth0", "tx", "off"])?;
        let ip6 = if dual_stack {
            let net = format!("fd00:10:{}:{subnet}", 243 + k as u16);
            Some(crate::pod_ipv6(&self.ns, &iface, &ns, &net)?)
        } else {
            None
        };
        self.pods.push(Pod {
            name,
            ns: ns.name.clone(),
            ip: pod_ip,
            ip6,
            node_iface: iface,
        });
        self.pod_ns.push(ns);
        Ok(())
    }

    /// One TCP request from pod `i` of this node.
    pub fn pod_tcp(&self, i: usize, to: impl Into<SocketAddr>) -> Result<Reply> {
        let to = to.into();
        in_netns(&self.pods[i].ns, move || {
            servers::tcp_request(to, Duration::from_secs(2))
        })?
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.servers.take();
            node.pod_ns.clear();
            let _ = fs::remove_dir_all(&node.manifests);
            let _ = fs::remove_dir_all(&node.bpffs);
        }
        self.nodes.clear();
        self.clients.clear();
    }
}

/// Counter `name` of the `TcpExt:` lines of a `/proc/net/netstat` text (a line of
/// names, then a line of values).
pub(crate) fn tcp_ext(text: &str, name: &str) -> Result<u64> {
    let mut rows = text
        .lines()
        .filter_map(|l| l.strip_prefix("TcpExt:"))
        .map(str::split_whitespace);
    let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
        anyhow::bail!("no TcpExt lines in /proc/net/netstat");
    };
    names
        .zip(values)
        .find(|(n, _)| *n == name)
        .with_context(|| format!("no {name} in TcpExt"))?
        .1
        .parse()
        .with_context(|| format!("{name} is not a number"))
}

#[cfg(test)]
mod tests {
    use super::tcp_ext;

    #[test]
    fn a_tcp_ext_counter_is_read_by_its_name() {
        let text = "TcpExt: SyncookiesSent TCPSynRetrans TCPOrigDataSent\n\
                    TcpExt: 0 3 120\n\
                    IpExt: InNoRoutes\n\
                    IpExt: 0\n";
        assert_eq!(tcp_ext(text, "TCPSynRetrans").unwrap(), 3);
        assert!(tcp_ext(text, "TCPNothing").is_err());
        assert!(tcp_ext("IpExt: A\nIpExt: 1\n", "TCPSynRetrans").is_err());
    }
}

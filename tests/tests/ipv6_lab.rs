//! IPv6 and dual-stack in the node lab (issue 12): pods of both families, real IPv6
//! sockets through the attached programs, in network namespaces. Need root.
//!
//! The lab's pods have `10.244.N.2` and `fd00:10:244:N::2`; each family of a
//! Service is compiled from the EndpointSlices of its own address type, as
//! kube-proxy's per-family proxiers do
//! (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointschangetracker.go).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use sliceway_lab::Lab;

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const PORT: u16 = 80;

fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// `n` TCP and `n` UDP requests from the client pod to `vip`: the backends that
/// answered each, and every peer address they saw the client as.
fn spread(
    lab: &Lab,
    vip: SocketAddr,
    n: usize,
) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<IpAddr>) {
    let (mut tcp, mut udp, mut peers) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for _ in 0..n {
        let t = lab.tcp_request(vip).unwrap();
        let u = lab.udp_request(vip).unwrap();
        peers.extend(t.peer.map(|p| p.ip()));
        peers.extend(u.peer.map(|p| p.ip()));
        tcp.insert(t.backend);
        udp.insert(u.backend);
    }
    (tcp, udp, peers)
}

/// A dual-stack Service is reached over both families, each through its own
/// ClusterIP, by every backend of its family's slice; the backends see the client's
/// own address of that family (no masquerade between pods).
#[test]
fn a_dual_stack_service_is_reached_over_both_families() {
    let lab = Lab::dual_stack(3, false).unwrap();
    let yaml = lab
        .service_yaml_families("web", &[VIP4.into(), VIP6.into()], PORT, &[0, 1, 2])
        .unwrap();
    lab.write_manifest("web.yaml", &yaml).unwrap();
    // Control: without the agent neither ClusterIP exists.
    assert!(lab.tcp_request(at(VIP6, PORT)).is_err());
    let agent = lab.start_agent().unwrap();
    let all: BTreeSet<String> = lab.backends.iter().map(|b| b.name.clone()).collect();
    let client6 = lab.client.ip6.unwrap();
    for (vip, client) in [
        (at(VIP4, PORT), IpAddr::from(lab.client.ip)),
        (at(VIP6, PORT), client6.into()),
    ] {
        let (tcp, udp, peers) = spread(&lab, vip, 40);
        assert_eq!(tcp, all, "TCP spread over {vip}");
        assert_eq!(udp, all, "UDP spread over {vip}");
        assert_eq!(
            peers,
            BTreeSet::from([client]),
            "the client as backends saw it over {vip}"
        );
    }
    assert_eq!(agent.problems_logged().unwrap(), 0, "{:#?}", agent.log());
}

/// An IPv6-only Service (`SingleStack`, one IPv6 ClusterIP) beside an IPv4 one:
/// each serves its family only; a port the IPv6 Service does not declare, and an
/// IPv6 Service without endpoints, are refused at once (ICMPv6 port unreachable
/// turns into ECONNREFUSED, a drop would time out), as kube-proxy rejects them.
#[test]
fn an_ipv6_only_service_serves_its_family_and_refuses_what_it_does_not_declare() {
    let lab = Lab::dual_stack(2, false).unwrap();
    let v6 = lab
        .service_yaml_families("web6", &[VIP6.into()], PORT, &[0, 1])
        .unwrap();
    let empty6: Ipv6Addr = "fd00:96::20".parse().unwrap();
    let empty = lab
        .service_yaml_families("empty6", &[empty6.into()], PORT, &[])
        .unwrap();
    lab.write_manifest("web6.yaml", &v6).unwrap();
    lab.write_manifest("empty6.yaml", &empty).unwrap();
    let _agent = lab.start_agent().unwrap();

    let (tcp, udp, _) = spread(&lab, at(VIP6, PORT), 30);
    let both = BTreeSet::from(["backend-1".to_string(), "backend-2".to_string()]);
    assert_eq!((tcp, udp), (both.clone(), both));

    let client = lab.client.ns.clone();
    let kinds = sliceway_lab::netns::in_netns(&client, move || {
        let connect = |to: SocketAddr| {
            std::net::TcpStream::connect_timeout(&to, Duration::from_secs(3))
                .map(drop)
                .map_err(|e| e.kind())
        };
        let udp = (|| {
            let s = std::net::UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            s.connect(at(empty6, PORT))?;
            s.send(b"hello")?;
            s.recv(&mut [0u8; 64]).map(drop)
        })()
        .map_err(|e| e.kind());
        (connect(at(empty6, PORT)), udp, connect(at(VIP6, PORT + 1)))
    })
    .unwrap();
    let refused = Err(std::io::ErrorKind::ConnectionRefused);
    assert_eq!(kinds, (refused, refused, refused));
}

/// Pods that keep veth's TX checksum offload send IPv6 with partial checksums (the
/// pseudo-header sum only); the program's address rewrite must keep them right: a
/// long transfer arrives intact (the receiver verifies every segment), and UDP,
/// whose checksum IPv6 makes mandatory, too.
#[test]
fn ipv6_partial_checksums_from_pods_with_tx_offload_stay_right() {
    let lab = Lab::dual_stack(2, true).unwrap();
    let yaml = lab
        .service_yaml_families("web", &[VIP6.into(), VIP4.into()], PORT, &[0, 1])
        .unwrap();
    lab.write_manifest("web.yaml", &yaml).unwrap();
    let _agent = lab.start_agent().unwrap();
    let reply = lab.tcp_stream(at(VIP6, PORT), 8 << 20).unwrap();
    assert!(lab.backends.iter().any(|b| b.name == reply.backend));
    let mut udp = BTreeMap::new();
    for _ in 0..20 {
        *udp.entry(lab.udp_request(at(VIP6, PORT)).unwrap().backend)
            .or_insert(0) += 1;
    }
    assert_eq!(udp.len(), 2, "{udp:?}");
}

/// A pod that reaches its own IPv6 Service and is picked as the backend is answered
/// by itself, the connection coming from the IPv6 hairpin address (`100::5c1c:1`,
/// never a pod's), over TCP and UDP.
#[test]
fn a_pod_reaching_its_own_ipv6_service_is_answered_by_itself() {
    let lab = Lab::dual_stack(1, false).unwrap();
    let yaml = lab
        .service_yaml_families("web", &[VIP6.into()], PORT, &[0])
        .unwrap();
    lab.write_manifest("web.yaml", &yaml).unwrap();
    let _agent = lab.start_agent().unwrap();
    let me = lab.backends[0].clone();
    let seen = sliceway_lab::in_netns(
        &me.ns,
        move || -> anyhow::Result<BTreeSet<(String, Option<IpAddr>)>> {
            let mut seen = BTreeSet::new();
            for _ in 0..5 {
                let t = sliceway_lab::servers::tcp_request(at(VIP6, PORT), Duration::from_secs(2))?;
                let u = sliceway_lab::servers::udp_request(at(VIP6, PORT), Duration::from_secs(2))?;
                seen.insert((t.backend, t.peer.map(|p| p.ip())));
                seen.insert((u.backend, u.peer.map(|p| p.ip())));
            }
            Ok(seen)
        },
    )
    .unwrap()
    .unwrap();
    let hairpin: IpAddr = "100::5c1c:1".parse().unwrap();
    assert_eq!(seen, BTreeSet::from([(me.name.clone(), Some(hairpin))]));
}

/// The node's own IPv6 sockets (`sliceway_connect6`, `sendmsg6`, `recvmsg6`,
/// `getpeername6`) reach an IPv6 ClusterIP by every backend and see the ClusterIP as
/// their peer; a dual-stack socket naming the IPv4 ClusterIP IPv4-mapped
/// (`::ffff:10.96.0.10`, which the kernel connects over IPv4 without the IPv4 hooks)
/// is translated too and sees the mapped ClusterIP; a frontend without endpoints
/// and an undeclared port are refused at once (EPERM), as over IPv4. Pods' traffic
/// stays the TC program's.
#[test]
fn the_nodes_own_ipv6_sockets_reach_a_clusterip_and_see_it_as_their_peer() {
    let lab = Lab::dual_stack(3, false).unwrap();
    let yaml = lab
        .service_yaml_families("web", &[VIP6.into(), VIP4.into()], PORT, &[0, 1, 2])
        .unwrap();
    let empty6: Ipv6Addr = "fd00:96::20".parse().unwrap();
    let empty = lab
        .service_yaml_families("empty6", &[empty6.into()], PORT, &[])
        .unwrap();
    lab.write_manifest("web.yaml", &yaml).unwrap();
    lab.write_manifest("empty6.yaml", &empty).unwrap();
    let agent = lab.start_agent().unwrap();
    let all: BTreeSet<String> = lab.backends.iter().map(|b| b.name.clone()).collect();
    let timeout = Duration::from_secs(2);
    let mapped = at(VIP4.to_ipv6_mapped(), PORT);
    let any6 = at(Ipv6Addr::UNSPECIFIED, 0);
    let (seen, refused) = sliceway_lab::in_netns(&lab.node.name, move || {
        let mut seen: BTreeMap<(SocketAddr, usize), BTreeSet<String>> = BTreeMap::new();
        for _ in 0..20 {
            for vip in [at(VIP6, PORT), mapped] {
                let round = sliceway_lab::node_socket_round(vip, any6, timeout);
                for (i, backend) in round.into_iter().enumerate() {
                    seen.entry((vip, i)).or_default().insert(backend);
                }
            }
        }
        let refused = [
            at(empty6, PORT),
            at(VIP6, 9999),
            at(VIP4.to_ipv6_mapped(), 9999),
        ]
        .map(|to| {
            std::net::TcpStream::connect_timeout(&to, timeout)
                .map(drop)
                .map_err(|e| e.kind())
        });
        (seen, refused)
    })
    .unwrap();
    assert_eq!(seen.len(), 6, "{seen:?}");
    for ((vip, call), backends) in &seen {
        assert!(
            backends.len() > 1 && backends.is_subset(&all),
            "{vip}, call {call} (TCP, UDP, unconnected UDP): {backends:?}"
        );
    }
    assert_eq!(
        refused,
        [Err(sliceway_lab::socket_refusal()); 3],
        "connect refused by the socket program"
    );
    let metrics = agent.metrics().unwrap();
    let count = |reason: &str| {
        let series = format!("sliceway_datapath_packets{{reason=\"{reason}\"}}");
        sliceway_lab::metric_value(&metrics, &series).unwrap_or(0.0)
    };
    // 40 rounds of three calls, and two replies each read as the frontend.
    assert!(count("sock_translated") >= 120.0, "{metrics}");
    assert!(count("sock_revnat") >= 80.0, "{metrics}");
    assert!(count("sock_reject_no_backend") >= 1.0, "{metrics}");
    assert!(count("sock_reject_no_port") >= 2.0, "{metrics}");
    // None of it passed a pod's interface.
    assert_eq!(count("dnat_new"), 0.0, "{metrics}");
    assert_eq!(agent.problems_logged().unwrap(), 0, "{:#?}", agent.log());
}

/// `conntrack` lists a live IPv6 connection of a running agent from its pinned map
/// (`[addr]:port` for client, frontend and backend; its Service), in JSON and in a
/// table whose columns stay aligned, and `--flush-backend [addr]:port` forgets it.
#[test]
fn conntrack_lists_and_flushes_a_live_ipv6_connection() {
    let lab = Lab::dual_stack(2, false).unwrap();
    let yaml = lab
        .service_yaml_families("web", &[VIP6.into(), VIP4.into()], PORT, &[0, 1])
        .unwrap();
    lab.write_manifest("web.yaml", &yaml).unwrap();
    let _agent = lab.start_agent().unwrap();
    let bpffs = lab.bpffs.to_str().unwrap().to_string();
    let conn = sliceway_lab::in_netns(&lab.client.ns, move || {
        sliceway_lab::servers::EchoConn::open(at(VIP6, PORT), Duration::from_secs(2))
    })
    .unwrap()
    .unwrap();
    let backend = lab
        .backends
        .iter()
        .find(|b| b.name == conn.reply.backend)
        .unwrap();
    let backend_addr = at(backend.ip6.unwrap(), sliceway_lab::BACKEND_PORT).to_string();
    let client = at(lab.client.ip6.unwrap(), conn.local_addr().port()).to_string();
    let list = |out: &str| {
        let args = ["conntrack", "--bpffs-dir", &bpffs, "-o", out];
        std::process::Command::new(sliceway_lab::workspace_binary("sliceway-agent").unwrap())
            .args(args)
            .output()
            .unwrap()
    };
    let flows: serde_json::Value = serde_json::from_slice(&list("json").stdout).unwrap();
    let flows = flows.as_array().unwrap();
    assert_eq!(flows.len(), 1, "{flows:?}");
    let f = &flows[0];
    assert_eq!(
        (
            &f["protocol"],
            &f["client"],
            &f["frontend"],
            &f["backend"],
            &f["service"],
            &f["state"]
        ),
        (
            &"TCP".into(),
            &client.as_str().into(),
            &format!("[{VIP6}]:{PORT}").into(),
            &backend_addr.as_str().into(),
            &"default/web:http".into(),
            &"tcp_established".into()
        ),
        "{f}"
    );
    let table = String::from_utf8(list("table").stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert_eq!(
        lines[1].find(backend_addr.as_str()),
        lines[0].find("BACKEND"),
        "{table}"
    );

    sliceway_lab::flush_the_one_connection_to(&bpffs, &backend_addr);
    drop(conn);
}

/// Path-MTU discovery through an IPv6 ClusterIP: the backend is a server one hop
/// behind a pod, over a link of IPv6's minimum MTU (1,280), so the pod, as a
/// router, answers the client's full-size segments with ICMPv6 Packet Too Big
/// about the translated connection (pod → backend). `sliceway_icmp6` translates it
/// back (the quote gets the ClusterIP), so the client's kernel lowers its path MTU
/// to the ClusterIP and the upload arrives whole; untranslated, the error would
/// name a connection the client never opened and the upload would stall.
#[test]
fn a_packet_too_big_behind_the_backend_reaches_the_client_over_ipv6() {
    const PORT: u16 = 9300;
    const SIZE: usize = 256 * 1024;
    let lab = Lab::dual_stack(1, false).unwrap();
    let pod = lab.backends[0].clone();
    let (far, far_ip) = lab.server_behind(&pod, true, 1280).unwrap();
    let server = sliceway_lab::servers::upload_server(&far.name, at(Ipv6Addr::UNSPECIFIED, PORT));
    let yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: far, namespace: default}}\n\
         spec:\n  ipFamilies: [IPv6]\n  clusterIP: \"{VIP6}\"\n  clusterIPs: [\"{VIP6}\"]\n\
         \x20 ports: [{{name: p, port: {PORT}, protocol: TCP}}]\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: far-1, namespace: default, labels: {{kubernetes.io/service-name: far}}}}\n\
         addressType: IPv6\nports: [{{name: p, port: {PORT}, protocol: TCP}}]\n\
         endpoints:\n- {{addresses: [\"{far_ip}\"], conditions: {{ready: true}}, nodeName: node-1}}\n"
    );
    lab.write_manifest("far.yaml", &yaml).unwrap();
    let agent = lab.start_agent().unwrap();
    let translated = || {
        agent
            .metric("sliceway_datapath_packets{reason=\"nat_icmp_error\"}")
            .unwrap()
            .unwrap_or(0.0)
    };
    let before = translated();
    let answer = sliceway_lab::servers::upload(&lab.client.ns, at(VIP6, PORT), SIZE)
        .unwrap_or_else(|e| panic!("the upload through the smaller path MTU failed: {e}"));
    assert_eq!(answer.trim(), SIZE.to_string());
    assert_eq!(server.join().unwrap().unwrap(), SIZE);
    assert!(translated() > before, "no ICMPv6 error was translated");
    let route = sliceway_lab::netns::nsenter(
        &lab.client.ns,
        "ip",
        &["-6", "route", "get", &VIP6.to_string()],
    )
    .unwrap_or_else(|e| panic!("ip route get: {e:#}"));
    assert!(
        route.contains("mtu 1280"),
        "the client's route to the ClusterIP does not show the path MTU: {route}"
    );
}

/// `--socket-lb-pods` over IPv6: a pod's TCP connect to an IPv6 ClusterIP is
/// translated at the socket (`sliceway_connect6`), spread over the backends, the
/// backend sees the pod's IPv6 address and the pod sees the ClusterIP as its peer;
/// no packet takes the TC program's translation. An IPv6 frontend without endpoints
/// is left to TC, which rejects it (ECONNREFUSED), as over IPv4.
#[test]
fn with_socket_lb_pods_a_pods_ipv6_tcp_connect_is_translated_at_the_socket() {
    let mut lab = Lab::dual_stack(3, false).unwrap();
    let yaml = lab
        .service_yaml_families("web", &[VIP6.into(), VIP4.into()], PORT, &[0, 1, 2])
        .unwrap();
    let empty6: Ipv6Addr = "fd00:96::20".parse().unwrap();
    let empty = lab
        .service_yaml_families("empty6", &[empty6.into()], PORT, &[])
        .unwrap();
    lab.write_manifest("web.yaml", &yaml).unwrap();
    lab.write_manifest("empty6.yaml", &empty).unwrap();
    let cgroup = lab.socket_lb_pods().unwrap();
    let agent = lab.start_agent().unwrap();
    let count = |reason: &str| agent.packets(reason);
    let all: BTreeSet<String> = lab.backends.iter().map(|b| b.name.clone()).collect();
    let client6 = lab.client.ip6.expect("a dual-stack pod");
    let replies = cgroup
        .requests(&lab.client.ns, "tcp", at(VIP6, PORT), 20)
        .unwrap();
    let mut seen = BTreeSet::new();
    for reply in &replies {
        let (reply, peer) = reply.as_ref().expect("answered");
        assert_eq!(*peer, at(VIP6, PORT), "getpeername shows the ClusterIP");
        assert_eq!(reply.peer.map(|p| p.ip()), Some(client6.into()));
        seen.insert(reply.backend.clone());
    }
    assert_eq!(replies.len(), 20);
    assert!(seen.len() > 1 && seen.is_subset(&all), "{seen:?}");
    assert!(count("sock_translated_pod") >= 20.0);
    assert_eq!(count("dnat_new"), 0.0, "no packet took TC's translation");
    let refused = cgroup
        .requests(&lab.client.ns, "tcp", at(empty6, PORT), 1)
        .unwrap();
    assert_eq!(refused, [Err("ConnectionRefused".to_string())]);
    assert!(count("reject_no_backend") >= 1.0);
    drop(agent);
}

/// Issue 46: a dual-stack `LoadBalancer` Service with `externalTrafficPolicy: Local`
/// has a health check in each family, as kube-proxy's per-family proxiers have: on
/// the node's IPv4 addresses counting its ready local IPv4 endpoints, and on its
/// IPv6 addresses counting its IPv6 ones (here two and one).
#[test]
fn a_dual_stack_local_load_balancer_is_health_checked_in_each_family() {
    use std::io::{Read as _, Write as _};
    let lab = Lab::dual_stack(2, false).unwrap();
    let slice = |family: &str, eps: &[(IpAddr, &str)]| {
        let mut out = format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: lb-{}, namespace: shop, labels: {{kubernetes.io/service-name: lb}}}}\naddressType: {family}\nports: [{{name: http, port: {port}, protocol: TCP}}]\nendpoints:\n",
            family.to_lowercase(),
            port = sliceway_lab::BACKEND_PORT
        );
        for (ip, node) in eps {
            out.push_str(&format!(
                "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n  nodeName: {node}\n"
            ));
        }
        out
    };
    let (b0, b1) = (&lab.backends[0], &lab.backends[1]);
    lab.write_manifest(
        "lb.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: lb, namespace: shop}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.40\n  clusterIPs: [10.96.0.40, \"fd00:96::40\"]\n  ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30102\n  ports: [{{name: http, port: 80, protocol: TCP, targetPort: {port}, nodePort: 30080}}]\n{}{}",
            slice("IPv4", &[(b0.ip.into(), "node-1"), (b1.ip.into(), "node-1")]),
            slice(
                "IPv6",
                &[(b0.ip6.unwrap().into(), "node-1"), (b1.ip6.unwrap().into(), "node-2")]
            ),
            port = sliceway_lab::BACKEND_PORT
        ),
    )
    .unwrap();
    let _agent = lab.start_agent().unwrap();
    let ask = |to: SocketAddr| -> String {
        sliceway_lab::in_netns(&lab.client.ns, move || {
            let mut c = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            c.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\n\r\n")?;
            let mut answer = String::new();
            c.read_to_string(&mut answer)?;
            std::io::Result::Ok(answer)
        })
        .unwrap()
        .unwrap_or_else(|e| panic!("asking {to}: {e}"))
    };
    let node6: IpAddr = "fd00:10:244:1::1".parse().unwrap();
    for (at, local) in [
        (at(Ipv4Addr::new(10, 244, 1, 1), 30102), 2),
        (at(node6, 30102), 1),
    ] {
        let answer = ask(at);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{at}: {answer}");
        assert!(
            answer.contains(&format!("X-Load-Balancing-Endpoint-Weight: {local}\r\n")),
            "{at}: {answer}"
        );
        let body: serde_json::Value =
            serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["localEndpoints"], local, "{at}: {body}");
    }
}

/// Issue 46: over both families, a pod's connection to a NodePort or an external IP
/// of a Service with `externalTrafficPolicy: Cluster` reaches the backend from the
/// node's address of that family (its Node object's InternalIPs), as kube-proxy's
/// external chain masquerades it
/// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go);
/// its ClusterIPs keep the pod's address.
#[test]
fn a_pods_connection_to_a_dual_stack_node_port_or_external_ip_comes_from_the_node() {
    let lab = Lab::dual_stack(1, false).unwrap();
    let node4 = Ipv4Addr::new(10, 244, 1, 1);
    let client6 = lab.client.ip6.unwrap();
    let mut segments = client6.segments();
    segments[7] = 1;
    let node6 = Ipv6Addr::from(segments);
    lab.write_manifest(
        "node.yaml",
        &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: node-1}}\nstatus:\n  addresses: [{{type: InternalIP, address: {node4}}}, {{type: InternalIP, address: \"{node6}\"}}]\n"),
    )
    .unwrap();
    let ext6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x70);
    let yaml = lab
        .service_yaml_families("web", &[VIP4.into(), VIP6.into()], PORT, &[0])
        .unwrap()
        .replace(
            "  type: ClusterIP\n",
            &format!("  type: NodePort\n  externalIPs: [192.0.2.70, \"{ext6}\"]\n"),
        )
        .replace(
            "protocol: TCP, targetPort: 8080}",
            "protocol: TCP, targetPort: 8080, nodePort: 30080}",
        );
    assert!(yaml.contains("nodePort: 30080"), "{yaml}");
    lab.write_manifest("web.yaml", &yaml).unwrap();
    let agent = lab.start_agent().unwrap();
    let seen_as = |to: SocketAddr| lab.tcp_request(to).unwrap().peer.map(|p| p.ip());
    assert_eq!(seen_as(at(VIP4, PORT)), Some(lab.client.ip.into()));
    assert_eq!(seen_as(at(VIP6, PORT)), Some(client6.into()));
    for (to, node) in [
        (at(node4, 30080), IpAddr::from(node4)),
        (at(Ipv4Addr::new(192, 0, 2, 70), PORT), node4.into()),
        (at(node6, 30080), node6.into()),
        (at(ext6, PORT), node6.into()),
    ] {
        assert_eq!(seen_as(to), Some(node), "{to}");
    }
    assert_eq!(agent.problems_logged().unwrap(), 0, "{:#?}", agent.log());
}

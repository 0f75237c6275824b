//! `sliceway-agent list`, `trace` and `check`, and `run --config`, run as a user
//! would. Needs root.

use std::{net::Ipv4Addr, process::Command};

use serde_json::Value;
use sliceway_lab::{agent_cli, agent_start, http_get, workspace_binary, Lab};

/// `sliceway-agent trace -o json` of one packet from `src` to `dst`, over `maps`
/// (`--manifests DIR` or `--bpffs-dir DIR`), with `extra` arguments.
fn trace(maps: [&str; 2], src: &str, dst: &str, extra: &[&str]) -> Value {
    let mut args = vec!["trace", maps[0], maps[1], "--src", src, "--dst", dst];
    args.extend_from_slice(extra);
    args.extend(["-o", "json"]);
    agent_cli(&args)
}

#[test]
fn trace_and_list_tell_where_packets_go() {
    let lab = Lab::new(3).unwrap();
    lab.write_manifest(
        "web.yaml",
        &lab.service_yaml("web", Ipv4Addr::new(10, 96, 0, 10), 80, &[0, 1, 2]),
    )
    .unwrap();
    lab.write_manifest(
        "empty.yaml",
        &lab.service_yaml("empty", Ipv4Addr::new(10, 96, 0, 20), 80, &[]),
    )
    .unwrap();
    let dir = lab.manifests.to_str().unwrap();
    let backends: Vec<String> = lab
        .backends
        .iter()
        .map(|b| format!("{}:8080", b.ip))
        .collect();

    // Compiled from the manifests, private maps.
    let manifests = ["--manifests", dir];
    let t = trace(manifests, "10.244.1.2:40000", "10.96.0.10:80", &[]);
    assert_eq!(t["verdict"], "dnat", "{t}");
    assert_eq!(t["service"], "default/web:http");
    let candidates: Vec<String> = t["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let mut sorted = candidates.clone();
    sorted.sort();
    assert_eq!(sorted, backends);
    assert!(candidates.contains(&t["backend"].as_str().unwrap().to_string()));

    let t = trace(
        manifests,
        "10.244.1.2",
        "10.96.0.20:80",
        &["--proto", "udp"],
    );
    // No endpoints anywhere: rejected (ICMP port unreachable), as kube-proxy does.
    assert_eq!(
        (t["verdict"].as_str(), t["service"].as_str()),
        (Some("reject"), Some("default/empty:dns")),
        "{t}"
    );
    assert_eq!(t["candidates"], Value::Array(vec![]));
    assert_eq!(t["reason"], "reject_no_backend");

    // A port the Service does not declare: rejected too, never passed on.
    let t = trace(manifests, "10.244.1.2", "10.96.0.20:9999", &[]);
    assert_eq!(
        (t["verdict"].as_str(), t["reason"].as_str()),
        (Some("reject"), Some("reject_no_port")),
        "{t}"
    );

    let t = trace(manifests, "10.244.1.2", "10.244.11.2:8080", &[]);
    assert_eq!(t["verdict"], "pass");
    assert_eq!(t["service"], Value::Null);
    assert_eq!(t["backend"], Value::Null);

    // Against a running agent's pinned maps.
    let _agent = lab.start_agent().unwrap();
    let bpffs = lab.bpffs.to_str().unwrap();
    let live = trace(
        ["--bpffs-dir", bpffs],
        "10.244.1.2:40000",
        "10.96.0.10:80",
        &[],
    );
    assert_eq!(live["verdict"], "dnat", "{live}");
    assert_eq!(live["service"], "default/web:http");

    let l = agent_cli(&["list", "--bpffs-dir", bpffs, "-o", "json"]);
    let frontends = l["frontends"].as_array().unwrap();
    let web = frontends
        .iter()
        .find(|f| f["frontend"] == "10.96.0.10:80/TCP")
        .unwrap_or_else(|| panic!("{l}"));
    assert_eq!(web["service"], "default/web:http");
    assert_eq!(web["backends"].as_array().unwrap().len(), 3);
    let empty = frontends
        .iter()
        .find(|f| f["frontend"] == "10.96.0.20:80/UDP")
        .unwrap();
    assert_eq!(empty["backends"], Value::Array(vec![]));
    // Two Services' frontends, and a ClusterIP marker each (their other ports).
    assert_eq!(frontends.len(), 6, "{l}");
    let marker = frontends
        .iter()
        .find(|f| f["frontend"] == "10.96.0.10:*")
        .unwrap_or_else(|| panic!("{l}"));
    assert_eq!(marker["service"], "default/web");
    assert!(l["counters"]["dnat_new"].is_u64());
}

/// `trace`'s contract: every answer has the same JSON shape (`snat` included); a
/// packet from outside the node goes through the uplink program (masqueraded to the
/// node's address, dropped while none is known); a socket of the node itself gets what the socket programs do (one of
/// the candidates, chosen per connection; an undeclared port refused); SCTP is
/// traced like TCP and UDP; `--service-proxy-name` selects Services as `run` does.
#[test]
fn trace_answers_every_origin_and_follows_the_service_proxy_name() {
    let lab = Lab::new(1).unwrap();
    let theirs = lab
        .service_yaml("theirs", Ipv4Addr::new(10, 96, 0, 30), 80, &[0])
        .replace(
            "metadata:\n  name: theirs\n  namespace: default\n",
            "metadata:\n  name: theirs\n  namespace: default\n  labels: {service.kubernetes.io/service-proxy-name: sliceway}\n",
        )
        .replace(
            "    kubernetes.io/service-name: theirs\n",
            "    kubernetes.io/service-name: theirs\n    service.kubernetes.io/service-proxy-name: sliceway\n",
        );
    lab.write_manifest("theirs.yaml", &theirs).unwrap();
    let dir = lab.manifests.to_str().unwrap();
    let manifests = ["--manifests", dir];
    let to = |dst: &str, extra: &[&str]| trace(manifests, "10.244.1.2:40000", dst, extra);
    let theirs = |extra: &[&str]| to("10.96.0.30:80", extra);
    let mine = ["--service-proxy-name", "sliceway"];
    // From outside the node: masqueraded to the node's address, which only a Node
    // object with an address gives a trace from files.
    let external = theirs(&["--from", "external", mine[0], mine[1]]);
    assert_eq!(
        (&external["verdict"], &external["reason"]),
        (&"drop".into(), &"drop_no_node_addr".into()),
        "{external}"
    );
    lab.write_manifest(
        "node.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nstatus:\n  addresses: [{type: InternalIP, address: 10.100.0.11}]\n",
    )
    .unwrap();
    let node = ["--node", "node-1"];
    let external = theirs(&["--from", "external", mine[0], mine[1], node[0], node[1]]);
    assert_eq!(
        (&external["verdict"], &external["reason"], &external["snat"]),
        (
            &"dnat".into(),
            &"dnat_masqueraded".into(),
            &"10.100.0.11".into()
        ),
        "{external}"
    );
    assert_eq!(
        external["backend"],
        format!("{}:{}", lab.backends[0].ip, sliceway_lab::BACKEND_PORT)
    );
    assert_eq!(external["program"], "sliceway_tc_ext");
    // The same through the XDP program, which decides it itself; a Service without
    // endpoints it leaves to the TC program, which rejects.
    let xdp = theirs(&["--from", "external-xdp", mine[0], mine[1], node[0], node[1]]);
    for key in [
        "verdict",
        "reason",
        "snat",
        "backend",
        "service",
        "candidates",
    ] {
        assert_eq!(xdp[key], external[key], "{key}: {xdp} against {external}");
    }
    assert_eq!(xdp["program"], "sliceway_xdp", "{xdp}");
    // Direct server return to a NodePort of the node: the client's address kept, no
    // masquerade; the XDP program leaves the new connection to the TC program.
    let np = lab
        .service_yaml("np", Ipv4Addr::new(10, 96, 0, 32), 80, &[0])
        .replace("  type: ClusterIP\n", "  type: NodePort\n")
        .replace(
            "protocol: TCP, targetPort: 8080}",
            "protocol: TCP, targetPort: 8080, nodePort: 30080}",
        );
    lab.write_manifest("np.yaml", &np).unwrap();
    for from in ["external", "external-xdp"] {
        let dsr = &["--from", from, node[0], node[1], "--external-mode", "dsr"];
        let t = to("10.100.0.11:30080", dsr);
        assert_eq!(
            (&t["verdict"], &t["reason"], &t["snat"], &t["program"]),
            (
                &"dnat".into(),
                &"dnat_dsr".into(),
                &Value::Null,
                &"sliceway_tc_ext".into()
            ),
            "{t}"
        );
    }
    let masqueraded = to(
        "10.100.0.11:30080",
        &["--from", "external", node[0], node[1]],
    );
    assert_eq!(masqueraded["reason"], "dnat_masqueraded", "{masqueraded}");
    lab.write_manifest(
        "empty.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: empty, namespace: default}\n\
         spec:\n  clusterIP: 10.96.0.31\n  ports: [{port: 80, protocol: TCP}]\n",
    )
    .unwrap();
    let empty = |from: &str| to("10.96.0.31:80", &["--from", from, node[0], node[1]]);
    let (tc, xdp) = (empty("external"), empty("external-xdp"));
    assert_eq!(
        (&xdp["verdict"], &xdp["reason"], &xdp["program"]),
        (
            &"reject".into(),
            &"reject_no_backend".into(),
            &"sliceway_tc_ext".into()
        ),
        "{xdp}"
    );
    assert_eq!(
        (&tc["verdict"], &tc["reason"]),
        (&xdp["verdict"], &xdp["reason"])
    );
    let host = theirs(&["--from", "host", "--service-proxy-name", "sliceway"]);
    for t in [&external, &host] {
        for key in ["service", "backend", "candidates", "snat", "reason"] {
            assert!(t.get(key).is_some(), "no {key} in {t}");
        }
    }
    assert_eq!(
        (&host["verdict"], &host["reason"], &host["service"]),
        (
            &"dnat".into(),
            &"sock_translated".into(),
            &"default/theirs:http".into()
        ),
        "{host}"
    );
    let backend = format!("{}:{}", lab.backends[0].ip, sliceway_lab::BACKEND_PORT);
    assert_eq!(host["candidates"], serde_json::json!([backend]), "{host}");
    assert_eq!(
        host["backend"],
        Value::Null,
        "chosen per connection: {host}"
    );
    assert_eq!(theirs(&["--from", "host"])["reason"], "pass_no_service");
    // A pod's socket with --socket-lb-pods: TCP to a frontend with backends is the
    // socket programs'; UDP, and a frontend without backends, go on to TC's.
    let pod_socket = theirs(&["--from", "pod-socket", "--service-proxy-name", "sliceway"]);
    assert_eq!(
        (
            &pod_socket["verdict"],
            &pod_socket["reason"],
            &pod_socket["backend"]
        ),
        (&"dnat".into(), &"sock_translated_pod".into(), &Value::Null),
        "{pod_socket}"
    );
    assert_eq!(
        pod_socket["candidates"],
        serde_json::json!([backend]),
        "{pod_socket}"
    );
    let udp = theirs(&[
        "--from",
        "pod-socket",
        "--service-proxy-name",
        "sliceway",
        "--proto",
        "udp",
    ]);
    assert_eq!(
        (&udp["verdict"], &udp["reason"], &udp["backend"]),
        (&"dnat".into(), &"dnat_new".into(), &backend.clone().into()),
        "{udp}"
    );
    let t = to("10.96.0.31:80", &["--from", "pod-socket"]);
    assert_eq!(
        (&t["verdict"], &t["reason"]),
        (&"reject".into(), &"reject_no_backend".into()),
        "{t}"
    );
    let t = to(
        "10.96.0.30:81",
        &["--from", "host", "--service-proxy-name", "sliceway"],
    );
    assert_eq!(
        (&t["verdict"], &t["reason"]),
        (&"reject".into(), &"sock_reject_no_port".into()),
        "{t}"
    );
    // What the compiler refused is in every answer from manifests.
    lab.write_manifest(
        "bad.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: default}\nspec: {clusterIP: 10.96.0.31, ports: [{name: http, port: 70000}]}\n",
    )
    .unwrap();
    let t = theirs(&[]);
    let skipped = t["skipped"].as_array().unwrap();
    assert!(
        skipped.iter().any(|s| s["object"] == "Service default/bad"
            && s["reason"].as_str().unwrap().contains("70000")),
        "{t}"
    );
    // Labelled for a proxy named "sliceway": ignored without the flag (as kube-proxy
    // ignores it), served with it.
    assert_eq!(theirs(&[])["verdict"], "pass");
    let t = theirs(&["--service-proxy-name", "sliceway"]);
    assert_eq!(t["verdict"], "dnat", "{t}");
    // SCTP: to a port the Service declares for TCP only, rejected as any undeclared
    // port of a ClusterIP; to an SCTP port, translated.
    let t = theirs(&["--service-proxy-name", "sliceway", "--proto", "sctp"]);
    assert_eq!(
        (&t["verdict"], &t["reason"]),
        (&"reject".into(), &"reject_no_port".into()),
        "{t}"
    );
    lab.write_manifest(
        "sctp.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: sig, namespace: default}\n\
         spec: {clusterIP: 10.96.0.32, ports: [{name: s, port: 3868, protocol: SCTP, targetPort: 13868}]}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {name: sig-1, namespace: default, labels: {kubernetes.io/service-name: sig}}\n\
         addressType: IPv4\nports: [{name: s, port: 13868, protocol: SCTP}]\n\
         endpoints: [{addresses: [10.244.7.7]}]\n",
    )
    .unwrap();
    let t = to("10.96.0.32:3868", &["--proto", "sctp"]);
    assert_eq!(t["verdict"], "dnat", "{t}");
    assert_eq!(t["backend"], "10.244.7.7:13868", "{t}");
    assert_eq!(t["snat"], Value::Null);
    // The backend itself as the client (hairpin): it is reached from the hairpin
    // address.
    let t = trace(
        manifests,
        "10.244.7.7:40000",
        "10.96.0.32:3868",
        &["--proto", "sctp"],
    );
    assert_eq!(
        (&t["verdict"], &t["snat"]),
        (&"dnat".into(), &"169.254.42.1".into()),
        "{t}"
    );
}

/// A manifest directory of its own for one test, removed when dropped.
struct ManifestDir(std::path::PathBuf);

impl ManifestDir {
    fn new(name: &str, files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("sliceway-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        Self(dir)
    }
}

impl Drop for ManifestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Dual stack as `trace` reads it from a directory: the Services of the compiler's
/// fixture (dataplane-user/tests/testdata/dualstack.yaml) without its malformed
/// endpoints, which the manifest reader refuses with their whole slice, and an IPv6
/// ClusterIP without endpoints.
const DUALSTACK: &str = r#"apiVersion: v1
kind: Service
metadata: {name: dual, namespace: ds}
spec:
  clusterIP: 10.96.6.1
  clusterIPs: [10.96.6.1, fd00:96::1]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v4, namespace: ds, labels: {kubernetes.io/service-name: dual}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.60], nodeName: node-1}
- {addresses: [10.244.2.60], nodeName: node-2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v6, namespace: ds, labels: {kubernetes.io/service-name: dual}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: ["fd00:244:1::60"], nodeName: node-1}
- {addresses: ["fd00:244:2::60"], nodeName: node-2}
---
apiVersion: v1
kind: Service
metadata: {name: only6, namespace: ds}
spec:
  clusterIP: fd00:96::2
  clusterIPs: [fd00:96::2]
  ipFamilies: [IPv6]
  ipFamilyPolicy: SingleStack
  externalIPs: ["2001:db8::62"]
  ports:
  - {name: dns, port: 53, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: only6-a, namespace: ds, labels: {kubernetes.io/service-name: only6}}
addressType: IPv6
ports: [{name: dns, port: 5353, protocol: UDP}]
endpoints:
- {addresses: ["fd00:244:1::53"], nodeName: node-1}
- {addresses: ["fd00:244:1::54"], nodeName: node-1, conditions: {ready: false, serving: true, terminating: true}}
---
apiVersion: v1
kind: Service
metadata: {name: empty6, namespace: ds}
spec:
  clusterIP: fd00:96::3
  clusterIPs: [fd00:96::3]
  ipFamilies: [IPv6]
  ports:
  - {name: http, port: 80}
"#;
const DUAL_NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nstatus:\n  \
     addresses: [{type: InternalIP, address: 10.100.0.11}, {type: InternalIP, address: \"fd00:100::11\"}]\n";

/// `sliceway-agent trace` with `args`, expected to fail: its standard error.
fn trace_fails(args: &[&str]) -> String {
    let out = Command::new(workspace_binary("sliceway-agent").unwrap())
        .arg("trace")
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} succeeded: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Issue 12: `trace --dst [v6]:port` sends an IPv6 packet through the IPv6 programs
/// and reads the frontend and its backends back from SERVICES6 and BACKENDS6: a
/// pod's packet to a dual-stack Service's IPv6 ClusterIP is translated to one of its
/// IPv6 endpoints; a ClusterIP without endpoints and an undeclared port are
/// rejected; from outside, masqueraded to the Node's IPv6 address; IPv4 of the same
/// Service still answers as before.
#[test]
fn trace_follows_ipv6_packets() {
    let dir = ManifestDir::new(
        "trace-v6",
        &[("dualstack.yaml", DUALSTACK), ("node.yaml", DUAL_NODE)],
    );
    let manifests = ["--manifests", dir.0.to_str().unwrap()];
    let t = trace(manifests, "[fd00:244:1::2]:41000", "[fd00:96::1]:80", &[]);
    assert_eq!(
        (&t["verdict"], &t["reason"], &t["service"], &t["program"]),
        (
            &"dnat".into(),
            &"dnat_new".into(),
            &"ds/dual:http".into(),
            &"sliceway_tc6".into()
        ),
        "{t}"
    );
    let endpoints = ["[fd00:244:1::60]:8080", "[fd00:244:2::60]:8080"];
    let mut candidates: Vec<&str> = t["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    candidates.sort();
    assert_eq!(candidates, endpoints, "{t}");
    assert!(endpoints.contains(&t["backend"].as_str().unwrap()), "{t}");
    assert_eq!(t["snat"], Value::Null, "{t}");
    assert_eq!(t["skipped"], Value::Array(vec![]), "{t}");
    // A source without a port, bare or in brackets.
    for src in ["fd00:244:1::2", "[fd00:244:1::2]"] {
        let t = trace(manifests, src, "[fd00:96::1]:80", &[]);
        assert_eq!(t["verdict"], "dnat", "{src}: {t}");
    }
    // No endpoints: rejected, by ICMPv6.
    let t = trace(manifests, "fd00:244:1::2", "[fd00:96::3]:80", &[]);
    assert_eq!(
        (&t["verdict"], &t["reason"], &t["service"], &t["candidates"]),
        (
            &"reject".into(),
            &"reject_no_backend".into(),
            &"ds/empty6:http".into(),
            &Value::Array(vec![])
        ),
        "{t}"
    );
    // A port the Service does not declare.
    let t = trace(manifests, "fd00:244:1::2", "[fd00:96::1]:9999", &[]);
    assert_eq!(
        (&t["verdict"], &t["reason"], &t["service"]),
        (&"reject".into(), &"reject_no_port".into(), &Value::Null),
        "{t}"
    );
    // UDP to an IPv6-only Service: its ready endpoint only.
    let t = trace(
        manifests,
        "fd00:244:1::2",
        "[fd00:96::2]:53",
        &["--proto", "udp"],
    );
    assert_eq!(
        (&t["verdict"], &t["backend"]),
        (&"dnat".into(), &"[fd00:244:1::53]:5353".into()),
        "{t}"
    );
    // From outside: an external IP, masqueraded to the Node's IPv6 address, by the
    // uplink's TC program or, as it would, by the XDP program's IPv6 program.
    for (from, program) in [
        ("external", "sliceway_ext6"),
        ("external-xdp", "sliceway_xdp6"),
    ] {
        let t = trace(
            manifests,
            "[2001:db8:9::1]:41000",
            "[2001:db8::62]:53",
            &["--proto", "udp", "--from", from, "--node", "node-1"],
        );
        assert_eq!(
            (&t["verdict"], &t["reason"], &t["snat"], &t["program"]),
            (
                &"dnat".into(),
                &"dnat_masqueraded".into(),
                &"fd00:100::11".into(),
                &program.into()
            ),
            "{from}: {t}"
        );
    }
    // IPv4 of the dual-stack Service: its IPv4 endpoints, as before.
    let t = trace(manifests, "10.244.1.2", "10.96.6.1:80", &[]);
    assert_eq!(
        (&t["verdict"], &t["service"], &t["program"]),
        (
            &"dnat".into(),
            &"ds/dual:http".into(),
            &"sliceway_tc".into()
        ),
        "{t}"
    );
    let mut candidates: Vec<&str> = t["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    candidates.sort();
    assert_eq!(candidates, ["10.244.1.60:8080", "10.244.2.60:8080"], "{t}");
}

/// Issue 12: `trace` over a running agent's pinned maps finds its IPv6 frontends
/// (SERVICES6 and BACKENDS6 taken from the pins, not made empty).
#[test]
fn live_trace_reads_pinned_ipv6_maps() {
    let lab = Lab::new(1).unwrap();
    lab.write_manifest("dualstack.yaml", DUALSTACK).unwrap();
    let _agent = lab.start_agent().unwrap();
    let bpffs = ["--bpffs-dir", lab.bpffs.to_str().unwrap()];
    let t = trace(
        bpffs,
        "fd00:244:1::2",
        "[fd00:96::2]:53",
        &["--proto", "udp"],
    );
    assert_eq!(
        (&t["verdict"], &t["service"], &t["backend"]),
        (
            &"dnat".into(),
            &"ds/only6:dns".into(),
            &"[fd00:244:1::53]:5353".into()
        ),
        "{t}"
    );
}

/// Issue 12: `trace --from host` over IPv6 shows what the IPv6 socket programs do
/// with a socket of the node: an IPv6 frontend's backends as candidates, a
/// frontend without endpoints and an undeclared port refused; an IPv4-mapped
/// destination (a dual-stack socket's) is IPv4's frontend.
#[test]
fn trace_from_the_host_over_ipv6() {
    let dir = ManifestDir::new("trace-host6", &[("dualstack.yaml", DUALSTACK)]);
    let d = dir.0.to_str().unwrap();
    let host = |src: &str, dst: &str, extra: &[&str]| {
        let mut args = vec!["--from", "host"];
        args.extend_from_slice(extra);
        trace(["--manifests", d], src, dst, &args)
    };
    let candidates = |t: &serde_json::Value| {
        let mut c: Vec<String> = t["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
        c.sort();
        c
    };
    let t = host("fd00:100::11", "[fd00:96::1]:80", &[]);
    assert_eq!(
        (&t["verdict"], &t["reason"], &t["service"]),
        (
            &"dnat".into(),
            &"sock_translated".into(),
            &"ds/dual:http".into()
        ),
        "{t}"
    );
    assert_eq!(
        candidates(&t),
        ["[fd00:244:1::60]:8080", "[fd00:244:2::60]:8080"],
        "{t}"
    );
    let t = host("fd00:100::11", "[fd00:96::2]:53", &["--proto", "udp"]);
    assert_eq!(
        (&t["verdict"], &t["reason"]),
        (&"dnat".into(), &"sock_translated".into()),
        "{t}"
    );
    assert_eq!(candidates(&t), ["[fd00:244:1::53]:5353"], "{t}");
    for (dst, reason) in [
        ("[fd00:96::3]:80", "sock_reject_no_backend"),
        ("[fd00:96::1]:9999", "sock_reject_no_port"),
    ] {
        let t = host("fd00:100::11", dst, &[]);
        assert_eq!(
            (&t["verdict"], &t["reason"]),
            (&"reject".into(), &reason.into()),
            "{dst}: {t}"
        );
    }
    let t = host("fd00:100::11", "[fd00:96::99]:80", &[]);
    assert_eq!(t["verdict"], "pass", "{t}");
    // A dual-stack socket connecting to the IPv4 ClusterIP, mapped.
    let t = host("::ffff:10.100.0.11", "[::ffff:10.96.6.1]:80", &[]);
    assert_eq!(
        (&t["verdict"], &t["service"]),
        (&"dnat".into(), &"ds/dual:http".into()),
        "{t}"
    );
    assert_eq!(
        candidates(&t),
        ["10.244.1.60:8080", "10.244.2.60:8080"],
        "{t}"
    );
}

/// Issue 12: a `--src` of one family with a `--dst` of the other is refused with
/// what to give instead; a malformed `--dst` names the forms it takes.
#[test]
fn trace_refuses_mixed_families_and_malformed_destinations() {
    let dir = ManifestDir::new("trace-mixed", &[("dualstack.yaml", DUALSTACK)]);
    let d = dir.0.to_str().unwrap();
    for (src, dst) in [
        ("10.244.1.2", "[fd00:96::1]:80"),
        ("[fd00:244:1::2]:41000", "10.96.6.1:80"),
    ] {
        let err = trace_fails(&["--manifests", d, "--src", src, "--dst", dst]);
        assert!(
            err.contains("are of different address families: give both as IPv4"),
            "{src} {dst}: {err}"
        );
    }
    let err = trace_fails(&[
        "--manifests",
        d,
        "--src",
        "fd00:244:1::2",
        "--dst",
        "fd00:96::1:80",
    ]);
    assert!(
        err.contains("expected IP:PORT or [IPv6]:PORT, such as 10.96.0.10:80 or [fd00::10]:80"),
        "{err}"
    );
}

/// `conntrack` lists a running agent's connections from its pinned map (client,
/// frontend, Service, backend, state), filters by Service, and `--flush-backend`
/// forgets the connections of one backend.
#[test]
fn conntrack_lists_tracked_connections_and_flushes_a_backend() {
    let lab = Lab::new(2).unwrap();
    lab.write_manifest(
        "web.yaml",
        &lab.service_yaml("web", Ipv4Addr::new(10, 96, 0, 10), 80, &[0, 1]),
    )
    .unwrap();
    let _agent = lab.start_agent().unwrap();
    let bpffs = lab.bpffs.to_str().unwrap();
    let vip: std::net::SocketAddr = "10.96.0.10:80".parse().unwrap();
    // A connection that stays open while the listing is read.
    let conn = sliceway_lab::in_netns(&lab.client.ns, move || {
        sliceway_lab::servers::EchoConn::open(vip, std::time::Duration::from_secs(2))
    })
    .unwrap()
    .unwrap();
    let backend = lab
        .backends
        .iter()
        .find(|b| b.name == conn.reply.backend)
        .unwrap();
    let backend_addr = format!("{}:8080", backend.ip);

    let flows = agent_cli(&["conntrack", "--bpffs-dir", bpffs, "-o", "json"]);
    let flows = flows.as_array().unwrap();
    assert_eq!(flows.len(), 1, "{flows:?}");
    let f = &flows[0];
    assert_eq!(f["protocol"], "TCP");
    assert!(
        f["client"].as_str().unwrap().starts_with("10.244.1.2:"),
        "{f}"
    );
    assert_eq!(f["frontend"], "10.96.0.10:80");
    assert_eq!(f["service"], "default/web:http");
    assert_eq!(f["backend"], backend_addr.as_str());
    assert_eq!(f["state"], "tcp_established");
    assert!(f["expires_in_s"].as_u64().unwrap() > 3_600, "{f}");

    let other = agent_cli(&[
        "conntrack",
        "--bpffs-dir",
        bpffs,
        "--service",
        "default/other",
        "-o",
        "json",
    ]);
    assert_eq!(other, Value::Array(vec![]));
    let mine = agent_cli(&[
        "conntrack",
        "--bpffs-dir",
        bpffs,
        "--service",
        "default/web",
        "-o",
        "json",
    ]);
    assert_eq!(mine.as_array().unwrap().len(), 1);

    sliceway_lab::flush_the_one_connection_to(bpffs, &backend_addr);
    drop(conn);
}

/// Issue 18: `check` loads every program into the running kernel and says how the
/// agent would attach, as the tcx probe finds it.
#[test]
fn check_reports_every_program_and_the_attach_path() {
    let check = agent_cli(&["check", "-o", "json"]);
    assert_eq!(
        check["tcx"].as_bool(),
        Some(sliceway_agent::kernel::probe_tcx().is_ok()),
        "{check:#}"
    );
    assert_eq!(
        check["socket_errors"].as_bool(),
        Some(sliceway_agent::kernel::probe_set_retval()),
        "{check:#}"
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(check["kernel"].as_str(), Some(release.trim()));
    let programs = check["programs"].as_array().unwrap();
    let names: Vec<&str> = programs
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "sliceway_tc",
            "sliceway_tc_ext",
            "sliceway_reject",
            "sliceway_sctp_nat",
            "sliceway_dsr",
            "sliceway_l3",
            "sliceway_l3_ext",
            "sliceway_rej_l3",
            "sliceway_bridge",
            "sliceway_tc6",
            "sliceway_ext6",
            "sliceway_rej6",
            "sliceway_icmp6",
            "sliceway_dsr6",
            "sliceway_l3_6",
            "sliceway_l3ext6",
            "sliceway_rej6_l3",
            "sliceway_icmp6_l3",
            "sliceway_tc_out",
            "sliceway_l3_out",
            "sliceway_out6",
            "sliceway_l3out6",
            "sliceway_xdp",
            "sliceway_xdp6",
            "sliceway_connect4",
            "sliceway_sendmsg4",
            "sliceway_recvmsg4",
            "sliceway_getpeername4",
            "sliceway_connect6",
            "sliceway_sendmsg6",
            "sliceway_recvmsg6",
            "sliceway_getpeername6",
        ]
    );
    for p in programs {
        assert!(p["error"].is_null(), "{p:#}");
        // The TC program is thousands of instructions, the tail-called ones and the
        // socket programs tens to hundreds: checked whole, not reduced to the path of
        // a socket outside the agent's namespace (a handful).
        assert!(p["xlated_insns"].as_u64().unwrap() > 50, "{p:#}");
        assert!(
            p["verified_insns"].as_u64().unwrap() >= p["xlated_insns"].as_u64().unwrap() / 2,
            "{p:#}"
        );
    }
}

/// Issue 47: `check` lists what `run` probes before loading, each piece present or
/// not, and on this machine nothing required is missing.
#[test]
fn check_lists_the_kernel_requirements() {
    let check = agent_cli(&["check", "-o", "json"]);
    let reqs = check["requirements"].as_array().expect("requirements");
    let named = |name: &str| {
        reqs.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {check:#}"))
    };
    for name in [
        "the bpf() system call",
        "TC (sched_cls) programs",
        "the TC programs' helpers",
        "bpffs for the pins at /sys/fs/bpf/sliceway",
        "cgroup sock_addr programs",
        "the network namespace cookie",
    ] {
        assert_eq!(named(name)["present"], true, "{name}: {check:#}");
    }
    assert_eq!(
        named("tcx links")["present"].as_bool(),
        Some(sliceway_agent::kernel::probe_tcx().is_ok())
    );
    assert_eq!(
        named("kernel BTF")["present"].as_bool(),
        Some(std::path::Path::new("/sys/kernel/btf/vmlinux").exists())
    );
    assert_eq!(named("kernel BTF")["weight"], "note");
}

/// Issue 47: `run` probes what it needs before anything is served, loaded or
/// attached. A pin directory that cannot be used stops it with a message that names
/// it (and what to do), exit code non-zero; a socket-program cgroup that is not a
/// cgroup v2 hierarchy is only a warning saying what the agent does without.
#[test]
fn run_names_a_missing_requirement_before_starting() {
    let bin = workspace_binary("sliceway-agent").unwrap();
    let dir = std::env::temp_dir().join(format!("sliceway-cli-req-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // /proc takes no directory: neither a bpffs nor one to make.
    let out = Command::new(&bin)
        .args(["run", "--manifests"])
        .arg(&dir)
        .args([
            "--bpffs-dir",
            "/proc/sliceway-pins",
            "--socket-lb-cgroup",
            "/proc",
            "--healthz-port",
            "0",
            "--metrics-port",
            "0",
        ])
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("this kernel or node lacks one piece the agent needs:"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "bpffs for the pins at /proc/sliceway-pins: /proc is not on a bpffs; mount one there"
        ),
        "{stderr}"
    );
    // Warned, not fatal, and said with what the agent does without it.
    let warning = stderr
        .lines()
        .find(|l| l.contains("a cgroup v2 hierarchy (/proc)"))
        .unwrap_or_else(|| panic!("no warning about the cgroup: {stderr}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning
            .contains("the node's own sockets (kubelet, hostNetwork pods) do not reach Services"),
        "{warning}"
    );
    // Nothing was loaded or pinned.
    assert!(!stderr.contains("adopted pinned maps"), "{stderr}");
}

/// The head every KubeProxyConfiguration document starts with.
const KUBE_PROXY_CONFIG: &str =
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

/// A `sliceway-agent run` started by a test, its standard error read line by line;
/// stopped (SIGTERM, then SIGKILL) on drop.
struct RunningAgent {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl RunningAgent {
    /// The first line of the log so far or to come (within the agent's start
    /// budget) that contains every one of `words`.
    fn line_with(&mut self, words: &[&str]) -> String {
        let has = |l: &String| words.iter().all(|w| l.contains(w));
        if let Some(l) = self.seen.iter().find(|l| has(l)) {
            return l.clone();
        }
        let deadline = std::time::Instant::now() + agent_start();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if has(&l) {
                        return l;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no log line with {words:?}:\n{}", self.seen.join("\n"))
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        // SAFETY: a plain syscall on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 47: `run --config FILE` reads kube-proxy's KubeProxyConfiguration. A field
/// it honours changes what the agent does (health served where the file says), a
/// flag given on the command line wins over the file (metrics), a field it does not
/// honour is named in a warning and the agent goes on; an unknown field, or another
/// type, stops it before it starts, naming the field.
#[test]
fn run_takes_a_kube_proxy_configuration_file() {
    let bin = workspace_binary("sliceway-agent").unwrap();
    let dir = std::env::temp_dir().join(format!("sliceway-cli-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, body: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{KUBE_PROXY_CONFIG}{body}")).unwrap();
        path
    };

    // Refused before anything starts (no namespace needed).
    for (name, body, words) in [
        (
            "unknown.yaml",
            "conntrack:\n  tcpTimeout: 1h\n",
            &["conntrack.tcpTimeout", "unknown field `tcpTimeout`"][..],
        ),
        (
            "malformed.yaml",
            "healthzBindAddress: \"10256\"\n",
            &["healthzBindAddress", "expected IP or IP:PORT"][..],
        ),
    ] {
        let path = write(name, body);
        let out = Command::new(&bin)
            .arg("run")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} was taken: {stderr}");
        for w in words {
            assert!(stderr.contains(w), "{name}: {w:?} in {stderr}");
        }
        assert!(
            stderr.contains(&format!("--config {}", path.display())),
            "{stderr}"
        );
    }
    let kubelet = dir.join("kubelet.yaml");
    std::fs::write(
        &kubelet,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
    )
    .unwrap();
    let out = Command::new(&bin)
        .arg("run")
        .arg("--config")
        .arg(&kubelet)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("kind: \"KubeletConfiguration\": must be KubeProxyConfiguration"),
        "{out:?}"
    );

    // Taken, in a lab's node namespace.
    let lab = Lab::new(1).unwrap();
    let config = write(
        "config.yaml",
        "healthzBindAddress: 127.0.0.1:22256\nmetricsBindAddress: 127.0.0.1:23249\n\
         hostnameOverride: Node-1\nmode: iptables\nnodePortAddresses: [primary]\n",
    );
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", lab.node.name))
        .arg(&bin)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--manifests")
        .arg(&lab.manifests)
        .arg("--interfaces")
        .arg(lab.pod_interfaces().join(","))
        .arg("--bpffs-dir")
        .arg(&lab.bpffs)
        .arg("--no-socket-lb")
        .args(["--metrics-bind-address", "127.0.0.1:23250"])
        .env_remove("NODE_NAME")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut agent = RunningAgent {
        child,
        lines,
        seen: Vec::new(),
    };
    let warning = agent.line_with(&["WARN", "mode: not honoured"]);
    assert!(
        warning.contains(&format!("config={}", config.display())),
        "{warning}"
    );
    agent.line_with(&["serving /healthz and /livez", "addr=127.0.0.1:22256"]);
    agent.line_with(&["serving /metrics", "addr=127.0.0.1:23250"]);
    agent.line_with(&["synced"]);
    let health = http_get(
        &lab.node.name,
        "127.0.0.1:22256".parse().unwrap(),
        "/healthz",
    )
    .unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(
        !agent.seen.iter().any(|l| l.contains("127.0.0.1:23249")),
        "the file's metrics address was used: {:?}",
        agent.seen
    );
    drop(agent);
    std::fs::remove_dir_all(&dir).unwrap();
}

//! Every case of upstream's `TestCategorizeEndpoints` run end to end: each case is
//! written as ordinary Kubernetes YAML (a Service with its traffic policies, an
//! EndpointSlice with conditions, node names and hints, this node's Node with its
//! zone), compiled by the agent's compiler for this node, loaded into the kernel
//! program, and a TCP SYN to the ClusterIP is traced with BPF_PROG_TEST_RUN. The
//! ClusterIP's candidates must be upstream's internal set (the local set with
//! `internalTrafficPolicy: Local`, else the cluster set), an external IP's the cluster
//! set, and a ClusterIP without candidates must reject when upstream has no endpoints
//! anywhere and drop when it has only remote ones. Every case runs twice: as upstream
//! writes it, over IPv4, and over IPv6 (an IPv6-only Service, an `addressType: IPv6`
//! slice of the endpoints' IPv6 twins, an IPv6 external IP, the SYN through the IPv6
//! program), with the same expectations: kube-proxy categorizes each family's
//! endpoints alike, in that family's proxier
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/metaproxier/meta_proxier.go#L85-L96>).
//! Needs root (BPF).

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use dataplane_common::PROTO_TCP;
use sliceway_agent::{
    cmd::inspect,
    compiler::categorize::PortPolicy,
    compiler::{self, frontend_addr, frontend_addr6, Incremental, Options},
    kernel,
    model::{Origin, ServiceInfo, SliceInfo},
    source::local::parse_file,
};

include!("../../dataplane-user/tests/data/categorize_cases.rs");

/// The name this node has in a case, and the one every remote endpoint is on.
const OTHER_NODE: &str = "other-node";

/// The family a run of the cases is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// The cases as upstream writes them.
    V4,
    /// Every address of a case replaced by its IPv6 twin.
    V6,
}

impl Family {
    /// An IPv4 address of a case in this family: itself, or its IPv6 twin
    /// (`cluster::lab_v6`: 10.1.2.3 is fd00:10:1:2::3).
    fn ip(self, v4: &str) -> IpAddr {
        let v4 = v4.parse().expect("an IPv4 address");
        match self {
            Family::V4 => IpAddr::V4(v4),
            Family::V6 => IpAddr::V6(sliceway_lab::cluster::lab_v6(v4)),
        }
    }

    /// An endpoint `ip:port` of a case in this family, as the compiler and the
    /// trace print it (`[ip]:port` in IPv6).
    fn endpoint(self, endpoint: &str) -> String {
        let (ip, port) = endpoint.split_once(':').expect("ip:port");
        SocketAddr::new(self.ip(ip), port.parse().expect("a port")).to_string()
    }

    fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

fn node_of(c: &Case) -> &'static str {
    if c.node.is_empty() {
        "this-node"
    } else {
        c.node
    }
}

/// The case as YAML in `family`: a Service of that family alone, a slice of that
/// `addressType`, and this node's Node when it has a zone.
fn manifests(c: &Case, family: Family, vip: IpAddr, external: IpAddr) -> String {
    let mut y = String::new();
    let _ = write!(
        y,
        "apiVersion: v1\nkind: Service\nmetadata: {{name: svc, namespace: default}}\nspec:\n  clusterIP: \"{vip}\"\n  ipFamilyPolicy: SingleStack\n  ipFamilies: [{}]\n  internalTrafficPolicy: {}\n  externalTrafficPolicy: {}\n  ports: [{{name: http, port: 80}}]\n",
        family.name(),
        if c.policy.internal_local { "Local" } else { "Cluster" },
        if c.policy.external_local { "Local" } else { "Cluster" },
    );
    if c.policy.externally_accessible {
        let _ = writeln!(y, "  externalIPs: [\"{external}\"]");
    }
    let _ = write!(y, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-1, namespace: default, labels: {{kubernetes.io/service-name: svc}}}}\naddressType: {}\nports: [{{name: http, port: 80}}]\nendpoints:\n", family.name());
    if c.endpoints.is_empty() {
        y.push_str("  []\n");
    }
    for e in &c.endpoints {
        let ip = family.ip(e.addr.split(':').next().unwrap());
        let list = |names: &[Arc<str>]| {
            names
                .iter()
                .map(|n| format!("{{name: {n}}}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut hints = Vec::new();
        if !e.zones.is_empty() {
            hints.push(format!("forZones: [{}]", list(&e.zones)));
        }
        if !e.nodes.is_empty() {
            hints.push(format!("forNodes: [{}]", list(&e.nodes)));
        }
        let _ = writeln!(
            y,
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: {}, serving: {}, terminating: {}}}\n  nodeName: {}{}",
            e.ready,
            e.serving,
            e.terminating,
            if e.local { node_of(c) } else { OTHER_NODE },
            if hints.is_empty() {
                String::new()
            } else {
                format!("\n  hints: {{{}}}", hints.join(", "))
            }
        );
    }
    if !c.zone.is_empty() {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {}, labels: {{topology.kubernetes.io/zone: {}}}}}\n",
            node_of(c),
            c.zone
        );
    }
    y
}

/// Upstream's endpoints `ip:port` in `family`, sorted.
fn sorted(family: Family, v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| family.endpoint(s)).collect();
    v.sort();
    v
}

#[test]
fn every_upstream_categorize_case_through_the_compiler_and_the_program() {
    every_case(Family::V4);
}

#[test]
fn every_upstream_categorize_case_over_ipv6_through_the_compiler_and_the_ipv6_program() {
    every_case(Family::V6);
}

/// Every case in `family`: compiled, then traced through that family's program.
fn every_case(family: Family) {
    let cases = cases();
    assert_eq!(cases.len(), 32);
    for (i, c) in cases.iter().enumerate() {
        let vip = family.ip(&format!("10.96.7.{}", i + 1));
        let external = family.ip(&format!("192.0.2.{}", i + 1));
        let yaml = manifests(c, family, vip, external);
        let (objects, problems) = parse_file("case.yaml".as_ref(), &yaml);
        assert!(problems.is_empty(), "{}: {problems:?}\n{yaml}", c.name);
        let objects = objects.unwrap();
        let zone = (!c.zone.is_empty()).then(|| c.zone.to_string());
        let opts = Options {
            node_name: Some(node_of(c).into()),
            proxy_name: None,
            zone,
            ..Options::default()
        };

        // Upstream's expectations for what reaches this frontend.
        let cluster = sorted(family, c.cluster.unwrap_or_default());
        let local = sorted(family, c.local.unwrap_or_default());
        let internal = if c.policy.internal_local {
            &local
        } else {
            &cluster
        };
        let any = {
            let all = if !cluster.is_empty() && local.is_empty() {
                cluster.clone()
            } else if !local.is_empty() && cluster.is_empty() {
                local.clone()
            } else {
                sorted(family, c.all.unwrap_or_default())
            };
            !all.is_empty() || c.only_remote
        };

        let compiled = compiler::compile(&objects.services, &objects.slices, &opts);
        assert!(
            compiled.skipped.is_empty(),
            "{}: {:?}",
            c.name,
            compiled.skipped
        );
        // Each family's frontends from its own slices: none in the other family.
        let (ours, theirs) = match family {
            Family::V4 => (compiled.frontends.len(), compiled.frontends6.len()),
            Family::V6 => (compiled.frontends6.len(), compiled.frontends.len()),
        };
        assert!(
            ours > 0 && theirs == 0,
            "{} ({family:?}): {ours} frontends of the family, {theirs} of the other",
            c.name
        );
        // A frontend's backends by the frontend's `ip:port/proto`, of either family.
        let backends_of = |addr: &str| -> Vec<String> {
            let v4 = compiled
                .frontends
                .iter()
                .find(|(k, _)| frontend_addr(k) == addr)
                .map(|(_, f)| f.backends.iter().map(compiler::backend_addr).collect());
            let v6 = || {
                compiled
                    .frontends6
                    .iter()
                    .find(|(k, _)| frontend_addr6(k) == addr)
                    .map(|(_, f)| f.backends.iter().map(compiler::backend_addr6).collect())
            };
            let mut backends: Vec<String> = v4
                .or_else(v6)
                .unwrap_or_else(|| panic!("{} ({family:?}): no frontend {addr}", c.name));
            backends.sort();
            backends
        };
        let vip_port = SocketAddr::new(vip, 80);
        assert_eq!(
            &backends_of(&format!("{vip_port}/TCP")),
            internal,
            "{} ({family:?}): ClusterIP",
            c.name
        );
        if c.policy.externally_accessible {
            assert_eq!(
                backends_of(&format!("{}/TCP", SocketAddr::new(external, 80))),
                cluster,
                "{} ({family:?}): external IP from a pod (short-circuited to the cluster set)",
                c.name
            );
        }

        // As `trace --manifests`: the objects through the incremental compiler.
        let mut incremental = Incremental::new(opts.clone());
        for svc in &objects.services {
            incremental.put_service(Origin::default(), ServiceInfo::from(svc));
        }
        for slice in &objects.slices {
            incremental.put_slice(Origin::default(), SliceInfo::from(slice));
        }
        let trace = inspect::trace(
            incremental,
            SocketAddr::new(family.ip("10.244.1.2"), 40000),
            vip_port,
            PROTO_TCP,
            sliceway_agent::cmd::cli::From::Pod,
        )
        .expect("tracing (needs root)");
        let program = match family {
            Family::V4 => kernel::TC_PROGRAM,
            Family::V6 => kernel::TC6_PROGRAM,
        };
        assert_eq!(
            trace.program.as_deref(),
            Some(program),
            "{} ({family:?})",
            c.name
        );
        let candidates: BTreeSet<String> = trace.candidates.iter().cloned().collect();
        let want: BTreeSet<String> = internal.iter().cloned().collect();
        assert_eq!(
            candidates, want,
            "{} ({family:?}): trace candidates",
            c.name
        );
        let verdict = match (internal.is_empty(), any) {
            (false, _) => "dnat",
            (true, true) => "drop",
            (true, false) => "reject",
        };
        assert_eq!(trace.verdict, verdict, "{} ({family:?}): {trace:?}", c.name);
        if verdict == "dnat" {
            assert!(
                want.contains(trace.backend.as_deref().unwrap()),
                "{} ({family:?})",
                c.name
            );
        }
    }
}

//! Every case of upstream's `TestCategorizeEndpoints` run end to end: each case is
//! written as ordinary Kubernetes YAML (a Service with its traffic policies, an
//! EndpointSlice with conditions, node names and hints, this node's Node with its
//! zone), compiled by the agent's compiler for this node, loaded into the kernel
//! program, and a TCP SYN to the ClusterIP is traced with BPF_PROG_TEST_RUN. The
//! ClusterIP's candidates must be upstream's internal set (the local set with
//! `internalTrafficPolicy: Local`, else the cluster set), an external IP's the cluster
//! set, and a ClusterIP without candidates must reject when upstream has no endpoints
//! anywhere and drop when it has only remote ones. Needs root (BPF).

use std::{collections::BTreeSet, fmt::Write as _, net::SocketAddr, sync::Arc};

use dataplane_common::PROTO_TCP;
use sliceway_agent::{
    categorize::PortPolicy,
    compiler::{self, frontend_addr, Incremental, Options},
    inspect,
    model::{Origin, ServiceInfo, SliceInfo},
    source::local::parse_file,
};

include!("../../dataplane-user/tests/data/categorize_cases.rs");

/// The name this node has in a case, and the one every remote endpoint is on.
const OTHER_NODE: &str = "other-node";

fn node_of(c: &Case) -> &'static str {
    if c.node.is_empty() {
        "this-node"
    } else {
        c.node
    }
}

/// The case as YAML: Service, slice, and this node's Node when it has a zone.
fn manifests(c: &Case, vip: &str, external: &str) -> String {
    let mut y = String::new();
    let _ = write!(
        y,
        "apiVersion: v1\nkind: Service\nmetadata: {{name: svc, namespace: default}}\nspec:\n  clusterIP: {vip}\n  internalTrafficPolicy: {}\n  externalTrafficPolicy: {}\n  ports: [{{name: http, port: 80}}]\n",
        if c.policy.internal_local { "Local" } else { "Cluster" },
        if c.policy.external_local { "Local" } else { "Cluster" },
    );
    if c.policy.externally_accessible {
        let _ = writeln!(y, "  externalIPs: [{external}]");
    }
    y.push_str("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: svc-1, namespace: default, labels: {kubernetes.io/service-name: svc}}\naddressType: IPv4\nports: [{name: http, port: 80}]\nendpoints:\n");
    if c.endpoints.is_empty() {
        y.push_str("  []\n");
    }
    for e in &c.endpoints {
        let ip = e.addr.split(':').next().unwrap();
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
            "- addresses: [{ip}]\n  conditions: {{ready: {}, serving: {}, terminating: {}}}\n  nodeName: {}{}",
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

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn every_upstream_categorize_case_through_the_compiler_and_the_program() {
    let cases = cases();
    assert_eq!(cases.len(), 32);
    for (i, c) in cases.iter().enumerate() {
        let vip = format!("10.96.7.{}", i + 1);
        let external = format!("192.0.2.{}", i + 1);
        let yaml = manifests(c, &vip, &external);
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
        let cluster = sorted(c.cluster.unwrap_or_default());
        let local = sorted(c.local.unwrap_or_default());
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
                sorted(c.all.unwrap_or_default())
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
        let backends_of = |addr: &str| -> Vec<String> {
            let f = compiled
                .frontends
                .iter()
                .find(|(k, _)| frontend_addr(k) == addr)
                .unwrap_or_else(|| panic!("{}: no frontend {addr}", c.name))
                .1;
            f.backends.iter().map(compiler::backend_addr).collect()
        };
        assert_eq!(
            &backends_of(&format!("{vip}:80/TCP")),
            internal,
            "{}: ClusterIP",
            c.name
        );
        if c.policy.externally_accessible {
            assert_eq!(
                backends_of(&format!("{external}:80/TCP")),
                cluster,
                "{}: external IP from a pod (short-circuited to the cluster set)",
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
            "10.244.1.2:40000".parse::<SocketAddr>().unwrap(),
            format!("{vip}:80").parse().unwrap(),
            PROTO_TCP,
            sliceway_agent::cli::From::Pod,
        )
        .expect("tracing (needs root)");
        let candidates: BTreeSet<String> = trace.candidates.iter().cloned().collect();
        let want: BTreeSet<String> = internal.iter().cloned().collect();
        assert_eq!(candidates, want, "{}: trace candidates", c.name);
        let verdict = match (internal.is_empty(), any) {
            (false, _) => "dnat",
            (true, true) => "drop",
            (true, false) => "reject",
        };
        assert_eq!(trace.verdict, verdict, "{}: {trace:?}", c.name);
        if verdict == "dnat" {
            assert!(
                want.contains(trace.backend.as_deref().unwrap()),
                "{}",
                c.name
            );
        }
    }
}

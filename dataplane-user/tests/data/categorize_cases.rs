// Every case of upstream's `TestCategorizeEndpoints`
// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/topology_test.go>),
// written again as data: endpoints by address, with conditions, locality and hints;
// the expected sets by address. Included by the categorizer's unit tests and by the
// tests that run the same cases through the compiler and the kernel program; the
// includer brings `Arc` and `PortPolicy` into scope.

#[derive(Clone, Default)]
struct Ep {
    addr: &'static str,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
    zones: Vec<Arc<str>>,
    nodes: Vec<Arc<str>>,
}

fn names(n: &[&str]) -> Vec<Arc<str>> {
    n.iter().map(|s| Arc::from(*s)).collect()
}

/// A ready endpoint (upstream's tests set `serving` only where they mean it).
fn ready(addr: &'static str) -> Ep {
    Ep {
        addr,
        ready: true,
        ..Default::default()
    }
}
fn zoned(addr: &'static str, zones: &[&str]) -> Ep {
    Ep {
        zones: names(zones),
        ..ready(addr)
    }
}
fn hinted(addr: &'static str, zone: &str, node: &str) -> Ep {
    Ep {
        zones: names(&[zone]),
        nodes: names(&[node]),
        ..ready(addr)
    }
}
fn local(mut e: Ep) -> Ep {
    e.local = true;
    e
}
fn unready(mut e: Ep) -> Ep {
    e.ready = false;
    e
}
fn terminating(addr: &'static str, is_local: bool) -> Ep {
    Ep {
        addr,
        serving: true,
        terminating: true,
        local: is_local,
        ..Default::default()
    }
}

struct Case {
    name: &'static str,
    node: &'static str,
    zone: &'static str,
    policy: PortPolicy,
    endpoints: Vec<Ep>,
    cluster: Option<&'static [&'static str]>,
    local: Option<&'static [&'static str]>,
    /// `None`: the one of cluster and local that is set and not empty.
    all: Option<&'static [&'static str]>,
    only_remote: bool,
}

const CLUSTER: PortPolicy = PortPolicy {
    internal_local: false,
    external_local: false,
    externally_accessible: false,
};
fn policy(internal_local: bool, external_local: bool, node_port: bool) -> PortPolicy {
    PortPolicy {
        internal_local,
        external_local,
        externally_accessible: node_port,
    }
}

fn case(name: &'static str, endpoints: Vec<Ep>) -> Case {
    Case {
        name,
        node: "",
        zone: "",
        policy: CLUSTER,
        endpoints,
        cluster: None,
        local: None,
        all: None,
        only_remote: false,
    }
}

fn cases() -> Vec<Case> {
    let abcd = |za, zb, zc, zd| {
        vec![
            zoned("10.1.2.3:80", za),
            zoned("10.1.2.4:80", zb),
            zoned("10.1.2.5:80", zc),
            zoned("10.1.2.6:80", zd),
        ]
    };
    let four_nodes = || {
        vec![
            hinted("10.1.2.3:80", "zone-a", "node-1"),
            hinted("10.1.2.4:80", "zone-b", "node-2"),
            hinted("10.1.2.5:80", "zone-c", "node-3"),
            hinted("10.1.2.6:80", "zone-a", "node-4"),
        ]
    };
    let local_ab = || {
        vec![
            local(zoned("10.1.2.3:80", &["zone-a"])),
            local(zoned("10.1.2.4:80", &["zone-b"])),
            zoned("10.1.2.5:80", &["zone-c"]),
            zoned("10.1.2.6:80", &["zone-a"]),
        ]
    };
    let one_local = || vec![local(ready("10.0.0.0:80")), ready("10.0.0.1:80")];
    vec![
        Case {
            zone: "zone-a",
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            ..case(
                "should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone",
                abcd(&["zone-a"], &["zone-b"], &["zone-c"], &["zone-a"]),
            )
        },
        Case {
            zone: "zone-a",
            policy: policy(false, true, true),
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
            all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            ..case("externalTrafficPolicy: Local, topology ignored for Local endpoints", local_ab())
        },
        Case {
            zone: "zone-a",
            policy: policy(true, false, true),
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
            all: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            ..case("internalTrafficPolicy: Local, topology ignored for Local endpoints", local_ab())
        },
        Case {
            cluster: Some(&["10.1.2.3:80"]),
            ..case("empty node labels", vec![zoned("10.1.2.3:80", &["zone-a"])])
        },
        Case {
            zone: "",
            cluster: Some(&["10.1.2.3:80"]),
            ..case("empty zone label", vec![zoned("10.1.2.3:80", &["zone-a"])])
        },
        Case {
            zone: "zone-b",
            cluster: Some(&["10.1.2.3:80"]),
            ..case("node in different zone, no endpoint filtering", vec![zoned("10.1.2.3:80", &["zone-a"])])
        },
        Case {
            zone: "zone-a",
            cluster: Some(&["10.1.2.3:80"]),
            ..case("unready endpoint", {
                let mut e = abcd(&["zone-a"], &["zone-b"], &["zone-c"], &["zone-a"]);
                e[3].ready = false;
                e
            })
        },
        Case {
            zone: "zone-a",
            cluster: Some(&["10.1.2.4:80", "10.1.2.5:80"]),
            ..case("only unready endpoints in same zone (should not filter)", {
                let mut e = abcd(&["zone-a"], &["zone-b"], &["zone-c"], &["zone-a"]);
                e[0].ready = false;
                e[3].ready = false;
                e
            })
        },
        Case {
            zone: "zone-a",
            cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
            ..case("missing hints, no filtering applied", abcd(&["zone-a"], &["zone-b"], &[], &["zone-a"]))
        },
        Case {
            zone: "zone-c",
            cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
            ..case(
                "multiple hints per endpoint, filtering includes any endpoint with zone included",
                abcd(&["zone-a", "zone-b", "zone-c"], &["zone-b", "zone-c"], &["zone-b", "zone-d"], &["zone-c"]),
            )
        },
        Case {
            // Upstream runs this case with the gate off (emulating 1.34), where
            // the slice cache does not record node hints at all: the same input
            // without node hints.
            node: "node-1",
            zone: "zone-a",
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            ..case("PreferSameNode falls back to same-zone when feature gate disabled", {
                let mut e = four_nodes();
                e.iter_mut().for_each(|e| e.nodes.clear());
                e
            })
        },
        Case {
            node: "node-1",
            zone: "zone-a",
            cluster: Some(&["10.1.2.3:80"]),
            ..case("PreferSameNode available", four_nodes())
        },
        Case {
            node: "node-1",
            zone: "zone-a",
            cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
            ..case("PreferSameNode ignored if some endpoints unhinted", {
                let mut e = four_nodes();
                e[1] = ready("10.1.2.4:80");
                e
            })
        },
        Case {
            node: "node-0",
            zone: "zone-a",
            cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
            ..case("PreferSameNode falls back to PreferSameZone if no endpoint for node", four_nodes())
        },
        Case {
            zone: "zone-a",
            policy: policy(false, true, true),
            cluster: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
            local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"]),
            ..case(
                "conflicting topology and localness require merging allEndpoints",
                vec![
                    local(zoned("10.0.0.0:80", &["zone-a"])),
                    local(zoned("10.0.0.1:80", &["zone-b"])),
                    zoned("10.0.0.2:80", &["zone-a"]),
                    zoned("10.0.0.3:80", &["zone-b"]),
                ],
            )
        },
        Case {
            policy: policy(true, false, false),
            local: Some(&[]),
            ..case("internalTrafficPolicy: Local, with empty endpoints", vec![])
        },
        Case {
            policy: policy(true, false, false),
            local: Some(&[]),
            only_remote: true,
            ..case(
                "internalTrafficPolicy: Local, but all endpoints are remote",
                vec![ready("10.0.0.0:80"), ready("10.0.0.1:80")],
            )
        },
        Case {
            policy: policy(true, false, false),
            local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..case(
                "internalTrafficPolicy: Local, all endpoints are local",
                vec![local(ready("10.0.0.0:80")), local(ready("10.0.0.1:80"))],
            )
        },
        Case {
            policy: policy(true, false, false),
            local: Some(&["10.0.0.0:80"]),
            ..case("internalTrafficPolicy: Local, some endpoints are local", one_local())
        },
        Case {
            cluster: Some(&[]),
            ..case(
                "Cluster traffic policy, endpoints not Ready",
                vec![unready(ready("10.0.0.0:80")), unready(ready("10.0.0.1:80"))],
            )
        },
        Case {
            cluster: Some(&["10.0.0.1:80"]),
            ..case(
                "Cluster traffic policy, some endpoints are Ready",
                vec![unready(ready("10.0.0.0:80")), ready("10.0.0.1:80")],
            )
        },
        Case {
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..case(
                "Cluster traffic policy, all endpoints are terminating",
                vec![terminating("10.0.0.0:80", true), terminating("10.0.0.1:80", false)],
            )
        },
        Case {
            policy: policy(true, false, true),
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&["10.0.0.0:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..case("iTP: Local, eTP: Cluster, some endpoints local", one_local())
        },
        Case {
            policy: policy(false, true, true),
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&["10.0.0.0:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..case("iTP: Cluster, eTP: Local, some endpoints local", one_local())
        },
        Case {
            policy: policy(true, true, true),
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&["10.0.0.0:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..case("iTP: Local, eTP: Local, some endpoints local", one_local())
        },
        Case {
            policy: policy(true, true, true),
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&[]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..case(
                "iTP: Local, eTP: Local, all endpoints remote",
                vec![ready("10.0.0.0:80"), ready("10.0.0.1:80")],
            )
        },
        Case {
            policy: policy(true, true, true),
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            local: Some(&[]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            only_remote: true,
            ..case(
                "iTP: Local, eTP: Local, all endpoints remote and terminating",
                vec![terminating("10.0.0.0:80", false), terminating("10.0.0.1:80", false)],
            )
        },
        Case {
            policy: policy(false, true, true),
            cluster: Some(&["10.0.0.0:80"]),
            local: Some(&["10.0.0.2:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
            ..case(
                "iTP: Cluster, eTP: Local, with terminating endpoints",
                vec![
                    ready("10.0.0.0:80"),
                    local(unready(ready("10.0.0.1:80"))),
                    terminating("10.0.0.2:80", true),
                    terminating("10.0.0.3:80", false),
                ],
            )
        },
        Case {
            policy: policy(false, true, false),
            cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            all: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
            ..case(
                "externalTrafficPolicy ignored if not externally accessible",
                vec![ready("10.0.0.0:80"), local(ready("10.0.0.1:80"))],
            )
        },
        Case {
            policy: policy(true, false, false),
            local: Some(&["10.0.0.1:80"]),
            all: Some(&["10.0.0.1:80"]),
            ..case(
                "no cluster endpoints for iTP:Local internal-only service",
                vec![ready("10.0.0.0:80"), local(ready("10.0.0.1:80"))],
            )
        },
        case("empty endpoints when no service endpoints exist", vec![]),
        Case {
            zone: "zone-a",
            cluster: Some(&[]),
            ..case(
                "single endpoint not ready, not serving, not terminating",
                vec![unready(ready("10.0.0.0:80"))],
            )
        },
    ]
}


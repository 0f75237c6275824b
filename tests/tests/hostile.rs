//! Issue 19, "broken and hostile input never hurts": a corpus of hostile manifest
//! files, generated at a fixed seed, beside one good Service, read by
//! `sliceway-agent trace --manifests`, `sliceway-controller plan --manifests`, a
//! running agent (`run --no-pin` in a namespace of its own, attached to nothing) and
//! a running controller (`run --manifests`, in a namespace of its own).
//!
//! For every case: no panic and no failed exit; the cost of reading its file,
//! counted by the manifest reader (bytes read and handed to the parser, the largest
//! document held, nesting, aliases, parsed nodes), within the reader's limits; the
//! good Service still compiled, planned and written exactly as without the case; the
//! case's object either used or named by a message (its file or its object) in
//! `trace`'s and `plan`'s `skipped` and in the agent's and the controller's logs; no
//! file people wrote rewritten or deleted. Needs root (the agent loads its programs;
//! namespaces).

use std::{
    collections::BTreeSet,
    ffi::OsString,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use conventions::manifests::{self, MAX_ALIASES, MAX_DOCUMENTS, MAX_DOCUMENT_BYTES, MAX_NESTING};
use serde_json::Value;
use sliceway_agent::{compiler, source::local::ManifestDir};
use sliceway_lab::{fuzz::Rng, netns, workspace_binary, Agent, Netns, NS_PREFIX};

const SEED: u64 = 19;
const CASES: usize = 60;

/// The good objects every case sits beside: a Service with one port, its slice,
/// the Pod behind it and that Pod's Node.
const GOOD: &str = "apiVersion: v1
kind: Service
metadata: {name: web, namespace: default, creationTimestamp: \"2024-01-01T00:00:00Z\"}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  selector: {app: web}
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: default
  labels: {kubernetes.io/service-name: web, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true}
  nodeName: node-1
---
apiVersion: v1
kind: Node
metadata: {name: node-1}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: default, labels: {app: web}}
spec:
  nodeName: node-1
  containers: [{name: c, image: x}]
status:
  phase: Running
  podIP: 10.244.1.5
  podIPs: [{ip: 10.244.1.5}]
  conditions: [{type: Ready, status: \"True\"}]
";

/// What a case's object must come to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Compiled to a frontend (the hostile part is elsewhere in its file).
    Used,
    /// Named by a message, whether or not (part of) it is used.
    Named,
    /// Used, or named by a message (random damage may or may not break it).
    Either,
}

struct Case {
    file: String,
    bytes: Vec<u8>,
    /// The case's own objects are named `bad-NN...`.
    tag: String,
    /// Names of Services that [`Expect::Used`] asks to find compiled or planned.
    used: Vec<String>,
    /// What the agent (`trace`) and the controller (`plan`) must make of it: the
    /// controller reads no frontends and no slices it does not manage.
    agent: Expect,
    controller: Expect,
    what: &'static str,
}

/// A valid Service named `name` on ClusterIP 10.96.1.`n`, with `ports` (a YAML
/// flow sequence) and more `spec` fields.
fn service(name: &str, n: usize, ports: &str, more: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: 10.96.{}.{}\n  selector: {{app: {name}}}\n  ports: {ports}\n{more}",
        1 + n / 250,
        1 + n % 250
    )
}

fn slice(name: &str, service: &str, address_type: &str, address: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {address_type}\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n- addresses: [\"{address}\"]\n  conditions: {{ready: true}}\n"
    )
}

const PORT: &str = "[{name: http, port: 80, protocol: TCP, targetPort: 8080}]";

/// Kinds of hostile files, taken in turn.
const KINDS: usize = 20;

/// The `n`th case of the corpus: kinds in turn, their details from `rng`.
fn case(n: usize, rng: &mut Rng) -> Case {
    let tag = format!("bad-{n:02}");
    let good_first = service(&tag, n, PORT, "");
    let both = |e| (e, e);
    let (what, (agent, controller), text): (&'static str, (Expect, Expect), Vec<u8>) = match n
        % KINDS
    {
        0 => {
            let depth = MAX_NESTING + 1 + rng.below(100_000) as usize;
            let doc = format!("a: {}1{}\n", "{a: ".repeat(depth), "}".repeat(depth));
            (
                "deep flow nesting",
                both(Expect::Used),
                format!("{good_first}---\n{doc}").into(),
            )
        }
        1 => {
            let depth = MAX_NESTING + 1 + rng.below(100_000) as usize;
            let doc = format!("a:\n{}1\n", "- ".repeat(depth));
            (
                "deep block sequences",
                both(Expect::Used),
                format!("{good_first}---\n{doc}").into(),
            )
        }
        2 => {
            let size = MAX_DOCUMENT_BYTES + 1 + rng.below(1 << 20) as usize;
            let doc = format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: huge}}\ndata: {{x: \"{}\"}}\n",
                "x".repeat(size)
            );
            (
                "a document too large",
                both(Expect::Used),
                format!("{good_first}---\n{doc}").into(),
            )
        }
        3 => {
            // One byte that is not UTF-8 in a comment of the second document.
            let mut bytes = format!("{good_first}---\n# caf").into_bytes();
            bytes.push(0x80 + rng.below(0x80) as u8);
            bytes.extend_from_slice(b"\n");
            bytes.extend_from_slice(service(&format!("{tag}-lost"), n, PORT, "").as_bytes());
            ("a byte that is not UTF-8", both(Expect::Used), bytes)
        }
        4 => {
            let bytes = [b"\xef\xbb\xbf".as_slice(), good_first.as_bytes()].concat();
            ("a byte-order mark", both(Expect::Used), bytes)
        }
        5 => {
            let mut doc = String::from(
                "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
            );
            for (prev, next) in ["a", "b", "c", "d", "e", "f", "g", "h"]
                .iter()
                .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
            {
                let _ = writeln!(
                    doc,
                    "{next}: &{next} [{}]",
                    vec![format!("*{prev}"); 9].join(",")
                );
            }
            (
                "aliases that expand a billion times",
                both(Expect::Named),
                format!("{good_first}---\n{doc}").into(),
            )
        }
        6 => {
            let cut = good_first.len() / 2 + rng.below(good_first.len() as u64 / 2) as usize;
            let broken = format!("{}\n  bad: [indent\n", &good_first[..cut]);
            (
                "YAML that does not parse",
                both(Expect::Named),
                broken.into(),
            )
        }
        7 => {
            let port = *rng.pick(&["0", "65536", "-1", "99999", "\"x\""]);
            let ports = if rng.chance(30) {
                "[{name: http, protocol: TCP}]".to_string()
            } else {
                format!("[{{name: http, port: {port}, protocol: TCP}}]")
            };
            (
                "a bad or missing port",
                both(Expect::Named),
                service(&tag, n, &ports, "").into(),
            )
        }
        8 => {
            let ip = *rng.pick(&[
                "127.0.0.1",
                "0.0.0.0",
                "169.254.169.254",
                "224.0.0.1",
                "255.255.255.255",
                "010.96.7.1",
                "10.96.7",
                "10.96.7.1.5",
            ]);
            let text = service(&tag, n, PORT, "").replacen(
                &format!("clusterIP: 10.96.{}.{}", 1 + n / 250, 1 + n % 250),
                &format!("clusterIP: \"{ip}\""),
                1,
            );
            (
                "a ClusterIP the API server refuses",
                (Expect::Named, Expect::Either),
                text.into(),
            )
        }
        9 => {
            let ip = *rng.pick(&[
                "127.0.0.1",
                "0.0.0.0",
                "169.254.169.254",
                "224.0.0.5",
                "255.255.255.255",
                // Read as decimal by kube-proxy where an older API server stored it;
                // refused in a new object since Kubernetes 1.36.
                "010.244.1.9",
            ]);
            let text = format!(
                "{good_first}---\n{}",
                slice(&format!("{tag}-x"), &tag, "IPv4", ip)
            );
            (
                "an endpoint address the API server refuses",
                (Expect::Named, Expect::Used),
                text.into(),
            )
        }
        10 => {
            let name = match rng.below(4) {
                0 => format!("{tag}/../../etc"),
                1 => format!("{tag}-{}", "a".repeat(300)),
                2 => tag.to_uppercase(),
                _ => format!("\"{tag} x\""),
            };
            let text = service(&name, n, PORT, "");
            (
                "a name the API server refuses",
                both(Expect::Named),
                text.into(),
            )
        }
        11 => {
            let text = match rng.below(3) {
                0 => good_first.replacen("apiVersion: v1", "apiVersion: v2", 1),
                1 => good_first.replacen("kind: Service\n", "", 1),
                _ => slice(&tag, &tag, "IPv4", "10.244.1.9").replacen(
                    "discovery.k8s.io/v1",
                    "discovery.k8s.io/v1beta1",
                    1,
                ),
            };
            (
                "a wrong apiVersion or no kind",
                both(Expect::Named),
                text.into(),
            )
        }
        12 => {
            let bad_item = *rng.pick(&[
                "{apiVersion: v1, kind: Service, metadata: {name: x}, spec: {ports: [{port: \"x\"}]}}",
                "{apiVersion: v1, kind: Service, metadata: {name: Bad/Name}}",
                "{kind: Service}",
                "17",
            ]);
            let item = |name: &str, m: usize| {
                format!(
                    "- {{apiVersion: v1, kind: Service, metadata: {{name: {name}}}, spec: {{clusterIP: 10.96.{}.{}, selector: {{app: {name}}}, ports: [{{name: http, port: 80, protocol: TCP}}]}}}}\n",
                    1 + m / 250,
                    1 + m % 250
                )
            };
            let text = format!(
                "apiVersion: v1\nkind: List\nitems:\n{}- {bad_item}\n{}",
                item(&tag, n),
                item(&format!("{tag}-after"), n + 100)
            );
            ("a bad item of a List", both(Expect::Used), text.into())
        }
        13 => {
            // Claims the good Service's frontend; sorts before it and is newer.
            let name = format!("a-{tag}");
            let text = match rng.below(2) {
                0 => service(&name, n, PORT, "  externalIPs: [10.96.0.10]\n"),
                _ => service(
                    &name,
                    n,
                    PORT,
                    "  type: LoadBalancer\nstatus: {loadBalancer: {ingress: [{ip: 10.96.0.10}]}}\n",
                ),
            };
            (
                "another Service's frontend claimed",
                (Expect::Named, Expect::Used),
                text.into(),
            )
        }
        14 => {
            let len = 1 + rng.below(4096) as usize;
            let bytes = (0..len).map(|_| rng.next_u64() as u8).collect();
            ("random bytes", both(Expect::Either), bytes)
        }
        15 => {
            let mut bytes = good_first.clone().into_bytes();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = *rng.pick(b"{}[]:-&*!|>'\"#%@` \n\t\x00\xff");
            }
            (
                "a few bytes of a Service damaged",
                both(Expect::Either),
                bytes,
            )
        }
        16 => {
            let docs = MAX_DOCUMENTS + 1 + rng.below(1000) as usize;
            let text = format!("{good_first}{}", "---\n".repeat(docs));
            ("too many documents", both(Expect::Used), text.into())
        }
        17 => {
            // The same Service twice, and a slice of it twice.
            let slice = slice(&format!("{tag}-x"), &tag, "IPv4", "10.244.1.9");
            let text = format!("{good_first}---\n{slice}---\n{good_first}---\n{slice}");
            (
                "the same objects defined twice",
                both(Expect::Named),
                text.into(),
            )
        }
        19 => {
            // More aliases than a document may have, each of a small anchor.
            let aliases = MAX_ALIASES + 1 + rng.below(1000) as usize;
            let doc = format!("a: &a x\nb: [{}]\n", vec!["*a"; aliases].join(","));
            (
                "more aliases than a document may have",
                both(Expect::Used),
                format!("{good_first}---\n{doc}").into(),
            )
        }
        _ => {
            let text = match rng.below(3) {
                0 => format!(
                    "{good_first}---\n{}",
                    slice(&format!("{tag}-x"), &tag, "FQDN", "example.com")
                ),
                1 => format!(
                    "{good_first}---\n{}",
                    slice(&format!("{tag}-x"), &tag, "IPv4", "10.244.1.9").replacen(
                        "labels: {kubernetes.io/service-name: bad",
                        "labels: {app: bad",
                        1
                    )
                ),
                _ => service(&tag, n, "[{name: http, port: 80, protocol: ICMP}]", ""),
            };
            (
                "a slice or port of a kind not handled",
                both(Expect::Either),
                text.into(),
            )
        }
    };
    // The objects that must be used: a List's good items too.
    let used = match n % KINDS {
        12 => vec![tag.clone(), format!("{tag}-after")],
        13 => vec![format!("a-{tag}")],
        _ => vec![tag.clone()],
    };
    Case {
        file: format!("case-{n:02}.yaml"),
        bytes: text,
        tag,
        used,
        agent,
        controller,
        what,
    }
}

fn corpus() -> Vec<Case> {
    let mut rng = Rng::new(SEED);
    (0..CASES).map(|n| case(n, &mut rng)).collect()
}

/// Reads a case's file as both binaries do (streamed, a document at a time) and
/// checks what it cost, counted.
fn check_cost(case: &Case, path: &Path) -> Vec<manifests::Problem> {
    let what = format!("{} ({})", case.file, case.what);
    let read = match manifests::read_file(path, &mut |_| Ok(())) {
        Ok(read) => read,
        // Broken YAML: the file is refused whole at the first broken document.
        Err(p) => return vec![p],
    };
    let cost = read.cost;
    assert!(cost.bytes <= case.bytes.len(), "{what}: {cost:?}");
    assert!(cost.parsed_bytes <= cost.bytes, "{what}: {cost:?}");
    assert!(cost.documents <= MAX_DOCUMENTS, "{what}: {cost:?}");
    // Held at once: one document, within the limit.
    assert!(cost.largest <= MAX_DOCUMENT_BYTES, "{what}: {cost:?}");
    assert!(cost.deepest <= MAX_NESTING, "{what}: {cost:?}");
    assert!(cost.aliases <= MAX_ALIASES, "{what}: {cost:?}");
    // Parsing is at worst linear in what it is handed times the nesting it may meet.
    let budget = (MAX_NESTING + 1) * cost.bytes.max(1);
    assert!(
        cost.parsed_bytes * (cost.deepest + 1) <= budget,
        "{what}: {cost:?}"
    );
    // What parsing held: a small multiple of a document, aliases expanded.
    assert!(
        cost.most_nodes <= manifests::max_nodes(cost.largest),
        "{what}: {cost:?}"
    );
    assert!(
        read.nodes <= 2 * cost.parsed_bytes + 1024 * cost.documents,
        "{what}: {} nodes from {cost:?}",
        read.nodes
    );
    read.problems
}

fn run(bin: &str, args: &[&str]) -> (Value, String) {
    let out = Command::new(workspace_binary(bin).unwrap())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "{bin} {args:?} panicked: {stderr}"
    );
    assert!(out.status.success(), "{bin} {args:?}: {stderr}");
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{bin} {args:?}: {e}: {stderr}"));
    (json, stderr)
}

/// The messages of a `skipped` list, one string each (file, object, field, reason).
fn skipped_text(v: &Value) -> Vec<String> {
    v["skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no skipped list: {v}"))
        .iter()
        .map(|s| {
            for key in ["object", "code", "reason"] {
                assert!(s[key].is_string(), "{key} missing in {s}");
            }
            s.to_string()
        })
        .collect()
}

fn named(messages: &[String], case: &Case) -> bool {
    messages
        .iter()
        .any(|m| m.contains(&case.file) || m.contains(&case.tag))
}

fn write_all(dir: &Path, cases: &[Case]) {
    std::fs::write(dir.join("good.yaml"), GOOD).unwrap();
    for case in cases {
        std::fs::write(dir.join(&case.file), &case.bytes).unwrap();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sliceway-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn hostile_manifests_never_hurt() {
    let cases = corpus();
    let dir = temp_dir("corpus");
    write_all(&dir, &cases);

    // Counted cost of every file, read as both binaries read it.
    for case in &cases {
        check_cost(case, &dir.join(&case.file));
    }

    // What the agent's compiler makes of the whole directory, as `trace` and `run`
    // fill it: which case objects are used.
    let mut compiled = compiler::Incremental::new(compiler::Options {
        node_name: Some("node-1".into()),
        proxy_name: None,
        zone: None,
        ..compiler::Options::default()
    });
    let mut source = ManifestDir::new(&dir, Some("node-1".into()));
    source.rescan(&mut compiled).unwrap();
    compiled.compile();
    let used: BTreeSet<String> = compiled
        .frontends()
        .values()
        .map(|f| f.service.name.to_string())
        .collect();

    // trace: the good Service exactly as alone, every case used or named.
    let dir_arg = dir.to_str().unwrap();
    let (trace, _) = run(
        "sliceway-agent",
        &[
            "trace",
            "--manifests",
            dir_arg,
            "--node",
            "node-1",
            "--src",
            "10.244.1.2:40000",
            "--dst",
            "10.96.0.10:80",
            "-o",
            "json",
        ],
    );
    assert_eq!(
        (&trace["verdict"], &trace["service"], &trace["candidates"]),
        (
            &Value::from("dnat"),
            &Value::from("default/web:http"),
            &serde_json::json!(["10.244.1.5:8080"])
        ),
        "{trace}"
    );
    let trace_messages = skipped_text(&trace);
    // An object defined twice is settled, not a clash: its last definition is used.
    for case in cases
        .iter()
        .filter(|c| c.what == "the same objects defined twice")
    {
        let clashes: Vec<&String> = trace_messages
            .iter()
            .filter(|m| m.contains(&case.tag) && m.contains("frontend of"))
            .collect();
        assert!(clashes.is_empty(), "{}: {clashes:?}", case.file);
        assert!(used.contains(&case.tag), "{}: not compiled", case.file);
    }

    // plan: the good Service's slice planned as alone, every case planned or named.
    let (plan, _) = run(
        "sliceway-controller",
        &["plan", "--manifests", dir_arg, "-o", "json"],
    );
    let plan_messages = skipped_text(&plan);
    let planned: BTreeSet<String> = plan["create"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"] == "EndpointSlice")
        .filter_map(|o| o["metadata"]["labels"]["kubernetes.io/service-name"].as_str())
        .map(String::from)
        .collect();
    let web_slices: Vec<&Value> = plan["create"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["metadata"]["labels"]["kubernetes.io/service-name"] == "web")
        .collect();
    assert_eq!(web_slices.len(), 1, "{plan}");
    assert_eq!(
        web_slices[0]["endpoints"][0]["addresses"],
        serde_json::json!(["10.244.1.5"]),
        "{plan}"
    );

    let mut failures = Vec::new();
    for case in &cases {
        let meets = |expect, kept: &BTreeSet<String>, messages: &[String]| {
            let any = kept.iter().any(|s| s.contains(&case.tag));
            let all = case.used.iter().all(|name| kept.contains(name));
            match expect {
                Expect::Used => all,
                Expect::Named => named(messages, case),
                Expect::Either => any || named(messages, case),
            }
        };
        let agent_ok = meets(case.agent, &used, &trace_messages);
        let controller_ok = meets(case.controller, &planned, &plan_messages);
        if !(agent_ok && controller_ok) {
            failures.push(format!(
                "{} ({}): agent {:?} {}, controller {:?} {}",
                case.file,
                case.what,
                case.agent,
                if agent_ok { "met" } else { "MISSED" },
                case.controller,
                if controller_ok { "met" } else { "MISSED" },
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {CASES} cases:\n{}\ntrace skipped:\n{}\nplan skipped:\n{}",
        failures.len(),
        failures.join("\n"),
        trace_messages.join("\n"),
        plan_messages.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The files process `pid` holds open, by the paths they were opened under.
fn open_files(pid: u32) -> Vec<PathBuf> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .collect()
}

/// The running agent follows a directory while the cases arrive one by one: it
/// never stops, syncs after each, logs every problem the reader finds, and ends
/// with the good Service alone once they are gone.
#[test]
fn a_running_agent_survives_the_corpus() {
    netns::remove_stale(NS_PREFIX);
    let ns = Netns::create(&format!("{NS_PREFIX}-{}-hostile", std::process::id())).unwrap();
    let dir = temp_dir("agent");
    std::fs::write(dir.join("good.yaml"), GOOD).unwrap();
    let bpffs = dir.join("unused-bpffs");
    let mut agent = Agent::start_with_args(
        &ns.name,
        &[OsString::from("--manifests"), dir.clone().into()],
        &["nomatch*".to_string()],
        &bpffs,
        &["--no-pin".to_string()],
    )
    .unwrap();
    agent.wait_for_sync(1, Duration::from_secs(30)).unwrap();
    let mut codes = BTreeSet::new();
    for case in corpus() {
        let path = dir.join(&case.file);
        agent
            .applies(|| Ok(std::fs::write(&path, &case.bytes)?))
            .unwrap_or_else(|e| panic!("{} ({}): {e}", case.file, case.what));
        assert!(
            agent.exit_status().is_none(),
            "{}: the agent exited",
            case.file
        );
        for p in check_cost(&case, &path) {
            codes.insert(p.code);
            // The reader's reason, without the part added when an older version is kept.
            assert!(
                agent.logs_within(&p.reason, Duration::from_secs(10)),
                "{} ({}): not in the agent's log: {}",
                case.file,
                case.what,
                p.reason
            );
        }
    }
    // Healthy, and every reason the reader gave counted in /metrics.
    let health = agent.http("/healthz").unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = agent.metrics().unwrap();
    for code in codes {
        assert!(
            metrics.contains(&format!(
                "sliceway_objects_skipped{{kind=\"manifest\",reason=\"{code}\"}}"
            )),
            "{code} not counted: {metrics}"
        );
    }
    // 50 MB of documents just under the size limit, all parsed: read off the agent's
    // loop, so /healthz answers (healthy) while it is read. The file arrives whole, by
    // a rename from a name the agent does not read. The read is seen in progress while
    // the agent holds the file open (its reader streams the file): a /healthz answer
    // that begins and ends inside that window was given during the read, and a loop
    // blocked by the read could not give it.
    let doc = |i: usize| {
        format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\ndata: {{x: \"{}\"}}\n",
            "x".repeat(MAX_DOCUMENT_BYTES - 100)
        )
    };
    let big = dir.join("big.yaml");
    let staged = dir.join("big.yaml.part");
    std::fs::write(&staged, (0..12).map(doc).collect::<String>()).unwrap();
    std::fs::rename(&staged, &big).unwrap();
    let big_real = std::fs::canonicalize(&big).unwrap();
    let holds_big = || open_files(agent.pid()).contains(&big_real);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !holds_big() {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not open {} within 60 s",
            big.display()
        );
        std::thread::yield_now();
    }
    let health = agent.http("/healthz").unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(
        holds_big(),
        "the read of 50 MB ended before one /healthz request did: nothing was shown"
    );
    // All gone: the good Service alone, one frontend and one backend.
    let mut cases: Vec<PathBuf> = corpus().iter().map(|c| dir.join(&c.file)).collect();
    cases.push(big);
    agent
        .applies(|| {
            for path in &cases {
                std::fs::remove_file(path)?;
            }
            Ok(())
        })
        .unwrap();
    // The directory's poll may see the removals over more than one sync, and the
    // lab reads the agent's output on a thread of its own.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = agent.log();
        let last = log.iter().rev().find(|l| l.contains("synced")).unwrap();
        if last.contains("frontends=1 ") && last.contains("backends=1 ") {
            break log;
        }
        assert!(std::time::Instant::now() < deadline, "{last}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        !log.iter().any(|l| l.contains("panicked")),
        "{}",
        log.join("\n")
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The controller's local mode (`sliceway-controller run --manifests`, in a network
/// namespace of its own) over the whole corpus: it keeps running, writes the good
/// Service's slice and Endpoints correctly, names every problem the reader finds in
/// its log, and never rewrites or deletes a file it did not write.
#[test]
fn the_controllers_run_survives_the_corpus() {
    netns::remove_stale(NS_PREFIX);
    let ns = Netns::create(&format!("{NS_PREFIX}-{}-hostilectl", std::process::id())).unwrap();
    let cases = corpus();
    let dir = temp_dir("controller");
    write_all(&dir, &cases);
    let before: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    // Every problem the reader finds, and the cases the controller must name.
    let mut expected: Vec<String> = Vec::new();
    for case in &cases {
        expected.extend(
            check_cost(case, &dir.join(&case.file))
                .into_iter()
                .map(|p| p.reason),
        );
    }
    // The corpus has problems of every kind the reader names.
    assert!(expected.len() >= KINDS, "{expected:?}");
    let log_path = std::env::temp_dir().join(format!(
        "sliceway-hostile-{}-controller.log",
        std::process::id()
    ));
    let log = std::fs::File::create(&log_path).unwrap();
    /// The controller, killed when the test ends, whichever way.
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut running = Running(
        Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", ns.name))
            .arg(workspace_binary("sliceway-controller").unwrap())
            .args(["run", "--manifests"])
            .arg(&dir)
            .env("NO_COLOR", "1")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let child = &mut running.0;
    // The good Service's slice and Endpoints, as files the controller owns.
    let owned = |prefix: &str| -> Vec<String> {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    };
    let web_slice = |texts: &[String]| {
        texts.iter().any(|t| {
            t.contains("kubernetes.io/service-name: web\n") && t.contains("- 10.244.1.5\n")
        })
    };
    let mut missing = Vec::new();
    for _ in 0..600 {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        missing = expected
            .iter()
            .filter(|r| !text.contains(r.as_str()))
            .cloned()
            .collect();
        missing.extend(
            cases
                .iter()
                .filter(|c| c.controller == Expect::Named)
                .filter(|c| !text.contains(&c.file) && !text.contains(&c.tag))
                .map(|c| format!("{} ({}) not named", c.file, c.what)),
        );
        let written = web_slice(&owned("endpointslice-default-web-"))
            && owned("endpoints-default-web.yaml")
                .iter()
                .any(|t| t.contains("ip: 10.244.1.5"));
        if !written {
            missing.push("the web Service's slice and Endpoints".into());
        }
        if missing.is_empty() || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.try_wait().unwrap();
    drop(running);
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        status.is_none(),
        "the controller exited ({status:?}): {text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    assert!(missing.is_empty(), "missing: {missing:#?}\nlog:\n{text}");
    // Files people wrote: all there, byte for byte.
    for (path, bytes) in &before {
        let now = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(now == *bytes, "{} was rewritten", path.display());
    }
    // What the controller wrote is its own: every new file begins with its header.
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        if before.iter().all(|(p, _)| *p != path) {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.starts_with(controller::local::HEADER),
                "{}: {text}",
                path.display()
            );
        }
    }
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&log_path);
}

//! Proves the baselines' rules are kube-proxy's own: the generator of `kubeproxy.rs` writes,
//! for the same Services and endpoints, the tables upstream's kube-proxy (the binary of
//! the upstream kit, in the cluster lab) writes, line for line as the kernel hands them
//! back, after its full sync and after the sync of a changed endpoint.
//!
//! A cluster lab of one node without workloads (etcd, kube-apiserver and the node's
//! kubelet stand-in; no pods: the endpoints are made-up addresses that get no
//! traffic, and this test sends none) holds selector-less Services with
//! EndpointSlices of the test's own. kube-proxy runs in node-1's namespace; the
//! generator's rules are loaded into fresh namespaces of the test's own with the
//! tools kube-proxy itself runs (`iptables-restore --noflush --counters`, `nft -f`;
//! kube-proxy's nfacct counters created there first, as kube-proxy creates them in
//! its own), and both sides are read back with `iptables-save` / `nft list` and
//! compared once kube-proxy's side reads the same twice in a row.
//! In each phase: kube-proxy's first full sync against the generator's full rules,
//! then one endpoint of one Service replaced in the API, kube-proxy's sync of it
//! against the generator's partial restore (or transaction) loaded on top of its
//! full rules.
//!
//! - iptables, 2 Services of 3 endpoints: first, each Service's KUBE-SVC chain, its
//!   KUBE-SEP chains and its KUBE-SERVICES rules, endpoint comments and all (readable
//!   differences per Service); then the whole `iptables-save` of the mangle, filter and
//!   nat tables: the chains declared (in order, without their counters) and every
//!   chain's rules, line for line;
//! - iptables, a third Service of 1,000 endpoints (more than 1,000 in all: kube-proxy's
//!   large cluster mode), kube-proxy restarted so that it writes everything in one
//!   full sync: the same for all three, now without the endpoint rules' comments
//!   (checked on the real side, so the comparison cannot pass by ignoring the mode),
//!   and after the change the stale endpoint chain left on both sides;
//! - nftables, the same three Services: each Service's chains and its `service-ips`
//!   elements, then the whole `nft list table ip kube-proxy`: the table's own lines,
//!   the order of its sets, maps and chains (but the Services' chains, which kube-proxy
//!   writes in the order of a Go map), every chain line for line (base chains' hooks
//!   and priorities too), every set's and map's declaration line for line and its
//!   elements as a set.
//!
//! Left out of the comparison, as the generator cannot know them: the `kubernetes`
//! Service of the API server (its chains, its KUBE-SERVICES rule, its elements: read
//! from the API, removed by their exact names), counters (`[packets:bytes]`), the
//! comment and header lines of `iptables-save`, and the elements of `nodeport-ips`,
//! which are the node's own addresses (checked to be among those of the node's
//! interfaces). The Service rules of KUBE-SERVICES are compared as a set in their
//! places: kube-proxy writes them in the order of a Go map, random from run to run.
//!
//! Cost: about 11 s (a lab without workloads starts in about 4 s; kube-proxy is
//! started three times and writes these rules in under a second each); needs root,
//! like every cluster-lab test, and the lab's binaries built (`cargo build --bins`).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::{
    core::v1::{Namespace, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    api::{ListParams, Patch, PatchParams, PostParams},
    Api,
};
use serde_json::json;
use sliceway_bench::{
    kubeproxy::{
        ensure_nfacct_counters, iptables_full_with, iptables_partial_with, large_cluster,
        nft_endpoint_chain, nft_full, nft_partial, nft_service_chain, sep_chain, svc_chain,
        LARGE_CLUSTER_ENDPOINTS,
    },
    model::Svc,
};
use sliceway_lab::{
    cluster::{self, Cluster, Controllers, Proxy, Spec},
    netns::{self, Netns},
};

/// The namespace of the test's objects.
const NS: &str = "kprules";
/// Its `endpointslice.kubernetes.io/managed-by`: neither controller's.
const MANAGED_BY: &str = "kube-proxy-rules.test.sliceway.io";
/// The Services' port and their endpoints' (`targetPort`).
const PORT: u16 = 80;
const TARGET_PORT: u16 = 8080;
/// The large Service's endpoints, in slices of this many (a slice holds at most 1,000).
const LARGE: usize = 1000;
const PER_SLICE: usize = 500;
/// How long kube-proxy may take to write the rules once it is healthy.
const PROGRAMMED: Duration = Duration::from_secs(60);
/// Differences shown per compared item, and items shown in all.
const SHOW_LINES: usize = 6;
const SHOW_ITEMS: usize = 12;
/// The iptables tables kube-proxy writes to (the canary alone in mangle).
const IPT_TABLES: [&str; 3] = ["mangle", "filter", "nat"];

fn say(msg: &str) {
    eprintln!("kube-proxy rules: {msg}");
}

/// Runs `program` in the network namespace `ns` with `input` on its standard input.
fn run_in(ns: &str, program: &str, args: &[&str], input: &str) -> Result<String> {
    sliceway_lab::output_with_input(
        Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{ns}"))
            .arg(program)
            .args(args),
        input,
        &format!("{program} {} in {ns}", args.join(" ")),
    )
}

/// Polls `check` every 300 ms until it gives a value, the same in two reads in a row:
/// kube-proxy has written what `check` looks for and, as the tables are read one at a
/// time, nothing was read in the middle of a sync (its jumps from the built-in chains
/// and the filter table come before the nat table's Services, its canary chains from
/// a thread of their own). `what` and kube-proxy's log when it has not within
/// [`PROGRAMMED`]. A check that fails (a table read while kube-proxy writes it) is
/// tried again.
fn wait_for<T: PartialEq>(
    cluster: &Cluster,
    what: &str,
    mut check: impl FnMut() -> Result<std::result::Result<T, String>>,
) -> Result<T> {
    let deadline = Instant::now() + PROGRAMMED;
    let mut last = None;
    loop {
        let missing = match check() {
            Ok(Ok(v)) if last.as_ref() == Some(&v) => return Ok(v),
            Ok(Ok(v)) => {
                last = Some(v);
                "still changing".to_string()
            }
            Ok(Err(missing)) => missing,
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!(
                "kube-proxy did not write {what} within {PROGRAMMED:?}: {missing}\n{}",
                cluster.log_tail("proxy-node-1")
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

// --------------------------------------------------------------------- the API

/// The endpoints of the test's Services, in the order the test creates them (not
/// kube-proxy's: it orders each Service port's endpoints by their `ip:port` string,
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointslicecache.go>,
/// `endpointsMapFromEndpointInfo`, `byEndpoint`; the generator must do the same).
/// The small Services' three sort `.10`, `.11`, `.9`; the large one's 1,000 are
/// 10.244.110.1 to 10.244.113.250.
fn small_endpoints(i: usize) -> Vec<(Ipv4Addr, u16)> {
    (9..12)
        .map(|d| (Ipv4Addr::new(10, 244, 100 + i as u8, d), TARGET_PORT))
        .collect()
}

fn large_endpoints() -> Vec<(Ipv4Addr, u16)> {
    (0..LARGE)
        .map(|k| {
            (
                Ipv4Addr::new(10, 244, 110 + (k / 250) as u8, (k % 250 + 1) as u8),
                TARGET_PORT,
            )
        })
        .collect()
}

/// The endpoints of slice `n` of a Service, as the API takes them.
fn slice_endpoints(endpoints: &[(Ipv4Addr, u16)], n: usize) -> serde_json::Value {
    endpoints
        .chunks(PER_SLICE)
        .nth(n)
        .unwrap_or_default()
        .iter()
        .map(|(ip, _)| {
            json!({
                "addresses": [ip.to_string()],
                "conditions": {"ready": true},
            })
        })
        .collect()
}

/// Creates selector-less Service `name` (port `http` 80 to 8080, ClusterIP from the
/// API server) and its slices, [`PER_SLICE`] endpoints each, all ready; the Service as
/// the generator takes it.
async fn create(client: &kube::Client, name: &str, endpoints: Vec<(Ipv4Addr, u16)>) -> Result<Svc> {
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": PORT, "targetPort": TARGET_PORT, "protocol": "TCP"}]},
    }))?;
    let svc = services
        .create(&PostParams::default(), &svc)
        .await
        .with_context(|| format!("creating Service {name}"))?;
    let vip: Ipv4Addr = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .with_context(|| format!("Service {name} has no ClusterIP"))?
        .parse()
        .with_context(|| format!("Service {name}'s ClusterIP"))?;
    for n in 0..endpoints.len().div_ceil(PER_SLICE) {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {
                "name": format!("{name}-{n}"),
                "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
            "endpoints": slice_endpoints(&endpoints, n),
        }))?;
        slices
            .create(&PostParams::default(), &slice)
            .await
            .with_context(|| format!("creating EndpointSlice {name}-{n}"))?;
    }
    Ok(Svc {
        namespace: NS.into(),
        name: name.into(),
        port_name: "http".into(),
        vip,
        port: PORT,
        endpoints,
    })
}

/// Replaces the first endpoint of `s` by `new` in its slice; the Service after.
async fn replace_first_endpoint(client: &kube::Client, s: &Svc, new: Ipv4Addr) -> Result<Svc> {
    let mut after = s.clone();
    after.endpoints[0].0 = new;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let name = format!("{}-0", s.name);
    slices
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": slice_endpoints(&after.endpoints, 0)})),
        )
        .await
        .with_context(|| format!("updating EndpointSlice {name}"))?;
    Ok(after)
}

/// The API server's own `default/kubernetes` Service as kube-proxy sees it, to be
/// left out of the comparison.
async fn kubernetes_service(client: &kube::Client) -> Result<Svc> {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .get("kubernetes")
        .await
        .context("the kubernetes Service")?;
    let spec = svc.spec.context("the kubernetes Service's spec")?;
    let vip: Ipv4Addr = spec
        .cluster_ip
        .context("the kubernetes Service's ClusterIP")?
        .parse()?;
    let port = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .next()
        .context("the kubernetes Service's port")?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let mut endpoints = Vec::new();
    let listed = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await?;
    for slice in listed.items.iter().filter(|s| s.address_type == "IPv4") {
        let target = slice
            .ports
            .iter()
            .flatten()
            .find_map(|p| p.port)
            .context("the kubernetes EndpointSlice's port")?;
        for e in &slice.endpoints {
            for a in &e.addresses {
                endpoints.push((a.parse()?, u16::try_from(target)?));
            }
        }
    }
    ensure!(
        !endpoints.is_empty(),
        "the kubernetes Service has no endpoints"
    );
    Ok(Svc {
        namespace: "default".into(),
        name: "kubernetes".into(),
        port_name: port.name.unwrap_or_default(),
        vip,
        port: u16::try_from(port.port)?,
        endpoints,
    })
}

// ------------------------------------------------------------------- comparison

/// `l` shortened to its start and end when long (a 1,000-endpoint rule is one line).
fn clip(l: &str) -> String {
    const HEAD: usize = 240;
    const TAIL: usize = 80;
    let chars: Vec<char> = l.chars().collect();
    if chars.len() <= HEAD + TAIL + 40 {
        return l.to_string();
    }
    let head: String = chars[..HEAD].iter().collect();
    let tail: String = chars[chars.len() - TAIL..].iter().collect();
    format!(
        "{head} [... {} characters ...] {tail}",
        chars.len() - HEAD - TAIL
    )
}

/// What differs between the real and the generated rules, one entry per item.
#[derive(Default)]
struct Diffs(Vec<String>);

impl Diffs {
    /// Compares one item's lines (`None`: the item does not exist on that side).
    fn lines(&mut self, what: &str, real: Option<&[String]>, generated: Option<&[String]>) {
        if real == generated {
            return;
        }
        let (Some(real), Some(generated)) = (real, generated) else {
            let side = if real.is_none() { "real" } else { "generated" };
            let other = real.or(generated).unwrap_or_default();
            let mut s = format!("{what}: absent from the {side} rules; the other side has:");
            for l in other.iter().take(SHOW_LINES) {
                s.push_str(&format!("\n      {}", clip(l)));
            }
            if other.len() > SHOW_LINES {
                s.push_str(&format!("\n      ... {} more", other.len() - SHOW_LINES));
            }
            self.0.push(s);
            return;
        };
        let mut s = format!(
            "{what}: {} line(s) real, {} generated",
            real.len(),
            generated.len()
        );
        let differing = (0..real.len().max(generated.len()))
            .filter(|i| real.get(*i) != generated.get(*i))
            .collect::<Vec<_>>();
        let show = |l: Option<&String>| l.map_or("(none)".to_string(), |l| clip(l));
        for i in differing.iter().take(SHOW_LINES) {
            s.push_str(&format!(
                "\n    line {}\n      real:      {}\n      generated: {}",
                i + 1,
                show(real.get(*i)),
                show(generated.get(*i))
            ));
        }
        if differing.len() > SHOW_LINES {
            s.push_str(&format!(
                "\n    ... {} more differing lines",
                differing.len() - SHOW_LINES
            ));
        }
        // A line more or less shifts all after it: say which.
        if real.len() != generated.len() {
            for (side, a, b) in [("real", real, generated), ("generated", generated, real)] {
                for l in a.iter().filter(|l| !b.contains(l)).take(SHOW_LINES) {
                    s.push_str(&format!("\n    only in the {side} lines: {}", clip(l)));
                }
            }
        }
        self.0.push(s);
    }

    /// Compares two sets.
    fn sets(&mut self, what: &str, real: &BTreeSet<String>, generated: &BTreeSet<String>) {
        if real == generated {
            return;
        }
        let mut s = format!("{what}:");
        let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
            a.difference(b).cloned().collect()
        };
        for (side, items) in [
            ("real only:     ", only(real, generated)),
            ("generated only:", only(generated, real)),
        ] {
            for l in items.iter().take(SHOW_LINES) {
                s.push_str(&format!("\n      {side} {}", clip(l)));
            }
            if items.len() > SHOW_LINES {
                s.push_str(&format!(
                    "\n      {side} ... {} more",
                    items.len() - SHOW_LINES
                ));
            }
        }
        self.0.push(s);
    }

    fn check(self, phase: &str) -> Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        let n = self.0.len();
        let mut s =
            format!("{phase}: the generator's rules differ from kube-proxy's in {n} item(s):\n");
        for d in self.0.iter().take(SHOW_ITEMS) {
            s.push_str(&format!("  {d}\n"));
        }
        if n > SHOW_ITEMS {
            s.push_str(&format!("  ... and {} more item(s)\n", n - SHOW_ITEMS));
        }
        bail!(s)
    }
}

// --------------------------------------------------------------------- iptables

/// One table of `iptables-save`: its chains as declared (`:NAME POLICY`, counters
/// dropped), in order, and each chain's rules (`-A CHAIN ...`), in order; any other
/// line but comments, the `*table` header and `COMMIT` in `other`.
#[derive(Clone, PartialEq)]
struct Ipt {
    declared: Vec<String>,
    chains: BTreeMap<String, Vec<String>>,
    other: Vec<String>,
}

impl Ipt {
    fn read(ns: &str, table: &str) -> Result<Self> {
        let text = netns::nsenter(ns, "iptables-save", &["-t", table])?;
        let mut ipt = Ipt {
            declared: Vec::new(),
            chains: BTreeMap::new(),
            other: Vec::new(),
        };
        for l in text.lines() {
            if l.starts_with('#') || l.starts_with('*') || l == "COMMIT" {
                continue;
            }
            if let Some(decl) = l.strip_prefix(':') {
                // `:NAME POLICY [packets:bytes]`.
                let decl = decl.rsplit_once(" [").map_or(decl, |(d, _)| d);
                ipt.declared.push(decl.to_string());
            } else if let Some(chain) = l.strip_prefix("-A ").and_then(|r| r.split(' ').next()) {
                ipt.chains
                    .entry(chain.to_string())
                    .or_default()
                    .push(l.to_string());
            } else {
                ipt.other.push(l.to_string());
            }
        }
        Ok(ipt)
    }

    fn chain(&self, name: &str) -> Option<&[String]> {
        self.chains.get(name).map(Vec::as_slice)
    }

    /// The KUBE-SERVICES rules that name `vip`.
    fn services_rules(&self, vip: Ipv4Addr) -> Vec<String> {
        let d = format!(" -d {vip}/32 ");
        self.chain("KUBE-SERVICES")
            .unwrap_or_default()
            .iter()
            .filter(|l| l.contains(&d))
            .cloned()
            .collect()
    }

    /// The KUBE-SEP-... chains `rules` jump to, in order.
    fn sep_targets(rules: &[String]) -> Vec<String> {
        rules
            .iter()
            .filter_map(|l| l.split(" -j ").nth(1))
            .filter(|t| t.starts_with("KUBE-SEP-"))
            .map(|t| t.trim().to_string())
            .collect()
    }

    /// What of `s` kube-proxy has not written yet (none: it is all there): its
    /// KUBE-SERVICES rule, the chain that rule jumps to with a jump to each endpoint's
    /// chain, and each endpoint chain's two rules.
    fn missing(&self, s: &Svc) -> Option<String> {
        let rules = self.services_rules(s.vip);
        let Some(target) = rules
            .iter()
            .find_map(|l| l.split(" -j ").nth(1))
            .map(str::trim)
        else {
            return Some(format!("{}: no KUBE-SERVICES rule", s.name));
        };
        let jumps: BTreeSet<String> = Self::sep_targets(self.chain(target).unwrap_or_default())
            .into_iter()
            .collect();
        let expected: BTreeSet<String> = s.endpoints.iter().map(|e| sep_chain(s, e)).collect();
        if jumps != expected {
            return Some(format!(
                "{}: {target} jumps to {} chains, {} of them of its {} endpoints",
                s.name,
                jumps.len(),
                jumps.intersection(&expected).count(),
                s.endpoints.len()
            ));
        }
        let short = jumps
            .iter()
            .filter(|c| self.chain(c).map_or(0, <[String]>::len) < 2)
            .count();
        (short > 0).then(|| format!("{}: {short} endpoint chains not written", s.name))
    }

    /// The table less the `kubernetes` Service `k` (its chains, their declarations,
    /// its KUBE-SERVICES rule), with the Service rules of KUBE-SERVICES sorted in
    /// their places (kube-proxy writes them in the order of a Go map).
    fn without(&self, k: &Svc) -> Self {
        let mut gone: BTreeSet<String> = k.endpoints.iter().map(|e| sep_chain(k, e)).collect();
        gone.insert(svc_chain(k));
        let mut ipt = self.clone();
        ipt.declared
            .retain(|d| !gone.contains(d.split(' ').next().unwrap_or_default()));
        ipt.chains.retain(|c, _| !gone.contains(c));
        if let Some(rules) = ipt.chains.get_mut("KUBE-SERVICES") {
            let d = format!(" -d {}/32 ", k.vip);
            rules.retain(|l| !l.contains(&d));
            let at: Vec<usize> = (0..rules.len())
                .filter(|i| rules[*i].contains(" -j KUBE-SVC-"))
                .collect();
            let mut sorted: Vec<String> = at.iter().map(|i| rules[*i].clone()).collect();
            sorted.sort();
            for (i, l) in at.into_iter().zip(sorted) {
                rules[i] = l;
            }
        }
        ipt
    }
}

/// The three tables of a namespace.
#[derive(PartialEq)]
struct Tables(Vec<(&'static str, Ipt)>);

impl Tables {
    /// Reads nat first: what kube-proxy's restore writes last.
    fn read(ns: &str) -> Result<Self> {
        let mut tables = IPT_TABLES
            .iter()
            .rev()
            .map(|t| Ok((*t, Ipt::read(ns, t)?)))
            .collect::<Result<Vec<_>>>()?;
        tables.reverse();
        Ok(Tables(tables))
    }

    fn nat(&self) -> &Ipt {
        &self.0[2].1
    }
}

/// Compares, for every Service, its KUBE-SERVICES rules, its KUBE-SVC chain and the
/// endpoint chains either side's Service chain jumps to; the chains it compared.
fn compare_services_iptables(
    real: &Ipt,
    generated: &Ipt,
    services: &[Svc],
    diffs: &mut Diffs,
) -> BTreeSet<String> {
    let mut compared = BTreeSet::new();
    for s in services {
        let who = s.port_name_string();
        diffs.lines(
            &format!("KUBE-SERVICES rules of {who} ({})", s.vip),
            Some(&real.services_rules(s.vip)),
            Some(&generated.services_rules(s.vip)),
        );
        let chain = svc_chain(s);
        diffs.lines(
            &format!("{chain} ({who})"),
            real.chain(&chain),
            generated.chain(&chain),
        );
        let mut seps: BTreeSet<String> = s.endpoints.iter().map(|e| sep_chain(s, e)).collect();
        seps.extend(Ipt::sep_targets(real.chain(&chain).unwrap_or_default()));
        seps.extend(Ipt::sep_targets(
            generated.chain(&chain).unwrap_or_default(),
        ));
        for sep in &seps {
            diffs.lines(
                &format!("{sep} ({who})"),
                real.chain(sep),
                generated.chain(sep),
            );
        }
        compared.insert(chain);
        compared.extend(seps);
    }
    compared
}

/// Compares whole tables, less the `kubernetes` Service: the chains declared, in
/// order, and every chain's rules but those of `compared` (already compared, with
/// their Service named).
fn compare_tables_iptables(
    real: &Tables,
    generated: &Tables,
    kubernetes: &Svc,
    compared: &BTreeSet<String>,
    diffs: &mut Diffs,
) {
    for ((table, real), (_, generated)) in real.0.iter().zip(&generated.0) {
        let (real, generated) = (real.without(kubernetes), generated.without(kubernetes));
        diffs.lines(
            &format!("{table} table: the chains declared"),
            Some(&real.declared),
            Some(&generated.declared),
        );
        diffs.lines(
            &format!("{table} table: other lines"),
            Some(&real.other),
            Some(&generated.other),
        );
        let chains: BTreeSet<&String> = real.chains.keys().chain(generated.chains.keys()).collect();
        for c in chains {
            if *table == "nat" && compared.contains(c) {
                continue;
            }
            diffs.lines(
                &format!("{table} table: chain {c}"),
                real.chain(c),
                generated.chain(c),
            );
        }
    }
}

/// Compares everything: the Services' rules, then the whole tables.
fn compare_iptables(
    real: &Tables,
    generated: &Tables,
    services: &[Svc],
    kubernetes: &Svc,
    what: &str,
) -> Result<()> {
    let mut diffs = Diffs::default();
    let compared = compare_services_iptables(real.nat(), generated.nat(), services, &mut diffs);
    compare_tables_iptables(real, generated, kubernetes, &compared, &mut diffs);
    diffs.check(what)
}

/// Waits until kube-proxy has written every Service of `services` (as they are now)
/// in node-1's namespace; its tables.
fn wait_iptables(cluster: &Cluster, node: &str, services: &[Svc]) -> Result<Tables> {
    wait_for(cluster, "the Services (iptables)", || {
        let tables = Tables::read(node)?;
        let missing: Vec<String> = services
            .iter()
            .filter_map(|s| tables.nat().missing(s))
            .collect();
        Ok(if missing.is_empty() {
            Ok(tables)
        } else {
            Err(missing.join("; "))
        })
    })
}

/// The rules of the endpoint chains kube-proxy wrote for `s` that carry a comment
/// (`-m comment`): all of them below large cluster mode, none in it.
fn commented_sep_rules(nat: &Ipt, s: &Svc) -> (usize, usize) {
    let seps = Ipt::sep_targets(nat.chain(&svc_chain(s)).unwrap_or_default());
    let rules: Vec<&String> = seps
        .iter()
        .flat_map(|c| nat.chain(c).unwrap_or_default())
        .collect();
    let commented = rules.iter().filter(|l| l.contains("-m comment")).count();
    (commented, rules.len())
}

/// The lab, the API and what every phase needs.
struct Ctx<'a> {
    cluster: &'a Cluster,
    rt: &'a tokio::runtime::Runtime,
    client: &'a kube::Client,
    prefix: &'a str,
    node: String,
    kubernetes: Svc,
}

/// Starts kube-proxy in iptables mode, waits for `services`, compares its tables with
/// the generator's full restore in a namespace of the test's own; then replaces the
/// first endpoint of Service `changed` by `new`, waits for kube-proxy's sync and
/// compares again, the generator's partial restore loaded on top. kube-proxy's tables
/// after its full sync.
fn iptables_phase(
    ctx: &Ctx,
    phase: &str,
    services: &mut [Svc],
    changed: usize,
    new: Ipv4Addr,
) -> Result<Tables> {
    let t = Instant::now();
    ctx.cluster.start_proxies(Proxy::Iptables)?;
    let real = wait_iptables(ctx.cluster, &ctx.node, services)?;
    say(&format!(
        "{phase}: kube-proxy (iptables) wrote the {} Services in {:.1} s",
        services.len(),
        t.elapsed().as_secs_f64()
    ));
    let gen_ns = format!("{}-gen-{phase}", ctx.prefix);
    let _gen = Netns::create(&gen_ns)?;
    // kube-proxy's nfacct counters, created in the namespace as kube-proxy creates them
    // in its own before its first restore.
    let nfacct = netns::in_netns(&gen_ns, ensure_nfacct_counters)??;
    say(&format!("{phase}: nfacct in the kernel: {nfacct:?}"));
    run_in(
        &gen_ns,
        "iptables-restore",
        &["--noflush", "--counters"],
        &iptables_full_with(services, true, nfacct),
    )
    .context("loading the generator's iptables rules")?;
    let generated = Tables::read(&gen_ns)?;
    compare_iptables(
        &real,
        &generated,
        services,
        &ctx.kubernetes,
        &format!("iptables, {phase}, full sync"),
    )?;
    let endpoints = services.iter().map(|s| s.endpoints.len()).sum::<usize>();
    say(&format!(
        "{phase}: iptables tables equal for {} Services, {endpoints} endpoints",
        services.len(),
    ));

    let before = services[changed].clone();
    services[changed] = ctx
        .rt
        .block_on(replace_first_endpoint(ctx.client, &before, new))?;
    let real_after = wait_iptables(ctx.cluster, &ctx.node, services)?;
    run_in(
        &gen_ns,
        "iptables-restore",
        &["--noflush", "--counters"],
        &iptables_partial_with(services, changed, &before, nfacct),
    )
    .context("loading the generator's partial iptables restore")?;
    let generated = Tables::read(&gen_ns)?;
    compare_iptables(
        &real_after,
        &generated,
        services,
        &ctx.kubernetes,
        &format!("iptables, {phase}, after the change"),
    )?;
    // The stale endpoint chain: deleted, or in large cluster mode left (not vacuous).
    let stale = sep_chain(&before, &before.endpoints[0]);
    let left = real_after
        .nat()
        .declared
        .iter()
        .any(|d| d.starts_with(&format!("{stale} ")));
    ensure!(
        left == large_cluster(services),
        "{phase}: kube-proxy {} the stale endpoint chain {stale}",
        if left { "left" } else { "deleted" }
    );
    say(&format!(
        "{phase}: iptables tables equal after {} changed {} to {new} (stale chain {})",
        before.name,
        before.endpoints[0].0,
        if left { "left" } else { "deleted" }
    ));
    Ok(real)
}

// ---------------------------------------------------------------------- nftables

/// A set or map of `nft list table`: its declaration's lines and its elements.
#[derive(Clone, Default, PartialEq)]
struct NftSet {
    declaration: Vec<String>,
    elements: BTreeSet<String>,
}

/// `nft list table ip kube-proxy`: the table's own lines, its objects in order
/// (`set NAME`, `map NAME`, `chain NAME`), each chain's lines (rules, and the base
/// chains' `type` line and a chain's `comment`), each set's and map's declaration and
/// elements.
#[derive(Clone, PartialEq)]
struct NftTable {
    own: Vec<String>,
    order: Vec<String>,
    chains: BTreeMap<String, Vec<String>>,
    sets: BTreeMap<String, NftSet>,
}

impl NftTable {
    fn read(ns: &str) -> Result<Self> {
        let text = netns::nsenter(ns, "nft", &["list", "table", "ip", "kube-proxy"])?;
        Self::parse(&text)
    }

    /// The table is a block `table ip kube-proxy {` ... `}`; its objects are blocks
    /// one level in, `KIND NAME {` ... `}`; a set's elements are the comma-separated
    /// list of its `elements = { ... }`, which may go over lines.
    fn parse(text: &str) -> Result<Self> {
        let mut table = NftTable {
            own: Vec::new(),
            order: Vec::new(),
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
        };
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        ensure!(
            lines.next() == Some("table ip kube-proxy {"),
            "not a listing of table ip kube-proxy"
        );
        while let Some(l) = lines.next() {
            if l == "}" {
                ensure!(lines.next().is_none(), "lines after the table's end");
                return Ok(table);
            }
            let Some(head) = l.strip_suffix(" {") else {
                table.own.push(l.to_string());
                continue;
            };
            let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "}").collect();
            table.order.push(head.to_string());
            let (kind, name) = head.split_once(' ').context("an object without a name")?;
            match kind {
                "chain" => {
                    table.chains.insert(
                        name.to_string(),
                        block.iter().map(|l| l.to_string()).collect(),
                    );
                }
                "set" | "map" => {
                    let mut set = NftSet::default();
                    let mut elements: Option<String> = None;
                    for l in block {
                        match (&mut elements, l.strip_prefix("elements = {")) {
                            (None, Some(rest)) => elements = Some(rest.to_string()),
                            (None, None) => set.declaration.push(l.to_string()),
                            (Some(e), _) => {
                                e.push(' ');
                                e.push_str(l);
                            }
                        }
                    }
                    if let Some(e) = elements {
                        let list = e.trim().strip_suffix('}').context("elements unclosed")?;
                        set.elements = list
                            .split(',')
                            .map(|e| e.trim().to_string())
                            .filter(|e| !e.is_empty())
                            .collect();
                    }
                    table.sets.insert(name.to_string(), set);
                }
                _ => bail!("an object of an unexpected kind: {head}"),
            }
        }
        bail!("the table's block is not closed")
    }

    fn chain(&self, name: &str) -> Option<&[String]> {
        self.chains.get(name).map(Vec::as_slice)
    }

    /// The elements of map `map` whose key starts with `vip`.
    fn elements(&self, map: &str, vip: Ipv4Addr) -> BTreeSet<String> {
        let key = format!("{vip} . ");
        self.sets
            .get(map)
            .map(|m| {
                m.elements
                    .iter()
                    .filter(|e| e.starts_with(&key))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The chains of Service port `s`: those whose names carry `NS/NAME/tcp/PORTNAME`
    /// (upstream's `servicePortChainNameBase`, `servicePortEndpointChainNameBase`).
    fn chains_of(&self, s: &Svc) -> BTreeSet<String> {
        let base = format!("-{}/{}/tcp/{}", s.namespace, s.name, s.port_name);
        self.chains
            .keys()
            .filter(|c| c.ends_with(&base) || c.contains(&format!("{base}__")))
            .cloned()
            .collect()
    }

    /// The table less the `kubernetes` Service `k`: its chains, and its elements (the
    /// ClusterIP's in every set and map).
    fn without(&self, k: &Svc) -> Self {
        let mut table = self.clone();
        for c in self.chains_of(k) {
            table.chains.remove(&c);
            table.order.retain(|o| *o != format!("chain {c}"));
        }
        let (vip, key) = (k.vip.to_string(), format!("{} . ", k.vip));
        for set in table.sets.values_mut() {
            set.elements.retain(|e| *e != vip && !e.starts_with(&key));
        }
        table
    }
}

/// Compares, for every Service, its `service-ips` elements and every chain of its
/// that either side has; the chains compared.
fn compare_services_nft(
    real: &NftTable,
    generated: &NftTable,
    services: &[Svc],
    diffs: &mut Diffs,
) -> BTreeSet<String> {
    let mut compared = BTreeSet::new();
    for s in services {
        let who = s.port_name_string();
        diffs.sets(
            &format!("service-ips elements of {who} ({})", s.vip),
            &real.elements("service-ips", s.vip),
            &generated.elements("service-ips", s.vip),
        );
        let service = nft_service_chain(s);
        diffs.lines(
            &format!("chain {service}"),
            real.chain(&service),
            generated.chain(&service),
        );
        let mut chains = real.chains_of(s);
        chains.extend(generated.chains_of(s));
        chains.extend(s.endpoints.iter().map(|e| nft_endpoint_chain(s, e)));
        chains.remove(&service);
        compared.insert(service);
        compared.extend(chains.iter().cloned());
        // The chains both sides have, rule for rule; those of one side only, as one
        // item per side.
        let mut only: [Vec<String>; 2] = Default::default();
        for c in chains {
            match (real.chain(&c), generated.chain(&c)) {
                (Some(r), Some(g)) => diffs.lines(&format!("chain {c}"), Some(r), Some(g)),
                (Some(_), None) => only[0].push(c),
                (None, Some(_)) => only[1].push(c),
                (None, None) => {}
            }
        }
        for (side, chains, table) in [("real", &only[0], real), ("generated", &only[1], generated)]
        {
            let Some(first) = chains.first() else {
                continue;
            };
            let mut d = format!(
                "{who}: {} chain(s) only in the {side} rules, the first of them:\n    chain {first}",
                chains.len()
            );
            for l in table.chain(first).unwrap_or_default() {
                d.push_str(&format!("\n      {}", clip(l)));
            }
            diffs.0.push(d);
        }
    }
    compared
}

/// Compares the whole tables less the `kubernetes` Service and the node's addresses
/// in `nodeport-ips` (checked to be `node_addresses`): the table's own lines, the
/// order of its objects but the Services' chains, every chain but those of
/// `compared`, every set's and map's declaration and elements.
fn compare_tables_nft(
    real: &NftTable,
    generated: &NftTable,
    kubernetes: &Svc,
    node_addresses: &BTreeSet<String>,
    compared: &BTreeSet<String>,
    diffs: &mut Diffs,
) -> Result<()> {
    let (mut real, generated) = (real.without(kubernetes), generated.without(kubernetes));
    let nodeports = real
        .sets
        .get_mut("nodeport-ips")
        .context("kube-proxy wrote no nodeport-ips set")?;
    ensure!(
        !nodeports.elements.is_empty() && nodeports.elements.is_subset(node_addresses),
        "kube-proxy's nodeport-ips {:?} are not among the node's addresses {node_addresses:?}",
        nodeports.elements
    );
    nodeports.elements.clear();
    diffs.lines(
        "the table's own lines",
        Some(&real.own),
        Some(&generated.own),
    );
    // Objects in the order kube-proxy created them; the Services' chains (their names
    // have a `/`) in the order of a Go map.
    let fixed = |t: &NftTable| -> Vec<String> {
        t.order
            .iter()
            .filter(|o| !o.contains('/'))
            .cloned()
            .collect()
    };
    diffs.lines(
        "the table's sets, maps and chains (but the Services'), in order",
        Some(&fixed(&real)),
        Some(&fixed(&generated)),
    );
    let chains: BTreeSet<&String> = real.chains.keys().chain(generated.chains.keys()).collect();
    for c in chains.into_iter().filter(|c| !compared.contains(*c)) {
        diffs.lines(&format!("chain {c}"), real.chain(c), generated.chain(c));
    }
    let sets: BTreeSet<&String> = real.sets.keys().chain(generated.sets.keys()).collect();
    for name in sets {
        let (r, g) = (real.sets.get(name), generated.sets.get(name));
        diffs.lines(
            &format!("set or map {name}: its declaration"),
            r.map(|s| s.declaration.as_slice()),
            g.map(|s| s.declaration.as_slice()),
        );
        diffs.sets(
            &format!("set or map {name}: its elements"),
            &r.map(|s| s.elements.clone()).unwrap_or_default(),
            &g.map(|s| s.elements.clone()).unwrap_or_default(),
        );
    }
    Ok(())
}

fn compare_nft(
    real: &NftTable,
    generated: &NftTable,
    services: &[Svc],
    ctx: &Ctx,
    node_addresses: &BTreeSet<String>,
    what: &str,
) -> Result<()> {
    let mut diffs = Diffs::default();
    let compared = compare_services_nft(real, generated, services, &mut diffs);
    compare_tables_nft(
        real,
        generated,
        &ctx.kubernetes,
        node_addresses,
        &compared,
        &mut diffs,
    )?;
    diffs.check(what)
}

/// Waits until kube-proxy (nftables) has every Service of `services` in its
/// `service-ips` map and DNATs to each of their endpoints (one transaction writes a
/// Service's chain and its element).
fn wait_nft(cluster: &Cluster, node: &str, services: &[Svc]) -> Result<NftTable> {
    wait_for(cluster, "the Services (nftables)", || {
        let table = NftTable::read(node)?;
        let missing: Vec<&str> = services
            .iter()
            .filter(|s| {
                let rules = table
                    .chain(&nft_service_chain(s))
                    .unwrap_or_default()
                    .join("\n");
                table.elements("service-ips", s.vip).is_empty()
                    || s.endpoints
                        .iter()
                        .any(|(ip, port)| !rules.contains(&format!(" {ip} . {port}")))
            })
            .map(|s| s.name.as_str())
            .collect();
        Ok(if missing.is_empty() {
            Ok(table)
        } else {
            Err(format!("{missing:?}"))
        })
    })
}

/// The IPv4 addresses of the node's interfaces (but loopback's).
fn node_addresses(node: &str) -> Result<BTreeSet<String>> {
    let text = netns::nsenter(node, "ip", &["-4", "-o", "addr", "show"])?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            let address = words.next()?.split('/').next()?;
            (!address.starts_with("127.")).then(|| address.to_string())
        })
        .collect())
}

/// kube-proxy in nftables mode, the same way as [`iptables_phase`].
fn nft_phase(ctx: &Ctx, services: &mut [Svc], changed: usize, new: Ipv4Addr) -> Result<()> {
    let t = Instant::now();
    ctx.cluster.start_proxies(Proxy::Nftables)?;
    let real = wait_nft(ctx.cluster, &ctx.node, services)?;
    say(&format!(
        "nftables: kube-proxy wrote the {} Services in {:.1} s",
        services.len(),
        t.elapsed().as_secs_f64()
    ));
    let addresses = node_addresses(&ctx.node)?;
    let gen_ns = format!("{}-gen-nft", ctx.prefix);
    let _gen = Netns::create(&gen_ns)?;
    run_in(&gen_ns, "nft", &["-f", "-"], &nft_full(services))
        .context("loading the generator's nftables rules")?;
    let generated = NftTable::read(&gen_ns)?;
    compare_nft(
        &real,
        &generated,
        services,
        ctx,
        &addresses,
        "nftables, full sync",
    )?;
    let endpoints = services.iter().map(|s| s.endpoints.len()).sum::<usize>();
    say(&format!(
        "nftables: tables equal for {} Services, {endpoints} endpoints",
        services.len()
    ));

    let before = services[changed].clone();
    services[changed] = ctx
        .rt
        .block_on(replace_first_endpoint(ctx.client, &before, new))?;
    let real = wait_nft(ctx.cluster, &ctx.node, services)?;
    run_in(
        &gen_ns,
        "nft",
        &["-f", "-"],
        &nft_partial(services, changed),
    )
    .context("loading the generator's nftables transaction")?;
    let generated = NftTable::read(&gen_ns)?;
    compare_nft(
        &real,
        &generated,
        services,
        ctx,
        &addresses,
        "nftables, after the change",
    )?;
    say(&format!(
        "nftables: tables equal after {} changed {} to {new}",
        before.name, before.endpoints[0].0
    ));
    Ok(())
}

// -------------------------------------------------------------------------- test

fn run(cluster: &Cluster, prefix: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = rt.block_on(cluster.client())?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    rt.block_on(namespaces.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
    ))
    .context("creating the namespace")?;
    let ctx = Ctx {
        cluster,
        rt: &rt,
        client: &client,
        prefix,
        node: cluster.state.nodes[0].netns.clone(),
        kubernetes: rt.block_on(kubernetes_service(&client))?,
    };

    // kube-proxy runs `iptables-restore` and `iptables-save` by these names from its
    // PATH (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/util/iptables/iptables.go,
    // `cmdIPTablesRestore`), the test's PATH, so both sides use the same backend.
    let version = Command::new("iptables-restore").arg("--version").output()?;
    say(&format!(
        "iptables backend: {}",
        String::from_utf8_lossy(&version.stdout).trim()
    ));

    // Small: 6 endpoints (7 with the `kubernetes` Service's, which kube-proxy counts
    // too), below large cluster mode.
    let mut services = Vec::new();
    for i in 0..2 {
        services.push(rt.block_on(create(&client, &format!("small-{i}"), small_endpoints(i)))?);
    }
    ensure!(!large_cluster(&services));
    let real = iptables_phase(
        &ctx,
        "small",
        &mut services,
        0,
        Ipv4Addr::new(10, 244, 100, 12),
    )?;
    for s in &services {
        let (commented, all) = commented_sep_rules(real.nat(), s);
        ensure!(
            all == 2 * s.endpoints.len() && commented == all,
            "small: kube-proxy commented {commented} of the {all} endpoint rules of {}",
            s.name
        );
    }

    // Large: one more Service of 1,000 endpoints (two slices), 1,006 in all (1,007
    // with the `kubernetes` Service's). kube-proxy is restarted without rules so that
    // its first sync writes everything.
    cluster.stop_proxies()?;
    services.push(rt.block_on(create(&client, "large", large_endpoints()))?);
    let total: usize = services.iter().map(|s| s.endpoints.len()).sum();
    ensure!(total > LARGE_CLUSTER_ENDPOINTS && large_cluster(&services));
    let real = iptables_phase(
        &ctx,
        "large",
        &mut services,
        1,
        Ipv4Addr::new(10, 244, 101, 12),
    )?;
    // Not vacuous: kube-proxy did leave the comments out, so the generator had to.
    for s in &services {
        let (commented, all) = commented_sep_rules(real.nat(), s);
        ensure!(
            all == 2 * s.endpoints.len() && commented == 0,
            "large: kube-proxy commented {commented} of the {all} endpoint rules of {}",
            s.name
        );
    }

    // nftables, the same three Services (the 1,000-endpoint one too, and its endpoint
    // is the one changed: both tables list in well under a second).
    cluster.stop_proxies()?;
    nft_phase(&ctx, &mut services, 2, Ipv4Addr::new(10, 244, 114, 1))?;
    cluster.stop_proxies()
}

#[test]
fn the_generated_rules_are_the_ones_kube_proxy_writes() -> Result<()> {
    let t = Instant::now();
    let parent = std::env::temp_dir();
    // Labs and namespaces left by runs killed before their cleanup go first.
    cluster::remove_stale(&parent);
    netns::remove_stale(cluster::NS_PREFIX);
    let prefix = format!("{}-{}-kprules", cluster::NS_PREFIX, std::process::id());
    let spec = Spec {
        nodes: 1,
        proxy: Proxy::None,
        controller: Controllers::Upstream,
        workloads: false,
        apiserver_args: vec![],
        ..Spec::default()
    };
    // Taken down on drop, after an error too: processes, namespaces (ours are named
    // after its prefix as well), files.
    let cluster = Cluster::up(&spec, &parent.join(&prefix), &prefix)?;
    say(&format!("lab up in {:.1} s", t.elapsed().as_secs_f64()));
    run(&cluster, &prefix)?;
    drop(cluster);
    say(&format!("done in {:.1} s", t.elapsed().as_secs_f64()));
    Ok(())
}

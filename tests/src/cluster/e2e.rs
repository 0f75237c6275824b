//! Upstream's own e2e suite on the lab (`cargo xtask e2e`): a cluster of real nodes
//! (`--kubelet real`), upstream's `e2e.test` of the pinned version run from inside the
//! lab (the external client's namespace, which reaches the API server through the
//! gateway and the nodes and pods directly), its JUnit report read back, and the
//! results written to `target/e2e/<proxy>-<controller>/`.
//!
//! The default selection is issue 45's: every `[sig-network]` spec tagged
//! `[Conformance]`, every `[sig-network] Services` spec and the dual-stack specs, less
//! `[Disruptive]`, `[Serial]`, `[Flaky]` and SCTP (this kernel has none), each skip
//! named with its reason. The e2e suite's flags are those of
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/test/e2e/framework/test_context.go>.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{pki, Cluster, ADVERTISE_ADDRESS};

/// What the suite runs by default (a Go regular expression, as ginkgo takes it).
pub const DEFAULT_FOCUS: &str =
    r"\[sig-network\].*\[Conformance\]|\[sig-network\] Services|\[Feature:IPv6DualStack\]";

/// What the default run leaves out, and why.
pub const SKIPS: [(&str, &str); 4] = [
    (
        r"\[Disruptive\]",
        "disruptive: restarts or breaks nodes and components",
    ),
    (r"\[Serial\]", "serial: must run alone on a cluster"),
    (r"\[Flaky\]", "flaky: upstream marks it unreliable"),
    (r"SCTP", "SCTP: this machine's kernel has no SCTP"),
];

/// The default skip expression: every reason of [`SKIPS`].
pub fn default_skip() -> String {
    SKIPS
        .iter()
        .map(|(re, _)| *re)
        .collect::<Vec<_>>()
        .join("|")
}

/// The reason of [`SKIPS`] that a spec's name matches (tags and words, as written).
pub fn skip_reason(name: &str) -> Option<&'static str> {
    SKIPS.iter().find_map(|(re, why)| {
        let word = re.replace('\\', "");
        name.contains(&word).then_some(*why)
    })
}

/// One spec's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub name: String,
    /// passed, failed, skipped (or what the report says otherwise).
    pub status: String,
    /// Seconds.
    pub time: f64,
    /// The failure's or the skip's message, first line.
    pub message: String,
}

/// One run of the suite on one lab.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub proxy: String,
    pub controller: String,
    pub date: String,
    pub commit: String,
    pub kubernetes: String,
    pub focus: String,
    pub skip: String,
    pub specs: Vec<Spec>,
}

impl Run {
    pub fn count(&self, status: &str) -> usize {
        self.specs.iter().filter(|s| s.status == status).count()
    }

    /// `N passed, N failed, N skipped`.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.count("passed"),
            self.count("failed"),
            self.count("skipped")
        )
    }
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&#34;", "\"")
        .replace("&#xA;", "\n")
        .replace("&amp;", "&")
}

/// The value of attribute `name` in the tag text `tag` (`<testcase a="b" ...`).
fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')? + start;
    Some(unescape(&tag[start..end]))
}

/// The specs of a JUnit report as ginkgo v2 writes it (`<testcase name=... status=...
/// time=...>` with `<failure message=...>` or `<skipped message=...>` inside). The
/// suite's set-up and tear-down nodes (`[SynchronizedBeforeSuite]`, ...) are left out.
pub fn parse_junit(xml: &str) -> Vec<Spec> {
    let mut specs = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase ") {
        rest = &rest[i..];
        let head_end = rest.find('>').unwrap_or(rest.len());
        let head = &rest[..head_end];
        let self_closing = head.ends_with('/');
        let body_end = if self_closing {
            head_end
        } else {
            rest.find("</testcase>").unwrap_or(rest.len())
        };
        let body = &rest[head_end.min(body_end)..body_end];
        let name = attr(head, "name").unwrap_or_default();
        let mut status = attr(head, "status").unwrap_or_default();
        let mut message = String::new();
        for (tag, st) in [("<failure", "failed"), ("<skipped", "skipped")] {
            if let Some(j) = body.find(tag) {
                let t = &body[j..body[j..].find('>').map_or(body.len(), |e| j + e)];
                message = attr(t, "message")
                    .unwrap_or_default()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                if status.is_empty() {
                    status = st.to_string();
                }
            }
        }
        if status.is_empty() {
            status = "passed".into();
        }
        let time = attr(head, "time")
            .and_then(|t| t.parse().ok())
            .unwrap_or(0.0);
        let name = name.trim_start_matches("[It] ").to_string();
        if !name.starts_with("[Synchronized")
            && !name.starts_with("[BeforeSuite]")
            && !name.starts_with("[AfterSuite]")
            && !name.starts_with("[ReportAfterSuite]")
            && !name.starts_with("[ReportBeforeSuite]")
        {
            specs.push(Spec {
                name,
                status,
                time,
                message,
            });
        }
        rest = &rest[body_end.max(1)..];
    }
    specs
}

/// The e2e suite's kubeconfig: the admin's, for the API server as the lab's own
/// namespaces reach it (the gateway).
fn kubeconfig(cluster: &Cluster) -> Result<PathBuf> {
    let s = &cluster.state;
    pki::kubeconfig(
        &s.dir.join("pki"),
        &s.dir.join("e2e.kubeconfig"),
        &format!("https://{ADVERTISE_ADDRESS}:{}", s.apiserver_port),
        Some("admin"),
        None,
    )
}

/// How `e2e.test` runs: alone, or as `procs` processes that ginkgo's own command
/// (`ginkgo`, built from the ginkgo module e2e.test is built with) starts and whose
/// specs it shares out, as upstream's hack/ginkgo-e2e.sh runs the suite
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/hack/ginkgo-e2e.sh>).
pub enum Runner<'a> {
    Serial,
    Parallel { ginkgo: &'a Path, procs: usize },
}

/// Runs `e2e_test` (upstream's `e2e.test`) on `cluster` from inside its client
/// namespace, with ginkgo's `focus`, `skip` and `timeout` (the suite's whole run:
/// specs not reached by then are reported as not run); its report, log and the components'
/// logs go to `out`. Returns the run, read back from the JUnit report.
pub fn run(
    cluster: &Cluster,
    e2e_test: &Path,
    runner: Runner,
    focus: &str,
    skip: &str,
    timeout: &str,
    out: &Path,
) -> Result<Run> {
    let s = &cluster.state;
    // Absolute: ginkgo's command runs e2e.test in the binary's own directory.
    let out = &std::path::absolute(out)?;
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("clearing {}", out.display()))?;
    }
    fs::create_dir_all(out)?;
    // The commit and date of the tree the run starts from (the binaries under test were
    // built from it), not of whatever the tree is when the suite ends.
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let mut commit = git(&["rev-parse", "--short=12", "HEAD"]);
    if !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty() {
        commit.push_str("-dirty");
    }
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let kc = kubeconfig(cluster)?;
    let log = fs::File::create(out.join("e2e.log"))?;
    eprintln!(
        "e2e: running {} from {} (focus {focus:?}, skip {skip:?}); log in {}",
        e2e_test.display(),
        s.client_ns,
        out.join("e2e.log").display()
    );
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{}", s.client_ns));
    // ginkgo's flags: e2e.test's own (`--ginkgo.X`) when it runs alone, the ginkgo
    // command's (`--X`, then e2e.test and its arguments after `--`) when that runs it.
    let ginkgo_flags = [
        format!("focus={focus}"),
        format!("skip={skip}"),
        "no-color".to_string(),
        format!("timeout={timeout}"),
        "v".to_string(),
    ];
    match runner {
        Runner::Serial => {
            cmd.arg(e2e_test)
                .args(ginkgo_flags.iter().map(|f| format!("--ginkgo.{f}")));
        }
        Runner::Parallel { ginkgo, procs } => {
            eprintln!("e2e: {procs} processes of e2e.test, shared out by ginkgo");
            cmd.arg(ginkgo)
                .arg(format!("--procs={procs}"))
                .args(ginkgo_flags.iter().map(|f| format!("--{f}")))
                .arg(e2e_test)
                .arg("--");
        }
    }
    let status = cmd
        .arg("--provider=skeleton")
        // Only ginkgo's first process counts the nodes itself: the others would skip
        // every spec that needs two (hack/ginkgo-e2e.sh passes it too).
        .arg(format!("--num-nodes={}", s.nodes.len()))
        .arg(format!("--kubeconfig={}", kc.display()))
        .arg(format!(
            "--kubectl-path={}",
            s.bin.join("kubectl").display()
        ))
        .arg(format!("--report-dir={}", out.display()))
        .arg("--dump-logs-on-failure=false")
        .arg("--disable-log-dump")
        .env("KUBECONFIG", &kc)
        .env("HOME", out)
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .context("starting e2e.test")?;
    // Failing specs make it exit 1: the report says which.
    let junit = fs::read_dir(out)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("junit"))
        });
    let Some(junit) = junit else {
        bail!(
            "e2e.test ({status}) wrote no JUnit report into {}; see e2e.log there",
            out.display()
        );
    };
    let specs = parse_junit(&fs::read_to_string(&junit)?);
    for entry in fs::read_dir(s.dir.join("logs"))?.filter_map(|e| e.ok()) {
        let _ = fs::copy(
            entry.path(),
            out.join(format!("component-{}", entry.file_name().to_string_lossy())),
        );
    }
    let run = Run {
        proxy: format!("{:?}", s.proxy).to_lowercase(),
        controller: format!("{:?}", s.controller).to_lowercase(),
        date,
        commit,
        kubernetes: s.version.clone(),
        focus: focus.to_string(),
        skip: skip.to_string(),
        specs,
    };
    fs::write(out.join("results.json"), serde_json::to_vec_pretty(&run)?)?;
    Ok(run)
}

/// `docs/conformance.md` from runs (every `results.json` under `target/e2e`): each
/// run's selection and counts, and each spec any run ran with its result in each.
pub fn conformance_page(runs: &[Run]) -> String {
    let mut names: BTreeMap<&str, BTreeMap<String, &str>> = BTreeMap::new();
    let columns: Vec<String> = runs
        .iter()
        .map(|r| format!("{} / {}", r.proxy, r.controller))
        .collect();
    for (run, col) in runs.iter().zip(&columns) {
        for spec in &run.specs {
            names
                .entry(spec.name.as_str())
                .or_default()
                .insert(col.clone(), spec.status.as_str());
        }
    }
    let mut page = String::from(
        "# Conformance: upstream's e2e suite on sliceway\n\n\
         Generated by `cargo xtask e2e` from its runs' reports (`target/e2e/*/results.json`);\n\
         do not edit. Each run brings up a 3-node cluster of real nodes in the lab\n\
         ([the cluster lab](dev/cluster-lab.md#real-nodes)) and runs upstream's `e2e.test` of\n\
         the pinned version from inside it.\n\n",
    );
    page.push_str("| run (proxy / controller) | date | commit | Kubernetes | focus | skip | passed | failed | skipped |\n|---|---|---|---|---|---|---|---|---|\n");
    for (run, col) in runs.iter().zip(&columns) {
        page.push_str(&format!(
            "| {col} | {} | {} | {} | `{}` | `{}` | {} | {} | {} |\n",
            run.date,
            run.commit,
            run.kubernetes,
            run.focus.replace('|', "\\|"),
            run.skip.replace('|', "\\|"),
            run.count("passed"),
            run.count("failed"),
            run.count("skipped")
        ));
    }
    page.push_str(&format!(
        "\nThe default selection (`cargo xtask e2e` with no `--focus` or `--skip`) is focus \
         `{}` and skip `{}`. Skipped by it, and why:\n\n",
        DEFAULT_FOCUS.replace('|', "\\|"),
        default_skip().replace('|', "\\|")
    ));
    for (re, why) in SKIPS {
        page.push_str(&format!("- `{}`: {why}\n", re.replace('\\', "")));
    }
    page.push_str("\n## Specs run\n\n| spec |");
    for col in &columns {
        page.push_str(&format!(" {col} |"));
    }
    page.push_str("\n|---|");
    for _ in &columns {
        page.push_str("---|");
    }
    page.push('\n');
    let mut skipped = 0;
    for (name, results) in &names {
        if results.values().all(|s| *s == "skipped") {
            skipped += 1;
            continue;
        }
        page.push_str(&format!("| {} |", name.replace('|', "\\|")));
        for col in &columns {
            page.push_str(&format!(" {} |", results.get(col).copied().unwrap_or("-")));
        }
        page.push('\n');
    }
    page.push_str(&format!(
        "\n{skipped} other specs of the suite were outside the selection in every run.\n"
    ));
    page
}

/// Every run's results under `dir`, in name order.
pub fn read_runs(dir: &Path) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(runs);
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("results.json"))
        .filter(|p| p.exists())
        .collect();
    paths.sort();
    for p in paths {
        runs.push(
            serde_json::from_slice(&fs::read(&p)?)
                .with_context(|| format!("reading {}", p.display()))?,
        );
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="1" errors="0" failures="1" time="12.5">
  <testsuite name="Kubernetes e2e suite" package="/" tests="4" disabled="1" skipped="1" errors="0" failures="1" time="12.5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.0"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="8.25"></testcase>
    <testcase name="[It] [sig-network] Services should be able to up and down services" classname="Kubernetes e2e suite" status="failed" time="3.0">
      <failure message="timed out waiting for the condition&#xA;more" type="failed">details</failure>
    </testcase>
    <testcase name="[It] [sig-network] Services should work with SCTP &amp; more [Feature:SCTP]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>"#;

    #[test]
    fn a_ginkgo_report_reads_back_as_its_specs() {
        let specs = parse_junit(REPORT);
        assert_eq!(specs.len(), 3, "{specs:?}");
        assert_eq!(
            specs[0].name,
            "[sig-network] Services should serve a basic endpoint from pods  [Conformance]"
        );
        assert_eq!(specs[0].status, "passed");
        assert_eq!(specs[0].time, 8.25);
        assert_eq!(specs[1].status, "failed");
        assert_eq!(specs[1].message, "timed out waiting for the condition");
        assert_eq!(specs[2].status, "skipped");
        assert!(specs[2].name.contains("SCTP & more"));
        let run = Run {
            proxy: "sliceway".into(),
            controller: "sliceway".into(),
            date: "2026-12-02".into(),
            commit: "abc".into(),
            kubernetes: "v1.37.2".into(),
            focus: DEFAULT_FOCUS.into(),
            skip: default_skip(),
            specs,
        };
        assert_eq!(run.summary(), "1 passed, 1 failed, 1 skipped");
        let page = conformance_page(&[run]);
        assert!(page.contains("| sliceway / sliceway | 2026-12-02 | abc | v1.37.2 |"));
        assert!(page.contains("| 1 | 1 | 1 |"));
        assert!(page.contains("should be able to up and down services | failed |"));
        assert!(page.contains("1 other specs"));
    }

    #[test]
    fn every_default_skip_has_its_reason() {
        assert_eq!(default_skip(), r"\[Disruptive\]|\[Serial\]|\[Flaky\]|SCTP");
        assert_eq!(
            skip_reason("[sig-network] Services should x [Serial]"),
            Some("serial: must run alone on a cluster")
        );
        assert_eq!(
            skip_reason("[sig-network] SCTP [LinuxOnly] should y"),
            Some("SCTP: this machine's kernel has no SCTP")
        );
        assert_eq!(skip_reason("[sig-network] Services should z"), None);
    }
}

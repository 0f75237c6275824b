//! The monitoring files in `deploy/monitoring/` cannot go stale: the alert rules
//! parse as a Prometheus rule file, the Grafana dashboard as JSON, and every metric
//! they name is a series the agent serves.

use std::{collections::BTreeSet, path::PathBuf};

use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;
use sliceway_agent::serve::metrics::Metrics;

fn monitoring(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/monitoring")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The series names the agent serves, with their `_bucket`, `_sum`, `_count` and
/// `_total` suffixes, as a query names them.
fn served() -> BTreeSet<String> {
    Metrics::with_one_series_each()
        .render()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(String::from)
        .collect()
}

/// The metric names a PromQL expression uses: sliceway's and kube-proxy's.
fn names_in(expr: &str) -> Vec<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = ["sliceway_", "kubeproxy_"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let before = rest[..at].chars().next_back();
        let len = rest[at..].find(|c| !word(c)).unwrap_or(rest.len() - at);
        if !before.is_some_and(word) {
            names.push(rest[at..at + len].to_string());
        }
        rest = &rest[at + len..];
    }
    names
}

fn check(exprs: &[(String, String)], what: &str) {
    let served = served();
    let mut used = 0;
    for (name, expr) in exprs {
        let names = names_in(expr);
        assert!(
            !names.is_empty(),
            "{what} {name} uses no agent metric: {expr}"
        );
        for n in names {
            assert!(
                served.contains(&n),
                "{what} {name} uses {n}, which the agent does not serve: {expr}"
            );
            used += 1;
        }
    }
    assert!(used > 0, "{what}: no metric used");
}

#[test]
fn names_in_finds_whole_metric_names_only() {
    assert_eq!(
        names_in(r#"rate(kubeproxy_a_total{x="sliceway_not"}[5m]) / sliceway_b"#),
        ["kubeproxy_a_total", "sliceway_not", "sliceway_b"]
    );
    assert_eq!(names_in("my_sliceway_x + 1"), Vec::<String>::new());
}

#[test]
fn the_alert_rules_parse_and_use_only_served_metrics() {
    let rules: Yaml = serde_yaml_ng::from_str(&monitoring("alerts.yaml")).expect("valid YAML");
    assert!(
        rules.get("apiVersion").is_none() && rules.get("kind").is_none(),
        "a plain rule file, not a Kubernetes object"
    );
    let groups = rules["groups"].as_sequence().expect("groups");
    let mut exprs = Vec::new();
    for group in groups {
        assert!(group["name"].as_str().is_some(), "a group without a name");
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().expect("an expr");
            for key in ["summary", "description"] {
                assert!(
                    rule["annotations"][key].as_str().is_some(),
                    "{name} without {key}"
                );
            }
            let severity = rule["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("critical" | "warning" | "info")),
                "{name}: severity {severity:?}"
            );
            exprs.push((name.to_string(), expr.to_string()));
        }
    }
    check(&exprs, "alert");
}

#[test]
fn the_dashboard_parses_and_uses_only_served_metrics() {
    let dash: Json = serde_json::from_str(&monitoring("grafana-dashboard.json")).expect("JSON");
    assert!(dash["title"].is_string() && dash["uid"].is_string());
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("a panel title");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} without targets");
        for t in targets {
            exprs.push((
                title.to_string(),
                t["expr"].as_str().expect("an expr").to_string(),
            ));
        }
    }
    for var in dash["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = var["query"]["query"].as_str() {
            exprs.push((var["name"].to_string(), q.to_string()));
        }
    }
    check(&exprs, "panel");
}

//! Local mode source: a directory of ordinary Kubernetes YAML.
//!
//! Every `*.yaml` / `*.yml` file is read, multi-document files and `v1 List` objects
//! too. Services (v1), EndpointSlices (discovery.k8s.io/v1) and Nodes (v1) are kept;
//! other kinds are not the agent's business and are passed over. A file that fails to
//! parse is reported and skipped; if it parsed before, its last good objects are kept,
//! so a half-written file never makes Services vanish.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use serde::Deserialize;

/// The objects of one directory.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
}

/// A file, or a document in it, that could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

#[derive(Debug)]
struct FileState {
    stamp: Stamp,
    objects: Objects,
    problems: Vec<Problem>,
}

/// Reads a manifest directory and re-reads only the files that changed.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
}

/// What a rescan found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Whether any file was added, changed or removed since the last scan.
    pub changed: bool,
    /// Problems found in the files that changed (old problems are not repeated).
    pub new_problems: Vec<Problem>,
}

impl ManifestDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Looks for added, changed and removed files and parses the changed ones.
    pub fn rescan(&mut self) -> std::io::Result<Scan> {
        let mut scan = Scan::default();
        let mut present = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let is_yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            );
            if !is_yaml || !path.is_file() {
                continue;
            }
            present.push(path);
        }
        let before = self.files.len();
        self.files.retain(|p, _| present.contains(p));
        scan.changed |= self.files.len() != before;
        for path in present {
            let meta = match fs::metadata(&path) {
                Ok(m) => m,
                Err(_) => continue, // removed between listing and stat: next scan sees it
            };
            let stamp = Stamp {
                modified: meta.modified().ok(),
                len: meta.len(),
            };
            if self.files.get(&path).is_some_and(|f| f.stamp == stamp) {
                continue;
            }
            scan.changed = true;
            let (objects, problems) = match fs::read_to_string(&path) {
                Ok(text) => parse_file(&path, &text),
                Err(e) => (
                    None,
                    vec![Problem {
                        file: path.clone(),
                        reason: format!("cannot read: {e}"),
                    }],
                ),
            };
            let objects = match objects {
                Some(o) => o,
                // Unparseable now: keep what the file held when it last parsed.
                None => self
                    .files
                    .get(&path)
                    .map(|f| f.objects.clone())
                    .unwrap_or_default(),
            };
            scan.new_problems.extend(problems.iter().cloned());
            self.files.insert(
                path,
                FileState {
                    stamp,
                    objects,
                    problems,
                },
            );
        }
        Ok(scan)
    }

    /// All objects of the directory, in file order.
    pub fn objects(&self) -> Objects {
        let mut all = Objects::default();
        for f in self.files.values() {
            all.services.extend(f.objects.services.iter().cloned());
            all.slices.extend(f.objects.slices.iter().cloned());
            all.nodes.extend(f.objects.nodes.iter().cloned());
        }
        all
    }

    /// Problems of the files as they are now.
    pub fn problems(&self) -> Vec<Problem> {
        self.files
            .values()
            .flat_map(|f| f.problems.iter().cloned())
            .collect()
    }
}

/// Reads a directory once.
pub fn load_dir(dir: &Path) -> std::io::Result<(Objects, Vec<Problem>)> {
    let mut m = ManifestDir::new(dir);
    m.rescan()?;
    Ok((m.objects(), m.problems()))
}

/// Parses one file. `None` when the YAML itself is broken (nothing in the file is
/// trusted then); otherwise the usable objects and a problem per unusable document.
pub fn parse_file(path: &Path, text: &str) -> (Option<Objects>, Vec<Problem>) {
    let mut objects = Objects::default();
    let mut problems = Vec::new();
    let problem = |reason: String| Problem {
        file: path.to_path_buf(),
        reason,
    };
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        match serde_yaml_ng::Value::deserialize(doc) {
            Ok(serde_yaml_ng::Value::Null) => {}
            Ok(v) => docs.push(v),
            Err(e) => return (None, vec![problem(format!("not valid YAML: {e}"))]),
        }
    }
    for (i, doc) in docs.into_iter().enumerate() {
        add_document(doc, &mut objects, &mut |reason| {
            problems.push(problem(format!("document {}: {reason}", i + 1)))
        });
    }
    (Some(objects), problems)
}

fn add_document(doc: serde_yaml_ng::Value, objects: &mut Objects, report: &mut dyn FnMut(String)) {
    let api_version = doc
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let kind = doc
        .get("kind")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let name = doc
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or("<unnamed>")
        .to_string();
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "List") => {
            let items = doc.get("items").and_then(|i| i.as_sequence()).cloned().unwrap_or_default();
            for item in items {
                add_document(item, objects, report);
            }
        }
        ("v1", "Service") => match serde_yaml_ng::from_value::<Service>(doc) {
            Ok(s) => objects.services.push(s),
            Err(e) => report(format!("Service {name}: {e}; skipped")),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => match serde_yaml_ng::from_value::<EndpointSlice>(doc) {
            Ok(s) => objects.slices.push(s),
            Err(e) => report(format!("EndpointSlice {name}: {e}; skipped")),
        },
        ("v1", "Node") => match serde_yaml_ng::from_value::<Node>(doc) {
            Ok(n) => objects.nodes.push(n),
            Err(e) => report(format!("Node {name}: {e}; skipped")),
        },
        ("", _) | (_, "") => report("no apiVersion or kind; skipped".into()),
        ("discovery.k8s.io/v1beta1", "EndpointSlice") => {
            report(format!("EndpointSlice {name}: discovery.k8s.io/v1beta1 is gone since Kubernetes 1.25, use v1; skipped"))
        }
        // Pods, Deployments, Endpoints, ...: not the agent's business.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_file_yields_each_kind() {
        let text = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
ports: [{port: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: ignored}
---
"#;
        let (objects, problems) = parse_file(Path::new("x.yaml"), text);
        let objects = objects.unwrap();
        assert_eq!(problems, vec![]);
        assert_eq!(objects.services.len(), 1);
        assert_eq!(objects.slices.len(), 1);
    }

    #[test]
    fn bad_document_is_reported_and_others_kept() {
        let text = r#"
apiVersion: v1
kind: Service
metadata: {name: bad}
spec: {ports: "not a list"}
---
apiVersion: v1
kind: Service
metadata: {name: good}
spec: {clusterIP: 10.96.0.11}
"#;
        let (objects, problems) = parse_file(Path::new("x.yaml"), text);
        assert_eq!(objects.unwrap().services.len(), 1);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].reason.contains("document 1: Service bad"),
            "{:?}",
            problems[0]
        );
    }

    #[test]
    fn broken_yaml_keeps_last_good_objects() {
        let dir = std::env::temp_dir().join(format!("sliceway-local-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("svc.yaml");
        fs::write(
            &file,
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n",
        )
        .unwrap();
        let mut m = ManifestDir::new(&dir);
        assert!(m.rescan().unwrap().changed);
        assert_eq!(m.objects().services.len(), 1);
        assert!(!m.rescan().unwrap().changed);
        fs::write(
            &file,
            "apiVersion: v1\nkind: Service\nmetadata: {name: a\n  spec: [",
        )
        .unwrap();
        let scan = m.rescan().unwrap();
        assert!(scan.changed);
        assert_eq!(scan.new_problems.len(), 1);
        assert!(scan.new_problems[0].reason.starts_with("not valid YAML"));
        assert_eq!(m.objects().services.len(), 1, "last good objects kept");
        fs::remove_file(&file).unwrap();
        assert!(m.rescan().unwrap().changed);
        assert_eq!(m.objects().services.len(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }
}

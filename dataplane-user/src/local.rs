//! Local mode source: a directory of ordinary Kubernetes YAML.
//!
//! Every `*.yaml` / `*.yml` file is read, multi-document files and `v1 List` objects
//! too. Services (v1), EndpointSlices (discovery.k8s.io/v1) and Nodes (v1) are kept;
//! other kinds are not the agent's business and are passed over. A file that fails to
//! parse is reported and skipped; if it parsed before, its last good objects are kept,
//! so a half-written file never makes Services vanish.
//!
//! Documents are parsed one at a time and each object is turned into the agent's model
//! straight away, so a large file never exists as a tree of YAML values or of API
//! objects. A rescan hands the objects of changed files to the incremental compiler,
//! which keeps them and notices which ones actually differ.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use serde::Deserialize;

use crate::{
    compiler::Incremental,
    model::{NodeInfo, Origin, ServiceId, ServiceInfo, SliceId, SliceInfo},
};

/// The objects of one directory.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
}

/// The objects of one file in the agent's model (of Nodes, only name and zone: the
/// compiler reads the zone of its own).
#[derive(Clone, Debug, Default)]
pub struct ModelObjects {
    pub services: Vec<ServiceInfo>,
    pub slices: Vec<SliceInfo>,
    pub nodes: Vec<NodeInfo>,
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

/// A file as last read: the objects it gave (held by the compiler) and its problems.
#[derive(Debug)]
struct FileState {
    stamp: Stamp,
    services: Vec<ServiceId>,
    slices: Vec<SliceId>,
    nodes: Vec<NodeInfo>,
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

/// The `*.yaml` and `*.yml` files of a directory, sorted.
fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut present = Vec::new();
    for entry in fs::read_dir(dir)? {
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
    present.sort();
    Ok(present)
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

    /// Looks for added, changed and removed files, parses the changed ones and brings
    /// `compiler` to the directory's objects: those of removed files go, those of
    /// changed files are put (the compiler tells which really differ), and a file that
    /// no longer parses keeps the objects it last gave.
    pub fn rescan(&mut self, compiler: &mut Incremental) -> std::io::Result<Scan> {
        let mut scan = Scan::default();
        let present = yaml_files(&self.dir)?;
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| present.binary_search(p).is_err())
            .cloned()
            .collect();
        for path in gone {
            let state = self.files.remove(&path).expect("listed");
            for id in &state.services {
                compiler.remove_service(id);
            }
            for id in &state.slices {
                compiler.remove_slice(id);
            }
            scan.changed = true;
        }
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
            let (objects, problems) = match fs::read(&path) {
                Ok(bytes) => {
                    let (text, mut screened) = screen(&path, &bytes);
                    let (objects, mut parsed) = parse_file_model(&path, &text);
                    screened.append(&mut parsed);
                    (objects, screened)
                }
                Err(e) => (
                    None,
                    vec![Problem {
                        file: path.clone(),
                        reason: format!("cannot read: {e}"),
                    }],
                ),
            };
            scan.new_problems.extend(problems.iter().cloned());
            let (services, slices, nodes) = match (objects, self.files.remove(&path)) {
                (Some(objects), old) => {
                    let nodes = objects.nodes.clone();
                    let (services, slices) = put_file(&path, objects, old.as_ref(), compiler);
                    (services, slices, nodes)
                }
                // Unparseable now: keep what the file held when it last parsed.
                (None, Some(old)) => (old.services, old.slices, old.nodes),
                (None, None) => (Vec::new(), Vec::new(), Vec::new()),
            };
            self.files.insert(
                path,
                FileState {
                    stamp,
                    services,
                    slices,
                    nodes,
                    problems,
                },
            );
        }
        let own = compiler.options().node_name.clone();
        compiler.set_zone(own.and_then(|name| self.node_zone(&name)));
        Ok(scan)
    }

    /// The zone of the Node named `name`: the first such Node in file order.
    pub fn node_zone(&self, name: &str) -> Option<String> {
        self.files
            .values()
            .flat_map(|f| &f.nodes)
            .find(|n| n.name == name)
            .and_then(|n| n.zone.clone())
    }

    /// Problems of the files as they are now.
    pub fn problems(&self) -> Vec<Problem> {
        self.files
            .values()
            .flat_map(|f| f.problems.iter().cloned())
            .collect()
    }
}

/// Puts the objects of a file that parsed into `compiler` and removes those the file
/// held before and no longer does. Returns the identities of the file's objects.
/// Where the next object named `key` in `file` comes from: the file, and how many of
/// that name came before it there.
fn next_origin<K: std::hash::Hash + Eq>(
    seen: &mut HashMap<K, u32>,
    key: K,
    file: &Arc<Path>,
) -> Origin {
    let n = seen.entry(key).or_default();
    let origin = Origin {
        file: Some(file.clone()),
        occurrence: *n,
    };
    *n += 1;
    origin
}

fn put_file(
    path: &Path,
    objects: ModelObjects,
    old: Option<&FileState>,
    compiler: &mut Incremental,
) -> (Vec<ServiceId>, Vec<SliceId>) {
    let file: Arc<Path> = Arc::from(path);
    let mut seen: HashMap<(String, String), u32> = HashMap::new();
    let mut services = Vec::with_capacity(objects.services.len());
    for svc in objects.services {
        let mut id = ServiceId::of(&svc, Origin::default());
        id.origin = next_origin(&mut seen, (id.namespace.clone(), id.name.clone()), &file);
        compiler.put_service(id.origin.clone(), svc);
        services.push(id);
    }
    let mut seen: HashMap<(Option<String>, Option<String>), u32> = HashMap::new();
    let mut slices = Vec::with_capacity(objects.slices.len());
    for slice in objects.slices {
        let mut id = SliceId::of(&slice, Origin::default());
        id.origin = next_origin(&mut seen, (id.namespace.clone(), id.name.clone()), &file);
        compiler.put_slice(id.origin.clone(), slice);
        slices.push(id);
    }
    if let Some(old) = old {
        let now: BTreeSet<&ServiceId> = services.iter().collect();
        for id in old.services.iter().filter(|id| !now.contains(id)) {
            compiler.remove_service(id);
        }
        let now: BTreeSet<&SliceId> = slices.iter().collect();
        for id in old.slices.iter().filter(|id| !now.contains(id)) {
            compiler.remove_slice(id);
        }
    }
    (services, slices)
}

/// Reads a directory once, as API objects.
pub fn load_dir(dir: &Path) -> std::io::Result<(Objects, Vec<Problem>)> {
    let mut all = Objects::default();
    let mut problems = Vec::new();
    for path in yaml_files(dir)? {
        let (objects, p) = match fs::read(&path) {
            Ok(bytes) => {
                let (text, mut screened) = screen(&path, &bytes);
                let (objects, mut parsed) = parse_file(&path, &text);
                screened.append(&mut parsed);
                (objects, screened)
            }
            Err(e) => (
                None,
                vec![Problem {
                    file: path.clone(),
                    reason: format!("cannot read: {e}"),
                }],
            ),
        };
        problems.extend(p);
        if let Some(o) = objects {
            all.services.extend(o.services);
            all.slices.extend(o.slices);
            all.nodes.extend(o.nodes);
        }
    }
    Ok((all, problems))
}

/// Bytes of one document at most: a Service or an EndpointSlice (at most 1,000
/// endpoints by API validation) is far smaller.
pub const MAX_DOCUMENT_BYTES: usize = 4 << 20;
/// Nesting of one document at most (flow collections and block sequences on a line);
/// Kubernetes objects nest a dozen levels.
pub const MAX_NESTING: usize = 64;

/// Screens a file's bytes before any YAML parsing, which can cost the square of a
/// document's size on deep nesting: a byte-order mark at the start is dropped (as
/// kubectl does), and each document that is not UTF-8, is larger than
/// [`MAX_DOCUMENT_BYTES`] or nests deeper than [`MAX_NESTING`] is left out with a
/// problem naming it (the others are kept). Linear in the file's size.
pub fn screen(path: &Path, bytes: &[u8]) -> (String, Vec<Problem>) {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let mut out = String::with_capacity(bytes.len());
    let mut problems = Vec::new();
    for (n, (start, doc)) in documents(bytes).into_iter().enumerate() {
        let line = 1 + bytes[..start].iter().filter(|b| **b == b'\n').count();
        let reason = match std::str::from_utf8(doc) {
            Err(e) => {
                let at = start + e.valid_up_to();
                let line = 1 + bytes[..at].iter().filter(|b| **b == b'\n').count();
                Some(format!(
                    "byte 0x{:02x} on line {line} is not UTF-8",
                    bytes[at]
                ))
            }
            Ok(_) if doc.len() > MAX_DOCUMENT_BYTES => Some(format!(
                "{} bytes, more than the {MAX_DOCUMENT_BYTES} a document may have",
                doc.len()
            )),
            Ok(text) if nesting(text) > MAX_NESTING => {
                Some(format!("nested deeper than {MAX_NESTING} levels"))
            }
            Ok(text) => {
                out.push_str(text);
                None
            }
        };
        if let Some(reason) = reason {
            problems.push(Problem {
                file: path.to_path_buf(),
                reason: format!(
                    "the document starting on line {line} (document {}): {reason}; skipped",
                    n + 1
                ),
            });
            // Keep the separator so the documents around it stay apart.
            if doc.starts_with(b"---") {
                out.push_str("---\n");
            }
        }
    }
    (out, problems)
}

/// The documents of a file: (offset, bytes), split before every line that starts
/// with `---` (each document keeps its separator line).
fn documents(bytes: &[u8]) -> Vec<(usize, &[u8])> {
    let mut starts = vec![0];
    let mut at = 0;
    while at < bytes.len() {
        let end = bytes[at..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |i| at + i + 1);
        if at > 0 && bytes[at..end].starts_with(b"---") {
            starts.push(at);
        }
        at = end;
    }
    starts.push(bytes.len());
    starts
        .windows(2)
        .map(|w| (w[0], &bytes[w[0]..w[1]]))
        .filter(|(_, d)| !d.is_empty())
        .collect()
}

/// How deep a document nests, counted cheaply: flow collections (`[`, `{`) open
/// outside quotes and comments, plus block sequence entries (`- - -`) that begin one
/// line. Block mappings need one more column of indentation per level, so the
/// document's size bounds them already.
fn nesting(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote: Option<char> = None;
    for line in text.lines() {
        let dashes = line
            .trim_start()
            .split_inclusive("- ")
            .take_while(|p| *p == "- ")
            .count();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (Some('"'), '\\') => {
                    chars.next();
                }
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') => break,
                (None, '[' | '{') => {
                    depth += 1;
                    deepest = deepest.max(depth + dashes);
                }
                (None, ']' | '}') => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        // A quote never spans lines in Kubernetes YAML worth reading; a stray one must
        // not blind the count for the rest of the document.
        quote = None;
        deepest = deepest.max(depth + dashes);
    }
    deepest
}

/// A usable object of a document (boxed: API objects are large and of unequal sizes).
enum Found {
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
    Node(Box<Node>),
}

/// Parses one file. `None` when the YAML itself is broken (nothing in the file is
/// trusted then); otherwise the usable objects and a problem per unusable document.
pub fn parse_file(path: &Path, text: &str) -> (Option<Objects>, Vec<Problem>) {
    let mut objects = Objects::default();
    let problems = parse_documents(path, text, &mut |found| match found {
        Found::Service(s) => objects.services.push(*s),
        Found::Slice(s) => objects.slices.push(*s),
        Found::Node(n) => objects.nodes.push(*n),
    });
    match problems {
        Ok(problems) => (Some(objects), problems),
        Err(problem) => (None, vec![problem]),
    }
}

/// [`parse_file`], each object turned into the agent's model as soon as it is read.
pub fn parse_file_model(path: &Path, text: &str) -> (Option<ModelObjects>, Vec<Problem>) {
    let mut objects = ModelObjects::default();
    let problems = parse_documents(path, text, &mut |found| match found {
        Found::Service(s) => objects.services.push(ServiceInfo::from(&*s)),
        Found::Slice(s) => objects.slices.push(SliceInfo::from(&*s)),
        Found::Node(n) => objects.nodes.push(NodeInfo::from(&*n)),
    });
    match problems {
        Ok(problems) => (Some(objects), problems),
        Err(problem) => (None, vec![problem]),
    }
}

/// Reads the documents of a file one at a time, giving each usable object to `found`.
/// The problems of unusable documents, or the one problem of broken YAML.
fn parse_documents(
    path: &Path,
    text: &str,
    found: &mut dyn FnMut(Found),
) -> Result<Vec<Problem>, Problem> {
    let mut problems = Vec::new();
    let problem = |reason: String| Problem {
        file: path.to_path_buf(),
        reason,
    };
    let mut n = 0;
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        match serde_yaml_ng::Value::deserialize(doc) {
            Ok(serde_yaml_ng::Value::Null) => {}
            Ok(v) => {
                n += 1;
                add_document(v, found, &mut |reason| {
                    problems.push(problem(format!("document {n}: {reason}")))
                });
            }
            Err(e) => return Err(problem(format!("not valid YAML: {e}"))),
        }
    }
    Ok(problems)
}

fn add_document(
    mut doc: serde_yaml_ng::Value,
    found: &mut dyn FnMut(Found),
    report: &mut dyn FnMut(String),
) {
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
            let items = match doc.get_mut("items").map(std::mem::take) {
                Some(serde_yaml_ng::Value::Sequence(items)) => items,
                _ => Vec::new(),
            };
            for item in items {
                add_document(item, found, report);
            }
        }
        ("v1", "Service") => match serde_yaml_ng::from_value::<Service>(doc) {
            Ok(s) => found(Found::Service(Box::new(s))),
            Err(e) => report(format!("Service {name}: {e}; skipped")),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            match serde_yaml_ng::from_value::<EndpointSlice>(doc) {
                Ok(s) => found(Found::Slice(Box::new(s))),
                Err(e) => report(format!("EndpointSlice {name}: {e}; skipped")),
            }
        }
        ("v1", "Node") => match serde_yaml_ng::from_value::<Node>(doc) {
            Ok(n) => found(Found::Node(Box::new(n))),
            Err(e) => report(format!("Node {name}: {e}; skipped")),
        },
        ("", _) | (_, "") => report("no apiVersion or kind; skipped".into()),
        ("discovery.k8s.io/v1beta1", "EndpointSlice") => {
            report(format!("EndpointSlice {name}: discovery.k8s.io/v1beta1 is gone since Kubernetes 1.25, use v1; skipped"))
        }
        // A kind the agent reads under another API version: said, not ignored.
        (_, "Service" | "Node") => report(format!(
            "{kind} {name}: apiVersion {api_version:?} is not v1; skipped"
        )),
        (_, "EndpointSlice") => report(format!(
            "EndpointSlice {name}: apiVersion {api_version:?} is not discovery.k8s.io/v1; skipped"
        )),
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

    const GOOD: &str =
        "apiVersion: v1\nkind: Service\nmetadata: {name: good}\nspec: {clusterIP: 10.96.0.1}\n";

    #[test]
    fn a_byte_order_mark_is_accepted() {
        let bytes = [b"\xef\xbb\xbf".as_slice(), GOOD.as_bytes()].concat();
        let (text, problems) = screen(Path::new("f.yaml"), &bytes);
        assert!(problems.is_empty(), "{problems:?}");
        let (objects, problems) = parse_file(Path::new("f.yaml"), &text);
        assert!(problems.is_empty());
        assert_eq!(objects.unwrap().services.len(), 1);
    }

    #[test]
    fn a_document_that_is_not_utf8_is_skipped_alone_with_its_line() {
        let bad = b"---\napiVersion: v1\nkind: Service\n# caf\xe9\nmetadata: {name: bad}\n";
        let bytes = [
            GOOD.as_bytes(),
            bad.as_slice(),
            b"---\n",
            GOOD.replace("good", "also").as_bytes(),
        ]
        .concat();
        let (text, problems) = screen(Path::new("f.yaml"), &bytes);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0]
                .reason
                .contains("byte 0xe9 on line 8 is not UTF-8"),
            "{problems:?}"
        );
        let (objects, problems) = parse_file(Path::new("f.yaml"), &text);
        assert!(problems.is_empty(), "{problems:?}");
        let names: Vec<_> = objects
            .unwrap()
            .services
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["good", "also"]);
    }

    #[test]
    fn deep_nesting_and_huge_documents_never_reach_the_parser() {
        // 60,000 levels of flow mappings in 300 KB: once 20 s of parsing.
        let deep = format!("a: {}1{}\n", "{a: ".repeat(60_000), "}".repeat(60_000));
        // 60,000 levels of block sequences on one line.
        let dashes = format!("a:\n{}1\n", "- ".repeat(60_000));
        let huge = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: huge, annotations: {{x: \"{}\"}}}}\n",
            "x".repeat(MAX_DOCUMENT_BYTES)
        );
        for doc in [deep, dashes, huge] {
            let bytes = format!("{GOOD}---\n{doc}");
            let (text, problems) = screen(Path::new("f.yaml"), bytes.as_bytes());
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].reason.contains("(document 2)"), "{problems:?}");
            // Only the good document is left for the parser.
            assert!(text.len() < GOOD.len() + 8, "{} bytes left", text.len());
            let (objects, _) = parse_file(Path::new("f.yaml"), &text);
            assert_eq!(objects.unwrap().services.len(), 1);
        }
    }

    #[test]
    fn a_known_kind_under_another_api_version_is_reported() {
        let (objects, problems) = parse_file(
            Path::new("f.yaml"),
            "apiVersion: apps/v1\nkind: Service\nmetadata: {name: odd}\n",
        );
        assert!(objects.unwrap().services.is_empty());
        assert_eq!(problems.len(), 1);
        assert!(problems[0]
            .reason
            .contains("apiVersion \"apps/v1\" is not v1"));
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
        let mut c = Incremental::default();
        assert!(m.rescan(&mut c).unwrap().changed);
        assert_eq!(c.service_count(), 1);
        assert!(!m.rescan(&mut c).unwrap().changed);
        fs::write(
            &file,
            "apiVersion: v1\nkind: Service\nmetadata: {name: a\n  spec: [",
        )
        .unwrap();
        let scan = m.rescan(&mut c).unwrap();
        assert!(scan.changed);
        assert_eq!(scan.new_problems.len(), 1);
        assert!(scan.new_problems[0].reason.starts_with("not valid YAML"));
        assert_eq!(c.service_count(), 1, "last good objects kept");
        fs::remove_file(&file).unwrap();
        assert!(m.rescan(&mut c).unwrap().changed);
        assert_eq!(c.service_count(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The own Node's zone comes from the directory: topology hints are read against
    /// it, and a relabelled or removed Node recompiles the Services.
    #[test]
    fn the_own_nodes_zone_filters_hinted_endpoints() {
        let dir = std::env::temp_dir().join(format!("sliceway-local-zone-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("svc.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec: {clusterIP: 10.96.0.1, ports: [{name: http, port: 80}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n- {addresses: [10.244.0.1], hints: {forZones: [{name: zone-a}]}}\n- {addresses: [10.244.0.2], hints: {forZones: [{name: zone-b}]}}\n",
        )
        .unwrap();
        let node = |zone: &str| {
            format!("apiVersion: v1\nkind: Node\nmetadata: {{name: node-1, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n---\napiVersion: v1\nkind: Node\nmetadata: {{name: node-2, labels: {{topology.kubernetes.io/zone: zone-b}}}}\n")
        };
        fs::write(dir.join("node.yaml"), node("zone-a")).unwrap();
        let mut m = ManifestDir::new(&dir);
        let mut c = Incremental::new(crate::compiler::Options {
            node_name: Some("node-1".into()),
            ..Default::default()
        });
        let backends = |m: &mut ManifestDir, c: &mut Incremental| -> Vec<u32> {
            m.rescan(c).unwrap();
            c.compile();
            let f = c
                .frontends()
                .iter()
                .find(|(k, _)| !crate::compiler::is_clusterip_marker(k))
                .expect("one frontend")
                .1;
            f.backends
                .iter()
                .map(|b| u32::from_be(b.addr_be) & 0xff)
                .collect()
        };
        assert_eq!(backends(&mut m, &mut c), [1], "zone-a");
        // A different size too, so the rescan sees the file changed at once.
        fs::write(dir.join("node.yaml"), node("zone-b") + "# moved\n").unwrap();
        assert_eq!(backends(&mut m, &mut c), [2], "zone-b");
        fs::remove_file(dir.join("node.yaml")).unwrap();
        assert_eq!(
            backends(&mut m, &mut c),
            [1, 2],
            "no Node: no zone, no filtering"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rewritten_file_changes_only_what_differs() {
        let dir = std::env::temp_dir().join(format!("sliceway-local-diff-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("svc.yaml");
        let doc = |name: &str, ip: &str| {
            format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n")
        };
        fs::write(&file, doc("a", "10.96.0.1") + &doc("b", "10.96.0.2")).unwrap();
        let mut m = ManifestDir::new(&dir);
        let mut c = Incremental::default();
        m.rescan(&mut c).unwrap();
        // A frontend and a ClusterIP marker each.
        assert_eq!(c.compile().len(), 4);
        // b moves, a stays, c is new (written longer, so the stamp differs).
        fs::write(
            &file,
            doc("a", "10.96.0.1") + &doc("b", "10.96.0.3") + &doc("c", "10.96.0.4"),
        )
        .unwrap();
        assert!(m.rescan(&mut c).unwrap().changed);
        assert_eq!(
            c.compile().len(),
            6,
            "b's old and new frontends and markers, c's"
        );
        assert_eq!(c.service_count(), 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn list_items_and_document_numbers() {
        let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: one}
  spec: {clusterIP: 10.96.0.1}
- apiVersion: v1
  kind: Node
  metadata: {name: node-1}
---
---
kind: Service
"#;
        let (objects, problems) = parse_file_model(Path::new("x.yaml"), text);
        let objects = objects.unwrap();
        assert_eq!((objects.services.len(), objects.nodes.len()), (1, 1));
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].reason,
            "document 2: no apiVersion or kind; skipped"
        );
    }
}

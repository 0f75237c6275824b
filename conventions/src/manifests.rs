//! Reading a directory of ordinary Kubernetes YAML, the same way in both binaries.
//!
//! - [`yaml_files`]: every `*.yaml` / `*.yml` file of the directory, sorted.
//! - [`read`]: a file's bytes, screened before any YAML parsing ([`screen`]): a
//!   byte-order mark is accepted; a document that is not UTF-8, larger than
//!   [`MAX_DOCUMENT_BYTES`] or nested deeper than [`MAX_NESTING`] is left out alone,
//!   with a problem naming its line.
//! - [`objects`]: the documents of a file parsed one at a time (so a large file never
//!   exists as one tree), `v1 List` items taken as documents of their own; each
//!   object goes to the caller, which keeps the kinds it reads. YAML that does not
//!   parse makes the whole file unusable: nothing in it is trusted then.
//! - [`Files`]: the files as last read, each with what it gave when it last parsed,
//!   so a half-written file keeps its last good objects and a typo never makes
//!   objects vanish; a rescan re-reads only the files whose size or modification
//!   time changed.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use serde::Deserialize as _;

/// A file, or a document in it, that could not be used, and why. The rest is used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    /// The whole message: where in the file, the object, the field and why.
    pub reason: String,
    /// The object it is about (`Service default/web`), when one was read.
    pub object: Option<String>,
    /// The field at fault (`metadata.name`), when one is known.
    pub field: Option<String>,
    /// A short, stable name of the reason, for metrics: `unreadable`, `not_utf8`,
    /// `document_too_large`, `nested_too_deep`, `too_many_documents`,
    /// `invalid_yaml`, `no_kind`, `invalid_object` (refused by
    /// [`crate::validate`]) or `unusable_object` (refused by the reader's caller).
    pub code: &'static str,
}

impl Problem {
    fn file(path: &Path, code: &'static str, reason: String) -> Self {
        Self {
            file: path.to_path_buf(),
            reason,
            code,
            ..Self::default()
        }
    }
}

/// The `*.yaml` and `*.yml` files of a directory, sorted.
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
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

/// A file's text after [`screen`], with the problems found; `None` when it cannot be
/// read at all.
pub fn read(path: &Path) -> (Option<String>, Vec<Problem>) {
    match fs::read(path) {
        Ok(bytes) => {
            let (text, problems) = screen(path, &bytes);
            (Some(text), problems)
        }
        Err(e) => (
            None,
            vec![Problem::file(
                path,
                "unreadable",
                format!("cannot read: {e}"),
            )],
        ),
    }
}

/// Bytes of one document at most: a Service or an EndpointSlice (at most 1,000
/// endpoints by API validation) is far smaller.
pub const MAX_DOCUMENT_BYTES: usize = 4 << 20;
/// Nesting of one document at most (flow collections and block sequences on a line);
/// Kubernetes objects nest a dozen levels.
pub const MAX_NESTING: usize = 64;
/// Documents of one file at most; the rest of a file past them is left out.
pub const MAX_DOCUMENTS: usize = 100_000;

/// What screening a file cost and let through, counted (not timed), so tests can
/// bound the work a hostile file causes: everything past screening is at most
/// linear in `parsed_bytes` times `deepest`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Bytes of the file, all looked at once by the screening (linear).
    pub bytes: usize,
    /// Documents found.
    pub documents: usize,
    /// Bytes handed on to the YAML parser.
    pub parsed_bytes: usize,
    /// The deepest nesting among the documents handed on.
    pub deepest: usize,
}

/// Screens a file's bytes before any YAML parsing, which can cost the square of a
/// document's size on deep nesting: a byte-order mark at the start is dropped (as
/// kubectl does), and each document that is not UTF-8, is larger than
/// [`MAX_DOCUMENT_BYTES`] or nests deeper than [`MAX_NESTING`] is left out with a
/// problem naming it (the others are kept). Linear in the file's size.
pub fn screen(path: &Path, bytes: &[u8]) -> (String, Vec<Problem>) {
    let (text, problems, _) = screen_counted(path, bytes);
    (text, problems)
}

/// [`screen`], with what it cost and let through. At most [`MAX_DOCUMENTS`]
/// documents are kept; the rest of the file is left out with one problem.
pub fn screen_counted(path: &Path, bytes: &[u8]) -> (String, Vec<Problem>, Cost) {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let mut out = String::with_capacity(bytes.len());
    let mut problems = Vec::new();
    let docs = documents(bytes);
    let mut cost = Cost {
        bytes: bytes.len(),
        documents: docs.len(),
        ..Cost::default()
    };
    // Lines counted once, in order, not from the start for every document.
    let (mut line, mut counted) = (1, 0);
    for (n, (start, doc)) in docs.into_iter().enumerate() {
        line += bytes[counted..start]
            .iter()
            .filter(|b| **b == b'\n')
            .count();
        counted = start;
        if n == MAX_DOCUMENTS {
            problems.push(Problem::file(
                path,
                "too_many_documents",
                format!(
                    "more than {MAX_DOCUMENTS} documents: the rest of the file from line {line} is skipped"
                ),
            ));
            break;
        }
        let mut depth = 0;
        let reason = match std::str::from_utf8(doc) {
            Err(e) => {
                let at = start + e.valid_up_to();
                let line = line + bytes[start..at].iter().filter(|b| **b == b'\n').count();
                Some((
                    "not_utf8",
                    format!("byte 0x{:02x} on line {line} is not UTF-8", bytes[at]),
                ))
            }
            Ok(_) if doc.len() > MAX_DOCUMENT_BYTES => Some((
                "document_too_large",
                format!(
                    "{} bytes, more than the {MAX_DOCUMENT_BYTES} a document may have",
                    doc.len()
                ),
            )),
            Ok(text)
                if {
                    depth = nesting(text);
                    depth > MAX_NESTING
                } =>
            {
                Some((
                    "nested_too_deep",
                    format!("nested deeper than {MAX_NESTING} levels"),
                ))
            }
            Ok(text) => {
                out.push_str(text);
                cost.parsed_bytes += text.len();
                cost.deepest = cost.deepest.max(depth);
                None
            }
        };
        if let Some((code, reason)) = reason {
            problems.push(Problem::file(
                path,
                code,
                format!(
                    "the document starting on line {line} (document {}): {reason}; skipped",
                    n + 1
                ),
            ));
            // Keep the separator so the documents around it stay apart.
            if doc.starts_with(b"---") {
                out.push_str("---\n");
            }
        }
    }
    (out, problems, cost)
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

/// One object of a manifest file: what every reader looks at first, and the rest.
#[derive(Clone, Debug)]
pub struct Object {
    pub api_version: String,
    pub kind: String,
    /// `metadata.name`, or `<unnamed>`.
    pub name: String,
    pub value: serde_yaml_ng::Value,
    /// Which document of the file it is (from 1), and which item of a `v1 List`.
    pub document: usize,
    pub item: Option<usize>,
}

impl Object {
    /// Where it stands in its file, as problems name it: `document 2` or
    /// `document 2, List item 3`.
    pub fn place(&self) -> String {
        place(self.document, self.item)
    }

    /// The object as a typed API object.
    pub fn typed<T: serde::de::DeserializeOwned>(self) -> Result<T, serde_yaml_ng::Error> {
        serde_yaml_ng::from_value(self.value)
    }
}

fn place(document: usize, item: Option<usize>) -> String {
    match item {
        None => format!("document {document}"),
        Some(i) => format!("document {document}, List item {i}"),
    }
}

/// What [`objects`] read of a file.
#[derive(Debug, Default)]
pub struct Read {
    /// Documents in the file (a `v1 List` is one).
    pub documents: usize,
    /// Problems of single documents; the other documents were read.
    pub problems: Vec<Problem>,
    /// Nodes (mappings, sequences, scalars) of the parsed documents, counted: what
    /// reading the file held in memory at most, a document at a time.
    pub nodes: usize,
}

/// Why an object was not handed on.
struct Refusal {
    object: Option<String>,
    field: Option<String>,
    code: &'static str,
    reason: String,
}

/// Nodes of a parsed document (its depth is bounded by the parser's recursion limit).
fn nodes(v: &serde_yaml_ng::Value) -> usize {
    use serde_yaml_ng::Value;
    1 + match v {
        Value::Sequence(s) => s.iter().map(nodes).sum(),
        Value::Mapping(m) => m.iter().map(|(k, v)| nodes(k) + nodes(v)).sum(),
        Value::Tagged(t) => nodes(&t.value),
        _ => 0,
    }
}

/// Reads the documents of a file one at a time and gives each object to `each`
/// (the items of a `v1 List` one by one). An object of a kind the binaries read
/// passes [`crate::validate::object`] first (the API server's rules). A reason
/// `each` returns, a refused object, or a document without `apiVersion` or `kind`,
/// becomes a problem naming the document (and the List item), the object and the
/// field; the other objects are still read. `Err` when the YAML itself is broken:
/// nothing in the file is trusted then, and what `each` was given before must be
/// dropped.
pub fn objects(
    path: &Path,
    text: &str,
    each: &mut dyn FnMut(Object) -> Result<(), String>,
) -> Result<Read, Problem> {
    let mut problems = Vec::new();
    let mut n = 0;
    let mut counted = 0;
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        match serde_yaml_ng::Value::deserialize(doc) {
            Ok(serde_yaml_ng::Value::Null) => {}
            Ok(v) => {
                n += 1;
                counted += nodes(&v);
                object(v, n, each, &mut |item, refusal| {
                    problems.push(Problem {
                        file: path.to_path_buf(),
                        reason: format!("{}: {}", place(n, item), refusal.reason),
                        object: refusal.object,
                        field: refusal.field,
                        code: refusal.code,
                    })
                });
            }
            Err(e) => {
                return Err(Problem::file(
                    path,
                    "invalid_yaml",
                    format!("not valid YAML: {e}"),
                ))
            }
        }
    }
    Ok(Read {
        documents: n,
        problems,
        nodes: counted,
    })
}

/// One document: a `v1 List`'s items each, or the object itself.
fn object(
    mut doc: serde_yaml_ng::Value,
    document: usize,
    each: &mut dyn FnMut(Object) -> Result<(), String>,
    report: &mut dyn FnMut(Option<usize>, Refusal),
) {
    let field = |doc: &serde_yaml_ng::Value, name: &str| {
        doc.get(name)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let api_version = field(&doc, "apiVersion");
    let kind = field(&doc, "kind");
    if (api_version.as_str(), kind.as_str()) == ("v1", "List") {
        let items = match doc.get_mut("items").map(std::mem::take) {
            Some(serde_yaml_ng::Value::Sequence(items)) => items,
            _ => Vec::new(),
        };
        for (i, item) in items.into_iter().enumerate() {
            let api_version = field(&item, "apiVersion");
            let kind = field(&item, "kind");
            if let Err(reason) = take(api_version, kind, item, (document, Some(i + 1)), each) {
                report(Some(i + 1), reason);
            }
        }
        return;
    }
    if let Err(reason) = take(api_version, kind, doc, (document, None), each) {
        report(None, reason);
    }
}

fn take(
    api_version: String,
    kind: String,
    value: serde_yaml_ng::Value,
    (document, item): (usize, Option<usize>),
    each: &mut dyn FnMut(Object) -> Result<(), String>,
) -> Result<(), Refusal> {
    if api_version.is_empty() || kind.is_empty() {
        return Err(Refusal {
            object: None,
            field: Some(
                if api_version.is_empty() {
                    "apiVersion"
                } else {
                    "kind"
                }
                .into(),
            ),
            code: "no_kind",
            reason: "no apiVersion or kind; skipped".into(),
        });
    }
    let meta = value.get("metadata");
    let text = |field: &str| meta.and_then(|m| m.get(field)).and_then(|n| n.as_str());
    let name = text("name").unwrap_or("<unnamed>").to_string();
    // As problems name it; the namespace only when given.
    let object = match text("namespace") {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    };
    if let Err(invalid) = crate::validate::object(&kind, &value) {
        return Err(Refusal {
            reason: format!("{object}: {}: {}; skipped", invalid.field, invalid.reason),
            object: Some(object),
            field: Some(invalid.field),
            code: "invalid_object",
        });
    }
    each(Object {
        api_version,
        kind,
        name,
        value,
        document,
        item,
    })
    .map_err(|reason| Refusal {
        object: Some(object),
        field: None,
        code: "unusable_object",
        reason,
    })
}

/// When a file was last seen changed: a rescan re-reads it when either differs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

/// A file as last read: what it gave when it last parsed, and its problems now.
#[derive(Debug)]
struct FileState<T> {
    stamp: Stamp,
    kept: T,
    problems: Vec<Problem>,
}

/// What a [`Files::rescan`] found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Whether any file was added, changed or removed since the last scan.
    pub changed: bool,
    /// Problems found in the files that changed (old problems are not repeated).
    pub new_problems: Vec<Problem>,
}

/// The files of a manifest directory as last read, each with `T`, what the caller
/// kept of it when it last parsed.
#[derive(Debug)]
pub struct Files<T> {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState<T>>,
}

/// What [`Files::rescan`] asks of its caller.
pub trait Reader<T> {
    /// Reads a changed file's text (screened; see [`objects`]) and says what to keep
    /// of it; `old` is what was kept before, if the file was read before. `None`
    /// when the YAML is broken: the file keeps `old` then. Problems go to `problems`.
    fn read(
        &mut self,
        path: &Path,
        text: &str,
        old: Option<&T>,
        problems: &mut Vec<Problem>,
    ) -> Option<T>;
    /// A file that was removed, with what was kept of it.
    fn gone(&mut self, path: &Path, kept: T);
}

impl<T: Default> Files<T> {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Looks for added, changed and removed files and reads the changed ones through
    /// `reader`. A file that can no longer be read, or whose YAML is broken, keeps
    /// what it last gave.
    pub fn rescan(&mut self, reader: &mut dyn Reader<T>) -> std::io::Result<Scan> {
        let mut scan = Scan::default();
        let present = yaml_files(&self.dir)?;
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| present.binary_search(p).is_err())
            .cloned()
            .collect();
        for path in gone {
            if let Some(state) = self.files.remove(&path) {
                reader.gone(&path, state.kept);
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
            let old = self.files.remove(&path).map(|f| f.kept);
            let (text, mut problems) = read(&path);
            let new = text.and_then(|text| reader.read(&path, &text, old.as_ref(), &mut problems));
            if new.is_none() && old.is_some() {
                if let Some(last) = problems.last_mut() {
                    last.reason.push_str(" (its last good version is kept)");
                }
            }
            let kept = new.or(old).unwrap_or_default();
            scan.new_problems.extend(problems.iter().cloned());
            self.files.insert(
                path,
                FileState {
                    stamp,
                    kept,
                    problems,
                },
            );
        }
        Ok(scan)
    }

    /// What is kept of each file, in file order.
    pub fn kept(&self) -> impl Iterator<Item = (&Path, &T)> {
        self.files.iter().map(|(p, f)| (p.as_path(), &f.kept))
    }

    /// Problems of the files as they are now.
    pub fn problems(&self) -> Vec<Problem> {
        self.files
            .values()
            .flat_map(|f| f.problems.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the objects of a text, and that nothing was wrong with them.
    fn names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let read = objects(Path::new("f.yaml"), text, &mut |o| {
            names.push(o.name);
            Ok(())
        })
        .expect("valid YAML");
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        names
    }

    const GOOD: &str =
        "apiVersion: v1\nkind: Service\nmetadata: {name: good}\nspec: {clusterIP: 10.96.0.1}\n";

    #[test]
    fn a_byte_order_mark_is_accepted() {
        let bytes = [b"\xef\xbb\xbf".as_slice(), GOOD.as_bytes()].concat();
        let (text, problems) = screen(Path::new("f.yaml"), &bytes);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(names(&text), ["good"]);
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
        assert_eq!(names(&text), ["good", "also"]);
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
            assert_eq!(names(&text), ["good"]);
        }
    }

    #[test]
    fn list_items_are_objects_and_problems_name_document_and_item() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: one}}\n- {kind: Service}\n---\n---\nkind: Service\n";
        let mut names = Vec::new();
        let mut places = Vec::new();
        let read = objects(Path::new("f.yaml"), text, &mut |o| {
            places.push(o.place());
            names.push(o.name);
            Ok(())
        })
        .unwrap();
        assert_eq!(names, ["one"]);
        assert_eq!(places, ["document 1, List item 1"]);
        assert_eq!(read.documents, 2);
        let reasons: Vec<&str> = read.problems.iter().map(|p| p.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "document 1, List item 2: no apiVersion or kind; skipped",
                "document 2: no apiVersion or kind; skipped"
            ]
        );
    }

    /// Issue 19: an object the API server would refuse is refused alone, named with
    /// its field; what reading cost is counted.
    #[test]
    fn refused_objects_name_their_field_and_reading_is_counted() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a/b}}\n- {apiVersion: v1, kind: Service, metadata: {name: one}}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: two, namespace: x}\nspec: {ports: [{name: p}]}\n";
        let (text, problems, cost) = screen_counted(Path::new("f.yaml"), text.as_bytes());
        assert!(problems.is_empty());
        assert_eq!((cost.documents, cost.parsed_bytes), (2, text.len()));
        let mut names = Vec::new();
        let read = objects(Path::new("f.yaml"), &text, &mut |o| {
            names.push(o.name);
            Ok(())
        })
        .unwrap();
        assert_eq!(names, ["one"]);
        let fields: Vec<_> = read
            .problems
            .iter()
            .map(|p| (p.object.as_deref(), p.field.as_deref()))
            .collect();
        assert_eq!(
            fields,
            [
                (Some("Service a/b"), Some("metadata.name")),
                (Some("Service x/two"), Some("spec.ports[0].port")),
            ]
        );
        assert!(
            read.problems[0]
                .reason
                .starts_with("document 1, List item 1: Service a/b: metadata.name: "),
            "{:?}",
            read.problems
        );
        assert!(read.nodes > 10 && read.nodes < text.len(), "{}", read.nodes);
    }

    #[test]
    fn broken_yaml_makes_the_whole_file_unusable() {
        let err = objects(Path::new("f.yaml"), "a: [\n", &mut |_| Ok(())).unwrap_err();
        assert!(err.reason.starts_with("not valid YAML"), "{err:?}");
    }
}

//! Reading a directory of ordinary Kubernetes YAML, the same way in both binaries.
//!
//! - [`yaml_files`]: every `*.yaml` / `*.yml` file of the directory, sorted.
//! - [`read_from`] (and [`read_file`], [`objects`]): a file streamed a document at a
//!   time: split at `---` lines as it is read, each document screened before any
//!   YAML parsing (a byte-order mark is accepted; a document that is not UTF-8,
//!   larger than [`MAX_DOCUMENT_BYTES`], nested deeper than [`MAX_NESTING`], with
//!   more than [`MAX_ALIASES`] aliases or whose aliases expand past [`max_nodes`] is
//!   left out alone, with a problem naming its line), then parsed, its objects
//!   (`v1 List` items each) handed to the caller, which keeps the kinds it reads,
//!   and dropped before the next is read. YAML that does not parse makes the whole
//!   file unusable: nothing in it is trusted then.
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
    /// `document_too_large`, `nested_too_deep`, `too_many_aliases`,
    /// `too_many_nodes`, `too_many_documents`, `invalid_yaml`, `no_kind`,
    /// `invalid_object` (refused by [`crate::validate`]), `unusable_object`
    /// (refused by the reader's caller) or `duplicate` (see [`duplicates`]).
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

/// Bytes of one document at most: a Service or an EndpointSlice (at most 1,000
/// endpoints by API validation) is far smaller.
pub const MAX_DOCUMENT_BYTES: usize = 4 << 20;
/// Nesting of one document at most (flow collections and block sequences on a line);
/// Kubernetes objects nest a dozen levels.
pub const MAX_NESTING: usize = 64;
/// Documents of one file at most; the rest of a file past them is left out.
pub const MAX_DOCUMENTS: usize = 100_000;
/// Aliases (`*name`) of one document at most, counted before parsing. Kubernetes
/// objects need none; a few hundred of them, each naming a node that holds
/// others, make a document stand for billions of nodes.
pub const MAX_ALIASES: usize = 100;

/// Nodes (mappings, sequences, scalars) a document of `bytes` bytes may make with its
/// aliases expanded: two a byte, and a little more. YAML text alone makes fewer
/// (about one a byte at most: `{a,b,c}`, `[?:,?:]`), so only aliases can reach it;
/// what a document costs stays a small multiple of its size.
pub const fn max_nodes(bytes: usize) -> usize {
    2 * bytes + 1024
}

/// What reading a file cost and let through, counted (not timed), so tests can
/// bound the work a hostile file causes: every byte is looked at once by the
/// splitting and screening (linear), and parsing is at most linear in
/// `parsed_bytes` times `deepest`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Bytes of the file read (a file past [`MAX_DOCUMENTS`] is not read further).
    pub bytes: usize,
    /// Documents found (split at `---` lines), screened or not.
    pub documents: usize,
    /// Bytes handed on to the YAML parser.
    pub parsed_bytes: usize,
    /// The largest document handed on, in bytes: what reading held at once.
    pub largest: usize,
    /// The deepest nesting among the documents handed on.
    pub deepest: usize,
    /// The most aliases in a document handed on.
    pub aliases: usize,
    /// Nodes built by parsing, aliases expanded (see [`max_nodes`]).
    pub nodes: usize,
    /// The most nodes of one document.
    pub most_nodes: usize,
}

/// One document of a file, split off as the file is read.
#[derive(Debug, Default)]
struct Chunk {
    /// The line it starts on (from 1).
    line: usize,
    /// Its bytes, while they stay within [`MAX_DOCUMENT_BYTES`]; dropped past it.
    bytes: Vec<u8>,
    /// Its length, kept or not.
    len: usize,
}

impl Chunk {
    fn push(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
        if self.len > MAX_DOCUMENT_BYTES {
            // Too large: nothing of it is kept, only its length counted.
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(bytes);
        }
    }
}

/// Splits a stream into documents as it is read, never holding more than one
/// document (and nothing of one past [`MAX_DOCUMENT_BYTES`]). A document starts at
/// a line that begins with `---` followed by a space, a tab or the line's end, as
/// kubectl's YAML reader splits (k8s.io/apimachinery pkg/util/yaml `YAMLReader`,
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apimachinery/pkg/util/yaml/decoder.go>);
/// the separator line stays with the document it opens, so `--- {a: 1}` keeps its
/// content. A byte-order mark at the start is dropped (as kubectl does).
struct Splitter<R> {
    reader: R,
    /// Whether the first document (and its byte-order mark) was handed on.
    started: bool,
    /// The line being read (from 1).
    line: usize,
    /// The first bytes of the line being read, until they tell whether it is a
    /// separator (at most 4).
    head: Vec<u8>,
    /// Whether the line being read has been decided (and its head placed).
    decided: bool,
    /// The document being read.
    chunk: Chunk,
    /// Bytes read.
    bytes: usize,
    done: bool,
}

fn is_separator_head(head: &[u8], line_ended: bool) -> Option<bool> {
    if !head.starts_with(&b"---"[..head.len().min(3)]) {
        return Some(false);
    }
    match head.get(3) {
        Some(b' ' | b'\t' | b'\r' | b'\n') => Some(true),
        Some(_) => Some(false),
        None if line_ended => Some(head.len() == 3),
        None => None,
    }
}

impl<R: std::io::BufRead> Splitter<R> {
    fn new(reader: R) -> Self {
        Self {
            reader,
            started: false,
            line: 1,
            head: Vec::with_capacity(4),
            decided: false,
            chunk: Chunk {
                line: 1,
                ..Chunk::default()
            },
            bytes: 0,
            done: false,
        }
    }

    /// The next document, or `None` at the end of the stream.
    fn next_chunk(&mut self) -> std::io::Result<Option<Chunk>> {
        if self.done {
            return Ok(None);
        }
        let chunk = self.next_raw()?;
        if std::mem::replace(&mut self.started, true) {
            return Ok(chunk);
        }
        // The first document: without its byte-order mark.
        Ok(chunk.map(|mut first| {
            if first.bytes.starts_with(b"\xef\xbb\xbf") {
                first.bytes.drain(..3);
                first.len -= 3;
            }
            first
        }))
    }

    fn next_raw(&mut self) -> std::io::Result<Option<Chunk>> {
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                // A last line without its newline, still undecided.
                if !self.head.is_empty() {
                    let head = std::mem::take(&mut self.head);
                    self.decided = true;
                    if let Some(next) = place_head(&mut self.chunk, self.line, head, true) {
                        return Ok(Some(std::mem::replace(&mut self.chunk, next)));
                    }
                }
                self.done = true;
                let last = std::mem::take(&mut self.chunk);
                return Ok((last.len > 0).then_some(last));
            }
            let (used, ended) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            let mut part = &buf[..used];
            let mut split = None;
            if !self.decided {
                // The line's first bytes tell whether it is a separator.
                let take = (4 - self.head.len()).min(part.len());
                self.head.extend_from_slice(&part[..take]);
                part = &part[take..];
                let line_ended = self.head.last() == Some(&b'\n');
                if line_ended || is_separator_head(&self.head, false).is_some() {
                    let head = std::mem::take(&mut self.head);
                    self.decided = true;
                    split = place_head(&mut self.chunk, self.line, head, line_ended);
                }
            }
            // The rest of a decided line goes to its document (an undecided head
            // took the whole part).
            let last = split.map(|next| std::mem::replace(&mut self.chunk, next));
            self.chunk.push(part);
            self.reader.consume(used);
            self.bytes += used;
            if ended {
                self.line += 1;
                self.decided = false;
            }
            if last.is_some() {
                return Ok(last);
            }
        }
    }
}

/// Places a decided line head: a separator after some document starts a new one
/// (returned); otherwise the head joins the document being read.
fn place_head(chunk: &mut Chunk, line: usize, head: Vec<u8>, line_ended: bool) -> Option<Chunk> {
    let separator = is_separator_head(&head, line_ended).unwrap_or(false);
    if separator && chunk.len > 0 {
        let mut next = Chunk {
            line,
            ..Chunk::default()
        };
        next.push(&head);
        return Some(next);
    }
    chunk.push(&head);
    None
}

/// Why a document is not handed to the parser, if it is not: not UTF-8, too
/// large, nested too deep, too many aliases. Linear in its size.
fn screen(chunk: &Chunk) -> Result<(&str, Shape), (&'static str, String)> {
    if chunk.len > MAX_DOCUMENT_BYTES {
        return Err((
            "document_too_large",
            format!(
                "{} bytes, more than the {MAX_DOCUMENT_BYTES} a document may have",
                chunk.len
            ),
        ));
    }
    let text = std::str::from_utf8(&chunk.bytes).map_err(|e| {
        let at = e.valid_up_to();
        let line = chunk.line + chunk.bytes[..at].iter().filter(|b| **b == b'\n').count();
        (
            "not_utf8",
            format!("byte 0x{:02x} on line {line} is not UTF-8", chunk.bytes[at]),
        )
    })?;
    let shape = shape(text);
    if shape.depth > MAX_NESTING {
        return Err((
            "nested_too_deep",
            format!("nested deeper than {MAX_NESTING} levels"),
        ));
    }
    if shape.aliases > MAX_ALIASES {
        return Err((
            "too_many_aliases",
            format!(
                "{} aliases, more than the {MAX_ALIASES} a document may have",
                shape.aliases
            ),
        ));
    }
    Ok((text, shape))
}

/// What screening sees of a document's structure without parsing it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Shape {
    /// How deep it nests (see [`shape`]).
    depth: usize,
    /// Anchors (`&name`) and aliases (`*name`).
    anchors: usize,
    aliases: usize,
}

/// How deep a document nests and how many anchors and aliases it has, counted
/// cheaply: flow collections (`[`, `{`) open outside quotes and comments, plus block
/// sequence entries (`- - -`) that begin one line. Block mappings need one more
/// column of indentation per level, so the document's size bounds them already.
/// An anchor or alias is `&` or `*` where a node may start (a line's start, after a
/// space or a flow indicator) followed by a name character; one inside a plain
/// scalar may be counted too, which only errs on the safe side.
fn shape(text: &str) -> Shape {
    let (mut depth, mut out) = (0usize, Shape::default());
    let mut quote: Option<char> = None;
    for line in text.lines() {
        let dashes = line
            .trim_start()
            .split_inclusive("- ")
            .take_while(|p| *p == "- ")
            .count();
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (Some('"'), '\\') => {
                    chars.next();
                }
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') if prev == ' ' || prev == '\t' => break,
                (None, '[' | '{') => {
                    depth += 1;
                    out.depth = out.depth.max(depth + dashes);
                }
                (None, ']' | '}') => depth = depth.saturating_sub(1),
                (None, '&' | '*')
                    if matches!(prev, ' ' | '\t' | '[' | '{' | ',')
                        && chars
                            .peek()
                            .is_some_and(|n| !n.is_whitespace() && !",[]{}".contains(*n)) =>
                {
                    if c == '&' {
                        out.anchors += 1;
                    } else {
                        out.aliases += 1;
                    }
                }
                _ => {}
            }
            prev = c;
        }
        // A quote never spans lines in Kubernetes YAML worth reading; a stray one must
        // not blind the count for the rest of the document.
        quote = None;
        out.depth = out.depth.max(depth + dashes);
    }
    out
}

/// Counts the nodes a document makes, aliases expanded, and stops at a budget:
/// what parsing it into a tree would hold, known before the tree is built.
struct CountNodes<'a> {
    left: &'a std::cell::Cell<usize>,
    over: &'a std::cell::Cell<bool>,
}

impl CountNodes<'_> {
    fn again(&self) -> Self {
        Self {
            left: self.left,
            over: self.over,
        }
    }

    fn take<E: serde::de::Error>(&self) -> Result<(), E> {
        match self.left.get().checked_sub(1) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.over.set(true);
                Err(E::custom("node budget exceeded"))
            }
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for CountNodes<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! count_scalar {
    ($($f:ident: $t:ty),*) => {
        $(fn $f<E: serde::de::Error>(self, _: $t) -> Result<(), E> {
            self.take()
        })*
    };
}

impl<'de> serde::de::Visitor<'de> for CountNodes<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    count_scalar!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128,
        visit_u128: u128, visit_f64: f64, visit_str: &str, visit_bytes: &[u8]);

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.take()
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.take()
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.take()?;
        while seq.next_element_seed(self.again())?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.take()?;
        while map.next_key_seed(self.again())?.is_some() {
            map.next_value_seed(self.again())?;
        }
        Ok(())
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use serde::de::VariantAccess as _;
        self.take()?;
        let (_, variant) = data.variant::<serde::de::IgnoredAny>()?;
        variant.newtype_variant_seed(self.again())
    }
}

/// The nodes of `text`'s YAML documents, aliases expanded, counted up to `budget`:
/// `Ok(Some(n))` within it, `Ok(None)` past it (counting stops there), `Err` when the
/// YAML is broken.
fn count_nodes(text: &str, budget: usize) -> Result<Option<usize>, serde_yaml_ng::Error> {
    let left = std::cell::Cell::new(budget);
    let over = std::cell::Cell::new(false);
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let seed = CountNodes {
            left: &left,
            over: &over,
        };
        if let Err(e) = serde::de::DeserializeSeed::deserialize(seed, doc) {
            return if over.get() { Ok(None) } else { Err(e) };
        }
    }
    Ok(Some(budget - left.get()))
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
    /// Documents in the file that held something (a `v1 List` is one).
    pub documents: usize,
    /// Problems of single documents; the other documents were read.
    pub problems: Vec<Problem>,
    /// Nodes (mappings, sequences, scalars) of the parsed documents, counted: what
    /// reading the file held in memory at most, a document at a time.
    pub nodes: usize,
    /// What reading cost, counted.
    pub cost: Cost,
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

/// Reads a file's documents one at a time as it is read (see [`read_from`]).
/// `Err` when the file cannot be read or its YAML is broken.
pub fn read_file(
    path: &Path,
    each: &mut dyn FnMut(Object) -> Result<(), String>,
) -> Result<Read, Problem> {
    let file = fs::File::open(path)
        .map_err(|e| Problem::file(path, "unreadable", format!("cannot read: {e}")))?;
    read_from(
        path,
        std::io::BufReader::with_capacity(64 << 10, file),
        each,
    )
}

/// [`read_from`] over a text in memory.
pub fn objects(
    path: &Path,
    text: &str,
    each: &mut dyn FnMut(Object) -> Result<(), String>,
) -> Result<Read, Problem> {
    read_from(path, text.as_bytes(), each)
}

/// Reads a stream of YAML documents one at a time, as it comes, and gives each
/// object to `each` (the items of a `v1 List` one by one): only one document is
/// ever held, as text and then as a tree, never the file.
///
/// Each document is screened before any YAML parsing, which can cost the square of
/// its size on deep nesting: one that is not UTF-8, larger than
/// [`MAX_DOCUMENT_BYTES`] (not even kept while it is read past that), nested deeper
/// than [`MAX_NESTING`] or with more than [`MAX_ALIASES`] aliases is left out alone,
/// with a problem naming its line; so is one whose aliases would expand past
/// [`max_nodes`] (counted before the tree is built). At most [`MAX_DOCUMENTS`]
/// documents are read; the rest of the stream is left out with one problem.
///
/// An object of a kind the binaries read passes [`crate::validate::object`] first
/// (the API server's rules for an object it holds, [`crate::validate::Rules::Stored`]:
/// a file stands for what a cluster stores, written under older releases too). A reason `each` returns, a refused object, or a
/// document without `apiVersion` or `kind`, becomes a problem naming the document
/// (and the List item), the object and the field; the other objects are still
/// read. `Err` when the stream cannot be read or the YAML itself is broken:
/// nothing in the file is trusted then, and what `each` was given before must be
/// dropped.
pub fn read_from(
    path: &Path,
    reader: impl std::io::BufRead,
    each: &mut dyn FnMut(Object) -> Result<(), String>,
) -> Result<Read, Problem> {
    let mut read = Read::default();
    let mut split = Splitter::new(reader);
    let unreadable =
        |e: std::io::Error| Problem::file(path, "unreadable", format!("cannot read: {e}"));
    // Documents that held something, numbered as problems name them.
    let mut n = 0;
    while let Some(chunk) = split.next_chunk().map_err(unreadable)? {
        read.cost.documents += 1;
        if read.cost.documents > MAX_DOCUMENTS {
            read.problems.push(Problem::file(
                path,
                "too_many_documents",
                format!(
                    "more than {MAX_DOCUMENTS} documents: the rest of the file from line {} is skipped",
                    chunk.line
                ),
            ));
            read.cost.documents -= 1;
            break;
        }
        let mut skip = |n: &mut usize, code, reason: String| {
            *n += 1;
            read.problems.push(Problem::file(
                path,
                code,
                format!(
                    "the document starting on line {} (document {n}): {reason}; skipped",
                    chunk.line
                ),
            ));
        };
        let (text, shape) = match screen(&chunk) {
            Ok(screened) => screened,
            Err((code, reason)) => {
                skip(&mut n, code, reason);
                continue;
            }
        };
        let broken = |e: serde_yaml_ng::Error| {
            let mut reason = format!("not valid YAML: {e}");
            if let Some(at) = e.location() {
                // The parser counts lines from the document's start.
                let relative = format!("at line {} column", at.line());
                let absolute = format!("at line {} column", chunk.line + at.line() - 1);
                reason = reason.replacen(&relative, &absolute, 1);
            }
            Problem::file(path, "invalid_yaml", reason)
        };
        // Aliases can make a short text a huge tree: count it before building it.
        let budget = max_nodes(text.len());
        if shape.aliases > 0 || text.contains('*') {
            match count_nodes(text, budget).map_err(broken)? {
                Some(_) => {}
                None => {
                    skip(
                        &mut n,
                        "too_many_nodes",
                        format!("its aliases expand to more than {budget} nodes"),
                    );
                    continue;
                }
            }
        }
        read.cost.parsed_bytes += text.len();
        read.cost.largest = read.cost.largest.max(text.len());
        read.cost.deepest = read.cost.deepest.max(shape.depth);
        read.cost.aliases = read.cost.aliases.max(shape.aliases);
        let mut doc_nodes = 0;
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            match serde_yaml_ng::Value::deserialize(doc).map_err(broken)? {
                serde_yaml_ng::Value::Null => {}
                v => {
                    n += 1;
                    doc_nodes += nodes(&v);
                    let problems = &mut read.problems;
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
            }
        }
        read.nodes += doc_nodes;
        read.cost.most_nodes = read.cost.most_nodes.max(doc_nodes);
    }
    read.documents = n;
    read.cost.nodes = read.nodes;
    read.cost.bytes = split.bytes;
    Ok(read)
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
    if let Err(invalid) = crate::validate::object(&kind, &value, crate::validate::Rules::Stored) {
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

/// One definition of an object in a manifest directory: which object, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Definition {
    pub kind: String,
    /// The namespace as the reader's caller tells objects apart (the controller:
    /// `default` when none is given; the agent, as its compiler: empty).
    pub namespace: String,
    pub name: String,
    pub file: PathBuf,
    /// Where in the file (`document 2`), when known.
    pub place: Option<String>,
}

impl Definition {
    fn object(&self) -> String {
        if self.namespace.is_empty() {
            return format!("{} {}", self.kind, self.name);
        }
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }

    fn at(&self) -> String {
        match &self.place {
            Some(place) => format!("{} ({place})", self.file.display()),
            None => self.file.display().to_string(),
        }
    }
}

/// An object defined more than once, as both binaries settle it: `kubectl apply -f`
/// of the directory applies its files in lexical order (`filepath.Walk` in
/// k8s.io/cli-runtime pkg/resource `ExpandPathsToFileVisitors`,
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/cli-runtime/pkg/resource/visitor.go>)
/// and a file's documents in order, so the cluster ends with the last definition.
/// Given the definitions in that order, says which lose (their indexes) with a
/// problem each naming both places; the last of each object is used.
pub fn duplicates(defs: &[Definition]) -> Vec<(usize, Problem)> {
    let mut last: std::collections::HashMap<(&str, &str, &str), usize> = Default::default();
    for (i, d) in defs.iter().enumerate() {
        last.insert((&d.kind, &d.namespace, &d.name), i);
    }
    defs.iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let winner = &defs[last[&(d.kind.as_str(), d.namespace.as_str(), d.name.as_str())]];
            (!std::ptr::eq(winner, d)).then(|| {
                let problem = Problem {
                    file: d.file.clone(),
                    object: Some(d.object()),
                    field: None,
                    code: "duplicate",
                    reason: format!(
                        "{} in {} is defined again later, in {}; the last definition is used, as `kubectl apply -f` of the directory would leave it, and this one is skipped",
                        d.object(),
                        d.at(),
                        winner.at()
                    ),
                };
                (i, problem)
            })
        })
        .collect()
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
    /// Reads a changed file, opened, as it comes (see [`read_from`]), and says what
    /// to keep of it; `old` is what was kept before, if the file was read before.
    /// `None` when the YAML is broken: the file keeps `old` then. Problems go to
    /// `problems`.
    fn read(
        &mut self,
        path: &Path,
        file: &mut dyn std::io::BufRead,
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
            let mut problems = Vec::new();
            let new = match fs::File::open(&path) {
                Ok(file) => {
                    let mut file = std::io::BufReader::with_capacity(64 << 10, file);
                    reader.read(&path, &mut file, old.as_ref(), &mut problems)
                }
                Err(e) => {
                    problems.push(Problem::file(
                        &path,
                        "unreadable",
                        format!("cannot read: {e}"),
                    ));
                    None
                }
            };
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

    /// The names of the objects of a stream, and what reading it found.
    fn read_names(bytes: &[u8]) -> (Vec<String>, Read) {
        let mut names = Vec::new();
        let read = read_from(Path::new("f.yaml"), bytes, &mut |o| {
            names.push(o.name);
            Ok(())
        })
        .expect("valid YAML");
        (names, read)
    }

    const GOOD: &str =
        "apiVersion: v1\nkind: Service\nmetadata: {name: good}\nspec: {clusterIP: 10.96.0.1}\n";

    #[test]
    fn a_byte_order_mark_is_accepted() {
        let bytes = [b"\xef\xbb\xbf".as_slice(), GOOD.as_bytes()].concat();
        let (names, read) = read_names(&bytes);
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert_eq!(names, ["good"]);
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
        let (names, read) = read_names(&bytes);
        let problems = read.problems;
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0]
                .reason
                .contains("byte 0xe9 on line 8 is not UTF-8"),
            "{problems:?}"
        );
        assert_eq!(problems[0].code, "not_utf8");
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
            let bytes = format!("{GOOD}---\n{doc}---\n{}", GOOD.replace("good", "after"));
            let (names, read) = read_names(bytes.as_bytes());
            let problems = &read.problems;
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0]
                    .reason
                    .starts_with("the document starting on line 5 (document 2): "),
                "{problems:?}"
            );
            // Only the good documents reached the parser.
            assert_eq!(
                read.cost.parsed_bytes,
                2 * GOOD.len() + 4 + 1,
                "{:?}",
                read.cost
            );
            assert_eq!(read.cost.documents, 3);
            assert_eq!(names, ["good", "after"]);
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
        let (names, read) = read_names(text.as_bytes());
        let cost = read.cost;
        assert_eq!((cost.documents, cost.parsed_bytes), (2, text.len()));
        assert_eq!(cost.bytes, text.len());
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

    /// A stream read through buffers of any size splits and reads the same: a
    /// separator line is told apart from `---` inside text, whatever the buffer
    /// boundaries.
    #[test]
    fn documents_split_the_same_whatever_the_reads() {
        let text = format!(
            "\u{feff}{GOOD}---\n{}--- # comment\n{}---\t\n---\n---\n--- {{apiVersion: v1, kind: Service, metadata: {{name: flow}}}}\n---\nb: 1\n---x: 1\n",
            GOOD.replace("good", "two"),
            GOOD.replace("good", "three")
        );
        let whole = read_names(text.as_bytes());
        assert_eq!(whole.0, ["good", "two", "three", "flow"], "{:?}", whole.1);
        // `---x` is no separator: it is a key of the document it ends.
        assert_eq!(whole.1.problems.len(), 1, "{:?}", whole.1.problems);
        assert_eq!(whole.1.cost.documents, 8);
        for size in 1..9 {
            let reader = std::io::BufReader::with_capacity(size, text.as_bytes());
            let mut names = Vec::new();
            let read = read_from(Path::new("f.yaml"), reader, &mut |o| {
                names.push(o.name);
                Ok(())
            })
            .unwrap();
            assert_eq!(names, whole.0, "buffer of {size}");
            assert_eq!(read.cost, whole.1.cost, "buffer of {size}");
            assert_eq!(read.problems, whole.1.problems, "buffer of {size}");
        }
        // A last line without its newline.
        assert_eq!(read_names(b"a: 1\n---").1.cost.documents, 2);
        assert_eq!(read_names(b"a: 1\n---\nb: 2").1.cost.documents, 2);
    }

    /// A document too large is never held: the reader keeps its length only, and
    /// what it held at once is the largest document it parsed.
    #[test]
    fn a_large_stream_is_read_a_document_at_a_time() {
        struct Generated {
            left: usize,
            doc: Vec<u8>,
            at: usize,
        }
        impl std::io::Read for Generated {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.left == 0 {
                    return Ok(0);
                }
                let n = buf.len().min(self.doc.len() - self.at);
                buf[..n].copy_from_slice(&self.doc[self.at..self.at + n]);
                self.at += n;
                if self.at == self.doc.len() {
                    (self.at, self.left) = (0, self.left - 1);
                }
                Ok(n)
            }
        }
        // 64 MiB in one document that never ends, then nothing: never in memory.
        let endless = Generated {
            left: 64 << 10,
            doc: format!("# {}\n", "x".repeat(1021)).into_bytes(),
            at: 0,
        };
        let read = read_from(
            Path::new("f.yaml"),
            std::io::BufReader::new(endless),
            &mut |_| Ok(()),
        )
        .unwrap();
        assert_eq!(read.problems.len(), 1);
        assert_eq!(read.problems[0].code, "document_too_large");
        assert_eq!((read.cost.bytes, read.cost.parsed_bytes), (64 << 20, 0));
        // Many documents: each parsed and dropped in turn.
        let many = Generated {
            left: 20_000,
            doc: format!("---\n{}", GOOD).into_bytes(),
            at: 0,
        };
        let mut count = 0;
        let read = read_from(
            Path::new("f.yaml"),
            std::io::BufReader::new(many),
            &mut |_| {
                count += 1;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!((count, read.documents), (20_000, 20_000));
        assert_eq!(read.cost.largest, GOOD.len() + 4);
    }

    /// Aliases are counted before parsing: past [`MAX_ALIASES`] a document is left
    /// out alone, and one whose aliases would expand past [`max_nodes`] too, before
    /// its tree is built. A few aliases that expand a little are read.
    #[test]
    fn aliases_are_bounded_before_the_tree_is_built() {
        let many = format!("a: &a x\nb: [{}]\n", vec!["*a"; MAX_ALIASES + 1].join(", "));
        // Nine levels of nine aliases each: a billion nodes from 700 bytes.
        let mut laughs = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for (prev, next) in ["a", "b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
        {
            laughs += &format!(
                "{next}: &{next} [{}]\n",
                vec![format!("*{prev}"); 9].join(",")
            );
        }
        let few = "apiVersion: v1\nkind: Service\nmetadata: &m {name: few}\nspec: {ports: &p [{port: 80}]}\nx: [*p, *p, *m]\n";
        let text = format!("{GOOD}---\n{many}---\n{laughs}---\n{few}");
        let (names, read) = read_names(text.as_bytes());
        assert_eq!(names, ["good", "few"]);
        let problems: Vec<(&str, &str)> = read
            .problems
            .iter()
            .map(|p| (p.code, p.reason.as_str()))
            .collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(problems[0].0, "too_many_aliases");
        assert!(
            problems[0]
                .1
                .contains("(document 2): 101 aliases, more than the 100"),
            "{problems:?}"
        );
        assert_eq!(problems[1].0, "too_many_nodes");
        assert!(problems[1].1.contains("(document 3)"), "{problems:?}");
        assert!(
            read.cost.most_nodes <= max_nodes(few.len()),
            "{:?}",
            read.cost
        );
        assert_eq!(read.cost.aliases, 3);
    }

    /// The last definition of an object wins, as `kubectl apply -f` leaves it; the
    /// others are named with both places.
    #[test]
    fn duplicates_are_settled_for_the_last_definition() {
        let def = |kind: &str, name: &str, file: &str, place: Option<&str>| Definition {
            kind: kind.into(),
            namespace: "default".into(),
            name: name.into(),
            file: file.into(),
            place: place.map(String::from),
        };
        let defs = [
            def("Service", "web", "a.yaml", Some("document 1")),
            def("Service", "web", "a.yaml", Some("document 3")),
            def("EndpointSlice", "web", "a.yaml", None),
            def("Service", "db", "b.yaml", None),
            def("Service", "web", "c.yaml", Some("document 1")),
        ];
        let lost = duplicates(&defs);
        let losers: Vec<usize> = lost.iter().map(|(i, _)| *i).collect();
        assert_eq!(losers, [0, 1]);
        assert_eq!(
            lost[1].1.reason,
            "Service default/web in a.yaml (document 3) is defined again later, in c.yaml (document 1); the last definition is used, as `kubectl apply -f` of the directory would leave it, and this one is skipped"
        );
        assert_eq!(lost[0].1.code, "duplicate");
        assert_eq!(lost[0].1.file, Path::new("a.yaml"));
    }
}

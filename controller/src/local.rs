//! Local mode: a directory of ordinary Kubernetes YAML as the cluster, read as
//! [`conventions::manifests`] reads it (the agent reads it the same way): Services,
//! Pods, Nodes, Endpoints and EndpointSlices from every `*.yaml`/`*.yml` file
//! (multi-document files and `v1 List` too, each document screened first); the
//! objects the controllers manage are written back, one file per object, and kept
//! current as the directory changes (polled; only changed files are read again).
//!
//! Files people wrote are never rewritten or deleted: the controller writes only
//! files it owns (they begin with [`HEADER`]). An object it manages that a person
//! wrote is superseded by a copy in an owned file (which wins when both exist), and
//! one that should be deleted is left in place with a warning. A file that stops
//! parsing keeps its last good objects, so a typo does not empty a Service.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use conventions::manifests::{self, Files, Object as Document, Problem, Reader};

use crate::plan::{Object, Plan};
use crate::store::{self, Key, Snapshot};
use crate::{util, Error, Result};

/// A file, or an object of it, that could not be read or used, and why. It is
/// skipped; `plan` lists it under `skipped`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    /// The file.
    #[serde(rename = "file")]
    pub path: PathBuf,
    /// The object (`Service default/web`), or the file when no object was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The field at fault, when known (`metadata.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// A short, stable name of the reason, for metrics: the reader's codes
    /// (`unusable_object` for an object that does not read as its kind).
    pub code: &'static str,
    /// Why, naming the document.
    pub reason: String,
}

/// The first line of every file the controller writes; only such files are ever
/// rewritten or removed.
pub const HEADER: &str = "# Managed by sliceway-controller.";

/// Where a managed object came from: a file and its document index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file.
    pub path: PathBuf,
    /// Number of documents in the file.
    pub documents: usize,
    /// Whether the controller wrote the file (it begins with [`HEADER`]).
    pub owned: bool,
}

/// What was read from a directory.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The objects.
    pub snapshot: Snapshot,
    /// Files (or documents) skipped.
    pub rejected: Vec<Rejected>,
    /// The file of each EndpointSlice and Endpoints, by (kind, key).
    pub sources: BTreeMap<(String, Key), Source>,
}

/// The kinds the controllers read; objects of other kinds are not kept.
const READS: [&str; 5] = ["Service", "Pod", "Node", "Endpoints", "EndpointSlice"];

/// An object of a kind the controllers read, as a file gave it: checked to read as
/// its kind when the file is read, and kept compact (as JSON, about the size of its
/// YAML) until a pass needs it typed, so a large directory is held once as text and
/// once as the snapshot of a pass, not as YAML trees besides.
#[derive(Debug)]
pub struct Kept {
    kind: String,
    /// The namespace, `default` when none is given.
    namespace: String,
    name: String,
    /// Where in its file (`document 2`, `document 2, List item 3`).
    place: String,
    /// Whether it is an item of a `v1 List`.
    item: bool,
    json: Box<str>,
}

/// An object of a kind the controllers read, kept; `None` for other kinds; why not
/// when it does not read as its kind.
fn keep(o: Document) -> std::result::Result<Option<Kept>, String> {
    fn json<T: serde::de::DeserializeOwned + serde::Serialize>(
        o: Document,
    ) -> std::result::Result<Box<str>, String> {
        let (kind, name) = (o.kind.clone(), o.name.clone());
        let typed: T = o
            .typed()
            .map_err(|e| format!("{kind} {name}: {e}; skipped"))?;
        serde_json::to_string(&typed)
            .map(String::into_boxed_str)
            .map_err(|e| format!("{kind} {name}: {e}; skipped"))
    }
    use k8s_openapi::api::{
        core::v1::{Endpoints, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    };
    if !READS.contains(&o.kind.as_str()) {
        return Ok(None);
    }
    let namespace = o
        .value
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_string();
    let (kind, name, place, item) = (o.kind.clone(), o.name.clone(), o.place(), o.item.is_some());
    let json = match kind.as_str() {
        "Service" => json::<Service>(o)?,
        "Pod" => json::<Pod>(o)?,
        "Node" => json::<Node>(o)?,
        "Endpoints" => json::<Endpoints>(o)?,
        _ => json::<EndpointSlice>(o)?,
    };
    Ok(Some(Kept {
        kind,
        namespace,
        name,
        place,
        item,
        json,
    }))
}

fn typed<T: serde::de::DeserializeOwned>(k: &Kept) -> std::result::Result<T, String> {
    serde_json::from_str(&k.json).map_err(|e| e.to_string())
}

/// Puts a kept object into the snapshot (and the file of a managed kind into
/// `sources`).
fn add_object(
    loaded: &mut Loaded,
    path: &Path,
    documents: usize,
    owned: bool,
    v: &Kept,
) -> std::result::Result<(), String> {
    let snap = &mut loaded.snapshot;
    match v.kind.as_str() {
        "Service" => {
            let mut s: k8s_openapi::api::core::v1::Service = typed(v)?;
            fill_uid(&mut s.metadata, "Service");
            snap.add_service(s);
        }
        "Pod" => {
            let mut p: k8s_openapi::api::core::v1::Pod = typed(v)?;
            fill_namespace(&mut p.metadata);
            snap.add_pod(p);
        }
        "Node" => snap.add_node(typed::<k8s_openapi::api::core::v1::Node>(v)?),
        "Endpoints" => {
            let mut e: k8s_openapi::api::core::v1::Endpoints = typed(v)?;
            fill_uid(&mut e.metadata, "Endpoints");
            let key = (
                e.metadata.namespace.clone().unwrap_or_default(),
                e.metadata.name.clone().unwrap_or_default(),
            );
            loaded.sources.insert(
                ("Endpoints".into(), key),
                Source {
                    path: path.to_path_buf(),
                    documents,
                    owned,
                },
            );
            snap.add_endpoints(e);
        }
        "EndpointSlice" => {
            let mut s: k8s_openapi::api::discovery::v1::EndpointSlice = typed(v)?;
            fill_namespace(&mut s.metadata);
            let key = (
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            );
            loaded.sources.insert(
                ("EndpointSlice".into(), key),
                Source {
                    path: path.to_path_buf(),
                    documents,
                    owned,
                },
            );
            snap.add_slice(s);
        }
        _ => {}
    }
    Ok(())
}

fn fill_namespace(m: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    if m.namespace.as_deref().unwrap_or("").is_empty() {
        m.namespace = Some("default".into());
    }
}

/// Objects without a namespace are in `default`; owners without a UID get a stable
/// synthesized one, so ownership by UID works across passes.
fn fill_uid(m: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, kind: &str) {
    fill_namespace(m);
    if m.uid.as_deref().unwrap_or("").is_empty() {
        m.uid = Some(util::synthetic_uid(
            kind,
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or(""),
        ));
    }
}

/// What a file gave when it last parsed: its objects, how many documents it has
/// and whether the controller wrote it.
#[derive(Debug, Default)]
pub struct FileDocs {
    owned: bool,
    documents: usize,
    objects: Vec<Kept>,
}

/// The directory's files as last read, each with its last good objects.
pub type LastGood = Files<FileDocs>;

struct ToDocs;

impl Reader<FileDocs> for ToDocs {
    fn read(
        &mut self,
        path: &Path,
        file: &mut dyn std::io::BufRead,
        _old: Option<&FileDocs>,
        problems: &mut Vec<Problem>,
    ) -> Option<FileDocs> {
        // The header is the file's first line; a read buffer holds it whole.
        let owned = file
            .fill_buf()
            .is_ok_and(|start| start.starts_with(HEADER.as_bytes()));
        let mut objects = Vec::new();
        match manifests::read_from(path, file, &mut |o| {
            // Only the kinds the controllers read are kept, a document at a time.
            objects.extend(keep(o)?);
            Ok(())
        }) {
            Ok(read) => {
                problems.extend(read.problems);
                Some(FileDocs {
                    owned,
                    documents: read.documents,
                    objects,
                })
            }
            Err(problem) => {
                problems.push(problem);
                None
            }
        }
    }

    fn gone(&mut self, _path: &Path, _kept: FileDocs) {}
}

/// Reads every YAML file of a directory. Unreadable files and documents are
/// reported in [`Loaded::rejected`] and skipped.
pub fn load_dir(dir: &Path) -> Result<Loaded> {
    load_dir_keeping(&mut LastGood::new(dir))
}

/// Like [`load_dir`], over the files as last read: only changed files are read
/// again, and a file that no longer parses keeps the objects of its last good
/// version, as the agent does: a typo in a file must not delete the slices of the
/// Services it holds. Files the controller owns are read after the others, so their
/// copies win.
pub fn load_dir_keeping(files: &mut LastGood) -> Result<Loaded> {
    rescan(files)?;
    Ok(loaded(files))
}

/// Reads the files that were added or changed since the last rescan; whether any
/// file was added, changed or removed.
fn rescan(files: &mut LastGood) -> Result<bool> {
    let scan = files.rescan(&mut ToDocs).map_err(|source| Error::Io {
        path: files.dir().display().to_string(),
        source,
    })?;
    Ok(scan.changed)
}

/// The objects of the files as last read.
fn loaded(files: &LastGood) -> Loaded {
    let mut loaded = Loaded {
        rejected: files
            .problems()
            .into_iter()
            .map(|p| Rejected {
                // A file that gave no object is named as the object, as `trace` does.
                object: p.object.or_else(|| Some(p.file.display().to_string())),
                path: p.file,
                field: p.field,
                code: p.code,
                reason: p.reason,
            })
            .collect(),
        ..Default::default()
    };
    let mut all: Vec<(&Path, &FileDocs)> = files.kept().collect();
    all.sort_by_key(|(path, f)| (f.owned, path.to_path_buf()));
    // Objects defined more than once: the last definition is used, as `kubectl apply
    // -f` of the directory leaves it (the owned files last: an owned copy superseding
    // a person's is meant, and not said).
    let mut defs = Vec::new();
    let mut owned = Vec::new();
    for (path, f) in &all {
        for o in &f.objects {
            defs.push(manifests::Definition {
                kind: o.kind.clone(),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                file: path.to_path_buf(),
                place: Some(o.place.clone()),
            });
            owned.push(f.owned);
        }
    }
    let mut losers = BTreeSet::new();
    let last: BTreeMap<(&str, &str, &str), usize> = defs
        .iter()
        .enumerate()
        .map(|(i, d)| ((d.kind.as_str(), d.namespace.as_str(), d.name.as_str()), i))
        .collect();
    for (i, p) in manifests::duplicates(&defs) {
        losers.insert(i);
        let d = &defs[i];
        if owned[last[&(d.kind.as_str(), d.namespace.as_str(), d.name.as_str())]] {
            continue;
        }
        loaded.rejected.push(Rejected {
            path: p.file,
            object: p.object,
            field: None,
            code: p.code,
            reason: p.reason,
        });
    }
    let mut i = 0;
    for (path, f) in all {
        for o in &f.objects {
            i += 1;
            if losers.contains(&(i - 1)) {
                continue;
            }
            // An item of a List never has a file to itself.
            let documents = f.documents + usize::from(o.item);
            if let Err(reason) = add_object(&mut loaded, path, documents, f.owned, o) {
                // Checked when the file was read: only a bug of ours gets here.
                loaded.rejected.push(Rejected {
                    path: path.to_path_buf(),
                    object: Some(format!("{} {}", o.kind, o.name)),
                    field: None,
                    code: "invalid_object",
                    reason: format!("{}: {} {}: {reason}", o.place, o.kind, o.name),
                });
            }
        }
    }
    loaded
}

/// The file a new managed object is written to: `<kind>-<namespace>-<name>.yaml`,
/// with every character other than letters, digits, `.`, `-` and `_` replaced by
/// `_`, so no name reaches outside the directory or makes an invalid file name.
pub fn file_name(obj: &Object) -> String {
    let (ns, name) = obj.key();
    let safe = |s: &str| -> String {
        let s: String = s
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                    c
                } else {
                    '_'
                }
            })
            .take(100)
            .collect();
        if s.starts_with('.') {
            format!("_{s}")
        } else {
            s
        }
    };
    format!(
        "{}-{}-{}.yaml",
        obj.kind().to_ascii_lowercase(),
        safe(&ns),
        safe(&name)
    )
}

fn to_yaml(obj: &Object) -> Result<String> {
    let body = serde_yaml_ng::to_string(obj).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(format!("{HEADER}\n{body}"))
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    // Write then rename, so a reader never sees half a file and a failed write
    // leaves the previous file as it was.
    let tmp = path.with_extension("yaml.tmp");
    let done = std::fs::write(&tmp, text)
        .map_err(|source| Error::Io {
            path: tmp.display().to_string(),
            source,
        })
        .and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|source| Error::Io {
                path: path.display().to_string(),
                source,
            })
        });
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Whether `path` is a file this controller wrote.
fn is_owned(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.starts_with(HEADER))
}

/// What [`apply_plan`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Files written or removed.
    pub written: usize,
    /// Objects to delete that live in files people wrote, left alone.
    pub left_alone: Vec<(String, Key, PathBuf)>,
    /// Writes and removals that failed (the rest of the plan was applied); the
    /// previous files are intact, and the next pass tries again.
    pub failed: Vec<String>,
}

/// Applies a plan to the directory, touching only files the controller owns:
/// creates and updates go to the object's owned file (or a new one named by
/// [`file_name`]); deletes remove owned files, and leave objects in files people
/// wrote where they are (reported in [`Applied::left_alone`]). A failed write or
/// removal does not stop the others; it is reported in [`Applied::failed`].
pub fn apply_plan(
    dir: &Path,
    plan: &Plan,
    sources: &BTreeMap<(String, Key), Source>,
) -> Result<Applied> {
    let mut applied = Applied::default();
    for obj in plan.create.iter().chain(plan.update.iter()) {
        let key = obj.key();
        let path = match sources.get(&(obj.kind().to_string(), key.clone())) {
            Some(src) if src.owned && src.documents == 1 => src.path.clone(),
            _ => {
                let mut path = dir.join(file_name(obj));
                // Never over a file of the same name that a person wrote.
                if path.exists() && !is_owned(&path) {
                    path = path.with_extension("sliceway.yaml");
                }
                path
            }
        };
        match to_yaml(obj).and_then(|text| write_file(&path, &text)) {
            Ok(()) => applied.written += 1,
            Err(e) => applied.failed.push(e.to_string()),
        }
    }
    for obj in &plan.delete {
        let key = obj.key();
        match sources.get(&(obj.kind().to_string(), key.clone())) {
            Some(src) if src.owned && src.documents == 1 => match std::fs::remove_file(&src.path) {
                Ok(()) => applied.written += 1,
                Err(e) => applied
                    .failed
                    .push(format!("removing {}: {e}", src.path.display())),
            },
            Some(src) => applied
                .left_alone
                .push((obj.kind().to_string(), key, src.path.clone())),
            None => {}
        }
    }
    Ok(applied)
}

/// One pass: read the directory and compute the plan (names assigned), without
/// writing anything.
pub fn plan_dir(
    dir: &Path,
    opts: &store::Options,
    state: &mut store::State,
) -> Result<(Plan, Loaded, store::Outcome)> {
    plan_dir_keeping(&mut LastGood::new(dir), opts, state)
}

/// [`plan_dir`] over [`load_dir_keeping`].
pub fn plan_dir_keeping(
    files: &mut LastGood,
    opts: &store::Options,
    state: &mut store::State,
) -> Result<(Plan, Loaded, store::Outcome)> {
    Ok(plan_loaded(load_dir_keeping(files)?, opts, state))
}

/// The plan (names assigned) for what was read.
fn plan_loaded(
    loaded: Loaded,
    opts: &store::Options,
    state: &mut store::State,
) -> (Plan, Loaded, store::Outcome) {
    let mut outcome = store::plan_all(&loaded.snapshot, opts, state);
    let taken: BTreeSet<Key> = loaded.snapshot.slices.keys().cloned().collect();
    outcome.plan.assign_names(&taken);
    (outcome.plan.clone(), loaded, outcome)
}

/// Runs the controllers over a directory until `stop` resolves: one pass at start,
/// then one whenever a YAML file changes (polled every `poll`), and again after
/// `retry` when some Pods could not be placed.
pub async fn run(
    dir: &Path,
    opts: &store::Options,
    poll: Duration,
    retry: Duration,
    metrics: Option<&crate::metrics::Metrics>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let mut state = store::State::default();
    let mut last_good = LastGood::new(dir);
    let mut known: BTreeSet<Key> = BTreeSet::new();
    // A pass is due at start, and after a pass that wrote or could not read.
    let mut again = true;
    let mut retry_at: Option<tokio::time::Instant> = None;
    tokio::pin!(stop);
    loop {
        // The rescan reads only files added or changed (by name, size and mtime).
        let changed = match rescan(&mut last_good) {
            Ok(changed) => changed,
            Err(e) => {
                // The directory itself could not be read: retry at the next poll.
                tracing::warn!(error = %e, "reading the manifest directory failed; retrying");
                again = true;
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    _ = tokio::time::sleep(poll) => {}
                }
                continue;
            }
        };
        let due = retry_at.is_some_and(|t| tokio::time::Instant::now() >= t);
        if changed || again || due {
            retry_at = None;
            let (plan, loaded, outcome) = plan_loaded(loaded(&last_good), opts, &mut state);
            for r in &loaded.rejected {
                tracing::warn!(file = %r.path.display(), reason = %r.reason, "skipping manifest");
            }
            if let Some(m) = metrics {
                m.record_pass(&outcome, &loaded.rejected);
                // Services gone from the directory leave no series behind.
                for (ns, name) in known.difference(&outcome.services.keys().cloned().collect()) {
                    m.forget_service(ns, name);
                }
            }
            known = outcome.services.keys().cloned().collect();
            for (key, reason) in &outcome.retry {
                tracing::info!(service = %format!("{}/{}", key.0, key.1), %reason, "will retry");
                retry_at = Some(tokio::time::Instant::now() + retry);
            }
            for (kind, key, msg) in &outcome.events {
                tracing::warn!(%kind, object = %format!("{}/{}", key.0, key.1), "{msg}");
            }
            if !plan.is_empty() {
                tracing::info!(
                    create = plan.create.len(),
                    update = plan.update.len(),
                    delete = plan.delete.len(),
                    "applying plan"
                );
            }
            let written = match apply_plan(dir, &plan, &loaded.sources) {
                Ok(applied) => {
                    for (kind, key, path) in &applied.left_alone {
                        tracing::warn!(
                            %kind,
                            object = %format!("{}/{}", key.0, key.1),
                            file = %path.display(),
                            "stale object in a file written by a person: left alone (delete it by hand)"
                        );
                    }
                    for e in &applied.failed {
                        // The previous file is intact; the next poll tries again.
                        tracing::warn!(error = %e, "writing part of the plan failed; retrying");
                    }
                    if applied.failed.is_empty() {
                        applied.written
                    } else {
                        usize::MAX
                    }
                }
                Err(e) => {
                    // Earlier files stay intact (writes go to a temporary file first);
                    // the next poll tries again.
                    tracing::warn!(error = %e, "writing the plan failed; retrying");
                    usize::MAX
                }
            };
            // Our own writes change the directory; the next pass must find nothing
            // to do, which re-checks the plan is stable.
            again = written != 0;
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

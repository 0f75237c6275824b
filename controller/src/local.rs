//! Local mode: a directory of ordinary Kubernetes YAML as the cluster. Services,
//! Pods, Nodes, Endpoints and EndpointSlices are read from every `*.yaml`/`*.yml`
//! file (multi-document files and `kind: List` too); the objects the controllers
//! manage are written back, one file per object, and kept current as the
//! directory changes (polled).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;

use crate::plan::{Object, Plan};
use crate::store::{self, Key, Snapshot};
use crate::{util, Error, Result};

/// A file that could not be read or parsed, and why. It is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

/// Where a managed object came from: a file and its document index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file.
    pub path: PathBuf,
    /// Number of documents in the file.
    pub documents: usize,
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

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|source| Error::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    files.sort();
    Ok(files)
}

fn typed<T: DeserializeOwned>(v: serde_yaml_ng::Value) -> std::result::Result<T, String> {
    serde_yaml_ng::from_value(v).map_err(|e| e.to_string())
}

/// Objects of kinds the controllers do not read are ignored.
fn add_object(
    loaded: &mut Loaded,
    path: &Path,
    documents: usize,
    v: serde_yaml_ng::Value,
) -> std::result::Result<(), String> {
    let kind = v
        .get("kind")
        .and_then(|k| k.as_str())
        .ok_or("missing kind")?
        .to_string();
    let snap = &mut loaded.snapshot;
    match kind.as_str() {
        "List" => {
            let items = v
                .get("items")
                .and_then(|i| i.as_sequence())
                .cloned()
                .unwrap_or_default();
            for item in items {
                add_object(loaded, path, documents + 1, item)?;
            }
        }
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
        "Node" => snap.add_node(typed(v)?),
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

/// Reads every YAML file of a directory. Unreadable files and documents are
/// reported in [`Loaded::rejected`] and skipped.
pub fn load_dir(dir: &Path) -> Result<Loaded> {
    let mut loaded = Loaded::default();
    for path in yaml_files(dir)? {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                loaded.rejected.push(Rejected {
                    path,
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let mut docs = Vec::new();
        let mut failed = None;
        for de in serde_yaml_ng::Deserializer::from_str(&text) {
            match <serde_yaml_ng::Value as serde::Deserialize>::deserialize(de) {
                Ok(serde_yaml_ng::Value::Null) => {}
                Ok(v) => docs.push(v),
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(reason) = failed {
            loaded.rejected.push(Rejected { path, reason });
            continue;
        }
        let n = docs.len();
        for (i, v) in docs.into_iter().enumerate() {
            if let Err(reason) = add_object(&mut loaded, &path, n, v) {
                loaded.rejected.push(Rejected {
                    path: path.clone(),
                    reason: format!("document {}: {reason}", i + 1),
                });
            }
        }
    }
    Ok(loaded)
}

/// The file a new managed object is written to: `<kind>-<namespace>-<name>.yaml`.
pub fn file_name(obj: &Object) -> String {
    let (ns, name) = obj.key();
    format!("{}-{ns}-{name}.yaml", obj.kind().to_ascii_lowercase())
}

fn to_yaml(obj: &Object) -> Result<String> {
    let body = serde_yaml_ng::to_string(obj).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(format!("# Managed by sliceway-controller.\n{body}"))
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    // Write then rename, so a reader never sees half a file.
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).map_err(|source| Error::Io {
        path: tmp.display().to_string(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Rewrites a multi-document file without (or with a replaced) document for `key`.
fn rewrite_multi(path: &Path, kind: &str, key: &Key, replacement: Option<&Object>) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut out = Vec::new();
    for de in serde_yaml_ng::Deserializer::from_str(&text) {
        let Ok(v) = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(de) else {
            continue;
        };
        if v.is_null() {
            continue;
        }
        let this_kind = v.get("kind").and_then(|k| k.as_str()) == Some(kind);
        let meta = v.get("metadata");
        let ns = meta
            .and_then(|m| m.get("namespace"))
            .and_then(|n| n.as_str())
            .unwrap_or("default");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or("");
        if this_kind && ns == key.0 && name == key.1 {
            if let Some(obj) = replacement {
                out.push(
                    serde_yaml_ng::to_string(obj).map_err(|e| Error::Serialize(e.to_string()))?,
                );
            }
        } else {
            out.push(serde_yaml_ng::to_string(&v).map_err(|e| Error::Serialize(e.to_string()))?);
        }
    }
    if out.is_empty() {
        return std::fs::remove_file(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        });
    }
    write_file(path, &out.join("---\n"))
}

/// Applies a plan to the directory: creates and updates written (to the file the
/// object came from, else to [`file_name`]), deletes removed.
pub fn apply_plan(
    dir: &Path,
    plan: &Plan,
    sources: &BTreeMap<(String, Key), Source>,
) -> Result<()> {
    for obj in plan.create.iter().chain(plan.update.iter()) {
        let key = obj.key();
        match sources.get(&(obj.kind().to_string(), key.clone())) {
            Some(src) if src.documents > 1 => {
                rewrite_multi(&src.path, obj.kind(), &key, Some(obj))?
            }
            Some(src) => write_file(&src.path, &to_yaml(obj)?)?,
            None => write_file(&dir.join(file_name(obj)), &to_yaml(obj)?)?,
        }
    }
    for obj in &plan.delete {
        let key = obj.key();
        match sources.get(&(obj.kind().to_string(), key.clone())) {
            Some(src) if src.documents > 1 => rewrite_multi(&src.path, obj.kind(), &key, None)?,
            Some(src) => std::fs::remove_file(&src.path).map_err(|source| Error::Io {
                path: src.path.display().to_string(),
                source,
            })?,
            None => {}
        }
    }
    Ok(())
}

/// One pass: read the directory and compute the plan (names assigned), without
/// writing anything.
pub fn plan_dir(
    dir: &Path,
    opts: &store::Options,
    state: &mut store::State,
) -> Result<(Plan, Loaded, store::Outcome)> {
    let loaded = load_dir(dir)?;
    let mut outcome = store::plan_all(&loaded.snapshot, opts, state);
    let taken: BTreeSet<Key> = loaded.snapshot.slices.keys().cloned().collect();
    outcome.plan.assign_names(&taken);
    Ok((outcome.plan.clone(), loaded, outcome))
}

/// A cheap fingerprint of the directory's YAML files (names, sizes, mtimes).
fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    yaml_files(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let md = std::fs::metadata(&p).ok();
            let len = md.as_ref().map_or(0, |m| m.len());
            let mtime = md.and_then(|m| m.modified().ok());
            (p, len, mtime)
        })
        .collect()
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
    let mut last = None;
    let mut retry_at: Option<tokio::time::Instant> = None;
    tokio::pin!(stop);
    loop {
        let fp = fingerprint(dir);
        let due = retry_at.is_some_and(|t| tokio::time::Instant::now() >= t);
        if last.as_ref() != Some(&fp) || due {
            retry_at = None;
            let (plan, loaded, outcome) = plan_dir(dir, opts, &mut state)?;
            for r in &loaded.rejected {
                tracing::warn!(file = %r.path.display(), reason = %r.reason, "skipping manifest");
            }
            if let Some(m) = metrics {
                m.record_pass(&outcome, loaded.rejected.len());
            }
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
                apply_plan(dir, &plan, &loaded.sources)?;
            }
            // Our own writes change the directory; the next pass must find nothing
            // to do, which re-checks the plan is stable.
            last = if plan.is_empty() { Some(fp) } else { None };
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

//! An in-memory Kubernetes API server for tests: real HTTP on loopback, so the code
//! under test keeps `kube::Client`, `kube::Api` and kube-rs watchers in the path.
//!
//! It serves what a list-and-watch client needs, for any kind a test stores:
//! - `GET /api/v1/{plural}`, `/apis/{group}/{version}/{plural}` and their
//!   `/namespaces/{ns}/` forms: a list with the current resourceVersion;
//! - the same with `watch=true`: newline-delimited JSON events (`ADDED`, `MODIFIED`,
//!   `DELETED`, `BOOKMARK` when `allowWatchBookmarks=true`, `ERROR`), starting after
//!   `resourceVersion` (or with the current objects as `ADDED` when it is absent or
//!   `0`), ending after `timeoutSeconds`; a resourceVersion older than the retained
//!   history gets the API server's `410 Gone` ERROR event, which makes clients relist;
//! - `GET .../{plural}/{name}`: one object;
//! - `labelSelector` (`k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`)
//!   and `fieldSelector` (`metadata.name`, `metadata.namespace`, with `=`, `==`, `!=`).
//!   Like the real watch cache, a watch sees an object that stops matching its
//!   selector as `DELETED` and one that starts matching as `ADDED`.
//!
//! Tests change objects through methods ([`ApiServer::create`], [`ApiServer::replace`],
//! [`ApiServer::delete`], ...), each write taking the next global resourceVersion, and
//! disturb clients on purpose: [`ApiServer::drop_watches`] ends every open watch
//! cleanly, [`ApiServer::abort_watches`] cuts their connections, [`ApiServer::compact`]
//! forgets the history, [`ApiServer::fail_requests`] answers the next requests with
//! `500`. Every request is recorded for assertions.
//!
//! Lists ignore `limit` and return everything in one page, which clients accept.
//! Only GET is served: writes go through the test methods.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    convert::Infallible,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use anyhow::{bail, Context, Result};
use futures::stream;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{
    body::{Bytes, Frame, Incoming},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use kube::Resource;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Value};
use tokio::{
    net::TcpListener,
    sync::{broadcast, watch},
    task::JoinSet,
    time::Instant,
};

type Body = BoxBody<Bytes, std::io::Error>;

/// Events a watch may fall behind by before the server ends it (the client then
/// re-watches from its last resourceVersion).
const WATCH_BUFFER: usize = 4096;

/// A request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
}

impl Recorded {
    pub fn is_watch(&self) -> bool {
        self.query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1")
    }

    /// A query parameter, if present.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }
}

/// (apiVersion, plural): which collection an object lives in.
type Collection = (String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
            Self::Bookmark => "BOOKMARK",
        }
    }
}

/// One write (or a bookmark), as watches see it.
#[derive(Debug)]
struct Change {
    rv: u64,
    collection: Collection,
    event: EventType,
    /// The object after the write; for a delete, its last state.
    object: Value,
    /// The object before a modification, to turn selector transitions into
    /// ADDED/DELETED.
    previous: Option<Value>,
}

/// How open watches are ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// The response body ends normally.
    Close,
    /// The connection is cut mid-stream.
    Abort,
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<(Collection, String, String), Value>,
    kinds: BTreeMap<Collection, String>,
    /// Changes after `oldest`, in order.
    history: Vec<Arc<Change>>,
    /// The oldest resourceVersion a watch may start from.
    oldest: u64,
    requests: Vec<Recorded>,
    fail_next: usize,
    uids: u64,
}

struct Shared {
    state: Mutex<State>,
    changes: broadcast::Sender<Arc<Change>>,
    cuts: watch::Sender<(u64, Cut)>,
    open_watches: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The server. Stops on drop.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
}

impl ApiServer {
    /// Binds 127.0.0.1 on a free port and serves until dropped.
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("binding the test API server")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changes: broadcast::channel(WATCH_BUFFER).0,
            cuts: watch::channel((0, Cut::Close)).0,
            open_watches: AtomicUsize::new(0),
        });
        let mut tasks = JoinSet::new();
        let accept_shared = shared.clone();
        tasks.spawn(async move {
            // Connections live in this set, so they end with the accept loop.
            let mut connections = JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let shared = accept_shared.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(handle(&shared, req)) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
                // Reap finished connections.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            shared,
            tasks,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server (plain HTTP, no credentials).
    pub fn client(&self) -> Result<kube::Client> {
        let config = kube::Config::new(self.url().parse()?);
        Ok(kube::Client::try_from(config)?)
    }

    /// Stores a new object; fails if it exists. Returns it as stored (with its
    /// resourceVersion and uid).
    pub fn create<K: Object>(&self, obj: &K) -> Result<K> {
        self.write(obj, Some(false))
    }

    /// Replaces an existing object; fails if it does not exist.
    pub fn replace<K: Object>(&self, obj: &K) -> Result<K> {
        self.write(obj, Some(true))
    }

    /// Creates or replaces.
    pub fn apply<K: Object>(&self, obj: &K) -> Result<K> {
        self.write(obj, None)
    }

    /// Deletes an object; fails if it does not exist. `namespace` is `None` for
    /// cluster-scoped kinds.
    pub fn delete<K: Object>(&self, namespace: Option<&str>, name: &str) -> Result<()> {
        let collection = collection_of::<K>();
        let key = (
            collection.clone(),
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        let mut st = self.shared.lock();
        let Some(mut last) = st.objects.remove(&key) else {
            bail!("{} {name} not found", K::kind(&()));
        };
        st.rv += 1;
        let rv = st.rv;
        last["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.publish(
            &mut st,
            Change {
                rv,
                collection,
                event: EventType::Deleted,
                object: last,
                previous: None,
            },
        );
        Ok(())
    }

    /// Stored objects of kind `K`, sorted by namespace and name.
    pub fn list<K: Object>(&self) -> Result<Vec<K>> {
        let collection = collection_of::<K>();
        let st = self.shared.lock();
        st.objects
            .iter()
            .filter(|((c, _, _), _)| *c == collection)
            .map(|(_, v)| serde_json::from_value(v.clone()).map_err(Into::into))
            .collect()
    }

    /// The resourceVersion of the last write.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Ends every open watch cleanly; clients re-watch from their last
    /// resourceVersion.
    pub fn drop_watches(&self) {
        self.shared.cuts.send_modify(|(n, cut)| {
            *n += 1;
            *cut = Cut::Close;
        });
    }

    /// Cuts the connection of every open watch mid-stream.
    pub fn abort_watches(&self) {
        self.shared.cuts.send_modify(|(n, cut)| {
            *n += 1;
            *cut = Cut::Abort;
        });
    }

    /// Forgets the change history: a watch from any resourceVersion before now gets
    /// `410 Gone`, as after etcd compaction.
    pub fn compact(&self) {
        let mut st = self.shared.lock();
        st.history.clear();
        st.oldest = st.rv;
    }

    /// Sends a BOOKMARK with the current resourceVersion to every open watch that
    /// asked for bookmarks.
    pub fn bookmark(&self) {
        let st = self.shared.lock();
        let rv = st.rv;
        let collections: BTreeSet<Collection> = st.kinds.keys().cloned().collect();
        for collection in collections {
            // Bookmarks are not history: a watch that starts later does not get them.
            let _ = self.shared.changes.send(Arc::new(Change {
                rv,
                collection,
                event: EventType::Bookmark,
                object: Value::Null,
                previous: None,
            }));
        }
        drop(st);
    }

    /// Answers the next `n` requests with `500 Internal Server Error`.
    pub fn fail_requests(&self, n: usize) {
        self.shared.lock().fail_next = n;
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// Watches being served now.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    fn write<K: Object>(&self, obj: &K, exists: Option<bool>) -> Result<K> {
        let collection = collection_of::<K>();
        let mut value = serde_json::to_value(obj)?;
        let name = value["metadata"]["name"]
            .as_str()
            .context("an object needs metadata.name")?
            .to_string();
        let namespace = value["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let key = (collection.clone(), namespace, name.clone());
        let mut st = self.shared.lock();
        let previous = st.objects.get(&key).cloned();
        match (exists, &previous) {
            (Some(false), Some(_)) => bail!("{} {name} already exists", K::kind(&())),
            (Some(true), None) => bail!("{} {name} not found", K::kind(&())),
            _ => {}
        }
        st.rv += 1;
        let rv = st.rv;
        let meta = &mut value["metadata"];
        meta["resourceVersion"] = json!(rv.to_string());
        let uid = previous
            .as_ref()
            .and_then(|p| p["metadata"]["uid"].as_str().map(String::from));
        let uid = match uid {
            Some(uid) => uid,
            None => {
                st.uids += 1;
                format!("00000000-0000-4000-8000-{:012x}", st.uids)
            }
        };
        value["metadata"]["uid"] = json!(uid);
        st.kinds
            .insert(collection.clone(), K::kind(&()).into_owned());
        st.objects.insert(key, value.clone());
        let event = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.publish(
            &mut st,
            Change {
                rv,
                collection,
                event,
                object: value.clone(),
                previous,
            },
        );
        Ok(serde_json::from_value(value)?)
    }

    /// Records a change and sends it to the open watches, under the state lock so that
    /// a watch starting now sees it either in its backlog or live, never both.
    fn publish(&self, st: &mut State, change: Change) {
        let change = Arc::new(change);
        st.history.push(change.clone());
        let _ = self.shared.changes.send(change);
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// What the test methods can store: any typed Kubernetes object.
pub trait Object: Resource<DynamicType = ()> + Serialize + DeserializeOwned {}
impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Object for K {}

fn collection_of<K: Object>() -> Collection {
    (
        K::api_version(&()).into_owned(),
        K::plural(&()).into_owned(),
    )
}

/// What a request addresses.
struct Target {
    collection: Collection,
    namespace: Option<String>,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let (api_version, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
        ("v1".to_string(), rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(3, '/');
        let group = parts.next()?;
        let version = parts.next()?;
        (format!("{group}/{version}"), parts.next()?)
    };
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, plural, name) = match segs.as_slice() {
        [plural] => (None, *plural, None),
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural, name] => (None, *plural, Some(*name)),
        _ => return None,
    };
    Some(Target {
        collection: (api_version, plural.to_string()),
        namespace: namespace.map(String::from),
        name: name.map(String::from),
    })
}

fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let query: BTreeMap<String, String> =
        form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let recorded = Recorded {
        method: req.method().to_string(),
        path: path.clone(),
        query: query.clone(),
    };
    let is_watch = recorded.is_watch();
    {
        let mut st = shared.lock();
        st.requests.push(recorded);
        if st.fail_next > 0 {
            st.fail_next -= 1;
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "injected failure",
            );
        }
    }
    if req.method() != Method::GET {
        return status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the test API server only serves GET; write through its methods",
        );
    }
    let Some(target) = parse_path(&path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("no route for {path}"),
        );
    };
    let filter = match Filter::new(&target, &query) {
        Ok(f) => f,
        Err(msg) => return status(StatusCode::BAD_REQUEST, "BadRequest", &msg),
    };
    if let Some(name) = &target.name {
        return get(shared, &target, name);
    }
    if is_watch {
        watch_response(shared, filter, &query)
    } else {
        list(shared, &filter)
    }
}

fn get(shared: &Shared, target: &Target, name: &str) -> Response<Body> {
    let st = shared.lock();
    let key = (
        target.collection.clone(),
        target.namespace.clone().unwrap_or_default(),
        name.to_string(),
    );
    match st.objects.get(&key) {
        Some(obj) => json_response(StatusCode::OK, obj),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{} \"{name}\" not found", target.collection.1),
        ),
    }
}

fn list(shared: &Shared, filter: &Filter) -> Response<Body> {
    let st = shared.lock();
    let items: Vec<&Value> = st
        .objects
        .iter()
        .filter(|((c, _, _), obj)| *c == filter.collection && filter.matches(obj))
        .map(|(_, obj)| obj)
        .collect();
    let kind = st
        .kinds
        .get(&filter.collection)
        .map(|k| format!("{k}List"))
        .unwrap_or_else(|| "List".to_string());
    let body = json!({
        "kind": kind,
        "apiVersion": filter.collection.0,
        "metadata": {"resourceVersion": st.rv.to_string()},
        "items": items,
    });
    json_response(StatusCode::OK, &body)
}

fn watch_response(
    shared: &Arc<Shared>,
    filter: Filter,
    query: &BTreeMap<String, String>,
) -> Response<Body> {
    let timeout = match query.get("timeoutSeconds").map(|t| t.parse::<u64>()) {
        None => Duration::from_secs(1800),
        Some(Ok(t)) => Duration::from_secs(t),
        Some(Err(_)) => return status(StatusCode::BAD_REQUEST, "BadRequest", "bad timeoutSeconds"),
    };
    let from = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    &format!("invalid resourceVersion {rv:?}"),
                )
            }
        },
    };
    let mut backlog = VecDeque::new();
    let mut expired = false;
    // Under the lock: the backlog and the live subscription meet without gap or overlap.
    let st = shared.lock();
    match from {
        None => {
            for ((c, _, _), obj) in &st.objects {
                if *c == filter.collection && filter.matches(obj) {
                    backlog.push_back(event_line(EventType::Added, obj));
                }
            }
        }
        Some(rv) if rv < st.oldest => {
            expired = true;
            let gone = status_body(
                410,
                "Expired",
                &format!("too old resource version: {rv} ({})", st.oldest),
            );
            backlog.push_back(line(&json!({"type": "ERROR", "object": gone})));
        }
        Some(rv) => {
            for change in st.history.iter().filter(|c| c.rv > rv) {
                if let Some(l) = filter.render(change) {
                    backlog.push_back(l);
                }
            }
        }
    }
    let live = shared.changes.subscribe();
    drop(st);
    let mut cuts = shared.cuts.subscribe();
    cuts.mark_unchanged();
    let watch = Watch {
        backlog,
        end_after_backlog: expired,
        live,
        cuts,
        deadline: Instant::now() + timeout,
        filter,
        _open: OpenWatch::new(shared.clone()),
        done: false,
    };
    let body = StreamBody::new(stream::unfold(watch, Watch::next_frame));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(body))
        .expect("a valid response")
}

/// Counts a watch as open while its body lives.
struct OpenWatch(Arc<Shared>);

impl OpenWatch {
    fn new(shared: Arc<Shared>) -> Self {
        shared.open_watches.fetch_add(1, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One watch response being streamed.
struct Watch {
    backlog: VecDeque<Bytes>,
    end_after_backlog: bool,
    live: broadcast::Receiver<Arc<Change>>,
    cuts: watch::Receiver<(u64, Cut)>,
    deadline: Instant,
    filter: Filter,
    _open: OpenWatch,
    done: bool,
}

type FrameResult = std::result::Result<Frame<Bytes>, std::io::Error>;

impl Watch {
    async fn next_frame(mut self) -> Option<(FrameResult, Self)> {
        if self.done {
            return None;
        }
        if let Some(l) = self.backlog.pop_front() {
            return Some((Ok(Frame::data(l)), self));
        }
        if self.end_after_backlog {
            return None;
        }
        loop {
            // A cut wins over pending changes: what was written after it must reach the
            // client through its next watch, not this one.
            tokio::select! {
                biased;
                cut = self.cuts.changed() => {
                    if cut.is_err() {
                        return None;
                    }
                    let how = self.cuts.borrow_and_update().1;
                    return match how {
                        Cut::Close => None,
                        Cut::Abort => {
                            self.done = true;
                            Some((Err(std::io::Error::other("watch aborted by the test")), self))
                        }
                    };
                }
                _ = tokio::time::sleep_until(self.deadline) => return None,
                change = self.live.recv() => match change {
                    Ok(change) => {
                        if let Some(l) = self.filter.render(&change) {
                            return Some((Ok(Frame::data(l)), self));
                        }
                    }
                    // Fell behind, or the server is going away: end the watch.
                    Err(_) => return None,
                },
            }
        }
    }
}

/// A request's collection, namespace and selectors.
struct Filter {
    collection: Collection,
    namespace: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
    bookmarks: bool,
}

impl Filter {
    fn new(target: &Target, query: &BTreeMap<String, String>) -> Result<Self, String> {
        Ok(Self {
            collection: target.collection.clone(),
            namespace: target.namespace.clone(),
            labels: match query.get("labelSelector") {
                Some(s) => parse_label_selector(s)?,
                None => Vec::new(),
            },
            fields: match query.get("fieldSelector") {
                Some(s) => parse_field_selector(s)?,
                None => Vec::new(),
            },
            bookmarks: query
                .get("allowWatchBookmarks")
                .is_some_and(|b| b == "true"),
        })
    }

    fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        let ns = meta["namespace"].as_str().unwrap_or_default();
        if self.namespace.as_deref().is_some_and(|want| want != ns) {
            return false;
        }
        let empty = serde_json::Map::new();
        let labels = meta["labels"].as_object().unwrap_or(&empty);
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.labels.iter().all(|r| r.matches(label(r.key())))
            && self.fields.iter().all(|f| f.matches(meta))
    }

    /// The event line this watch sends for `change`, if any.
    fn render(&self, change: &Change) -> Option<Bytes> {
        if change.collection != self.collection {
            return None;
        }
        let (api_version, _) = &self.collection;
        match change.event {
            EventType::Bookmark => self.bookmarks.then(|| {
                line(&json!({
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": api_version,
                        "kind": "Bookmark",
                        "metadata": {"resourceVersion": change.rv.to_string()},
                    },
                }))
            }),
            EventType::Added => self
                .matches(&change.object)
                .then(|| event_line(EventType::Added, &change.object)),
            EventType::Deleted => self
                .matches(&change.object)
                .then(|| event_line(EventType::Deleted, &change.object)),
            EventType::Modified => {
                let was = change.previous.as_ref().is_some_and(|p| self.matches(p));
                let is = self.matches(&change.object);
                let event = match (was, is) {
                    (true, true) => EventType::Modified,
                    (false, true) => EventType::Added,
                    (true, false) => EventType::Deleted,
                    (false, false) => return None,
                };
                Some(event_line(event, &change.object))
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
}

impl LabelReq {
    fn key(&self) -> &str {
        match self {
            Self::Exists(k) | Self::NotExists(k) | Self::In(k, _) | Self::NotIn(k, _) => k,
        }
    }

    fn matches(&self, value: Option<&str>) -> bool {
        match self {
            Self::Exists(_) => value.is_some(),
            Self::NotExists(_) => value.is_none(),
            Self::In(_, set) => value.is_some_and(|v| set.contains(v)),
            Self::NotIn(_, set) => value.is_none_or(|v| !set.contains(v)),
        }
    }
}

/// Parses a label selector as apimachinery's `labels.Parse` does, for the operators
/// listed in the module doc.
fn parse_label_selector(s: &str) -> Result<Vec<LabelReq>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    let bad = |t: &str| format!("unable to parse requirement {t:?} of labelSelector {s:?}");
    let mut reqs = Vec::new();
    for term in terms.into_iter().map(str::trim).filter(|t| !t.is_empty()) {
        let req = if let Some(key) = term.strip_prefix('!') {
            LabelReq::NotExists(check_key(key.trim()).ok_or_else(|| bad(term))?)
        } else if let Some((key, value)) = term.split_once("!=") {
            LabelReq::NotIn(
                check_key(key.trim()).ok_or_else(|| bad(term))?,
                [value.trim().to_string()].into(),
            )
        } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
            LabelReq::In(
                check_key(key.trim()).ok_or_else(|| bad(term))?,
                [value.trim().to_string()].into(),
            )
        } else if let Some((left, set)) = term.split_once('(') {
            let set = set.strip_suffix(')').ok_or_else(|| bad(term))?;
            let set: BTreeSet<String> = set.split(',').map(|v| v.trim().to_string()).collect();
            match left.split_whitespace().collect::<Vec<_>>().as_slice() {
                [key, "in"] => LabelReq::In(check_key(key).ok_or_else(|| bad(term))?, set),
                [key, "notin"] => LabelReq::NotIn(check_key(key).ok_or_else(|| bad(term))?, set),
                _ => return Err(bad(term)),
            }
        } else {
            LabelReq::Exists(check_key(term).ok_or_else(|| bad(term))?)
        };
        reqs.push(req);
    }
    Ok(reqs)
}

fn check_key(key: &str) -> Option<String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| key.to_string())
}

#[derive(Debug, PartialEq, Eq)]
struct FieldReq {
    field: String,
    value: String,
    equal: bool,
}

impl FieldReq {
    fn matches(&self, meta: &Value) -> bool {
        let actual = match self.field.as_str() {
            "metadata.name" => meta["name"].as_str(),
            "metadata.namespace" => meta["namespace"].as_str(),
            _ => None,
        }
        .unwrap_or_default();
        (actual == self.value) == self.equal
    }
}

/// Field selectors on `metadata.name` and `metadata.namespace`, which every kind
/// supports; the API server refuses other fields unless the kind adds them.
fn parse_field_selector(s: &str) -> Result<Vec<FieldReq>, String> {
    let mut reqs = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            (f, v, true)
        } else {
            return Err(format!("invalid field selector term {term:?}"));
        };
        let field = field.trim();
        if !matches!(field, "metadata.name" | "metadata.namespace") {
            return Err(format!("field label not supported: {field}"));
        }
        reqs.push(FieldReq {
            field: field.to_string(),
            value: value.trim().to_string(),
            equal,
        });
    }
    Ok(reqs)
}

fn line(v: &Value) -> Bytes {
    let mut out = serde_json::to_vec(v).expect("JSON values serialize");
    out.push(b'\n');
    Bytes::from(out)
}

fn event_line(event: EventType, obj: &Value) -> Bytes {
    line(&json!({"type": event.as_str(), "object": obj}))
}

fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    let bytes = Bytes::from(serde_json::to_vec(body).expect("JSON values serialize"));
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(bytes).map_err(|never| match never {}).boxed())
        .expect("a valid response")
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json_response(code, &status_body(code.as_u16(), reason, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_parse_like_apimachinery() {
        let reqs = parse_label_selector("!a/b, c=d,e==f,g!=h,i in (j, k),l notin (m),n").unwrap();
        assert_eq!(
            reqs,
            vec![
                LabelReq::NotExists("a/b".into()),
                LabelReq::In("c".into(), ["d".to_string()].into()),
                LabelReq::In("e".into(), ["f".to_string()].into()),
                LabelReq::NotIn("g".into(), ["h".to_string()].into()),
                LabelReq::In("i".into(), ["j".to_string(), "k".to_string()].into()),
                LabelReq::NotIn("l".into(), ["m".to_string()].into()),
                LabelReq::Exists("n".into()),
            ]
        );
        assert!(parse_label_selector("a in b").is_err());
        assert!(parse_label_selector("!").is_err());
    }

    #[test]
    fn field_selectors_know_metadata_only() {
        assert_eq!(
            parse_field_selector("metadata.name=n1").unwrap(),
            vec![FieldReq {
                field: "metadata.name".into(),
                value: "n1".into(),
                equal: true
            }]
        );
        assert!(parse_field_selector("spec.nodeName=n1").is_err());
    }

    #[test]
    fn paths_name_collections() {
        let t = parse_path("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices").unwrap();
        assert_eq!(
            t.collection,
            ("discovery.k8s.io/v1".into(), "endpointslices".into())
        );
        assert_eq!(t.namespace.as_deref(), Some("default"));
        assert!(t.name.is_none());
        let t = parse_path("/api/v1/nodes/node-1").unwrap();
        assert_eq!(t.collection, ("v1".into(), "nodes".into()));
        assert_eq!(t.name.as_deref(), Some("node-1"));
        assert!(parse_path("/healthz").is_none());
    }
}

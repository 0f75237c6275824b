//! Helpers for tests of Kubernetes API clients against the real kube-apiserver of a
//! [`Cluster`] (usually [`super::shared_control_plane`]): a namespace of one's own,
//! clients whose requests are recorded (or shown to a hook before they are sent),
//! a client of another identity, and etcd compaction.
//!
//! Tests of one binary share one control plane and run in parallel, so each works in
//! its own namespace and gives cluster-scoped objects (Nodes, ClusterRoles) names of
//! its own ([`unique`]).

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{Ipv4Addr, TcpStream},
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::{api::PostParams, client::ClientBuilder, Api, Client};

use super::{Cluster, Forwarder};

/// A request as the client sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
}

impl Recorded {
    fn of<B>(req: &http::Request<B>) -> Self {
        Self {
            method: req.method().to_string(),
            path: req.uri().path().to_string(),
            query: req
                .uri()
                .query()
                .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default(),
        }
    }

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

/// The requests a recording client sent, in order.
#[derive(Clone, Debug, Default)]
pub struct Requests(Arc<Mutex<Vec<Recorded>>>);

impl Requests {
    pub fn all(&self) -> Vec<Recorded> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The requests after the first `n`.
    pub fn since(&self, n: usize) -> Vec<Recorded> {
        self.all().split_off(n)
    }
}

/// A name no other caller in this process gets: `prefix-N`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::SeqCst))
}

/// A client with `config` whose every request is shown to `on_request` before it is
/// sent (to record it, or to change something on the server at that exact point).
pub fn observed_client(
    config: kube::Config,
    on_request: impl Fn(&Recorded) + Send + Sync + 'static,
) -> Result<Client> {
    let on_request = Arc::new(on_request);
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        on_request(&Recorded::of(&req));
        req
    });
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

/// A client with `config` that records its requests.
pub fn recording_client(config: kube::Config) -> Result<(Client, Requests)> {
    let requests = Requests::default();
    let sink = requests.clone();
    let client = observed_client(config, move |r| sink.0.lock().unwrap().push(r.clone()))?;
    Ok((client, requests))
}

impl Cluster {
    /// The admin's client configuration, for tests that change it before building a
    /// client: another address ([`Cluster::config_via`]), another identity
    /// ([`kube::Config::auth_info`]`.impersonate`).
    pub async fn config(&self) -> Result<kube::Config> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.state.kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?)
    }

    /// The admin's configuration, connecting through `forwarder` (which forwards to
    /// this cluster's API server) instead of straight to the API server.
    pub async fn config_via(&self, forwarder: &Forwarder) -> Result<kube::Config> {
        let mut config = self.config().await?;
        config.cluster_url = format!("https://{}", forwarder.addr()).parse()?;
        Ok(config)
    }

    /// A forwarder to this cluster's API server, listening on `127.0.0.1:port` in
    /// `netns` (`None`: this process's namespace; port 0: any free port).
    pub fn forwarder(&self, netns: Option<&str>, port: u16) -> Result<Forwarder> {
        Forwarder::start(netns, port, self.state.apiserver_port)
    }

    /// Creates a namespace named `unique(prefix)` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let name = unique(prefix);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name},
        }))?;
        Api::<Namespace>::all(self.client().await?)
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(name)
    }

    /// Compacts etcd's history up to its current revision (through etcd's HTTP
    /// gateway), as etcd's periodic compaction does: watches that resume from an older
    /// resourceVersion get `410 Gone`, unless the API server's watch cache still
    /// serves them. Returns the revision compacted at.
    pub fn compact_etcd(&self) -> Result<u64> {
        let port: u16 = std::fs::read_to_string(self.state.dir.join("etcd.port"))?
            .trim()
            .parse()?;
        // Any key: the answer's header carries the store's current revision.
        let range = etcd_post(port, "/v3/kv/range", r#"{"key":"AA=="}"#)?;
        let revision: u64 = range["header"]["revision"]
            .as_str()
            .context("no revision in etcd's answer")?
            .parse()?;
        etcd_post(
            port,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )?;
        Ok(revision)
    }
}

/// A POST to etcd's HTTP gateway on the loopback; the JSON answer.
fn etcd_post(port: u16, path: &str, body: &str) -> Result<serde_json::Value> {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("no HTTP answer from etcd")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!("etcd {path}: {head}\n{body}");
    }
    Ok(serde_json::from_str(body)?)
}

//! Reaching the API server from a list of addresses (`--apiserver`), the next one
//! tried when a connection to one fails. Without kube-proxy the `kubernetes`
//! Service's ClusterIP is served only once this agent has programmed it, so the agent
//! is told the API servers' own addresses, as kube-proxy is told its `--master`
//! (https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kube-proxy/app/options.go).
//! A name is resolved by the system's resolver (`getaddrinfo`: the node's
//! `/etc/hosts` and resolver with the DaemonSet's `dnsPolicy: Default`), never by the
//! cluster's DNS, which itself needs Services.
//!
//! kube-rs builds one connection stack for one `cluster_url`
//! (kube-client's `ClientBuilder`); [`client`] builds the same stack (its TLS,
//! credentials and headers layers, from the same `kube::Config`) over a connector
//! that dials the list: each address in turn from the last that answered, each
//! verified by TLS as itself (its name or IP), so an API server's certificate need
//! not name the others.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use kube::client::ConfigExt as _;
use tower::ServiceExt as _;

/// How long one address may take to accept a connection and its TLS handshake
/// before the next is tried.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The port of an address given without one (kube-apiserver's `--secure-port`
/// default, and kubeadm's).
pub const DEFAULT_PORT: u16 = 6443;

/// One API server address: `HOST`, `HOST:PORT`, `[IPv6]:PORT` or an `https://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// As the URI's authority has it (`10.0.0.1:6443`, `[fd00::1]:6443`,
    /// `cp.example:6443`).
    pub authority: String,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.authority)
    }
}

/// Parses one `--apiserver` entry.
pub fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    let s = s.trim();
    let rest = match s.split_once("://") {
        Some(("https", rest)) => rest.trim_end_matches('/'),
        Some((scheme, _)) => {
            return Err(format!(
                "{s:?}: the API server is reached over https, not {scheme}"
            ))
        }
        None => s,
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace)
    {
        return Err(format!(
            "{s:?}: expected HOST, HOST:PORT, [IPv6]:PORT or https://HOST:PORT"
        ));
    }
    let authority = if let Ok(ip) = rest.parse::<std::net::Ipv6Addr>() {
        format!("[{ip}]:{DEFAULT_PORT}")
    } else if let Some(inner) = rest.strip_prefix('[') {
        let (ip, port) = inner
            .split_once(']')
            .ok_or_else(|| format!("{s:?}: an unclosed ["))?;
        ip.parse::<std::net::Ipv6Addr>()
            .map_err(|e| format!("{s:?}: {ip:?}: {e}"))?;
        match port {
            "" => format!("[{ip}]:{DEFAULT_PORT}"),
            p => format!("[{ip}]:{}", port_of(s, p.strip_prefix(':').unwrap_or("x"))?),
        }
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => format!("{host}:{}", port_of(s, port)?),
            None => format!("{rest}:{DEFAULT_PORT}"),
        }
    };
    authority
        .parse::<http::uri::Authority>()
        .map_err(|e| format!("{s:?}: {e}"))?;
    Ok(Endpoint { authority })
}

fn port_of(s: &str, p: &str) -> Result<u16, String> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("{s:?}: {p:?} is not a port")),
        Ok(p) => Ok(p),
    }
}

/// `--apiserver` entries, each possibly a comma-separated list, in order, without
/// repeats.
pub fn parse_list<S: AsRef<str>>(entries: &[S]) -> Result<Vec<Endpoint>, String> {
    let mut out: Vec<Endpoint> = Vec::new();
    for entry in entries {
        for part in entry.as_ref().split(',').filter(|p| !p.trim().is_empty()) {
            let e = parse_endpoint(part)?;
            if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    Ok(out)
}

/// The order the addresses are tried in for one connection: from `current` (the
/// last that answered), around the list.
pub fn order(len: usize, current: usize) -> impl Iterator<Item = usize> {
    (0..len).map(move |i| (current + i) % len.max(1))
}

/// `uri` sent to `endpoint` instead: its authority replaced, scheme and path kept.
pub fn retarget(uri: &http::Uri, endpoint: &Endpoint) -> Result<http::Uri, http::Error> {
    let mut parts = uri.clone().into_parts();
    parts.authority = Some(endpoint.authority.parse()?);
    if parts.scheme.is_none() {
        parts.scheme = Some(http::uri::Scheme::HTTPS);
    }
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some("/".parse()?);
    }
    Ok(http::Uri::from_parts(parts)?)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connector that dials the API servers in turn (see the module's documentation).
#[derive(Clone)]
pub struct Failover<C> {
    inner: C,
    endpoints: Arc<[Endpoint]>,
    /// The index of the address that answered last.
    current: Arc<AtomicUsize>,
    attempt: Duration,
}

impl<C> Failover<C> {
    pub fn new(inner: C, endpoints: Vec<Endpoint>, attempt: Duration) -> Self {
        Self {
            inner,
            endpoints: endpoints.into(),
            current: Arc::new(AtomicUsize::new(0)),
            attempt,
        }
    }
}

impl<C> tower::Service<http::Uri> for Failover<C>
where
    C: tower::Service<http::Uri> + Clone + Send + 'static,
    C::Future: Send,
    C::Response: Send,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each attempt waits for the inner connector's readiness itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (inner, endpoints, current, attempt) = (
            self.inner.clone(),
            self.endpoints.clone(),
            self.current.clone(),
            self.attempt,
        );
        Box::pin(async move {
            let start = current.load(Ordering::Relaxed);
            let mut failures = Vec::new();
            for k in order(endpoints.len(), start) {
                let ep = &endpoints[k];
                let target = retarget(&uri, ep)?;
                match tokio::time::timeout(attempt, inner.clone().oneshot(target)).await {
                    Ok(Ok(conn)) => {
                        if k != start {
                            current.store(k, Ordering::Relaxed);
                            tracing::warn!(
                                apiserver = %ep,
                                failed = %failures.join("; "),
                                "the API server's connection moved to the next address"
                            );
                        }
                        return Ok(conn);
                    }
                    Ok(Err(e)) => {
                        let e: BoxError = e.into();
                        failures.push(format!("{ep}: {}", crate::error_chain(&*e)));
                    }
                    Err(_) => {
                        failures.push(format!("{ep}: no connection within {}s", attempt.as_secs()))
                    }
                }
            }
            Err(format!("no API server address answered: {}", failures.join("; ")).into())
        })
    }
}

/// A client for `config`'s credentials and CA that reaches the API server at
/// `endpoints` (not empty), in turn: kube-rs's stack (TLS from the config, its
/// credentials, extra headers and read and write timeouts) over [`Failover`].
pub fn client(mut config: kube::Config, endpoints: Vec<Endpoint>) -> anyhow::Result<kube::Client> {
    let first = endpoints
        .first()
        .ok_or_else(|| anyhow::anyhow!("no API server address"))?;
    config.cluster_url = format!("https://{first}").parse()?;
    let https = config.rustls_https_connector()?;
    let mut connector =
        hyper_timeout::TimeoutConnector::new(Failover::new(https, endpoints, ATTEMPT_TIMEOUT));
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_take_the_forms_an_operator_writes() {
        for (entry, want) in [
            ("10.0.0.1", "10.0.0.1:6443"),
            ("10.0.0.1:443", "10.0.0.1:443"),
            ("https://10.0.0.1:6443/", "10.0.0.1:6443"),
            ("https://cp.example", "cp.example:6443"),
            ("cp.example:8443", "cp.example:8443"),
            ("fd00::1", "[fd00::1]:6443"),
            ("[fd00::1]:7443", "[fd00::1]:7443"),
            ("[fd00::1]", "[fd00::1]:6443"),
            (" localhost:6443 ", "localhost:6443"),
        ] {
            assert_eq!(parse_endpoint(entry).unwrap().authority, want, "{entry}");
        }
        for (entry, says) in [
            ("http://10.0.0.1:8080", "not http"),
            ("10.0.0.1:0", "is not a port"),
            ("10.0.0.1:http", "is not a port"),
            ("https://10.0.0.1:6443/api", "expected HOST"),
            ("user@cp:6443", "expected HOST"),
            ("[fd00::1:6443", "unclosed"),
            ("", "expected HOST"),
        ] {
            let err = parse_endpoint(entry).unwrap_err();
            assert!(err.contains(says), "{entry}: {err}");
        }
    }

    #[test]
    fn lists_are_comma_separated_repeatable_and_without_repeats() {
        let got = parse_list(&["10.0.0.1,10.0.0.2:6443", "cp.example", "10.0.0.1:6443,"]).unwrap();
        let got: Vec<_> = got.iter().map(|e| e.authority.as_str()).collect();
        assert_eq!(got, ["10.0.0.1:6443", "10.0.0.2:6443", "cp.example:6443"]);
        assert!(parse_list::<&str>(&[]).unwrap().is_empty());
        assert!(parse_list(&["10.0.0.1,http://x"]).is_err());
    }

    #[test]
    fn connections_start_at_the_last_address_that_answered() {
        assert_eq!(order(3, 0).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(3, 2).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(order(1, 0).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn a_request_is_sent_to_the_address_tried() {
        let uri: http::Uri = "https://10.0.0.1:6443/api/v1/services?watch=1"
            .parse()
            .unwrap();
        let ep = parse_endpoint("[fd00::2]:7443").unwrap();
        assert_eq!(
            retarget(&uri, &ep).unwrap().to_string(),
            "https://[fd00::2]:7443/api/v1/services?watch=1"
        );
    }

    /// The connector moves to the next address when one refuses, stays there for
    /// the next connection, and names every address when none answers.
    #[tokio::test]
    async fn the_next_address_is_dialed_when_one_fails() {
        use std::sync::Mutex;
        let dialed = Arc::new(Mutex::new(Vec::new()));
        let up = Arc::new(Mutex::new(vec!["b:1".to_string()]));
        let (d, u) = (dialed.clone(), up.clone());
        let inner = tower::service_fn(move |uri: http::Uri| {
            let (d, u) = (d.clone(), u.clone());
            async move {
                let host = uri.authority().unwrap().to_string();
                d.lock().unwrap().push(host.clone());
                match u.lock().unwrap().contains(&host) {
                    true => Ok(host),
                    false => Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
                }
            }
        });
        let endpoints = parse_list(&["a:1,b:1,c:1"]).unwrap();
        let mut f = Failover::new(inner, endpoints, Duration::from_secs(1));
        let uri: http::Uri = "https://a:1/version".parse().unwrap();
        use tower::Service as _;
        assert_eq!(f.call(uri.clone()).await.unwrap(), "b:1");
        assert_eq!(f.call(uri.clone()).await.unwrap(), "b:1");
        assert_eq!(*dialed.lock().unwrap(), ["a:1", "b:1", "b:1"]);
        *up.lock().unwrap() = vec!["a:1".to_string()];
        assert_eq!(f.call(uri.clone()).await.unwrap(), "a:1");
        up.lock().unwrap().clear();
        let err = f.call(uri).await.unwrap_err().to_string();
        assert!(
            err.starts_with("no API server address answered: a:1: connection refused; b:1: "),
            "{err}"
        );
        assert!(err.contains("c:1: connection refused"), "{err}");
    }
}

//! The small HTTP endpoint both binaries serve: `/metrics` (Prometheus' text format),
//! `/healthz` and `/livez` (200 `ok`, or 503 with the reason; or a JSON page of the
//! binary's, [`Status::health_json`]), and the paths a binary
//! adds ([`Status::extra`]); nothing else. A listener serves all of them or one
//! side ([`Paths`]): kube-proxy serves health and metrics on two ports. One request
//! per connection, no request body; anything it cannot read is closed.

use std::{future::Future, net::SocketAddr, pin::Pin, sync::Arc, time::Duration};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// What the endpoint serves.
pub trait Status: Send + Sync + 'static {
    /// The metrics, in the OpenMetrics text format.
    fn metrics(&self) -> String;
    /// `Ok` when healthy, else why not (the body of the 503).
    fn health(&self) -> Result<(), String>;
    /// `/livez`: `Ok` while the process does its work, else why not. By default
    /// always `Ok` (a process that answers is alive).
    fn live(&self) -> Result<(), String> {
        Ok(())
    }
    /// `/readyz`: `Some(Ok)` when ready (200 `ok`), `Some(Err)` with why not (503);
    /// `None` (the default) when the binary serves no `/readyz` (404).
    fn ready(&self) -> Option<Result<(), String>> {
        None
    }
    /// `/healthz` (`live`: `/livez`) as a JSON page, for a binary whose health has
    /// one: whether healthy (200, else 503) and the body. `None` (the default):
    /// [`Status::health`] and [`Status::live`] answer, in plain text.
    fn health_json(&self, live: bool) -> Option<(bool, String)> {
        let _ = live;
        None
    }
    /// Brings values read on demand up to date before `/metrics` renders them; waited
    /// for at most [`REFRESH_WAIT`] (then the last values are served).
    fn refresh(&self) -> Reply<'_, ()> {
        Box::pin(async {})
    }
    /// Another path this binary serves: `Some` with its answer (`Ok` body for a 200,
    /// `Err` reason for a 503), `None` for a 404.
    fn extra(&self, path: &str) -> Option<Reply<'_, Result<String, String>>> {
        let _ = path;
        None
    }
    /// A path this listener refuses (403) rather than answers: `Some` with the
    /// reason, checked before [`Status::extra`]. `None` (the default) for every path.
    fn forbidden(&self, path: &str) -> Option<String> {
        let _ = path;
        None
    }
}

/// Which paths a listener answers; the others are 404.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paths {
    /// `/metrics`, `/healthz`, `/livez` and the binary's own paths.
    All,
    /// `/healthz`, `/livez` and `/readyz` only: a health port other hosts probe.
    Health,
    /// `/metrics` and the binary's own paths ([`Status::extra`]).
    Metrics,
}

impl Paths {
    fn health(self) -> bool {
        matches!(self, Paths::All | Paths::Health)
    }
    fn metrics(self) -> bool {
        matches!(self, Paths::All | Paths::Metrics)
    }
}

/// An answer that takes a while to come.
pub type Reply<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long `/metrics` waits for [`Status::refresh`].
pub const REFRESH_WAIT: Duration = Duration::from_secs(1);

/// The longest request head read; a longer one is answered from what was read.
const MAX_HEAD: usize = 4096;

/// Binds `addr` and serves `/metrics` and `/healthz` until the task is dropped. Only
/// binding fails; a connection that fails is dropped alone.
pub async fn serve<S: Status + ?Sized>(addr: SocketAddr, status: Arc<S>) -> std::io::Result<()> {
    serve_on(tokio::net::TcpListener::bind(addr).await?, status).await
}

/// [`serve`] on a listener already bound.
pub async fn serve_on<S: Status + ?Sized>(
    listener: tokio::net::TcpListener,
    status: Arc<S>,
) -> std::io::Result<()> {
    serve_paths_on(listener, status, Paths::All).await
}

/// [`serve_on`], answering only `paths`.
pub async fn serve_paths_on<S: Status + ?Sized>(
    listener: tokio::net::TcpListener,
    status: Arc<S>,
    paths: Paths,
) -> std::io::Result<()> {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            // Out of file descriptors and the like: the next accept may work.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        tokio::spawn(answer(conn, status.clone(), paths));
    }
}

async fn answer<S: Status + ?Sized>(mut conn: tokio::net::TcpStream, status: Arc<S>, paths: Paths) {
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    // Read the request head (requests have no body here).
    while len < buf.len() {
        match conn.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let (code, ctype, body) = response(path, &*status, paths).await;
    let response = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(response.as_bytes()).await;
}

/// Status line, content type and body for a path.
async fn response<S: Status + ?Sized>(
    path: &str,
    status: &S,
    paths: Paths,
) -> (&'static str, &'static str, String) {
    let text = |r: Result<String, String>| match r {
        Ok(body) => ("200 OK", "text/plain", body),
        Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
    };
    let not_found = ("404 Not Found", "text/plain", "not found\n".to_string());
    match path {
        "/metrics" if paths.metrics() => {
            // A refresh that does not come in time leaves the last values.
            let _ = tokio::time::timeout(REFRESH_WAIT, status.refresh()).await;
            (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                status.metrics(),
            )
        }
        "/healthz" | "/livez" if paths.health() => {
            let live = path == "/livez";
            match status.health_json(live) {
                Some((true, body)) => ("200 OK", "application/json", body),
                Some((false, body)) => ("503 Service Unavailable", "application/json", body),
                None if live => text(status.live().map(|()| "ok\n".into())),
                None => text(status.health().map(|()| "ok\n".into())),
            }
        }
        "/readyz" if paths.health() => match status.ready() {
            Some(ready) => text(ready.map(|()| "ok\n".into())),
            None => not_found,
        },
        // The binary's own paths go with the metrics.
        _ if !paths.metrics() || matches!(path, "/metrics" | "/healthz" | "/livez" | "/readyz") => {
            not_found
        }
        _ => match status.forbidden(path) {
            Some(why) => ("403 Forbidden", "text/plain", format!("{why}\n")),
            None => match status.extra(path) {
                Some(reply) => text(reply.await),
                None => not_found,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Result<(), String>);

    impl Status for Fixed {
        fn metrics(&self) -> String {
            "# EOF\n".into()
        }
        fn health(&self) -> Result<(), String> {
            self.0.clone()
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_health_and_nothing_else() {
        for (health, code, body) in [
            (Ok(()), "200 OK", "ok\n"),
            (
                Err("not synced yet".to_string()),
                "503 Service Unavailable",
                "not synced yet\n",
            ),
        ] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(serve_on(listener, Arc::new(Fixed(health))));
            let healthz = get(addr, "/healthz").await;
            assert!(
                healthz.starts_with(&format!("HTTP/1.1 {code}\r\n")),
                "{healthz}"
            );
            assert!(healthz.ends_with(body), "{healthz}");
            let metrics = get(addr, "/metrics").await;
            assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
            assert!(metrics.ends_with("\r\n\r\n# EOF\n"), "{metrics}");
            let livez = get(addr, "/livez").await;
            assert!(livez.starts_with("HTTP/1.1 200 OK\r\n"), "{livez}");
            // A binary that serves no `/readyz` answers 404 for it.
            assert!(get(addr, "/readyz")
                .await
                .starts_with("HTTP/1.1 404 Not Found"));
            assert!(get(addr, "/other")
                .await
                .starts_with("HTTP/1.1 404 Not Found"));
            server.abort();
        }
    }

    /// A binary with JSON health pages: its verdict sets the code, its body is served
    /// as `application/json`, `/livez` asks for the live page.
    #[tokio::test]
    async fn json_health_pages_are_served_as_json() {
        struct Json;
        impl Status for Json {
            fn metrics(&self) -> String {
                "# EOF\n".into()
            }
            fn health(&self) -> Result<(), String> {
                Ok(())
            }
            fn health_json(&self, live: bool) -> Option<(bool, String)> {
                Some((live, format!("{{\"live\":{live}}}")))
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_on(listener, Arc::new(Json)));
        let healthz = get(addr, "/healthz").await;
        assert!(
            healthz.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{healthz}"
        );
        assert!(
            healthz.contains("Content-Type: application/json\r\n"),
            "{healthz}"
        );
        assert!(healthz.ends_with("{\"live\":false}"), "{healthz}");
        let livez = get(addr, "/livez").await;
        assert!(livez.starts_with("HTTP/1.1 200 OK\r\n"), "{livez}");
        assert!(livez.ends_with("{\"live\":true}"), "{livez}");
        server.abort();
    }

    /// A health listener answers `/healthz` and `/livez` only; a metrics listener
    /// `/metrics` and the binary's paths (refused ones with 403), not health.
    #[tokio::test]
    async fn a_listener_answers_only_its_side() {
        struct Extra;
        impl Status for Extra {
            fn metrics(&self) -> String {
                "# EOF\n".into()
            }
            fn health(&self) -> Result<(), String> {
                Ok(())
            }
            fn extra(&self, path: &str) -> Option<Reply<'_, Result<String, String>>> {
                (path == "/extra").then(|| -> Reply<'_, _> { Box::pin(async { Ok("x".into()) }) })
            }
            fn forbidden(&self, path: &str) -> Option<String> {
                (path == "/refused").then(|| "not here".into())
            }
        }
        for (paths, wanted) in [
            (
                Paths::Health,
                [
                    ("/healthz", "200"),
                    ("/livez", "200"),
                    ("/metrics", "404"),
                    ("/extra", "404"),
                    ("/refused", "404"),
                ],
            ),
            (
                Paths::Metrics,
                [
                    ("/healthz", "404"),
                    ("/livez", "404"),
                    ("/metrics", "200"),
                    ("/extra", "200"),
                    ("/refused", "403"),
                ],
            ),
            (
                Paths::All,
                [
                    ("/healthz", "200"),
                    ("/livez", "200"),
                    ("/metrics", "200"),
                    ("/extra", "200"),
                    ("/refused", "403"),
                ],
            ),
        ] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(serve_paths_on(listener, Arc::new(Extra), paths));
            for (path, code) in wanted {
                let reply = get(addr, path).await;
                assert!(
                    reply.starts_with(&format!("HTTP/1.1 {code} ")),
                    "{paths:?} {path}: {reply}"
                );
            }
            assert!(
                get(addr, "/refused").await.ends_with("\r\n\r\nnot here\n")
                    || paths == Paths::Health
            );
            server.abort();
        }
    }
}

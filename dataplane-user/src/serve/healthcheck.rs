//! kube-proxy's Service health checks (pkg/proxy/healthcheck/service_health.go): for
//! each Service that needs one (a `LoadBalancer` with `externalTrafficPolicy:
//! Local`), an HTTP server on its `healthCheckNodePort` that a cloud load balancer
//! asks whether to send this node traffic: one per family of the Service, as
//! kube-proxy's per-family proxiers have, on `0.0.0.0` counting its IPv4 endpoints
//! and on `[::]` (IPv6 only) counting its IPv6 ones. Any path is answered: 200 when
//! the node has ready endpoints of the family and the agent is healthy (its sync
//! rule, the Node left out, as kube-proxy's `serviceProxyHealthy`), 503 otherwise,
//! with kube-proxy's JSON body and headers (`X-Load-Balancing-Endpoint-Weight`: the
//! number of local endpoints).
//!
//! Servers follow the compiler's health checks after every sync: a Service gone or
//! whose port changed closes its server, a new one opens; a port that cannot be
//! listened on is reported and tried again at the next sync (kube-proxy does the
//! same: the instance is not kept). Counts change in place.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{compiler::HealthCheck, serve::metrics::Metrics};

/// A Service's health-check servers, one per family it has.
struct Instance {
    port: u16,
    families: (Option<bool>, Option<bool>),
    local: [Arc<AtomicU32>; 2],
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // The listeners are the tasks': aborting them closes the ports.
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Which families a health check serves (their presence, not their counts).
fn families(hc: &HealthCheck) -> (Option<bool>, Option<bool>) {
    (hc.local4.map(|_| false), hc.local6.map(|_| true))
}

/// The health-check servers of this node, by Service (namespace, name).
pub struct ServiceHealth {
    servers: BTreeMap<(String, String), Instance>,
    /// The agent's metrics, whose health the answers include.
    metrics: Arc<Metrics>,
}

/// A port that could not be listened on.
#[derive(Debug)]
pub struct ListenFailed {
    pub service: (String, String),
    pub port: u16,
    pub error: std::io::Error,
}

impl ServiceHealth {
    /// No servers yet; the answers include the health `metrics` keeps.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            servers: BTreeMap::new(),
            metrics,
        }
    }

    /// Brings the servers to `wanted` (kube-proxy's `SyncServices` and
    /// `SyncEndpoints` together). Needs a tokio runtime. Returns the ports that
    /// could not be listened on, to be tried again at the next call.
    pub fn sync(&mut self, wanted: &BTreeMap<(String, String), HealthCheck>) -> Vec<ListenFailed> {
        self.servers.retain(|service, i| {
            wanted
                .get(service)
                .is_some_and(|w| w.port == i.port && families(w) == i.families)
        });
        let mut failed = Vec::new();
        for (service, hc) in wanted {
            if let Some(i) = self.servers.get(service) {
                i.local[0].store(hc.local4.unwrap_or(0), Ordering::Relaxed);
                i.local[1].store(hc.local6.unwrap_or(0), Ordering::Relaxed);
                continue;
            }
            match self.open(service, hc) {
                Ok(i) => {
                    tracing::info!(service = %format!("{}/{}", service.0, service.1), port = hc.port, "opened the Service's health check");
                    self.servers.insert(service.clone(), i);
                }
                Err(error) => failed.push(ListenFailed {
                    service: service.clone(),
                    port: hc.port,
                    error,
                }),
            }
        }
        failed
    }

    /// How many Services have a health-check server open.
    pub fn open_count(&self) -> usize {
        self.servers.len()
    }

    fn open(&self, service: &(String, String), hc: &HealthCheck) -> std::io::Result<Instance> {
        let local = [
            Arc::new(AtomicU32::new(hc.local4.unwrap_or(0))),
            Arc::new(AtomicU32::new(hc.local6.unwrap_or(0))),
        ];
        let mut instance = Instance {
            port: hc.port,
            families: families(hc),
            local,
            tasks: Vec::new(),
        };
        for (v6, present) in [(false, hc.local4.is_some()), (true, hc.local6.is_some())] {
            if !present {
                continue;
            }
            // Dropping the instance on an error closes what was opened.
            let listener = listen(v6, hc.port)?;
            let (count, health, service) = (
                instance.local[usize::from(v6)].clone(),
                self.metrics.clone(),
                service.clone(),
            );
            instance.tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((conn, _)) = listener.accept().await else {
                        continue;
                    };
                    let (count, health, service) = (count.clone(), health.clone(), service.clone());
                    tokio::spawn(async move {
                        let endpoints = count.load(Ordering::Relaxed);
                        let healthy = health
                            .health
                            .proxy_healthy_at(std::time::Instant::now())
                            .is_ok();
                        let _ = answer(conn, &service, endpoints, healthy).await;
                    });
                }
            }));
        }
        Ok(instance)
    }
}

/// A listener on `port` of every address of one family: `0.0.0.0`, or `[::]` for
/// IPv6 alone (so both families' servers can hold the port).
fn listen(v6: bool, port: u16) -> std::io::Result<tokio::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let (domain, addr) = if v6 {
        (
            Domain::IPV6,
            std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
        )
    } else {
        (
            Domain::IPV4,
            std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
        )
    };
    let socket = Socket::new(domain, Type::STREAM, None)?;
    if v6 {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    tokio::net::TcpListener::from_std(socket.into())
}

/// Reads the request's head (any method and path, at most 8 KiB, for at most 5 s)
/// and writes the answer.
async fn answer(
    mut conn: tokio::net::TcpStream,
    service: &(String, String),
    endpoints: u32,
    healthy: bool,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            let n = conn.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        std::io::Result::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    conn.write_all(response(service, endpoints, healthy).as_bytes())
        .await?;
    conn.shutdown().await
}

/// The whole HTTP response kube-proxy's `hcHandler` gives: 200 with local endpoints
/// and a healthy proxy, else 503; its JSON body, as its dedented template prints it
/// (tabs, Go's `%q` for the names).
pub fn response(service: &(String, String), endpoints: u32, healthy: bool) -> String {
    let status = match endpoints != 0 && healthy {
        true => "200 OK",
        false => "503 Service Unavailable",
    };
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {endpoints},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        go_quote(&service.0),
        go_quote(&service.1),
    );
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nX-Load-Balancing-Endpoint-Weight: {endpoints}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A string as Go's `%q` prints it, for the characters a Kubernetes name can hold
/// (DNS labels: letters, digits, `-`, `.`); anything else escaped as JSON does.
fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body byte for byte as kube-proxy's template gives it
    /// (healthcheck_test.go's expectations: `localEndpoints` and
    /// `serviceProxyHealthy`), and the status from both.
    #[test]
    fn answers_as_kube_proxy() {
        let svc = ("ns".to_string(), "web".to_string());
        let ok = response(&svc, 2, true);
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("\r\nX-Load-Balancing-Endpoint-Weight: 2\r\n"));
        assert!(ok.contains("\r\nContent-Type: application/json\r\n"));
        assert!(ok.contains("\r\nX-Content-Type-Options: nosniff\r\n"));
        let body = ok.split("\r\n\r\n").nth(1).unwrap();
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["service"]["name"], "web");
        assert!(response(&svc, 0, true).starts_with("HTTP/1.1 503 "));
        assert!(response(&svc, 3, false).starts_with("HTTP/1.1 503 "));
    }
}

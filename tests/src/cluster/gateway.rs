//! The lab's gateway between the control plane on the root namespace's loopback and
//! the lab's namespaces, for real nodes (`--kubelet real`). It runs in the
//! control-plane namespace (`PREFIX-cp`, 10.100.0.2 on the node network, the API
//! server's advertised address) and does two things:
//!
//! - **Into the control plane.** It listens on the advertised address at the API
//!   server's port and forwards every connection to the API server on the root
//!   namespace's loopback: kubelets, CoreDNS (through the `kubernetes` Service) and
//!   the e2e suite reach the API server the way they would on a real cluster.
//! - **Out of the control plane.** It is the API server's egress: an HTTP CONNECT
//!   proxy on a Unix socket, named by the API server's egress selector for its
//!   `cluster` traffic (kubelets for exec, logs and port-forward; the pod, service
//!   and node proxy subresources). Each connection is made from inside the
//!   control-plane namespace, so the API server in the root namespace never opens a
//!   socket to a lab address, and only to the lab's own ranges: anything else is
//!   refused with 403. The egress selector's format and its HTTP CONNECT exchange are
//!   those of
//!   <https://github.com/kubernetes/apiserver/blob/v0.37.2/pkg/server/egressselector/egress_selector.go>.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
};

use crate::netns;

/// What the gateway serves.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// The control-plane namespace: listeners and outbound connections live there.
    pub netns: String,
    /// Addresses to listen on in the namespace, each forwarded to the API server.
    pub listen: Vec<SocketAddr>,
    /// The API server's port on the root namespace's loopback.
    pub apiserver_port: u16,
    /// The Unix socket of the API server's egress.
    pub egress_socket: PathBuf,
    /// The only networks the egress connects to: the lab's.
    pub allow: Vec<(IpAddr, u8)>,
}

/// Whether `ip` is in the network `net/len`.
pub fn contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// Parses `ADDR/LEN`.
pub fn parse_cidr(text: &str) -> Result<(IpAddr, u8)> {
    let (addr, len) = text
        .split_once('/')
        .with_context(|| format!("{text}: not ADDR/LEN"))?;
    let addr: IpAddr = addr
        .parse()
        .with_context(|| format!("{text}: the address"))?;
    let len: u8 = len.parse().with_context(|| format!("{text}: the length"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        bail!("{text}: a prefix longer than {max}");
    }
    Ok((addr, len))
}

/// Runs the gateway until the process is killed.
pub async fn run(cfg: GatewayConfig) -> Result<()> {
    for addr in &cfg.listen {
        let addr = *addr;
        let listener = netns::in_netns(&cfg.netns, move || -> std::io::Result<_> {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?
        .with_context(|| format!("listening on {addr} in {}", cfg.netns))?;
        let listener = TcpListener::from_std(listener)?;
        let port = cfg.apiserver_port;
        tracing::info!(%addr, port, "forwarding to the API server");
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Err(e) = to_apiserver(inbound, port).await {
                        tracing::debug!("a connection to the API server: {e:#}");
                    }
                });
            }
        });
    }
    let _ = std::fs::remove_file(&cfg.egress_socket);
    let egress = UnixListener::bind(&cfg.egress_socket)
        .with_context(|| format!("listening on {}", cfg.egress_socket.display()))?;
    tracing::info!(socket = %cfg.egress_socket.display(), "serving the API server's egress");
    loop {
        let (conn, _) = egress.accept().await?;
        let cfg = cfg.clone();
        tokio::spawn(async move {
            if let Err(e) = connect_for_apiserver(conn, &cfg).await {
                tracing::warn!("the API server's egress: {e:#}");
            }
        });
    }
}

async fn to_apiserver(mut inbound: TcpStream, port: u16) -> Result<()> {
    let mut out = TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).await?;
    tokio::io::copy_bidirectional(&mut inbound, &mut out).await?;
    Ok(())
}

/// Reads an HTTP CONNECT request head, byte by byte so that nothing after it is
/// consumed; returns its target.
async fn read_connect(conn: &mut UnixStream) -> Result<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 {
            bail!("a request head over 8 KiB");
        }
        let mut b = [0u8; 1];
        if conn.read(&mut b).await? == 0 {
            bail!("the API server closed the connection within the request head");
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let line = head.lines().next().unwrap_or_default();
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("CONNECT"), Some(target)) => Ok(target.to_string()),
        _ => bail!("not a CONNECT request: {line:?}"),
    }
}

async fn connect_for_apiserver(mut conn: UnixStream, cfg: &GatewayConfig) -> Result<()> {
    let target = read_connect(&mut conn).await?;
    let addr: SocketAddr = match target.parse() {
        Ok(a) => a,
        Err(_) => {
            conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await?;
            bail!("CONNECT {target}: not an address and port (the lab names no hosts)");
        }
    };
    if !cfg
        .allow
        .iter()
        .any(|(net, len)| contains(*net, *len, addr.ip()))
    {
        conn.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await?;
        bail!("CONNECT {addr}: outside the lab's networks, refused");
    }
    let ns = cfg.netns.clone();
    let dialed = tokio::task::spawn_blocking(move || {
        netns::in_netns(&ns, move || -> std::io::Result<std::net::TcpStream> {
            let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    })
    .await?;
    let mut out = match dialed.and_then(|r| r.map_err(anyhow::Error::from)) {
        Ok(s) => TcpStream::from_std(s)?,
        Err(e) => {
            conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await?;
            bail!("CONNECT {addr}: {e:#}");
        }
    };
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tracing::debug!(%addr, "egress connection");
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut out).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_holds_its_own_addresses_only() {
        let (net, len) = parse_cidr("10.244.0.0/16").unwrap();
        assert!(contains(net, len, "10.244.3.7".parse().unwrap()));
        assert!(!contains(net, len, "10.245.0.1".parse().unwrap()));
        assert!(!contains(net, len, "fd00:10:244::1".parse().unwrap()));
        let (net, len) = parse_cidr("fd00:10:244::/56").unwrap();
        assert!(contains(net, len, "fd00:10:244:1::5".parse().unwrap()));
        assert!(!contains(net, len, "fd00:10:245::5".parse().unwrap()));
        assert!(parse_cidr("10.0.0.0/33").is_err());
    }
}

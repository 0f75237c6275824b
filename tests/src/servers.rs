//! Backend servers and the client side of the lab's tiny protocol.
//!
//! Each backend answers on TCP and UDP with `NAME IP`. Over TCP, a request line
//! `hello` gets that line back; `stream N` gets the line followed by N bytes of a
//! known pattern, so the client can check that a long transfer arrived intact;
//! `echo` gets the line and then every further line echoed back, for connections that
//! stay open. An HTTP `GET` gets the line as an HTTP/1.1 response, for curl.
//!
//! SCTP speaks the same protocol: a one-to-one style SCTP socket (`SOCK_STREAM`,
//! RFC 6458) is read and written as a TCP stream is, so the TCP code serves it
//! through std's stream types.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::{in_netns, Pod};

/// Who answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reply {
    pub backend: String,
    pub addr: Ipv4Addr,
    /// The client as the backend saw it (its peer address), when it said.
    pub peer: Option<std::net::SocketAddr>,
}

/// The servers of all backends; stopped on drop.
pub struct BackendServers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Byte `i` of a stream.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

impl BackendServers {
    pub fn start(pods: &[Pod], port: u16) -> Result<Self> {
        Self::start_at(pods, port, false)
    }

    /// [`BackendServers::start`] bound to each pod's own IPv4 address rather than to
    /// every address: a server in the node's network namespace (a host-network
    /// backend) then answers UDP from the address it was asked at, as a server
    /// bound to its address does (one bound to all answers from the address of the
    /// route back).
    pub fn start_bound(pods: &[Pod], port: u16) -> Result<Self> {
        Self::start_at(pods, port, true)
    }

    fn start_at(pods: &[Pod], port: u16, bound: bool) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for pod in pods {
            // A pod of a dual-stack lab answers on its IPv6 address too, with the
            // same identity (its name and IPv4 address); the peer it adds tells the
            // family the client came in by.
            let ident = format!("{} {}\n", pod.name, pod.ip);
            let v4 = if bound { pod.ip } else { Ipv4Addr::UNSPECIFIED };
            let mut addrs = vec![SocketAddr::from((v4, port))];
            addrs.extend(pod.ip6.map(|ip6| SocketAddr::from((ip6, port))));
            for addr in addrs {
                let (tcp, udp) =
                    in_netns(&pod.ns, move || -> Result<(TcpListener, UdpSocket)> {
                        let tcp = TcpListener::bind(addr)?;
                        tcp.set_nonblocking(true)?;
                        let udp = UdpSocket::bind(addr)?;
                        udp.set_read_timeout(Some(Duration::from_millis(100)))?;
                        Ok((tcp, udp))
                    })??;
                let (s, id) = (stop.clone(), ident.clone());
                threads.push(std::thread::spawn(move || serve_tcp(tcp, id, s)));
                let (s, id) = (stop.clone(), ident.clone());
                threads.push(std::thread::spawn(move || serve_udp(udp, id, s)));
            }
        }
        Ok(Self { stop, threads })
    }
}

impl BackendServers {
    /// Servers answering on SCTP at `port`, as [`BackendServers::start`] does on TCP.
    pub fn start_sctp(pods: &[Pod], port: u16) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for pod in pods {
            let ident = format!("{} {}\n", pod.name, pod.ip);
            let listener = in_netns(&pod.ns, move || -> Result<TcpListener> {
                let l = sctp_listener(port)?;
                l.set_nonblocking(true)?;
                Ok(l)
            })??;
            let s = stop.clone();
            threads.push(std::thread::spawn(move || serve_tcp(listener, ident, s)));
        }
        Ok(Self { stop, threads })
    }
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// An SCTP listener on every address at `port`.
fn sctp_listener(port: u16) -> std::io::Result<TcpListener> {
    use std::os::fd::AsRawFd;
    let fd = sliceway_agent::kernel::sctp_socket()?;
    let sa = sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `sa` is a valid sockaddr_in of `len` bytes for the call's duration.
    if unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            len,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: listen(2) on a socket this function owns.
    if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(TcpListener::from(fd))
}

/// Opens an SCTP association to `to`, sends `hello`, reads the answer.
pub fn sctp_request(to: SocketAddrV4, timeout: Duration) -> Result<Reply> {
    use std::os::fd::AsRawFd;
    let fd = sliceway_agent::kernel::sctp_socket().context("opening an SCTP socket")?;
    let conn = TcpStream::from(fd);
    // A blocking connect bounded by the send timeout (SO_SNDTIMEO bounds connect(2)).
    conn.set_write_timeout(Some(timeout))?;
    conn.set_read_timeout(Some(timeout))?;
    let sa = sockaddr(to);
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `sa` is a valid sockaddr_in of `len` bytes for the call's duration.
    if unsafe {
        libc::connect(
            conn.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            len,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("SCTP association to {to}"));
    }
    (&conn).write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .with_context(|| format!("reading from {to} over SCTP"))?;
    parse_ident(&line)
}

impl Drop for BackendServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve_tcp(listener: TcpListener, ident: String, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((conn, _)) => {
                let ident = ident.clone();
                std::thread::spawn(move || {
                    let _ = handle_tcp(conn, &ident);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn handle_tcp(conn: TcpStream, ident: &str) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut conn = conn;
    if line.starts_with("GET ") {
        // An HTTP client (curl from `cluster exec`): skip its headers, answer HTTP.
        let mut header = String::new();
        while reader.read_line(&mut header)? > 2 {
            header.clear();
        }
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{ident}",
            ident.len()
        );
        return conn.write_all(reply.as_bytes());
    }
    match conn.peer_addr() {
        Ok(peer) => conn.write_all(format!("{} {peer}\n", ident.trim_end()).as_bytes())?,
        Err(_) => conn.write_all(ident.as_bytes())?,
    }
    if line.trim() == "echo" {
        // Idle for as long as a test may keep a connection open across an agent's
        // restart (under the VM tier's emulation, loading and verifying the programs
        // again takes more than a minute).
        conn.set_read_timeout(Some(Duration::from_secs(600)))?;
        loop {
            let mut l = String::new();
            if reader.read_line(&mut l)? == 0 {
                return Ok(());
            }
            conn.write_all(l.as_bytes())?;
        }
    }
    if let Some(n) = line
        .trim()
        .strip_prefix("stream ")
        .and_then(|n| n.parse::<usize>().ok())
    {
        let mut buf = vec![0u8; 64 * 1024];
        let mut sent = 0;
        while sent < n {
            let len = buf.len().min(n - sent);
            for (j, b) in buf[..len].iter_mut().enumerate() {
                *b = pattern(sent + j);
            }
            conn.write_all(&buf[..len])?;
            sent += len;
        }
    }
    conn.flush()
}

fn serve_udp(socket: UdpSocket, ident: String, stop: Arc<AtomicBool>) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) {
        if let Ok((_, peer)) = socket.recv_from(&mut buf) {
            let answer = format!("{} {peer}\n", ident.trim_end());
            let _ = socket.send_to(answer.as_bytes(), peer);
        }
    }
}

/// Any address of `to`'s family, port 0: where a client socket binds.
fn unspecified(to: &SocketAddr) -> SocketAddr {
    match to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

pub(crate) fn parse_ident(line: &str) -> Result<Reply> {
    let mut parts = line.split_whitespace();
    let (Some(name), Some(addr)) = (parts.next(), parts.next()) else {
        bail!("unexpected answer {line:?}")
    };
    Ok(Reply {
        backend: name.to_string(),
        addr: addr.parse()?,
        peer: parts.next().and_then(|p| p.parse().ok()),
    })
}

/// Connects, sends `hello`, reads the answer.
pub fn tcp_request(to: impl Into<SocketAddr>, timeout: Duration) -> Result<Reply> {
    let to = to.into();
    let (line, _) = tcp_exchange(to, timeout).with_context(|| format!("TCP request to {to}"))?;
    parse_ident(&line)
}

/// Sends one datagram, reads the answer, from a source port no earlier request of
/// this process took ([`fresh_udp_port`]).
pub fn udp_request(to: impl Into<SocketAddr>, timeout: Duration) -> Result<Reply> {
    udp_request_from(fresh_udp_port(), to, timeout)
}

/// Source ports for [`udp_request`]: below the NodePort range and the kernel's
/// ephemeral range, so nothing else in a lab namespace holds them.
const FRESH_UDP_PORTS: std::ops::RangeInclusive<u16> = 20_000..=29_999;

/// A source port for a UDP request that no earlier request of this process used
/// (until 10,000 requests wrap the range). A port the kernel picks at random may be
/// one an earlier request took, whose flow the datapath still tracks: the request
/// then rides that flow, and a test counting new flows counts one too few. Issue 46:
/// a two-node test saw 39 masquerades of 40 with no SYN retransmitted.
pub fn fresh_udp_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    nth_fresh_udp_port(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The `n`th port [`fresh_udp_port`] hands out.
fn nth_fresh_udp_port(n: u32) -> u16 {
    let span = u32::from(FRESH_UDP_PORTS.end() - FRESH_UDP_PORTS.start()) + 1;
    // n % span < span, so the sum stays within the range.
    FRESH_UDP_PORTS.start() + (n % span) as u16
}

/// [`udp_request`] from source port `port` (0: one the kernel picks at random).
pub fn udp_request_from(port: u16, to: impl Into<SocketAddr>, timeout: Duration) -> Result<Reply> {
    let to = to.into();
    let (answer, _) = udp_exchange_from(port, to, timeout)
        .with_context(|| format!("no UDP answer from {to} (source port {port}, 0: any)"))?;
    parse_ident(&answer)
}

/// A TCP request's exchange: connects, sends `hello`, reads the answer's line; the
/// line (`NAME ADDR PEER`) and the socket's peer name (`getpeername`). The I/O error
/// as it came, so a caller can tell a refusal from a timeout.
pub fn tcp_exchange(to: SocketAddr, timeout: Duration) -> std::io::Result<(String, SocketAddr)> {
    let conn = TcpStream::connect_timeout(&to, timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    (&conn).write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    Ok((line, conn.peer_addr()?))
}

/// [`tcp_exchange`] over UDP: one datagram from a connected socket, its answer.
pub fn udp_exchange(to: SocketAddr, timeout: Duration) -> std::io::Result<(String, SocketAddr)> {
    udp_exchange_from(0, to, timeout)
}

/// [`udp_exchange`] from source port `port` (0: one the kernel picks at random).
pub fn udp_exchange_from(
    port: u16,
    to: SocketAddr,
    timeout: Duration,
) -> std::io::Result<(String, SocketAddr)> {
    let mut from = unspecified(&to);
    from.set_port(port);
    let socket = UdpSocket::bind(from)?;
    socket.set_read_timeout(Some(timeout))?;
    socket.connect(to)?;
    socket.send(b"hello")?;
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf)?;
    Ok((
        String::from_utf8_lossy(&buf[..n]).into_owned(),
        socket.peer_addr()?,
    ))
}

/// Asks for `bytes` bytes and checks each of them.
pub fn tcp_stream(to: impl Into<SocketAddr>, bytes: usize, timeout: Duration) -> Result<Reply> {
    let to = to.into();
    let conn = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
    conn.set_read_timeout(Some(timeout))?;
    (&conn).write_all(format!("stream {bytes}\n").as_bytes())?;
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let reply = parse_ident(&line)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < bytes {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            bail!(
                "stream from {} ended after {got} of {bytes} bytes",
                reply.backend
            );
        }
        for (j, b) in buf[..n].iter().enumerate() {
            if *b != pattern(got + j) {
                bail!("byte {} from {} is wrong", got + j, reply.backend);
            }
        }
        got += n;
    }
    Ok(reply)
}

/// A connection that stays open: `echo` mode.
pub struct EchoConn {
    conn: TcpStream,
    reader: BufReader<TcpStream>,
    pub reply: Reply,
}

impl EchoConn {
    pub fn open(to: impl Into<std::net::SocketAddr>, timeout: Duration) -> Result<Self> {
        let conn = TcpStream::connect_timeout(&to.into(), timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        (&conn).write_all(b"echo\n")?;
        let mut reader = BufReader::new(conn.try_clone()?);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let reply = parse_ident(&line)?;
        Ok(Self {
            conn,
            reader,
            reply,
        })
    }

    /// The client's end of the connection.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.conn
            .local_addr()
            .expect("a connected socket has an address")
    }

    /// Sends a line and checks it comes back.
    pub fn roundtrip(&mut self, text: &str) -> Result<()> {
        self.conn.write_all(format!("{text}\n").as_bytes())?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        if line.trim_end() != text {
            bail!("echo of {text:?} came back as {line:?}");
        }
        Ok(())
    }
}

/// A TCP server in `ns` on `bind` for one upload: it reads everything its client
/// sends and answers with the byte count; joined, the count it read.
pub fn upload_server(
    ns: &str,
    bind: SocketAddr,
) -> std::thread::JoinHandle<std::io::Result<usize>> {
    let listener = in_netns(ns, move || std::net::TcpListener::bind(bind))
        .expect("entering the namespace")
        .expect("binding the upload server");
    std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut total = 0;
        let mut buf = vec![0u8; 65_536];
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n;
        }
        conn.write_all(format!("{total}\n").as_bytes())?;
        Ok(total)
    })
}

/// Uploads `size` bytes from `ns` to `to` over one TCP connection and returns the
/// server's answer ([`upload_server`]'s byte count).
pub fn upload(ns: &str, to: SocketAddr, size: usize) -> std::io::Result<String> {
    in_netns(ns, move || -> std::io::Result<String> {
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        conn.set_write_timeout(Some(Duration::from_secs(20)))?;
        conn.set_read_timeout(Some(Duration::from_secs(20)))?;
        conn.write_all(&vec![7u8; size])?;
        conn.shutdown(std::net::Shutdown::Write)?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok(answer)
    })
    .map_err(std::io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 46: a run of UDP requests never reuses a source port (whose flow the
    /// datapath may still track) until the range wraps.
    #[test]
    fn fresh_udp_ports_do_not_repeat_within_the_range() {
        let span = u32::from(FRESH_UDP_PORTS.end() - FRESH_UDP_PORTS.start()) + 1;
        let mut seen = std::collections::BTreeSet::new();
        for n in 0..span {
            let port = nth_fresh_udp_port(n);
            assert!(FRESH_UDP_PORTS.contains(&port), "{port} outside the range");
            assert!(seen.insert(port), "port {port} given twice");
        }
        assert_eq!(nth_fresh_udp_port(span), *FRESH_UDP_PORTS.start(), "wraps");
        assert_ne!(fresh_udp_port(), fresh_udp_port());
    }
}

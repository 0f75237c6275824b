//! A pod's process for the labs: joins a cgroup (v2) and a lab's network namespace,
//! then opens connections to an address and says what each got, a line each:
//! `ok BACKEND PEER_THE_BACKEND_SAW GETPEERNAME` or `err KIND`. Socket programs act
//! on a socket by its process's cgroup, which a thread of a test cannot change on its
//! own; a process can.
//!
//! `sliceway-lab-connect NETNS CGROUP_DIR|- tcp|udp ADDR:PORT COUNT`

use std::{
    fs::File,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    time::Duration,
};

use anyhow::{bail, Context, Result};

const TIMEOUT: Duration = Duration::from_secs(3);

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [netns, cgroup, proto, to, count] = args.as_slice() else {
        bail!("usage: sliceway-lab-connect NETNS CGROUP_DIR|- tcp|udp ADDR:PORT COUNT");
    };
    if cgroup != "-" {
        let procs = format!("{cgroup}/cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .with_context(|| format!("joining {procs}"))?;
    }
    let path = format!("/var/run/netns/{netns}");
    let ns = File::open(&path).with_context(|| format!("opening {path}"))?;
    // SAFETY: setns on a valid namespace fd; the process is single-threaded here.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {path}: {}", std::io::Error::last_os_error());
    }
    let to: SocketAddr = to.parse().with_context(|| format!("address {to}"))?;
    let count: usize = count.parse().with_context(|| format!("count {count}"))?;
    let mut out = std::io::stdout().lock();
    for _ in 0..count {
        let line = match proto.as_str() {
            "tcp" => tcp(to),
            "udp" => udp(to),
            other => bail!("protocol {other}: tcp or udp"),
        };
        let line = match line {
            Ok((answer, peer)) => format!("ok {} {peer}", answer.trim()),
            Err(e) => format!("err {:?}", e.kind()),
        };
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// One request; the backend's answer (`NAME ADDR PEER`) and the socket's peer name.
fn tcp(to: SocketAddr) -> std::io::Result<(String, SocketAddr)> {
    let conn = TcpStream::connect_timeout(&to, TIMEOUT)?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    (&conn).write_all(b"hello\n")?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    Ok((line, conn.peer_addr()?))
}

fn udp(to: SocketAddr) -> std::io::Result<(String, SocketAddr)> {
    let any: SocketAddr = if to.is_ipv4() {
        "0.0.0.0:0".parse().expect("an address")
    } else {
        "[::]:0".parse().expect("an address")
    };
    let socket = UdpSocket::bind(any)?;
    socket.set_read_timeout(Some(TIMEOUT))?;
    socket.connect(to)?;
    socket.send(b"hello")?;
    let mut buf = [0u8; 1500];
    let n = socket.recv(&mut buf)?;
    Ok((
        String::from_utf8_lossy(&buf[..n]).into_owned(),
        socket.peer_addr()?,
    ))
}

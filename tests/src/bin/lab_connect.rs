//! A pod's process for the labs: joins a cgroup (v2) and a lab's network namespace,
//! then opens connections to an address and says what each got, a line each:
//! `ok BACKEND PEER_THE_BACKEND_SAW GETPEERNAME` or `err KIND`. Socket programs act
//! on a socket by its process's cgroup, which a thread of a test cannot change on its
//! own; a process can.
//!
//! `sliceway-lab-connect NETNS CGROUP_DIR|- tcp|udp ADDR:PORT COUNT`

use std::{fs::File, io::Write, net::SocketAddr, os::fd::AsRawFd, time::Duration};

use anyhow::{bail, Context, Result};
use sliceway_lab::servers::{tcp_exchange, udp_exchange};

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
            "tcp" => tcp_exchange(to, TIMEOUT),
            "udp" => udp_exchange(to, TIMEOUT),
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

//! Network namespaces: create, enter, delete.

use std::{fs::File, os::fd::AsRawFd, process::Command};

use anyhow::{bail, Context, Result};

/// A named network namespace (`/var/run/netns/NAME`), deleted on drop.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: &str) -> Result<Self> {
        ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_string(),
        };
        ns.run("ip", &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs a command inside the namespace (network namespace only; `/sys` stays the
    /// host's, so bpffs pins remain visible).
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        nsenter(&self.name, program, args)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

/// Runs `ip ARGS` in the current namespace.
pub fn ip(args: &[&str]) -> Result<String> {
    output(Command::new("ip").args(args))
}

/// A veth pair made directly inside two namespaces: `outer` in `outer_ns`, `eth0` in
/// `inner_ns` (a pod's or a node's interface, never in the root namespace).
pub fn veth_pair(outer: &str, outer_ns: &str, inner_ns: &str) -> Result<()> {
    ip(&[
        "link", "add", outer, "netns", outer_ns, "type", "veth", "peer", "name", "eth0", "netns",
        inner_ns,
    ])?;
    Ok(())
}

/// Runs a program in the network namespace `ns` through `nsenter --net`.
pub fn nsenter(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    output(
        Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{ns}"))
            .arg(program)
            .args(args),
    )
}

fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `f` on a new thread that has entered the network namespace `ns`. Sockets it
/// opens belong to that namespace for their whole life.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let path = format!("/var/run/netns/{ns}");
    let file = File::open(&path).with_context(|| format!("opening {path}"))?;
    std::thread::spawn(move || {
        // SAFETY: setns on a valid namespace fd; affects only this thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(anyhow::anyhow!(
                "setns into {path}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(f())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("thread in namespace {ns} panicked"))?
}

/// Deletes namespaces with `prefix` left by processes that no longer run (a test run
/// that was killed before its cleanup).
pub fn remove_stale(prefix: &str) {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(&format!("{prefix}-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

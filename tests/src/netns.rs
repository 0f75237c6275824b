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

/// A tun device made in a lab namespace: an interface without an Ethernet header
/// (`IFF_TUN | IFF_NO_PI`: raw IP packets both ways), the test at its other end. It
/// goes when this is dropped.
pub struct Tun {
    file: File,
}

/// `TUNSETIFF` (linux/if_tun.h: `_IOW('T', 202, int)`).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

impl Tun {
    /// Makes tun device `name` in namespace `ns` (down, no address).
    pub fn create(ns: &str, name: &str) -> Result<Self> {
        let name = name.to_string();
        let file = in_netns(ns, move || -> Result<File> {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .context("opening /dev/net/tun")?;
            // SAFETY: an all-zero ifreq is valid; the name (checked shorter than
            // IFNAMSIZ) is copied in, the flags set.
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            if name.len() >= libc::IFNAMSIZ {
                bail!("interface name {name} too long");
            }
            for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
                *d = s as libc::c_char;
            }
            req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
            // SAFETY: TUNSETIFF reads the ifreq set up above.
            if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) } != 0 {
                return Err(std::io::Error::last_os_error()).context("TUNSETIFF");
            }
            Ok(file)
        })??;
        Ok(Self { file })
    }

    /// Hands `packet` (from its IP header) to the kernel, as if it came in on the
    /// device.
    pub fn send(&self, packet: &[u8]) -> Result<()> {
        use std::io::Write as _;
        (&self.file)
            .write_all(packet)
            .context("writing to the tun device")
    }

    /// The next packet the kernel sends out of the device (from its IP header), or
    /// `None` after `timeout`.
    pub fn recv(&self, timeout: std::time::Duration) -> Result<Option<Vec<u8>>> {
        use std::io::Read as _;
        let mut poll = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut poll, 1, timeout.as_millis() as libc::c_int) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("poll");
        }
        if n == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; 65536];
        let len = (&self.file)
            .read(&mut buf)
            .context("reading the tun device")?;
        buf.truncate(len);
        Ok(Some(buf))
    }
}

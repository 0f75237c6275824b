//! Socket-level load balancing for the node's own sockets (the kernel's `sock.rs`):
//! the eight cgroup `sock_addr` programs (four hooks, for IPv4 and IPv6) attached to a cgroup v2 directory (the root
//! one by default, so every process of the node), acting only on sockets of the
//! agent's network namespace (its cookie, `SO_NETNS_COOKIE`, written into the object
//! at load). With pinning, each attachment is a link pinned as `sock-<hook>` beside
//! the maps, so it outlives the agent; a restarted agent attaches its own beside the
//! earlier run's, then removes that one (both read the same pinned maps).

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use aya::programs::{links::FdLink, CgroupAttachMode, CgroupSockAddr};

use super::{
    pin::{is_fs, mount_fs, unpin, CGROUP2_SUPER_MAGIC},
    record::{record_change, Change},
    Attached, Datapath, KernelError,
};

/// The socket programs and their pins' names. The hook each is attached to is its
/// section's (`cgroup/connect4`, ...).
pub const SOCK_PROGRAMS: [(&str, &str); 8] = [
    ("sliceway_connect4", "sock-connect4"),
    ("sliceway_sendmsg4", "sock-sendmsg4"),
    ("sliceway_recvmsg4", "sock-recvmsg4"),
    ("sliceway_getpeername4", "sock-getpeername4"),
    ("sliceway_connect6", "sock-connect6"),
    ("sliceway_sendmsg6", "sock-sendmsg6"),
    ("sliceway_recvmsg6", "sock-recvmsg6"),
    ("sliceway_getpeername6", "sock-getpeername6"),
];

/// The cookie of the calling thread's network namespace (Linux 5.14+), which the
/// socket programs compare with their socket's; `None` where the kernel has none.
pub fn netns_cookie() -> Option<u64> {
    // SAFETY: a plain socket call; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are live and sized for SO_NETNS_COOKIE's u64.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            &mut cookie as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    };
    (ret == 0 && cookie != 0).then_some(cookie)
}

/// Whether this kernel lets the `connect` and `sendmsg` socket programs choose the
/// error of a call they refuse (`bpf_set_retval` in `cgroup/connect4` programs;
/// Debian 12's 6.1 has it). With it a Service without
/// endpoints, or a ClusterIP's undeclared port, fails a node process's `connect()`
/// with ECONNREFUSED, as kube-proxy's REJECT does; without it, with EPERM. A probe
/// (the kernel is asked to load a four-instruction program that calls the
/// helper), not a version check, so a kernel that backports it is used as such.
pub fn probe_set_retval() -> bool {
    // r1 = -ECONNREFUSED; call bpf_set_retval; r0 = 1; exit. Each instruction is
    // `struct bpf_insn`: code, dst and src registers, offset, immediate.
    const BPF_FUNC_SET_RETVAL: i32 = 187;
    let insn = |code: u8, dst: u8, imm: i32| -> u64 {
        u64::from(code) | u64::from(dst) << 8 | u64::from(imm as u32) << 32
    };
    let insns = [
        insn(0xb7, 1, -libc::ECONNREFUSED),
        insn(0x85, 0, BPF_FUNC_SET_RETVAL),
        insn(0xb7, 0, 1),
        insn(0x95, 0, 0),
    ];
    let license = b"GPL\0";
    // `union bpf_attr` for BPF_PROG_LOAD (include/uapi/linux/bpf.h): prog_type,
    // insn_cnt, insns, license, then the log fields, kern_version, prog_flags and
    // the name (left zero), prog_ifindex and expected_attach_type at 68.
    let mut attr = [0u8; 128];
    const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
    const BPF_CGROUP_INET4_CONNECT: u32 = 10;
    const BPF_PROG_LOAD: libc::c_long = 5;
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_CGROUP_SOCK_ADDR.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[68..72].copy_from_slice(&BPF_CGROUP_INET4_CONNECT.to_ne_bytes());
    // SAFETY: `attr` is a valid BPF_PROG_LOAD attribute of its size; the pointers in
    // it (instructions, license) live until the call returns.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            attr.as_ptr(),
            attr.len() as libc::c_uint,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: the kernel returned a new program descriptor nothing else owns;
    // dropping it unloads the program.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    true
}

/// Where a cgroup v2 hierarchy is mounted by the agent where the host has none.
const OWN_CGROUP2: &str = "/run/sliceway/cgroupv2";

/// The cgroup the socket programs go on for `--socket-lb-cgroup`: the path given, or
/// for `auto` the root of the host's cgroup v2 hierarchy (`/sys/fs/cgroup` on a
/// unified host, `/sys/fs/cgroup/unified` on a hybrid one), mounted at
/// [`OWN_CGROUP2`] where none is (as Cilium mounts its own).
///
/// A path given that is not a cgroup v2 hierarchy but holds one at `unified` (a hybrid
/// host's `/sys/fs/cgroup`, mounted into the DaemonSet's container) means that one.
pub fn resolve_cgroup(given: &Path) -> Result<PathBuf, KernelError> {
    resolve_cgroup_mounting(given).map(|(path, _)| path)
}

/// [`resolve_cgroup`], and whether it mounted the hierarchy it returns.
fn resolve_cgroup_mounting(given: &Path) -> Result<(PathBuf, bool), KernelError> {
    if given != Path::new("auto") {
        let unified = given.join("unified");
        if !is_fs(given, CGROUP2_SUPER_MAGIC) && is_fs(&unified, CGROUP2_SUPER_MAGIC) {
            tracing::info!(
                given = %given.display(),
                path = %unified.display(),
                "the cgroup given is a hybrid host's: the socket programs go on its cgroup v2 hierarchy"
            );
            return Ok((unified, false));
        }
        return Ok((given.to_path_buf(), false));
    }
    for candidate in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified", OWN_CGROUP2] {
        if is_fs(Path::new(candidate), CGROUP2_SUPER_MAGIC) {
            return Ok((PathBuf::from(candidate), false));
        }
    }
    let err = |reason: String| KernelError::Sock {
        cgroup: PathBuf::from(OWN_CGROUP2),
        reason,
    };
    std::fs::create_dir_all(OWN_CGROUP2).map_err(|e| err(e.to_string()))?;
    let target = std::ffi::CString::new(OWN_CGROUP2).map_err(|e| err(e.to_string()))?;
    if let Err(e) = mount_fs(c"cgroup2", &target) {
        return Err(err(format!(
            "no cgroup v2 hierarchy is mounted and mounting one failed: {e}"
        )));
    }
    tracing::info!(
        path = OWN_CGROUP2,
        "mounted the cgroup v2 hierarchy for the socket programs"
    );
    Ok((PathBuf::from(OWN_CGROUP2), true))
}

/// How the socket programs are attached, per hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockAttached {
    pub hook: &'static str,
    pub how: Attached,
}

impl Datapath {
    /// Attaches the socket programs to the cgroup v2 directory `cgroup` (`auto`: see
    /// [`resolve_cgroup`]). With pinning, the link an earlier run pinned is replaced
    /// by this agent's once that is attached.
    pub fn attach_sockets(&mut self, cgroup: &Path) -> Result<Vec<SockAttached>, KernelError> {
        if self.netns_cookie.is_none() {
            return Err(KernelError::Sock {
                cgroup: cgroup.to_path_buf(),
                reason: "this kernel gives no network namespace cookie (SO_NETNS_COOKIE, \
                         Linux 5.14 or later): the socket programs could not tell the \
                         node's sockets from pods'"
                    .into(),
            });
        }
        let (cgroup, mounted) = resolve_cgroup_mounting(cgroup)?;
        if let (true, Some(pins)) = (mounted, &self.pins) {
            record_change(
                pins,
                &Change::Mount {
                    fstype: "cgroup2".into(),
                    path: cgroup.clone(),
                },
            );
        }
        let cgroup = &cgroup;
        let sock_err = |reason: String| KernelError::Sock {
            cgroup: cgroup.to_path_buf(),
            reason,
        };
        let dir = std::fs::File::open(cgroup).map_err(|e| sock_err(format!("opening it: {e}")))?;
        let pins = self.pins.as_ref().map(|p| p.dir());
        let mut out = Vec::new();
        for (name, pin_name) in SOCK_PROGRAMS {
            let program: &mut CgroupSockAddr = self
                .ebpf
                .program_mut(name)
                .ok_or(KernelError::MissingProgram(name))?
                .try_into()?;
            if program.fd().is_err() {
                program.load()?;
            }
            let Some(pin) = pins.as_ref().map(|d| d.join(pin_name)) else {
                // Not pinned: attached while this process lives.
                program
                    .attach(&dir, CgroupAttachMode::Single)
                    .map_err(|e| sock_err(format!("{name}: {e}")))?;
                out.push(SockAttached {
                    hook: pin_name,
                    how: Attached::Unpinned,
                });
                continue;
            };
            // A cgroup link always sits beside others (the kernel refuses flags with
            // one): `Single` asks for none. (aya makes a link on Linux 5.7+; the netns
            // cookie above needs 5.14.)
            let id = program
                .attach(&dir, CgroupAttachMode::Single)
                .map_err(|e| sock_err(format!("{name}: {e}")))?;
            let link = FdLink::try_from(program.take_link(id)?)
                .map_err(|e| sock_err(format!("{name}: {e}")))?;
            let how = if pin.exists() {
                // The earlier run's link goes only once this one is attached: both
                // programs read the same pinned maps, so whichever runs first
                // translates and the other then sees a backend and lets it be; no
                // socket call runs without one.
                // (bpffs refuses names with a dot.)
                let new_pin = pin.with_file_name(format!("{pin_name}-new"));
                unpin(&new_pin)
                    .map_err(|e| sock_err(format!("removing {}: {e}", new_pin.display())))?;
                link.pin(&new_pin)
                    .map_err(|e| sock_err(format!("pinning {}: {e}", new_pin.display())))?;
                unpin(&pin).map_err(|e| sock_err(format!("removing {}: {e}", pin.display())))?;
                std::fs::rename(&new_pin, &pin)
                    .map_err(|e| sock_err(format!("renaming {}: {e}", new_pin.display())))?;
                Attached::Replaced
            } else {
                link.pin(&pin)
                    .map_err(|e| sock_err(format!("pinning {}: {e}", pin.display())))?;
                Attached::NewPinned
            };
            out.push(SockAttached {
                hook: pin_name,
                how,
            });
        }
        self.sock_cgroup = Some(cgroup.to_path_buf());
        Ok(out)
    }

    /// Removes the socket links an earlier run pinned (the agent runs without socket
    /// load balancing now). Returns the hooks removed.
    pub fn unpin_sock_links(&self) -> Result<Vec<&'static str>, KernelError> {
        let Some(pins) = &self.pins else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        for (_, pin_name) in SOCK_PROGRAMS {
            let pin = pins.dir().join(pin_name);
            if pin.exists() {
                unpin(&pin).map_err(|e| KernelError::Pin {
                    path: pin.clone(),
                    reason: e.to_string(),
                })?;
                removed.push(pin_name);
            }
        }
        Ok(removed)
    }

    /// The cgroup the socket programs were attached to by this agent, if any.
    pub fn sock_cgroup(&self) -> Option<&PathBuf> {
        self.sock_cgroup.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DaemonSet hands in the host's `/sys/fs/cgroup`: on a hybrid host (cgroup v1
    /// controllers, v2 at `unified`) that means its v2 hierarchy, elsewhere the path
    /// itself; a directory that holds no hierarchy is taken as it is.
    #[test]
    fn a_hybrid_hosts_cgroup_root_means_its_unified_hierarchy() {
        let root = Path::new("/sys/fs/cgroup");
        let unified = root.join("unified");
        let want = if !is_fs(root, CGROUP2_SUPER_MAGIC) && is_fs(&unified, CGROUP2_SUPER_MAGIC) {
            unified
        } else {
            root.to_path_buf()
        };
        assert_eq!(resolve_cgroup(root).unwrap(), want);
        let plain = std::env::temp_dir();
        assert_eq!(resolve_cgroup(&plain).unwrap(), plain);
    }
}

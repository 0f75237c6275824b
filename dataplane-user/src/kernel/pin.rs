//! Pinning: where maps and links live under bpffs (`BASE/v<layout>/`), the size check
//! of pinned maps, mounting bpffs, and removing pins.

use std::{
    mem::size_of,
    path::{Path, PathBuf},
};

use dataplane_common::{
    map_name, Backend, CtEntry, CtKey, ServiceKey, ServiceName, ServiceValue, SlotKey,
    MAP_LAYOUT_VERSION,
};

use super::KernelError;

/// Where the maps and links of one agent are pinned: `BASE/v<layout>/`. The layout
/// version in the path means an agent never opens maps of another layout.
#[derive(Clone, Debug)]
pub struct PinDir {
    pub base: PathBuf,
}

impl PinDir {
    pub fn new(base: impl Into<PathBuf>) -> Self {
        Self { base: base.into() }
    }
    pub fn dir(&self) -> PathBuf {
        self.layout_dir(MAP_LAYOUT_VERSION)
    }
    /// The directory of layout `version` under the same base.
    pub fn layout_dir(&self, version: u32) -> PathBuf {
        self.base.join(format!("v{version}"))
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir().join(name)
    }
    pub fn link(&self, iface: &str) -> PathBuf {
        self.dir().join(format!("{LINK_PREFIX}{iface}"))
    }
    /// The pin of the egress program's link on `iface`.
    pub fn egress_link(&self, iface: &str) -> PathBuf {
        self.dir().join(format!("{EGRESS_LINK_PREFIX}{iface}"))
    }
    /// Mounts bpffs at `/sys/fs/bpf` if this directory lies there and none is mounted,
    /// and makes the directory, as loading with pins does first.
    pub fn prepare(&self) -> Result<(), KernelError> {
        prepare_bpffs(&self.dir()).map(drop)
    }
    /// Interfaces that have a pinned link in this layout directory.
    pub fn linked_interfaces(&self) -> Vec<String> {
        linked_interfaces_in(&self.dir())
    }
    /// Interfaces that have a pinned egress link in this layout directory.
    pub fn egress_linked_interfaces(&self) -> Vec<String> {
        with_prefix_in(&self.dir(), EGRESS_LINK_PREFIX)
    }
    /// Layout directories of other versions found under the base.
    pub fn other_layouts(&self) -> Vec<PathBuf> {
        let mine = self.dir();
        std::fs::read_dir(&self.base)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p != &mine
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('v'))
            })
            .collect()
    }
}

/// File name prefix of a pinned link; the interface name follows.
pub(super) const LINK_PREFIX: &str = "link-";
/// File name prefix of a pinned egress link; the interface name follows.
pub(super) const EGRESS_LINK_PREFIX: &str = "egress-";

/// Key and value sizes of each map, to check pinned maps against.
pub(super) fn expected_sizes(name: &str) -> (usize, usize) {
    match name {
        map_name::SERVICES => (size_of::<ServiceKey>(), size_of::<ServiceValue>()),
        map_name::SLOTS => (size_of::<SlotKey>(), size_of::<u32>()),
        map_name::BACKENDS => (size_of::<u32>(), size_of::<Backend>()),
        map_name::CONNTRACK => (size_of::<CtKey>(), size_of::<CtEntry>()),
        map_name::CT_TIMEOUTS => (size_of::<u32>(), size_of::<u64>()),
        map_name::FRAGMENTS => (
            size_of::<dataplane_common::FragKey>(),
            size_of::<dataplane_common::FragPorts>(),
        ),
        map_name::STATS => (size_of::<u32>(), size_of::<u64>()),
        map_name::SERVICE_NAMES => (size_of::<u32>(), size_of::<ServiceName>()),
        map_name::JUMP | map_name::JUMP6 => (size_of::<u32>(), size_of::<u32>()),
        map_name::AFFINITY => (
            size_of::<dataplane_common::AffinityKey>(),
            size_of::<dataplane_common::AffinityValue>(),
        ),
        map_name::FRONTEND_COUNTERS => (
            size_of::<u32>(),
            size_of::<dataplane_common::FrontendCounters>(),
        ),
        map_name::BACKEND_COUNTERS => (
            size_of::<u32>(),
            size_of::<dataplane_common::BackendCounters>(),
        ),
        map_name::SOURCE_RANGES => (
            size_of::<u32>() + size_of::<dataplane_common::SourceRange>(),
            size_of::<u8>(),
        ),
        map_name::NAT_CONFIG => (size_of::<u32>(), size_of::<dataplane_common::NatConfig>()),
        map_name::SOCK_REVNAT => (
            size_of::<dataplane_common::SockRevKey>(),
            size_of::<dataplane_common::SockRevValue>(),
        ),
        map_name::SERVICES6 => (
            size_of::<dataplane_common::ServiceKey6>(),
            size_of::<ServiceValue>(),
        ),
        map_name::BACKENDS6 => (size_of::<u32>(), size_of::<dataplane_common::Backend6>()),
        map_name::FRAGMENTS6 => (
            size_of::<dataplane_common::FragKey6>(),
            size_of::<dataplane_common::FragPorts>(),
        ),
        map_name::NAT_CONFIG6 => (size_of::<u32>(), size_of::<dataplane_common::NatConfig6>()),
        map_name::SOURCE_RANGES6 => (
            size_of::<u32>() + size_of::<dataplane_common::SourceRange6>(),
            size_of::<u8>(),
        ),
        map_name::SOCK_REVNAT6 => (
            size_of::<dataplane_common::SockRevKey6>(),
            size_of::<dataplane_common::SockRevValue6>(),
        ),
        map_name::SERVICE_CIDRS => (size_of::<u32>() + size_of::<u32>(), size_of::<u8>()),
        map_name::SERVICE_CIDRS6 => (size_of::<u32>() + size_of::<[u32; 4]>(), size_of::<u8>()),
        map_name::MASQ_SOURCES => (size_of::<u32>() + size_of::<u32>(), size_of::<u8>()),
        map_name::MASQ_SOURCES6 => (size_of::<u32>() + size_of::<[u32; 4]>(), size_of::<u8>()),
        _ => (0, 0),
    }
}

/// Interfaces with a pinned link (`link-<iface>`) in layout directory `dir`, sorted.
pub(super) fn linked_interfaces_in(dir: &Path) -> Vec<String> {
    with_prefix_in(dir, LINK_PREFIX)
}

/// The rest of the names of the files in `dir` that begin with `prefix`, sorted.
fn with_prefix_in(dir: &Path, prefix: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(prefix))
                .map(str::to_string)
        })
        .collect();
    out.sort();
    out
}

/// Where bpffs is mounted when the host has none.
pub(super) const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Makes sure a bpffs is mounted at `dir`'s mount point (`/sys/fs/bpf` is not mounted
/// on every host) and that `dir` exists. Returns whether it mounted one.
pub(super) fn prepare_bpffs(dir: &Path) -> Result<bool, KernelError> {
    let pin_err = |reason: String| KernelError::Pin {
        path: dir.to_path_buf(),
        reason,
    };
    let root = Path::new(BPFFS_ROOT);
    let mut mounted = false;
    if dir.starts_with(root) && !is_fs(root, BPF_FS_MAGIC) {
        if let Err(e) = mount_fs(c"bpf", c"/sys/fs/bpf") {
            return Err(pin_err(format!("mounting bpffs at /sys/fs/bpf: {e}")));
        }
        tracing::info!("mounted bpffs at /sys/fs/bpf");
        mounted = true;
    }
    std::fs::create_dir_all(dir).map_err(|e| pin_err(e.to_string()))?;
    Ok(mounted)
}

/// `statfs`'s magic number of a bpffs.
pub(super) const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// `statfs`'s magic number of a cgroup v2 file system.
pub(super) const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Whether a file system of type `magic` (`statfs`'s `f_type`) is mounted at `path`.
pub(super) fn is_fs(path: &Path, magic: i64) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` is plain old data (integers and arrays of them): all zeroes
    // is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and outlives the call; `st` is a valid, writable
    // `statfs` that the call fills.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == magic }
}

/// Mounts a file system of type `fstype` (also its source name) at `target`.
pub(super) fn mount_fs(fstype: &std::ffi::CStr, target: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: valid NUL-terminated strings that outlive the call; no data argument.
    let ret = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    match ret {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Removes every pinned map and link under `base`: programs detach, maps and
/// conntrack go away. For uninstalling, or after a layout change.
pub(super) fn remove_pins(base: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(base) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// [`remove_pins`] of every layout under `base`, keeping the record of what the agent
/// changed on the node (`record/`, for `cleanup --all`); `base` itself goes once
/// nothing is left in it. Returns whether there was anything to remove.
pub(super) fn remove_pins_keeping_record(base: &Path) -> std::io::Result<bool> {
    let entries = match std::fs::read_dir(base) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut any = false;
    for entry in entries {
        let entry = entry?;
        if entry.file_name() == super::record::RECORD_DIR {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            remove_pins(&path)?;
        } else {
            unpin(&path)?;
        }
        any = true;
    }
    // Not empty (the record is there): left.
    let _ = std::fs::remove_dir(base);
    Ok(any)
}

/// Removes a pin file; one already gone is fine.
pub(super) fn unpin(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

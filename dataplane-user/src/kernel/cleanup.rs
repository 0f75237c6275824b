//! `cleanup` and `cleanup --all`: taking sliceway off a node. Plain `cleanup` removes
//! the pins (maps and links: the tcx and socket programs detach) and sliceway's TC
//! filters on every interface of the calling thread's network namespace, and keeps
//! the record of what the agent changed on the node (for after a layout change, when
//! an agent starts again). `cleanup --all` also puts back what the record holds
//! ([`super::record`]): sysctls to the values they had before the agent first
//! changed them, clsact qdiscs the agent added removed (only where no filter of
//! anyone else's is left on them), file systems it mounted unmounted; then the
//! record and the bpffs directory go. Each step is said in the report; a second run
//! finds nothing and says so.

use std::path::Path;

use super::{
    interfaces, link, netlink,
    pin::{self, is_fs, BPF_FS_MAGIC, CGROUP2_SUPER_MAGIC},
    record::{Change, NodeRecord},
};

/// What a cleanup did, one line each, and what it left, with why.
#[derive(Debug, Default)]
pub struct CleanupReport {
    pub removed: Vec<String>,
    pub left: Vec<String>,
}

impl CleanupReport {
    /// Whether there was nothing of sliceway's to remove or leave.
    pub fn nothing(&self) -> bool {
        self.removed.is_empty() && self.left.is_empty()
    }
}

/// Plain `cleanup`: pins and TC filters (see the module's doc).
pub fn cleanup(base: &Path) -> std::io::Result<CleanupReport> {
    let mut report = CleanupReport::default();
    // The filters first: with them gone no packet meets a program whose maps are
    // being removed.
    for (_, iface) in interfaces::list()? {
        if link::remove_filters(&iface) {
            report
                .removed
                .push(format!("removed the TC filter on {iface}"));
        }
    }
    if pin::remove_pins_keeping_record(base)? {
        report.removed.push(format!(
            "removed pinned maps and links under {} (the tcx and socket programs detached)",
            base.display()
        ));
    }
    Ok(report)
}

/// `cleanup --all`: [`cleanup`], then every change the record holds put back, then
/// the record and `base` removed (see the module's doc).
pub fn cleanup_all(base: &Path) -> std::io::Result<CleanupReport> {
    let mut report = cleanup(base)?;
    let record = NodeRecord::new(base);
    let (changes, unknown) = record.changes();
    let present = interfaces::list()?;
    let here = |iface: &str, ifindex: u32| present.iter().any(|(i, n)| n == iface && *i == ifindex);
    // bpffs last: the record lives on it.
    let (bpffs, others): (Vec<_>, Vec<_>) = changes
        .into_iter()
        .partition(|c| matches!(c, Change::Mount { fstype, .. } if fstype == "bpf"));
    for change in &others {
        match change {
            Change::Sysctl {
                iface,
                ifindex,
                name,
                value,
            } => {
                if !here(iface, *ifindex) {
                    // Deleted since: its sysctls went with it.
                } else {
                    let key = format!("net.ipv4.conf.{iface}.{name}");
                    match interfaces::sysctl_path(iface, name)
                        .and_then(|path| std::fs::write(path, value.as_bytes()))
                    {
                        Ok(()) => report.removed.push(format!(
                            "restored {key} to {value}, its value before sliceway"
                        )),
                        Err(e) => report.left.push(format!(
                            "{key}: restoring it to {value} failed ({e}); left as it is"
                        )),
                    }
                }
            }
            Change::Qdisc { iface, ifindex } => {
                if here(iface, *ifindex) {
                    remove_clsact(iface, *ifindex, &mut report);
                }
            }
            Change::Mount { fstype, path } => unmount(fstype, path, &mut report),
            Change::Netfilter { name, value } => {
                match std::fs::write(super::netfilter::path(name), value.to_string()) {
                    Ok(()) => report.removed.push(format!(
                        "restored netfilter's {name} to {value}, its value before sliceway"
                    )),
                    Err(e) => report.left.push(format!(
                        "netfilter's {name}: restoring it to {value} failed ({e}); left as it is"
                    )),
                }
            }
        }
        record.forget(change)?;
    }
    for name in unknown {
        report.left.push(format!(
            "left the record {} (not one this build knows: a newer agent's?)",
            record.dir().join(name).display()
        ));
    }
    for change in &bpffs {
        record.forget(change)?;
    }
    record.remove_if_empty();
    let _ = std::fs::remove_dir(base);
    for change in &bpffs {
        if let Change::Mount { path, .. } = change {
            unmount_bpffs_if_empty(path, &mut report);
        }
    }
    Ok(report)
}

/// Deletes the clsact qdisc sliceway added on `iface`, unless a filter is left on it
/// (another program's: sliceway's are gone by now), which deleting it would remove.
fn remove_clsact(iface: &str, ifindex: u32, report: &mut CleanupReport) {
    match netlink::has_clsact(ifindex) {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            report.left.push(format!(
                "the clsact qdisc sliceway added on {iface}: cannot list qdiscs ({e}); left"
            ));
            return;
        }
    }
    let filters = netlink::filters_at(ifindex, netlink::CLSACT_INGRESS)
        .and_then(|i| Ok(i + netlink::filters_at(ifindex, netlink::CLSACT_EGRESS)?));
    match filters {
        Ok(0) => match netlink::delete_clsact(ifindex) {
            Ok(()) => report.removed.push(format!(
                "removed the clsact qdisc sliceway added on {iface}"
            )),
            Err(e) => report.left.push(format!(
                "the clsact qdisc sliceway added on {iface}: deleting it failed ({e}); left"
            )),
        },
        Ok(n) => report.left.push(format!(
            "left the clsact qdisc sliceway added on {iface}: {n} TC filter entries of \
             another program are on it now"
        )),
        Err(e) => report.left.push(format!(
            "the clsact qdisc sliceway added on {iface}: cannot list its filters ({e}); left"
        )),
    }
}

/// Unmounts what the agent mounted at `path`, if a file system of that type is
/// still mounted there, and removes the directory it made for it.
fn unmount(fstype: &str, path: &Path, report: &mut CleanupReport) {
    let magic = match fstype {
        "cgroup2" => CGROUP2_SUPER_MAGIC,
        "bpf" => BPF_FS_MAGIC,
        other => {
            report.left.push(format!(
                "left the {other} file system at {} (a type this build does not unmount)",
                path.display()
            ));
            return;
        }
    };
    if !is_fs(path, magic) {
        return;
    }
    match umount(path) {
        Ok(()) => {
            report.removed.push(format!(
                "unmounted the {fstype} file system sliceway mounted at {}",
                path.display()
            ));
            if fstype == "cgroup2" {
                // The directory the agent made for it (empty once unmounted).
                let _ = std::fs::remove_dir(path);
            }
        }
        Err(e) => report.left.push(format!(
            "the {fstype} file system sliceway mounted at {}: unmounting failed ({e}); left",
            path.display()
        )),
    }
}

/// Unmounts the bpffs the agent mounted at `path` only if nothing is pinned there
/// any more: other programs' pins would go with it.
fn unmount_bpffs_if_empty(path: &Path, report: &mut CleanupReport) {
    if !is_fs(path, BPF_FS_MAGIC) {
        return;
    }
    let entries = std::fs::read_dir(path).map(|d| d.count()).unwrap_or(1);
    if entries > 0 {
        report.left.push(format!(
            "left the bpffs sliceway mounted at {}: {entries} pins or directories of others are on it",
            path.display()
        ));
        return;
    }
    unmount("bpf", path, report);
}

fn umount(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a NUL-terminated path that outlives the call.
    match unsafe { libc::umount2(c.as_ptr(), 0) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

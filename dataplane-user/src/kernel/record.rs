//! What the agent changed on the node outside its pins, recorded beside them so that
//! `cleanup --all` puts the node back as it was: the original value of each sysctl it
//! changed, the clsact qdiscs it added, the file systems it mounted.
//!
//! The record is the directory `<bpffs-dir>/record/`: it lives exactly as long as the
//! pins (both go at a reboot, as the changes do) and survives agent restarts. bpffs
//! holds no regular files, but it holds directories and symbolic links, so each
//! record is a symlink whose target is its value (`ln -s` is atomic, and a name that
//! exists is never overwritten, so the first value recorded is the one kept). bpffs
//! refuses names with a dot: a dot of an interface name is written `%2e` (and `%` as
//! `%25`); interface names never hold `:` or `/`, which separate the parts.
//!
//! - `sysctl:<iface>:<name>` → `<ifindex> <value>`: `net.ipv4.conf.<iface>.<name>` was
//!   `<value>` on the interface of index `<ifindex>` before the agent changed it.
//! - `qdisc:<iface>` → `<ifindex>`: the agent added the clsact qdisc of that interface.
//! - `mount:<fstype>` → `<path>`: the agent mounted a file system of that type there.
//! - `netfilter:<name>` → `<value>`: netfilter's conntrack setting `<name>` (one of
//!   [`super::netfilter::NAMES`]) was `<value>` before the agent set it as kube-proxy
//!   does.
//!
//! An interface deleted and created again under the same name has another index: a
//! record of the old one is no record of the new one, and is dropped.

use std::{
    io,
    path::{Path, PathBuf},
};

/// The record's directory under the bpffs base (`--bpffs-dir`).
pub const RECORD_DIR: &str = "record";

/// The sysctls of an interface the agent changes, under `net.ipv4.conf.<iface>.`.
pub const INTERFACE_SYSCTLS: [&str; 1] = ["accept_local"];

/// The record of one node (one network namespace) under a bpffs base.
#[derive(Clone, Debug)]
pub struct NodeRecord {
    dir: PathBuf,
}

/// One recorded change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `net.ipv4.conf.<iface>.<name>` was `value` on interface `ifindex`.
    Sysctl {
        iface: String,
        ifindex: u32,
        name: String,
        value: String,
    },
    /// The agent added the clsact qdisc of `iface` (index `ifindex`).
    Qdisc { iface: String, ifindex: u32 },
    /// The agent mounted a file system of type `fstype` at `path`.
    Mount { fstype: String, path: PathBuf },
    /// netfilter's conntrack setting `name` (of [`super::netfilter::NAMES`]) was
    /// `value`.
    Netfilter { name: String, value: u64 },
}

impl Change {
    /// The interface the change belongs to, if any.
    pub fn interface(&self) -> Option<(&str, u32)> {
        match self {
            Change::Sysctl { iface, ifindex, .. } | Change::Qdisc { iface, ifindex } => {
                Some((iface, *ifindex))
            }
            Change::Mount { .. } | Change::Netfilter { .. } => None,
        }
    }

    /// The record's file name.
    fn file_name(&self) -> String {
        match self {
            Change::Sysctl { iface, name, .. } => format!("sysctl:{}:{name}", escape(iface)),
            Change::Qdisc { iface, .. } => format!("qdisc:{}", escape(iface)),
            Change::Mount { fstype, .. } => format!("mount:{fstype}"),
            Change::Netfilter { name, .. } => format!("netfilter:{name}"),
        }
    }

    /// The record's value (the symlink's target).
    fn value(&self) -> String {
        match self {
            Change::Sysctl { ifindex, value, .. } => format!("{ifindex} {value}"),
            Change::Qdisc { ifindex, .. } => ifindex.to_string(),
            Change::Mount { path, .. } => path.to_string_lossy().into_owned(),
            Change::Netfilter { value, .. } => value.to_string(),
        }
    }

    /// Reads a record back from its file name and value; `None` for a name or value
    /// this build does not know.
    fn parse(file_name: &str, value: &str) -> Option<Change> {
        let mut parts = file_name.split(':');
        let change = match (parts.next()?, parts.next(), parts.next()) {
            ("sysctl", Some(iface), Some(name)) => {
                let (ifindex, value) = value.split_once(' ')?;
                Change::Sysctl {
                    iface: unescape(iface)?,
                    ifindex: ifindex.parse().ok()?,
                    name: name.to_string(),
                    value: value.to_string(),
                }
            }
            ("qdisc", Some(iface), None) => Change::Qdisc {
                iface: unescape(iface)?,
                ifindex: value.parse().ok()?,
            },
            ("mount", Some(fstype), None) => Change::Mount {
                fstype: fstype.to_string(),
                path: PathBuf::from(value),
            },
            // Only a name this build sets: the record never names a file to write.
            ("netfilter", Some(name), None) if super::netfilter::NAMES.contains(&name) => {
                Change::Netfilter {
                    name: name.to_string(),
                    value: value.parse().ok()?,
                }
            }
            _ => return None,
        };
        parts.next().is_none().then_some(change)
    }
}

/// An interface name as bpffs takes it in a file name (no dots).
fn escape(iface: &str) -> String {
    iface.replace('%', "%25").replace('.', "%2e")
}

fn unescape(name: &str) -> Option<String> {
    let out = name.replace("%2e", ".").replace("%25", "%");
    (escape(&out) == name).then_some(out)
}

impl NodeRecord {
    /// The record under the bpffs base `base` (`--bpffs-dir`).
    pub fn new(base: &Path) -> Self {
        Self {
            dir: base.join(RECORD_DIR),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records `change` unless a record of the same thing is there already: the
    /// first value recorded is the original and is kept. A record of an interface of
    /// the same name but another index (deleted and created again) is replaced.
    /// Returns whether it was recorded now.
    pub fn add(&self, change: &Change) -> io::Result<bool> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(change.file_name());
        if let Some(old) = self.read_one(&path) {
            if old.interface().map(|(_, i)| i) == change.interface().map(|(_, i)| i) {
                return Ok(false);
            }
            // Another incarnation of the interface: its record is of no use.
            remove(&path)?;
        }
        match std::os::unix::fs::symlink(change.value(), &path) {
            Ok(()) => Ok(true),
            // Recorded meanwhile (two agents on one base): the first value stays.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every change recorded, in name order; names this build cannot read are
    /// returned apart (left alone by `cleanup --all`, which says so).
    pub fn changes(&self) -> (Vec<Change>, Vec<String>) {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut changes = Vec::new();
        let mut unknown = Vec::new();
        for name in names {
            match self.read_one(&self.dir.join(&name)) {
                Some(c) => changes.push(c),
                None => unknown.push(name),
            }
        }
        (changes, unknown)
    }

    fn read_one(&self, path: &Path) -> Option<Change> {
        let value = std::fs::read_link(path).ok()?;
        Change::parse(path.file_name()?.to_str()?, value.to_str()?)
    }

    /// Removes the record of `change` (put back, or of an interface gone).
    pub fn forget(&self, change: &Change) -> io::Result<()> {
        remove(&self.dir.join(change.file_name()))
    }

    /// Drops the records of interfaces that are not `present` (`(ifindex, name)`) any
    /// more: a deleted interface took its sysctls and qdiscs with it. Returns how
    /// many were dropped.
    pub fn prune(&self, present: &[(u32, String)]) -> usize {
        let (changes, _) = self.changes();
        changes
            .iter()
            .filter(|c| {
                c.interface().is_some_and(|(name, index)| {
                    !present.iter().any(|(i, n)| n == name && *i == index)
                })
            })
            .filter(|c| self.forget(c).is_ok())
            .count()
    }

    /// Removes the record's directory once it is empty; one not empty, or gone, is
    /// left as it is.
    pub fn remove_if_empty(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Records `change` in the record beside `pins`; a failure is logged with what it
/// means (the change is made anyway: `cleanup --all` will not put it back).
pub(super) fn record_change(pins: &super::PinDir, change: &Change) {
    let record = NodeRecord::new(&pins.base);
    match record.add(change) {
        Ok(true) => tracing::debug!(record = %record.dir().display(), ?change, "recorded"),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            record = %record.dir().display(),
            ?change,
            "cannot record a change to the node ({e}): `cleanup --all` will not put it back"
        ),
    }
}

fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysctl(iface: &str, ifindex: u32, value: &str) -> Change {
        Change::Sysctl {
            iface: iface.into(),
            ifindex,
            name: "accept_local".into(),
            value: value.into(),
        }
    }

    /// Each kind of record reads back as written, interface names with dots and
    /// percent signs too; a name or value of another kind is refused.
    #[test]
    fn records_read_back_as_written() {
        for change in [
            sysctl("eth0.100", 7, "0"),
            sysctl("we%rd.x", 8, "1"),
            Change::Qdisc {
                iface: "veth1".into(),
                ifindex: 9,
            },
            Change::Mount {
                fstype: "cgroup2".into(),
                path: "/run/sliceway/cgroupv2".into(),
            },
            Change::Netfilter {
                name: "nf_conntrack_tcp_timeout_established".into(),
                value: 432000,
            },
        ] {
            let name = change.file_name();
            assert!(!name.contains('.'), "{name}");
            assert_eq!(Change::parse(&name, &change.value()), Some(change));
        }
        assert_eq!(Change::parse("sysctl:eth0:accept_local", "7"), None);
        assert_eq!(Change::parse("qdisc:eth0", "x"), None);
        assert_eq!(Change::parse("qdisc:eth0:extra", "7"), None);
        assert_eq!(Change::parse("later:thing", "7"), None);
        // Never a name the agent does not set: a record names no other file to write.
        assert_eq!(Change::parse("netfilter:ip_forward", "1"), None);
        assert_eq!(Change::parse("netfilter:nf_conntrack_max", "x"), None);
        assert_eq!(Change::parse("sysctl:eth%2x:accept_local", "7 0"), None);
    }

    /// The first value recorded stays (the original, before the agent changed it); an
    /// interface of the same name and another index replaces the record; pruning
    /// drops the records of interfaces gone. (A plain directory stands in for bpffs:
    /// both hold symlinks.)
    #[test]
    fn the_first_value_is_kept_and_records_of_gone_interfaces_go() {
        let base = std::env::temp_dir().join(format!("slw-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let record = NodeRecord::new(&base);
        assert!(record.add(&sysctl("v1", 5, "0")).unwrap());
        assert!(!record.add(&sysctl("v1", 5, "1")).unwrap());
        assert!(record.add(&sysctl("v2", 6, "0")).unwrap());
        assert_eq!(
            record.changes(),
            (vec![sysctl("v1", 5, "0"), sysctl("v2", 6, "0")], vec![])
        );
        // v2 re-created (index 16): its old record goes, the new value is recorded.
        assert!(record.add(&sysctl("v2", 16, "1")).unwrap());
        assert_eq!(record.changes().0[1], sysctl("v2", 16, "1"));
        // v1 deleted: pruned; v2 stays.
        assert_eq!(record.prune(&[(16, "v2".into())]), 1);
        assert_eq!(record.changes().0, vec![sysctl("v2", 16, "1")]);
        std::os::unix::fs::symlink("?", record.dir().join("future:thing")).unwrap();
        assert_eq!(record.changes().1, vec!["future:thing".to_string()]);
        std::fs::remove_dir_all(&base).unwrap();
    }
}

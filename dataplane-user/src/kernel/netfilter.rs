//! netfilter's conntrack as kube-proxy sets it on its node: the table's size
//! (`nf_conntrack_max` and the module's `hashsize`), two TCP timeouts, TCP's liberal
//! mode and two UDP timeouts, with kube-proxy's defaults and rules
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/conntrack/sysctls.go>,
//! defaults in
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/apis/config/v1alpha1/defaults.go>).
//!
//! sliceway's own conntrack holds the Services' connections; netfilter's still tracks
//! everything else of the node (pod to pod, the node's own traffic), which kube-proxy
//! sized and timed for it. A node that drops kube-proxy keeps these settings as they
//! are, until it reboots: the agent sets them as kube-proxy did, so nothing changes
//! when it replaces kube-proxy. Every value it changes is recorded first ([`record`]),
//! and `cleanup --all` puts it back.
//!
//! `nf_conntrack_max` and `hashsize` belong to the whole machine: a network namespace
//! other than the first sees `nf_conntrack_max` read-only. There the agent says so and
//! leaves both alone (kube-proxy stops with an error).
//!
//! [`record`]: super::record

use std::path::{Path, PathBuf};

/// kube-proxy's `getConntrackMax` ceiling on many-core machines.
pub const MAX_LIMIT: u64 = 1_048_576;

/// The settings, as kube-proxy's `conntrack` configuration (`--conntrack-*` flags);
/// 0 leaves a value as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conntrack {
    /// `maxPerCore`: `nf_conntrack_max` is this times the node's CPUs; 0 leaves the
    /// table's size (and `min`) alone.
    pub max_per_core: u32,
    /// `min`: `nf_conntrack_max` is at least this.
    pub min: u32,
    /// `tcpEstablishedTimeout`, seconds.
    pub tcp_established: u64,
    /// `tcpCloseWaitTimeout`, seconds.
    pub tcp_close_wait: u64,
    /// `tcpBeLiberal`: sets `nf_conntrack_tcp_be_liberal` to 1; false leaves it.
    pub tcp_be_liberal: bool,
    /// `udpTimeout`, seconds.
    pub udp: u64,
    /// `udpStreamTimeout`, seconds.
    pub udp_stream: u64,
}

impl Default for Conntrack {
    /// kube-proxy's defaults.
    fn default() -> Self {
        Self {
            max_per_core: 32 * 1024,
            min: 128 * 1024,
            tcp_established: 24 * 3600,
            tcp_close_wait: 3600,
            tcp_be_liberal: false,
            udp: 0,
            udp_stream: 0,
        }
    }
}

/// One value to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// A name of [`NAMES`].
    pub name: &'static str,
    pub value: u64,
}

/// What the agent may set: `hashsize` is the nf_conntrack module's parameter, the
/// others are under `net.netfilter.`.
pub const NAMES: [&str; 7] = [
    "nf_conntrack_max",
    "hashsize",
    "nf_conntrack_tcp_timeout_established",
    "nf_conntrack_tcp_timeout_close_wait",
    "nf_conntrack_tcp_be_liberal",
    "nf_conntrack_udp_timeout",
    "nf_conntrack_udp_timeout_stream",
];

/// Where `name` (one of [`NAMES`]) is read and written.
pub fn path(name: &str) -> PathBuf {
    path_in(Path::new("/"), name)
}

/// [`path`] under `root` (`/` on a node; a directory of its own in tests).
fn path_in(root: &Path, name: &str) -> PathBuf {
    if name == "hashsize" {
        root.join("sys/module/nf_conntrack/parameters/hashsize")
    } else {
        root.join("proc/sys/net/netfilter").join(name)
    }
}

/// kube-proxy's `getConntrackMax`: `max_per_core` times `cpus`, capped at
/// [`MAX_LIMIT`], at least `min`; 0 when `max_per_core` is 0.
pub fn conntrack_max(max_per_core: u64, min: u64, cpus: u64) -> u64 {
    if max_per_core == 0 {
        return 0;
    }
    let scaled = max_per_core.saturating_mul(cpus);
    if scaled > MAX_LIMIT {
        MAX_LIMIT
    } else {
        scaled.max(min)
    }
}

/// What kube-proxy's `setSysctls` would write on a node of `cpus` CPUs whose values
/// `now` reads (`None`: unreadable): `nf_conntrack_max` only when lower than wanted
/// (it is never lowered), `hashsize` when under a quarter of it, each other value
/// when it differs.
pub fn plan(c: &Conntrack, cpus: u64, now: impl Fn(&str) -> Option<u64>) -> Vec<Write> {
    let mut out = Vec::new();
    let mut set = |name, value| {
        if now(name) != Some(value) {
            out.push(Write { name, value });
        }
    };
    let max = conntrack_max(c.max_per_core.into(), c.min.into(), cpus);
    if max > 0 {
        if now("nf_conntrack_max").is_none_or(|cur| cur < max) {
            set("nf_conntrack_max", max);
        }
        if now("hashsize").is_none_or(|cur| cur < max / 4) {
            set("hashsize", max / 4);
        }
    }
    for (name, secs) in [
        ("nf_conntrack_tcp_timeout_established", c.tcp_established),
        ("nf_conntrack_tcp_timeout_close_wait", c.tcp_close_wait),
    ] {
        if secs > 0 {
            set(name, secs);
        }
    }
    if c.tcp_be_liberal {
        set("nf_conntrack_tcp_be_liberal", 1);
    }
    for (name, secs) in [
        ("nf_conntrack_udp_timeout", c.udp),
        ("nf_conntrack_udp_timeout_stream", c.udp_stream),
    ] {
        if secs > 0 {
            set(name, secs);
        }
    }
    out
}

/// The value of `name` on this node, if it can be read.
pub fn read(name: &str) -> Option<u64> {
    read_in(Path::new("/"), name)
}

fn read_in(root: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(path_in(root, name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What applying a plan did, a line each.
#[derive(Debug, Default)]
pub struct Applied {
    /// `name: was -> now`.
    pub set: Vec<String>,
    /// What could not be set, and why.
    pub left: Vec<String>,
    /// What is not there to set: netfilter's conntrack is not loaded (a node that
    /// tracks nothing, whose settings nothing reads).
    pub absent: Vec<&'static str>,
}

/// Whether this network namespace may set the machine's table size: only the first
/// one may (others see `nf_conntrack_max` read-only).
fn may_size_the_table(root: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path_in(root, "nf_conntrack_max"))
        .is_ok_and(|m| m.permissions().mode() & 0o200 != 0)
}

/// Writes `plan` (see [`plan`]); before each write, `record` is given the name and
/// the value it replaces. The table's size is left alone where this namespace may
/// not set it; a value that is not there (netfilter's conntrack not loaded) is
/// reported absent, not left.
pub fn apply(plan: &[Write], record: impl Fn(&'static str, u64)) -> Applied {
    apply_in(Path::new("/"), plan, record)
}

fn apply_in(root: &Path, plan: &[Write], record: impl Fn(&'static str, u64)) -> Applied {
    let mut done = Applied::default();
    let sizing = may_size_the_table(root);
    let path = |name| path_in(root, name);
    let read = |name| read_in(root, name);
    for w in plan {
        if !path(w.name).exists() {
            done.absent.push(w.name);
            continue;
        }
        if matches!(w.name, "nf_conntrack_max" | "hashsize") && !sizing {
            done.left.push(format!(
                "{} wants {} as kube-proxy sizes it, but this network namespace may not size \
                 the machine's conntrack table: left at {}",
                w.name,
                w.value,
                read(w.name).map_or("?".to_string(), |v| v.to_string())
            ));
            continue;
        }
        let Some(was) = read(w.name) else {
            done.left.push(format!(
                "{} cannot be read at {}: not set",
                w.name,
                path(w.name).display()
            ));
            continue;
        };
        record(w.name, was);
        match std::fs::write(path(w.name), w.value.to_string()) {
            Ok(()) => done.set.push(format!("{}: {was} -> {}", w.name, w.value)),
            Err(e) => done.left.push(format!(
                "{}: writing {} failed ({e}); left at {was}",
                w.name, w.value
            )),
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn planned(c: Conntrack, now: &[(&str, u64)]) -> Vec<String> {
        let now: HashMap<&str, u64> = now.iter().copied().collect();
        // upstream's fake conntracker reports 8 CPUs.
        plan(&c, 8, |n| now.get(n).copied())
            .iter()
            .map(|w| format!("{}={}", w.name, w.value))
            .collect()
    }

    /// Nothing but `max_per_core` (12, as upstream's cases), the rest zero.
    fn per_core(n: u32) -> Conntrack {
        Conntrack {
            max_per_core: n,
            min: 0,
            ..nothing()
        }
    }

    fn nothing() -> Conntrack {
        Conntrack {
            max_per_core: 0,
            min: 0,
            tcp_established: 0,
            tcp_close_wait: 0,
            tcp_be_liberal: false,
            udp: 0,
            udp_stream: 0,
        }
    }

    /// upstream's `TestGetConntrackMax`.
    #[test]
    fn the_table_is_sized_as_kube_proxy_sizes_it() {
        assert_eq!(conntrack_max(0, 0, 8), 0);
        assert_eq!(conntrack_max(67890, 1, 8), 67890 * 8);
        assert_eq!(conntrack_max(67890, 1, 64), MAX_LIMIT);
        assert_eq!(conntrack_max(1, 123456, 8), 123456);
        assert_eq!(conntrack_max(0, 123456, 8), 0);
        // kube-proxy's defaults on this project's 2-core test machines.
        let d = Conntrack::default();
        assert_eq!(
            conntrack_max(d.max_per_core.into(), d.min.into(), 2),
            131072
        );
    }

    /// upstream's `TestSetupConntrack`, case by case (its fake has 8 CPUs; a value
    /// it leaves unset reads as 0).
    #[test]
    fn what_is_written_is_what_kube_proxy_writes() {
        let unset = [("nf_conntrack_max", 0), ("hashsize", 0)];
        assert!(planned(nothing(), &unset).is_empty());
        assert_eq!(
            planned(per_core(12), &unset),
            ["nf_conntrack_max=96", "hashsize=24"]
        );
        let right = [("nf_conntrack_max", 96), ("hashsize", 24)];
        assert!(planned(per_core(12), &right).is_empty());
        let higher = [("nf_conntrack_max", 192), ("hashsize", 48)];
        assert!(planned(per_core(12), &higher).is_empty());
        let low = [("nf_conntrack_max", 32), ("hashsize", 16)];
        assert_eq!(
            planned(per_core(12), &low),
            ["nf_conntrack_max=96", "hashsize=24"]
        );
        assert!(planned(per_core(0), &unset).is_empty());
        let bad_hash = [("nf_conntrack_max", 96), ("hashsize", 16)];
        assert_eq!(planned(per_core(12), &bad_hash), ["hashsize=24"]);
        let good_hash = [("nf_conntrack_max", 32), ("hashsize", 24)];
        assert_eq!(planned(per_core(12), &good_hash), ["nf_conntrack_max=96"]);
        for (field, name) in [
            (
                Conntrack {
                    tcp_established: 5,
                    ..nothing()
                },
                "nf_conntrack_tcp_timeout_established",
            ),
            (
                Conntrack {
                    tcp_close_wait: 5,
                    ..nothing()
                },
                "nf_conntrack_tcp_timeout_close_wait",
            ),
            (
                Conntrack {
                    udp: 5,
                    ..nothing()
                },
                "nf_conntrack_udp_timeout",
            ),
            (
                Conntrack {
                    udp_stream: 5,
                    ..nothing()
                },
                "nf_conntrack_udp_timeout_stream",
            ),
        ] {
            assert_eq!(planned(field, &unset), [format!("{name}=5")]);
        }
        let liberal = Conntrack {
            tcp_be_liberal: true,
            ..nothing()
        };
        assert_eq!(planned(liberal, &unset), ["nf_conntrack_tcp_be_liberal=1"]);
        // A value already as wanted is not written again (`setIntSysCtl`).
        let already = [("nf_conntrack_tcp_timeout_established", 5)];
        let five = Conntrack {
            tcp_established: 5,
            ..nothing()
        };
        assert!(planned(five, &already).is_empty());
    }

    /// kube-proxy's defaults on a node whose table is big enough: the two TCP
    /// timeouts, nothing else.
    #[test]
    fn the_defaults_set_the_tcp_timeouts() {
        let now = [
            ("nf_conntrack_max", 262144),
            ("hashsize", 262144),
            ("nf_conntrack_tcp_timeout_established", 432000),
            ("nf_conntrack_tcp_timeout_close_wait", 60),
        ];
        assert_eq!(
            planned(Conntrack::default(), &now),
            [
                "nf_conntrack_tcp_timeout_established=86400",
                "nf_conntrack_tcp_timeout_close_wait=3600"
            ]
        );
    }

    /// A directory of its own standing for `/`, with `files` written into it.
    fn root_with(test: &str, files: &[(&str, &str, u32)]) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let root =
            std::env::temp_dir().join(format!("sliceway-netfilter-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        for (name, value, mode) in files {
            let p = path_in(&root, name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, value).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
        }
        root
    }

    fn applied(root: &Path, c: &Conntrack) -> (Applied, Vec<String>) {
        let plan = plan(c, 2, |n| read_in(root, n));
        let recorded = std::cell::RefCell::new(Vec::new());
        let done = apply_in(root, &plan, |name, was| {
            recorded.borrow_mut().push(format!("{name}={was}"))
        });
        (done, recorded.into_inner())
    }

    /// A node whose netfilter tracks nothing (the module not loaded): every
    /// setting is absent, none is a problem, nothing is recorded.
    #[test]
    fn a_node_without_netfilters_conntrack_has_nothing_to_set() {
        let root = root_with("absent", &[]);
        let (done, recorded) = applied(&root, &Conntrack::default());
        assert!(done.set.is_empty() && done.left.is_empty(), "{done:?}");
        assert_eq!(
            done.absent,
            [
                "nf_conntrack_max",
                "hashsize",
                "nf_conntrack_tcp_timeout_established",
                "nf_conntrack_tcp_timeout_close_wait"
            ]
        );
        assert!(recorded.is_empty());
        std::fs::remove_dir_all(root).unwrap();
    }

    /// The first network namespace: each value is recorded, then written.
    #[test]
    fn values_are_recorded_then_written() {
        let root = root_with(
            "first",
            &[
                ("nf_conntrack_max", "65536\n", 0o644),
                ("hashsize", "16384\n", 0o600),
                ("nf_conntrack_tcp_timeout_established", "432000\n", 0o644),
                ("nf_conntrack_tcp_timeout_close_wait", "3600\n", 0o644),
            ],
        );
        let (done, recorded) = applied(&root, &Conntrack::default());
        assert_eq!(
            done.set,
            [
                "nf_conntrack_max: 65536 -> 131072",
                "hashsize: 16384 -> 32768",
                "nf_conntrack_tcp_timeout_established: 432000 -> 86400"
            ]
        );
        assert!(done.left.is_empty() && done.absent.is_empty(), "{done:?}");
        assert_eq!(
            recorded,
            [
                "nf_conntrack_max=65536",
                "hashsize=16384",
                "nf_conntrack_tcp_timeout_established=432000"
            ]
        );
        assert_eq!(read_in(&root, "nf_conntrack_max"), Some(131072));
        assert_eq!(read_in(&root, "hashsize"), Some(32768));
        std::fs::remove_dir_all(root).unwrap();
    }

    /// Another network namespace sees `nf_conntrack_max` read-only: the table's
    /// size is left, with its value; the timeouts are still set.
    #[test]
    fn another_namespace_leaves_the_tables_size() {
        let root = root_with(
            "other",
            &[
                ("nf_conntrack_max", "65536\n", 0o444),
                ("hashsize", "16384\n", 0o600),
                ("nf_conntrack_tcp_timeout_established", "432000\n", 0o644),
                ("nf_conntrack_tcp_timeout_close_wait", "60\n", 0o644),
            ],
        );
        let (done, recorded) = applied(&root, &Conntrack::default());
        assert_eq!(done.left.len(), 2, "{done:?}");
        assert!(done.left[0].starts_with("nf_conntrack_max wants 131072"));
        assert!(done.left[0].ends_with("left at 65536"), "{}", done.left[0]);
        assert!(done.left[1].ends_with("left at 16384"), "{}", done.left[1]);
        assert_eq!(
            recorded,
            [
                "nf_conntrack_tcp_timeout_established=432000",
                "nf_conntrack_tcp_timeout_close_wait=60"
            ]
        );
        assert_eq!(read_in(&root, "nf_conntrack_max"), Some(65536));
        std::fs::remove_dir_all(root).unwrap();
    }
}

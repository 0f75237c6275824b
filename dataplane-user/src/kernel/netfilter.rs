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

use std::path::PathBuf;

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
    if name == "hashsize" {
        PathBuf::from("/sys/module/nf_conntrack/parameters/hashsize")
    } else {
        PathBuf::from("/proc/sys/net/netfilter").join(name)
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
    std::fs::read_to_string(path(name))
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
fn may_size_the_table() -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path("nf_conntrack_max")).is_ok_and(|m| m.permissions().mode() & 0o200 != 0)
}

/// Writes `plan` (see [`plan`]); before each write, `record` is given the name and
/// the value it replaces. The table's size is left alone where this namespace may
/// not set it.
pub fn apply(plan: &[Write], record: impl Fn(&'static str, u64)) -> Applied {
    let mut done = Applied::default();
    let sizing = may_size_the_table();
    for w in plan {
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
        if !path(w.name).exists() {
            done.absent.push(w.name);
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
}

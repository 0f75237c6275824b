//! Which interfaces the TC program goes on: `--interfaces` entries are exact names,
//! glob patterns (`veth*`, `cali*`, `lxc?`), matched against the interfaces of the
//! agent's network namespace, or `auto`: the pod interfaces found without a name
//! ([`super::pod_links`]). Pods come and go, so the agent lists the interfaces again
//! and again; [`plan`] (pure) says what to attach and what to drop.

use std::collections::BTreeMap;

/// Longest interface name the kernel accepts (IFNAMSIZ minus the NUL).
pub const IFNAME_MAX: usize = 15;

/// Errors in `--interfaces`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectionError {
    #[error("empty entry in --interfaces")]
    Empty,
    #[error("interface {0:?}: longer than {IFNAME_MAX} bytes, the kernel's limit")]
    TooLong(String),
    #[error("interface {0:?}: '/', ':', whitespace and NUL cannot appear in an interface name")]
    Invalid(String),
    #[error("--external-interfaces takes names and patterns, not `auto` (uplinks are named)")]
    AutoUplinks,
}

/// One `--interfaces` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// Must exist when the agent starts.
    Exact(String),
    /// `*` matches any run of characters, `?` one character; may match nothing.
    Pattern(String),
}

/// The `--interfaces` entry that selects the pod interfaces found without a name.
pub const AUTO: &str = "auto";

/// The parsed `--interfaces` list, and `--external-interfaces`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    selectors: Vec<Selector>,
    /// The node's uplinks: clients outside the node come in there.
    external: Vec<Selector>,
    /// `--interfaces auto`: pod interfaces are also those [`super::pod_links`] finds.
    auto: bool,
    /// What it found at the last look ([`Selection::with_found`]).
    found: std::collections::BTreeSet<String>,
}

/// What an interface is to the node, so which program it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Pod-facing (`--interfaces`): `sliceway_tc`.
    Pods,
    /// An uplink (`--external-interfaces`): `sliceway_tc_ext`, whose new connections
    /// come from outside the node.
    External,
}

impl Selection {
    /// Parses `--interfaces` entries: an entry with `*` or `?` is a pattern, any other
    /// an exact name.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, SelectionError> {
        let mut selectors = Vec::new();
        let mut auto = false;
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry.is_empty() {
                return Err(SelectionError::Empty);
            }
            if entry == AUTO {
                auto = true;
                continue;
            }
            if entry
                .chars()
                .any(|c| c == '/' || c == ':' || c == '\0' || c.is_whitespace())
            {
                return Err(SelectionError::Invalid(entry.to_string()));
            }
            if entry.contains(['*', '?']) {
                selectors.push(Selector::Pattern(entry.to_string()));
            } else if entry.len() > IFNAME_MAX {
                return Err(SelectionError::TooLong(entry.to_string()));
            } else {
                selectors.push(Selector::Exact(entry.to_string()));
            }
        }
        Ok(Self {
            selectors,
            external: Vec::new(),
            auto,
            found: Default::default(),
        })
    }

    /// Whether `auto` is among the entries.
    pub fn is_auto(&self) -> bool {
        self.auto
    }

    /// This selection with `found` as the pod interfaces `auto` takes now.
    pub fn with_found(&self, found: impl IntoIterator<Item = String>) -> Self {
        Self {
            found: found.into_iter().collect(),
            ..self.clone()
        }
    }

    /// Whether `--external-interfaces` names `name` (an uplink).
    pub fn is_external(&self, name: &str) -> bool {
        self.role(name) == Some(Role::External)
    }

    /// This selection with `external` (`--external-interfaces` entries, parsed as
    /// `--interfaces` ones) as the node's uplinks. An interface both select is an
    /// uplink.
    pub fn with_external<S: AsRef<str>>(self, external: &[S]) -> Result<Self, SelectionError> {
        let parsed = Self::parse(external)?;
        if parsed.auto {
            return Err(SelectionError::AutoUplinks);
        }
        Ok(Self {
            external: parsed.selectors,
            ..self
        })
    }

    /// No entry at all: the agent attaches nowhere.
    pub fn is_empty(&self) -> bool {
        self.selectors.is_empty() && self.external.is_empty() && !self.auto
    }

    /// The exact names, which must exist at start.
    pub fn exact(&self) -> impl Iterator<Item = &str> {
        self.selectors
            .iter()
            .chain(&self.external)
            .filter_map(|s| match s {
                Selector::Exact(name) => Some(name.as_str()),
                Selector::Pattern(_) => None,
            })
    }

    /// Whether `name` is selected by an exact entry or a pattern.
    pub fn matches(&self, name: &str) -> bool {
        self.role(name).is_some()
    }

    /// The role `name` is selected in, if it is selected.
    pub fn role(&self, name: &str) -> Option<Role> {
        let hit = |list: &[Selector]| {
            list.iter().any(|s| match s {
                Selector::Exact(exact) => exact == name,
                Selector::Pattern(pattern) => glob_match(pattern, name),
            })
        };
        if hit(&self.external) {
            Some(Role::External)
        } else if hit(&self.selectors) || self.found.contains(name) {
            Some(Role::Pods)
        } else {
            None
        }
    }
}

/// Shell-style match of the whole `name`: `*` is any run of characters (empty too),
/// `?` exactly one; everything else matches itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    // Where the last `*` was, and how much of the name it has eaten so far.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            // Let the last `*` eat one more character and try again.
            star = Some((sp, sn + 1));
            pi = sp + 1;
            ni = sn + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The interfaces of the calling thread's network namespace: `(ifindex, name)`.
/// Uses `if_nameindex(3)` (netlink underneath), so it does not depend on how `/sys`
/// is mounted.
pub fn list() -> std::io::Result<Vec<(u32, String)>> {
    // SAFETY: if_nameindex returns a NULL-terminated array (index 0 ends it) that is
    // ours until if_freenameindex; names are NUL-terminated C strings.
    unsafe {
        let head = libc::if_nameindex();
        if head.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut cur = head;
        while (*cur).if_index != 0 && !(*cur).if_name.is_null() {
            let name = std::ffi::CStr::from_ptr((*cur).if_name)
                .to_string_lossy()
                .into_owned();
            out.push(((*cur).if_index, name));
            cur = cur.add(1);
        }
        libc::if_freenameindex(head);
        Ok(out)
    }
}

/// Lets interface `iface` take packets whose source is an address of the node
/// (`net.ipv4.conf.<iface>.accept_local`). The TC program translates a reply back
/// before routing, so the reply of a pod's connection to a NodePort on the node's
/// own address arrives with that address as its source, which the kernel otherwise
/// drops as a martian (netfilter translates replies after routing and never meets
/// this).
pub fn accept_local(iface: &str) -> std::io::Result<()> {
    std::fs::write(sysctl_path(iface, "accept_local")?, b"1")
}

/// The file of sysctl `net.ipv4.conf.<iface>.<name>` in the calling thread's network
/// namespace.
pub fn sysctl_path(iface: &str, name: &str) -> std::io::Result<std::path::PathBuf> {
    if iface.contains('/') || iface == "." || iface == ".." || iface.is_empty() {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    Ok(std::path::PathBuf::from(format!(
        "/proc/sys/net/ipv4/conf/{iface}/{name}"
    )))
}

/// The IPv4 addresses of the interfaces of the calling thread's network namespace
/// (`getifaddrs(3)`), for `--nodeport-addresses` CIDRs.
pub fn ipv4_addresses() -> std::io::Result<Vec<std::net::Ipv4Addr>> {
    Ok(ipv4_addresses_by_interface()?
        .into_iter()
        .map(|(_, a)| a)
        .collect())
}

/// [`ipv4_addresses`] with the name of the interface of each.
pub fn ipv4_addresses_by_interface() -> std::io::Result<Vec<(String, std::net::Ipv4Addr)>> {
    Ok(addresses_by_interface()?
        .into_iter()
        .filter_map(|(name, a)| match a {
            std::net::IpAddr::V4(a) => Some((name, a)),
            std::net::IpAddr::V6(_) => None,
        })
        .collect())
}

/// The IPv6 addresses of the node's interfaces, with the name of the interface of
/// each (as [`ipv4_addresses_by_interface`]).
pub fn ipv6_addresses_by_interface() -> std::io::Result<Vec<(String, std::net::Ipv6Addr)>> {
    Ok(addresses_by_interface()?
        .into_iter()
        .filter_map(|(name, a)| match a {
            std::net::IpAddr::V6(a) => Some((name, a)),
            std::net::IpAddr::V4(_) => None,
        })
        .collect())
}

/// Every IPv4 and IPv6 address of the node's interfaces, with the name of the
/// interface of each, in the order getifaddrs(3) lists them.
fn addresses_by_interface() -> std::io::Result<Vec<(String, std::net::IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that is ours until freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is an element of the list getifaddrs returned; an
        // `ifa_addr` of family AF_INET points at a sockaddr_in, one of AF_INET6 at
        // a sockaddr_in6.
        unsafe {
            let addr = (*cur).ifa_addr;
            let ip = if addr.is_null() {
                None
            } else if i32::from((*addr).sa_family) == libc::AF_INET {
                let sin = &*(addr as *const libc::sockaddr_in);
                Some(std::net::IpAddr::from(std::net::Ipv4Addr::from(
                    u32::from_be(sin.sin_addr.s_addr),
                )))
            } else if i32::from((*addr).sa_family) == libc::AF_INET6 {
                let sin6 = &*(addr as *const libc::sockaddr_in6);
                Some(std::net::IpAddr::from(std::net::Ipv6Addr::from(
                    sin6.sin6_addr.s6_addr,
                )))
            } else {
                None
            };
            if let Some(ip) = ip {
                let name = std::ffi::CStr::from_ptr((*cur).ifa_name)
                    .to_string_lossy()
                    .into_owned();
                out.push((name, ip));
            }
            cur = (*cur).ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Link and address notifications of the calling thread's network namespace
/// (rtnetlink's `RTMGRP_LINK`, `RTMGRP_IPV4_IFADDR` and `RTMGRP_IPV6_IFADDR`
/// groups): an interface that appears, changes or goes is seen when the kernel says
/// so, not at the next scan, so a new pod's interface has the program before the
/// pod has configured its address; an address that comes or goes moves NodePorts
/// in CIDR mode at once. The messages are not parsed: any of them means "look
/// again", and the scan's plan and the address lists say what changed.
pub struct LinkEvents {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

impl LinkEvents {
    /// Subscribes; with `routes`, to route changes too (`RTMGRP_IPV4_ROUTE`,
    /// `RTMGRP_IPV6_ROUTE`). Needs a tokio runtime.
    pub fn open(routes: bool) -> std::io::Result<Self> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: a plain socket call; the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is new and nothing else owns it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups =
            (libc::RTMGRP_LINK | libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
        if routes {
            addr.nl_groups |= (libc::RTMGRP_IPV4_ROUTE | libc::RTMGRP_IPV6_ROUTE) as u32;
        }
        // SAFETY: `addr` is a sockaddr_nl of the size given.
        let ret = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if ret != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: an OwnedFd is open for as long as it lives and always gives the
        // same descriptor; it moves into the AsyncFd, which owns it from here on.
        let fd = unsafe { tokio::io::unix::AsyncFd::register(fd) }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Self { fd })
    }

    /// Waits until the kernel says a link changed, and drains what is queued. An
    /// overrun (ENOBUFS: more changes than the socket holds) counts as a change.
    pub async fn changed(&mut self) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut any = false;
            let mut buf = [0u8; 8192];
            loop {
                // SAFETY: `buf` is live and as long as said.
                let n = unsafe {
                    libc::recv(
                        std::os::fd::AsRawFd::as_raw_fd(guard.get_inner()),
                        buf.as_mut_ptr() as *mut libc::c_void,
                        buf.len(),
                        0,
                    )
                };
                if n > 0 {
                    any = true;
                    continue;
                }
                if n == 0 {
                    break;
                }
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::ENOBUFS) => any = true,
                    Some(libc::EINTR) => {}
                    _ => return Err(e),
                }
            }
            guard.clear_ready();
            if any {
                return Ok(());
            }
        }
    }
}

/// What one scan changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Links to drop: the interface is gone, or was re-created under the same name
    /// (then it is in `attach` too).
    pub detach: Vec<String>,
    /// Selected interfaces without a link to their current incarnation (or with one
    /// of another role), and the role to attach in.
    pub attach: Vec<(String, u32, Role)>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.detach.is_empty() && self.attach.is_empty()
    }
}

/// Compares the links the agent holds (`attached`: name → ifindex at attach time
/// and role) with the interfaces `present` now. An interface whose name is back with
/// another ifindex was deleted and re-created between two scans (a pod restarted with
/// the same veth name): its old link is dropped and a new one made; so is the link of
/// an interface whose role changed.
pub fn plan(
    selection: &Selection,
    attached: &BTreeMap<String, (u32, Role)>,
    present: &[(u32, String)],
) -> Plan {
    let mut plan = Plan::default();
    let now: BTreeMap<&str, (u32, Role)> = present
        .iter()
        .filter_map(|(index, name)| Some((name.as_str(), (*index, selection.role(name)?))))
        .collect();
    for (name, link) in attached {
        match now.get(name.as_str()) {
            Some(l) if l == link => {}
            _ => plan.detach.push(name.clone()),
        }
    }
    for (name, (index, role)) in now {
        if attached.get(name) != Some(&(index, role)) {
            plan.attach.push((name.to_string(), index, role));
        }
    }
    // Uplinks first (a stable sort: by name within a role). The reply of a flow that a
    // pod interface's program translates to another node's backend is translated back
    // by the uplink's program; with the uplinks' programs in place before any pod's,
    // an agent starting on a node that serves traffic (beside kube-proxy) starts no
    // flow whose reply nothing translates back. Until then the uplinks' programs find
    // no flow of theirs and pass everything.
    plan.attach
        .sort_by_key(|(_, _, role)| *role != Role::External);
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        for (pattern, name, want) in [
            ("veth*", "veth1a2b", true),
            ("veth*", "veth", true),
            ("veth*", "eth0", false),
            ("cali*", "cali12ab34cd56e", true),
            ("lxc*", "lxc_health", true),
            ("v*", "v11", true),
            ("v*", "lo", false),
            ("v?", "v1", true),
            ("v?", "v11", false),
            ("*", "eth0", true),
            ("*0", "eth0", true),
            ("*0", "eth01", false),
            ("e*h*1", "eth0eh1", true),
            ("e*h*1", "eth0eh2", false),
            ("a*b*c", "abbbc", true),
            ("a*?", "a", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_match(pattern, name), want, "{pattern} vs {name}");
        }
    }

    #[test]
    fn entries_with_wildcards_are_patterns_others_exact_names() {
        let s = Selection::parse(&["eth1", "veth*", "v?"]).unwrap();
        assert_eq!(s.exact().collect::<Vec<_>>(), ["eth1"]);
        assert!(s.matches("eth1") && s.matches("veth9") && s.matches("v1"));
        assert!(!s.matches("eth0") && !s.matches("v12"));
        assert_eq!(Selection::parse(&["eth1", ""]), Err(SelectionError::Empty));
        assert!(matches!(
            Selection::parse(&["averyveryverylongname"]),
            Err(SelectionError::TooLong(_))
        ));
        assert!(matches!(
            Selection::parse(&["a/b*"]),
            Err(SelectionError::Invalid(_))
        ));
        assert!(Selection::parse::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_scan_attaches_new_interfaces_and_drops_gone_or_recreated_ones() {
        let s = Selection::parse(&["v*"]).unwrap();
        let pods = |i: u32| (i, Role::Pods);
        let attached: BTreeMap<String, (u32, Role)> = [
            ("v1".to_string(), pods(2)),
            ("v2".to_string(), pods(3)),
            ("v3".to_string(), pods(4)),
        ]
        .into();
        let present = vec![
            (1, "lo".to_string()),
            (2, "v1".to_string()),
            // v2 is gone; v3 was deleted and re-created; v4 is new.
            (9, "v3".to_string()),
            (10, "v4".to_string()),
            (11, "eth0".to_string()),
        ];
        assert_eq!(
            plan(&s, &attached, &present),
            Plan {
                detach: vec!["v2".into(), "v3".into()],
                attach: vec![("v3".into(), 9, Role::Pods), ("v4".into(), 10, Role::Pods)],
            }
        );
        let now: BTreeMap<String, (u32, Role)> = [
            ("v1".to_string(), pods(2)),
            ("v3".to_string(), pods(9)),
            ("v4".to_string(), pods(10)),
        ]
        .into();
        assert!(plan(&s, &now, &present).is_empty());
        // eth0 named an uplink: attached with the uplink program; v4 named both ways
        // is an uplink too, so its pod link is replaced.
        let s = s.with_external(&["eth0", "v4"]).unwrap();
        assert_eq!(
            plan(&s, &now, &present),
            Plan {
                detach: vec!["v4".into()],
                attach: vec![
                    ("eth0".into(), 11, Role::External),
                    ("v4".into(), 10, Role::External)
                ],
            }
        );
    }

    /// Uplinks are attached before pod interfaces, whatever the names: Calico's
    /// `cali*` sort before `eth0`.
    #[test]
    fn a_scan_attaches_uplinks_before_pod_interfaces() {
        let s = Selection::parse(&["cali*"])
            .unwrap()
            .with_external(&["eth0"])
            .unwrap();
        let present = vec![
            (2, "cali2b".to_string()),
            (3, "eth0".to_string()),
            (4, "cali1a".to_string()),
        ];
        assert_eq!(
            plan(&s, &BTreeMap::new(), &present).attach,
            vec![
                ("eth0".into(), 3, Role::External),
                ("cali1a".into(), 4, Role::Pods),
                ("cali2b".into(), 2, Role::Pods),
            ]
        );
    }

    /// Issue 47: `auto` selects what the finder found, beside names and patterns; an
    /// uplink named by --external-interfaces stays an uplink.
    #[test]
    fn auto_selects_the_interfaces_found() {
        let s = Selection::parse(&["auto", "tun0"])
            .unwrap()
            .with_external(&["eth*"])
            .unwrap();
        assert!(s.is_auto() && !s.is_empty());
        assert_eq!(s.exact().collect::<Vec<_>>(), ["tun0"]);
        assert_eq!(s.role("eni1a2b"), None);
        let s = s.with_found(["eni1a2b".to_string(), "eth0".to_string()]);
        assert_eq!(s.role("eni1a2b"), Some(Role::Pods));
        assert_eq!(s.role("tun0"), Some(Role::Pods));
        assert_eq!(s.role("eth0"), Some(Role::External));
        assert_eq!(s.role("azv1"), None);
        assert!(Selection::parse(&["auto"])
            .unwrap()
            .with_found(Vec::new())
            .is_auto());
        assert_eq!(
            Selection::parse::<&str>(&[])
                .unwrap()
                .with_external(&["auto"]),
            Err(SelectionError::AutoUplinks)
        );
    }

    #[test]
    fn listing_sees_loopback() {
        // Every network namespace has `lo`.
        assert!(list().unwrap().iter().any(|(_, name)| name == "lo"));
    }
}

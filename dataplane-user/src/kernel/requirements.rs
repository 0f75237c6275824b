//! What the agent needs of the kernel and the node, probed before anything is loaded
//! (`run`, and `check`): the bpf() system call, TC programs and the helpers they
//! call, tcx when `--attach tcx` asks for it, a usable bpffs for the pins, XDP when
//! `--xdp` asks for it, and the socket programs' pieces (cgroup `sock_addr` programs
//! and their helpers, the network namespace cookie, a cgroup v2 hierarchy). Program
//! types and helpers are asked of the kernel (aya's feature probes load a minimal
//! program), never guessed from the version; the version is only compared with the
//! oldest tested kernel.
//!
//! [`assess`] is pure: from what was needed and what was found it says what is
//! missing (the agent stops, naming every piece at once), what only degrades the agent
//! (and how) and what is merely noted.

use std::path::{Path, PathBuf};

use super::{AttachMode, XdpChoice};

/// What this run of the agent asks for.
#[derive(Clone, Debug)]
pub struct Needs {
    /// The bpffs directory maps and links are pinned under; `None`: `--no-pin`.
    pub pins: Option<PathBuf>,
    pub attach: AttachMode,
    pub xdp: XdpChoice,
    /// `--socket-lb-cgroup`; `None`: `--no-socket-lb`.
    pub socket_lb: Option<PathBuf>,
}

/// What was found on this kernel and node: each `Err` says why a piece is absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// `uname -r`.
    pub kernel: String,
    /// The bpf() system call, with the agent's privileges.
    pub bpf: Result<(), String>,
    /// TC (`sched_cls`) programs.
    pub tc: Result<(), String>,
    /// Helpers the TC programs call that this kernel lacks.
    pub tc_helpers_missing: Vec<&'static str>,
    /// tcx links (Linux 6.6).
    pub tcx: Result<(), String>,
    /// bpffs at the pin directory, mounted or mountable there; `None`: not probed.
    pub bpffs: Option<Result<(), String>>,
    /// XDP programs; `None`: not probed (`--xdp off`).
    pub xdp: Option<Result<(), String>>,
    /// Helpers the XDP program calls that this kernel lacks.
    pub xdp_helpers_missing: Vec<&'static str>,
    /// cgroup `sock_addr` programs; `None`: not probed (`--no-socket-lb`).
    pub sock: Option<Result<(), String>>,
    /// Helpers the socket programs call that this kernel lacks.
    pub sock_helpers_missing: Vec<&'static str>,
    /// The network namespace cookie (`SO_NETNS_COOKIE`, Linux 5.14).
    pub netns_cookie: bool,
    /// A cgroup v2 hierarchy for the socket programs; `None`: not probed.
    pub cgroup: Option<Result<(), String>>,
    /// `bpf_set_retval` in socket programs (refused node connections get
    /// ECONNREFUSED rather than EPERM).
    pub set_retval: bool,
    /// Kernel BTF at `/sys/kernel/btf/vmlinux`.
    pub btf: bool,
}

/// How much a piece matters to this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weight {
    /// Without it the agent does not start.
    Required,
    /// Without it the agent runs without something, said in the log.
    Degrades,
    /// Said for information only.
    Note,
}

/// One piece the agent needs or uses, and whether it is there.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Requirement {
    /// What it is, as the message names it.
    pub name: String,
    pub weight: Weight,
    /// Whether it is there.
    pub present: bool,
    /// Why it is absent, or what the agent does without it (or with it).
    pub detail: String,
}

/// The oldest kernel the project tests on (Debian 12's).
pub const OLDEST_TESTED: (u32, u32) = (6, 1);

/// What the agent makes of `found`, for the run that needs `needs`: every piece
/// probed, in the order the message lists them.
pub fn assess(needs: &Needs, found: &Found) -> Vec<Requirement> {
    let mut out = Vec::new();
    let mut push = |name: &str, weight: Weight, got: &Result<(), String>, without: &str| {
        out.push(Requirement {
            name: name.to_string(),
            weight,
            present: got.is_ok(),
            detail: match got {
                Ok(()) => String::new(),
                Err(why) if without.is_empty() => why.clone(),
                Err(why) => format!("{why}; {without}"),
            },
        });
    };
    push(
        "the bpf() system call",
        Weight::Required,
        &found.bpf,
        "run the agent as root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN) on a kernel with CONFIG_BPF_SYSCALL",
    );
    push(
        "TC (sched_cls) programs",
        Weight::Required,
        &found.tc,
        "the kernel needs CONFIG_NET_CLS_BPF and CONFIG_NET_SCH_INGRESS",
    );
    push(
        "the TC programs' helpers",
        Weight::Required,
        &helpers(&found.tc_helpers_missing),
        "",
    );
    match needs.attach {
        AttachMode::Tcx => push(
            "tcx links (--attach tcx)",
            Weight::Required,
            &found.tcx,
            "Linux 6.6 or later has them; --attach auto falls back to a TC filter",
        ),
        AttachMode::Auto => push(
            "tcx links",
            Weight::Note,
            &found.tcx,
            "the programs go on a clsact qdisc with a TC filter instead",
        ),
        AttachMode::Tc => {}
    }
    if let (Some(dir), Some(got)) = (&needs.pins, &found.bpffs) {
        push(
            &format!("bpffs for the pins at {}", dir.display()),
            Weight::Required,
            got,
            "mount one there (`mount -t bpf bpf DIR`), choose another --bpffs-dir, or run with --no-pin (restarts then drop every connection)",
        );
    }
    if needs.xdp != XdpChoice::Off {
        if let Some(got) = &found.xdp {
            let got = got.clone().and(helpers(&found.xdp_helpers_missing));
            push(
                "XDP programs (--xdp)",
                Weight::Degrades,
                &got,
                "the uplinks' TC program decides every packet",
            );
        }
    }
    if let Some(cgroup) = &needs.socket_lb {
        let without = "the node's own sockets (kubelet, hostNetwork pods) do not reach Services, \
                       pods' traffic is translated as usual, and /readyz answers 503";
        if let Some(got) = &found.sock {
            let got = got.clone().and(helpers(&found.sock_helpers_missing));
            push("cgroup sock_addr programs", Weight::Degrades, &got, without);
        }
        let cookie = match found.netns_cookie {
            true => Ok(()),
            false => Err("SO_NETNS_COOKIE is refused (Linux 5.14 or later has it)".to_string()),
        };
        push(
            "the network namespace cookie",
            Weight::Degrades,
            &cookie,
            without,
        );
        if let Some(got) = &found.cgroup {
            push(
                &format!("a cgroup v2 hierarchy ({})", cgroup.display()),
                Weight::Degrades,
                got,
                without,
            );
        }
        let retval = match found.set_retval {
            true => Ok(()),
            false => Err("the socket programs cannot call bpf_set_retval".to_string()),
        };
        push(
            "bpf_set_retval in socket programs",
            Weight::Note,
            &retval,
            "a node process's connect() to a Service without endpoints fails with EPERM, not ECONNREFUSED",
        );
    }
    let btf = match found.btf {
        true => Ok(()),
        false => Err("no /sys/kernel/btf/vmlinux".to_string()),
    };
    push(
        "kernel BTF",
        Weight::Note,
        &btf,
        "not needed: the programs carry no CO-RE relocations",
    );
    let tested = match parse_release(&found.kernel) {
        Some(v) if v >= OLDEST_TESTED => Ok(()),
        Some(_) => Err(format!(
            "kernel {} is older than the oldest tested ({}.{})",
            found.kernel, OLDEST_TESTED.0, OLDEST_TESTED.1
        )),
        None => Err(format!("kernel release {:?} not understood", found.kernel)),
    };
    push(
        "a tested kernel",
        Weight::Note,
        &tested,
        "every piece above was probed, but the datapath is not tested there",
    );
    out
}

fn helpers(missing: &[&'static str]) -> Result<(), String> {
    match missing {
        [] => Ok(()),
        names => Err(format!("the kernel lacks {}", names.join(", "))),
    }
}

/// `6.1.0-28-amd64` to `(6, 1)`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-', '+']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// The pieces that stop the agent.
pub fn missing(reqs: &[Requirement]) -> impl Iterator<Item = &Requirement> {
    reqs.iter()
        .filter(|r| r.weight == Weight::Required && !r.present)
}

/// The one message that names every missing required piece; `None` when none is.
pub fn refusal(reqs: &[Requirement]) -> Option<String> {
    let missing: Vec<_> = missing(reqs).collect();
    if missing.is_empty() {
        return None;
    }
    let mut msg = format!(
        "this kernel or node lacks {} the agent needs:",
        match missing.len() {
            1 => "one piece".to_string(),
            n => format!("{n} pieces"),
        }
    );
    for r in missing {
        msg.push_str(&format!("\n  - {}: {}", r.name, r.detail));
    }
    Some(msg)
}

/// Probes the running kernel and node for what `needs` asks. Loads nothing that
/// stays: each probe program is unloaded at once; nothing is mounted or created.
pub fn probe(needs: &Needs) -> Found {
    use aya::{
        programs::ProgramType,
        sys::{is_helper_supported, is_program_supported, BpfHelper as H},
    };
    super::load::raise_memlock();
    let kind = |t: ProgramType, what: &str| match is_program_supported(t) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("this kernel does not load {what} programs")),
        Err(e) => Err(format!(
            "probing {what} programs: {}",
            crate::error_chain(&e)
        )),
    };
    let lacking = |t: ProgramType, list: &[(H, &'static str)]| -> Vec<&'static str> {
        list.iter()
            .filter(|(h, _)| !matches!(is_helper_supported(t, *h), Ok(true)))
            .map(|(_, name)| *name)
            .collect()
    };
    let bpf = match is_program_supported(ProgramType::SocketFilter) {
        Ok(true) => Ok(()),
        Ok(false) => Err("the kernel loads no BPF program at all".to_string()),
        Err(e) => Err(crate::error_chain(&e)),
    };
    let tc = kind(ProgramType::SchedClassifier, "TC");
    // What the TC programs call (dataplane-ebpf): conntrack's clocks (coarse ns is
    // Linux 5.11), REJECT's rewrite and redirect, checksums.
    let tc_helpers = [
        (H::BPF_FUNC_ktime_get_coarse_ns, "bpf_ktime_get_coarse_ns"),
        (H::BPF_FUNC_jiffies64, "bpf_jiffies64"),
        (H::BPF_FUNC_skb_adjust_room, "bpf_skb_adjust_room"),
        (H::BPF_FUNC_skb_change_tail, "bpf_skb_change_tail"),
        (H::BPF_FUNC_skb_load_bytes, "bpf_skb_load_bytes"),
        (H::BPF_FUNC_skb_store_bytes, "bpf_skb_store_bytes"),
        (H::BPF_FUNC_l4_csum_replace, "bpf_l4_csum_replace"),
        (H::BPF_FUNC_csum_diff, "bpf_csum_diff"),
        (H::BPF_FUNC_redirect, "bpf_redirect"),
        (H::BPF_FUNC_skb_pull_data, "bpf_skb_pull_data"),
        (H::BPF_FUNC_tail_call, "bpf_tail_call"),
    ];
    let tc_helpers_missing = match tc {
        Ok(()) => lacking(ProgramType::SchedClassifier, &tc_helpers),
        Err(_) => Vec::new(),
    };
    let (xdp, xdp_helpers_missing) = match needs.xdp {
        XdpChoice::Off => (None, Vec::new()),
        _ => {
            let got = kind(ProgramType::Xdp, "XDP");
            let missing = match got {
                Ok(()) => lacking(
                    ProgramType::Xdp,
                    &[(H::BPF_FUNC_xdp_adjust_meta, "bpf_xdp_adjust_meta")],
                ),
                Err(_) => Vec::new(),
            };
            (Some(got), missing)
        }
    };
    let (sock, sock_helpers_missing, cgroup) = match &needs.socket_lb {
        None => (None, Vec::new(), None),
        Some(given) => {
            let got = kind(ProgramType::CgroupSockAddr, "cgroup sock_addr");
            let missing = match got {
                Ok(()) => lacking(
                    ProgramType::CgroupSockAddr,
                    &[
                        (H::BPF_FUNC_get_netns_cookie, "bpf_get_netns_cookie"),
                        (H::BPF_FUNC_get_socket_cookie, "bpf_get_socket_cookie"),
                        (H::BPF_FUNC_get_prandom_u32, "bpf_get_prandom_u32"),
                    ],
                ),
                Err(_) => Vec::new(),
            };
            (Some(got), missing, Some(cgroup_usable(given)))
        }
    };
    Found {
        kernel: kernel_release(),
        bpf,
        tc,
        tc_helpers_missing,
        tcx: super::probe_tcx(),
        bpffs: needs.pins.as_deref().map(bpffs_usable),
        xdp,
        xdp_helpers_missing,
        sock,
        sock_helpers_missing,
        netns_cookie: super::netns_cookie().is_some(),
        cgroup,
        set_retval: super::probe_set_retval(),
        btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
    }
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: `utsname` is plain old data; `uname` fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    // SAFETY: `release` is NUL-terminated by the kernel.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Whether pins can be made under `base`, as loading will: the deepest directory of
/// `base` that exists is on a bpffs and writable, or it is `/sys/fs/bpf` (or above
/// it, for a `base` under it) with no bpffs yet, which the agent mounts there when
/// this kernel has the file system.
pub fn bpffs_usable(base: &Path) -> Result<(), String> {
    let mut at = base;
    while !at.exists() {
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => break,
        }
    }
    if !at.is_dir() {
        return Err(format!("{} is not a directory", at.display()));
    }
    let root = Path::new("/sys/fs/bpf");
    if super::pin::is_fs(at, super::pin::BPF_FS_MAGIC) {
        return writable(at);
    }
    if base.starts_with(root) && root.starts_with(at) {
        let known = std::fs::read_to_string("/proc/filesystems")
            .map(|t| {
                t.lines()
                    .any(|l| l.split_whitespace().last() == Some("bpf"))
            })
            .unwrap_or(false);
        return match (root.is_dir(), known) {
            (true, true) => Ok(()),
            (false, _) => Err("no /sys/fs/bpf to mount a bpffs on".into()),
            (true, false) => Err("this kernel has no bpf file system (/proc/filesystems)".into()),
        };
    }
    Err(format!("{} is not on a bpffs", at.display()))
}

fn writable(dir: &Path) -> Result<(), String> {
    let c =
        std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    match unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } {
        0 => Ok(()),
        _ => Err(format!(
            "{} is on a bpffs but not writable: {}",
            dir.display(),
            std::io::Error::last_os_error()
        )),
    }
}

/// Whether the socket programs find a cgroup v2 hierarchy for `--socket-lb-cgroup`
/// `given`, as [`super::resolve_cgroup`] looks (without mounting one).
pub fn cgroup_usable(given: &Path) -> Result<(), String> {
    use super::pin::{is_fs, CGROUP2_SUPER_MAGIC as V2};
    if given != Path::new("auto") {
        return match is_fs(given, V2) || is_fs(&given.join("unified"), V2) {
            true => Ok(()),
            false => Err(format!(
                "{} is not a cgroup v2 hierarchy (nor holds one at unified)",
                given.display()
            )),
        };
    }
    let mounted = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .any(|p| is_fs(Path::new(p), V2));
    let known = std::fs::read_to_string("/proc/filesystems")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("cgroup2"))
        })
        .unwrap_or(false);
    match mounted || known {
        true => Ok(()),
        false => Err("no cgroup v2 hierarchy is mounted and this kernel has none to mount".into()),
    }
}

/// The requirements as `check` prints them: one line each.
pub fn render(reqs: &[Requirement]) -> String {
    let mut out = String::new();
    for r in reqs {
        let status = match (r.present, r.weight) {
            (true, _) => "present",
            (false, Weight::Required) => "MISSING",
            (false, Weight::Degrades) => "missing (degrades)",
            (false, Weight::Note) => "absent",
        };
        out.push_str(&format!("{:<48} {status}", r.name));
        if !r.present {
            out.push_str(&format!(": {}", r.detail));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_there() -> Found {
        Found {
            kernel: "6.18.0-1-amd64".into(),
            bpf: Ok(()),
            tc: Ok(()),
            tc_helpers_missing: vec![],
            tcx: Ok(()),
            bpffs: Some(Ok(())),
            xdp: Some(Ok(())),
            xdp_helpers_missing: vec![],
            sock: Some(Ok(())),
            sock_helpers_missing: vec![],
            netns_cookie: true,
            cgroup: Some(Ok(())),
            set_retval: true,
            btf: true,
        }
    }

    fn needs() -> Needs {
        Needs {
            pins: Some("/sys/fs/bpf/sliceway".into()),
            attach: AttachMode::Auto,
            xdp: XdpChoice::Native,
            socket_lb: Some("auto".into()),
        }
    }

    #[test]
    fn nothing_missing_refuses_nothing_and_lists_every_piece_present() {
        let reqs = assess(&needs(), &all_there());
        assert_eq!(refusal(&reqs), None);
        assert!(reqs.iter().all(|r| r.present), "{reqs:#?}");
        let names: Vec<_> = reqs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "the bpf() system call",
                "TC (sched_cls) programs",
                "the TC programs' helpers",
                "tcx links",
                "bpffs for the pins at /sys/fs/bpf/sliceway",
                "XDP programs (--xdp)",
                "cgroup sock_addr programs",
                "the network namespace cookie",
                "a cgroup v2 hierarchy (auto)",
                "bpf_set_retval in socket programs",
                "kernel BTF",
                "a tested kernel",
            ]
        );
    }

    #[test]
    fn every_missing_required_piece_is_named_in_one_message() {
        let found = Found {
            tc_helpers_missing: vec!["bpf_ktime_get_coarse_ns"],
            tcx: Err("EINVAL".into()),
            bpffs: Some(Err("/proc is not on a bpffs".into())),
            ..all_there()
        };
        let needs = Needs {
            pins: Some("/proc/sliceway".into()),
            attach: AttachMode::Tcx,
            ..needs()
        };
        let reqs = assess(&needs, &found);
        let msg = refusal(&reqs).expect("refused");
        assert!(
            msg.starts_with("this kernel or node lacks 3 pieces the agent needs:"),
            "{msg}"
        );
        for part in [
            "the TC programs' helpers: the kernel lacks bpf_ktime_get_coarse_ns",
            "tcx links (--attach tcx): EINVAL; Linux 6.6",
            "bpffs for the pins at /proc/sliceway: /proc is not on a bpffs; mount one",
        ] {
            assert!(msg.contains(part), "{part:?} not in {msg}");
        }
        assert_eq!(msg.lines().count(), 4, "{msg}");
    }

    #[test]
    fn what_the_agent_runs_without_degrades_and_says_how() {
        let found = Found {
            xdp: Some(Err("this kernel does not load XDP programs".into())),
            sock_helpers_missing: vec!["bpf_get_netns_cookie"],
            netns_cookie: false,
            tcx: Err("no tcx".into()),
            set_retval: false,
            btf: false,
            ..all_there()
        };
        let reqs = assess(&needs(), &found);
        assert_eq!(refusal(&reqs), None, "{reqs:#?}");
        let absent = |name: &str| {
            reqs.iter()
                .find(|r| r.name == name)
                .filter(|r| !r.present)
                .unwrap_or_else(|| panic!("{name} not absent in {reqs:#?}"))
                .clone()
        };
        let xdp = absent("XDP programs (--xdp)");
        assert_eq!(xdp.weight, Weight::Degrades);
        assert!(xdp
            .detail
            .ends_with("the uplinks' TC program decides every packet"));
        let sock = absent("cgroup sock_addr programs");
        assert_eq!(sock.weight, Weight::Degrades);
        assert!(sock
            .detail
            .starts_with("the kernel lacks bpf_get_netns_cookie; the node's own sockets"));
        assert_eq!(
            absent("the network namespace cookie").weight,
            Weight::Degrades
        );
        // Auto falls back to a TC filter; BTF is not needed.
        assert_eq!(absent("tcx links").weight, Weight::Note);
        assert_eq!(absent("kernel BTF").weight, Weight::Note);
        assert_eq!(
            absent("bpf_set_retval in socket programs").weight,
            Weight::Note
        );
    }

    #[test]
    fn pieces_not_asked_for_are_not_listed() {
        let needs = Needs {
            pins: None,
            attach: AttachMode::Tc,
            xdp: XdpChoice::Off,
            socket_lb: None,
        };
        let found = Found {
            bpffs: None,
            xdp: None,
            sock: None,
            cgroup: None,
            tcx: Err("no tcx".into()),
            ..all_there()
        };
        let names: Vec<_> = assess(&needs, &found).into_iter().map(|r| r.name).collect();
        assert_eq!(
            names,
            [
                "the bpf() system call",
                "TC (sched_cls) programs",
                "the TC programs' helpers",
                "kernel BTF",
                "a tested kernel"
            ]
        );
    }

    #[test]
    fn kernels_older_than_the_oldest_tested_are_noted() {
        for (release, tested) in [
            ("6.1.0-28-amd64", true),
            ("6.12.9+bpo-amd64", true),
            ("5.15.0-105-generic", false),
            ("5.10.219-208.866.amzn2.x86_64", false),
            ("weird", false),
        ] {
            let found = Found {
                kernel: release.into(),
                ..all_there()
            };
            let reqs = assess(&needs(), &found);
            let r = reqs.iter().find(|r| r.name == "a tested kernel").unwrap();
            assert_eq!(r.present, tested, "{release}");
            assert_eq!(refusal(&reqs), None);
        }
    }

    #[test]
    fn a_bpffs_dir_under_a_file_or_off_bpffs_is_unusable() {
        // Not under /sys/fs/bpf and not a bpffs: the temp directory.
        let dir = std::env::temp_dir();
        let err = bpffs_usable(&dir.join("sliceway-pins")).unwrap_err();
        assert!(err.ends_with("is not on a bpffs"), "{err}");
        // Under a regular file.
        let file = dir.join(format!("sliceway-req-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let err = bpffs_usable(&file.join("pins")).unwrap_err();
        std::fs::remove_file(&file).unwrap();
        assert!(err.ends_with("is not a directory"), "{err}");
    }
}

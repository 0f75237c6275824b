//! Links: attaching the TC programs to an interface on one of two paths, taking over
//! what an earlier run left attached, and dropping links of interfaces that went
//! away. Every interface gets its role's program at ingress and the egress program
//! (`sliceway_tc_out`: replies of host-network backends of this node) at egress, the
//! egress one first, so no connection is translated before its replies can be.
//!
//! - tcx (Linux 6.6+): a BPF link per interface, pinned as `link-<iface>` so it
//!   outlives the agent; a restarted agent swaps its program in with
//!   `BPF_LINK_UPDATE`.
//! - clsact and a netlink TC filter (`cls_bpf`, direct action), where tcx is missing
//!   (Linux 6.1, 5.15): the filter sits at a fixed priority and handle
//!   ([`TC_PRIORITY`], [`TC_HANDLE`]) and stays after the agent exits; a restarted
//!   agent replaces the program of that same filter (`RTM_NEWTFILTER` without
//!   `NLM_F_CREATE`, which cls_bpf turns into an RCU swap of the filter), never
//!   deleting and adding, so no packet passes without a program and no second copy is
//!   ever attached.

use std::{collections::BTreeMap, path::PathBuf};

use aya::programs::{
    links::{FdLink, PinnedLink},
    tc::{self, NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions, TcHandle},
    Link as _, LinkOrder, SchedClassifier, TcAttachType,
};

use super::{
    load::{L3_EXT_PROGRAM, L3_OUT_PROGRAM, L3_PROGRAM, OUT_PROGRAM, TC_EXT_PROGRAM, TC_PROGRAM},
    pin::unpin,
    record::{record_change, Change},
    Datapath, KernelError,
};
pub use crate::kernel::interfaces::Role;

impl Role {
    /// The TC program interfaces of this role get (with an Ethernet header).
    pub fn program(self) -> &'static str {
        self.program_for(false)
    }

    /// The TC program interfaces of this role get: `l3` for one without an Ethernet
    /// header.
    pub fn program_for(self, l3: bool) -> &'static str {
        match (self, l3) {
            (Role::Pods, false) => TC_PROGRAM,
            (Role::External, false) => TC_EXT_PROGRAM,
            (Role::Pods, true) => L3_PROGRAM,
            (Role::External, true) => L3_EXT_PROGRAM,
        }
    }
}

/// Every TC program the agent attaches at ingress, by name (its filters are found
/// by it).
pub const TC_PROGRAMS: [&str; 4] = [TC_PROGRAM, TC_EXT_PROGRAM, L3_PROGRAM, L3_EXT_PROGRAM];
/// The programs the agent attaches at egress, by name.
pub const OUT_PROGRAMS: [&str; 2] = [OUT_PROGRAM, L3_OUT_PROGRAM];

/// Where on an interface a TC program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hook {
    Ingress,
    Egress,
}

impl Hook {
    fn tc(self) -> TcAttachType {
        match self {
            Hook::Ingress => TcAttachType::Ingress,
            Hook::Egress => TcAttachType::Egress,
        }
    }

    /// The program at this hook of an interface of `role` (`l3`: without an Ethernet
    /// header).
    fn program(self, role: Role, l3: bool) -> &'static str {
        match (self, l3) {
            (Hook::Ingress, _) => role.program_for(l3),
            (Hook::Egress, false) => OUT_PROGRAM,
            (Hook::Egress, true) => L3_OUT_PROGRAM,
        }
    }
}

/// Priority of sliceway's TC filter at clsact ingress (lower runs first). Fixed, so a
/// restarted agent finds the filter an earlier run left.
pub const TC_PRIORITY: u16 = 0x5157;
/// Handle of sliceway's TC filter at [`TC_PRIORITY`].
pub const TC_HANDLE: u32 = 0x5157;

/// How the TC program is attached (`--attach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// tcx where the kernel has it, a clsact TC filter otherwise.
    Auto,
    /// tcx only (Linux 6.6+); an error where the kernel lacks it.
    Tcx,
    /// A clsact qdisc and a netlink TC filter, on any kernel.
    Tc,
}

/// The attach path chosen for this datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcPath {
    Tcx,
    Netlink,
}

impl TcPath {
    pub fn as_str(self) -> &'static str {
        match self {
            TcPath::Tcx => "tcx",
            TcPath::Netlink => "tc",
        }
    }
}

/// Whether the running kernel has tcx: a `BPF_PROG_QUERY` of tcx ingress on the
/// loopback interface, which every namespace has; kernels without tcx refuse the
/// attach type (EINVAL). A probe rather than a version check, so a kernel that
/// backports tcx is used as such.
pub fn probe_tcx() -> Result<(), String> {
    SchedClassifier::query_tcx("lo", TcAttachType::Ingress)
        .map(|_| ())
        .map_err(|e| {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            msg
        })
}

/// This agent's attachment to one interface.
#[derive(Debug)]
pub(super) struct InterfaceLink {
    /// The interface's index when it was attached: a different index under the same
    /// name is another interface.
    ifindex: u32,
    /// A link owned by the program (unpinned); a pinned link is held by its pin file.
    owned: Option<SchedClassifierLinkId>,
    pin: Option<PathBuf>,
    /// A TC filter at sliceway's priority and handle, kept after the agent exits.
    filter: bool,
    /// Which role, and the program it runs (Ethernet or not).
    role: Role,
    program: &'static str,
}

/// How `attach` attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// A new link, pinned: it outlives the agent.
    NewPinned,
    /// A pinned link of an earlier run now runs this agent's program (atomic swap, no
    /// packet sees no program).
    Replaced,
    /// A new TC filter at sliceway's priority and handle: it outlives the agent.
    NewFilter,
    /// The TC filter an earlier run left now runs this agent's program (replaced in
    /// place, atomically).
    ReplacedFilter,
    /// Attached for the life of this process only (no pinning).
    Unpinned,
}

impl Attached {
    pub const ALL: [Attached; 5] = [
        Attached::NewPinned,
        Attached::Replaced,
        Attached::NewFilter,
        Attached::ReplacedFilter,
        Attached::Unpinned,
    ];

    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Attached::NewPinned => "new_link",
            Attached::Replaced => "took_over_link",
            Attached::NewFilter => "new_filter",
            Attached::ReplacedFilter => "replaced_filter",
            Attached::Unpinned => "unpinned",
        }
    }
}

impl Datapath {
    /// Chooses the attach path: `Auto` probes for tcx; `Tcx` insists on it. Called
    /// before the first attach (or the first attach calls it with `Auto`).
    pub fn choose_attach(&mut self, mode: AttachMode) -> Result<TcPath, KernelError> {
        let path = match mode {
            AttachMode::Tc => TcPath::Netlink,
            AttachMode::Tcx => {
                probe_tcx().map_err(|reason| KernelError::NoTcx { reason })?;
                TcPath::Tcx
            }
            AttachMode::Auto => match probe_tcx() {
                Ok(()) => TcPath::Tcx,
                Err(reason) => {
                    tracing::info!(
                        "this kernel has no tcx ({reason}); attaching with a clsact qdisc and a TC filter"
                    );
                    TcPath::Netlink
                }
            },
        };
        self.path = Some(path);
        Ok(path)
    }

    /// The attach path in use (probed on first use).
    pub fn attach_path(&mut self) -> Result<TcPath, KernelError> {
        match self.path {
            Some(p) => Ok(p),
            None => self.choose_attach(AttachMode::Auto),
        }
    }

    /// Attaches the TC programs to `iface` on the chosen path (see the module's doc):
    /// the egress program, then the role's program at ingress. With pinning the
    /// attachments outlive the agent, and what an earlier run left is taken over
    /// atomically. A pinned tcx link left from an interface that was deleted and
    /// re-created under the same name is defunct (the kernel refuses to update it):
    /// it is replaced by a new link. Without pinning the programs detach when the
    /// agent exits. Says how the ingress program was attached.
    pub fn attach(&mut self, iface: &str, role: Role) -> Result<Attached, KernelError> {
        let ifindex = ifindex(iface).map_err(|source| KernelError::Interface {
            iface: iface.to_string(),
            source,
        })?;
        // An interface without an Ethernet header (a tun device, ipip, WireGuard)
        // gets the programs that read the IP header first; any other link type is
        // refused, never misread.
        let l3 = match link_type(iface) {
            Ok(ARPHRD_ETHER) => false,
            Ok(t) if L3_LINK_TYPES.contains(&t) => true,
            Ok(other) => {
                return Err(KernelError::NotEthernet {
                    iface: iface.to_string(),
                    link_type: other,
                })
            }
            Err(source) => {
                return Err(KernelError::Interface {
                    iface: iface.to_string(),
                    source,
                })
            }
        };
        let path = self.attach_path()?;
        if l3 {
            self.load_l3()?;
        }
        if path == TcPath::Netlink {
            // The filters need the clsact qdisc (EEXIST when it is there already, and
            // then it is not this agent's to remove at `cleanup --all`).
            if tc::qdisc_add_clsact(iface).is_ok() {
                if let Some(pins) = &self.pins {
                    record_change(
                        pins,
                        &Change::Qdisc {
                            iface: iface.to_string(),
                            ifindex,
                        },
                    );
                }
            }
        }
        let (_, link) = self.attach_at(iface, ifindex, role, l3, path, Hook::Egress)?;
        self.egress.insert(iface.to_string(), link);
        let (how, link) = self.attach_at(iface, ifindex, role, l3, path, Hook::Ingress)?;
        self.links.insert(iface.to_string(), link);
        Ok(how)
    }

    /// Attaches the program of `hook` to `iface` (see [`Datapath::attach`]).
    fn attach_at(
        &mut self,
        iface: &str,
        ifindex: u32,
        role: Role,
        l3: bool,
        path: TcPath,
        hook: Hook,
    ) -> Result<(Attached, InterfaceLink), KernelError> {
        let attach_err = |source| KernelError::Attach {
            iface: iface.to_string(),
            source,
        };
        let name = hook.program(role, l3);
        let link_pin = self.pins.as_ref().map(|p| match hook {
            Hook::Ingress => p.link(iface),
            Hook::Egress => p.egress_link(iface),
        });
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .ok_or(KernelError::MissingProgram(name))?
            .try_into()?;
        let link = |owned, pin, filter| InterfaceLink {
            ifindex,
            owned,
            pin,
            filter,
            role,
            program: name,
        };
        let Some(link_pin) = link_pin else {
            // Not pinned: the attachment is this process's and goes when it exits.
            let options = match path {
                TcPath::Netlink => TcAttachOptions::Netlink(NlOptions::default()),
                TcPath::Tcx => TcAttachOptions::TcxOrder(LinkOrder::default()),
            };
            let id = program
                .attach_with_options(iface, hook.tc(), options)
                .map_err(attach_err)?;
            return Ok((Attached::Unpinned, link(Some(id), None, false)));
        };
        if path == TcPath::Netlink {
            let how = attach_filter(program, iface, hook).map_err(attach_err)?;
            return Ok((how, link(None, None, true)));
        }
        let pin_err = |reason: String| KernelError::Pin {
            path: link_pin.clone(),
            reason,
        };
        let mut how = Attached::NewPinned;
        if let Ok(old) = PinnedLink::from_pin(&link_pin) {
            let old = SchedClassifierLink::try_from(FdLink::from(old))
                .map_err(|e| pin_err(format!("taking over the pinned link: {e}")))?;
            match program.attach_to_link(old) {
                Ok(id) => {
                    // The pin holds the link; the program need not.
                    drop(program.take_link(id));
                    how = Attached::Replaced;
                }
                Err(e) => {
                    tracing::info!(
                        interface = %iface,
                        "the pinned link belongs to an interface that no longer exists ({e}); \
                         attaching anew"
                    );
                    unpin(&link_pin).map_err(|e| pin_err(e.to_string()))?;
                }
            }
        }
        if how == Attached::NewPinned {
            let id = program
                .attach_with_options(
                    iface,
                    hook.tc(),
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .map_err(attach_err)?;
            let taken = program.take_link(id).map_err(attach_err)?;
            let fd_link = FdLink::try_from(taken).map_err(|e| pin_err(e.to_string()))?;
            fd_link.pin(&link_pin).map_err(|e| pin_err(e.to_string()))?;
        }
        Ok((how, link(None, Some(link_pin), false)))
    }

    /// Drops this agent's link on `iface` (for an interface that is gone or was
    /// re-created): a pinned link is unpinned, an owned one closed, a kept TC filter
    /// deleted if its interface is still the one it was put on (a deleted interface
    /// took its filters with it). Nothing happens to other interfaces. Returns whether
    /// there was a link.
    pub fn detach(&mut self, iface: &str) -> Result<bool, KernelError> {
        self.detach_xdp(iface);
        let had_egress = match self.egress.remove(iface) {
            Some(link) => {
                self.drop_link(iface, link, Hook::Egress)?;
                true
            }
            None => false,
        };
        if let Some(pins) = &self.pins {
            // A deleted interface took its sysctls and qdiscs with it.
            if let Ok(present) = crate::kernel::interfaces::list() {
                super::record::NodeRecord::new(&pins.base).prune(&present);
            }
        }
        let Some(link) = self.links.remove(iface) else {
            return Ok(had_egress);
        };
        self.drop_link(iface, link, Hook::Ingress)?;
        Ok(true)
    }

    /// Drops one of this agent's links on `iface` (see [`Datapath::detach`]).
    fn drop_link(
        &mut self,
        iface: &str,
        link: InterfaceLink,
        hook: Hook,
    ) -> Result<(), KernelError> {
        if let Some(id) = link.owned {
            let program: &mut SchedClassifier = self
                .ebpf
                .program_mut(link.program)
                .ok_or(KernelError::MissingProgram(link.program))?
                .try_into()?;
            // Dropping the link detaches it; with the interface gone the kernel has
            // detached it already and the error of doing it again is of no interest.
            drop(program.take_link(id));
        }
        if let Some(pin) = link.pin {
            unpin(&pin).map_err(|e| KernelError::Pin {
                path: pin.clone(),
                reason: e.to_string(),
            })?;
        }
        if link.filter && ifindex(iface).is_ok_and(|i| i == link.ifindex) {
            delete_filter(iface, hook).map_err(|source| KernelError::Attach {
                iface: iface.to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// The TC program this agent attached to `iface`, if any.
    pub fn program_on(&self, iface: &str) -> Option<&'static str> {
        self.links.get(iface).map(|l| l.program)
    }

    /// Interfaces this agent attached to, with their index at attach time and the
    /// role they were attached in.
    pub fn attached(&self) -> BTreeMap<String, (u32, Role)> {
        self.links
            .iter()
            .map(|(name, link)| (name.clone(), (link.ifindex, link.role)))
            .collect()
    }

    /// Removes what earlier runs left attached to interfaces this agent has not
    /// attached to (deleted since, or no longer selected), and whatever the other
    /// attach path left anywhere (an agent that switched between tcx and a TC filter
    /// must not leave both running): pinned tcx links and sliceway's TC filters. Their
    /// programs detach. Returns the interfaces whose attachments were removed.
    pub fn unpin_other_links(&self) -> Result<Vec<String>, KernelError> {
        let Some(pins) = &self.pins else {
            return Ok(Vec::new());
        };
        let path = self.path.unwrap_or(TcPath::Tcx);
        let mut removed = Vec::new();
        let pinned = pins
            .linked_interfaces()
            .into_iter()
            .map(|iface| (pins.link(&iface), self.links.contains_key(&iface), iface))
            .chain(pins.egress_linked_interfaces().into_iter().map(|iface| {
                (
                    pins.egress_link(&iface),
                    self.egress.contains_key(&iface),
                    iface,
                )
            }));
        for (link, ours, iface) in pinned {
            if path == TcPath::Tcx && ours {
                continue;
            }
            unpin(&link).map_err(|e| KernelError::Pin {
                path: link.clone(),
                reason: e.to_string(),
            })?;
            if !removed.contains(&iface) {
                removed.push(iface);
            }
        }
        let present = crate::kernel::interfaces::list().unwrap_or_default();
        // Interfaces gone took their sysctls and qdiscs with them.
        super::record::NodeRecord::new(&pins.base).prune(&present);
        for (_, iface) in present {
            if path == TcPath::Netlink && self.links.contains_key(&iface) {
                continue;
            }
            if remove_filters(&iface) && !removed.contains(&iface) {
                removed.push(iface);
            }
        }
        Ok(removed)
    }
}

/// Puts the program into sliceway's TC filter on `iface`: replaces the program of
/// the filter an earlier run left (atomic), or creates the filter.
fn attach_filter(
    program: &mut SchedClassifier,
    iface: &str,
    hook: Hook,
) -> Result<Attached, aya::programs::ProgramError> {
    let existing = SchedClassifierLink::attached(
        iface,
        hook.tc(),
        TC_PRIORITY,
        TcHandle::from(TC_HANDLE),
        None,
    )
    .map_err(|e| aya::programs::ProgramError::from(tc::TcError::IoError(e)))?;
    // Without NLM_F_CREATE the kernel only changes a filter that exists (ENOENT
    // otherwise), so this never adds a second one.
    let (id, how) = match program.attach_to_link(existing) {
        Ok(id) => (id, Attached::ReplacedFilter),
        Err(_) => {
            let id = program.attach_with_options(
                iface,
                hook.tc(),
                TcAttachOptions::Netlink(NlOptions {
                    priority: TC_PRIORITY,
                    handle: TcHandle::from(TC_HANDLE),
                    classid: None,
                }),
            )?;
            (id, Attached::NewFilter)
        }
    };
    // The filter is to outlive this process, as a pinned link does: the link is
    // forgotten, not dropped (dropping it would delete the filter).
    std::mem::forget(program.take_link(id)?);
    Ok(how)
}

/// Deletes sliceway's TC filter at `hook` of `iface`.
fn delete_filter(iface: &str, hook: Hook) -> Result<(), aya::programs::ProgramError> {
    SchedClassifierLink::attached(
        iface,
        hook.tc(),
        TC_PRIORITY,
        TcHandle::from(TC_HANDLE),
        None,
    )
    .map_err(|e| aya::programs::ProgramError::from(tc::TcError::IoError(e)))?
    .detach()
}

/// Deletes every TC filter of sliceway's programs on `iface`, at ingress and egress
/// (any priority: an unpinned agent's filters too). Returns whether there was one.
pub(super) fn remove_filters(iface: &str) -> bool {
    let mut any = false;
    for name in TC_PROGRAMS {
        any |= tc::qdisc_detach_program(iface, TcAttachType::Ingress, name).is_ok();
    }
    for name in OUT_PROGRAMS {
        any |= tc::qdisc_detach_program(iface, TcAttachType::Egress, name).is_ok();
    }
    any
}

/// `ETHTOOL_GDRVINFO`'s answer (include/uapi/linux/ethtool.h `ethtool_drvinfo`).
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}
const _: () = assert!(std::mem::size_of::<DrvInfo>() == 196);
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;

/// An interface ioctl (`SIOC*`) for interface `name` on a new datagram socket, in the
/// calling thread's network namespace: `prepare` fills the request's union beyond the
/// name; the request as the kernel left it is returned.
fn ifreq_ioctl(
    name: &str,
    request: libc::c_ulong,
    prepare: impl FnOnce(&mut libc::ifreq),
) -> std::io::Result<libc::ifreq> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    // SAFETY: a plain socket call; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is new and nothing else owns it.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: an all-zero ifreq is valid; the name is copied in below (shorter than
    // IFNAMSIZ, so NUL-terminated).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    prepare(&mut req);
    // SAFETY: the request reads the name and writes the ifreq's union (or, for
    // SIOCETHTOOL, the buffer `prepare` pointed it at, which outlives this call).
    let ret = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            request,
            &mut req as *mut libc::ifreq,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(req)
}

/// The driver of interface `name` ("veth", "mlx5_core", ...), from
/// `ETHTOOL_GDRVINFO`, in the calling thread's network namespace.
pub(super) fn driver(name: &str) -> std::io::Result<String> {
    // SAFETY: all-zero bytes are a valid `DrvInfo` (integers and byte arrays).
    let mut info: DrvInfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    ifreq_ioctl(name, libc::SIOCETHTOOL, |req| {
        req.ifr_ifru.ifru_data = (&mut info as *mut DrvInfo).cast();
    })?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// `ARPHRD_ETHER`: an Ethernet header on every packet (veth, bridges, NICs).
const ARPHRD_ETHER: u16 = 1;
/// Link types whose packets reach TC ingress at their IP header
/// (include/uapi/linux/if_arp.h): `ARPHRD_NONE` (tun devices, WireGuard),
/// `ARPHRD_TUNNEL` (ipip), `ARPHRD_TUNNEL6` (ip6ip6), `ARPHRD_SIT`, `ARPHRD_IPGRE`,
/// `ARPHRD_RAWIP`, `ARPHRD_PPP`.
const L3_LINK_TYPES: [u16; 7] = [0xfffe, 768, 769, 776, 778, 519, 512];

/// The link-layer type of interface `name` (`ARPHRD_*`: 1 for Ethernet, 65534 for a
/// tun device or WireGuard, 768 for ipip), from `SIOCGIFHWADDR`.
fn link_type(name: &str) -> std::io::Result<u16> {
    let req = ifreq_ioctl(name, libc::SIOCGIFHWADDR, |_| {})?;
    // SAFETY: SIOCGIFHWADDR filled `ifru_hwaddr`.
    Ok(unsafe { req.ifr_ifru.ifru_hwaddr.sa_family })
}

/// The index of interface `name` in the calling thread's network namespace.
pub(super) fn ifindex(name: &str) -> std::io::Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: NUL-terminated string; the call reads nothing else.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(std::io::Error::last_os_error()),
        index => Ok(index),
    }
}

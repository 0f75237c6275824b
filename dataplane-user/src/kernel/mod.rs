//! The kernel edge: loads the embedded object (`load`), pins maps and links under
//! bpffs (`pin`), attaches the TC program to interfaces (`link`), exposes the maps to
//! the writer and the sweeper (`maps`), puts the XDP program on uplinks (`xdp`), and
//! runs packets through the programs with BPF_PROG_TEST_RUN (here, `xdp`), and reads
//! the kernel's run statistics of the loaded programs (`stats`). [`interfaces`] says
//! which interfaces the TC program goes on; [`packet`] crafts and checks the packets
//! that `trace` and the program tests run through the programs.

mod cleanup;
pub mod interfaces;
mod link;
mod load;
mod maps;
mod migrate;
pub mod netfilter;
mod netlink;
pub mod packet;
mod pin;
pub mod pod_links;
pub mod record;
pub mod requirements;
mod sock;
mod stats;
mod xdp;

use std::{collections::BTreeMap, path::PathBuf};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray},
    programs::{SchedClassifier, TestRun, TestRunOptions},
    Ebpf,
};
use dataplane_common::{CtEntry, CtKey, MAP_LAYOUT_VERSION};

use crate::writer::{Limits, Limits6};

pub use cleanup::{cleanup, cleanup_all, CleanupReport};
use link::InterfaceLink;
pub use link::{
    probe_tcx, AttachMode, Attached, Role, TcPath, TC_HANDLE, TC_PRIORITY, TC_PROGRAMS,
};
pub use load::{
    check, render_check, KernelCheck, ProgramCheck, DSR6_PROGRAM, DSR_PROGRAM, EXT6_PROGRAM,
    ICMP6_L3_PROGRAM, ICMP6_PROGRAM, L3_6_PROGRAM, L3_EXT6_PROGRAM, L3_EXT_PROGRAM, L3_PROGRAM,
    REJECT6_L3_PROGRAM, REJECT6_PROGRAM, REJECT_L3_PROGRAM, REJECT_PROGRAM, SCTP_NAT_PROGRAM,
    TC6_PROGRAM, TC_EXT_PROGRAM, TC_PROGRAM, XDP6_PROGRAM, XDP_PROGRAM,
};
pub(crate) use maps::summed;
pub use maps::KernelMaps;
pub use migrate::{plan_copy, CopyCounts, Migration, BRIDGE_PROGRAM, UNKNOWN_ID};
pub use pin::PinDir;
pub use sock::{netns_cookie, probe_set_retval, resolve_cgroup, SockAttached, SOCK_PROGRAMS};
pub use stats::{enable_run_stats, program_runs};
pub use xdp::{XdpAttached, XdpChoice, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX};

/// A one-to-one SCTP socket (IPv4), or why this kernel opens none
/// (`EPROTONOSUPPORT` where SCTP is not built or its module is missing).
pub fn sctp_socket() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain socket(2) call; the descriptor is owned from here on.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned by socket(2), owned by no one else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Whether this kernel opens SCTP sockets; the error says why not. The socket is
/// closed at once.
pub fn probe_sctp() -> std::io::Result<()> {
    sctp_socket().map(drop)
}

/// Errors of the kernel edge, each saying what failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("loading the kernel object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("the kernel object has no map {0}")]
    MissingMap(&'static str),
    #[error("the kernel object has no program {0}")]
    MissingProgram(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error("loading a program: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("attaching to interface {iface}: {source}")]
    Attach {
        iface: String,
        source: aya::programs::ProgramError,
    },
    #[error("interface {iface}: {source}")]
    Interface {
        iface: String,
        source: std::io::Error,
    },
    #[error("--attach tcx: this kernel has no tcx (Linux 6.6 or later has it): {reason}")]
    NoTcx { reason: String },
    #[error(
        "interface {iface} has link type {link_type}, neither Ethernet nor plain IP (a tun \
         device, ipip, GRE, WireGuard): not attached, so its packets are never misread"
    )]
    NotEthernet { iface: String, link_type: u16 },
    #[error("XDP on interface {iface} refused ({reason}); its TC program decides every packet")]
    Xdp { iface: String, reason: String },
    #[error("XDP forwarding from interface index {index}: {reason}")]
    XdpForward { index: u32, reason: String },
    #[error("socket programs on cgroup {cgroup}: {reason}")]
    Sock { cgroup: PathBuf, reason: String },
    #[error("pinning under {path}: {reason}")]
    Pin { path: PathBuf, reason: String },
    #[error(
        "the map pinned at {path} has key size {key} and value size {value}, but this agent's \
         layout v{MAP_LAYOUT_VERSION} needs {want_key} and {want_value}: it was written by an \
         incompatible build; run `sliceway-agent cleanup` (this drops conntrack) and start again"
    )]
    Layout {
        path: PathBuf,
        key: u32,
        value: u32,
        want_key: u32,
        want_value: u32,
    },
}

/// Map sizes chosen at load time.
#[derive(Clone, Copy, Debug)]
pub struct Capacities {
    pub limits: Limits,
    /// IPv6's frontend and backend maps (`SERVICES6`, `BACKENDS6`).
    pub limits6: Limits6,
    pub conntrack: u32,
    /// Whether the program counts per frontend and per backend (set at load time;
    /// off, the counting code is not in the verified program).
    pub flow_counters: bool,
    /// Whether the socket programs translate pods' TCP connects too
    /// (`--socket-lb-pods`; set at load time, like `flow_counters`).
    pub socket_lb_pods: bool,
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            limits6: Limits6::default(),
            conntrack: dataplane_common::capacity::CONNTRACK,
            flow_counters: true,
            socket_lb_pods: false,
        }
    }
}

/// A loaded datapath: programs and maps, private to this process.
pub struct Datapath {
    ebpf: Ebpf,
    pub maps: KernelMaps,
    conntrack: BpfHashMap<MapData, CtKey, CtEntry>,
    stats: PerCpuArray<MapData, u64>,
    /// Held for as long as the datapath lives: the kernel empties a program array no
    /// process or pin holds.
    jump: aya::maps::ProgramArray<MapData>,
    /// The IPv6 programs' table (`JUMP6`), held likewise.
    jump6: aya::maps::ProgramArray<MapData>,
    pins: Option<PinDir>,
    limits: Limits,
    limits6: Limits6,
    /// Interfaces the program is attached to by this agent.
    links: BTreeMap<String, InterfaceLink>,
    /// The egress program's links, likewise.
    egress: BTreeMap<String, InterfaceLink>,
    /// Uplinks with the XDP program, attached by this agent (not pinned).
    xdp_links: BTreeMap<String, (aya::programs::xdp::XdpLinkId, XdpAttached)>,
    /// Whether the XDP program forwards between the uplinks it is on
    /// (`--xdp-forward`): each gets its entry in `XDP_FORWARD` as it is attached.
    xdp_forward: bool,
    /// The uplinks in `XDP_FORWARD`, by name: their interface index.
    forwarding: BTreeMap<String, u32>,
    /// The attach path, chosen before the first attach.
    path: Option<TcPath>,
    /// A v1 layout beside this one, to migrate after the first sync.
    v1: Option<migrate::V1Layout>,
    /// Whether the service maps were pinned by an earlier run and adopted.
    adopted: bool,
    /// The network namespace the programs were loaded for (`HOST_NETNS`).
    netns_cookie: Option<u64>,
    /// The cgroup the socket programs were attached to, if they were.
    sock_cgroup: Option<std::path::PathBuf>,
}

impl Datapath {
    /// Whether the service maps were pinned by an earlier run and adopted (their
    /// contents kept), rather than made new.
    pub fn adopted_pins(&self) -> bool {
        self.adopted
    }
}

impl Datapath {
    /// Sets `net.ipv4.conf.<iface>.accept_local` ([`interfaces::accept_local`]) unless
    /// it is set; with pins, the value it had is recorded first, the first time only,
    /// so `cleanup --all` puts it back ([`record`]).
    pub fn accept_local(&self, iface: &str) -> std::io::Result<()> {
        let path = interfaces::sysctl_path(iface, "accept_local")?;
        let was = std::fs::read_to_string(&path)?;
        let was = was.trim();
        if was == "1" {
            return Ok(());
        }
        if let Some(pins) = &self.pins {
            record::record_change(
                pins,
                &record::Change::Sysctl {
                    iface: iface.to_string(),
                    ifindex: link::ifindex(iface)?,
                    name: "accept_local".into(),
                    value: was.to_string(),
                },
            );
        }
        interfaces::accept_local(iface)
    }
}

impl Datapath {
    /// Sets netfilter's conntrack as kube-proxy would on this node of `cpus` CPUs
    /// ([`netfilter`]); with pins, each value it replaces is recorded first, the first
    /// time only, so `cleanup --all` puts it back.
    pub fn set_netfilter_conntrack(
        &self,
        settings: &netfilter::Conntrack,
        cpus: u64,
    ) -> netfilter::Applied {
        let plan = netfilter::plan(settings, cpus, netfilter::read);
        netfilter::apply(&plan, |name, value| {
            if let Some(pins) = &self.pins {
                record::record_change(
                    pins,
                    &record::Change::Netfilter {
                        name: name.to_string(),
                        value,
                    },
                );
            }
        })
    }
}

impl Datapath {
    /// Capacities of the maps as loaded (an adopted pinned map keeps the capacity it
    /// was created with).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// IPv6's capacities, as loaded or adopted from pins.
    pub fn limits6(&self) -> Limits6 {
        self.limits6
    }

    fn program(&self, role: Role) -> &SchedClassifier {
        self.ebpf
            .program(role.program())
            .and_then(|p| <&SchedClassifier>::try_from(p).ok())
            .expect("loaded in Datapath::load")
    }

    /// Runs one packet (starting at the Ethernet header) through the TC program.
    /// Returns the TC verdict and the packet as the program left it.
    pub fn test_run(&self, packet: &[u8]) -> Result<TestRunOutput, KernelError> {
        self.test_run_as(Role::Pods, packet)
    }

    /// [`Datapath::test_run`] through the program of interfaces of `role` (the uplink
    /// program for `Role::External`).
    pub fn test_run_as(&self, role: Role, packet: &[u8]) -> Result<TestRunOutput, KernelError> {
        run_once(self.program(role), packet)
    }

    /// [`Datapath::test_run`] through the egress program of pods' interfaces and
    /// uplinks (`sliceway_tc_out`).
    pub fn test_run_egress(&self, packet: &[u8]) -> Result<TestRunOutput, KernelError> {
        let program: &SchedClassifier = self
            .ebpf
            .program(load::OUT_PROGRAM)
            .ok_or(KernelError::MissingProgram(load::OUT_PROGRAM))?
            .try_into()?;
        run_once(program, packet)
    }

    /// [`Datapath::test_run_as`] through the program of interfaces of `role` without
    /// an Ethernet header (`packet` starts at the IP header), loading those programs
    /// first as attaching to such an interface does.
    pub fn test_run_l3(&mut self, role: Role, packet: &[u8]) -> Result<TestRunOutput, KernelError> {
        self.load_l3()?;
        let name = role.program_for(true);
        let program: &SchedClassifier = self
            .ebpf
            .program(name)
            .ok_or(KernelError::MissingProgram(name))?
            .try_into()?;
        run_once(program, packet)
    }

    /// Runs one packet `repeat` times and returns the kernel-measured time per run.
    pub fn time_run(&self, packet: &[u8], repeat: u32) -> Result<std::time::Duration, KernelError> {
        self.time_run_as(Role::Pods, packet, repeat)
    }

    /// [`Datapath::time_run`] through the program of interfaces of `role`.
    pub fn time_run_as(
        &self,
        role: Role,
        packet: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, KernelError> {
        let mut out = vec![0u8; packet.len() + 256];
        let result = self.program(role).test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::new()
        })?;
        Ok(result.duration)
    }
}

/// Result of one BPF_PROG_TEST_RUN.
#[derive(Debug)]
pub struct TestRunOutput {
    pub verdict: i32,
    pub packet: Vec<u8>,
    pub duration: std::time::Duration,
}

/// TC verdicts as the program returns them.
pub const TC_ACT_OK: i32 = 0;
pub const TC_ACT_SHOT: i32 = 2;
/// The packet was redirected (a reply the program made, sent back where it came from).
pub const TC_ACT_REDIRECT: i32 = 7;

/// Runs `packet` once through a TC program with BPF_PROG_TEST_RUN: its verdict and
/// the packet as the program left it (room for 256 bytes more: a reject's answer).
fn run_once(program: &SchedClassifier, packet: &[u8]) -> Result<TestRunOutput, KernelError> {
    let mut out = vec![0u8; packet.len() + 256];
    let result = program.test_run(TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ..TestRunOptions::new()
    })?;
    out.truncate(result.data_size_out as usize);
    Ok(TestRunOutput {
        verdict: result.return_value as i32,
        packet: out,
        duration: result.duration,
    })
}

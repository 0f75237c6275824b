//! Loading: the embedded object with maps sized from the capacities (pinned maps of an
//! earlier run adopted), the TC program and the reject program it tail-calls.

use std::{collections::BTreeMap, path::PathBuf};

use aya::{
    maps::{MapData, MapError, MapInfo, ProgramArray},
    programs::{Program, ProgramError, ProgramFd, SchedClassifier},
    Ebpf, EbpfLoader,
};
use dataplane_common::{capacity6, map_name, MAP_LAYOUT_VERSION};

use super::{
    migrate::V1Layout,
    pin::{self, expected_sizes, prepare_bpffs},
    record::{self, record_change},
    Capacities, Datapath, KernelError, KernelMaps, PinDir,
};

/// The kernel object, built by `cargo xtask build-ebpf` (or this crate's build script).
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("SLICEWAY_EBPF_OBJECT"));

/// Name of the TC program in the object.
pub const TC_PROGRAM: &str = "sliceway_tc";
/// The TC program of the node's uplinks (`--external-interfaces`): clients outside
/// the node, masqueraded unless a frontend says `externalTrafficPolicy: Local`.
pub const TC_EXT_PROGRAM: &str = "sliceway_tc_ext";
/// `sliceway_tc` for interfaces without an Ethernet header (a tun device, ipip,
/// WireGuard): the same code, offsets from the IP header. Loaded when such an
/// interface is first attached.
pub const L3_PROGRAM: &str = "sliceway_l3";
/// `sliceway_tc_ext` for uplinks without an Ethernet header, loaded likewise.
pub const L3_EXT_PROGRAM: &str = "sliceway_l3_ext";
/// The reject program of interfaces without an Ethernet header (tail call).
pub const REJECT_L3_PROGRAM: &str = "sliceway_rej_l3";
/// The XDP program of the uplinks (`--xdp`): the uplink TC program's decisions,
/// before the skb is made; what it cannot finish it leaves to that program. Loaded
/// when first needed (`Datapath::load_xdp`).
pub const XDP_PROGRAM: &str = "sliceway_xdp";
/// The XDP program's IPv6 program (tail call, `XDP_JUMP6`): the uplink IPv6 program's
/// decisions, before the skb is made. Loaded with the XDP program; one the kernel
/// refuses leaves IPv6 to the uplink's TC program, as before.
pub const XDP6_PROGRAM: &str = "sliceway_xdp6";
/// The program the TC program hands packets to reject to (tail call).
pub const REJECT_PROGRAM: &str = "sliceway_reject";
/// The program the TC program hands SCTP packets to for their ports (tail call).
pub const SCTP_NAT_PROGRAM: &str = "sliceway_sctp_nat";
/// The uplink programs' direct server return (`--external-mode dsr`, tail call):
/// adds the option naming the frontend, or records the connection of a packet that
/// carries one.
pub const DSR_PROGRAM: &str = "sliceway_dsr";

/// The program at egress of pods' interfaces and uplinks: replies from backends in
/// the host network of this node, which leave the node's own stack and meet no
/// ingress program, get their frontend back; anything else passes.
pub const OUT_PROGRAM: &str = "sliceway_tc_out";
/// `sliceway_tc_out` for interfaces without an Ethernet header, loaded with the L3
/// programs.
pub const L3_OUT_PROGRAM: &str = "sliceway_l3_out";
/// Their IPv6 programs (`JUMP6_OUT`, `JUMP6_L3_OUT`).
pub const OUT6_PROGRAM: &str = "sliceway_out6";
pub const L3_OUT6_PROGRAM: &str = "sliceway_l3out6";

/// The IPv6 programs, reached by tail call (`JUMP6`) from the entry programs above
/// when a packet is IPv6: `sliceway_tc`'s, `sliceway_tc_ext`'s, their reject
/// program and their ICMPv6 error program. A kernel that refuses them refuses IPv6
/// only (it then passes untouched).
pub const TC6_PROGRAM: &str = "sliceway_tc6";
pub const EXT6_PROGRAM: &str = "sliceway_ext6";
pub const REJECT6_PROGRAM: &str = "sliceway_rej6";
pub const ICMP6_PROGRAM: &str = "sliceway_icmp6";
/// The IPv6 uplink programs' direct server return (tail call, `JUMP6_DSR`): adds the
/// destination options header naming the frontend, or records the connection of a
/// packet that carries one; for interfaces with and without an Ethernet header.
pub const DSR6_PROGRAM: &str = "sliceway_dsr6";
/// The IPv6 programs of interfaces without an Ethernet header, loaded with the L3
/// programs.
pub const L3_6_PROGRAM: &str = "sliceway_l3_6";
pub const L3_EXT6_PROGRAM: &str = "sliceway_l3ext6";
pub const REJECT6_L3_PROGRAM: &str = "sliceway_rej6_l3";
pub const ICMP6_L3_PROGRAM: &str = "sliceway_icmp6_l3";

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, KernelError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(KernelError::MissingMap(name))?;
    T::try_from(map).map_err(|source| KernelError::Map { name, source })
}

/// [`take`] of a map the object may lack (IPv6's, in an object built before them).
fn take_if_there<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<Option<T>, KernelError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    match ebpf.take_map(name) {
        None => Ok(None),
        Some(map) => T::try_from(map)
            .map(Some)
            .map_err(|source| KernelError::Map { name, source }),
    }
}

impl Datapath {
    /// Loads the object with maps of the given sizes and loads (not attaches) the TC
    /// program. With `pins`, maps are pinned there, and maps already pinned by an
    /// earlier run are adopted as they are (contents, conntrack and capacity).
    /// A v1 layout pinned beside this one is taken up for migration
    /// ([`Datapath::migrate_from_v1`]): its conntrack map becomes `CT_V1`.
    pub fn load(caps: &Capacities, pins: Option<&PinDir>) -> Result<Self, KernelError> {
        Self::load_with(caps, pins, &map_name::ALL, true)
    }

    /// Loads the programs over the service maps pinned by a running agent, with private
    /// conntrack and counters, for `trace` against live state. Nothing is attached.
    pub fn load_over_pinned_services(pins: &PinDir) -> Result<Self, KernelError> {
        for name in [
            map_name::SERVICES,
            map_name::SLOTS,
            map_name::BACKENDS,
            map_name::SERVICE_NAMES,
        ] {
            if !pins.map(name).exists() {
                return Err(KernelError::Pin {
                    path: pins.map(name),
                    reason: "no pinned map: is an agent running with this --bpffs-dir?".into(),
                });
            }
        }
        let caps = Capacities {
            conntrack: 1024,
            ..Capacities::default()
        };
        let mut pinned = vec![
            map_name::SERVICES,
            map_name::SLOTS,
            map_name::BACKENDS,
            map_name::SERVICE_NAMES,
            map_name::NAT_CONFIG,
            map_name::SOURCE_RANGES,
        ];
        // The ServiceCIDRs, where the running agent pinned them (an agent built
        // before them did not).
        pinned.extend(
            [map_name::SERVICE_CIDRS]
                .into_iter()
                .filter(|name| pins.map(name).exists()),
        );
        // IPv6's, where the running agent pinned them (never made here: a trace
        // leaves no pin behind).
        pinned.extend(
            [
                map_name::SERVICES6,
                map_name::BACKENDS6,
                map_name::NAT_CONFIG6,
                map_name::SOURCE_RANGES6,
                map_name::SERVICE_CIDRS6,
            ]
            .into_iter()
            .filter(|name| pins.map(name).exists()),
        );
        Self::load_with(&caps, Some(pins), &pinned, false)
    }

    fn load_with(
        caps: &Capacities,
        pins: Option<&PinDir>,
        pinned: &[&'static str],
        migrate: bool,
    ) -> Result<Self, KernelError> {
        raise_memlock();
        let mut limits = caps.limits;
        let mut limits6 = caps.limits6;
        let flow_counters = u8::from(caps.flow_counters);
        let netns_cookie = super::sock::netns_cookie();
        let host_netns = netns_cookie.unwrap_or(0);
        let pod_sockets = u8::from(caps.socket_lb_pods);
        let set_retval = u8::from(super::sock::probe_set_retval());
        let mut loader = EbpfLoader::new();
        loader
            .map_max_entries(map_name::SERVICES, caps.limits.services)
            // Frontend ids (and so names) come from one space for both families.
            .map_max_entries(
                map_name::SERVICE_NAMES,
                caps.limits.services.saturating_add(caps.limits6.services),
            )
            .map_max_entries(map_name::SLOTS, caps.limits.slots)
            .map_max_entries(map_name::BACKENDS, caps.limits.backends)
            .map_max_entries(map_name::CONNTRACK, caps.conntrack)
            .map_max_entries(map_name::SERVICES6, caps.limits6.services)
            .map_max_entries(map_name::BACKENDS6, caps.limits6.backends)
            .map_max_entries(map_name::FRAGMENTS6, capacity6::FRAGMENTS6)
            .map_max_entries(map_name::SOURCE_RANGES6, capacity6::SOURCE_RANGES6)
            .override_global("FLOW_COUNTERS", &flow_counters, true)
            .override_global("HOST_NETNS", &host_netns, true)
            .override_global("POD_SOCKETS", &pod_sockets, true)
            .override_global("SET_RETVAL", &set_retval, true);
        let pin_paths: Vec<(&str, PathBuf)> = pins
            .map(|p| pinned.iter().map(|n| (*n, p.map(n))).collect())
            .unwrap_or_default();
        let mut v1 = None;
        let mut adopted = false;
        if let Some(pins) = pins {
            if prepare_bpffs(&pins.dir())? {
                record_change(
                    pins,
                    &record::Change::Mount {
                        fstype: "bpf".into(),
                        path: pin::BPFFS_ROOT.into(),
                    },
                );
            }
            v1 = migrate.then(|| V1Layout::find(pins)).flatten();
            if let Some(v1) = &v1 {
                tracing::info!(
                    dir = %v1.dir.display(),
                    conntrack = v1.conntrack.is_some(),
                    "layout v1 is pinned here: migrating it after the first sync"
                );
                if let Some(ct) = &v1.conntrack {
                    loader.map_pin_path(map_name::CT_V1, ct.as_path());
                }
            }
            for old in pins.other_layouts() {
                if v1.as_ref().is_some_and(|v1| v1.dir == old) {
                    continue;
                }
                tracing::warn!(
                    path = %old.display(),
                    "maps of another layout version are pinned here; this agent uses v{MAP_LAYOUT_VERSION} \
                     and ignores them (remove them with `sliceway-agent cleanup` once no program uses them)"
                );
            }
            for (name, path) in &pin_paths {
                // Three maps grow with the program: the counters (a new exit
                // reason), the conntrack timeouts (a new state) and the tail-call
                // table (a new program). A pinned one of another size is replaced:
                // counts start again (a counter reset, as after a restart), timeouts
                // and programs are written at every start anyway; the old program
                // keeps its own.
                let grows = match *name {
                    map_name::STATS => Some(dataplane_common::stat::COUNT),
                    map_name::CT_TIMEOUTS => Some(dataplane_common::ct::state::COUNT),
                    map_name::JUMP => Some(dataplane_common::JUMP_SLOTS),
                    map_name::JUMP6 => Some(dataplane_common::JUMP6_SLOTS),
                    _ => None,
                };
                if let Some(now) = grows {
                    if let Ok(info) = MapInfo::from_pin(path) {
                        if info.max_entries() != now {
                            tracing::warn!(
                                map = name,
                                entries = info.max_entries(),
                                now,
                                "the pinned map was made for another number of entries; starting a new one"
                            );
                            let _ = std::fs::remove_file(path);
                        }
                    }
                }
                if let Ok(info) = MapInfo::from_pin(path) {
                    let (k, v) = expected_sizes(name);
                    if (info.key_size() as usize, info.value_size() as usize) != (k, v) {
                        return Err(KernelError::Layout {
                            path: path.clone(),
                            key: info.key_size(),
                            value: info.value_size(),
                            want_key: k as u32,
                            want_value: v as u32,
                        });
                    }
                    tracing::info!(
                        map = name,
                        entries = info.max_entries(),
                        "adopting pinned map"
                    );
                    // A pinned map keeps its size: the running programs use it, and
                    // a copy into a map of the new size would lose what they write
                    // meanwhile (conntrack). Said, with what to do, rather than
                    // silently taken.
                    let asked = match *name {
                        map_name::SERVICES => Some(("--max-services", caps.limits.services)),
                        map_name::SLOTS => Some(("--max-slots", caps.limits.slots)),
                        map_name::BACKENDS => Some(("--max-backends", caps.limits.backends)),
                        map_name::CONNTRACK => Some(("--max-conntrack", caps.conntrack)),
                        map_name::SERVICES6 => Some(("--max-services6", caps.limits6.services)),
                        map_name::BACKENDS6 => Some(("--max-backends6", caps.limits6.backends)),
                        _ => None,
                    };
                    if let Some((flag, asked)) = asked.filter(|(_, a)| *a != info.max_entries()) {
                        tracing::warn!(
                            map = name,
                            pinned = info.max_entries(),
                            asked,
                            "{flag} asks for {asked} entries but the pinned map has {}: it keeps \
                             them; to resize it, run `sliceway-agent cleanup` (this drops \
                             conntrack) and start the agent again",
                            info.max_entries()
                        );
                    }
                    adopted |= *name == map_name::SERVICES;
                    match *name {
                        map_name::SERVICES => limits.services = info.max_entries(),
                        map_name::SLOTS => limits.slots = info.max_entries(),
                        map_name::BACKENDS => limits.backends = info.max_entries(),
                        map_name::SERVICES6 => limits6.services = info.max_entries(),
                        map_name::BACKENDS6 => limits6.backends = info.max_entries(),
                        _ => {}
                    }
                }
                loader.map_pin_path(name, path.as_path());
            }
        }
        let mut ebpf = loader.load(OBJECT)?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(TC_PROGRAM)
            .ok_or(KernelError::MissingProgram(TC_PROGRAM))?
            .try_into()?;
        program.load()?;
        let ext: &mut SchedClassifier = ebpf
            .program_mut(TC_EXT_PROGRAM)
            .ok_or(KernelError::MissingProgram(TC_EXT_PROGRAM))?
            .try_into()?;
        ext.load()?;
        let out: &mut SchedClassifier = ebpf
            .program_mut(OUT_PROGRAM)
            .ok_or(KernelError::MissingProgram(OUT_PROGRAM))?
            .try_into()?;
        out.load()?;
        // The programs reached from the TC program by tail call (a stack of their
        // own), loaded and put in their slots of JUMP: reject in 0, SCTP ports in 1,
        // direct server return in 3 (reject without an Ethernet header goes in 2
        // with the L3 programs, `Datapath::load_l3`).
        let mut jump: ProgramArray<MapData> = take(&mut ebpf, map_name::JUMP)?;
        for (slot, name) in [
            (0, REJECT_PROGRAM),
            (1, SCTP_NAT_PROGRAM),
            (dataplane_common::JUMP_DSR, DSR_PROGRAM),
        ] {
            let fd = loaded_fd(&mut ebpf, name, load_classifier)?;
            set_slot(&mut jump, map_name::JUMP, slot, &fd)?;
        }
        let maps = KernelMaps {
            services: take(&mut ebpf, map_name::SERVICES)?,
            slots: take(&mut ebpf, map_name::SLOTS)?,
            backends: take(&mut ebpf, map_name::BACKENDS)?,
            names: take(&mut ebpf, map_name::SERVICE_NAMES)?,
            frontend_counters: take(&mut ebpf, map_name::FRONTEND_COUNTERS)?,
            backend_counters: take(&mut ebpf, map_name::BACKEND_COUNTERS)?,
            source_ranges: take(&mut ebpf, map_name::SOURCE_RANGES)?,
            service_cidrs: take(&mut ebpf, map_name::SERVICE_CIDRS)?,
            // Both or neither: an object with IPv6's maps has them all.
            v6: match (
                take_if_there(&mut ebpf, map_name::SERVICES6)?,
                take_if_there(&mut ebpf, map_name::BACKENDS6)?,
                take_if_there(&mut ebpf, map_name::SOURCE_RANGES6)?,
                take_if_there(&mut ebpf, map_name::SERVICE_CIDRS6)?,
            ) {
                (Some(services), Some(backends), Some(source_ranges), Some(service_cidrs)) => {
                    Some(super::maps::KernelMaps6 {
                        services,
                        backends,
                        source_ranges,
                        service_cidrs,
                    })
                }
                _ => None,
            },
        };
        let conntrack = take(&mut ebpf, map_name::CONNTRACK)?;
        let stats = take(&mut ebpf, map_name::STATS)?;
        let jump6 = take(&mut ebpf, map_name::JUMP6)?;
        let mut datapath = Self {
            ebpf,
            maps,
            conntrack,
            stats,
            jump,
            jump6,
            pins: pins.cloned(),
            limits,
            limits6,
            links: BTreeMap::new(),
            egress: BTreeMap::new(),
            xdp_links: BTreeMap::new(),
            xdp_forward: false,
            forwarding: BTreeMap::new(),
            path: None,
            v1,
            adopted,
            netns_cookie,
            sock_cgroup: None,
        };
        datapath.load_v6(&[
            (dataplane_common::JUMP6_TC, TC6_PROGRAM),
            (dataplane_common::JUMP6_EXT, EXT6_PROGRAM),
            (dataplane_common::JUMP6_REJECT, REJECT6_PROGRAM),
            (dataplane_common::JUMP6_ICMP, ICMP6_PROGRAM),
            (dataplane_common::JUMP6_DSR, DSR6_PROGRAM),
            (dataplane_common::JUMP6_OUT, OUT6_PROGRAM),
        ]);
        Ok(datapath)
    }
}

impl Datapath {
    /// Loads the programs of interfaces without an Ethernet header, the first time
    /// one is attached: `sliceway_l3`, `sliceway_l3_ext` and their reject program
    /// (`JUMP` slot 2). A kernel that refuses them refuses such interfaces only.
    pub(super) fn load_l3(&mut self) -> Result<(), KernelError> {
        self.load_v6(&[
            (dataplane_common::JUMP6_L3, L3_6_PROGRAM),
            (dataplane_common::JUMP6_L3_EXT, L3_EXT6_PROGRAM),
            (dataplane_common::JUMP6_REJECT_L3, REJECT6_L3_PROGRAM),
            (dataplane_common::JUMP6_ICMP_L3, ICMP6_L3_PROGRAM),
            (dataplane_common::JUMP6_L3_OUT, L3_OUT6_PROGRAM),
        ]);
        for name in [
            L3_PROGRAM,
            L3_EXT_PROGRAM,
            REJECT_L3_PROGRAM,
            L3_OUT_PROGRAM,
        ] {
            let fd = loaded_fd(&mut self.ebpf, name, load_classifier)?;
            if name == REJECT_L3_PROGRAM {
                set_slot(
                    &mut self.jump,
                    map_name::JUMP,
                    dataplane_common::JUMP_REJECT_L3,
                    &fd,
                )?;
            }
        }
        Ok(())
    }
}

/// Program `name` of `ebpf`, loaded with `load` (its type's: aya has no load common
/// to every type) unless it already is, and a copy of its fd for a program array.
pub(super) fn loaded_fd(
    ebpf: &mut Ebpf,
    name: &'static str,
    load: fn(&mut Program) -> Result<(), ProgramError>,
) -> Result<ProgramFd, KernelError> {
    let p = ebpf
        .program_mut(name)
        .ok_or(KernelError::MissingProgram(name))?;
    if p.fd().is_err() {
        load(p)?;
    }
    p.fd()?
        .try_clone()
        .map_err(|e| KernelError::Program(ProgramError::IOError(e)))
}

/// Loads a TC program ([`loaded_fd`]'s `load`).
pub(super) fn load_classifier(p: &mut Program) -> Result<(), ProgramError> {
    <&mut SchedClassifier>::try_from(p)?.load()
}

/// Puts `fd` in `slot` of program array `array` (map `name`).
pub(super) fn set_slot<T: std::borrow::BorrowMut<MapData>>(
    array: &mut ProgramArray<T>,
    name: &'static str,
    slot: u32,
    fd: &ProgramFd,
) -> Result<(), KernelError> {
    array
        .set(slot, fd, 0)
        .map_err(|source| KernelError::Map { name, source })
}

impl Datapath {
    /// Loads IPv6 programs and puts each in its `JUMP6` slot. One the kernel refuses
    /// is logged and left out: its slot stays empty, so IPv6 passes untouched
    /// (counted `pass_not_ipv4`) and IPv4 is served as before.
    fn load_v6(&mut self, programs: &[(u32, &'static str)]) {
        for &(slot, name) in programs {
            if let Err(e) = self.load_into_jump6(slot, name) {
                tracing::warn!(
                    program = name,
                    error = %e,
                    "the kernel refused an IPv6 program: IPv6 passes untouched"
                );
            }
        }
    }

    fn load_into_jump6(&mut self, slot: u32, name: &'static str) -> Result<(), KernelError> {
        let fd = loaded_fd(&mut self.ebpf, name, load_classifier)?;
        set_slot(&mut self.jump6, map_name::JUMP6, slot, &fd)
    }

    /// A map of the loaded object by name, found through the maps the pods' and
    /// uplinks' programs of both families use (so also one another part of the agent
    /// holds): for tests and tools that read or empty maps the agent does not hand
    /// out.
    pub fn loaded_map(&self, name: &str) -> Result<MapData, KernelError> {
        let missing = || KernelError::Pin {
            path: PathBuf::from(name),
            reason: "no such map in the loaded programs (are they loaded?)".into(),
        };
        for program in [TC_PROGRAM, TC_EXT_PROGRAM, TC6_PROGRAM, EXT6_PROGRAM] {
            let p: &SchedClassifier = self
                .ebpf
                .program(program)
                .ok_or(KernelError::MissingProgram(program))?
                .try_into()?;
            let ids = p.info()?.map_ids()?.unwrap_or_default();
            for id in ids {
                let Ok(info) = MapInfo::from_id(id) else {
                    continue;
                };
                if info.name_as_str() == Some(name) {
                    return MapData::from_id(id).map_err(|source| KernelError::Pin {
                        path: PathBuf::from(name),
                        reason: format!("opening it by id {id}: {source}"),
                    });
                }
            }
        }
        Err(missing())
    }
}

/// BPF memory is charged to the memory cgroup on current kernels; older ones count it
/// against RLIMIT_MEMLOCK. Raising the limit may be refused: that is not fatal.
pub(super) fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
    if ret != 0 {
        tracing::debug!(
            "could not raise RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// One program as the running kernel took it (`sliceway-agent check`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ProgramCheck {
    pub name: String,
    /// Instructions after the kernel's rewrites (`xlated`, as `bpftool prog show`
    /// counts them).
    pub xlated_insns: Option<u32>,
    /// Instructions the verifier processed: its measure of complexity (the limit is
    /// 1,000,000); Linux 5.16 and later report it.
    pub verified_insns: Option<u32>,
    /// Why the kernel refused the program, with the verifier's log.
    pub error: Option<String>,
}

/// What the running kernel makes of the datapath (`sliceway-agent check`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct KernelCheck {
    /// `uname -r`.
    pub kernel: String,
    /// Whether the kernel has tcx (else the agent attaches with a TC filter).
    pub tcx: bool,
    /// Whether the socket programs can set a refused call's error (ECONNREFUSED;
    /// else the kernel's EPERM), [`super::probe_set_retval`].
    #[serde(default)]
    pub socket_errors: bool,
    pub programs: Vec<ProgramCheck>,
    /// What `run` probes before loading, with every optional piece asked for
    /// (pins at the default --bpffs-dir, XDP, the socket programs on `auto`).
    #[serde(default)]
    pub requirements: Vec<super::requirements::Requirement>,
}

impl KernelCheck {
    /// Whether every program loaded and no required piece is missing.
    pub fn ok(&self) -> bool {
        self.programs.iter().all(|p| p.error.is_none())
            && super::requirements::missing(&self.requirements)
                .next()
                .is_none()
    }
}

/// Loads every program of the object into the running kernel (small private maps,
/// nothing pinned or attached) and reports each one's size and verifier cost, or the
/// verifier's log for one that is refused; the others are still tried.
pub fn check() -> Result<KernelCheck, KernelError> {
    raise_memlock();
    let needs = super::requirements::Needs {
        pins: Some(std::path::PathBuf::from(crate::cmd::cli::DEFAULT_BPFFS_DIR)),
        attach: super::AttachMode::Auto,
        xdp: super::XdpChoice::Auto,
        socket_lb: Some(std::path::PathBuf::from("auto")),
    };
    let requirements = super::requirements::assess(&needs, &super::requirements::probe(&needs));
    // The socket programs do nothing outside the agent's namespace (a zero cookie
    // verifies as nothing at all): checked as they run, with this namespace's.
    let host_netns = super::sock::netns_cookie().unwrap_or(1);
    // Pods' sockets too, so the check verifies the most code; the error a refusal
    // sets, as this kernel allows.
    let pod_sockets = 1u8;
    let set_retval = u8::from(super::sock::probe_set_retval());
    let mut ebpf = EbpfLoader::new()
        .override_global("HOST_NETNS", &host_netns, true)
        .override_global("POD_SOCKETS", &pod_sockets, true)
        .override_global("SET_RETVAL", &set_retval, true)
        .map_max_entries(map_name::SERVICES, 16)
        .map_max_entries(map_name::SERVICE_NAMES, 16)
        .map_max_entries(map_name::SLOTS, 16)
        .map_max_entries(map_name::BACKENDS, 16)
        .map_max_entries(map_name::CONNTRACK, 16)
        .map_max_entries(map_name::SERVICES6, 16)
        .map_max_entries(map_name::BACKENDS6, 16)
        .map_max_entries(map_name::FRAGMENTS6, 16)
        .map_max_entries(map_name::SOURCE_RANGES6, 16)
        .map_max_entries(map_name::SOCK_REVNAT6, 16)
        .load(OBJECT)?;
    let mut programs = Vec::new();
    // The bridge is loaded only while migrating from layout v1; checked all the same,
    // so a kernel that refuses it is known before an upgrade needs it. Then XDP, then
    // the socket programs.
    #[derive(Clone, Copy)]
    enum Kind {
        Tc,
        Xdp,
        Sock,
    }
    let tc = [
        TC_PROGRAM,
        TC_EXT_PROGRAM,
        REJECT_PROGRAM,
        SCTP_NAT_PROGRAM,
        DSR_PROGRAM,
        L3_PROGRAM,
        L3_EXT_PROGRAM,
        REJECT_L3_PROGRAM,
        super::BRIDGE_PROGRAM,
        TC6_PROGRAM,
        EXT6_PROGRAM,
        REJECT6_PROGRAM,
        ICMP6_PROGRAM,
        DSR6_PROGRAM,
        L3_6_PROGRAM,
        L3_EXT6_PROGRAM,
        REJECT6_L3_PROGRAM,
        ICMP6_L3_PROGRAM,
        OUT_PROGRAM,
        L3_OUT_PROGRAM,
        OUT6_PROGRAM,
        L3_OUT6_PROGRAM,
    ];
    let sock = super::SOCK_PROGRAMS.map(|(name, _)| name);
    for (name, kind) in tc
        .map(|n| (n, Kind::Tc))
        .into_iter()
        .chain([(XDP_PROGRAM, Kind::Xdp), (XDP6_PROGRAM, Kind::Xdp)])
        .chain(sock.map(|n| (n, Kind::Sock)))
    {
        let program = ebpf
            .program_mut(name)
            .ok_or(KernelError::MissingProgram(name))?;
        let loaded = match kind {
            Kind::Sock => {
                let p: &mut aya::programs::CgroupSockAddr = program.try_into()?;
                p.load().and_then(|()| p.info())
            }
            Kind::Xdp => {
                let p: &mut aya::programs::Xdp = program.try_into()?;
                p.load().and_then(|()| p.info())
            }
            Kind::Tc => {
                let p: &mut SchedClassifier = program.try_into()?;
                p.load().and_then(|()| p.info())
            }
        };
        let mut check = ProgramCheck {
            name: name.to_string(),
            xlated_insns: None,
            verified_insns: None,
            error: None,
        };
        match loaded {
            Ok(info) => {
                // One instruction is 8 bytes.
                check.xlated_insns = info.size_translated().map(|b| b / 8);
                check.verified_insns = info.verified_instruction_count();
            }
            Err(e) => check.error = Some(e.to_string()),
        }
        programs.push(check);
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    Ok(KernelCheck {
        kernel,
        tcx: super::probe_tcx().is_ok(),
        socket_errors: set_retval != 0,
        programs,
        requirements,
    })
}

/// `check`'s report as a table.
pub fn render_check(c: &KernelCheck) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "kernel {}: attach with {}; refused node sockets get {}\n{:<22} {:>8} {:>10}  status\n",
        c.kernel,
        if c.tcx { "tcx" } else { "a TC filter (no tcx)" },
        if c.socket_errors {
            "ECONNREFUSED"
        } else {
            "EPERM (no bpf_set_retval for socket programs)"
        },
        "program",
        "xlated",
        "verified"
    );
    let n = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    for p in &c.programs {
        let _ = writeln!(
            out,
            "{:<22} {:>8} {:>10}  {}",
            p.name,
            n(p.xlated_insns),
            n(p.verified_insns),
            if p.error.is_some() {
                "REFUSED"
            } else {
                "loaded"
            }
        );
    }
    for p in &c.programs {
        if let Some(e) = &p.error {
            let _ = writeln!(out, "\n{} was refused: {e}", p.name);
        }
    }
    if !c.requirements.is_empty() {
        let _ = write!(
            out,
            "\n{:<48} status\n{}",
            "requirement",
            super::requirements::render(&c.requirements)
        );
    }
    out
}

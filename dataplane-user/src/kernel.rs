//! The kernel edge: loads the embedded object, sizes and exposes its maps, attaches
//! the TC program, and runs packets through it with BPF_PROG_TEST_RUN.

use std::{
    collections::BTreeMap,
    mem::size_of,
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError, MapInfo, PerCpuArray},
    programs::{
        links::{FdLink, PinnedLink},
        tc::{self, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions},
        LinkOrder, SchedClassifier, TcAttachType, TestRun, TestRunOptions,
    },
    util::KernelVersion,
    Ebpf, EbpfLoader,
};
use dataplane_common::{
    map_name, stat, Backend, CtEntry, CtKey, ServiceKey, ServiceName, ServiceValue, SlotKey,
    MAP_LAYOUT_VERSION,
};

use crate::writer::{KernelState, Limits, MapOps};

/// The kernel object, built by `cargo xtask build-ebpf` (or this crate's build script).
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("SLICEWAY_EBPF_OBJECT"));

/// Name of the TC program in the object.
pub const TC_PROGRAM: &str = "sliceway_tc";
/// The program the TC program hands packets to reject to (tail call).
pub const REJECT_PROGRAM: &str = "sliceway_reject";
/// The program the TC program hands SCTP packets to for their ports (tail call).
pub const SCTP_NAT_PROGRAM: &str = "sliceway_sctp_nat";

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
    pub conntrack: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            conntrack: dataplane_common::capacity::CONNTRACK,
        }
    }
}

/// The service maps, as the writer sees them.
pub struct KernelMaps {
    services: BpfHashMap<MapData, ServiceKey, ServiceValue>,
    slots: BpfHashMap<MapData, SlotKey, u32>,
    backends: BpfHashMap<MapData, u32, Backend>,
    names: BpfHashMap<MapData, u32, ServiceName>,
}

impl KernelMaps {
    /// Reads the maps back, for a restarted agent's writer and for `list`.
    pub fn state(&self) -> KernelState {
        KernelState {
            services: self.services.iter().filter_map(Result::ok).collect(),
            slots: self.slots.iter().filter_map(Result::ok).collect(),
            backends: self.backends.iter().filter_map(Result::ok).collect(),
            names: self
                .names
                .iter()
                .filter_map(Result::ok)
                .map(|(id, n)| (id, n.as_str().to_string()))
                .collect(),
        }
    }
}

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
        self.base.join(format!("v{MAP_LAYOUT_VERSION}"))
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir().join(name)
    }
    pub fn link(&self, iface: &str) -> PathBuf {
        self.dir().join(format!("{LINK_PREFIX}{iface}"))
    }
    /// Interfaces that have a pinned link in this layout directory.
    pub fn linked_interfaces(&self) -> Vec<String> {
        std::fs::read_dir(self.dir())
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(LINK_PREFIX))
                    .map(str::to_string)
            })
            .collect()
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
const LINK_PREFIX: &str = "link-";

/// Key and value sizes of each map, to check pinned maps against.
fn expected_sizes(name: &str) -> (usize, usize) {
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
        map_name::JUMP => (size_of::<u32>(), size_of::<u32>()),
        map_name::AFFINITY => (
            size_of::<dataplane_common::AffinityKey>(),
            size_of::<dataplane_common::AffinityValue>(),
        ),
        _ => (0, 0),
    }
}

/// Makes sure a bpffs is mounted at `dir`'s mount point (`/sys/fs/bpf` is not mounted
/// on every host) and that `dir` exists.
fn prepare_bpffs(dir: &Path) -> Result<(), KernelError> {
    let pin_err = |reason: String| KernelError::Pin {
        path: dir.to_path_buf(),
        reason,
    };
    let root = Path::new("/sys/fs/bpf");
    if dir.starts_with(root) && !is_bpffs(root) {
        let src = c"bpf";
        let target = c"/sys/fs/bpf";
        // SAFETY: valid NUL-terminated strings; mounting bpffs has no other inputs.
        let ret = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                src.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if ret != 0 {
            return Err(pin_err(format!(
                "mounting bpffs at /sys/fs/bpf: {}",
                std::io::Error::last_os_error()
            )));
        }
        tracing::info!("mounted bpffs at /sys/fs/bpf");
    }
    std::fs::create_dir_all(dir).map_err(|e| pin_err(e.to_string()))
}

fn is_bpffs(path: &Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
}

/// Removes every pinned map and link under `base`: programs detach, maps and
/// conntrack go away. For uninstalling, or after a layout change.
pub fn cleanup(base: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(base) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
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
    _jump: aya::maps::ProgramArray<MapData>,
    pins: Option<PinDir>,
    limits: Limits,
    /// Interfaces the program is attached to by this agent.
    links: BTreeMap<String, InterfaceLink>,
}

/// This agent's attachment to one interface.
#[derive(Debug)]
struct InterfaceLink {
    /// The interface's index when it was attached: a different index under the same
    /// name is another interface.
    ifindex: u32,
    /// A link owned by the program (unpinned); a pinned link is held by its pin file.
    owned: Option<SchedClassifierLinkId>,
    pin: Option<PathBuf>,
}

/// How `attach` attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// A new link, pinned: it outlives the agent.
    NewPinned,
    /// A pinned link of an earlier run now runs this agent's program (atomic swap, no
    /// packet sees no program).
    Replaced,
    /// Attached for the life of this process only (no pinning, or no tcx).
    Unpinned,
}

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, KernelError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(KernelError::MissingMap(name))?;
    T::try_from(map).map_err(|source| KernelError::Map { name, source })
}

impl Datapath {
    /// Loads the object with maps of the given sizes and loads (not attaches) the TC
    /// program. With `pins`, maps are pinned there, and maps already pinned by an
    /// earlier run are adopted as they are (contents, conntrack and capacity).
    pub fn load(caps: &Capacities, pins: Option<&PinDir>) -> Result<Self, KernelError> {
        Self::load_with(caps, pins, &map_name::ALL)
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
        Self::load_with(
            &caps,
            Some(pins),
            &[
                map_name::SERVICES,
                map_name::SLOTS,
                map_name::BACKENDS,
                map_name::SERVICE_NAMES,
            ],
        )
    }

    fn load_with(
        caps: &Capacities,
        pins: Option<&PinDir>,
        pinned: &[&'static str],
    ) -> Result<Self, KernelError> {
        raise_memlock();
        let mut limits = caps.limits;
        let mut loader = EbpfLoader::new();
        loader
            .map_max_entries(map_name::SERVICES, caps.limits.services)
            .map_max_entries(map_name::SERVICE_NAMES, caps.limits.services)
            .map_max_entries(map_name::SLOTS, caps.limits.slots)
            .map_max_entries(map_name::BACKENDS, caps.limits.backends)
            .map_max_entries(map_name::CONNTRACK, caps.conntrack);
        let pin_paths: Vec<(&str, PathBuf)> = pins
            .map(|p| pinned.iter().map(|n| (*n, p.map(n))).collect())
            .unwrap_or_default();
        if let Some(pins) = pins {
            prepare_bpffs(&pins.dir())?;
            for old in pins.other_layouts() {
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
                    match *name {
                        map_name::SERVICES => limits.services = info.max_entries(),
                        map_name::SLOTS => limits.slots = info.max_entries(),
                        map_name::BACKENDS => limits.backends = info.max_entries(),
                        _ => {}
                    }
                }
                loader.map_pin_path(name, path.as_path());
            }
        }
        let mut ebpf = loader.load(OBJECT)?;
        // Kernel-side logging exists only in a debug build of the object.
        if let Err(e) = aya_log::EbpfLogger::init(&mut ebpf) {
            tracing::debug!("no kernel-side logging: {e}");
        }
        let program: &mut SchedClassifier = ebpf
            .program_mut(TC_PROGRAM)
            .ok_or(KernelError::MissingProgram(TC_PROGRAM))?
            .try_into()?;
        program.load()?;
        // The programs reached from the TC program by tail call (a stack of their
        // own), loaded and put in their slots of JUMP: reject in 0, SCTP ports in 1.
        let mut fds = Vec::new();
        for name in [REJECT_PROGRAM, SCTP_NAT_PROGRAM] {
            let p: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(KernelError::MissingProgram(name))?
                .try_into()?;
            p.load()?;
            fds.push(
                p.fd()?
                    .try_clone()
                    .map_err(|e| KernelError::Program(aya::programs::ProgramError::IOError(e)))?,
            );
        }
        let mut jump: aya::maps::ProgramArray<MapData> = take(&mut ebpf, map_name::JUMP)?;
        for (slot, fd) in fds.iter().enumerate() {
            jump.set(slot as u32, fd, 0)
                .map_err(|source| KernelError::Map {
                    name: map_name::JUMP,
                    source,
                })?;
        }
        let maps = KernelMaps {
            services: take(&mut ebpf, map_name::SERVICES)?,
            slots: take(&mut ebpf, map_name::SLOTS)?,
            backends: take(&mut ebpf, map_name::BACKENDS)?,
            names: take(&mut ebpf, map_name::SERVICE_NAMES)?,
        };
        let conntrack = take(&mut ebpf, map_name::CONNTRACK)?;
        let stats = take(&mut ebpf, map_name::STATS)?;
        Ok(Self {
            ebpf,
            maps,
            conntrack,
            stats,
            _jump: jump,
            pins: pins.cloned(),
            limits,
            links: BTreeMap::new(),
        })
    }

    /// Capacities of the maps as loaded (an adopted pinned map keeps the capacity it
    /// was created with).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn program(&self) -> &SchedClassifier {
        self.ebpf
            .program(TC_PROGRAM)
            .and_then(|p| <&SchedClassifier>::try_from(p).ok())
            .expect("loaded in Datapath::load")
    }

    /// Attaches the TC program at ingress of `iface`: tcx on kernels that have it
    /// (6.6+), clsact otherwise. With pinning and tcx the link is pinned and outlives
    /// the agent; a link pinned by an earlier run is taken over atomically. A pinned
    /// link left from an interface that was deleted and re-created under the same name
    /// is defunct (the kernel refuses to update it): it is replaced by a new link.
    pub fn attach(&mut self, iface: &str) -> Result<Attached, KernelError> {
        let attach_err = |source| KernelError::Attach {
            iface: iface.to_string(),
            source,
        };
        let ifindex = ifindex(iface).map_err(|source| KernelError::Interface {
            iface: iface.to_string(),
            source,
        })?;
        let tcx = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0));
        let link_pin = self.pins.as_ref().filter(|_| tcx).map(|p| p.link(iface));
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(TC_PROGRAM)
            .ok_or(KernelError::MissingProgram(TC_PROGRAM))?
            .try_into()?;
        let Some(link_pin) = link_pin else {
            // Needed for the netlink attach before 6.6 (EEXIST when already there).
            let _ = tc::qdisc_add_clsact(iface);
            let id = program
                .attach(iface, TcAttachType::Ingress)
                .map_err(attach_err)?;
            self.links.insert(
                iface.to_string(),
                InterfaceLink {
                    ifindex,
                    owned: Some(id),
                    pin: None,
                },
            );
            return Ok(Attached::Unpinned);
        };
        let pin_err = |reason: String| KernelError::Pin {
            path: link_pin.clone(),
            reason,
        };
        let mut how = Attached::NewPinned;
        if let Ok(old) = PinnedLink::from_pin(&link_pin) {
            let link = SchedClassifierLink::try_from(FdLink::from(old))
                .map_err(|e| pin_err(format!("taking over the pinned link: {e}")))?;
            match program.attach_to_link(link) {
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
                    TcAttachType::Ingress,
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .map_err(attach_err)?;
            let link = program.take_link(id).map_err(attach_err)?;
            let fd_link = FdLink::try_from(link).map_err(|e| pin_err(e.to_string()))?;
            fd_link.pin(&link_pin).map_err(|e| pin_err(e.to_string()))?;
        }
        self.links.insert(
            iface.to_string(),
            InterfaceLink {
                ifindex,
                owned: None,
                pin: Some(link_pin),
            },
        );
        Ok(how)
    }

    /// Drops this agent's link on `iface` (for an interface that is gone or was
    /// re-created): a pinned link is unpinned, an owned one closed. Nothing happens to
    /// other interfaces. Returns whether there was a link.
    pub fn detach(&mut self, iface: &str) -> Result<bool, KernelError> {
        let Some(link) = self.links.remove(iface) else {
            return Ok(false);
        };
        if let Some(id) = link.owned {
            let program: &mut SchedClassifier = self
                .ebpf
                .program_mut(TC_PROGRAM)
                .ok_or(KernelError::MissingProgram(TC_PROGRAM))?
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
        Ok(true)
    }

    /// Interfaces this agent attached to, with their index at attach time.
    pub fn attached(&self) -> BTreeMap<String, u32> {
        self.links
            .iter()
            .map(|(name, link)| (name.clone(), link.ifindex))
            .collect()
    }

    /// Removes pinned links of interfaces this agent has not attached to: left by an
    /// earlier run for interfaces deleted since, or no longer selected. Their
    /// programs detach. Returns the interfaces whose links were removed.
    pub fn unpin_other_links(&self) -> Result<Vec<String>, KernelError> {
        let Some(pins) = &self.pins else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        for iface in pins.linked_interfaces() {
            if self.links.contains_key(&iface) {
                continue;
            }
            let path = pins.link(&iface);
            unpin(&path).map_err(|e| KernelError::Pin {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            removed.push(iface);
        }
        Ok(removed)
    }

    /// Runs one packet (starting at the Ethernet header) through the TC program.
    /// Returns the TC verdict and the packet as the program left it.
    pub fn test_run(&self, packet: &[u8]) -> Result<TestRunOutput, KernelError> {
        let mut out = vec![0u8; packet.len() + 256];
        let result = self.program().test_run(TestRunOptions {
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

    /// Runs one packet `repeat` times and returns the kernel-measured time per run.
    pub fn time_run(&self, packet: &[u8], repeat: u32) -> Result<std::time::Duration, KernelError> {
        let mut out = vec![0u8; packet.len() + 256];
        let result = self.program().test_run(TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::new()
        })?;
        Ok(result.duration)
    }

    /// Exit counters summed over CPUs, indexed by `stat::*`.
    pub fn stats(&self) -> Result<[u64; stat::COUNT as usize], KernelError> {
        let mut out = [0u64; stat::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            let values = self
                .stats
                .get(&(i as u32), 0)
                .map_err(|source| KernelError::Map {
                    name: map_name::STATS,
                    source,
                })?;
            *slot = values.iter().sum();
        }
        Ok(out)
    }

    /// Conntrack entries (forward and reverse).
    pub fn conntrack(&self) -> Vec<(CtKey, CtEntry)> {
        self.conntrack.iter().filter_map(Result::ok).collect()
    }

    /// The conntrack map, for the sweeper (`crate::conntrack`).
    pub fn conntrack_map(&mut self) -> &mut BpfHashMap<MapData, CtKey, CtEntry> {
        &mut self.conntrack
    }

    /// Capacity of the conntrack map as loaded.
    pub fn conntrack_capacity(&self) -> u32 {
        use aya::maps::IterableMap;
        self.conntrack
            .map()
            .info()
            .map(|i| i.max_entries())
            .unwrap_or(0)
    }

    /// Writes the conntrack idle timeouts the program uses (seconds, by state).
    pub fn set_ct_timeouts(&mut self, seconds: &[u64]) -> Result<(), KernelError> {
        let name = map_name::CT_TIMEOUTS;
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(KernelError::MissingMap(name))?;
        let mut array: aya::maps::Array<&mut MapData, u64> =
            aya::maps::Array::try_from(map).map_err(|source| KernelError::Map { name, source })?;
        for (i, s) in seconds.iter().enumerate() {
            array
                .set(i as u32, s, 0)
                .map_err(|source| KernelError::Map { name, source })?;
        }
        Ok(())
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

impl MapOps for KernelMaps {
    type Error = MapError;
    fn put_backend(&mut self, id: u32, backend: &Backend) -> Result<(), MapError> {
        self.backends.insert(id, backend, 0)
    }
    fn del_backend(&mut self, id: u32) -> Result<(), MapError> {
        ignore_missing(self.backends.remove(&id))
    }
    fn put_slot(&mut self, key: &SlotKey, backend_id: u32) -> Result<(), MapError> {
        self.slots.insert(key, backend_id, 0)
    }
    fn del_slot(&mut self, key: &SlotKey) -> Result<(), MapError> {
        ignore_missing(self.slots.remove(key))
    }
    fn put_service(&mut self, key: &ServiceKey, value: &ServiceValue) -> Result<(), MapError> {
        self.services.insert(key, value, 0)
    }
    fn del_service(&mut self, key: &ServiceKey) -> Result<(), MapError> {
        ignore_missing(self.services.remove(key))
    }
    fn put_name(&mut self, id: u32, name: &ServiceName) -> Result<(), MapError> {
        self.names.insert(id, name, 0)
    }
    fn del_name(&mut self, id: u32) -> Result<(), MapError> {
        ignore_missing(self.names.remove(&id))
    }
}

fn ignore_missing(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
    }
}

/// Removes a pin file; one already gone is fine.
fn unpin(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The index of interface `name` in the calling thread's network namespace.
fn ifindex(name: &str) -> std::io::Result<u32> {
    let c = std::ffi::CString::new(name)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: NUL-terminated string; the call reads nothing else.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(std::io::Error::last_os_error()),
        index => Ok(index),
    }
}

/// BPF memory is charged to the memory cgroup on current kernels; older ones count it
/// against RLIMIT_MEMLOCK. Raising the limit may be refused: that is not fatal.
fn raise_memlock() {
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

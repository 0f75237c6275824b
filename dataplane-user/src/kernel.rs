//! The kernel edge: loads the embedded object, sizes and exposes its maps, attaches
//! the TC program, and runs packets through it with BPF_PROG_TEST_RUN.

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray},
    programs::{tc, SchedClassifier, TcAttachType, TestRun, TestRunOptions},
    Ebpf, EbpfLoader,
};
use dataplane_common::{
    map_name, stat, Backend, FlowKey, NatTarget, ServiceKey, ServiceValue, SlotKey,
};

use crate::writer::{Limits, MapOps};

/// The kernel object, built by `cargo xtask build-ebpf` (or this crate's build script).
static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("SLICEWAY_EBPF_OBJECT"));

/// Name of the TC program in the object.
pub const TC_PROGRAM: &str = "sliceway_tc";

/// Errors of the kernel edge, each saying what failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("loading the kernel object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("the kernel object has no map {0}")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error("program {TC_PROGRAM}: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("attaching to interface {iface}: {source}")]
    Attach {
        iface: String,
        source: aya::programs::ProgramError,
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
}

/// A loaded datapath: programs and maps, private to this process.
pub struct Datapath {
    ebpf: Ebpf,
    pub maps: KernelMaps,
    conntrack: BpfHashMap<MapData, FlowKey, NatTarget>,
    stats: PerCpuArray<MapData, u64>,
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
    /// program.
    pub fn load(caps: &Capacities) -> Result<Self, KernelError> {
        raise_memlock();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(map_name::SERVICES, caps.limits.services)
            .map_max_entries(map_name::SLOTS, caps.limits.slots)
            .map_max_entries(map_name::BACKENDS, caps.limits.backends)
            .map_max_entries(map_name::CONNTRACK, caps.conntrack)
            .load(OBJECT)?;
        // Kernel-side logging exists only in a debug build of the object.
        if let Err(e) = aya_log::EbpfLogger::init(&mut ebpf) {
            tracing::debug!("no kernel-side logging: {e}");
        }
        let program: &mut SchedClassifier = ebpf
            .program_mut(TC_PROGRAM)
            .ok_or(KernelError::MissingMap(TC_PROGRAM))?
            .try_into()?;
        program.load()?;
        let maps = KernelMaps {
            services: take(&mut ebpf, map_name::SERVICES)?,
            slots: take(&mut ebpf, map_name::SLOTS)?,
            backends: take(&mut ebpf, map_name::BACKENDS)?,
        };
        let conntrack = take(&mut ebpf, map_name::CONNTRACK)?;
        let stats = take(&mut ebpf, map_name::STATS)?;
        Ok(Self {
            ebpf,
            maps,
            conntrack,
            stats,
        })
    }

    fn program(&self) -> &SchedClassifier {
        self.ebpf
            .program(TC_PROGRAM)
            .and_then(|p| <&SchedClassifier>::try_from(p).ok())
            .expect("loaded in Datapath::load")
    }

    /// Attaches the TC program at ingress of `iface` (tcx on kernels that have it,
    /// clsact otherwise). It stays attached while this `Datapath` lives.
    pub fn attach(&mut self, iface: &str) -> Result<(), KernelError> {
        // Needed for the netlink attach on kernels before 6.6; harmless otherwise
        // (fails with EEXIST when the qdisc is there already).
        let _ = tc::qdisc_add_clsact(iface);
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(TC_PROGRAM)
            .ok_or(KernelError::MissingMap(TC_PROGRAM))?
            .try_into()?;
        program
            .attach(iface, TcAttachType::Ingress)
            .map_err(|source| KernelError::Attach {
                iface: iface.to_string(),
                source,
            })?;
        Ok(())
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
    pub fn conntrack(&self) -> Vec<(FlowKey, NatTarget)> {
        self.conntrack.iter().filter_map(Result::ok).collect()
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
}

fn ignore_missing(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
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

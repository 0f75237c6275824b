//! `list` and `trace`: what the kernel holds, and where a packet would go.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr, SocketAddrV6},
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray};
use dataplane_common::{
    map_name, stat, Backend, ServiceKey, ServiceKey6, ServiceName, ServiceValue, SlotKey,
    PROTO_SCTP, PROTO_TCP, SCOPE_ANY,
};
use serde::Serialize;

use dataplane_common::{BackendCounters, FrontendCounters};

use crate::{
    agent::Pipeline,
    cmd::cli::From,
    compiler::{any_backend_addr, any_frontend_addr, FrontendKey, Incremental},
    kernel::packet::{self, PacketSpec, PacketSpec6, TCP_SYN},
    kernel::summed,
    kernel::{Capacities, Datapath, KernelError, PinDir, Role, TC_ACT_REDIRECT, TC_ACT_SHOT},
    writer::{KernelState, MapWriter},
};

/// One frontend as `list` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ListedFrontend {
    pub frontend: String,
    pub service: String,
    pub backends: Vec<String>,
    /// What clients sent it since it got its id (`None` for ClusterIP markers and
    /// frontends beyond the counted ones).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counts>,
    /// `loadBalancerSourceRanges` the kernel holds for it (a load-balancer IP's):
    /// new connections only from these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<String>,
    #[serde(skip)]
    id: u32,
    #[serde(skip)]
    key: crate::compiler::FrontendKey,
}

/// Counts of a frontend or backend, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub connections: u64,
    pub packets: u64,
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drops: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejects: Option<u64>,
}

/// One backend's counts as `list` shows them.
#[derive(Clone, Debug, Serialize)]
pub struct ListedBackend {
    pub backend: String,
    pub protocol: &'static str,
    pub counters: Counts,
}

/// What `list` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Listing {
    pub frontends: Vec<ListedFrontend>,
    /// Backends of the listed frontends, with what clients sent them through any
    /// frontend.
    pub backends: Vec<ListedBackend>,
    /// Datapath exit counters by reason, summed over CPUs.
    pub counters: BTreeMap<String, u64>,
    pub conntrack_entries: usize,
}

/// A pinned map of this agent's layout, typed.
pub(crate) fn open_pinned<T: TryFrom<Map, Error = aya::maps::MapError>>(
    pins: &PinDir,
    name: &'static str,
) -> Result<T, KernelError> {
    let path = pins.map(name);
    let data = MapData::from_pin(&path).map_err(|source| KernelError::Map { name, source })?;
    let map = match name {
        map_name::STATS | map_name::FRONTEND_COUNTERS | map_name::BACKEND_COUNTERS => {
            Map::PerCpuArray(data)
        }
        map_name::CONNTRACK => Map::LruHashMap(data),
        map_name::CT_TIMEOUTS | map_name::NAT_CONFIG => Map::Array(data),
        map_name::NAT_CONFIG6 => Map::Array(data),
        map_name::SOURCE_RANGES | map_name::SOURCE_RANGES6 => Map::LpmTrie(data),
        _ => Map::HashMap(data),
    };
    T::try_from(map).map_err(|source| KernelError::Map { name, source })
}

/// Reads the pinned maps of a running (or stopped) agent; with `service`
/// (`namespace/name`), only that Service's frontends and their backends.
pub fn list(pins: &PinDir, service: Option<&str>) -> Result<Listing, KernelError> {
    let services: BpfHashMap<MapData, ServiceKey, ServiceValue> =
        open_pinned(pins, map_name::SERVICES)?;
    let slots: BpfHashMap<MapData, SlotKey, u32> = open_pinned(pins, map_name::SLOTS)?;
    let backends: BpfHashMap<MapData, u32, Backend> = open_pinned(pins, map_name::BACKENDS)?;
    let names: BpfHashMap<MapData, u32, ServiceName> = open_pinned(pins, map_name::SERVICE_NAMES)?;
    let stats: PerCpuArray<MapData, u64> = open_pinned(pins, map_name::STATS)?;
    let conntrack: BpfHashMap<MapData, dataplane_common::CtKey, dataplane_common::CtEntry> =
        open_pinned(pins, map_name::CONNTRACK)?;
    // IPv6's maps, when the agent that pinned them had them.
    let services6 = open_pinned::<BpfHashMap<MapData, dataplane_common::ServiceKey6, ServiceValue>>(
        pins,
        map_name::SERVICES6,
    );
    let backends6 = open_pinned::<BpfHashMap<MapData, u32, dataplane_common::Backend6>>(
        pins,
        map_name::BACKENDS6,
    );
    let state = KernelState {
        services: services.iter().filter_map(Result::ok).collect(),
        slots: slots.iter().filter_map(Result::ok).collect(),
        backends: backends.iter().filter_map(Result::ok).collect(),
        names: names
            .iter()
            .filter_map(Result::ok)
            .map(|(id, n)| (id, n.as_str().to_string()))
            .collect(),
        services6: services6
            .iter()
            .flat_map(|m| m.iter().filter_map(Result::ok))
            .collect(),
        backends6: backends6
            .iter()
            .flat_map(|m| m.iter().filter_map(Result::ok))
            .collect(),
    };
    let mut counters = BTreeMap::new();
    for (i, name) in stat::NAMES.iter().enumerate() {
        let v: u64 = stats
            .get(&(i as u32), 0)
            .map(|v| v.iter().sum())
            .unwrap_or(0);
        counters.insert(name.to_string(), v);
    }
    let frontend_counters: PerCpuArray<MapData, FrontendCounters> =
        open_pinned(pins, map_name::FRONTEND_COUNTERS)?;
    let backend_counters: PerCpuArray<MapData, BackendCounters> =
        open_pinned(pins, map_name::BACKEND_COUNTERS)?;
    let mut frontends = list_state(&state);
    if let Some(svc) = service {
        frontends.retain(|f| {
            f.service == svc
                || f.service
                    .strip_prefix(svc)
                    .is_some_and(|r| r.starts_with(':'))
        });
    }
    // Source ranges, by frontend (a pinned map of an older agent may lack them).
    let mut ranges: BTreeMap<crate::compiler::FrontendKey, Vec<String>> = BTreeMap::new();
    let trie = open_pinned::<aya::maps::LpmTrie<MapData, dataplane_common::SourceRange, u8>>(
        pins,
        map_name::SOURCE_RANGES,
    );
    if let Err(e) = &trie {
        tracing::warn!("source ranges not shown: {e}");
    }
    if let Ok(trie) = trie {
        for k in trie.keys().filter_map(Result::ok) {
            let (len, data) = (k.prefix_len(), k.data());
            let addr = std::net::Ipv4Addr::from(u32::from_be(data.src_be));
            let bits = len.saturating_sub(dataplane_common::SourceRange::FRONTEND_BITS);
            ranges
                .entry(data.frontend.into())
                .or_default()
                .push(format!("{addr}/{bits}"));
        }
    }
    let trie6 = open_pinned::<aya::maps::LpmTrie<MapData, dataplane_common::SourceRange6, u8>>(
        pins,
        map_name::SOURCE_RANGES6,
    );
    if let Ok(trie) = trie6 {
        for k in trie.keys().filter_map(Result::ok) {
            let (len, data) = (k.prefix_len(), k.data());
            let addr = crate::compiler::format::ipv6_of(data.src_be);
            let bits = len.saturating_sub(dataplane_common::SourceRange6::FRONTEND_BITS);
            ranges
                .entry(data.frontend.into())
                .or_default()
                .push(format!("{addr}/{bits}"));
        }
    }
    for f in &mut frontends {
        let any = match f.key {
            crate::compiler::FrontendKey::V4(k) => crate::compiler::FrontendKey::V4(ServiceKey {
                scope: SCOPE_ANY,
                ..k
            }),
            crate::compiler::FrontendKey::V6(k) => {
                crate::compiler::FrontendKey::V6(dataplane_common::ServiceKey6 {
                    scope: SCOPE_ANY,
                    ..k
                })
            }
        };
        if let Some(r) = ranges.get(&any) {
            f.source_ranges = r.clone();
            f.source_ranges.sort();
        }
        if f.frontend.ends_with(":*") {
            continue;
        }
        f.counters = summed(&frontend_counters, f.id, FrontendCounters::add).map(|c| Counts {
            connections: c.new,
            packets: c.packets,
            bytes: c.bytes,
            drops: Some(c.drops),
            rejects: Some(c.rejects),
        });
    }
    let wanted: std::collections::BTreeSet<&str> = frontends
        .iter()
        .flat_map(|f| f.backends.iter().map(String::as_str))
        .collect();
    let mut backends: Vec<ListedBackend> = state
        .all_backends()
        .filter(|(_, b)| wanted.contains(any_backend_addr(b).as_str()))
        .map(|(id, b)| ListedBackend {
            backend: any_backend_addr(&b),
            protocol: crate::compiler::proto_name(b.proto()),
            counters: summed(&backend_counters, id, BackendCounters::add)
                .map(|c| Counts {
                    connections: c.new,
                    packets: c.packets,
                    bytes: c.bytes,
                    ..Counts::default()
                })
                .unwrap_or_default(),
        })
        .collect();
    backends.sort_by(|a, b| (&a.backend, a.protocol).cmp(&(&b.backend, b.protocol)));
    Ok(Listing {
        frontends,
        backends,
        counters,
        conntrack_entries: conntrack.keys().count(),
    })
}

/// Frontends of a map state, sorted by address.
pub fn list_state(state: &KernelState) -> Vec<ListedFrontend> {
    let slots: BTreeMap<SlotKey, u32> = state.slots.iter().copied().collect();
    let backends: BTreeMap<u32, crate::compiler::AnyBackend> = state.all_backends().collect();
    let names: BTreeMap<u32, &str> = state
        .names
        .iter()
        .map(|(id, n)| (*id, n.as_str()))
        .collect();
    let mut out: Vec<(crate::compiler::FrontendKey, ListedFrontend)> = state
        .all_services()
        .map(|(key, value)| {
            // Each backend once, in the order of its first slot (a Maglev table
            // holds each in many).
            let mut listed: Vec<String> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for slot in 0..value.count {
                let b = slots
                    .get(&SlotKey {
                        service_id: value.id,
                        slot,
                    })
                    .and_then(|id| backends.get(id))
                    .map_or_else(|| "<missing>".to_string(), any_backend_addr);
                if seen.insert(b.clone()) {
                    listed.push(b);
                }
            }
            let backends = listed;
            let service = names.get(&value.id).copied().unwrap_or("?").to_string();
            (
                key,
                ListedFrontend {
                    frontend: any_frontend_addr(&key),
                    service,
                    backends,
                    counters: None,
                    source_ranges: Vec::new(),
                    id: value.id,
                    key,
                },
            )
        })
        .collect();
    // IPv4's first, each by address, port and protocol.
    out.sort_by_key(|(k, _)| (k.ip(), k.port(), k.proto()));
    out.into_iter().map(|(_, f)| f).collect()
}

/// `list -o table`.
pub fn render_table(l: &Listing) -> String {
    let mut s = format!(
        "{:<24} {:<32} {:>8} {:>10} {:>12} {:>6} {:>7} BACKENDS\n",
        "FRONTEND", "SERVICE", "CONNS", "PACKETS", "BYTES", "DROPS", "REJECTS"
    );
    for f in &l.frontends {
        let mut backends = if f.backends.is_empty() {
            "(none: new flows dropped)".to_string()
        } else {
            f.backends.join(", ")
        };
        if !f.source_ranges.is_empty() {
            backends.push_str(&format!(" (only from {})", f.source_ranges.join(", ")));
        }
        let c = f.counters.unwrap_or_default();
        let n = |v: u64| {
            if f.counters.is_some() {
                v.to_string()
            } else {
                "-".into()
            }
        };
        s.push_str(&format!(
            "{:<24} {:<32} {:>8} {:>10} {:>12} {:>6} {:>7} {}\n",
            f.frontend,
            f.service,
            n(c.connections),
            n(c.packets),
            n(c.bytes),
            n(c.drops.unwrap_or(0)),
            n(c.rejects.unwrap_or(0)),
            backends
        ));
    }
    if !l.backends.is_empty() {
        s.push_str(&format!(
            "\n{:<24} {:<6} {:>8} {:>10} {:>12}\n",
            "BACKEND", "PROTO", "CONNS", "PACKETS", "BYTES"
        ));
        for b in &l.backends {
            s.push_str(&format!(
                "{:<24} {:<6} {:>8} {:>10} {:>12}\n",
                b.backend, b.protocol, b.counters.connections, b.counters.packets, b.counters.bytes
            ));
        }
    }
    s.push_str(&format!(
        "\nconntrack entries: {}\ncounters:\n",
        l.conntrack_entries
    ));
    for (name, v) in &l.counters {
        s.push_str(&format!("  {name:<22} {v}\n"));
    }
    s
}

/// What `trace` prints.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Trace {
    /// `dnat`, `drop`, `reject` or `pass`.
    pub verdict: String,
    /// `namespace/name:port` of the frontend the packet hit, if any.
    pub service: Option<String>,
    /// The backend chosen for this packet, if it was DNATed.
    pub backend: Option<String>,
    /// Every backend this packet could have been sent to (the eligible set after
    /// policy, topology and affinity).
    pub candidates: Vec<String>,
    /// The source address the packet leaves with when it is rewritten: the hairpin
    /// address for a pod picked as the backend of its own connection, the node's
    /// address for a client outside the node that is masqueraded; none otherwise
    /// (traffic from pods keeps its source).
    pub snat: Option<String>,
    /// What the compiler could not use, each with its object and reason (with
    /// `--manifests`; a live trace reads only the maps and says nothing here).
    pub skipped: Vec<TraceSkipped>,
    /// The datapath's reason for the verdict.
    pub reason: String,
    /// The program that decided (`--from external-xdp`: `sliceway_xdp` or, for
    /// IPv6, `sliceway_xdp6`; the TC program for what XDP leaves to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
}

/// An object the manifest reader or the compiler skipped, as `trace` shows it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TraceSkipped {
    /// The object (`Service default/web`), or the file when no object could be read.
    pub object: String,
    /// The field at fault, when the reader knows it (`metadata.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The file the reader found it in (problems of the reader only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    pub code: String,
    pub reason: String,
}

impl TraceSkipped {
    /// A problem of the manifest reader (a file, a document or an object of it).
    pub fn of_problem(p: &conventions::manifests::Problem) -> Self {
        let file = p.file.display().to_string();
        Self {
            object: p.object.clone().unwrap_or_else(|| file.clone()),
            field: p.field.clone(),
            file: Some(file),
            code: p.code.into(),
            reason: p.reason.clone(),
        }
    }
}

/// Why a trace was not run.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(
        "--src {src} and --dst {dst} are of different address families: give both as IPv4 \
         (10.244.1.2, 10.96.0.10:80) or both as IPv6 (fd00:244::2, [fd00::10]:80)"
    )]
    MixedFamilies { src: IpAddr, dst: SocketAddr },
}

/// The client a trace sends from and the frontend it sends to, checked: one family
/// (`src` with no port gets [`default_src`]'s).
pub fn endpoints(
    src: crate::cmd::cli::TraceSource,
    dst: SocketAddr,
) -> Result<(SocketAddr, SocketAddr), TraceError> {
    if src.ip.is_ipv4() != dst.is_ipv4() {
        return Err(TraceError::MixedFamilies { src: src.ip, dst });
    }
    let src = match src.port {
        Some(port) => SocketAddr::new(src.ip, port),
        None => default_src(src.ip),
    };
    Ok((src, dst))
}

/// Loads the programs with private maps (no attach, no pinning), writes what
/// `compiler` holds into them as the agent's loop does (the incremental compiler's
/// first sync through the map writer), and runs one crafted packet, IPv4 or IPv6 as
/// `dst` is, through BPF_PROG_TEST_RUN (`from_host`: what the socket programs do
/// with a node's socket connecting to `dst`, [`host_trace`]). `trace
/// --manifests` fills `compiler` from the local source, as `run` does.
pub fn trace(
    compiler: Incremental,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
    from: From,
) -> Result<Trace, TraceError> {
    let mut dp = Datapath::load(&Capacities::default(), None)?;
    let mut pipeline = Pipeline::new(
        compiler,
        MapWriter::new(dp.limits()).with_limits6(dp.limits6()),
    );
    pipeline.sync(&mut dp.maps);
    // The node's addresses to masquerade to, as the agent takes them from the Node
    // object (an agent without one takes its uplink's address, which a trace from
    // files does not know).
    let (port_min, port_max) = dataplane_common::SNAT_PORTS_DEFAULT;
    if let Some(addr) = pipeline.compiler.node_ip() {
        dp.set_nat(dataplane_common::NatConfig {
            node_addr_be: u32::from(addr).to_be(),
            port_min,
            port_max,
        })?;
    }
    if let Some(addr) = pipeline.compiler.node_ip6() {
        if dp.has_ipv6_maps() {
            dp.set_nat6(dataplane_common::NatConfig6 {
                node_addr_be: dataplane_common::addr_of(addr.octets()),
                port_min,
                port_max,
            })?;
        }
    }
    let mut trace = match (from, dst) {
        (From::Host, _) => host_trace(&dp, dst, proto)?,
        (From::Pod, _) => run_trace(&dp, Role::Pods, src, dst, proto)?,
        (From::PodSocket, _) => pod_socket_trace(&dp, src, dst, proto)?,
        (From::External, _) => run_trace(&dp, Role::External, src, dst, proto)?,
        (From::ExternalXdp, _) => run_trace_xdp(&mut dp, src, dst, proto)?,
    };
    trace.skipped = pipeline
        .compiler
        .skipped()
        .iter()
        .map(|s| TraceSkipped {
            object: s.object.to_string(),
            field: None,
            file: None,
            code: s.code.into(),
            reason: s.reason.clone(),
        })
        .collect();
    Ok(trace)
}

/// Runs one packet through an already filled datapath; reads the frontend and its
/// candidates back from the maps (`SERVICES6` and `BACKENDS6` for IPv6), so it works
/// on live maps too.
pub fn run_trace(
    dp: &Datapath,
    role: Role,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
) -> Result<Trace, KernelError> {
    let packet = trace_packet(src, dst, proto);
    let before = dp.stats()?;
    let out = dp.test_run_as(role, &packet)?;
    let after = dp.stats()?;
    traced(dp, role, src, dst, proto, out, counted(&before, &after))
}

/// [`run_trace`] through the uplink's XDP program (`--from external-xdp`; IPv6 in
/// its IPv6 program), and through its TC program if XDP leaves the packet to it;
/// `program` says which decided.
pub fn run_trace_xdp(
    dp: &mut Datapath,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
) -> Result<Trace, KernelError> {
    let packet = trace_packet(src, dst, proto);
    let before = dp.stats()?;
    let mut out = dp.test_run_xdp(&packet)?;
    let after = dp.stats()?;
    let reason = counted(&before, &after);
    if reason == stat::NAMES[stat::XDP_TO_TC as usize] {
        return run_trace(dp, Role::External, src, dst, proto);
    }
    // In TC's terms, which the rest reads.
    out.verdict = match out.verdict {
        crate::kernel::XDP_DROP => TC_ACT_SHOT,
        _ => crate::kernel::TC_ACT_OK,
    };
    let mut trace = traced(dp, Role::External, src, dst, proto, out, reason)?;
    trace.program = Some(
        match dst {
            SocketAddr::V4(_) => crate::kernel::XDP_PROGRAM,
            SocketAddr::V6(_) => crate::kernel::XDP6_PROGRAM,
        }
        .into(),
    );
    Ok(trace)
}

/// The packet a trace sends: a TCP SYN, an SCTP INIT or a UDP datagram, over IPv4
/// or IPv6 as the addresses are (one family, [`endpoints`]).
fn trace_packet(src: SocketAddr, dst: SocketAddr, proto: u8) -> Vec<u8> {
    match (src, dst) {
        (SocketAddr::V4(src), SocketAddr::V4(dst)) => packet::build(&match proto {
            PROTO_TCP => PacketSpec::tcp(src, dst, TCP_SYN),
            PROTO_SCTP => PacketSpec::sctp(src, dst, packet::SCTP_INIT),
            _ => PacketSpec::udp(src, dst, b"trace"),
        }),
        (src, dst) => {
            let (src, dst) = (v6_of(src), v6_of(dst));
            packet::build6(&match proto {
                PROTO_TCP => PacketSpec6::tcp(src, dst, TCP_SYN),
                PROTO_SCTP => PacketSpec6::sctp(src, dst, packet::SCTP_INIT),
                _ => PacketSpec6::udp(src, dst, b"trace"),
            })
        }
    }
}

/// An address as IPv6 (an IPv4 one mapped, which [`endpoints`] never lets through).
fn v6_of(a: SocketAddr) -> SocketAddrV6 {
    match a {
        SocketAddr::V6(a) => a,
        SocketAddr::V4(a) => SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0),
    }
}

/// Source and destination of a packet a program left, of either family.
fn parsed_addrs(packet: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    packet::parse(packet)
        .map(|p| (p.src.into(), p.dst.into()))
        .or_else(|| packet::parse6(packet).map(|p| (p.src.into(), p.dst.into())))
}

/// The frontend key of `dst` in its family's map, of scope `scope`.
fn frontend_key(dst: SocketAddr, proto: u8, scope: u8) -> FrontendKey {
    match dst {
        SocketAddr::V4(d) => FrontendKey::V4(ServiceKey {
            addr_be: u32::from(*d.ip()).to_be(),
            port_be: d.port().to_be(),
            proto,
            scope,
        }),
        SocketAddr::V6(d) => FrontendKey::V6(ServiceKey6 {
            addr_be: dataplane_common::addr_of(d.ip().octets()),
            port_be: d.port().to_be(),
            proto,
            scope,
        }),
    }
}

/// The program that decides a packet of `dst`'s family arriving on an interface of
/// `role`: the entry program for IPv4, the IPv6 program it hands IPv6 to.
fn deciding_program(role: Role, dst: SocketAddr) -> &'static str {
    match (dst, role) {
        (SocketAddr::V4(_), role) => role.program(),
        (SocketAddr::V6(_), Role::Pods) => crate::kernel::TC6_PROGRAM,
        (SocketAddr::V6(_), Role::External) => crate::kernel::EXT6_PROGRAM,
    }
}

/// The exit a run counted, by name.
fn counted(before: &[u64], after: &[u64]) -> String {
    (0..stat::COUNT as usize)
        .find(|i| after[*i] > before[*i])
        .map_or("unknown", |i| stat::NAMES[i])
        .to_string()
}

/// The trace of a run that gave `out` for exit `reason`.
fn traced(
    dp: &Datapath,
    role: Role,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
    out: crate::kernel::TestRunOutput,
    reason: String,
) -> Result<Trace, KernelError> {
    let key = frontend_key(dst, proto, SCOPE_ANY);
    let state = dp.maps.state();
    let find = |k: FrontendKey| state.all_services().find(|(s, _)| *s == k);
    // From outside the node, a frontend's external entry comes first, as in the
    // uplink program.
    let frontend = match role {
        Role::External => {
            find(frontend_key(dst, proto, dataplane_common::SCOPE_EXTERNAL)).or_else(|| find(key))
        }
        Role::Pods => find(key),
    };
    let (service, candidates) = match frontend {
        Some((k, v)) => {
            let f = list_one(&state, k, v);
            (Some(f.service), f.backends)
        }
        None => (None, Vec::new()),
    };
    let parsed = parsed_addrs(&out.packet);
    // A new source: a pod reaching itself through its Service (hairpin), or a client
    // outside the node masqueraded to the node's address.
    let snat = parsed
        .as_ref()
        .filter(|(p_src, _)| p_src.ip() != src.ip() && out.verdict != TC_ACT_SHOT)
        .map(|(p_src, _)| p_src.ip().to_string());
    let (verdict, backend) = if out.verdict == TC_ACT_SHOT {
        ("drop", None)
    } else if out.verdict == TC_ACT_REDIRECT && reason.starts_with("reject") {
        ("reject", None)
    } else {
        match parsed {
            Some((_, p_dst)) if p_dst != dst => ("dnat", Some(p_dst.to_string())),
            _ => ("pass", None),
        }
    };
    Ok(Trace {
        verdict: verdict.into(),
        service,
        backend,
        candidates,
        snat,
        skipped: Vec::new(),
        reason,
        program: Some(deciding_program(role, dst).into()),
    })
}

/// The listing of one frontend of `state` (`key`, `value`), with its backends.
fn list_one(state: &KernelState, key: FrontendKey, value: ServiceValue) -> ListedFrontend {
    let (services, services6) = match key {
        FrontendKey::V4(k) => (vec![(k, value)], Vec::new()),
        FrontendKey::V6(k) => (Vec::new(), vec![(k, value)]),
    };
    let listed = list_state(&KernelState {
        services,
        services6,
        ..state.clone()
    });
    listed.into_iter().next().expect("one frontend")
}

/// The frontend key a socket call to `dst` looks up, as the socket programs take it
/// (an IPv4-mapped IPv6 address is IPv4's), and its ClusterIP's marker (the address,
/// port and protocol 0).
fn socket_keys(dst: SocketAddr, proto: u8) -> (FrontendKey, FrontendKey) {
    let ip = match dst.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    (
        frontend_key(SocketAddr::new(ip, dst.port()), proto, SCOPE_ANY),
        frontend_key(SocketAddr::new(ip, 0), 0, SCOPE_ANY),
    )
}

/// What a pod's socket meets where the agent runs with `--socket-lb-pods`: a TCP
/// connect to a frontend with backends, without session affinity or source ranges,
/// is translated by the socket programs (`dnat`, reason `sock_translated_pod`, the
/// candidates, no single backend: one is picked per connection), read from the maps
/// as they read them; anything else goes on to the TC program, whose trace this then
/// is (`--from pod`).
pub fn pod_socket_trace(
    dp: &Datapath,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
) -> Result<Trace, KernelError> {
    let (key, _) = socket_keys(dst, proto);
    let state = dp.maps.state();
    let at_socket = state
        .all_services()
        .find(|(k, v)| *k == key && v.pod_socket_translates(proto));
    let Some((k, v)) = at_socket else {
        return run_trace(dp, Role::Pods, src, dst, proto);
    };
    let f = list_one(&state, k, v);
    Ok(Trace {
        verdict: "dnat".into(),
        service: Some(f.service),
        backend: None,
        candidates: f.backends,
        snat: None,
        skipped: Vec::new(),
        reason: stat::NAMES[stat::SOCK_TRANSLATED_POD as usize].into(),
        program: None,
    })
}

/// What the socket programs (`sliceway_connect4`/`6`, `sliceway_sendmsg4`/`6`) do
/// with a socket of the node that connects or sends to `dst`, read from the maps the
/// way they read them (the kernel runs no test of socket programs): a frontend with
/// backends is translated to one of its candidates (a random slot per connection,
/// or the node's session-affinity backend, so no single backend is named); one
/// without, or a ClusterIP's undeclared port, is refused (EPERM); anything else
/// passes. An IPv4-mapped IPv6 destination (`[::ffff:10.96.0.10]:80`, a dual-stack
/// socket's) is IPv4's, as the programs take it. The source does not matter: the
/// node is one client.
pub fn host_trace(dp: &Datapath, dst: SocketAddr, proto: u8) -> Result<Trace, KernelError> {
    let (key, marker) = socket_keys(dst, proto);
    let state = dp.maps.state();
    let frontend = state.all_services().find(|(k, _)| *k == key);
    let (verdict, reason, service, candidates) = match frontend {
        Some((k, v)) => {
            let f = list_one(&state, k, v);
            match v.count {
                0 => (
                    "reject",
                    stat::SOCK_REJECT_NO_BACKEND,
                    Some(f.service),
                    f.backends,
                ),
                _ => ("dnat", stat::SOCK_TRANSLATED, Some(f.service), f.backends),
            }
        }
        None if state.all_services().any(|(k, _)| k == marker) => {
            ("reject", stat::SOCK_REJECT_NO_PORT, None, Vec::new())
        }
        None => ("pass", stat::PASS_NO_SERVICE, None, Vec::new()),
    };
    Ok(Trace {
        verdict: verdict.into(),
        service,
        backend: None,
        candidates,
        snat: None,
        skipped: Vec::new(),
        reason: stat::NAMES[reason as usize].into(),
        program: None,
    })
}

/// Loads the programs over the live pinned service maps (conntrack and counters stay
/// private, so a trace leaves no flow behind) for `trace` without `--manifests`.
pub fn live_datapath(pins: &PinDir) -> Result<Datapath, KernelError> {
    Datapath::load_over_pinned_services(pins)
}

/// A placeholder address for a client when `--src` has no port.
pub fn default_src(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, 40000)
}

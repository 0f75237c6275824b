//! `sliceway-agent conntrack`: the connections the datapath tracks, read from the
//! pinned conntrack map as an operator reads `conntrack -L` or `ipvsadm -Lnc`, and
//! `--flush-backend`, which forgets every connection to one backend so its packets
//! take a new backend at once (what an operator does when a backend must stop
//! receiving traffic now).
//!
//! A connection is shown from its forward entry: client, frontend (the address the
//! client asked for), backend (where its packets go), state, age and time left. Its
//! Service is looked up by frontend in the Service map now (the id the entry was
//! made with may have been given to another frontend since); one whose frontend is
//! gone shows `-`, as it still works until it ends (netfilter's behaviour).

use std::net::{Ipv4Addr, SocketAddrV4};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use dataplane_common::{
    ct, map_name, CtEntry, CtKey, ServiceKey, ServiceName, ServiceValue, CT_FORWARD, CT_REVERSE,
};
use serde::Serialize;

use crate::{
    compiler::proto_name,
    inspect::open_pinned,
    kernel::{KernelError, PinDir},
};

/// One tracked connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrackedFlow {
    pub protocol: String,
    pub client: String,
    pub frontend: String,
    /// `namespace/name:port`, or `-` when the frontend is no longer programmed.
    pub service: String,
    pub backend: String,
    pub state: String,
    /// Seconds since the last packet, either direction.
    pub idle_s: u64,
    /// Seconds until the entry expires unless a packet comes.
    pub expires_in_s: u64,
}

fn v4(addr_be: u32, port_be: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(u32::from_be(addr_be)), u16::from_be(port_be))
}

/// The idle timeout of each state: the agent's overrides in `CT_TIMEOUTS`, else the
/// defaults, as the program reads them.
fn timeouts(pins: &PinDir) -> [u64; ct::state::COUNT as usize] {
    let mut out = ct::DEFAULTS;
    let Ok(array) = open_pinned::<Array<MapData, u64>>(pins, map_name::CT_TIMEOUTS) else {
        return out;
    };
    for (i, t) in out.iter_mut().enumerate() {
        if let Ok(v) = array.get(&(i as u32), 0) {
            if v != 0 {
                *t = v;
            }
        }
    }
    out
}

/// The connections in the pinned conntrack map at `now_ns` (CLOCK_MONOTONIC), those
/// of Service `service` (`namespace/name`) only if given; sorted by frontend, then
/// client. Expired entries the sweeper has not removed yet are left out.
pub fn flows(
    pins: &PinDir,
    service: Option<&str>,
    now_ns: u64,
) -> Result<Vec<TrackedFlow>, KernelError> {
    let conntrack: BpfHashMap<MapData, CtKey, CtEntry> = open_pinned(pins, map_name::CONNTRACK)?;
    let services: BpfHashMap<MapData, ServiceKey, ServiceValue> =
        open_pinned(pins, map_name::SERVICES)?;
    let names: BpfHashMap<MapData, u32, ServiceName> = open_pinned(pins, map_name::SERVICE_NAMES)?;
    let timeouts = timeouts(pins);
    let mut out = Vec::new();
    for (key, entry) in conntrack.iter().filter_map(Result::ok) {
        if entry.dir != CT_FORWARD || key.family != dataplane_common::FAMILY_V4 {
            continue;
        }
        let timeout_s = timeouts
            .get(entry.state as usize)
            .copied()
            .unwrap_or_default();
        if !ct::alive(entry.last_seen_ns, now_ns, timeout_s) {
            continue;
        }
        let idle_ns = now_ns.saturating_sub(entry.last_seen_ns);
        let frontend = ServiceKey {
            addr_be: key.dst_be[0],
            port_be: key.dport_be,
            proto: key.proto,
            scope: 0,
        };
        let name = services
            .get(&frontend, 0)
            .ok()
            .and_then(|v| names.get(&v.id, 0).ok())
            .map_or_else(|| "-".to_string(), |n| n.as_str().to_string());
        if let Some(wanted) = service {
            let of_it = name == wanted
                || name
                    .strip_prefix(wanted)
                    .is_some_and(|rest| rest.starts_with(':'));
            if !of_it {
                continue;
            }
        }
        out.push(TrackedFlow {
            protocol: proto_name(key.proto).to_string(),
            client: v4(key.src_be[0], key.sport_be).to_string(),
            frontend: v4(key.dst_be[0], key.dport_be).to_string(),
            service: name,
            backend: v4(entry.pair.src_be[0], entry.pair.sport_be).to_string(),
            state: ct::state::NAMES
                .get(entry.state as usize)
                .copied()
                .unwrap_or("?")
                .to_string(),
            idle_s: idle_ns / ct::NS,
            expires_in_s: (timeout_s * ct::NS).saturating_sub(idle_ns) / ct::NS,
        });
    }
    out.sort_by(|a, b| {
        (&a.frontend, &a.client, &a.protocol).cmp(&(&b.frontend, &b.client, &b.protocol))
    });
    Ok(out)
}

/// Removes every connection whose packets go to `backend` (both of its entries, of
/// any protocol): their next packet to a frontend picks a backend again, and packets
/// of the backend's old replies are no longer translated. Returns how many
/// connections were removed.
pub fn flush_backend(pins: &PinDir, backend: SocketAddrV4) -> Result<usize, KernelError> {
    let mut conntrack: BpfHashMap<MapData, CtKey, CtEntry> =
        open_pinned(pins, map_name::CONNTRACK)?;
    let addr_be = u32::from(*backend.ip()).to_be();
    let port_be = backend.port().to_be();
    let doomed: Vec<(CtKey, CtKey)> = conntrack
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, e)| {
            e.dir == CT_FORWARD
                && k.family == dataplane_common::FAMILY_V4
                && e.pair.src_be[0] == addr_be
                && e.pair.sport_be == port_be
        })
        .map(|(k, e)| (k, e.pair))
        .collect();
    for (forward, reverse) in &doomed {
        // The reverse entry goes only if it still names this connection.
        if let Ok(r) = conntrack.get(reverse, 0) {
            if r.dir == CT_REVERSE && r.pair == *forward {
                let _ = conntrack.remove(reverse);
            }
        }
        let _ = conntrack.remove(forward);
    }
    Ok(doomed.len())
}

/// The flows as a table for people.
pub fn render_table(flows: &[TrackedFlow]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5} {:<21} {:<21} {:<21} {:<16} {:>6} {:>8}  SERVICE",
        "PROTO", "CLIENT", "FRONTEND", "BACKEND", "STATE", "IDLE", "EXPIRES"
    );
    for f in flows {
        let _ = writeln!(
            out,
            "{:<5} {:<21} {:<21} {:<21} {:<16} {:>5}s {:>7}s  {}",
            f.protocol,
            f.client,
            f.frontend,
            f.backend,
            f.state,
            f.idle_s,
            f.expires_in_s,
            f.service
        );
    }
    let _ = writeln!(out, "{} connections", flows.len());
    out
}

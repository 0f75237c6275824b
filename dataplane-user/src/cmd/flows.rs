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

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use dataplane_common::{
    addr_of, ct, map_name, octets_of, CtEntry, CtKey, ServiceKey, ServiceKey6, ServiceName,
    ServiceValue, CT_FORWARD, CT_REVERSE, FAMILY_V4, FAMILY_V6,
};
use serde::Serialize;

use crate::{
    cmd::inspect::open_pinned,
    compiler::{proto_name, FrontendKey},
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

/// The address and port of one end of a conntrack key, of its family.
fn end_of(family: u8, addr_be: [u32; 4], port_be: u16) -> SocketAddr {
    let port = u16::from_be(port_be);
    if family == FAMILY_V6 {
        SocketAddr::new(Ipv6Addr::from(octets_of(addr_be)).into(), port)
    } else {
        SocketAddr::new(Ipv4Addr::from(u32::from_be(addr_be[0])).into(), port)
    }
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
    // IPv6's frontends, when the agent that pinned the maps had them.
    let services6 =
        open_pinned::<BpfHashMap<MapData, ServiceKey6, ServiceValue>>(pins, map_name::SERVICES6)
            .ok();
    let names: BpfHashMap<MapData, u32, ServiceName> = open_pinned(pins, map_name::SERVICE_NAMES)?;
    let name_of = |frontend: FrontendKey| {
        let id = match frontend {
            FrontendKey::V4(k) => services.get(&k, 0).ok()?.id,
            FrontendKey::V6(k) => services6.as_ref()?.get(&k, 0).ok()?.id,
        };
        names.get(&id, 0).ok().map(|n| n.as_str().to_string())
    };
    Ok(tracked(
        conntrack.iter().filter_map(Result::ok),
        name_of,
        &timeouts(pins),
        service,
        now_ns,
    ))
}

/// [`flows`] over conntrack entries of both families, `name_of` giving a frontend's
/// `namespace/name:port`.
pub fn tracked(
    entries: impl IntoIterator<Item = (CtKey, CtEntry)>,
    name_of: impl Fn(FrontendKey) -> Option<String>,
    timeouts: &[u64; ct::state::COUNT as usize],
    service: Option<&str>,
    now_ns: u64,
) -> Vec<TrackedFlow> {
    let mut out = Vec::new();
    for (key, entry) in entries {
        if entry.dir != CT_FORWARD || ![FAMILY_V4, FAMILY_V6].contains(&key.family) {
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
        let frontend = if key.family == FAMILY_V6 {
            FrontendKey::V6(ServiceKey6 {
                addr_be: key.dst_be,
                port_be: key.dport_be,
                proto: key.proto,
                scope: 0,
            })
        } else {
            FrontendKey::V4(ServiceKey {
                addr_be: key.dst_be[0],
                port_be: key.dport_be,
                proto: key.proto,
                scope: 0,
            })
        };
        let name = name_of(frontend).unwrap_or_else(|| "-".to_string());
        if let Some(wanted) = service {
            let of_it = name == wanted
                || name
                    .strip_prefix(wanted)
                    .is_some_and(|rest| rest.starts_with(':'));
            if !of_it {
                continue;
            }
        }
        let end = |addr_be, port_be| end_of(key.family, addr_be, port_be).to_string();
        out.push(TrackedFlow {
            protocol: proto_name(key.proto).to_string(),
            client: end(key.src_be, key.sport_be),
            frontend: end(key.dst_be, key.dport_be),
            service: name,
            backend: end(entry.pair.src_be, entry.pair.sport_be),
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
    out
}

/// Removes every connection whose packets go to `backend`, IPv4 or IPv6 (both of
/// its entries, of any protocol): their next packet to a frontend picks a backend
/// again, and packets of the backend's old replies are no longer translated.
/// Returns how many connections were removed.
pub fn flush_backend(pins: &PinDir, backend: SocketAddr) -> Result<usize, KernelError> {
    let mut conntrack: BpfHashMap<MapData, CtKey, CtEntry> =
        open_pinned(pins, map_name::CONNTRACK)?;
    let doomed = to_backend(conntrack.iter().filter_map(Result::ok), backend);
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

/// The connections among `entries` whose packets go to `backend`: each forward key
/// with its reverse one.
pub fn to_backend(
    entries: impl IntoIterator<Item = (CtKey, CtEntry)>,
    backend: SocketAddr,
) -> Vec<(CtKey, CtKey)> {
    let (family, addr_be) = match backend.ip() {
        IpAddr::V4(ip) => (FAMILY_V4, [u32::from(ip).to_be(), 0, 0, 0]),
        IpAddr::V6(ip) => (FAMILY_V6, addr_of(ip.octets())),
    };
    let port_be = backend.port().to_be();
    entries
        .into_iter()
        .filter(|(k, e)| {
            e.dir == CT_FORWARD
                && k.family == family
                && e.pair.src_be == addr_be
                && e.pair.sport_be == port_be
        })
        .map(|(k, e)| (k, e.pair))
        .collect()
}

/// The flows as a table for people. The address columns are as wide as their
/// widest entry (an IPv6 `[addr]:port` takes up to 47 characters), at least 21.
pub fn render_table(flows: &[TrackedFlow]) -> String {
    use std::fmt::Write;
    let width = |column: fn(&TrackedFlow) -> &str| {
        flows.iter().map(|f| column(f).len()).fold(21, usize::max)
    };
    let (c, fr, b) = (
        width(|f| &f.client),
        width(|f| &f.frontend),
        width(|f| &f.backend),
    );
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5} {:<c$} {:<fr$} {:<b$} {:<16} {:>6} {:>8}  SERVICE",
        "PROTO", "CLIENT", "FRONTEND", "BACKEND", "STATE", "IDLE", "EXPIRES"
    );
    for f in flows {
        let _ = writeln!(
            out,
            "{:<5} {:<c$} {:<fr$} {:<b$} {:<16} {:>5}s {:>7}s  {}",
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

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_common::PROTO_TCP;

    /// A forward entry and its reverse of one connection `client` → `frontend`
    /// given to `backend`, all of one family; last seen at 10 s.
    fn connection(
        client: SocketAddr,
        frontend: SocketAddr,
        backend: SocketAddr,
    ) -> [(CtKey, CtEntry); 2] {
        let addr = |a: SocketAddr| match a.ip() {
            IpAddr::V4(ip) => (FAMILY_V4, [u32::from(ip).to_be(), 0, 0, 0]),
            IpAddr::V6(ip) => (FAMILY_V6, addr_of(ip.octets())),
        };
        let key = |from: SocketAddr, to: SocketAddr| {
            let (family, src_be) = addr(from);
            CtKey {
                src_be,
                dst_be: addr(to).1,
                sport_be: from.port().to_be(),
                dport_be: to.port().to_be(),
                proto: PROTO_TCP,
                family,
                _pad: [0; 2],
            }
        };
        let forward = key(client, frontend);
        let reverse = key(backend, client);
        let entry = |dir, pair| CtEntry {
            pair,
            last_seen_ns: 10 * ct::NS,
            dir,
            state: ct::state::TCP_ESTABLISHED,
            ..CtEntry::default()
        };
        [
            (forward, entry(CT_FORWARD, reverse)),
            (reverse, entry(CT_REVERSE, forward)),
        ]
    }

    fn sock(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Issue 12: IPv6 connections are listed beside IPv4's, as `[addr]:port`, with
    /// their Service looked up by their IPv6 frontend.
    #[test]
    fn ipv6_connections_are_listed_in_brackets() {
        let mut entries = connection(
            sock("[fd00:244:1::2]:41000"),
            sock("[fd00:96::1]:80"),
            sock("[fd00:244:2::60]:8080"),
        )
        .to_vec();
        entries.extend(connection(
            sock("10.244.1.2:40000"),
            sock("10.96.6.1:80"),
            sock("10.244.2.60:8080"),
        ));
        let name_of = |f: FrontendKey| match f {
            FrontendKey::V6(k)
                if k.addr_be == addr_of("fd00:96::1".parse::<Ipv6Addr>().unwrap().octets()) =>
            {
                Some("ds/dual:http".to_string())
            }
            FrontendKey::V4(k) if k.addr_be == u32::from(Ipv4Addr::new(10, 96, 6, 1)).to_be() => {
                Some("ds/dual:http".to_string())
            }
            _ => None,
        };
        let flows = tracked(entries, name_of, &ct::DEFAULTS, None, 12 * ct::NS);
        let shown: Vec<(&str, &str, &str, &str)> = flows
            .iter()
            .map(|f| {
                (
                    f.client.as_str(),
                    f.frontend.as_str(),
                    f.backend.as_str(),
                    f.service.as_str(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "10.244.1.2:40000",
                    "10.96.6.1:80",
                    "10.244.2.60:8080",
                    "ds/dual:http"
                ),
                (
                    "[fd00:244:1::2]:41000",
                    "[fd00:96::1]:80",
                    "[fd00:244:2::60]:8080",
                    "ds/dual:http"
                ),
            ]
        );
        assert_eq!(flows[1].idle_s, 2);
        assert_eq!(flows[1].state, "tcp_established");

        // The table's columns stay aligned with long IPv6 addresses: every field
        // starts where its header does.
        let long = "[fd00:1234:5678:9abc:def0:1234:5678:9abc]:65535";
        let mut wide = flows.clone();
        wide[1].client = long.to_string();
        let table = render_table(&wide);
        let lines: Vec<&str> = table.lines().collect();
        let at = |line: &str, field: &str| line.find(field).unwrap();
        for (row, f) in lines[1..3].iter().zip(&wide) {
            assert_eq!(at(row, &f.frontend), at(lines[0], "FRONTEND"), "{table}");
            assert_eq!(at(row, &f.backend), at(lines[0], "BACKEND"), "{table}");
            assert_eq!(at(row, &f.state), at(lines[0], "STATE"), "{table}");
        }
        assert_eq!(lines[3], "2 connections");
    }

    /// Issue 12: `--flush-backend [addr]:port` finds the IPv6 connections of that
    /// backend only (not an IPv4 one whose first word matches, not another port).
    #[test]
    fn flush_backend_finds_ipv6_connections() {
        let backend = sock("[fd00:244:2::60]:8080");
        let mine = connection(
            sock("[fd00:244:1::2]:41000"),
            sock("[fd00:96::1]:80"),
            backend,
        );
        let mut entries = mine.to_vec();
        entries.extend(connection(
            sock("[fd00:244:1::3]:41000"),
            sock("[fd00:96::1]:80"),
            sock("[fd00:244:2::60]:8081"),
        ));
        entries.extend(connection(
            sock("[fd00:244:1::4]:41000"),
            sock("[fd00:96::1]:80"),
            sock("[fd00:244:2::61]:8080"),
        ));
        // IPv4 with the IPv6 backend's first four bytes.
        entries.extend(connection(
            sock("10.244.1.2:40000"),
            sock("10.96.6.1:80"),
            sock("253.0.2.68:8080"),
        ));
        assert_eq!(
            to_backend(entries.clone(), backend),
            [(mine[0].0, mine[1].0)]
        );
        let v4 = sock("10.244.2.60:8080");
        assert_eq!(to_backend(entries, v4), []);
    }
}

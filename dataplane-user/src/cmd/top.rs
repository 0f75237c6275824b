//! `sliceway-agent top`: the busiest frontends, refreshed on a timer, like `top`.
//! Reads the pinned maps (frontends, their names and per-frontend counters) of the
//! running agent; rates are the growth between two reads.

use std::{
    collections::BTreeMap,
    io::Write,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray};
use dataplane_common::{map_name, FrontendCounters, ServiceKey, ServiceName, ServiceValue};

use crate::{
    cmd::inspect::open_pinned,
    compiler::{frontend_addr, is_clusterip_marker},
    kernel::{summed, KernelError, PinDir},
};

/// One frontend's counts at one read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sample {
    service: String,
    counts: FrontendCounters,
}

/// One row of the view.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub frontend: String,
    pub service: String,
    pub connections_per_s: f64,
    pub packets_per_s: f64,
    pub bytes_per_s: f64,
    /// Drops and rejects per second.
    pub refused_per_s: f64,
    pub connections: u64,
}

/// Reads every frontend's counts from the pinned maps.
fn read(pins: &PinDir) -> Result<BTreeMap<(ServiceKey, u32), Sample>, KernelError> {
    let services: BpfHashMap<MapData, ServiceKey, ServiceValue> =
        open_pinned(pins, map_name::SERVICES)?;
    let names: BpfHashMap<MapData, u32, ServiceName> = open_pinned(pins, map_name::SERVICE_NAMES)?;
    let counters: PerCpuArray<MapData, FrontendCounters> =
        open_pinned(pins, map_name::FRONTEND_COUNTERS)?;
    let mut out = BTreeMap::new();
    for (key, value) in services.iter().filter_map(Result::ok) {
        if is_clusterip_marker(&key) {
            continue;
        }
        let Some(counts) = summed(&counters, value.id, FrontendCounters::add) else {
            continue;
        };
        let service = names
            .get(&value.id, 0)
            .map(|n| n.as_str().to_string())
            .unwrap_or_else(|_| "?".into());
        out.insert((key, value.id), Sample { service, counts });
    }
    Ok(out)
}

/// Rows from two reads `elapsed` apart, busiest first (new connections, then
/// packets). A frontend new since the first read, or whose counts went down (its id
/// was given to another frontend), counts from zero.
fn rows(
    before: &BTreeMap<(ServiceKey, u32), Sample>,
    now: &BTreeMap<(ServiceKey, u32), Sample>,
    elapsed: Duration,
) -> Vec<Row> {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let mut out: Vec<Row> = now
        .iter()
        .map(|((key, id), s)| {
            let base = before
                .get(&(*key, *id))
                .filter(|b| b.service == s.service && b.counts.new <= s.counts.new)
                .map(|b| b.counts)
                .unwrap_or_default();
            let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
            Row {
                frontend: frontend_addr(key),
                service: s.service.clone(),
                connections_per_s: rate(s.counts.new, base.new),
                packets_per_s: rate(s.counts.packets, base.packets),
                bytes_per_s: rate(s.counts.bytes, base.bytes),
                refused_per_s: rate(s.counts.drops + s.counts.rejects, base.drops + base.rejects),
                connections: s.counts.new,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.connections_per_s
            .total_cmp(&a.connections_per_s)
            .then(b.packets_per_s.total_cmp(&a.packets_per_s))
            .then(a.frontend.cmp(&b.frontend))
    });
    out
}

/// One screen: a header line and up to `limit` rows.
pub fn render(rows: &[Row], limit: usize, at: &str) -> String {
    let mut s = format!(
        "sliceway-agent top - {at} - {} frontends\n\n{:<24} {:<36} {:>9} {:>10} {:>12} {:>9} {:>10}\n",
        rows.len(),
        "FRONTEND",
        "SERVICE",
        "CONN/S",
        "PKT/S",
        "BYTES/S",
        "REFUSED/S",
        "CONNS"
    );
    for r in rows.iter().take(limit) {
        s.push_str(&format!(
            "{:<24} {:<36} {:>9.1} {:>10.1} {:>12.0} {:>9.1} {:>10}\n",
            r.frontend,
            r.service,
            r.connections_per_s,
            r.packets_per_s,
            r.bytes_per_s,
            r.refused_per_s,
            r.connections
        ));
    }
    s
}

/// Runs the view: a screen every `interval`, `iterations` times (0: until
/// interrupted), `limit` rows each. On a terminal each screen replaces the last.
pub fn run(
    pins: &PinDir,
    interval: Duration,
    iterations: u64,
    limit: usize,
    out: &mut impl Write,
    terminal: bool,
) -> Result<(), TopError> {
    let mut before = read(pins)?;
    let mut last = Instant::now();
    let mut n = 0u64;
    while iterations == 0 || n < iterations {
        std::thread::sleep(interval);
        let now = read(pins)?;
        let elapsed = last.elapsed();
        last = Instant::now();
        let screen = render(&rows(&before, &now, elapsed), limit, &humantime_now());
        if terminal {
            // Home, clear the screen, then the new one.
            write!(out, "\x1b[H\x1b[2J{screen}")?;
        } else {
            writeln!(out, "{screen}")?;
        }
        out.flush()?;
        before = now;
        n += 1;
    }
    Ok(())
}

/// Why `top` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("reading the pinned maps (is an agent running with this --bpffs-dir?)")]
    Maps(#[from] KernelError),
    #[error("writing to the terminal")]
    Write(#[from] std::io::Error),
}

/// The wall-clock time of day, UTC, `HH:MM:SS`.
fn humantime_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let day = secs % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day / 3600,
        (day % 3600) / 60,
        day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(service: &str, new: u64, packets: u64) -> Sample {
        Sample {
            service: service.into(),
            counts: FrontendCounters {
                new,
                packets,
                ..Default::default()
            },
        }
    }

    fn key(port: u16) -> ServiceKey {
        ServiceKey {
            addr_be: u32::from(std::net::Ipv4Addr::new(10, 96, 0, 10)).to_be(),
            port_be: port.to_be(),
            proto: dataplane_common::PROTO_TCP,
            scope: 0,
        }
    }

    #[test]
    fn busiest_first_with_rates_over_the_interval() {
        let before = BTreeMap::from([
            ((key(80), 0), sample("default/web:http", 10, 100)),
            ((key(81), 1), sample("default/api:http", 0, 0)),
            ((key(82), 2), sample("default/old:http", 50, 500)),
        ]);
        let now = BTreeMap::from([
            ((key(80), 0), sample("default/web:http", 12, 120)),
            ((key(81), 1), sample("default/api:http", 10, 30)),
            // Id 2 given to another frontend since: counts from zero.
            ((key(82), 2), sample("default/new:http", 3, 6)),
        ]);
        let r = rows(&before, &now, Duration::from_secs(2));
        let order: Vec<&str> = r.iter().map(|r| r.service.as_str()).collect();
        assert_eq!(
            order,
            ["default/api:http", "default/new:http", "default/web:http"]
        );
        assert_eq!(r[0].connections_per_s, 5.0);
        assert_eq!(r[1].connections_per_s, 1.5);
        assert_eq!(r[2].packets_per_s, 10.0);
        let screen = render(&r, 2, "12:00:00 UTC");
        assert!(screen.contains("3 frontends"), "{screen}");
        assert!(screen.contains("default/api:http"), "{screen}");
        assert!(!screen.contains("default/web:http"), "limited to 2 rows");
    }
}

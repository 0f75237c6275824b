//! The kernel's run statistics of loaded programs (`BPF_ENABLE_STATS`): how often
//! and for how long each program ran, counted by the kernel while a holder keeps
//! them on. They cost every program run two clock reads, so they are on only while
//! someone measures.

use std::{collections::BTreeMap, os::fd::OwnedFd};

use aya::sys::{enable_stats, Stats};

/// Turns the kernel's run statistics on until the returned descriptor is dropped
/// (the kernel counts holders: others' stay as they were). Linux 5.8 or later.
pub fn enable_run_stats() -> std::io::Result<OwnedFd> {
    enable_stats(Stats::RunTime)
        .map_err(|e| std::io::Error::other(format!("turning on the kernel's run statistics: {e}")))
}

/// Runs and nanoseconds spent so far, summed by name, of every loaded program whose
/// name starts with `prefix` (the kernel keeps 15 bytes of a name), in every network
/// namespace. A program that cannot be read is skipped; none found is an empty map.
pub fn program_runs(prefix: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for info in aya::programs::loaded_programs().flatten() {
        let Some(name) = info.name_as_str() else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        let e = out.entry(name.to_string()).or_default();
        e.0 += info.run_count();
        e.1 += info.run_time().as_nanos() as u64;
    }
    out
}

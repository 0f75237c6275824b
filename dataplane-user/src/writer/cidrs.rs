//! The ServiceCIDRs in the kernel: the `SERVICE_CIDRS` and `SERVICE_CIDRS6`
//! longest-prefix-match maps, prefix → 1, kept equal to the compiled prefixes
//! ([`crate::compiler::cidrs`]) by [`CidrWriter`], their only writer. The programs
//! drop new traffic to an address inside them that is no Service's ClusterIP.
//!
//! Written after the map writer's apply: a new Service's ClusterIP marker is in
//! `SERVICES` before a new prefix around it. A prefix the first sync finds that no
//! ServiceCIDR has any more (an earlier run's) is removed.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::compiler::cidrs::ServiceCidrs;

/// The map operations of [`CidrWriter`]: the kernel's maps, or memory in tests.
/// Addresses in network order as the programs read them (`dst_be`).
pub trait CidrOps {
    type Error: std::fmt::Display;
    fn put_cidr(&mut self, prefix_len: u32, addr_be: u32) -> Result<(), Self::Error>;
    fn del_cidr(&mut self, prefix_len: u32, addr_be: u32) -> Result<(), Self::Error>;
    /// Every entry the map holds (what an earlier run left, at the first sync).
    fn cidrs(&self) -> Result<Vec<(u32, u32)>, Self::Error>;
    /// `SERVICE_CIDRS6`.
    fn put_cidr6(&mut self, prefix_len: u32, addr_be: [u32; 4]) -> Result<(), Self::Error>;
    fn del_cidr6(&mut self, prefix_len: u32, addr_be: [u32; 4]) -> Result<(), Self::Error>;
    fn cidrs6(&self) -> Result<Vec<(u32, [u32; 4])>, Self::Error>;
}

/// An IPv4 address as the programs hold it.
pub fn addr_be(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// An IPv6 address as the programs hold it.
pub fn addr6_be(a: Ipv6Addr) -> [u32; 4] {
    dataplane_common::addr_of(a.octets())
}

/// The mirror of both maps and its writes.
#[derive(Debug, Default)]
pub struct CidrWriter {
    /// What the kernel holds: (prefix length, address).
    v4: BTreeSet<(u32, u32)>,
    v6: BTreeSet<(u32, [u32; 4])>,
    listed: bool,
}

impl CidrWriter {
    /// Brings both maps to `cidrs`: new prefixes first, then the stale removed.
    /// Errors are said, not fatal: a prefix not written is tried again at the next
    /// sync, one not removed too.
    pub fn sync<M: CidrOps>(&mut self, cidrs: &ServiceCidrs, ops: &mut M) -> Vec<String> {
        let mut errors = Vec::new();
        if !std::mem::replace(&mut self.listed, true) {
            match ops.cidrs() {
                Ok(found) => self.v4 = found.into_iter().collect(),
                Err(e) => errors.push(format!("listing SERVICE_CIDRS: {e}")),
            }
            match ops.cidrs6() {
                Ok(found) => self.v6 = found.into_iter().collect(),
                Err(e) => errors.push(format!("listing SERVICE_CIDRS6: {e}")),
            }
        }
        let want4: BTreeSet<(u32, u32)> = cidrs
            .v4
            .iter()
            .map(|&(a, len)| (u32::from(len), addr_be(a)))
            .collect();
        let want6: BTreeSet<(u32, [u32; 4])> = cidrs
            .v6
            .iter()
            .map(|&(a, len)| (u32::from(len), addr6_be(a)))
            .collect();
        // Every write's list is taken before the first: the removals are then
        // what was held and is not wanted, as after the writes.
        let put4 = missing(&want4, &self.v4);
        let put6 = missing(&want6, &self.v6);
        let del4 = missing(&self.v4, &want4);
        let del6 = missing(&self.v6, &want6);
        let show4 = |a: u32| Ipv4Addr::from(a.to_ne_bytes()).to_string();
        let show6 = |a: [u32; 4]| crate::compiler::format::ipv6_of(a).to_string();
        step(
            &mut self.v4,
            put4,
            Step::Write,
            |l, a| ops.put_cidr(l, a),
            show4,
            &mut errors,
        );
        step(
            &mut self.v6,
            put6,
            Step::Write,
            |l, a| ops.put_cidr6(l, a),
            show6,
            &mut errors,
        );
        step(
            &mut self.v4,
            del4,
            Step::Remove,
            |l, a| ops.del_cidr(l, a),
            show4,
            &mut errors,
        );
        step(
            &mut self.v6,
            del6,
            Step::Remove,
            |l, a| ops.del_cidr6(l, a),
            show6,
            &mut errors,
        );
        errors
    }

    /// Prefixes held, both families.
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Whether no prefix is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The entries of `a` that `b` lacks.
fn missing<A: Copy + Ord>(a: &BTreeSet<(u32, A)>, b: &BTreeSet<(u32, A)>) -> Vec<(u32, A)> {
    a.difference(b).copied().collect()
}

/// What [`step`] does to the map and to the mirror.
#[derive(Clone, Copy)]
enum Step {
    Write,
    Remove,
}

/// One family's writes or removals: each entry that succeeds joins or leaves the
/// mirror `held`; each that fails is said in `errors`, the prefix shown by `show`.
fn step<A: Copy + Ord, E: std::fmt::Display>(
    held: &mut BTreeSet<(u32, A)>,
    entries: Vec<(u32, A)>,
    what: Step,
    mut op: impl FnMut(u32, A) -> Result<(), E>,
    show: impl Fn(A) -> String,
    errors: &mut Vec<String>,
) {
    for (len, a) in entries {
        match (op(len, a), what) {
            (Ok(()), Step::Write) => {
                held.insert((len, a));
            }
            (Ok(()), Step::Remove) => {
                held.remove(&(len, a));
            }
            (Err(e), Step::Write) => {
                errors.push(format!("writing ServiceCIDR {}/{len}: {e}", show(a)))
            }
            (Err(e), Step::Remove) => {
                errors.push(format!("removing ServiceCIDR {}/{len}: {e}", show(a)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        compiler::cidrs::service_cidrs, model::ServiceCidrInfo, writer::memory_maps::MemoryMaps,
    };

    fn cidrs(list: &[&str]) -> ServiceCidrs {
        service_cidrs(&[ServiceCidrInfo {
            name: "c".into(),
            cidrs: list.iter().map(|c| c.to_string()).collect(),
        }])
        .0
    }

    #[test]
    fn the_maps_follow_the_prefixes_and_a_restart_cleans_what_is_gone() {
        let mut maps = MemoryMaps::default();
        let mut w = CidrWriter::default();
        assert!(w
            .sync(&cidrs(&["10.96.0.0/16", "fd00:96::/112"]), &mut maps)
            .is_empty());
        assert_eq!(
            maps.cidrs,
            [(16, u32::from_ne_bytes([10, 96, 0, 0]))].into()
        );
        assert_eq!(
            maps.cidrs6,
            [(112, addr6_be("fd00:96::".parse().unwrap()))].into()
        );
        // One more, one gone.
        assert!(w
            .sync(&cidrs(&["10.96.0.0/16", "10.97.0.0/24"]), &mut maps)
            .is_empty());
        assert_eq!(maps.cidrs.len(), 2);
        assert!(maps.cidrs6.is_empty());
        // The same again writes nothing.
        let ops = maps.cidr_ops;
        w.sync(&cidrs(&["10.96.0.0/16", "10.97.0.0/24"]), &mut maps);
        assert_eq!(maps.cidr_ops, ops);
        // A restarted agent finds the maps as they were and removes what no
        // ServiceCIDR has now.
        let mut again = CidrWriter::default();
        assert!(again.sync(&cidrs(&["10.97.0.0/24"]), &mut maps).is_empty());
        assert_eq!(
            maps.cidrs,
            [(24, u32::from_ne_bytes([10, 97, 0, 0]))].into()
        );
        assert_eq!(again.len(), 1);
        // None: the maps are empty, nothing is dropped.
        assert!(again.sync(&ServiceCidrs::default(), &mut maps).is_empty());
        assert!(maps.cidrs.is_empty() && again.is_empty());
    }
}

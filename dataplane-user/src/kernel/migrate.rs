//! Migration from the previous pinned layout (v1, `BASE/v1/`) to this one, without a
//! failed connection.
//!
//! A one-time copy of conntrack at agent start is not enough: the datapath itself
//! writes conntrack, so connections made between the copy and the switch of programs
//! are lost, and links are switched one interface at a time while a connection's
//! packets enter on two (the client's and the backend's). That is the disruption of
//! Cilium's upgrades with incompatible maps (cilium/cilium#28894,
//! https://github.com/cilium/cilium/issues/28894: a one-time migration at agent
//! start interrupts traffic, and does not fit maps the datapath writes). Here:
//!
//! 1. The object is loaded with `CT_V1` over v1's pinned conntrack (`load.rs`), and
//!    the first sync writes the service maps from the compiler, as at any start.
//! 2. The bridge program is loaded (the verifier's time comes before the copy, not
//!    between the copy and the switch) and `BACKEND_IDS_V1` maps v1's backend ids to
//!    this agent's. Every live v1 forward entry becomes a v2 connection (both paired
//!    entries, the backend kept, state established or replied, this agent's frontend
//!    and backend ids); v1 had no session affinity or other state a client would
//!    notice losing.
//! 3. Every pinned v1 tcx link is switched in place (`BPF_LINK_UPDATE`, atomic: no
//!    packet sees no program) to `sliceway_bridge`, which reads and writes both
//!    layouts' conntrack (see the kernel's `bridge.rs`), so whatever mix of v1 and
//!    bridge programs the interfaces run, both ends of a connection know it.
//!    A link update was chosen over attaching the new program beside the old one
//!    and detaching the old: tcx runs the first program that gives a verdict, so two
//!    attached programs never share the work, and detaching is one more step per
//!    interface at which the interfaces disagree.
//! 4. Once no v1 program runs, step 2 again for what v1 made meanwhile; the links are
//!    pinned under this layout, and the agent's usual attach switches each to
//!    `sliceway_tc` (both read the same v2 maps, so the order does not matter).
//! 5. The v1 directory is removed (its maps go with their last user).
//!
//! A v1 agent on a kernel without tcx pinned no links: there is nothing to switch
//! (its connections are copied all the same; not tested).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapInfo},
    programs::{
        links::{FdLink, PinnedLink},
        tc::SchedClassifierLink,
        SchedClassifier,
    },
};
use dataplane_common::{
    map_name,
    v1::{self, FlowKey, NatTarget},
    Backend, CtEntry, CtKey, ServiceKey, CT_FORWARD, PROTO_TCP, PROTO_UDP,
};
use tracing::{info, warn};

use super::{
    pin::{remove_pins, unpin},
    Datapath, KernelError, PinDir,
};

/// The TC program that bridges the two layouts while links are switched.
pub const BRIDGE_PROGRAM: &str = "sliceway_bridge";

pub use dataplane_common::v1::UNKNOWN_ID;

/// A v1 layout found beside this one.
#[derive(Debug)]
pub(super) struct V1Layout {
    pub dir: PathBuf,
    /// v1's pinned conntrack, if it has the v1 key and value sizes.
    pub conntrack: Option<PathBuf>,
}

impl V1Layout {
    /// The v1 directory under `pins`' base, if there is one. A conntrack pin of other
    /// sizes is reported and left out (its connections cannot be read).
    pub fn find(pins: &PinDir) -> Option<Self> {
        let dir = pins.layout_dir(v1::LAYOUT_VERSION);
        if !dir.is_dir() {
            return None;
        }
        let path = dir.join(map_name::CONNTRACK);
        let conntrack = match MapInfo::from_pin(&path) {
            Ok(info)
                if (info.key_size() as usize, info.value_size() as usize)
                    == (size_of::<FlowKey>(), size_of::<NatTarget>()) =>
            {
                Some(path)
            }
            Ok(info) => {
                warn!(
                    path = %path.display(),
                    key = info.key_size(),
                    value = info.value_size(),
                    "the v1 conntrack map has sizes v1 never had; its connections are not \
                     migrated (they pick a backend again), the rest of the migration goes on"
                );
                None
            }
            Err(e) => {
                info!(path = %path.display(), "no v1 conntrack map to migrate ({e})");
                None
            }
        };
        Some(Self { dir, conntrack })
    }
}

/// What one copy of v1 conntrack did, in connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyCounts {
    /// Written to v2 conntrack (both entries).
    pub copied: u64,
    /// Already in v2 (copied before, or taken over by `sliceway_bridge`).
    pub present: u64,
    /// v2 has a newer connection on the same tuple: the v1 one had ended.
    pub superseded: u64,
    /// The reply tuple belongs to another connection (in v1, its reverse entry named
    /// another frontend: only one of them got replies; or in v2).
    pub clashed: u64,
    /// Entries that could not be read or make no sense (direction, protocol).
    pub unreadable: u64,
    /// Writing to v2 conntrack failed.
    pub failed: u64,
}

/// What the whole migration did.
#[derive(Clone, Debug, Default)]
pub struct Migration {
    pub before_switch: CopyCounts,
    pub after_switch: CopyCounts,
    /// Interfaces whose v1 link now runs this agent's program (pinned under v2).
    pub links: Vec<String>,
    /// v1 links of interfaces that no longer exist: unpinned.
    pub defunct_links: Vec<String>,
}

impl Datapath {
    /// This agent's backend ids by (address, port, protocol), from its BACKENDS map.
    fn backend_ids_by_address(&self) -> HashMap<(u32, u16, u8), u32> {
        self.maps
            .backends
            .iter()
            .filter_map(Result::ok)
            .map(|(id, b)| ((b.addr_be, b.port_be, b.proto), id))
            .collect()
    }

    /// Whether a v1 layout waits to be migrated (after the first sync).
    pub fn migration_pending(&self) -> bool {
        self.v1.is_some()
    }

    /// Steps 2 to 4 of the module's doc: copies v1 conntrack, switches every v1 link
    /// to the bridge, copies again and pins the links under this layout. Called after
    /// the first sync and before the agent attaches; `finish_migration` follows the
    /// attach. An error leaves the v1 directory in place (the bridge or the v1
    /// program keeps translating), for the next start to try again.
    pub fn migrate_from_v1(&mut self) -> Result<Migration, KernelError> {
        let Some(v1) = &self.v1 else {
            return Ok(Migration::default());
        };
        let (dir, has_ct) = (v1.dir.clone(), v1.conntrack.is_some());
        let pins = self.pins.clone().ok_or_else(|| KernelError::Pin {
            path: dir.clone(),
            reason: "a v1 layout to migrate but no pin directory".into(),
        })?;
        let mut out = Migration::default();
        // Without v1 links (a v1 agent on a kernel without tcx pinned none) there is
        // nothing to switch, and the bridge is not loaded. It is loaded before the
        // first copy, so that the verifier's time does not stand between the copy
        // and the switch.
        let v1_links = super::pin::linked_interfaces_in(&dir);
        if !v1_links.is_empty() {
            let bridge: &mut SchedClassifier = self
                .ebpf
                .program_mut(BRIDGE_PROGRAM)
                .ok_or(KernelError::MissingProgram(BRIDGE_PROGRAM))?
                .try_into()?;
            bridge.load()?;
        }
        if !v1_links.is_empty() {
            self.write_backend_ids(&dir);
        }
        if has_ct {
            out.before_switch = self.copy_v1_conntrack();
            log_copy("before switching links", &out.before_switch);
        }
        for iface in v1_links {
            let bridge: &mut SchedClassifier = self
                .ebpf
                .program_mut(BRIDGE_PROGRAM)
                .ok_or(KernelError::MissingProgram(BRIDGE_PROGRAM))?
                .try_into()?;
            let path = dir.join(format!("{}{iface}", super::pin::LINK_PREFIX));
            let pin_err = |reason: String| KernelError::Pin {
                path: path.clone(),
                reason,
            };
            let old = match PinnedLink::from_pin(&path) {
                Ok(old) => old,
                Err(e) => {
                    warn!(path = %path.display(), "a v1 link pin that cannot be opened ({e}); removed");
                    unpin(&path).map_err(|e| pin_err(e.to_string()))?;
                    continue;
                }
            };
            let link = SchedClassifierLink::try_from(FdLink::from(old))
                .map_err(|e| pin_err(format!("taking over the v1 link: {e}")))?;
            match bridge.attach_to_link(link) {
                // The pin holds the link; the program need not.
                Ok(id) => drop(bridge.take_link(id)),
                Err(e) => {
                    info!(interface = %iface, "the v1 link belongs to an interface that no longer exists ({e}); removed");
                    unpin(&path).map_err(|e| pin_err(e.to_string()))?;
                    out.defunct_links.push(iface);
                    continue;
                }
            }
            out.links.push(iface);
        }
        info!(
            links = out.links.len(),
            defunct = out.defunct_links.len(),
            "v1 links switched to the bridge program in place"
        );
        if has_ct {
            out.after_switch = self.copy_v1_conntrack();
            log_copy("after switching links", &out.after_switch);
        }
        // Pinned under this layout, the agent's attach finds them and switches each to
        // `sliceway_tc` in place (or, on the TC-filter path, removes them once the
        // filters are in).
        for iface in &out.links {
            let from = dir.join(format!("{}{iface}", super::pin::LINK_PREFIX));
            let to = pins.link(iface);
            let pin_err = |reason: String| KernelError::Pin {
                path: to.clone(),
                reason,
            };
            let link = PinnedLink::from_pin(&from)
                .map_err(|e| pin_err(format!("reopening the v1 link: {e}")))?;
            FdLink::from(link)
                .pin(&to)
                .map_err(|e| pin_err(e.to_string()))?;
            unpin(&from).map_err(|e| pin_err(e.to_string()))?;
        }
        Ok(out)
    }

    /// Leaves the v1 layout as it is (after a failed migration): the agent goes on
    /// without migrating, the next start tries again.
    pub fn keep_v1(&mut self) {
        self.v1 = None;
    }

    /// Step 5: removes the v1 directory and lets go of what only the migration used.
    pub fn finish_migration(&mut self) -> Result<(), KernelError> {
        let Some(v1) = self.v1.take() else {
            return Ok(());
        };
        remove_pins(&v1.dir).map_err(|e| KernelError::Pin {
            path: v1.dir.clone(),
            reason: format!("removing the v1 pins: {e}"),
        })?;
        drop(self.ebpf.take_map(map_name::CT_V1));
        drop(self.ebpf.take_map(map_name::BACKEND_IDS_V1));
        if let Some(p) = self.ebpf.program_mut(BRIDGE_PROGRAM) {
            if let Ok(p) = <&mut SchedClassifier>::try_from(p) {
                // A link that still runs it (an interface this agent failed to attach
                // to) keeps it loaded in the kernel.
                let _ = p.unload();
            }
        }
        info!(dir = %v1.dir.display(), "removed the v1 layout's pins");
        Ok(())
    }

    /// Fills `BACKEND_IDS_V1` (v1's backend id → this agent's, by address) from v1's
    /// pinned backends, for the connections the bridge takes from v1 conntrack. A v1
    /// backend this agent does not have is left out: the bridge gives its UDP flows
    /// an unknown id (they pick again), TCP connections keep it regardless.
    fn write_backend_ids(&mut self, dir: &Path) {
        let path = dir.join(map_name::BACKENDS);
        let old: BpfHashMap<MapData, u32, Backend> = match MapData::from_pin(&path)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                BpfHashMap::try_from(aya::maps::Map::HashMap(m)).map_err(|e| e.to_string())
            }) {
            Ok(m) => m,
            Err(e) => {
                warn!(
                    path = %path.display(),
                    "v1 backends cannot be read ({e}); UDP flows the bridge takes from v1 \
                     pick a backend again"
                );
                return;
            }
        };
        let mine = self.backend_ids_by_address();
        let Some(map) = self.ebpf.map_mut(map_name::BACKEND_IDS_V1) else {
            return;
        };
        let Ok(mut ids) = BpfHashMap::<&mut MapData, u32, u32>::try_from(map) else {
            return;
        };
        let (mut mapped, mut unknown, mut failed) = (0u64, 0u64, 0u64);
        for entry in old.iter() {
            let Ok((v1_id, b)) = entry else {
                failed += 1;
                continue;
            };
            match mine.get(&(b.addr_be, b.port_be, b.proto)) {
                Some(id) if ids.insert(v1_id, id, 0).is_ok() => mapped += 1,
                Some(_) => failed += 1,
                None => unknown += 1,
            }
        }
        info!(
            mapped,
            unknown, failed, "v1 backend ids mapped to this agent's for the bridge program"
        );
    }

    /// Writes every live v1 connection into v2 conntrack (see [`CopyCounts`]).
    fn copy_v1_conntrack(&mut self) -> CopyCounts {
        let mut counts = CopyCounts::default();
        let Some(map) = self.ebpf.map(map_name::CT_V1) else {
            return counts;
        };
        let old: BpfHashMap<&MapData, FlowKey, NatTarget> = match BpfHashMap::try_from(map) {
            Ok(m) => m,
            Err(e) => {
                warn!(
                    "the v1 conntrack map cannot be read ({e}); its connections are not migrated"
                );
                return counts;
            }
        };
        let entries: Vec<_> = old
            .iter()
            .filter_map(|r| match r {
                Ok(kv) => Some(kv),
                Err(_) => {
                    counts.unreadable += 1;
                    None
                }
            })
            .collect();
        let v1_entries: HashMap<FlowKey, NatTarget> = entries.iter().copied().collect();
        let frontends: HashMap<ServiceKey, u32> = self
            .maps
            .services
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| (k, v.id))
            .collect();
        let backends = self.backend_ids_by_address();
        let now = crate::writer::conntrack::now_ns();
        let mut first_error = None;
        for (key, target) in entries {
            if target.dir == v1::CT_REVERSE {
                continue;
            }
            if target.dir != v1::CT_FORWARD || !matches!(key.proto, PROTO_TCP | PROTO_UDP) {
                counts.unreadable += 1;
                continue;
            }
            let plan = plan_copy(&key, &target, &v1_entries, &frontends, &backends, now);
            let Some((fwd_key, forward, reply, reverse)) = plan else {
                counts.clashed += 1;
                continue;
            };
            match self.conntrack.get(&fwd_key, 0) {
                Ok(e) if e.dir == CT_FORWARD && e.pair == reply => {
                    counts.present += 1;
                    continue;
                }
                Ok(_) => {
                    counts.superseded += 1;
                    continue;
                }
                Err(_) => {}
            }
            if let Ok(r) = self.conntrack.get(&reply, 0) {
                if r.pair != fwd_key {
                    counts.clashed += 1;
                    continue;
                }
            }
            // Reverse first, as the program does for a new connection.
            let written = self
                .conntrack
                .insert(reply, reverse, 0)
                .and_then(|()| self.conntrack.insert(fwd_key, forward, 0));
            match written {
                Ok(()) => counts.copied += 1,
                Err(e) => {
                    counts.failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            warn!(
                failed = counts.failed,
                "writing migrated connections to conntrack failed ({e}); those connections \
                 pick a backend again at their next packet"
            );
        }
        counts
    }
}

/// The v2 pair of a v1 forward entry `key` → `target`: forward key and entry, reverse
/// key and entry. `None` if v1's reverse entry of that reply tuple names another
/// frontend (two connections shared a reply tuple in v1; the other got the replies).
pub fn plan_copy(
    key: &FlowKey,
    target: &NatTarget,
    v1_entries: &HashMap<FlowKey, NatTarget>,
    frontends: &HashMap<ServiceKey, u32>,
    backends: &HashMap<(u32, u16, u8), u32>,
    now_ns: u64,
) -> Option<(CtKey, CtEntry, CtKey, CtEntry)> {
    let reply_v1 = FlowKey {
        src_be: target.addr_be,
        dst_be: key.src_be,
        sport_be: target.port_be,
        dport_be: key.sport_be,
        proto: key.proto,
        _pad: [0; 3],
    };
    if let Some(r) = v1_entries.get(&reply_v1) {
        if r.dir == v1::CT_REVERSE && (r.addr_be, r.port_be) != (key.dst_be, key.dport_be) {
            return None;
        }
    }
    let fwd_key = key.to_v2();
    let reply = v1::reply_key(key, target);
    let (state, flags) = v1::adopted_state(key.proto);
    let frontend = ServiceKey {
        addr_be: key.dst_be,
        port_be: key.dport_be,
        proto: key.proto,
        scope: 0,
    };
    let service_id = frontends.get(&frontend).copied().unwrap_or(UNKNOWN_ID);
    let backend_id = backends
        .get(&(target.addr_be, target.port_be, key.proto))
        .copied()
        .unwrap_or(UNKNOWN_ID);
    let [(_, mut forward), (_, mut reverse)] =
        crate::writer::conntrack::connection_entries(fwd_key, reply, state, now_ns);
    for e in [&mut forward, &mut reverse] {
        e.flags = flags;
        e.service_id = service_id;
        e.backend_id = backend_id;
    }
    Some((fwd_key, forward, reply, reverse))
}

fn log_copy(when: &str, c: &CopyCounts) {
    info!(
        copied = c.copied,
        present = c.present,
        superseded = c.superseded,
        clashed = c.clashed,
        unreadable = c.unreadable,
        failed = c.failed,
        "v1 conntrack copied to this layout ({when})"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_common::{
        ct::{flag, state},
        CT_REVERSE,
    };

    fn v4(s: &str) -> u32 {
        u32::from(s.parse::<std::net::Ipv4Addr>().unwrap()).to_be()
    }

    /// A v1 connection client 10.0.0.1:40000 → 10.96.0.1:80 on backend
    /// 10.244.0.5:8080, with its reverse entry.
    fn v1_connection(proto: u8) -> (FlowKey, NatTarget, FlowKey, NatTarget) {
        let key = FlowKey {
            src_be: v4("10.0.0.1"),
            dst_be: v4("10.96.0.1"),
            sport_be: 40000u16.to_be(),
            dport_be: 80u16.to_be(),
            proto,
            _pad: [0; 3],
        };
        let target = NatTarget {
            addr_be: v4("10.244.0.5"),
            port_be: 8080u16.to_be(),
            dir: v1::CT_FORWARD,
            service_id: 7,
            backend_id: 9,
        };
        let rkey = FlowKey {
            src_be: target.addr_be,
            dst_be: key.src_be,
            sport_be: target.port_be,
            dport_be: key.sport_be,
            proto,
            _pad: [0; 3],
        };
        let rtarget = NatTarget {
            addr_be: key.dst_be,
            port_be: key.dport_be,
            dir: v1::CT_REVERSE,
            service_id: 7,
            backend_id: 9,
        };
        (key, target, rkey, rtarget)
    }

    #[test]
    fn an_established_tcp_connection_stays_established_on_its_backend_with_this_agents_ids() {
        let (key, target, rkey, rtarget) = v1_connection(PROTO_TCP);
        let v1_entries = HashMap::from([(key, target), (rkey, rtarget)]);
        let frontends = HashMap::from([(
            ServiceKey {
                addr_be: key.dst_be,
                port_be: key.dport_be,
                proto: PROTO_TCP,
                scope: 0,
            },
            3,
        )]);
        let backends = HashMap::from([((target.addr_be, target.port_be, PROTO_TCP), 12)]);
        let (fk, f, rk, r) =
            plan_copy(&key, &target, &v1_entries, &frontends, &backends, 1000).unwrap();
        assert_eq!(
            fk,
            CtKey::v4(key.src_be, key.dst_be, key.sport_be, key.dport_be, 6)
        );
        assert_eq!(
            rk,
            CtKey::v4(target.addr_be, key.src_be, target.port_be, key.sport_be, 6)
        );
        assert_eq!(
            (f.pair, f.dir, r.pair, r.dir),
            (rk, CT_FORWARD, fk, CT_REVERSE)
        );
        assert_eq!((f.state, f.flags), (state::TCP_ESTABLISHED, flag::REPLIED));
        assert_eq!((f.service_id, f.backend_id, f.last_seen_ns), (3, 12, 1000));
    }

    #[test]
    fn a_udp_flow_whose_backend_is_gone_gets_an_unknown_backend_id_and_picks_again() {
        let (key, target, _, _) = v1_connection(PROTO_UDP);
        let (_, f, _, _) = plan_copy(
            &key,
            &target,
            &HashMap::new(),
            &HashMap::new(),
            &HashMap::new(),
            5,
        )
        .unwrap();
        assert_eq!(
            (f.state, f.service_id, f.backend_id),
            (state::UDP_REPLIED, UNKNOWN_ID, UNKNOWN_ID)
        );
    }

    #[test]
    fn a_connection_whose_v1_replies_went_to_another_frontend_is_not_copied() {
        let (key, target, rkey, mut rtarget) = v1_connection(PROTO_TCP);
        rtarget.addr_be = v4("10.96.0.2");
        let v1_entries = HashMap::from([(key, target), (rkey, rtarget)]);
        assert!(plan_copy(
            &key,
            &target,
            &v1_entries,
            &HashMap::new(),
            &HashMap::new(),
            0
        )
        .is_none());
    }
}

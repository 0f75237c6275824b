//! Service lookup and backend choice for a new flow: frontend by (VIP, port, proto),
//! then session affinity or the flow hash for the slot, backend by id.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use dataplane_common::{
    clusterip_marker, flow_hash, stat, AffinityKey, AffinityValue, Backend, ServiceKey,
    ServiceValue, SlotKey, SVC_F_AFFINITY,
};

use crate::{counters::Exit, maps, packet::Flow, tc::DROP};

/// The frontend the packet is addressed to, if any.
#[inline(always)]
pub fn frontend(flow: &Flow) -> Option<ServiceValue> {
    maps::service(&ServiceKey {
        addr_be: flow.dst_be,
        port_be: flow.dport_be,
        proto: flow.proto,
        _pad: 0,
    })
}

/// Whether the packet's destination is a ClusterIP (on a port or protocol no
/// frontend has, since [`frontend`] found none).
#[inline(always)]
pub fn is_clusterip(flow: &Flow) -> bool {
    maps::service(&clusterip_marker(flow.dst_be)).is_some()
}

/// A backend chosen for a new flow, and what session affinity must remember of it.
pub struct Picked {
    pub backend_id: u32,
    pub backend: Backend,
    /// With session affinity: the entry to write once the flow is tracked.
    pub remember: Option<(AffinityKey, AffinityValue)>,
}

/// Picks a backend for a new flow to `service` (which has at least one slot): the
/// client's backend if session affinity remembers one seen within the timeout and
/// still in its slot, else slot `flow_hash % count`. A slot or backend the frontend
/// published but the maps do not hold drops (a packet never reaches a VIP
/// untranslated).
#[inline(always)]
pub fn pick(flow: &Flow, service: &ServiceValue) -> Result<Picked, Exit> {
    let sticky = service.flags & SVC_F_AFFINITY != 0;
    let key = AffinityKey {
        client: [flow.src_be, 0, 0, 0],
        service_id: service.id,
    };
    let now = if sticky {
        // SAFETY: a plain helper call.
        unsafe { bpf_ktime_get_ns() }
    } else {
        0
    };
    let remembered = if sticky {
        remembered(&key, now, service)
    } else {
        None
    };
    let (slot, backend_id) = match remembered {
        Some(found) => found,
        None => {
            let hash = flow_hash(
                flow.src_be,
                flow.dst_be,
                flow.sport_be,
                flow.dport_be,
                flow.proto,
            );
            let slot = hash % service.count;
            let id = maps::slot(&SlotKey {
                service_id: service.id,
                slot,
            })
            .ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
            (slot, id)
        }
    };
    let backend = maps::backend(backend_id).ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
    Ok(Picked {
        backend_id,
        backend,
        remember: sticky.then_some((
            key,
            AffinityValue {
                backend_id,
                slot,
                last_ns: now,
            },
        )),
    })
}

/// The slot and backend session affinity gave this client, if it connected within
/// the timeout and that backend is still in that slot.
#[inline(always)]
fn remembered(key: &AffinityKey, now: u64, service: &ServiceValue) -> Option<(u32, u32)> {
    let seen = maps::affinity(key)?;
    let timeout_ns = service.affinity_timeout_s as u64 * 1_000_000_000;
    if now.wrapping_sub(seen.last_ns) >= timeout_ns || seen.slot >= service.count {
        return None;
    }
    let id = maps::slot(&SlotKey {
        service_id: service.id,
        slot: seen.slot,
    })?;
    (id == seen.backend_id).then_some((seen.slot, id))
}

/// Remembers a client's backend for session affinity (best effort: without the
/// entry the next connection is hashed anew).
#[inline(always)]
pub fn remember(entry: &(AffinityKey, AffinityValue)) {
    let _ = maps::AFFINITY.insert(entry.0, entry.1, 0);
}

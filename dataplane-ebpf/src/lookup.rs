//! Service lookup and backend choice for a new connection: frontend by (VIP, port,
//! proto), slot by flow hash, backend by id.

use dataplane_common::{flow_hash, stat, Backend, ServiceKey, ServiceValue, SlotKey};

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

/// Picks a backend for a new connection to `service`: slot `flow_hash % count`. A
/// frontend without backends drops (a packet never reaches a VIP untranslated), and so
/// does a slot or backend the frontend published but the maps do not hold.
#[inline(always)]
pub fn pick(flow: &Flow, service: &ServiceValue) -> Result<(u32, Backend), Exit> {
    if service.count == 0 {
        return Err((DROP, stat::DROP_NO_BACKEND));
    }
    let hash = flow_hash(
        flow.src_be,
        flow.dst_be,
        flow.sport_be,
        flow.dport_be,
        flow.proto,
    );
    let slot = SlotKey {
        service_id: service.id,
        slot: hash % service.count,
    };
    let backend_id = maps::slot(&slot).ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
    let backend = maps::backend(backend_id).ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
    Ok((backend_id, backend))
}

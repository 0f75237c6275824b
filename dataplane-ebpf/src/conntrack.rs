//! Connection tracking: which backend a flow was given (forward entry, keyed client →
//! VIP) and which frontend its replies come back as (reverse entry, keyed backend →
//! client).

use dataplane_common::{
    stat, Backend, FlowKey, NatTarget, ServiceValue, CT_FORWARD, CT_REVERSE, PROTO_TCP,
};

use crate::{
    counters::Exit,
    maps::{self, CONNTRACK},
    packet::Flow,
    tc::DROP,
};

/// The conntrack key of a packet as it arrives.
#[inline(always)]
pub fn key_of(flow: &Flow) -> FlowKey {
    FlowKey {
        src_be: flow.src_be,
        dst_be: flow.dst_be,
        sport_be: flow.sport_be,
        dport_be: flow.dport_be,
        proto: flow.proto,
        _pad: [0; 3],
    }
}

/// The tracked backend of a packet to a frontend, if the flow is tracked and keeps it.
#[inline(always)]
pub fn forward(flow: &Flow, key: &FlowKey) -> Option<NatTarget> {
    let ct = maps::conntrack(key)?;
    (ct.dir == CT_FORWARD && keep_tracked(flow, &ct)).then_some(ct)
}

/// The frontend a reply from a backend is rewritten back to, if the flow is tracked.
#[inline(always)]
pub fn reverse(key: &FlowKey) -> Option<NatTarget> {
    maps::conntrack(key).filter(|ct| ct.dir == CT_REVERSE)
}

/// Records a new flow: the reverse entry first (a reply can only exist once the
/// forward packet went out), then the forward one.
#[inline(always)]
pub fn track(
    flow: &Flow,
    key: &FlowKey,
    service: &ServiceValue,
    backend_id: u32,
    backend: &Backend,
) -> Result<(), Exit> {
    let forward = NatTarget {
        addr_be: backend.addr_be,
        port_be: backend.port_be,
        dir: CT_FORWARD,
        service_id: service.id,
        backend_id,
    };
    let reverse_key = FlowKey {
        src_be: backend.addr_be,
        dst_be: flow.src_be,
        sport_be: backend.port_be,
        dport_be: flow.sport_be,
        proto: flow.proto,
        _pad: [0; 3],
    };
    let reverse = NatTarget {
        addr_be: flow.dst_be,
        port_be: flow.dport_be,
        dir: CT_REVERSE,
        service_id: service.id,
        backend_id,
    };
    CONNTRACK
        .insert(reverse_key, reverse, 0)
        .map_err(|_| (DROP, stat::DROP_CONNTRACK))?;
    CONNTRACK
        .insert(key, forward, 0)
        .map_err(|_| (DROP, stat::DROP_CONNTRACK))
}

/// Whether a packet of a tracked flow stays with the tracked backend. A TCP SYN
/// without ACK starts a new connection on a reused tuple, and a UDP flow whose backend
/// is gone moves on (kube-proxy clears UDP conntrack of removed endpoints); otherwise
/// the flow keeps its backend, also when the endpoint left the slice.
#[inline(always)]
fn keep_tracked(flow: &Flow, ct: &NatTarget) -> bool {
    if flow.proto == PROTO_TCP {
        return !flow.syn_only;
    }
    match maps::backend(ct.backend_id) {
        Some(b) => b.addr_be == ct.addr_be && b.port_be == ct.port_be,
        None => false,
    }
}

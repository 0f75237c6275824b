//! Service lookup and backend choice for a new connection: frontend by (VIP, port,
//! proto), then session affinity or the flow hash for the slot, backend by id.

use dataplane_common::{
    clusterip_marker, clusterip_marker6, stat, AffinityKey, AffinityValue, Backend, Backend6,
    ServiceKey, ServiceKey6, ServiceValue, SlotKey, PROTO_SCTP, SCOPE_ANY, SCOPE_EXTERNAL,
    SVC_F_AFFINITY, SVC_F_DSR, SVC_F_MASQ_PODS,
};

use crate::{conntrack, counters::Exit, maps, packet::Flow, tc::DROP, v6::Flow6};

/// Session affinity's client for connections the node's own sockets open (socket
/// programs, before the kernel picks a source address): the node is one client, as
/// it is to kube-proxy, whose rules see the node's address as the source.
pub const NODE_CLIENT: u32 = 0;

/// The key of the frontend the packet is addressed to (for everyone).
#[inline(always)]
pub fn frontend_key(flow: &Flow) -> ServiceKey {
    ServiceKey {
        addr_be: flow.dst_be,
        port_be: flow.dport_be,
        proto: flow.proto,
        scope: SCOPE_ANY,
    }
}

/// The frontend the packet is addressed to, if any.
#[inline(always)]
pub fn frontend(flow: &Flow) -> Option<ServiceValue> {
    maps::service(&frontend_key(flow))
}

/// The frontend a packet from outside the node is addressed to, and how its client
/// is translated (`conntrack::NAT_*`): the frontend's external entry if it has one (a
/// Service with `externalTrafficPolicy: Local`: this node's endpoints, the client's
/// address kept), else its entry for every client, masqueraded (kube-proxy's
/// `KUBE-EXT-*` chain marks such traffic for masquerade: the backend, maybe on
/// another node, must answer through this node, which translates the reply back), or
/// with direct server return where the frontend says so (`crate::dsr`; not SCTP,
/// whose ports take a tail call of their own).
#[inline(always)]
pub fn frontend_external(flow: &Flow) -> Option<(ServiceValue, u8)> {
    let key = ServiceKey {
        scope: SCOPE_EXTERNAL,
        ..frontend_key(flow)
    };
    if let Some(local) = maps::service(&key) {
        return Some((local, conntrack::NAT_KEEP));
    }
    frontend(flow).map(|any| {
        let dsr = any.flags & SVC_F_DSR != 0 && flow.proto != PROTO_SCTP;
        let nat = if dsr {
            conntrack::NAT_DSR
        } else {
            conntrack::NAT_MASQUERADE
        };
        (any, nat)
    })
}

/// How a pod interface's new connection to `service` is translated: masqueraded to
/// the node's address when the frontend is an external address of a Service with
/// `externalTrafficPolicy: Cluster` (`SVC_F_MASQ_PODS`: kube-proxy's external chain
/// masquerades every connection, pods' too), or when it is a ClusterIP and
/// `MASQ_SOURCES` says so for its source (kube-proxy's `--masquerade-all`, and a
/// local detector's "not local": the nftables proxier's `masquerade all clusterIP
/// traffic` and `IfNotLocalNFT` rules of the service chain,
/// https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go);
/// else the client's address is kept. The flag first, then the trie: empty, it
/// answers at once.
#[inline(always)]
pub fn pod_nat(flow: &Flow, service: &ServiceValue) -> u8 {
    if service.flags & SVC_F_MASQ_PODS != 0
        || (maps::masquerades(flow.src_be) && is_clusterip(flow))
    {
        conntrack::NAT_MASQUERADE
    } else {
        conntrack::NAT_KEEP
    }
}

/// [`pod_nat`] for IPv6.
#[inline(always)]
pub fn pod_nat6(flow: &Flow6, service: &ServiceValue) -> u8 {
    if service.flags & SVC_F_MASQ_PODS != 0
        || (maps::masquerades6(flow.src_be) && is_clusterip6(flow))
    {
        conntrack::NAT_MASQUERADE
    } else {
        conntrack::NAT_KEEP
    }
}

/// Whether the packet's destination is a ClusterIP (on a port or protocol no
/// frontend has, since [`frontend`] found none).
#[inline(always)]
pub fn is_clusterip(flow: &Flow) -> bool {
    maps::service(&clusterip_marker(flow.dst_be)).is_some()
}

/// Whether the packet's destination is an unallocated ClusterIP: inside one of the
/// cluster's ServiceCIDRs, and the ClusterIP of no Service. Never without a
/// ServiceCIDR (the trie is empty, and the ClusterIP marker is not looked up).
#[inline(always)]
pub fn is_unallocated(flow: &Flow) -> bool {
    maps::in_service_cidr(flow.dst_be) && !is_clusterip(flow)
}

/// The key of the IPv6 frontend the packet is addressed to (for everyone).
#[inline(always)]
pub fn frontend_key6(flow: &Flow6) -> ServiceKey6 {
    ServiceKey6 {
        addr_be: flow.dst_be,
        port_be: flow.dport_be,
        proto: flow.proto,
        scope: SCOPE_ANY,
    }
}

/// [`frontend_external`] for IPv6: direct server return's frontend goes in a
/// destination options header (`crate::v6::dsr`) instead of an IPv4 option; SCTP
/// is masqueraded, as over IPv4.
#[inline(always)]
pub fn frontend_external6(flow: &Flow6) -> Option<(ServiceValue, u8)> {
    let key = ServiceKey6 {
        scope: SCOPE_EXTERNAL,
        ..frontend_key6(flow)
    };
    if let Some(local) = maps::service6(&key) {
        return Some((local, conntrack::NAT_KEEP));
    }
    maps::service6(&frontend_key6(flow)).map(|any| {
        let dsr = any.flags & SVC_F_DSR != 0 && flow.proto != PROTO_SCTP;
        let nat = if dsr {
            conntrack::NAT_DSR
        } else {
            conntrack::NAT_MASQUERADE
        };
        (any, nat)
    })
}

/// [`is_clusterip`] for IPv6.
#[inline(always)]
pub fn is_clusterip6(flow: &Flow6) -> bool {
    maps::service6(&clusterip_marker6(flow.dst_be)).is_some()
}

/// [`is_unallocated`] for IPv6.
#[inline(always)]
pub fn is_unallocated6(flow: &Flow6) -> bool {
    maps::in_service_cidr6(flow.dst_be) && !is_clusterip6(flow)
}

/// A backend chosen for a new connection (`Backend` or `Backend6`).
pub struct Picked<B = Backend> {
    pub backend_id: u32,
    pub backend: B,
}

/// Picks a backend for a new connection from `client_be` to `service` (which has at
/// least one slot): the client's backend if session affinity remembers one seen
/// within the timeout and still in its slot, else slot `hash % count` (the flow's
/// hash for packets); with affinity, the choice is remembered. A slot or backend the
/// frontend published but the maps do not hold drops (a packet never reaches a VIP
/// untranslated).
#[inline(always)]
pub fn pick(client_be: u32, hash: u32, service: &ServiceValue, now: u64) -> Result<Picked, Exit> {
    pick_in([client_be, 0, 0, 0], hash, service, now, maps::backend)
}

/// [`pick`] for an IPv6 client: backends from `BACKENDS6`, affinity keyed by the
/// whole address.
#[inline(always)]
pub fn pick6(
    client_be: [u32; 4],
    hash: u32,
    service: &ServiceValue,
    now: u64,
) -> Result<Picked<Backend6>, Exit> {
    pick_in(client_be, hash, service, now, maps::backend6)
}

/// [`pick`] with the backend read by `backend` (the family's map).
#[inline(always)]
fn pick_in<B>(
    client: [u32; 4],
    hash: u32,
    service: &ServiceValue,
    now: u64,
    backend: impl FnOnce(u32) -> Option<B>,
) -> Result<Picked<B>, Exit> {
    let sticky = service.flags & SVC_F_AFFINITY != 0;
    let remembered = if sticky {
        remembered(client, service, now)
    } else {
        None
    };
    let (slot, backend_id) = match remembered {
        Some(found) => found,
        None => {
            let slot = hash % service.count;
            let id = maps::slot(&SlotKey {
                service_id: service.id,
                slot,
            })
            .ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
            (slot, id)
        }
    };
    let backend = backend(backend_id).ok_or((DROP, stat::DROP_MISSING_BACKEND))?;
    if sticky {
        // Remembered when picked: a connection that then fails to be tracked leaves
        // an entry the client's next connection refreshes.
        let key = AffinityKey {
            client,
            service_id: service.id,
        };
        let seen = AffinityValue {
            backend_id,
            slot,
            last_ns: now,
        };
        // Best effort: without the entry the next connection is hashed anew.
        let _ = maps::AFFINITY.insert(key, seen, 0);
    }
    Ok(Picked {
        backend_id,
        backend,
    })
}

/// The slot and backend session affinity gave this client, if it connected within
/// the timeout and that backend is still in that slot.
#[inline(always)]
fn remembered(client: [u32; 4], service: &ServiceValue, now: u64) -> Option<(u32, u32)> {
    let seen = maps::affinity(&AffinityKey {
        client,
        service_id: service.id,
    })?;
    let timeout_ns = service.affinity_timeout_s as u64 * 1_000_000_000;
    if now.saturating_sub(seen.last_ns) >= timeout_ns || seen.slot >= service.count {
        return None;
    }
    let id = maps::slot(&SlotKey {
        service_id: service.id,
        slot: seen.slot,
    })?;
    (id == seen.backend_id).then_some((seen.slot, id))
}

//! The TC program: parse, service lookup, backend pick, conntrack, DNAT / reverse NAT.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::bpf_ktime_get_ns,
    macros::classifier,
    programs::TcContext,
};
use dataplane_common::{
    clusterip_marker, flow_hash, stat, AffinityKey, AffinityValue, FlowKey, NatTarget, ServiceKey,
    SlotKey, CT_FORWARD, CT_REVERSE, PROTO_TCP, PROTO_UDP, SVC_F_AFFINITY, SVC_F_DROP_EMPTY,
};

use crate::{
    maps::{count, AFFINITY, BACKENDS, CONNTRACK, SERVICES, SLOTS},
    nat::{rewrite, End},
    packet::{ptr_at, Flow, ETH_LEN, ETH_P_IP, IP_MAX_HDR_LEN},
    reject,
};

/// A verdict and the `stat` slot that explains it.
type Exit = (i32, u32);

#[classifier]
pub fn sliceway_tc(ctx: TcContext) -> i32 {
    let (action, reason) = match try_sliceway_tc(&ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    count(reason);
    action
}

const PASS: i32 = TC_ACT_OK;
const DROP: i32 = TC_ACT_SHOT;

fn try_sliceway_tc(ctx: &TcContext) -> Result<Exit, Exit> {
    let flow = parse(ctx)?;
    let service_key = ServiceKey {
        addr_be: flow.dst_be,
        port_be: flow.dport_be,
        proto: flow.proto,
        _pad: 0,
    };
    let flow_key = FlowKey {
        src_be: flow.src_be,
        dst_be: flow.dst_be,
        sport_be: flow.sport_be,
        dport_be: flow.dport_be,
        proto: flow.proto,
        _pad: [0; 3],
    };
    // SAFETY: map values are plain data; the reference does not outlive this call.
    if let Some(service) = unsafe { SERVICES.get(service_key) } {
        let (service_id, count, flags) = (service.id, service.count, service.flags);
        let affinity_timeout_s = service.affinity_timeout_s;
        // A tracked flow keeps its backend through endpoint churn.
        if let Some(ct) = unsafe { CONNTRACK.get(flow_key) } {
            let ct = *ct;
            if ct.dir == CT_FORWARD && keep_tracked(&flow, &ct) {
                rewrite(ctx, &flow, End::Destination, ct.addr_be, ct.port_be)
                    .map_err(|_| (DROP, stat::DROP_REWRITE))?;
                return Ok((PASS, stat::DNAT_ESTABLISHED));
            }
        }
        if count == 0 {
            // Never let a packet reach the VIP untranslated: with endpoints on other
            // nodes only and a Local policy, drop (kube-proxy's "drop"); with none
            // anywhere, reject.
            if flags & SVC_F_DROP_EMPTY != 0 {
                return Ok((DROP, stat::DROP_NO_BACKEND));
            }
            return Ok(reject_or_drop(ctx, &flow, stat::REJECT_NO_BACKEND));
        }
        // Session affinity: a client seen within the timeout keeps its backend while
        // that backend is still in the slot it was found in.
        let affinity_key = AffinityKey {
            client: [flow.src_be, 0, 0, 0],
            service_id,
        };
        let now = if flags & SVC_F_AFFINITY != 0 {
            // SAFETY: a plain helper call.
            unsafe { bpf_ktime_get_ns() }
        } else {
            0
        };
        let sticky = if flags & SVC_F_AFFINITY != 0 {
            sticky_backend(&affinity_key, now, affinity_timeout_s, count)
        } else {
            None
        };
        let (slot_index, backend_id) = match sticky {
            Some(found) => found,
            None => {
                let hash = flow_hash(
                    flow.src_be,
                    flow.dst_be,
                    flow.sport_be,
                    flow.dport_be,
                    flow.proto,
                );
                let slot = SlotKey {
                    service_id,
                    slot: hash % count,
                };
                match unsafe { SLOTS.get(slot) } {
                    Some(id) => (slot.slot, *id),
                    None => return Ok((DROP, stat::DROP_MISSING_BACKEND)),
                }
            }
        };
        let backend = match unsafe { BACKENDS.get(backend_id) } {
            Some(b) => *b,
            None => return Ok((DROP, stat::DROP_MISSING_BACKEND)),
        };
        let forward = NatTarget {
            addr_be: backend.addr_be,
            port_be: backend.port_be,
            dir: CT_FORWARD,
            service_id,
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
            service_id,
            backend_id,
        };
        // Reverse first: a reply can only exist once the forward packet went out.
        CONNTRACK
            .insert(reverse_key, reverse, 0)
            .map_err(|_| (DROP, stat::DROP_CONNTRACK))?;
        CONNTRACK
            .insert(flow_key, forward, 0)
            .map_err(|_| (DROP, stat::DROP_CONNTRACK))?;
        rewrite(
            ctx,
            &flow,
            End::Destination,
            backend.addr_be,
            backend.port_be,
        )
        .map_err(|_| (DROP, stat::DROP_REWRITE))?;
        if flags & SVC_F_AFFINITY != 0 {
            let remembered = AffinityValue {
                backend_id,
                slot: slot_index,
                last_ns: now,
            };
            // Best effort: without the entry the next connection is hashed anew.
            let _ = AFFINITY.insert(affinity_key, remembered, 0);
        }
        return Ok((PASS, stat::DNAT_NEW));
    }
    if let Some(ct) = unsafe { CONNTRACK.get(flow_key) } {
        let ct = *ct;
        if ct.dir == CT_REVERSE {
            rewrite(ctx, &flow, End::Source, ct.addr_be, ct.port_be)
                .map_err(|_| (DROP, stat::DROP_REWRITE))?;
            return Ok((PASS, stat::REVNAT));
        }
    }
    // A ClusterIP on a port or protocol its Service does not declare: rejected, as
    // kube-proxy's nftables `cluster-ips` set does, never passed on untranslated.
    if unsafe { SERVICES.get(clusterip_marker(flow.dst_be)) }.is_some() {
        return Ok(reject_or_drop(ctx, &flow, stat::REJECT_NO_PORT));
    }
    Ok((PASS, stat::PASS_NO_SERVICE))
}

/// Answers `flow` with ICMP port unreachable; drops it if the reply cannot be made.
#[inline(always)]
fn reject_or_drop(ctx: &TcContext, flow: &Flow, reason: u32) -> Exit {
    match reject::port_unreachable(ctx, flow) {
        Ok(action) => (action, reason),
        Err(()) => (DROP, stat::DROP_REJECT),
    }
}

/// The slot and backend a client was given by session affinity, if it connected
/// within the timeout and that backend is still in that slot.
#[inline(always)]
fn sticky_backend(key: &AffinityKey, now: u64, timeout_s: u32, count: u32) -> Option<(u32, u32)> {
    // SAFETY: map values are plain data; copied at once.
    let seen = unsafe { AFFINITY.get(key) }.copied()?;
    if now.wrapping_sub(seen.last_ns) >= timeout_s as u64 * 1_000_000_000 || seen.slot >= count {
        return None;
    }
    let slot = SlotKey {
        service_id: key.service_id,
        slot: seen.slot,
    };
    // SAFETY: as above.
    match unsafe { SLOTS.get(slot) } {
        Some(id) if *id == seen.backend_id => Some((seen.slot, seen.backend_id)),
        _ => None,
    }
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
    match unsafe { BACKENDS.get(ct.backend_id) } {
        Some(b) => b.addr_be == ct.addr_be && b.port_be == ct.port_be,
        None => false,
    }
}

/// Parses Ethernet + IPv4 + TCP/UDP. `Err` carries the exit for packets the program
/// does not handle: other protocols pass, truncated headers drop.
#[inline(always)]
fn parse(ctx: &TcContext) -> Result<Flow, Exit> {
    let ether_type: *const u16 = ptr_at(ctx, 12).ok_or((DROP, stat::DROP_MALFORMED))?;
    if u16::from_be(unsafe { *ether_type }) != ETH_P_IP {
        return Err((PASS, stat::PASS_NOT_IPV4));
    }
    let ip: *const [u8; 20] = ptr_at(ctx, ETH_LEN).ok_or((DROP, stat::DROP_MALFORMED))?;
    let ip = unsafe { &*ip };
    if ip[0] >> 4 != 4 {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let ihl = ((ip[0] & 0x0f) as usize) * 4;
    if !(20..=IP_MAX_HDR_LEN).contains(&ihl) {
        return Err((DROP, stat::DROP_MALFORMED));
    }
    let proto = ip[9];
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Err((PASS, stat::PASS_NOT_L4));
    }
    // Fragment offset non-zero: no L4 header here.
    if (u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff) != 0 {
        return Err((PASS, stat::PASS_FRAGMENT));
    }
    let src_be = u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]);
    let dst_be = u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let l4_off = ETH_LEN + ihl;
    let (sport_be, dport_be, syn_only, udp_no_csum) = if proto == PROTO_TCP {
        let tcp: *const [u8; 20] = ptr_at(ctx, l4_off).ok_or((DROP, stat::DROP_MALFORMED))?;
        let tcp = unsafe { &*tcp };
        let flags = tcp[13];
        (
            u16::from_ne_bytes([tcp[0], tcp[1]]),
            u16::from_ne_bytes([tcp[2], tcp[3]]),
            flags & 0x12 == 0x02,
            false,
        )
    } else {
        let udp: *const [u8; 8] = ptr_at(ctx, l4_off).ok_or((DROP, stat::DROP_MALFORMED))?;
        let udp = unsafe { &*udp };
        (
            u16::from_ne_bytes([udp[0], udp[1]]),
            u16::from_ne_bytes([udp[2], udp[3]]),
            false,
            udp[6] == 0 && udp[7] == 0,
        )
    };
    Ok(Flow {
        src_be,
        dst_be,
        sport_be,
        dport_be,
        proto,
        l4_off,
        syn_only,
        udp_no_csum,
    })
}

//! The TC program's entry: parse, then one path per direction. A packet to a
//! frontend goes to the backend (`to_frontend`: conntrack or pick, DNAT; no backend:
//! reject or drop); any other packet may be a reply of a tracked flow (`reply`:
//! reverse NAT), is rejected if it is for a ClusterIP's undeclared port, or passes
//! untouched.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use dataplane_common::{stat, FlowKey, ServiceValue, SVC_F_DROP_EMPTY};

use crate::{
    conntrack,
    counters::{count, Exit},
    lookup,
    nat::{rewrite, End},
    packet::Flow,
    parse::parse,
    reject,
};

pub const PASS: i32 = TC_ACT_OK;
pub const DROP: i32 = TC_ACT_SHOT;

#[classifier]
pub fn sliceway_tc(ctx: TcContext) -> i32 {
    let (action, reason) = match try_sliceway_tc(&ctx) {
        Ok(exit) => exit,
        Err(exit) => exit,
    };
    count(reason);
    action
}

fn try_sliceway_tc(ctx: &TcContext) -> Result<Exit, Exit> {
    let flow = parse(ctx)?;
    let key = conntrack::key_of(&flow);
    match lookup::frontend(&flow) {
        Some(service) => to_frontend(ctx, &flow, &key, &service),
        None => reply(ctx, &flow, &key),
    }
}

/// A packet to a frontend: a tracked flow keeps its backend through endpoint churn;
/// a new one picks a backend and is tracked. Then DNAT.
#[inline(always)]
fn to_frontend(
    ctx: &TcContext,
    flow: &Flow,
    key: &FlowKey,
    service: &ServiceValue,
) -> Result<Exit, Exit> {
    if let Some(ct) = conntrack::forward(flow, key) {
        rewrite(ctx, flow, End::Destination, ct.addr_be, ct.port_be)
            .map_err(|_| (DROP, stat::DROP_REWRITE))?;
        return Ok((PASS, stat::DNAT_ESTABLISHED));
    }
    if service.count == 0 {
        // Never let a packet reach the VIP untranslated: with endpoints on other nodes
        // only and a Local policy, drop (kube-proxy's "drop"); with none anywhere,
        // reject.
        if service.flags & SVC_F_DROP_EMPTY != 0 {
            return Ok((DROP, stat::DROP_NO_BACKEND));
        }
        return Ok(reject_or_drop(ctx, flow, stat::REJECT_NO_BACKEND));
    }
    let picked = lookup::pick(flow, service)?;
    conntrack::track(flow, key, service, picked.backend_id, &picked.backend)?;
    rewrite(
        ctx,
        flow,
        End::Destination,
        picked.backend.addr_be,
        picked.backend.port_be,
    )
    .map_err(|_| (DROP, stat::DROP_REWRITE))?;
    if let Some(entry) = &picked.remember {
        lookup::remember(entry);
    }
    Ok((PASS, stat::DNAT_NEW))
}

/// Answers `flow` with ICMP port unreachable (`sliceway_reject` counts `reason`);
/// drops it if the handover fails.
#[inline(always)]
fn reject_or_drop(ctx: &TcContext, flow: &Flow, reason: u32) -> Exit {
    reject::port_unreachable(ctx, flow, reason);
    (DROP, stat::DROP_REJECT)
}

/// A packet to no frontend: a reply of a tracked flow gets its frontend back as the
/// source; anything else passes untouched.
#[inline(always)]
fn reply(ctx: &TcContext, flow: &Flow, key: &FlowKey) -> Result<Exit, Exit> {
    match conntrack::reverse(key) {
        Some(ct) => {
            rewrite(ctx, flow, End::Source, ct.addr_be, ct.port_be)
                .map_err(|_| (DROP, stat::DROP_REWRITE))?;
            Ok((PASS, stat::REVNAT))
        }
        // A ClusterIP on a port or protocol its Service does not declare: rejected,
        // as kube-proxy's nftables `cluster-ips` set does, never passed on.
        None if lookup::is_clusterip(flow) => Ok(reject_or_drop(ctx, flow, stat::REJECT_NO_PORT)),
        None => Ok((PASS, stat::PASS_NO_SERVICE)),
    }
}

//! The TC program's entry: parse, then one path per direction. A packet to a
//! frontend goes to the backend (`to_frontend`: conntrack or pick, DNAT); any other
//! packet may be a reply of a tracked flow (`reply`: reverse NAT) or passes untouched.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};
use dataplane_common::{stat, FlowKey, ServiceValue};

use crate::{
    conntrack,
    counters::{count, Exit},
    lookup,
    nat::{rewrite, End},
    packet::Flow,
    parse::parse,
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
    let (backend_id, backend) = lookup::pick(flow, service)?;
    conntrack::track(flow, key, service, backend_id, &backend)?;
    rewrite(
        ctx,
        flow,
        End::Destination,
        backend.addr_be,
        backend.port_be,
    )
    .map_err(|_| (DROP, stat::DROP_REWRITE))?;
    Ok((PASS, stat::DNAT_NEW))
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
        None => Ok((PASS, stat::PASS_NO_SERVICE)),
    }
}

//! Socket-level load balancing for the node's own sockets (node processes, the
//! kubelet, hostNetwork pods): cgroup `sock_addr` programs, as Cilium's socket LB.
//! Their packets never pass a pod-facing interface, where `sliceway_tc` runs, so
//! the translation happens where the socket names its peer instead:
//! - `sliceway_connect4` (`connect`, TCP, UDP and SCTP) and `sliceway_sendmsg4`
//!   (`sendto` on an unconnected UDP socket) replace a frontend's address and port
//!   with a backend's, picked as for a packet (session affinity, with the node as
//!   one client; otherwise a random slot, since no source port exists yet); a
//!   frontend without backends, or a ClusterIP's undeclared port, is refused (the
//!   call fails with EPERM: a socket program can refuse, not answer);
//! - `sliceway_recvmsg4` and `sliceway_getpeername4` show the frontend again where
//!   the kernel would show the backend (a datagram's source, the peer's name), from
//!   `SOCK_REVNAT` (socket cookie, backend → frontend).
//!
//! The programs hang on a cgroup (the root one by default, so every process on the
//! node), but act only on sockets of the network namespace the agent runs in
//! (`HOST_NETNS`, its cookie, set at load): pods' sockets live in namespaces of their
//! own, and their packets are translated by `sliceway_tc` as before.

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
    EbpfContext,
};
use dataplane_common::{
    clusterip_marker, stat, ServiceKey, SockRevKey, SockRevValue, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
    SCOPE_ANY, SVC_F_SOURCE_RANGES,
};

use crate::{
    conntrack,
    counters::{self, count},
    lookup, maps,
};

/// The cookie of the network namespace the agent runs in (`SO_NETNS_COOKIE`); zero
/// acts nowhere. Set by the loader; read-only data.
#[no_mangle]
static HOST_NETNS: u64 = 0;

const AF_INET: u32 = 2;
/// What a `sock_addr` program returns: go on, or fail the call (EPERM).
const ALLOW: i32 = 1;
const REFUSE: i32 = 0;

#[cgroup_sock_addr(connect4)]
pub fn sliceway_connect4(ctx: SockAddrContext) -> i32 {
    translate(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sliceway_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn sliceway_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    // recvmsg programs must allow.
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn sliceway_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    ALLOW
}

/// Whether the socket belongs to the agent's network namespace.
#[inline(always)]
fn in_host_netns(ctx: &SockAddrContext) -> bool {
    // SAFETY: a plain read of a static; volatile so the loader's value is read.
    let host = unsafe { core::ptr::read_volatile(&HOST_NETNS) };
    // SAFETY: the helper takes the program's context, which `ctx` is.
    host != 0 && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } == host
}

/// The peer the socket names: (address, port, protocol), network byte order; `None`
/// for what is not IPv4 TCP, UDP or SCTP.
#[inline(always)]
fn peer(ctx: &SockAddrContext) -> Option<(u32, u16, u8)> {
    // SAFETY: the kernel hands the program a valid `bpf_sock_addr`; these fields may
    // be read by every sock_addr program (4-byte reads).
    let (family, ip, port, proto) = unsafe {
        let sa = &*ctx.sock_addr;
        (sa.user_family, sa.user_ip4, sa.user_port, sa.protocol)
    };
    if family != AF_INET {
        return None;
    }
    let proto = match proto {
        6 => PROTO_TCP,
        17 => PROTO_UDP,
        132 => PROTO_SCTP,
        _ => return None,
    };
    // The port is the low half of the word, in network byte order, as the packet
    // carries it.
    Some((ip, port as u16, proto))
}

/// Writes the peer's address and port (network byte order) into the call.
#[inline(always)]
fn set_peer(ctx: &SockAddrContext, addr_be: u32, port_be: u16) {
    // SAFETY: connect4, sendmsg4, recvmsg4 and getpeername4 may write these two
    // fields (4-byte writes); nothing else holds the context.
    unsafe {
        let sa = &mut *ctx.sock_addr;
        sa.user_ip4 = addr_be;
        sa.user_port = port_be as u32;
    }
}

/// connect4 and sendmsg4: a frontend becomes a backend.
#[inline(always)]
fn translate(ctx: &SockAddrContext) -> i32 {
    if !in_host_netns(ctx) {
        return ALLOW;
    }
    let Some((addr_be, port_be, proto)) = peer(ctx) else {
        return ALLOW;
    };
    let key = ServiceKey {
        addr_be,
        port_be,
        proto,
        scope: SCOPE_ANY,
    };
    let Some(service) = maps::service(&key) else {
        if maps::service(&clusterip_marker(addr_be)).is_some() {
            count(stat::SOCK_REJECT_NO_PORT);
            return REFUSE;
        }
        return ALLOW;
    };
    // loadBalancerSourceRanges: the node's sockets come from its address (the one
    // the uplink program masquerades to), as kube-proxy's output hook sees them.
    if service.flags & SVC_F_SOURCE_RANGES != 0 {
        let node_be = maps::nat_config().map_or(0, |c| c.node_addr_be);
        if !maps::source_allowed(key, node_be) {
            count(stat::DROP_SOURCE_RANGE);
            return REFUSE;
        }
    }
    if service.count == 0 {
        counters::refused(service.id, false);
        count(stat::SOCK_REJECT_NO_BACKEND);
        return REFUSE;
    }
    // SAFETY: a helper without arguments.
    let random = unsafe { bpf_get_prandom_u32() };
    let picked = match lookup::pick(lookup::NODE_CLIENT, random, &service, conntrack::now()) {
        Ok(p) => p,
        Err((_, reason)) => {
            count(reason);
            return REFUSE;
        }
    };
    let backend = picked.backend;
    // SAFETY: the helper takes the program's context, which `ctx` is.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevKey {
        cookie,
        addr_be: backend.addr_be,
        port_be: backend.port_be,
        _pad: 0,
    };
    let frontend = SockRevValue {
        addr_be,
        port_be,
        _pad: 0,
    };
    // Best effort: without it, replies and the peer name show the backend.
    let _ = maps::SOCK_REVNAT.insert(key, frontend, 0);
    set_peer(ctx, backend.addr_be, backend.port_be);
    counters::connected(service.id, picked.backend_id);
    count(stat::SOCK_TRANSLATED);
    ALLOW
}

/// recvmsg4 and getpeername4: a backend the socket was given shows as its frontend.
#[inline(always)]
fn reverse(ctx: &SockAddrContext) {
    if !in_host_netns(ctx) {
        return;
    }
    let Some((addr_be, port_be, _)) = peer(ctx) else {
        return;
    };
    // SAFETY: as in `translate`.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = SockRevKey {
        cookie,
        addr_be,
        port_be,
        _pad: 0,
    };
    if let Some(frontend) = maps::sock_revnat(&key) {
        set_peer(ctx, frontend.addr_be, frontend.port_be);
        count(stat::SOCK_REVNAT);
    }
}

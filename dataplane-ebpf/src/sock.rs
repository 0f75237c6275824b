//! Socket-level load balancing for the node's own sockets (node processes, the
//! kubelet, hostNetwork pods): cgroup `sock_addr` programs, as Cilium's socket LB.
//! Their packets never pass a pod-facing interface, where `sliceway_tc` runs, so
//! the translation happens where the socket names its peer instead:
//! - `sliceway_connect4` (`connect`, TCP, UDP and SCTP) and `sliceway_sendmsg4`
//!   (`sendto` on an unconnected UDP socket) replace a frontend's address and port
//!   with a backend's, picked as for a packet (session affinity, with the node as
//!   one client; otherwise a random slot, since no source port exists yet); a
//!   frontend without backends, or a ClusterIP's undeclared port, is refused (the
//!   call fails with ECONNREFUSED, as after kube-proxy's REJECT, where the kernel
//!   lets the program set the error, [`SET_RETVAL`]; with EPERM elsewhere);
//! - `sliceway_recvmsg4` and `sliceway_getpeername4` show the frontend again where
//!   the kernel would show the backend (a datagram's source, the peer's name), from
//!   `SOCK_REVNAT` (socket cookie, backend → frontend);
//! - `sliceway_connect6`, `sliceway_sendmsg6`, `sliceway_recvmsg6` and
//!   `sliceway_getpeername6` do the same for IPv6 sockets: IPv6 frontends from
//!   `SERVICES6`, backends from `BACKENDS6`, reverse from `SOCK_REVNAT6`. An
//!   IPv4-mapped address (`::ffff:10.96.0.10`) on an IPv6 socket is IPv4's: the
//!   kernel connects such a socket over IPv4 without running the IPv4 hooks, so the
//!   IPv6 hooks translate it through IPv4's maps and hand the backend back mapped
//!   (as Cilium's socket LB does for dual-stack sockets).
//!
//! The programs hang on a cgroup (the root one by default, so every process on the
//! node), but act only on sockets of the network namespace the agent runs in
//! (`HOST_NETNS`, its cookie, set at load): pods' sockets live in namespaces of their
//! own, and their packets are translated by `sliceway_tc` as before.
//!
//! With `POD_SOCKETS` (`--socket-lb-pods`, as Cilium's socket LB outside the host
//! namespace) a pod's TCP `connect` is translated here too, once, where the TC
//! program would translate every packet of the connection: only where the result is
//! the same as TC's, a frontend with backends and neither session affinity (keyed by
//! the pod's address, which a socket has no sure hold of before it connects) nor
//! source ranges (checked against that address). Everything else a pod sends is left
//! untouched for `sliceway_tc`: a frontend without backends, which TC rejects with
//! ICMP as kube-proxy does (a socket program could only fail the call with EPERM); a
//! ClusterIP's undeclared port; and UDP and SCTP, whose connected sockets would keep a
//! removed backend where TC's conntrack lets the next datagram pick again.

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
    EbpfContext,
};
use dataplane_common::{
    clusterip_marker, clusterip_marker6, stat, v4_mapped, ServiceKey, ServiceKey6, ServiceValue,
    SockRevKey, SockRevKey6, SockRevValue, SockRevValue6, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
    SCOPE_ANY, SVC_F_SOURCE_RANGES, V4_MAPPED_WORD_BE,
};

use crate::{
    conntrack,
    counters::{self, count, Exit},
    lookup,
    lookup::Picked,
    maps,
};

/// The cookie of the network namespace the agent runs in (`SO_NETNS_COOKIE`); zero
/// acts nowhere. Set by the loader; read-only data.
#[no_mangle]
static HOST_NETNS: u64 = 0;

/// Non-zero: pods' TCP connects are translated too (see the module's words). Set by
/// the loader; read-only data, so the verifier leaves out the code it turns off.
#[no_mangle]
static POD_SOCKETS: u8 = 0;

/// Non-zero: this kernel lets these programs choose the error of a call they refuse
/// (`bpf_set_retval`; the agent probes for it), so a refusal kube-proxy's REJECT
/// would answer fails with ECONNREFUSED rather than EPERM. Set by the loader;
/// read-only data, so a kernel without the helper never verifies the call.
#[no_mangle]
static SET_RETVAL: u8 = 0;

/// `ECONNREFUSED` (include/uapi/asm-generic/errno.h).
const ECONNREFUSED: i32 = 111;

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
/// What a `sock_addr` program returns: go on, or fail the call (EPERM).
const ALLOW: i32 = 1;
const REFUSE: i32 = 0;

#[cgroup_sock_addr(connect4)]
pub fn sliceway_connect4(ctx: SockAddrContext) -> i32 {
    translate::<false>(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sliceway_sendmsg4(ctx: SockAddrContext) -> i32 {
    translate::<false>(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn sliceway_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse::<false>(&ctx);
    // recvmsg programs must allow.
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn sliceway_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse::<false>(&ctx);
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn sliceway_connect6(ctx: SockAddrContext) -> i32 {
    translate::<true>(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sliceway_sendmsg6(ctx: SockAddrContext) -> i32 {
    translate::<true>(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn sliceway_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse::<true>(&ctx);
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn sliceway_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse::<true>(&ctx);
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

/// Whether pods' TCP connects are translated here too.
#[inline(always)]
fn pods_too() -> bool {
    // SAFETY: a plain read of a static; volatile so the loader's value is read.
    unsafe { core::ptr::read_volatile(&POD_SOCKETS) != 0 }
}

/// The address a socket call names, by the maps' family: an IPv4 address (also one
/// mapped into an IPv6 socket's), or an IPv6 one.
#[derive(Clone, Copy)]
enum Addr {
    V4(u32),
    V6([u32; 4]),
}

/// The peer the socket names: (address, port, protocol), network byte order; `None`
/// for what is not TCP, UDP or SCTP. `V6`: the program is an IPv6 hook, whose
/// context has only the IPv6 address (the verifier refuses a read of the other
/// family's field even on a path never taken). An IPv4-mapped address is IPv4's
/// ([`set_peer`] maps the answer back).
#[inline(always)]
fn peer<const V6: bool>(ctx: &SockAddrContext) -> Option<(Addr, u16, u8)> {
    // SAFETY: the kernel hands the program a valid `bpf_sock_addr`; the family's
    // address, the port and the protocol may be read by its hooks (plain field
    // reads, which compile to loads at constant offsets of the context, as the
    // verifier wants them).
    let sa = unsafe { &*ctx.sock_addr };
    let proto = match sa.protocol {
        6 => PROTO_TCP,
        17 => PROTO_UDP,
        132 => PROTO_SCTP,
        _ => return None,
    };
    // The port is the low half of the word, in network byte order, as the packet
    // carries it.
    let port = sa.user_port as u16;
    if !V6 {
        return (sa.user_family == AF_INET).then_some((Addr::V4(sa.user_ip4), port, proto));
    }
    if sa.user_family != AF_INET6 {
        return None;
    }
    let addr = [
        sa.user_ip6[0],
        sa.user_ip6[1],
        sa.user_ip6[2],
        sa.user_ip6[3],
    ];
    Some(match v4_mapped(addr) {
        Some(v4) => (Addr::V4(v4), port, proto),
        None => (Addr::V6(addr), port, proto),
    })
}

/// Writes the peer's address and port (network byte order) into the call, in the
/// hook's family (`V6`: an IPv4 address goes into an IPv6 hook's call mapped).
#[inline(always)]
fn set_peer<const V6: bool>(ctx: &SockAddrContext, addr: Addr, port_be: u16) {
    // SAFETY: connect, sendmsg, recvmsg and getpeername hooks may write their
    // family's address and the port (4-byte writes); nothing else holds the context.
    let sa = unsafe { &mut *ctx.sock_addr };
    let words = match addr {
        Addr::V4(v4) if !V6 => {
            sa.user_ip4 = v4;
            None
        }
        Addr::V4(v4) => Some([0, 0, V4_MAPPED_WORD_BE, v4]),
        Addr::V6(v6) if V6 => Some(v6),
        // An IPv6 address never comes from an IPv4 hook's call.
        Addr::V6(_) => return,
    };
    if let Some([w0, w1, w2, w3]) = words {
        // Word by word from registers: an array copy may become a loop over a
        // pointer into the context, which the verifier refuses.
        sa.user_ip6[0] = w0;
        sa.user_ip6[1] = w1;
        sa.user_ip6[2] = w2;
        sa.user_ip6[3] = w3;
    }
    sa.user_port = port_be as u32;
}

/// A frontend's key in its family's map.
#[derive(Clone, Copy)]
enum Key {
    V4(ServiceKey),
    V6(ServiceKey6),
}

impl Key {
    /// The key of (`addr`, `port_be`, `proto`), of scope [`SCOPE_ANY`].
    #[inline(always)]
    fn of(addr: Addr, port_be: u16, proto: u8) -> Self {
        match addr {
            Addr::V4(addr_be) => Key::V4(ServiceKey {
                addr_be,
                port_be,
                proto,
                scope: SCOPE_ANY,
            }),
            Addr::V6(addr_be) => Key::V6(ServiceKey6 {
                addr_be,
                port_be,
                proto,
                scope: SCOPE_ANY,
            }),
        }
    }
}

/// The frontend of `key`, and whether its address is a ClusterIP (on another port
/// or protocol) where there is none.
#[inline(always)]
fn frontend(key: &Key) -> Result<ServiceValue, bool> {
    let found = match key {
        Key::V4(k) => maps::service(k),
        Key::V6(k) => maps::service6(k),
    };
    found.ok_or_else(|| match key {
        Key::V4(k) => maps::service(&clusterip_marker(k.addr_be)).is_some(),
        Key::V6(k) => maps::service6(&clusterip_marker6(k.addr_be)).is_some(),
    })
}

/// loadBalancerSourceRanges: the node's sockets come from its address (the one the
/// uplink program masquerades to, of the frontend's family), as kube-proxy's output
/// hook sees them.
#[inline(always)]
fn node_allowed(key: &Key) -> bool {
    match *key {
        Key::V4(k) => maps::source_allowed(k, maps::nat_config().map_or(0, |c| c.node_addr_be)),
        Key::V6(k) => maps::source_allowed6(
            k,
            maps::NAT_CONFIG6.get(0).map_or([0; 4], |c| c.node_addr_be),
        ),
    }
}

/// A backend of `service` for the node's socket (the node is one client), and its
/// address in the frontend's family.
#[inline(always)]
fn pick(addr: Addr, service: &ServiceValue) -> Result<(u32, Addr, u16), Exit> {
    // SAFETY: a helper without arguments.
    let random = unsafe { bpf_get_prandom_u32() };
    let now = conntrack::now();
    Ok(match addr {
        Addr::V4(_) => {
            let Picked {
                backend_id,
                backend,
            } = lookup::pick(lookup::NODE_CLIENT, random, service, now)?;
            (backend_id, Addr::V4(backend.addr_be), backend.port_be)
        }
        Addr::V6(_) => {
            let client = [lookup::NODE_CLIENT, 0, 0, 0];
            let Picked {
                backend_id,
                backend,
            } = lookup::pick6(client, random, service, now)?;
            (backend_id, Addr::V6(backend.addr_be), backend.port_be)
        }
    })
}

/// Remembers, for the socket, that `backend` stands for `frontend`; best effort:
/// without it, replies and the peer name show the backend.
#[inline(always)]
fn remember(cookie: u64, backend: (Addr, u16), frontend: (Addr, u16)) {
    match (backend, frontend) {
        ((Addr::V4(b), bport), (Addr::V4(f), fport)) => {
            let key = SockRevKey {
                cookie,
                addr_be: b,
                port_be: bport,
                _pad: 0,
            };
            let value = SockRevValue {
                addr_be: f,
                port_be: fport,
                _pad: 0,
            };
            let _ = maps::SOCK_REVNAT.insert(key, value, 0);
        }
        ((Addr::V6(b), bport), (Addr::V6(f), fport)) => {
            let key = SockRevKey6 {
                cookie,
                addr_be: b,
                port_be: bport,
                _pad: 0,
                _pad2: 0,
            };
            let value = SockRevValue6 {
                addr_be: f,
                port_be: fport,
                _pad: 0,
            };
            let _ = maps::SOCK_REVNAT6.insert(key, value, 0);
        }
        // A frontend's backends are of its family.
        _ => {}
    }
}

/// The frontend the socket asked for where it was given `backend`, if remembered.
#[inline(always)]
fn remembered(cookie: u64, backend: Addr, port_be: u16) -> Option<(Addr, u16)> {
    match backend {
        Addr::V4(addr_be) => maps::sock_revnat(&SockRevKey {
            cookie,
            addr_be,
            port_be,
            _pad: 0,
        })
        .map(|f| (Addr::V4(f.addr_be), f.port_be)),
        Addr::V6(addr_be) => maps::sock_revnat6(&SockRevKey6 {
            cookie,
            addr_be,
            port_be,
            _pad: 0,
            _pad2: 0,
        })
        .map(|f| (Addr::V6(f.addr_be), f.port_be)),
    }
}

/// A refusal where kube-proxy's REJECT answers (no endpoints, an undeclared port):
/// ECONNREFUSED where the kernel lets the program say so ([`SET_RETVAL`]), else the
/// kernel's EPERM.
#[inline(always)]
fn reject() -> i32 {
    // SAFETY: a read of the loader's read-only value.
    if unsafe { core::ptr::read_volatile(&SET_RETVAL) } != 0 {
        // SAFETY: sets this call's return value; the program refuses it below.
        unsafe { bpf_set_retval(-ECONNREFUSED) };
    }
    REFUSE
}

/// connect and sendmsg: a frontend becomes a backend.
#[inline(always)]
fn translate<const V6: bool>(ctx: &SockAddrContext) -> i32 {
    let host = in_host_netns(ctx);
    if !host && !pods_too() {
        return ALLOW;
    }
    let Some((addr, port_be, proto)) = peer::<V6>(ctx) else {
        return ALLOW;
    };
    if !host {
        return translate_pod::<V6>(ctx, addr, port_be, proto);
    }
    let key = Key::of(addr, port_be, proto);
    let service = match frontend(&key) {
        Ok(service) => service,
        Err(true) => {
            count(stat::SOCK_REJECT_NO_PORT);
            return reject();
        }
        Err(false) => return ALLOW,
    };
    if service.flags & SVC_F_SOURCE_RANGES != 0 && !node_allowed(&key) {
        count(stat::DROP_SOURCE_RANGE);
        return REFUSE;
    }
    if service.count == 0 {
        counters::refused(service.id, false);
        count(stat::SOCK_REJECT_NO_BACKEND);
        return reject();
    }
    let (backend_id, backend, backend_port) = match pick(addr, &service) {
        Ok(picked) => picked,
        Err((_, reason)) => {
            count(reason);
            return REFUSE;
        }
    };
    redirect::<V6>(
        ctx,
        (backend_id, backend, backend_port),
        &service,
        (addr, port_be),
    );
    count(stat::SOCK_TRANSLATED);
    ALLOW
}

/// A pod's connect: translated only where TC would give the same result (a TCP
/// frontend with backends, no session affinity, no source ranges); everything else
/// is TC's. Never refuses.
#[inline(always)]
fn translate_pod<const V6: bool>(
    ctx: &SockAddrContext,
    addr: Addr,
    port_be: u16,
    proto: u8,
) -> i32 {
    if proto != PROTO_TCP {
        return ALLOW;
    }
    let Ok(service) = frontend(&Key::of(addr, port_be, proto)) else {
        return ALLOW;
    };
    if !service.pod_socket_translates(proto) {
        return ALLOW;
    }
    // A slot or backend missing (the agent between writes): TC picks for the packet.
    let Ok(picked) = pick(addr, &service) else {
        return ALLOW;
    };
    redirect::<V6>(ctx, picked, &service, (addr, port_be));
    count(stat::SOCK_TRANSLATED_POD);
    ALLOW
}

/// Points the call at the picked backend, remembers the frontend for the socket's
/// replies and peer name, and counts the connection.
#[inline(always)]
fn redirect<const V6: bool>(
    ctx: &SockAddrContext,
    (backend_id, backend, backend_port): (u32, Addr, u16),
    service: &ServiceValue,
    frontend: (Addr, u16),
) {
    // SAFETY: the helper takes the program's context, which `ctx` is.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    remember(cookie, (backend, backend_port), frontend);
    set_peer::<V6>(ctx, backend, backend_port);
    counters::connected(service.id, backend_id);
}

/// recvmsg and getpeername: a backend the socket was given shows as its frontend.
#[inline(always)]
fn reverse<const V6: bool>(ctx: &SockAddrContext) {
    if !pods_too() && !in_host_netns(ctx) {
        return;
    }
    let Some((addr, port_be, _)) = peer::<V6>(ctx) else {
        return;
    };
    // SAFETY: as in `translate`.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if let Some((frontend, frontend_port)) = remembered(cookie, addr, port_be) {
        set_peer::<V6>(ctx, frontend, frontend_port);
        count(stat::SOCK_REVNAT);
    }
}

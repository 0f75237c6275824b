//! Frontends, backends and protocols as text, for messages, dumps and the CLI.

use std::net::{Ipv4Addr, Ipv6Addr};

use dataplane_common::{
    octets_of, Backend, Backend6, ServiceKey, ServiceKey6, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};

use super::{output::FrontendKey, AnyBackend};

/// `TCP` / `UDP` / `SCTP`, for messages and dumps.
pub fn proto_name(proto: u8) -> &'static str {
    match proto {
        PROTO_TCP => "TCP",
        PROTO_UDP => "UDP",
        PROTO_SCTP => "SCTP",
        _ => "?",
    }
}

/// Whether a frontend key is a ClusterIP's marker (port and protocol 0).
pub fn is_clusterip_marker(key: &ServiceKey) -> bool {
    key.port_be == 0 && key.proto == 0
}

/// `ip:port/PROTO` of a frontend key; `ip:*` for a ClusterIP's marker (its other
/// ports).
pub fn frontend_addr(key: &ServiceKey) -> String {
    if is_clusterip_marker(key) {
        return format!("{}:*", Ipv4Addr::from(u32::from_be(key.addr_be)));
    }
    // A frontend's entry for clients outside the node is named apart from the one
    // for everyone.
    let scope = if key.scope == dataplane_common::SCOPE_EXTERNAL {
        " (external)"
    } else {
        ""
    };
    format!(
        "{}:{}/{}{scope}",
        Ipv4Addr::from(u32::from_be(key.addr_be)),
        u16::from_be(key.port_be),
        proto_name(key.proto)
    )
}

/// `ip:port` of a backend.
pub fn backend_addr(b: &Backend) -> String {
    format!(
        "{}:{}",
        Ipv4Addr::from(u32::from_be(b.addr_be)),
        u16::from_be(b.port_be)
    )
}

/// An IPv6 address the maps hold, as text (without brackets).
pub fn ipv6_of(addr_be: [u32; 4]) -> Ipv6Addr {
    Ipv6Addr::from(octets_of(addr_be))
}

/// Whether an IPv6 frontend key is a ClusterIP's marker (port and protocol 0).
pub fn is_clusterip_marker6(key: &ServiceKey6) -> bool {
    key.port_be == 0 && key.proto == 0
}

/// `[ip]:port/PROTO` of an IPv6 frontend key; `[ip]:*` for a ClusterIP's marker.
pub fn frontend_addr6(key: &ServiceKey6) -> String {
    let ip = ipv6_of(key.addr_be);
    if is_clusterip_marker6(key) {
        return format!("[{ip}]:*");
    }
    let scope = if key.scope == dataplane_common::SCOPE_EXTERNAL {
        " (external)"
    } else {
        ""
    };
    format!(
        "[{ip}]:{}/{}{scope}",
        u16::from_be(key.port_be),
        proto_name(key.proto)
    )
}

/// `[ip]:port` of an IPv6 backend.
pub fn backend_addr6(b: &Backend6) -> String {
    format!("[{}]:{}", ipv6_of(b.addr_be), u16::from_be(b.port_be))
}

/// A frontend key of either family as text.
pub fn any_frontend_addr(key: &FrontendKey) -> String {
    match key {
        FrontendKey::V4(k) => frontend_addr(k),
        FrontendKey::V6(k) => frontend_addr6(k),
    }
}

/// A backend of either family as text.
pub fn any_backend_addr(b: &AnyBackend) -> String {
    match b {
        AnyBackend::V4(b) => backend_addr(b),
        AnyBackend::V6(b) => backend_addr6(b),
    }
}

/// Whether a frontend key of either family is a ClusterIP's marker.
pub fn is_any_clusterip_marker(key: &FrontendKey) -> bool {
    match key {
        FrontendKey::V4(k) => is_clusterip_marker(k),
        FrontendKey::V6(k) => is_clusterip_marker6(k),
    }
}

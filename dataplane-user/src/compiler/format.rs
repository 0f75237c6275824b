//! Frontends, backends and protocols as text, for messages, dumps and the CLI.

use std::net::Ipv4Addr;

use dataplane_common::{Backend, ServiceKey, PROTO_SCTP, PROTO_TCP, PROTO_UDP};

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

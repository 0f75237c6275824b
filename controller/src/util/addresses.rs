//! IP addresses as upstream reads them, and the EndpointSlice address types.

use std::net::IpAddr;

/// EndpointSlice address type for IPv4.
pub const IPV4: &str = "IPv4";
/// EndpointSlice address type for IPv6.
pub const IPV6: &str = "IPv6";

/// Parses an IP as upstream's `netutils.ParseIPSloppy` does (leading zeros in IPv4
/// parts read as decimal, which older API servers stored); `None` if invalid.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    conventions::validate::parse_ip_sloppy(s)
}

/// Whether the string is an IPv6 address (utilnet.IsIPv6String); IPv4-mapped IPv6
/// addresses count as IPv4, as in Go.
pub fn is_ipv6(s: &str) -> bool {
    // Every IPv6 form has a colon; most addresses are IPv4, and parsing is not free.
    if !s.contains(':') {
        return false;
    }
    match parse_ip(s) {
        Some(IpAddr::V6(v6)) => v6.to_ipv4_mapped().is_none(),
        _ => false,
    }
}

/// The EndpointSlice address type of an IP, `None` when it is not an IP.
pub fn address_type_of(s: &str) -> Option<&'static str> {
    parse_ip(s).map(|_| if is_ipv6(s) { IPV6 } else { IPV4 })
}

//! Protocol numbers the programs and the agent compare packets and map keys against
//! (IPv6's next-header values are in `v6`).

/// Protocol numbers as they appear in the IPv4 header.
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;

//! Address/length text (`10.0.0.0/8`, `fd00::/64`): the one reading that every CIDR
//! reader of the agent shares. Each reader adds its own rule on top (a ServiceCIDR's
//! canonical network, the configuration file's list forms) and words its own messages
//! from [`BadPrefix`].

use std::net::IpAddr;

/// Why a text is not an address/length.
#[derive(Debug, PartialEq, Eq)]
pub enum BadPrefix<'a> {
    /// No `/`.
    NoLength,
    /// The text before the first `/` is no address.
    Address(&'a str),
    /// The text after the first `/` is no prefix length within the address's family
    /// (`max` bits: 32 or 128).
    Length { text: &'a str, max: u8 },
}

/// How the two halves are read.
#[derive(Clone, Copy)]
pub struct Syntax {
    /// The address: [`exact`] (Rust's reading, no leading zeros in IPv4), or Go's
    /// `ParseIPSloppy` (`conventions::validate::parse_ip_sloppy`).
    pub address: fn(&str) -> Option<IpAddr>,
    /// The length in canonical decimal only (no sign, no leading zero), as the API
    /// server's `IsValidCIDR` wants it; otherwise any decimal Rust reads as a `u8`
    /// (`+8` and `08` included), as kube-proxy's configuration is read.
    pub canonical_length: bool,
}

/// An IP address of either family as Rust reads it.
pub fn exact(text: &str) -> Option<IpAddr> {
    text.parse().ok()
}

/// The address as written (host bits kept) and the prefix length, within the
/// address's family. The text is not trimmed: a reader that allows spaces around it
/// trims first.
pub fn parse(text: &str, syntax: Syntax) -> Result<(IpAddr, u8), BadPrefix<'_>> {
    let (addr, len) = text.split_once('/').ok_or(BadPrefix::NoLength)?;
    let ip = (syntax.address)(addr).ok_or(BadPrefix::Address(addr))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let canonical = !len.starts_with('+') && (len == "0" || !len.starts_with('0'));
    match len.parse::<u8>() {
        Ok(n) if n <= max && (canonical || !syntax.canonical_length) => Ok((ip, n)),
        _ => Err(BadPrefix::Length { text: len, max }),
    }
}

//! sliceway's kernel programs: ClusterIP load balancing at TC, and for the node's own
//! sockets at `connect`/`sendmsg` (`sock.rs`).
//!
//! `sliceway_xdp` runs the uplink TC program's body in XDP, where `--xdp` asks for it
//! (`xdp.rs`), and with `--xdp-forward` sends what it translated on itself
//! (`forward.rs`).
//!
//! `sliceway_tc` runs at TC ingress of the pod-facing interfaces of a node. For a
//! packet to a frontend (VIP:port:proto) it picks a backend, remembers the choice in
//! conntrack and rewrites the destination (DNAT); for a reply from a backend it
//! rewrites the source back to the frontend (reverse NAT). Every exit is counted in
//! `STATS` by verdict and reason.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

// One file per concern: packet access and header fields, parsing, service lookup
// and backend choice, conntrack, NAT rewrites, ICMP errors, REJECT replies, SCTP
// ports, counters, maps; `tc` ties them up.
#[cfg(target_arch = "bpf")]
mod bridge;
#[cfg(target_arch = "bpf")]
mod conntrack;
#[cfg(target_arch = "bpf")]
mod counters;
#[cfg(target_arch = "bpf")]
mod dsr;
#[cfg(target_arch = "bpf")]
mod forward;
#[cfg(target_arch = "bpf")]
mod icmp;
#[cfg(target_arch = "bpf")]
mod lookup;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod nat;
#[cfg(target_arch = "bpf")]
mod packet;
#[cfg(target_arch = "bpf")]
mod parse;
#[cfg(target_arch = "bpf")]
mod reject;
#[cfg(target_arch = "bpf")]
mod sctp;
#[cfg(target_arch = "bpf")]
mod sock;
#[cfg(target_arch = "bpf")]
mod tc;
#[cfg(target_arch = "bpf")]
mod v6;
#[cfg(target_arch = "bpf")]
mod xdp;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could panic, so this is never reached.
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// The crate only means something for the BPF target; a host build is empty.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

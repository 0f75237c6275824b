//! Map keys, values and constants shared by the kernel programs and the agent.
//!
//! Every type is `#[repr(C)]`, derives `bytemuck::{Pod, Zeroable}` (so the compiler
//! rejects hidden padding) and has its size asserted. Fields in network byte order end
//! in `_be`. No `bool`, `enum` or `Option` crosses the kernel boundary.
#![no_std]

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

// One module per map family; everything is re-exported at the crate root, where the
// kernel programs and the agent name it (`dataplane_common::ServiceKey`): this crate is
// the ABI both sides share, and its paths stay put when a family moves.
mod affinity;
mod backend;
mod checksum;
mod conntrack;
mod counters;
mod fragment;
mod maps;
mod nat;
mod proto;
mod service;
mod sock;
pub mod v1;
mod v6;

pub use affinity::*;
pub use backend::*;
pub use checksum::*;
pub use conntrack::*;
pub use counters::*;
pub use fragment::*;
pub use maps::*;
pub use nat::*;
pub use proto::*;
pub use service::*;
pub use sock::*;
pub use v6::*;

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: every type is `#[repr(C)]` and `bytemuck::Pod`: no padding, any bit
    // pattern valid.
    unsafe impl aya::Pod for ServiceKey {}
    unsafe impl aya::Pod for ServiceValue {}
    unsafe impl aya::Pod for SlotKey {}
    unsafe impl aya::Pod for Backend {}
    unsafe impl aya::Pod for CtKey {}
    unsafe impl aya::Pod for CtEntry {}
    unsafe impl aya::Pod for FragKey {}
    unsafe impl aya::Pod for FragPorts {}
    unsafe impl aya::Pod for ServiceName {}
    unsafe impl aya::Pod for AffinityKey {}
    unsafe impl aya::Pod for AffinityValue {}
    unsafe impl aya::Pod for FrontendCounters {}
    unsafe impl aya::Pod for BackendCounters {}
    unsafe impl aya::Pod for NatConfig {}
    unsafe impl aya::Pod for SourceRange {}
    unsafe impl aya::Pod for v1::FlowKey {}
    unsafe impl aya::Pod for v1::NatTarget {}
    // IPv6's map types (v6.rs), on the same grounds.
    unsafe impl aya::Pod for ServiceKey6 {}
    unsafe impl aya::Pod for Backend6 {}
    unsafe impl aya::Pod for FragKey6 {}
    unsafe impl aya::Pod for NatConfig6 {}
    unsafe impl aya::Pod for SourceRange6 {}
}

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
    /// `T` is `bytemuck::Pod` (checked by the compiler where this is called).
    const fn is_pod<T: bytemuck::Pod>() {}

    /// `aya::Pod` for map types that are `bytemuck::Pod`.
    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            const _: () = is_pod::<$t>();
            // SAFETY: `$t` is `bytemuck::Pod` (the line above does not compile
            // otherwise): `#[repr(C)]`, no padding, every bit pattern valid, which is
            // what aya needs to copy it to and from a map as bytes.
            unsafe impl aya::Pod for $t {}
        )*};
    }

    aya_pod!(
        ServiceKey,
        ServiceValue,
        SlotKey,
        Backend,
        CtKey,
        CtEntry,
        FragKey,
        FragPorts,
        ServiceName,
        AffinityKey,
        AffinityValue,
        FrontendCounters,
        BackendCounters,
        NatConfig,
        SourceRange,
        v1::FlowKey,
        v1::NatTarget,
        // IPv6's map types (v6.rs).
        ServiceKey6,
        Backend6,
        FragKey6,
        NatConfig6,
        SourceRange6,
    );
}

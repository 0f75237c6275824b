//! The `AFFINITY` map: which backend a client of a frontend with session affinity
//! keeps.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

/// Key of the `AFFINITY` map: a client address (IPv4 in the first word, the other
/// three zero; room for IPv6) and the frontend it connected to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityKey {
    pub client: [u32; 4],
    pub service_id: u32,
}
const _: () = assert!(size_of::<AffinityKey>() == 20);

/// Value of the `AFFINITY` map: the backend the client was given, in which slot, and
/// when it last opened a connection (CLOCK_MONOTONIC in ns at a tick's resolution).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub slot: u32,
    pub last_ns: u64,
}
const _: () = assert!(size_of::<AffinityValue>() == 16);

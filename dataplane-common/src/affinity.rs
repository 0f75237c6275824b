//! The `AFFINITY` map: which backend a client of a Service port with session
//! affinity keeps, whichever of the port's frontends it connects to.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

/// Key of the `AFFINITY` map: a client address (IPv4 in the first word, the other
/// three zero; room for IPv6) and the affinity group of the frontend it connected
/// to (`ServiceValue::affinity_group`: one per Service port and family).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityKey {
    pub client: [u32; 4],
    pub group: u32,
}
const _: () = assert!(size_of::<AffinityKey>() == 20);

/// Value of the `AFFINITY` map: the backend the client was given, in which slot of
/// the frontend that gave it (a frontend of the group whose slot holds another
/// backend picks anew), and when it last opened a connection (CLOCK_MONOTONIC in ns at a tick's resolution).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub slot: u32,
    pub last_ns: u64,
}
const _: () = assert!(size_of::<AffinityValue>() == 16);

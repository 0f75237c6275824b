//! The `BACKENDS` map: the backend a slot names.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

/// Value of the `BACKENDS` hash map (keyed by backend id, a `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct Backend {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    pub _pad: u8,
}
const _: () = assert!(size_of::<Backend>() == 8);

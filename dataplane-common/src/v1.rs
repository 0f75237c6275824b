//! Layout v1, the previous pinned layout, as far as a v2 agent reads it to migrate
//! (`sliceway-agent` pinned it under `v1/` up to the commit that made conntrack two
//! paired entries). Only conntrack carries state a client would notice losing: v1 had
//! no session affinity, fragment or timeout maps, and its service maps are rewritten
//! from the compiler.

use super::*;

/// The layout version these types belong to.
pub const LAYOUT_VERSION: u32 = 1;

/// v1's conntrack key: one direction of a flow, IPv4 only. Forward entries are
/// keyed client → frontend, reverse entries backend → client.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct FlowKey {
    pub src_be: u32,
    pub dst_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(size_of::<FlowKey>() == 16);

/// v1's conntrack value: the address and port to write into the packet (the
/// backend for a forward entry, the frontend for a reverse one). No state and no
/// time: v1 entries lived until the LRU evicted them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct NatTarget {
    pub addr_be: u32,
    pub port_be: u16,
    /// [`CT_FORWARD`] or [`CT_REVERSE`].
    pub dir: u16,
    /// v1's frontend id (its own numbering).
    pub service_id: u32,
    /// v1's backend id (its own numbering).
    pub backend_id: u32,
}
const _: () = assert!(size_of::<NatTarget>() == 16);

/// v1's direction values (v2 numbers them differently).
pub const CT_FORWARD: u16 = 0;
pub const CT_REVERSE: u16 = 1;

/// Frontend or backend id of a migrated connection whose frontend or backend the
/// new agent does not have (removed while no agent ran): a TCP connection keeps
/// its backend regardless (entries hold addresses); a UDP flow picks again, as
/// it would after its endpoint's removal.
pub const UNKNOWN_ID: u32 = u32::MAX;

impl FlowKey {
    /// The v2 key of the same direction of the flow.
    #[inline(always)]
    pub fn to_v2(&self) -> CtKey {
        CtKey::v4(
            self.src_be,
            self.dst_be,
            self.sport_be,
            self.dport_be,
            self.proto,
        )
    }
}

/// The v2 reverse key (backend → client) of the connection whose v1 forward entry
/// is `key` → `target`. v1 never remapped a client's port.
#[inline(always)]
pub fn reply_key(key: &FlowKey, target: &NatTarget) -> CtKey {
    CtKey::v4(
        target.addr_be,
        key.src_be,
        target.port_be,
        key.sport_be,
        key.proto,
    )
}

/// The v2 state and flags of a connection taken over from a v1 entry. v1 kept
/// none; a connection still tracked is taken as answered, so an established TCP
/// connection stays established (with its timeout) and a later FIN or RST moves
/// it on as usual. A v1 entry of a connection that had ended is then kept for
/// the established timeout, as the LRU kept it in v1, unless its tuple is reused.
#[inline(always)]
pub fn adopted_state(proto: u8) -> (u8, u8) {
    let s = match proto {
        PROTO_TCP => ct::state::TCP_ESTABLISHED,
        PROTO_UDP => ct::state::UDP_REPLIED,
        PROTO_SCTP => ct::state::SCTP_ESTABLISHED,
        _ => ct::state::OTHER,
    };
    (s, ct::flag::REPLIED)
}

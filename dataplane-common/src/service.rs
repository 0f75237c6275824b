//! The frontend maps: `SERVICES` (a frontend, its slot count and flags), `SLOTS` (its
//! backends by slot), `SERVICE_NAMES` (its Service port's name) and `SOURCE_RANGES`
//! (its `loadBalancerSourceRanges`); and the flow hash that picks a slot.

use bytemuck::{Pod, Zeroable};
use core::mem::size_of;

use crate::PROTO_TCP;

/// Key of the `SERVICES` hash map: one frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct ServiceKey {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    /// Who the entry is for: [`SCOPE_ANY`] or [`SCOPE_EXTERNAL`].
    pub scope: u8,
}
const _: () = assert!(size_of::<ServiceKey>() == 8);

/// A frontend entry for every client: pods, the node's sockets, and clients outside
/// the node unless an [`SCOPE_EXTERNAL`] entry of the same frontend exists.
pub const SCOPE_ANY: u8 = 0;
/// A frontend entry only the uplink program (`sliceway_tc_ext`) looks up, before the
/// [`SCOPE_ANY`] one: the frontend of a Service with `externalTrafficPolicy: Local`
/// as clients outside the node reach it (this node's endpoints only, the client's
/// address kept). Without it, clients outside the node are masqueraded.
pub const SCOPE_EXTERNAL: u8 = 1;

/// Value of the `SERVICES` map: the frontend's id and how many slots it publishes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct ServiceValue {
    /// Stable id of the frontend; slots are keyed by it.
    pub id: u32,
    /// Number of valid slots, `0..count`. Zero means no backend.
    pub count: u32,
    /// `SVC_F_*` bits.
    pub flags: u32,
    /// With `SVC_F_AFFINITY`: how long a client keeps its backend, in seconds.
    pub affinity_timeout_s: u32,
}
const _: () = assert!(size_of::<ServiceValue>() == 16);

impl ServiceValue {
    /// Whether a pod's connect (`proto`) to this frontend is translated at the socket
    /// with `--socket-lb-pods`: TCP, with backends, and neither session affinity nor
    /// source ranges (both keyed by the pod's address, which TC sees) nor a pods'
    /// masquerade (`SVC_F_MASQ_PODS`, which TC does); the rest is TC's. The socket programs and `trace --from pod-socket` both ask this.
    #[inline(always)]
    pub fn pod_socket_translates(&self, proto: u8) -> bool {
        proto == PROTO_TCP
            && self.count > 0
            && self.flags & (SVC_F_AFFINITY | SVC_F_SOURCE_RANGES | SVC_F_MASQ_PODS) == 0
    }
}

/// A frontend without backends drops new flows silently (the Service has endpoints
/// on other nodes only and its policy is `Local`); without the bit it rejects them.
pub const SVC_F_DROP_EMPTY: u32 = 1 << 0;
/// `sessionAffinity: ClientIP`: a client IP keeps its backend for
/// `affinity_timeout_s` after its last new connection.
pub const SVC_F_AFFINITY: u32 = 1 << 1;
/// A load-balancer IP with `loadBalancerSourceRanges`: a new connection from a
/// source outside them (`SOURCE_RANGES`) is dropped.
pub const SVC_F_SOURCE_RANGES: u32 = 1 << 2;
/// The slots are a Maglev lookup table (`count` is its prime size), built from the
/// backends' identities alone, so every node picks the same backend for a flow. The
/// programs pick as for any frontend; the agent reads the bit back after a restart.
pub const SVC_F_MAGLEV: u32 = 1 << 3;
/// Direct server return (`--external-mode dsr`): a connection from outside the node
/// that would be masqueraded keeps its client's address instead, and leaves with the
/// frontend in an IPv4 option ([`dsr`](crate::dsr)) or an IPv6 destination options
/// header ([`dsr6`](crate::dsr6)); the backend's node records it and its replies go
/// straight to the client from the frontend's address. Read by the uplink programs
/// only.
pub const SVC_F_DSR: u32 = 1 << 4;
/// An external address (a NodePort, an external IP, a load-balancer IP) of a Service
/// with `externalTrafficPolicy: Cluster`: a pod's new connection to it is
/// masqueraded to the node's address, as kube-proxy's external chain (`ext-*`)
/// marks every connection it sees for masquerade
/// (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go).
/// With `Local` the bit is unset: pods are short-circuited to every endpoint with
/// their address kept. Read by the pods' programs only (clients outside the node
/// are masqueraded without an external entry anyway).
pub const SVC_F_MASQ_PODS: u32 = 1 << 5;

/// What the `SOURCE_RANGES` longest-prefix-match map matches on (after the key's
/// prefix length): a frontend (always its `SCOPE_ANY` key) and a source address. An
/// entry for range `addr/len` has prefix length [`SourceRange::FRONTEND_BITS`] +
/// len, so it matches only sources of that frontend within the range.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SourceRange {
    pub frontend: ServiceKey,
    pub src_be: u32,
}
const _: () = assert!(size_of::<SourceRange>() == 12);

impl SourceRange {
    /// Bits of the key before the source address.
    pub const FRONTEND_BITS: u32 = 64;
    /// The prefix length of a lookup: the whole key.
    pub const LOOKUP_BITS: u32 = 96;

    /// The data of range `addr_be/len` of `frontend`, or of a lookup of source
    /// `addr_be`; the prefix length goes beside it.
    #[inline(always)]
    pub fn of(frontend: ServiceKey, addr_be: u32) -> Self {
        Self {
            frontend: ServiceKey {
                scope: SCOPE_ANY,
                ..frontend
            },
            src_be: addr_be,
        }
    }
}

/// Key of the `SLOTS` hash map: slot `slot` of frontend `service_id`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Pod, Zeroable)]
pub struct SlotKey {
    pub service_id: u32,
    pub slot: u32,
}
const _: () = assert!(size_of::<SlotKey>() == 8);

/// Bytes of a frontend's name kept in the `SERVICE_NAMES` map.
pub const SERVICE_NAME_LEN: usize = 124;

/// Value of the `SERVICE_NAMES` hash map (keyed by frontend id): the Service port's
/// name, `namespace/name:port`, so that `list` and a restarted agent can tell which
/// Service a frontend belongs to. Longer names are cut at `SERVICE_NAME_LEN` bytes.
/// The programs never read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ServiceName {
    pub len: u32,
    pub bytes: [u8; SERVICE_NAME_LEN],
}
const _: () = assert!(size_of::<ServiceName>() == 128);

impl ServiceName {
    pub fn new(name: &str) -> Self {
        let mut bytes = [0u8; SERVICE_NAME_LEN];
        let mut len = name.len().min(SERVICE_NAME_LEN);
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        Self {
            len: len as u32,
            bytes,
        }
    }

    pub fn as_str(&self) -> &str {
        let len = (self.len as usize).min(SERVICE_NAME_LEN);
        core::str::from_utf8(&self.bytes[..len]).unwrap_or("?")
    }
}

/// A `SERVICES` key with port 0 and protocol 0 marks a ClusterIP: traffic to it on a
/// port or protocol no frontend has is rejected (kube-proxy's nftables
/// `cluster-ips` set). Its value has count 0.
pub fn clusterip_marker(addr_be: u32) -> ServiceKey {
    ServiceKey {
        addr_be,
        port_be: 0,
        proto: 0,
        scope: SCOPE_ANY,
    }
}

/// Flow hash used to pick a slot for a new flow. Deterministic, so `trace` and tests
/// can predict the choice; well mixed over client ports. Shared by kernel and user
/// space so both compute the same slot.
#[inline(always)]
pub fn flow_hash(src_be: u32, dst_be: u32, sport_be: u16, dport_be: u16, proto: u8) -> u32 {
    let mut h: u32 = 0x9e37_79b9 ^ (proto as u32);
    h = mix(h, src_be);
    h = mix(h, dst_be);
    h = mix(h, ((sport_be as u32) << 16) | dport_be as u32);
    // Final avalanche (murmur3 fmix32).
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

#[inline(always)]
fn mix(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

//! EndpointSlice identity: port-map keys, ownership, generated names and
//! synthesized UIDs.

use k8s_openapi::api::discovery::v1::{EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// A key for a set of ports independent of their order (upstream's PortMapKey).
pub type PortMapKey = Vec<(String, i32, String, String)>;

/// The key of a list of EndpointSlice ports.
pub fn port_map_key(ports: &[EndpointPort]) -> PortMapKey {
    let mut key: PortMapKey = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or(0),
                p.protocol.clone().unwrap_or_default(),
                p.app_protocol.clone().unwrap_or_default(),
            )
        })
        .collect();
    key.sort();
    key
}

/// Whether the slice has an owner reference to the object with this UID and kind
/// (apiVersion v1), as upstream's ownedBy.
pub fn owned_by(slice: &EndpointSlice, kind: &str, uid: &str) -> bool {
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.kind == kind && o.api_version == "v1")
}

/// A controller owner reference (metav1.NewControllerRef) to a v1 object.
pub fn controller_ref(kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The generateName prefix of a slice (getEndpointSlicePrefix): `<name>-`, or
/// `endpointslice-` when that is not a valid DNS subdomain prefix.
pub fn slice_prefix(name: &str) -> String {
    let prefix = format!("{name}-");
    // NameIsDNSSubdomain with prefix=true: room for the 5-char suffix, lowercase
    // alphanumerics, '-' and '.'.
    let valid = !prefix.is_empty()
        && prefix.len() <= 253 - 5
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && prefix
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if valid {
        prefix
    } else {
        "endpointslice-".into()
    }
}

/// FNV-1a, 64 bits: a stable hash for generated names and synthesized UIDs.
pub fn fnv64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The alphabet of the API server's generateName suffixes (utilrand.String).
pub(super) const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A deterministic 5-character suffix in the API server's alphabet.
pub fn name_suffix(seed: &str) -> String {
    let mut h = fnv64(seed.as_bytes());
    (0..5)
        .map(|_| {
            let c = NAME_ALPHABET[(h % NAME_ALPHABET.len() as u64) as usize] as char;
            h /= NAME_ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// A deterministic UID (UUID-shaped) for objects read from files without one.
pub fn synthetic_uid(kind: &str, namespace: &str, name: &str) -> String {
    let a = fnv64(format!("{kind}/{namespace}/{name}").as_bytes());
    let b = fnv64(format!("{name}/{namespace}/{kind}").as_bytes());
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

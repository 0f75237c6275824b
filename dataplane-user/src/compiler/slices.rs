//! EndpointSlices into endpoints per Service port, as kube-proxy's
//! endpointslicecache merges them
//! (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/endpointslicecache.go>).

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
};

use dataplane_common::{PROTO_SCTP, PROTO_TCP, PROTO_UDP};

use conventions::labels::LABEL_SERVICE_NAME;

use super::{is_other_proxys, Ignored, ObjectRef, Options, Skipped};
use crate::compiler::categorize::EndpointFacts;
use crate::model::{Address, SliceInfo};

/// (port name, protocol) → address → endpoint, its slices merged. Both families'
/// slices merge here; an address is of its slice's `addressType` (checked by
/// [`merge_slice`]), so a frontend takes its family's addresses and with them only
/// its family's slices. IPv4's sort first.
pub(super) type PortEndpoints = HashMap<(String, u8), BTreeMap<(IpAddr, u16), EndpointFacts>>;

/// The slices of one Service: their namespace (`default` when unset) and the
/// Service's name from their label.
pub(super) type EndpointsKey = (String, String);

/// Parses a protocol name; `None` (unset) means TCP, as the API defaults it.
pub(super) fn protocol(p: Option<&str>) -> Result<u8, PortError> {
    match p {
        None | Some("TCP") => Ok(PROTO_TCP),
        Some("UDP") => Ok(PROTO_UDP),
        Some("SCTP") => Ok(PROTO_SCTP),
        Some(other) => Err(PortError::Protocol(other.to_string())),
    }
}

pub(super) fn port_number(p: i32) -> Result<u16, PortError> {
    u16::try_from(p)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(PortError::Range(p))
}

/// What is wrong with a port of a Service or an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum PortError {
    #[error("protocol {0} is not supported (TCP, UDP and SCTP are)")]
    Protocol(String),
    #[error("port {0} is out of range 1-65535")]
    Range(i32),
}

fn slice_ref(slice: &SliceInfo) -> ObjectRef {
    ObjectRef::new(
        "EndpointSlice",
        slice.namespace.as_deref(),
        slice.name.as_deref(),
    )
}

/// Whether a slice is used, and for which Service: what is not used is counted as
/// ignored or skipped with a message.
pub(super) fn classify_slice(
    slice: &SliceInfo,
    opts: &Options,
    ignored: &mut Ignored,
    skipped: &mut Vec<Skipped>,
) -> Option<EndpointsKey> {
    if is_other_proxys(slice.proxy_name.as_ref(), opts) {
        ignored.other_proxy += 1;
        return None;
    }
    if slice.headless {
        ignored.headless += 1;
        return None;
    }
    let Some(service) = &slice.service_name else {
        skipped.push(Skipped {
            object: slice_ref(slice),
            code: "no_service_label",
            reason: format!("no {LABEL_SERVICE_NAME} label: it belongs to no Service"),
        });
        return None;
    };
    // kube-proxy's proxier of each family watches the slices of its addressType;
    // FQDN slices are nobody's (endpointschangetracker.go).
    if family_of(slice).is_none() {
        skipped.push(Skipped {
            object: slice_ref(slice),
            code: "address_type",
            reason: format!(
                "addressType {} is not supported (IPv4 and IPv6 are)",
                slice.address_type
            ),
        });
        return None;
    }
    Some((
        slice.namespace.clone().unwrap_or_else(|| "default".into()),
        service.clone(),
    ))
}

/// The family of a slice's `addressType`: `Some(false)` IPv4, `Some(true)` IPv6.
fn family_of(slice: &SliceInfo) -> Option<bool> {
    match slice.address_type.as_str() {
        "IPv4" => Some(false),
        "IPv6" => Some(true),
        _ => None,
    }
}

/// Adds the endpoints of a used slice to its Service's, as kube-proxy's
/// endpointslicecache merges them (slices in namespace and name order).
pub(super) fn merge_slice(
    slice: &SliceInfo,
    opts: &Options,
    by_port: &mut PortEndpoints,
    skipped: &mut Vec<Skipped>,
) {
    let Some(is_v6) = family_of(slice) else {
        return;
    };
    let family = if is_v6 { "IPv6" } else { "IPv4" };
    for port in &slice.ports {
        // endpointslicecache: a port without a name field, without a number or with
        // number 0 is ignored (with an error in kube-proxy's log; here a message).
        let Some(port_name) = &port.name else {
            skipped.push(Skipped {
                object: slice_ref(slice),
                code: "port_without_name",
                reason: "a port has no name field (unnamed ports have name \"\"); kube-proxy ignores it, so it is ignored".into(),
            });
            continue;
        };
        let Some(number) = port.port.filter(|n| *n != 0) else {
            skipped.push(Skipped {
                object: slice_ref(slice),
                code: "port_without_number",
                reason: format!("port {port_name:?} has no number (or 0); it is ignored as kube-proxy ignores it"),
            });
            continue;
        };
        let proto = match protocol(port.protocol.as_deref()) {
            Ok(p) => p,
            Err(reason) => {
                skipped.push(Skipped {
                    object: slice_ref(slice),
                    code: "protocol",
                    reason: format!("port {number}: {reason}"),
                });
                continue;
            }
        };
        let number = match port_number(number) {
            Ok(n) => n,
            Err(reason) => {
                skipped.push(Skipped {
                    object: slice_ref(slice),
                    code: "port_range",
                    reason: reason.to_string(),
                });
                continue;
            }
        };
        let addrs = by_port.entry((port_name.clone(), proto)).or_default();
        for ep in &slice.endpoints {
            let endpoint = EndpointFacts {
                ready: ep.ready.unwrap_or(true),
                serving: ep.serving.unwrap_or(true),
                terminating: ep.terminating.unwrap_or(false),
                local: opts.node_name.as_deref().is_some_and(|n| !n.is_empty())
                    && ep.node_name.as_deref() == opts.node_name.as_deref(),
                hints: ep.hints.clone(),
            };
            // A slice endpoint has one address (the API allows more, only the first
            // is used, as in kube-proxy).
            let Some(addr) = &ep.address else {
                continue;
            };
            let ip: IpAddr = match addr {
                Address::V4(ip) if !is_v6 => (*ip).into(),
                Address::V6(ip) if is_v6 => (*ip).into(),
                // The API server refuses it in a slice it stores; a file may have it.
                // Never a backend of the other family's frontends.
                Address::V4(_) | Address::V6(_) => {
                    skipped.push(Skipped {
                        object: slice_ref(slice),
                        code: "endpoint_address_family",
                        reason: format!(
                            "endpoint address {} is not an {family} address, and the slice's addressType is {family}; that endpoint is skipped",
                            match addr {
                                Address::V4(ip) => ip.to_string(),
                                Address::V6(ip) => ip.to_string(),
                                Address::Other(s) => s.to_string(),
                            }
                        ),
                    });
                    continue;
                }
                Address::Other(addr) => {
                    skipped.push(Skipped {
                        object: slice_ref(slice),
                        code: "bad_endpoint_address",
                        reason: format!("endpoint address {addr:?} is not an {family} address"),
                    });
                    continue;
                }
            };
            if let Some(why) = conventions::validate::translatable(ip) {
                skipped.push(Skipped {
                    object: slice_ref(slice),
                    code: "refused_endpoint_address",
                    reason: format!("endpoint address {ip} {why}; that endpoint is skipped"),
                });
                continue;
            }
            // endpointslicecache `addEndpoints`: a copy replaces an earlier one of the
            // same address unless it is terminating.
            match addrs.entry((ip, number)) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(endpoint);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    if !endpoint.terminating {
                        o.insert(endpoint);
                    }
                }
            }
        }
    }
}

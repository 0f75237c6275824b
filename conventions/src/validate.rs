//! The front door: what the API server would refuse of an object of a kind the
//! binaries read, checked on every object before either binary keeps it: objects
//! of a manifest directory (so a file can hold nothing that a cluster could not)
//! and objects the API server's watches deliver (which it validated when they were
//! written, under the rules of its release then: [`Rules::Stored`]).
//!
//! Mirrors the API server's validation (k8s.io/kubernetes pkg/apis/core/validation:
//! `ValidateObjectMeta` with a Service's name a DNS-1123 label (`NameIsDNSLabel`,
//! KEP-5311's `RelaxedServiceNameValidation`, locked on in v1.37: `ValidateServiceCreate`),
//! `ValidatePodName`, `ValidateNodeName`, `ValidateEndpointsName` (DNS-1123
//! subdomains), `ValidateNamespaceName` (a DNS-1123 label), `ValidateLabels`;
//! pkg/apis/discovery/validation `ValidateEndpointSliceName`; `validateServicePort`
//! for a Service port's number and protocol; the syntax rules themselves from
//! k8s.io/apimachinery pkg/util/validation), and for IP addresses, one function per
//! rule:
//!
//! | field | rules |
//! |---|---|
//! | Service `spec.clusterIP(s)` | [`legacy_ip`]; `None` first and alone; at most two, one per family; `clusterIPs[0]` = `clusterIP` |
//! | Service `spec.externalIPs` | [`legacy_ip`], then [`endpoint_ip`] |
//! | Service `status.loadBalancer.ingress[].ip` | [`legacy_ip`] |
//! | EndpointSlice IPv4 addresses | [`legacy_ip`], IPv4, then [`endpoint_ip`] |
//! | EndpointSlice IPv6 addresses | [`strict_ip`], IPv6, then [`endpoint_ip`] |
//! | EndpointSlice FQDN addresses | [`fqdn`] |
//! | Endpoints `subsets[].addresses[].ip`, `notReadyAddresses` | [`legacy_ip`], then [`endpoint_ip`] |
//! | Pod `status.podIP`, `status.podIPs[].ip` | [`legacy_ip`] |
//!
//! ([`endpoint_ip`] is upstream's `ValidateEndpointIP`: not unspecified, loopback,
//! link-local or link-local multicast.) Multicast and broadcast addresses pass the
//! API server; [`translatable`] adds them for the agent, which can translate no
//! connection to them and skips such a frontend or backend alone.

use std::net::{IpAddr, Ipv4Addr};

use serde_yaml_ng::Value;

/// A field of an object the API server would refuse, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// The field's path, as the API server names it (`metadata.name`,
    /// `spec.ports[0].port`).
    pub field: String,
    pub reason: String,
}

/// The kinds the binaries read, each with the rule for its name. A Service's name
/// is a DNS-1123 label, so it may start with a digit (KEP-5311, GA and locked on in
/// v1.37:
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/apis/core/validation/validation.go>
/// `ValidateServiceCreate`); a stored Service's name passed the older DNS-1035 rule,
/// which is stricter.
fn name_rule(kind: &str) -> Option<fn(&str) -> Option<String>> {
    match kind {
        "Service" => Some(dns1123_label),
        "Pod" | "Node" | "Endpoints" | "EndpointSlice" => Some(dns1123_subdomain),
        _ => None,
    }
}

/// Which of the API server's rules for IP addresses apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rules {
    /// What the API server of v1.37.2 accepts in a new object, with its default
    /// feature gates (`StrictIPCIDRValidation` is on since 1.36).
    Create,
    /// What an API server may hold: also the legacy forms that older releases
    /// accepted and that validation keeps accepting in objects that have them
    /// (IPv4 parts with leading zeros, read as decimal, and IPv4-mapped IPv6), as
    /// kube-proxy reads them (`netutils.ParseIPSloppy`); EndpointSlices of the
    /// deprecated `addressType: IP` that discovery.k8s.io/v1beta1 wrote, their
    /// addresses unchecked as upstream leaves an unknown type's; Endpoints
    /// addresses are left to their reader, as upstream's mirroring controller
    /// mirrors an object's valid addresses and skips the others. Objects from the
    /// API server and from manifest directories, which stand for what a cluster
    /// holds.
    Stored,
}

/// Checks a typed object as an API server's watch delivered it, under
/// [`Rules::Stored`]: the front door both binaries' API edges share. Only what the
/// rules read is converted ([`Checked::view`]): a watch delivers every object of
/// the cluster, and a Pod's spec, the bulk of it, is never read here.
pub fn stored<T: Checked>(obj: &T) -> Result<(), Invalid> {
    let value = obj.view().map_err(|e| Invalid {
        field: String::new(),
        reason: format!("cannot be read: {e}"),
    })?;
    object(T::KIND, &value, Rules::Stored)
}

/// A kind the front door checks, and the part of an object of it that its rules
/// read, in the object's own field names: `metadata` (name, namespace, labels) and
/// the fields of the kind's rules in [`object`].
pub trait Checked {
    const KIND: &'static str;
    fn view(&self) -> Result<Value, serde_yaml_ng::Error>;
}

/// The metadata the rules read.
#[derive(serde::Serialize)]
struct Meta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<&'a std::collections::BTreeMap<String, String>>,
}

impl<'a> Meta<'a> {
    fn of(meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        Meta {
            name: meta.name.as_deref(),
            namespace: meta.namespace.as_deref(),
            labels: meta.labels.as_ref(),
        }
    }
}

/// An object's metadata beside the fields of its kind's rules.
#[derive(serde::Serialize)]
struct View<'a, R> {
    metadata: Meta<'a>,
    #[serde(flatten)]
    rest: R,
}

fn view<R: serde::Serialize>(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    rest: R,
) -> Result<Value, serde_yaml_ng::Error> {
    serde_yaml_ng::to_value(View {
        metadata: Meta::of(meta),
        rest,
    })
}

mod kinds {
    use k8s_openapi::api::{
        core::v1::{EndpointAddress, Endpoints, Node, Pod, PodIP, Service},
        discovery::v1::EndpointSlice,
    };
    use serde::Serialize;
    use serde_yaml_ng::Value;

    use super::{view, Checked};

    impl Checked for Node {
        const KIND: &'static str = "Node";
        fn view(&self) -> Result<Value, serde_yaml_ng::Error> {
            view(&self.metadata, ())
        }
    }

    impl Checked for Service {
        const KIND: &'static str = "Service";
        fn view(&self) -> Result<Value, serde_yaml_ng::Error> {
            #[derive(Serialize)]
            struct Rest<'a, S, T> {
                #[serde(skip_serializing_if = "Option::is_none")]
                spec: &'a Option<S>,
                #[serde(skip_serializing_if = "Option::is_none")]
                status: &'a Option<T>,
            }
            view(
                &self.metadata,
                Rest {
                    spec: &self.spec,
                    status: &self.status,
                },
            )
        }
    }

    impl Checked for EndpointSlice {
        const KIND: &'static str = "EndpointSlice";
        fn view(&self) -> Result<Value, serde_yaml_ng::Error> {
            #[derive(Serialize)]
            struct Endpoint<'a> {
                addresses: &'a [String],
            }
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct Rest<'a> {
                address_type: &'a str,
                endpoints: Vec<Endpoint<'a>>,
            }
            let endpoints = self
                .endpoints
                .iter()
                .map(|e| Endpoint {
                    addresses: &e.addresses,
                })
                .collect();
            view(
                &self.metadata,
                Rest {
                    address_type: &self.address_type,
                    endpoints,
                },
            )
        }
    }

    impl Checked for Endpoints {
        const KIND: &'static str = "Endpoints";
        fn view(&self) -> Result<Value, serde_yaml_ng::Error> {
            #[derive(Serialize)]
            struct Address<'a> {
                ip: &'a str,
            }
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct Subset<'a> {
                #[serde(skip_serializing_if = "Option::is_none")]
                addresses: Option<Vec<Address<'a>>>,
                #[serde(skip_serializing_if = "Option::is_none")]
                not_ready_addresses: Option<Vec<Address<'a>>>,
            }
            #[derive(Serialize)]
            struct Rest<'a> {
                #[serde(skip_serializing_if = "Option::is_none")]
                subsets: Option<Vec<Subset<'a>>>,
            }
            fn ips(list: &Option<Vec<EndpointAddress>>) -> Option<Vec<Address<'_>>> {
                list.as_ref()
                    .map(|l| l.iter().map(|a| Address { ip: &a.ip }).collect())
            }
            let subsets = self.subsets.as_ref().map(|subsets| {
                subsets
                    .iter()
                    .map(|s| Subset {
                        addresses: ips(&s.addresses),
                        not_ready_addresses: ips(&s.not_ready_addresses),
                    })
                    .collect()
            });
            view(&self.metadata, Rest { subsets })
        }
    }

    impl Checked for Pod {
        const KIND: &'static str = "Pod";
        fn view(&self) -> Result<Value, serde_yaml_ng::Error> {
            #[derive(Serialize)]
            struct Status<'a> {
                #[serde(skip_serializing_if = "Option::is_none")]
                #[serde(rename = "podIP")]
                pod_ip: Option<&'a str>,
                #[serde(skip_serializing_if = "Option::is_none")]
                #[serde(rename = "podIPs")]
                pod_ips: Option<&'a [PodIP]>,
            }
            #[derive(Serialize)]
            struct Rest<'a> {
                #[serde(skip_serializing_if = "Option::is_none")]
                status: Option<Status<'a>>,
            }
            let status = self.status.as_ref().map(|s| Status {
                pod_ip: s.pod_ip.as_deref(),
                pod_ips: s.pod_ips.as_deref(),
            });
            view(&self.metadata, Rest { status })
        }
    }
}

/// Checks an object of a kind the binaries read; other kinds pass unchecked.
pub fn object(kind: &str, value: &Value, rules: Rules) -> Result<(), Invalid> {
    let Some(name_ok) = name_rule(kind) else {
        return Ok(());
    };
    let invalid = |field: &str, reason: String| Invalid {
        field: field.into(),
        reason,
    };
    let meta = value.get("metadata");
    match meta.and_then(|m| m.get("name")) {
        None | Some(Value::Null) => {
            return Err(invalid("metadata.name", "required value".into()));
        }
        Some(Value::String(name)) => {
            if let Some(why) = name_ok(name) {
                return Err(invalid("metadata.name", format!("{name:?}: {why}")));
            }
        }
        Some(_) => return Err(invalid("metadata.name", "must be a string".into())),
    }
    if kind != "Node" {
        match meta.and_then(|m| m.get("namespace")) {
            None | Some(Value::Null) => {}
            Some(Value::String(ns)) if ns.is_empty() => {}
            Some(Value::String(ns)) => {
                if let Some(why) = dns1123_label(ns) {
                    return Err(invalid("metadata.namespace", format!("{ns:?}: {why}")));
                }
            }
            Some(_) => return Err(invalid("metadata.namespace", "must be a string".into())),
        }
    }
    if let Some(Value::Mapping(labels)) = meta.and_then(|m| m.get("labels")) {
        for (k, v) in labels {
            let (Value::String(k), Value::String(v)) = (k, v) else {
                continue; // the typed read says what is wrong with its type
            };
            if let Some(why) = qualified_name(k) {
                return Err(invalid("metadata.labels", format!("key {k:?}: {why}")));
            }
            if let Some(why) = label_value(v) {
                return Err(invalid(
                    &format!("metadata.labels[{k}]"),
                    format!("{v:?}: {why}"),
                ));
            }
        }
    }
    match kind {
        "Service" => {
            service_ports(value)?;
            service_ips(value, rules)
        }
        "EndpointSlice" => slice_addresses(value, rules),
        "Endpoints" => endpoints_addresses(value, rules),
        "Pod" => pod_ips(value, rules),
        _ => Ok(()),
    }
}

fn invalid(field: &str, reason: String) -> Invalid {
    Invalid {
        field: field.into(),
        reason,
    }
}

/// `validateServicePort`: each port's number and protocol.
fn service_ports(value: &Value) -> Result<(), Invalid> {
    if let Some(Value::Sequence(ports)) = value.get("spec").and_then(|s| s.get("ports")) {
        for (i, port) in ports.iter().enumerate() {
            // validateServicePort: a port that is not given is 0 in Go and
            // refused there as out of range; named here for what it is.
            let field = format!("spec.ports[{i}].port");
            match port.get("port") {
                None | Some(Value::Null) => {
                    return Err(invalid(&field, "required value (no port given)".into()))
                }
                Some(Value::Number(p)) if !p.as_i64().is_some_and(|p| (1..=65535).contains(&p)) => {
                    return Err(invalid(
                        &field,
                        format!("{p}: must be between 1 and 65535, inclusive"),
                    ))
                }
                _ => {} // a port of another type: the typed read says so
            }
            // supportedPortProtocols; an empty protocol is defaulted to TCP.
            if let Some(Value::String(proto)) = port.get("protocol") {
                if !matches!(proto.as_str(), "TCP" | "UDP" | "SCTP" | "") {
                    return Err(invalid(
                        &format!("spec.ports[{i}].protocol"),
                        format!("{proto:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A string field of a mapping, `Err` when it is there and not a string.
fn text<'a>(v: Option<&'a Value>, field: &str) -> Result<Option<&'a str>, Invalid> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(field, "must be a string".into())),
    }
}

/// The items of a sequence field (none when it is absent; the typed read says what
/// is wrong with another type).
fn items(v: Option<&Value>) -> &[Value] {
    match v {
        Some(Value::Sequence(s)) => s,
        _ => &[],
    }
}

/// A Service's addresses: `ValidateServiceClusterIPsRelatedFields` for its
/// ClusterIPs, `ValidateService` for its external IPs, `ValidateLoadBalancerStatus`
/// for its load-balancer ingress IPs
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/apis/core/validation/validation.go>).
fn service_ips(value: &Value, rules: Rules) -> Result<(), Invalid> {
    let Some(spec) = value.get("spec") else {
        return Ok(());
    };
    if text(spec.get("type"), "spec.type")? == Some("ExternalName") {
        return Ok(());
    }
    let single = text(spec.get("clusterIP"), "spec.clusterIP")?.filter(|ip| !ip.is_empty());
    let list = items(spec.get("clusterIPs"));
    let mut ips = Vec::new();
    for (i, ip) in list.iter().enumerate() {
        let field = format!("spec.clusterIPs[{i}]");
        ips.push((field.clone(), text(Some(ip), &field)?.unwrap_or_default()));
    }
    match (single, ips.first()) {
        (Some(one), Some((_, first))) if one != *first => {
            return Err(invalid(
                "spec.clusterIPs",
                format!("{first:?}: first value must match `clusterIP` ({one:?})"),
            ))
        }
        // The API server fills one from the other when only one is given.
        (Some(one), None) => ips.push(("spec.clusterIP".into(), one)),
        _ => {}
    }
    let mut families = Vec::new();
    for (i, (field, ip)) in ips.iter().enumerate() {
        if *ip == "None" {
            if i > 0 || ips.len() > 1 {
                return Err(invalid(
                    "spec.clusterIPs",
                    "'None' must be the first and only value".into(),
                ));
            }
            continue;
        }
        let parsed =
            legacy_ip(ip, rules).map_err(|why| invalid(field, format!("{ip:?}: {why}")))?;
        families.push(parsed.is_ipv4());
    }
    if ips.len() > 2 {
        return Err(invalid(
            "spec.clusterIPs",
            "may only hold up to 2 values".into(),
        ));
    }
    if families.len() == 2 && families[0] == families[1] {
        return Err(invalid(
            "spec.clusterIPs",
            "may specify no more than one IP for each IP family".into(),
        ));
    }
    for (i, ip) in items(spec.get("externalIPs")).iter().enumerate() {
        let field = format!("spec.externalIPs[{i}]");
        let Some(ip) = text(Some(ip), &field)? else {
            continue;
        };
        // For historical reasons, ValidateEndpointIP's rules too.
        legacy_ip(ip, rules)
            .and_then(|parsed| endpoint_ip(parsed).map_or(Ok(()), |why| Err(why.into())))
            .map_err(|why| invalid(&field, format!("{ip:?}: {why}")))?;
    }
    let ingress = value
        .get("status")
        .and_then(|s| s.get("loadBalancer"))
        .and_then(|lb| lb.get("ingress"));
    for (i, entry) in items(ingress).iter().enumerate() {
        let field = format!("status.loadBalancer.ingress[{i}].ip");
        if let Some(ip) = text(entry.get("ip"), &field)?.filter(|ip| !ip.is_empty()) {
            legacy_ip(ip, rules).map_err(|why| invalid(&field, format!("{ip:?}: {why}")))?;
        }
    }
    Ok(())
}

/// An EndpointSlice's address type and addresses, as `ValidateEndpointSlice`
/// checks them
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/apis/discovery/validation/validation.go>).
fn slice_addresses(value: &Value, rules: Rules) -> Result<(), Invalid> {
    let address_type = text(value.get("addressType"), "addressType")?.unwrap_or_default();
    // Stored by discovery.k8s.io/v1beta1, and replaced by upstream's reconciler
    // (`TestReconcileEndpointSlicesReplaceDeprecated`: issue 46); its
    // addresses fall through unchecked, as upstream's `validateEndpoints` leaves them.
    if address_type == "IP" && rules == Rules::Stored {
        return Ok(());
    }
    if !matches!(address_type, "IPv4" | "IPv6" | "FQDN") {
        return Err(invalid(
            "addressType",
            if address_type.is_empty() {
                "required value".into()
            } else {
                format!("{address_type:?}: supported values: \"FQDN\", \"IPv4\", \"IPv6\"")
            },
        ));
    }
    for (i, endpoint) in items(value.get("endpoints")).iter().enumerate() {
        let addresses = items(endpoint.get("addresses"));
        if addresses.is_empty() {
            return Err(invalid(
                &format!("endpoints[{i}].addresses"),
                "must contain at least 1 address".into(),
            ));
        }
        for (j, address) in addresses.iter().enumerate() {
            let field = format!("endpoints[{i}].addresses[{j}]");
            let Some(address) = text(Some(address), &field)? else {
                continue;
            };
            let checked = match address_type {
                "IPv4" => legacy_ip(address, rules).and_then(|ip| {
                    if !ip.is_ipv4() {
                        return Err("must be an IPv4 address".into());
                    }
                    endpoint_ip(ip).map_or(Ok(()), |why| Err(why.into()))
                }),
                "IPv6" => strict_ip(address).and_then(|ip| {
                    if !ip.is_ipv6() {
                        return Err("must be an IPv6 address".into());
                    }
                    endpoint_ip(ip).map_or(Ok(()), |why| Err(why.into()))
                }),
                _ => fqdn(address).map_or(Ok(()), Err),
            };
            checked.map_err(|why| invalid(&field, format!("{address:?}: {why}")))?;
        }
    }
    Ok(())
}

/// An Endpoints' addresses, as `validateEndpointAddress` checks them; under
/// [`Rules::Stored`] none: upstream's mirroring controller mirrors the valid ones and
/// skips the others with a warning
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslicemirroring/reconciler.go>),
/// as sliceway's does (issue 46).
fn endpoints_addresses(value: &Value, rules: Rules) -> Result<(), Invalid> {
    if rules == Rules::Stored {
        return Ok(());
    }
    for (i, subset) in items(value.get("subsets")).iter().enumerate() {
        for list in ["addresses", "notReadyAddresses"] {
            for (j, address) in items(subset.get(list)).iter().enumerate() {
                let field = format!("subsets[{i}].{list}[{j}].ip");
                let ip = text(address.get("ip"), &field)?.unwrap_or_default();
                legacy_ip(ip, rules)
                    .and_then(|parsed| endpoint_ip(parsed).map_or(Ok(()), |why| Err(why.into())))
                    .map_err(|why| invalid(&field, format!("{ip:?}: {why}")))?;
            }
        }
    }
    Ok(())
}

/// A Pod's IPs, as `validatePodIPs` checks them.
fn pod_ips(value: &Value, rules: Rules) -> Result<(), Invalid> {
    let Some(status) = value.get("status") else {
        return Ok(());
    };
    if let Some(ip) = text(status.get("podIP"), "status.podIP")?.filter(|ip| !ip.is_empty()) {
        legacy_ip(ip, rules).map_err(|why| invalid("status.podIP", format!("{ip:?}: {why}")))?;
    }
    for (i, entry) in items(status.get("podIPs")).iter().enumerate() {
        let field = format!("status.podIPs[{i}].ip");
        let ip = text(entry.get("ip"), &field)?.unwrap_or_default();
        legacy_ip(ip, rules).map_err(|why| invalid(&field, format!("{ip:?}: {why}")))?;
    }
    Ok(())
}

/// An IP address as Go 1.16's `net.ParseIP` read it, which Kubernetes keeps as
/// `netutils.ParseIPSloppy` for what older releases stored
/// (<https://github.com/kubernetes/utils/blob/be93311217bd/internal/third_party/forked/golang/net/ip.go>):
/// an IPv4 part may have leading zeros, read as decimal (`010.001.002.003` is
/// 10.1.2.3, where libc would read octal), any number of them; IPv6 as usual.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if s.contains(':') {
        return s.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let mut out = [0u8; 4];
    let mut parts = s.split('.');
    for byte in &mut out {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = part.trim_start_matches('0');
        if digits.len() > 3 {
            return None;
        }
        *byte = digits
            .parse::<u16>()
            .map_or(Some(0), |v| u8::try_from(v).ok())?;
    }
    parts
        .next()
        .is_none()
        .then_some(IpAddr::V4(Ipv4Addr::from(out)))
}

/// `IsValidIPForLegacyField`
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apimachinery/pkg/util/validation/ip.go>):
/// an IP address as [`parse_ip_sloppy`] reads it; under [`Rules::Create`] also
/// without [`leading_zeros`] and not [`ipv4_mapped`].
pub fn legacy_ip(s: &str, rules: Rules) -> Result<IpAddr, String> {
    let ip = parse_ip_sloppy(s).ok_or_else(|| {
        "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".to_string()
    })?;
    if rules == Rules::Create {
        if let Some(why) = leading_zeros(s).or_else(|| ipv4_mapped(ip)) {
            return Err(why.into());
        }
    }
    Ok(ip)
}

/// `IsValidIP`, for fields newer than the legacy ones: strict, and in canonical
/// form (RFC 5952 for IPv6).
pub fn strict_ip(s: &str) -> Result<IpAddr, String> {
    let ip = legacy_ip(s, Rules::Create)?;
    if ip.to_string() != s {
        return Err(format!("must be in canonical form ({:?})", ip.to_string()));
    }
    Ok(ip)
}

/// Strict parsing's rule: an address that only [`parse_ip_sloppy`] reads has parts
/// with leading zeros.
pub fn leading_zeros(s: &str) -> Option<&'static str> {
    (parse_ip_sloppy(s).is_some() && s.parse::<IpAddr>().is_err())
        .then_some("must not have leading 0s")
}

/// Strict parsing's rule: no IPv4 address written as IPv6 (`::ffff:1.2.3.4`).
pub fn ipv4_mapped(ip: IpAddr) -> Option<&'static str> {
    matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
        .then_some("must not be an IPv4-mapped IPv6 address")
}

/// `ValidateEndpointIP`'s rules, for endpoint and external IPs: the first that
/// refuses `ip`.
pub fn endpoint_ip(ip: IpAddr) -> Option<&'static str> {
    unspecified(ip)
        .or_else(|| loopback(ip))
        .or_else(|| link_local(ip))
        .or_else(|| link_local_multicast(ip))
}

/// `ValidateEndpointIP`: not unspecified.
pub fn unspecified(ip: IpAddr) -> Option<&'static str> {
    ip.is_unspecified()
        .then_some("may not be unspecified (0.0.0.0, ::)")
}

/// `ValidateEndpointIP`: not loopback.
pub fn loopback(ip: IpAddr) -> Option<&'static str> {
    ip.is_loopback()
        .then_some("may not be in the loopback range (127.0.0.0/8, ::1/128)")
}

/// `ValidateEndpointIP`: not link-local unicast.
pub fn link_local(ip: IpAddr) -> Option<&'static str> {
    let yes = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    };
    yes.then_some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
}

/// `ValidateEndpointIP`: not link-local multicast (Go's `IsLinkLocalMulticast`:
/// 224.0.0.0/24, ff02::/16).
pub fn link_local_multicast(ip: IpAddr) -> Option<&'static str> {
    let yes = match ip {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
    };
    yes.then_some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
}

/// Beyond the API server, which accepts it: not multicast, which no connection can
/// be translated to.
pub fn multicast(ip: IpAddr) -> Option<&'static str> {
    ip.is_multicast()
        .then_some("may not be multicast (224.0.0.0/4, ff00::/8)")
}

/// Beyond the API server, which accepts it: not the IPv4 broadcast address.
pub fn broadcast(ip: IpAddr) -> Option<&'static str> {
    matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()).then_some("may not be the broadcast address")
}

/// Why no connection may be translated to or from `ip`, if none may: the rules of
/// [`endpoint_ip`], [`multicast`] and [`broadcast`]. The agent skips a frontend or
/// backend on such an address alone (a ClusterIP is checked only here: the API
/// server leaves ClusterIPs to its allocator and service CIDRs).
pub fn translatable(ip: IpAddr) -> Option<&'static str> {
    endpoint_ip(ip)
        .or_else(|| multicast(ip))
        .or_else(|| broadcast(ip))
}

/// `IsFullyQualifiedDomainName`: a DNS-1123 subdomain (a final `.` aside) of at
/// least two labels, each a DNS-1123 label (so at most 63 characters)
/// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go>).
pub fn fqdn(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("required value".into());
    }
    let name = s.strip_suffix('.').unwrap_or(s);
    if let Some(why) = dns1123_subdomain(name) {
        return Some(why);
    }
    if !name.contains('.') {
        return Some("should be a domain with at least two segments separated by dots".into());
    }
    name.split('.')
        .find_map(|label| dns1123_label(label).map(|why| format!("{label:?}: {why}")))
}

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
const LABEL_VALUE_MAX: usize = 63;

fn is_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `IsDNS1123Label`: lower-case alphanumerics and `-`, starting and ending with an
/// alphanumeric, at most 63 characters.
pub fn dns1123_label(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "must be 1 to {DNS1123_LABEL_MAX} characters (it has {})",
            b.len()
        ));
    }
    let ok =
        b.iter().all(|c| is_alnum(*c) || *c == b'-') && is_alnum(b[0]) && is_alnum(b[b.len() - 1]);
    (!ok).then(|| {
        "must be a DNS-1123 label: lower-case letters, digits and '-', \
         starting and ending with a letter or digit"
            .into()
    })
}

/// `IsDNS1123Subdomain`: DNS-1123 labels joined by `.`, at most 253 characters.
pub fn dns1123_subdomain(s: &str) -> Option<String> {
    if s.is_empty() || s.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!(
            "must be 1 to {DNS1123_SUBDOMAIN_MAX} characters (it has {})",
            s.len()
        ));
    }
    let ok = s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter().all(|c| is_alnum(*c) || *c == b'-')
            && is_alnum(b[0])
            && is_alnum(b[b.len() - 1])
    });
    (!ok).then(|| {
        "must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', \
         starting and ending with a letter or digit"
            .into()
    })
}

/// `IsQualifiedName`: an optional DNS-1123 subdomain prefix and `/`, then a name of
/// at most 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
pub fn qualified_name(s: &str) -> Option<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(why) = prefix.and_then(dns1123_subdomain) {
        return Some(format!("prefix {why}"));
    }
    if name.is_empty() {
        return Some("the name part must not be empty".into());
    }
    label_value(name)
}

/// `IsValidLabelValue`: empty, or at most 63 alphanumerics (either case), `-`, `_`
/// and `.`, starting and ending alphanumeric.
pub fn label_value(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    if b.len() > LABEL_VALUE_MAX {
        return Some(format!(
            "must be at most {LABEL_VALUE_MAX} characters (it has {})",
            b.len()
        ));
    }
    let ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    (!ok).then(|| {
        "must be letters, digits, '-', '_' and '.', starting and ending with a letter \
         or digit"
            .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kind: &str, yaml: &str) -> Result<(), Invalid> {
        object(kind, &serde_yaml_ng::from_str(yaml).unwrap(), Rules::Create)
    }

    /// Upstream's own example values: `TestIsDNS1123Label`, `TestIsDNS1123Subdomain`,
    /// `TestIsQualifiedName`, `TestIsValidLabelValue` and
    /// `TestIsFullyQualifiedDomainName`
    /// (<https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apimachinery/pkg/util/validation/validation_test.go>).
    #[test]
    fn names_as_the_api_server_checks_them() {
        let a = |n: usize| "a".repeat(n);
        let good_labels = [
            "a",
            "ab",
            "abc",
            "a1",
            "a-1",
            "a--1--2--b",
            "0",
            "01",
            "012",
        ];
        let good_labels = good_labels.into_iter().map(String::from);
        let good_labels = good_labels.chain(["1a", "1-a", "1--a--b--2"].map(String::from));
        for good in good_labels.chain([a(63)]) {
            assert_eq!(dns1123_label(&good), None, "{good}");
        }
        let bad_labels = [
            "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_",
            "_a", "a_b", "1_", "_1", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ",
            " a", "a b", "1 ", " 1", "1 2",
        ];
        for bad in bad_labels.map(String::from).into_iter().chain([a(64)]) {
            assert!(dns1123_label(&bad).is_some(), "{bad}");
        }
        let good_subdomains = [
            "a",
            "ab",
            "abc",
            "a1",
            "a-1",
            "a--1--2--b",
            "0",
            "01",
            "012",
            "1a",
            "1-a",
            "1--a--b--2",
            "a.a",
            "ab.a",
            "abc.a",
            "a1.a",
            "a-1.a",
            "a--1--2--b.a",
            "a.1",
            "ab.1",
            "abc.1",
            "a1.1",
            "a-1.1",
            "a--1--2--b.1",
            "0.a",
            "01.a",
            "012.a",
            "1a.a",
            "1-a.a",
            "0.1",
            "01.1",
            "012.1",
            "1a.1",
            "1-a.1",
            "1--a--b--2.1",
            "a.b.c.d.e",
            "aa.bb.cc.dd.ee",
            "1.2.3.4.5",
            "11.22.33.44.55",
        ];
        for good in good_subdomains
            .map(String::from)
            .into_iter()
            .chain([a(253)])
        {
            assert_eq!(dns1123_subdomain(&good), None, "{good}");
        }
        let bad_subdomains = [
            "",
            "A",
            "ABC",
            "aBc",
            "A1",
            "A-1",
            "1-A",
            "-",
            "a-",
            "-a",
            "1-",
            "-1",
            "_",
            "a_",
            "_a",
            "a_b",
            "1_",
            "_1",
            "1_2",
            ".",
            "a.",
            ".a",
            "a..b",
            "1.",
            ".1",
            "1..2",
            " ",
            "a ",
            " a",
            "a b",
            "1 ",
            " 1",
            "1 2",
            "A.a",
            "aB.a",
            "ab.A",
            "A1.a",
            "a1.A",
            "A.1",
            "aB.1",
            "A1.1",
            "1A.1",
            "0.A",
            "01.A",
            "012.A",
            "1A.a",
            "1a.A",
            "A.B.C.D.E",
            "AA.BB.CC.DD.EE",
            "a.B.c.d.e",
            "aa.bB.cc.dd.ee",
            "a@b",
            "a,b",
            "a_b",
            "a;b",
            "a:b",
            "a%b",
            "a?b",
            "a$b",
        ];
        for bad in bad_subdomains.map(String::from).into_iter().chain([a(254)]) {
            assert!(dns1123_subdomain(&bad).is_some(), "{bad}");
        }
        let good_qualified = [
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "1234",
            "simple/simple",
            "now-with-dashes/simple",
            "now-with-dashes/now-with-dashes",
            "now.with.dots/simple",
            "now-with.dashes-and.dots/simple",
            "1-num.2-num/3-num",
            "1234/5678",
            "1.2.3.4/5678",
            "Uppercase_Is_OK_123",
            "example.com/Uppercase_Is_OK_123",
            "requests.storage-foo",
        ];
        let long_qualified = format!("{}/{}", a(253), "b".repeat(63));
        for good in good_qualified
            .map(String::from)
            .into_iter()
            .chain([a(63), long_qualified])
        {
            assert_eq!(qualified_name(&good), None, "{good}");
        }
        let bad_qualified = [
            "nospecialchars%^=@",
            "cantendwithadash-",
            "-cantstartwithadash-",
            "only/one/slash",
            "Example.com/abc",
            "example_com/abc",
            "example.com/",
            "/simple",
        ];
        let too_long_prefix = format!("{}/abc", a(254));
        for bad in bad_qualified
            .map(String::from)
            .into_iter()
            .chain([a(64), too_long_prefix])
        {
            assert!(qualified_name(&bad).is_some(), "{bad}");
        }
        let good_values = [
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "end-with-num-1",
        ];
        let good_values = good_values.map(String::from).into_iter();
        for good in good_values.chain(["1234".into(), a(63), String::new()]) {
            assert_eq!(label_value(&good), None, "{good}");
        }
        let bad_values = [
            "nospecialchars%^=@",
            "Tama-nui-te-rā.is.Māori.sun",
            "\\backslashes\\are\\bad",
            "-starts-with-dash",
            "ends-with-dash-",
            ".starts.with.dot",
            "ends.with.dot.",
        ];
        for bad in bad_values.map(String::from).into_iter().chain([a(64)]) {
            assert!(label_value(&bad).is_some(), "{bad}");
        }
        let good_fqdns = [
            "a.com",
            "k8s.io",
            "dev.k8s.io",
            "dev.k8s.io.",
            "foo.example.com",
            "this.is.a.really.long.fqdn",
            "bbc.co.uk",
            "10.0.0.1",
            "hyphens-are-good.k8s.io",
        ];
        let longest = format!(
            "{}.{}.{}.{}.k8s.io",
            a(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(54)
        );
        let good_fqdns = good_fqdns.map(String::from).into_iter();
        for good in good_fqdns.chain([format!("{}.k8s.io", a(63)), longest]) {
            assert_eq!(fqdn(&good), None, "{good}");
        }
        let bad_fqdns = [
            ".",
            "...",
            ".io",
            "com",
            ".com",
            "Dev.k8s.io",
            ".foo.example.com",
            "*.example.com",
            "*.bar.com",
            "*.foo.bar.com",
            "underscores_are_bad.k8s.io",
            "foo@bar.example.com",
            "http://foo.example.com",
        ];
        let too_long = format!(
            "{}.{}.{}.{}.k8s.io",
            a(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(55)
        );
        let bad_fqdns = bad_fqdns.map(String::from).into_iter();
        for bad in bad_fqdns.chain([format!("{}.k8s.io", a(64)), too_long]) {
            assert!(fqdn(&bad).is_some(), "{bad}");
        }
    }

    /// Issue 46: what an API server may hold passes as stored: an EndpointSlice of
    /// the deprecated `addressType: IP` (upstream's reconciler replaces it), and an
    /// Endpoints with some invalid addresses (upstream's mirroring controller
    /// mirrors the valid ones); a new object of either is refused.
    #[test]
    fn stored_objects_upstreams_controllers_must_handle_pass() {
        let judge = |kind: &str, yaml: &str, rules: Rules| {
            object(kind, &serde_yaml_ng::from_str(yaml).unwrap(), rules).map_err(|e| e.field)
        };
        let ip_slice = "metadata: {name: s}\naddressType: IP\nendpoints: [{addresses: [10.1.0.5]}]";
        assert_eq!(judge("EndpointSlice", ip_slice, Rules::Stored), Ok(()));
        assert_eq!(
            judge("EndpointSlice", ip_slice, Rules::Create),
            Err("addressType".into())
        );
        let other = "metadata: {name: s}\naddressType: IPX\nendpoints: [{addresses: [10.1.0.5]}]";
        assert_eq!(
            judge("EndpointSlice", other, Rules::Stored),
            Err("addressType".into())
        );
        let endpoints = "metadata: {name: e}\nsubsets: [{addresses: [{ip: 10.1.0.5}, {ip: not-an-ip}, {ip: 127.0.0.1}]}]";
        assert_eq!(judge("Endpoints", endpoints, Rules::Stored), Ok(()));
        assert_eq!(
            judge("Endpoints", endpoints, Rules::Create),
            Err("subsets[0].addresses[1].ip".into())
        );
    }

    /// Issue 46: a Service's name is a DNS-1123 label (KEP-5311), so `1api` is a
    /// valid name, new or stored; a Pod's, a Node's, an Endpoints' and an
    /// EndpointSlice's are DNS-1123 subdomains; a namespace is a DNS-1123 label.
    #[test]
    fn a_services_name_is_a_dns_1123_label() {
        let named = |kind: &str, name: &str, rules: Rules| {
            let yaml =
                format!("metadata: {{name: {name:?}, namespace: default}}\naddressType: IPv4");
            object(kind, &serde_yaml_ng::from_str(&yaml).unwrap(), rules)
        };
        for rules in [Rules::Create, Rules::Stored] {
            for good in ["1api", "0", "1-a", "web"] {
                assert_eq!(named("Service", good, rules), Ok(()), "{good}");
            }
            for bad in ["1.2", "a.b", "Api", "-a", "a_b"] {
                assert!(named("Service", bad, rules).is_err(), "{bad}");
            }
            for kind in ["Pod", "Node", "Endpoints", "EndpointSlice"] {
                assert_eq!(named(kind, "1api.x", rules), Ok(()), "{kind}");
                assert!(named(kind, "a..b", rules).is_err(), "{kind}");
            }
        }
        let ns = |ns: &str| {
            check(
                "Service",
                &format!("metadata: {{name: web, namespace: {ns:?}}}"),
            )
        };
        assert_eq!(ns("1-ns"), Ok(()));
        assert!(ns("a.b").is_err());
    }

    #[test]
    fn objects_the_api_server_would_refuse() {
        let svc = |meta: &str, ports: &str| {
            check(
                "Service",
                &format!("metadata: {meta}\nspec: {{ports: {ports}}}"),
            )
        };
        assert_eq!(svc("{name: web}", "[{port: 80}]"), Ok(()));
        let field = |r: Result<(), Invalid>| r.unwrap_err().field;
        assert_eq!(field(svc("{}", "[]")), "metadata.name");
        assert_eq!(field(svc("{name: a/b}", "[]")), "metadata.name");
        assert_eq!(
            field(svc(&format!("{{name: {}}}", "a".repeat(300)), "[]")),
            "metadata.name"
        );
        assert_eq!(
            field(svc("{name: web, namespace: A}", "[]")),
            "metadata.namespace"
        );
        assert_eq!(
            field(svc("{name: web, labels: {a/b/c: x}}", "[]")),
            "metadata.labels"
        );
        assert_eq!(
            field(svc("{name: web, labels: {a: -x}}", "[]")),
            "metadata.labels[a]"
        );
        let missing = svc("{name: web}", "[{port: 80}, {name: b, protocol: TCP}]").unwrap_err();
        assert_eq!(missing.field, "spec.ports[1].port");
        assert!(missing.reason.contains("required"), "{missing:?}");
        assert_eq!(
            field(svc("{name: web}", "[{port: 0}]")),
            "spec.ports[0].port"
        );
        assert_eq!(
            field(svc("{name: web}", "[{port: 65536}]")),
            "spec.ports[0].port"
        );
        assert_eq!(
            field(svc("{name: web}", "[{port: 80, protocol: ICMP}]")),
            "spec.ports[0].protocol"
        );
        // Kinds the binaries do not read are not theirs to judge.
        assert_eq!(check("ConfigMap", "metadata: {name: A/B}"), Ok(()));
    }

    #[test]
    fn addresses_as_the_api_server_reads_them() {
        let v4 = |s: &str| parse_ip_sloppy(s).map(|ip| ip.to_string());
        assert_eq!(v4("10.1.2.3").as_deref(), Some("10.1.2.3"));
        // Leading zeros are decimal, as many as written.
        assert_eq!(v4("010.001.002.0003").as_deref(), Some("10.1.2.3"));
        assert_eq!(v4("0.0.0.0255").as_deref(), Some("0.0.0.255"));
        for bad in [
            "256.1.1.1",
            "10.96.7",
            "10.96.7.1.5",
            "1..2.3",
            "a.b.c.d",
            "",
            "1.2.3.4 ",
        ] {
            assert_eq!(v4(bad), None, "{bad}");
        }
        assert_eq!(v4("fd00::1").as_deref(), Some("fd00::1"));
        // A new object may not use the legacy forms; a stored one may.
        assert_eq!(
            legacy_ip("010.96.0.1", Rules::Create),
            Err("must not have leading 0s".into())
        );
        assert_eq!(
            legacy_ip("010.96.0.1", Rules::Stored),
            Ok("10.96.0.1".parse().unwrap())
        );
        assert_eq!(
            legacy_ip("::ffff:10.96.0.1", Rules::Create),
            Err("must not be an IPv4-mapped IPv6 address".into())
        );
        assert!(legacy_ip("::ffff:10.96.0.1", Rules::Stored).is_ok());
        assert!(strict_ip("FD00::1").is_err());
        assert!(strict_ip("fd00::1").is_ok());
        // ValidateEndpointIP, then the agent's own two.
        let why = |s: &str| translatable(s.parse().unwrap());
        for (ip, refused) in [
            ("0.0.0.0", endpoint_ip as fn(IpAddr) -> Option<&'static str>),
            ("127.0.0.5", endpoint_ip),
            ("169.254.169.254", endpoint_ip),
            ("224.0.0.1", endpoint_ip),
            ("fe80::1", endpoint_ip),
            ("::1", endpoint_ip),
            ("ff02::1", endpoint_ip),
            ("239.1.1.1", multicast),
            ("255.255.255.255", broadcast),
        ] {
            assert!(refused(ip.parse().unwrap()).is_some(), "{ip}");
            assert_eq!(why(ip), refused(ip.parse().unwrap()), "{ip}");
        }
        assert_eq!(endpoint_ip("239.1.1.1".parse().unwrap()), None);
        assert_eq!(why("10.244.1.5"), None);
        assert_eq!(fqdn("example.com"), None);
        assert!(fqdn("example").is_some());
        assert!(fqdn("Example.com").is_some());
    }

    #[test]
    fn objects_with_addresses_the_api_server_would_refuse() {
        let field = |kind: &str, yaml: &str, rules| {
            object(kind, &serde_yaml_ng::from_str(yaml).unwrap(), rules)
                .err()
                .map(|e| e.field)
        };
        let svc = |spec: &str| format!("metadata: {{name: web}}\nspec: {spec}");
        let create = Rules::Create;
        assert_eq!(
            field("Service", &svc("{clusterIP: 10.96.0.1}"), create),
            None
        );
        assert_eq!(field("Service", &svc("{clusterIP: None}"), create), None);
        assert_eq!(
            field("Service", &svc("{clusterIP: 10.96.7}"), create).as_deref(),
            Some("spec.clusterIP")
        );
        assert_eq!(
            field("Service", &svc("{clusterIP: 010.96.0.1}"), create).as_deref(),
            Some("spec.clusterIP")
        );
        assert_eq!(
            field("Service", &svc("{clusterIP: 010.96.0.1}"), Rules::Stored),
            None
        );
        // The API server leaves a ClusterIP's range to its allocator.
        assert_eq!(
            field("Service", &svc("{clusterIP: 127.0.0.1}"), create),
            None
        );
        assert_eq!(
            field(
                "Service",
                &svc("{clusterIP: 10.96.0.1, clusterIPs: [10.96.0.2]}"),
                create
            )
            .as_deref(),
            Some("spec.clusterIPs")
        );
        assert_eq!(
            field(
                "Service",
                &svc("{clusterIPs: [10.96.0.1, 10.96.0.2]}"),
                create
            )
            .as_deref(),
            Some("spec.clusterIPs")
        );
        assert_eq!(
            field(
                "Service",
                &svc("{clusterIPs: [10.96.0.1, \"fd00::1\"]}"),
                create
            ),
            None
        );
        assert_eq!(
            field("Service", &svc("{clusterIPs: [None, 10.96.0.1]}"), create).as_deref(),
            Some("spec.clusterIPs")
        );
        assert_eq!(
            field(
                "Service",
                &svc("{clusterIP: 10.96.0.1, externalIPs: [1.2.3.4, 169.254.169.254]}"),
                create
            )
            .as_deref(),
            Some("spec.externalIPs[1]")
        );
        assert_eq!(
            field(
                "Service",
                &(svc("{clusterIP: 10.96.0.1, type: LoadBalancer}")
                    + "\nstatus: {loadBalancer: {ingress: [{ip: 1.2.3}]}}"),
                create
            )
            .as_deref(),
            Some("status.loadBalancer.ingress[0].ip")
        );
        assert_eq!(
            field(
                "Service",
                &svc("{type: ExternalName, clusterIP: x}"),
                create
            ),
            None
        );
        let slice = |address_type: &str, address: &str| {
            format!("metadata: {{name: s}}\naddressType: {address_type}\nendpoints: [{{addresses: [\"{address}\"]}}]")
        };
        assert_eq!(
            field("EndpointSlice", &slice("IPv4", "10.244.1.5"), create),
            None
        );
        for (t, a) in [
            ("IPv4", "127.0.0.1"),
            ("IPv4", "224.0.0.5"),
            ("IPv4", "010.244.1.5"),
            ("IPv4", "fd00::1"),
            ("IPv6", "FD00::1"),
            ("IPv6", "10.244.1.5"),
            ("FQDN", "example"),
        ] {
            assert_eq!(
                field("EndpointSlice", &slice(t, a), create).as_deref(),
                Some("endpoints[0].addresses[0]"),
                "{t} {a}"
            );
        }
        assert_eq!(
            field(
                "EndpointSlice",
                &slice("IPv4", "010.244.1.5"),
                Rules::Stored
            ),
            None
        );
        // The API server accepts what only the agent cannot use.
        assert_eq!(
            field("EndpointSlice", &slice("IPv4", "255.255.255.255"), create),
            None
        );
        assert_eq!(
            field("EndpointSlice", &slice("IPX", "1.2.3.4"), create).as_deref(),
            Some("addressType")
        );
        assert_eq!(
            field(
                "Endpoints",
                "metadata: {name: e}\nsubsets: [{notReadyAddresses: [{ip: 0.0.0.0}]}]",
                create
            )
            .as_deref(),
            Some("subsets[0].notReadyAddresses[0].ip")
        );
        assert_eq!(
            field(
                "Pod",
                "metadata: {name: p}\nstatus: {podIPs: [{ip: 10.244.1.5}, {ip: 10.244.1}]}",
                create
            )
            .as_deref(),
            Some("status.podIPs[1].ip")
        );
    }

    /// The watches' front door reads only a view of each object ([`Checked::view`]):
    /// it must judge every object as the whole object converted would be judged,
    /// refusals (the same field and reason) and passes alike.
    #[test]
    fn a_view_is_judged_as_its_whole_object() {
        use k8s_openapi::api::{
            core::v1::{Endpoints, Node, Pod, Service},
            discovery::v1::EndpointSlice,
        };
        fn same<T: Checked + serde::Serialize + serde::de::DeserializeOwned>(yaml: &str) -> bool {
            let obj: T = serde_yaml_ng::from_str(yaml).unwrap();
            let whole = object(
                T::KIND,
                &serde_yaml_ng::to_value(&obj).unwrap(),
                Rules::Stored,
            );
            let seen = stored(&obj);
            assert_eq!(seen, whole, "{} {yaml}", T::KIND);
            seen.is_err()
        }
        let pod_spec = "spec: {nodeName: n1, containers: [{name: c, image: i}]}";
        // Kind, judge (whether refused, after checking both ways agree), object,
        // refused.
        type Judge = fn(&str) -> bool;
        let cases: [(&str, Judge, &str, bool); 21] = [
            ("Node", same::<Node>, "metadata: {name: n1, labels: {a: b}}", false),
            ("Node", same::<Node>, "metadata: {name: N_1}", true),
            ("Node", same::<Node>, "metadata: {name: n1, labels: {'a/b/c': x}}", true),
            ("Service", same::<Service>, "metadata: {name: web, namespace: default}\nspec: {clusterIPs: [10.0.0.1, 'fd00::1'], ports: [{port: 80}]}", false),
            ("Service", same::<Service>, "metadata: {name: web}\nspec: {ports: [{port: 0}]}", true),
            ("Service", same::<Service>, "metadata: {name: web, namespace: Bad}", true),
            ("Service", same::<Service>, "metadata: {name: web}\nspec: {clusterIP: 10.0.0.1, clusterIPs: [10.0.0.2]}", true),
            ("Service", same::<Service>, "metadata: {name: web}\nspec: {ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 300.1.1.1}]}}", true),
            ("EndpointSlice", same::<EndpointSlice>, "metadata: {name: s, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.1.0.5]}]", false),
            ("EndpointSlice", same::<EndpointSlice>, "metadata: {name: s}\naddressType: IPv4\nendpoints: [{addresses: [127.0.0.1]}]", true),
            ("EndpointSlice", same::<EndpointSlice>, "metadata: {name: s}\naddressType: IPv6\nendpoints: [{addresses: [10.1.0.5]}]", true),
            ("Endpoints", same::<Endpoints>, "metadata: {name: e}\nsubsets: [{addresses: [{ip: 10.1.0.5}]}]", false),
            // A stored Endpoints' addresses are its reader's to skip (mirroring).
            ("Endpoints", same::<Endpoints>, "metadata: {name: e}\nsubsets: [{notReadyAddresses: [{ip: 0.0.0.0}]}]", false),
            ("Endpoints", same::<Endpoints>, "metadata: {name: E}\nsubsets: [{notReadyAddresses: [{ip: 10.1.0.5}]}]", true),
            ("Endpoints", same::<Endpoints>, "metadata: {name: e}\nsubsets: [{addresses: [{ip: 10.1.0.5, nodeName: n1, targetRef: {kind: Pod, name: p}}], notReadyAddresses: [{ip: 10.1.0.6}], ports: [{port: 80}]}, {addresses: [{ip: 10.1.0.7}]}]", false),
            ("EndpointSlice", same::<EndpointSlice>, "metadata: {name: s}\naddressType: IPv4\nendpoints: [{addresses: [10.1.0.5], conditions: {ready: true}, targetRef: {kind: Pod, name: p}}, {addresses: []}]", true),
            ("EndpointSlice", same::<EndpointSlice>, "metadata: {name: s}\naddressType: FQDN\nendpoints: [{addresses: [example.com]}]\nports: [{port: 80}]", false),
            ("Pod", same::<Pod>, "metadata: {name: p, labels: {app: web}}\nstatus: {podIP: 10.1.0.5, podIPs: [{ip: 10.1.0.5}]}", false),
            ("Pod", same::<Pod>, "metadata: {name: p}\nstatus: {podIP: 10.1.0}", true),
            ("Pod", same::<Pod>, "metadata: {name: p}\nstatus: {podIPs: [{ip: 10.1.0.5}, {ip: 'fe80::1x'}]}", true),
            ("Pod", same::<Pod>, "metadata: {name: p, labels: {app: -web}}", true),
        ];
        for (kind, same, yaml, refused) in cases {
            let yaml = if kind == "Pod" {
                format!("{yaml}\n{pod_spec}")
            } else {
                yaml.to_string()
            };
            assert_eq!(same(&yaml), refused, "{kind}: {yaml}");
        }
    }
}

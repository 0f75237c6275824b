//! The cluster's ServiceCIDRs (`networking.k8s.io/v1`), as kube-proxy's nftables
//! mode uses them: the union of every object's `spec.cidrs`, by family
//! (`OnServiceCIDRsChanged`,
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/nftables/proxier.go>;
//! the objects come as `ServiceCIDRConfig` hands them,
//! <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/proxy/config/config.go>).
//! New traffic to an address inside them that no Service holds as its ClusterIP is
//! dropped ("Drop traffic to unallocated ClusterIPs"); with none, nothing is.
//!
//! A cidr that does not parse, or is not in canonical form (host bits set, as the API
//! server refuses it), is skipped with a message naming the object; the others go on.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use super::prefix::{self, BadPrefix};
use super::{ObjectRef, Skipped};
use crate::model::ServiceCidrInfo;

/// The prefixes of every ServiceCIDR, by family: (address, prefix length), the
/// address with its host bits zero.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceCidrs {
    pub v4: BTreeSet<(Ipv4Addr, u8)>,
    pub v6: BTreeSet<(Ipv6Addr, u8)>,
}

impl ServiceCidrs {
    /// Whether there is no ServiceCIDR of either family.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
}

/// The skip reason's code, for `sliceway_objects_skipped{kind="ServiceCIDR"}`.
pub const BAD_CIDR: &str = "bad_cidr";

/// The union of the objects' cidrs, and one message per cidr skipped.
pub fn service_cidrs(objects: &[ServiceCidrInfo]) -> (ServiceCidrs, Vec<Skipped>) {
    let mut out = ServiceCidrs::default();
    let mut skipped = Vec::new();
    for o in objects {
        for (i, text) in o.cidrs.iter().enumerate() {
            match parse_cidr(text) {
                Ok((IpAddr::V4(a), len)) => {
                    out.v4.insert((a, len));
                }
                Ok((IpAddr::V6(a), len)) => {
                    out.v6.insert((a, len));
                }
                Err(why) => skipped.push(Skipped {
                    object: ObjectRef {
                        kind: "ServiceCIDR",
                        namespace: String::new(),
                        name: o.name.clone(),
                    },
                    code: BAD_CIDR,
                    reason: format!(
                        "spec.cidrs[{i}]: {text:?} {why}; this cidr is skipped, the others are used"
                    ),
                }),
            }
        }
    }
    (out, skipped)
}

/// `a.b.c.d/n` or an IPv6 address and `/n`, canonical: the address is the network's
/// (the API server's `IsValidCIDR` rule).
fn parse_cidr(text: &str) -> Result<(IpAddr, u8), String> {
    let syntax = prefix::Syntax {
        address: prefix::exact,
        canonical_length: true,
    };
    let (addr, len) = prefix::parse(text, syntax).map_err(|e| match e {
        BadPrefix::NoLength => "is not a CIDR (no prefix length)".to_string(),
        BadPrefix::Address(addr) => format!("is not a CIDR ({addr:?} is not an IP address)"),
        BadPrefix::Length { text, .. } => format!("is not a CIDR (prefix length {text:?})"),
    })?;
    let network = match addr {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & super::prefix_mask(len))),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & super::prefix_mask6(len))),
    };
    if network != addr {
        return Err(format!("is not in canonical form ({network}/{len})"));
    }
    Ok((addr, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44: what a ServiceCIDR's `spec.cidrs` accepts and refuses, with its
    /// messages.
    #[test]
    fn service_cidrs_read_each_cidr_case_as_before() {
        let got: Vec<String> = crate::compiler::CIDR_CASES
            .iter()
            .map(|s| match parse_cidr(s) {
                Ok((ip, len)) => format!("{s:?} ok {ip}/{len}"),
                Err(e) => format!("{s:?} err {e}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                "\"10.0.0.0/8\" ok 10.0.0.0/8",
                "\"10.1.2.3/8\" err is not in canonical form (10.0.0.0/8)",
                "\"10.0.0.0/+8\" err is not a CIDR (prefix length \"+8\")",
                "\"10.0.0.0/08\" err is not a CIDR (prefix length \"08\")",
                "\"10.0.0.0/0\" err is not in canonical form (0.0.0.0/0)",
                "\"10.0.0.0/00\" err is not a CIDR (prefix length \"00\")",
                "\"10.0.0.0/32\" ok 10.0.0.0/32",
                "\"10.0.0.0/33\" err is not a CIDR (prefix length \"33\")",
                "\"10.0.0.0/256\" err is not a CIDR (prefix length \"256\")",
                "\"10.0.0.0/-1\" err is not a CIDR (prefix length \"-1\")",
                "\"10.0.0.0\" err is not a CIDR (no prefix length)",
                "\"10.0.0.0/\" err is not a CIDR (prefix length \"\")",
                "\"/8\" err is not a CIDR (\"\" is not an IP address)",
                "\"010.0.0.0/8\" err is not a CIDR (\"010.0.0.0\" is not an IP address)",
                "\"10.0.0/8\" err is not a CIDR (\"10.0.0\" is not an IP address)",
                "\"x/8\" err is not a CIDR (\"x\" is not an IP address)",
                "\"10.0.0.0/8/9\" err is not a CIDR (prefix length \"8/9\")",
                "\" 10.0.0.0/8 \" err is not a CIDR (\" 10.0.0.0\" is not an IP address)",
                "\"10.0.0.0 /8\" err is not a CIDR (\"10.0.0.0 \" is not an IP address)",
                "\"10.0.0.0/ 8\" err is not a CIDR (prefix length \" 8\")",
                "\"fd00::/8\" ok fd00::/8",
                "\"fd00::1/8\" err is not in canonical form (fd00::/8)",
                "\"fd00::/128\" ok fd00::/128",
                "\"fd00::/129\" err is not a CIDR (prefix length \"129\")",
                "\"fd00::/+8\" err is not a CIDR (prefix length \"+8\")",
                "\"fd00::/008\" err is not a CIDR (prefix length \"008\")",
                "\"::/0\" ok ::/0",
                "\"::ffff:10.0.0.0/104\" ok ::ffff:10.0.0.0/104",
                "\"fd00::/ 8\" err is not a CIDR (prefix length \" 8\")",
            ]
        );
    }

    fn cidr(name: &str, cidrs: &[&str]) -> ServiceCidrInfo {
        ServiceCidrInfo {
            name: name.into(),
            cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn the_union_of_every_object_by_family() {
        let (out, skipped) = service_cidrs(&[
            cidr("kubernetes", &["10.96.0.0/16", "fd00:10:96::/112"]),
            cidr("extra", &["10.97.0.0/24"]),
            // The same prefix twice is one entry.
            cidr("again", &["10.96.0.0/16"]),
        ]);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(
            out.v4,
            [
                ("10.96.0.0".parse().unwrap(), 16),
                ("10.97.0.0".parse().unwrap(), 24)
            ]
            .into()
        );
        assert_eq!(out.v6, [("fd00:10:96::".parse().unwrap(), 112)].into());
        assert!(service_cidrs(&[]).0.is_empty());
    }

    #[test]
    fn a_bad_cidr_is_skipped_with_a_message_and_the_others_kept() {
        let (out, skipped) = service_cidrs(&[cidr(
            "mixed",
            &[
                "10.96.0.1/16",
                "10.96.0.0",
                "nonsense/8",
                "10.0.0.0/33",
                "10.0.0.0/08",
                "fd00::/112",
                "10.200.0.0/16",
            ],
        )]);
        assert_eq!(out.v4, [("10.200.0.0".parse().unwrap(), 16)].into());
        assert_eq!(out.v6, [("fd00::".parse().unwrap(), 112)].into());
        let reasons: Vec<&str> = skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(skipped.len(), 5, "{reasons:#?}");
        assert!(skipped.iter().all(|s| s.object.kind == "ServiceCIDR"
            && s.object.name == "mixed"
            && s.code == BAD_CIDR));
        assert!(
            reasons[0].starts_with(
                "spec.cidrs[0]: \"10.96.0.1/16\" is not in canonical form (10.96.0.0/16)"
            ),
            "{reasons:#?}"
        );
        assert!(reasons[1].contains("no prefix length"), "{reasons:#?}");
        assert!(reasons[2].contains("is not an IP address"), "{reasons:#?}");
        assert!(reasons[3].contains("prefix length \"33\""), "{reasons:#?}");
        assert!(reasons[4].contains("prefix length \"08\""), "{reasons:#?}");
    }

    #[test]
    fn whole_families_and_single_addresses_are_prefixes_too() {
        let (out, skipped) = service_cidrs(&[cidr("edges", &["0.0.0.0/0", "10.1.2.3/32", "::/0"])]);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(out.v4.len(), 2);
        assert_eq!(out.v6, [(Ipv6Addr::UNSPECIFIED, 0)].into());
    }
}

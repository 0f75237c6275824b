//! The front door: what the API server would refuse of an object of a kind the
//! binaries read, checked on every object of a manifest directory before either
//! binary keeps it, so a file can hold nothing that a cluster could not.
//!
//! Mirrors the API server's validation (k8s.io/kubernetes pkg/apis/core/validation:
//! `ValidateObjectMeta` with `ValidateServiceName` (a DNS-1035 label),
//! `ValidatePodName`, `ValidateNodeName`, `ValidateEndpointsName` (DNS-1123
//! subdomains), `ValidateNamespaceName` (a DNS-1123 label), `ValidateLabels`;
//! pkg/apis/discovery/validation `ValidateEndpointSliceName`; `validateServicePort`
//! for a Service port's number and protocol; the syntax rules themselves from
//! k8s.io/apimachinery pkg/util/validation). IP addresses are checked where they
//! are read, by the agent's compiler (which names the address it skips) and the
//! reconcilers.

use serde_yaml_ng::Value;

/// A field of an object the API server would refuse, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// The field's path, as the API server names it (`metadata.name`,
    /// `spec.ports[0].port`).
    pub field: String,
    pub reason: String,
}

/// The kinds the binaries read, each with the rule for its name.
fn name_rule(kind: &str) -> Option<fn(&str) -> Option<String>> {
    match kind {
        "Service" => Some(dns1035_label),
        "Pod" | "Node" | "Endpoints" | "EndpointSlice" => Some(dns1123_subdomain),
        _ => None,
    }
}

/// Checks an object of a kind the binaries read; other kinds pass unchecked.
pub fn object(kind: &str, value: &Value) -> Result<(), Invalid> {
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
    if kind == "Service" {
        if let Some(Value::Sequence(ports)) = value.get("spec").and_then(|s| s.get("ports")) {
            for (i, port) in ports.iter().enumerate() {
                // validateServicePort: a port that is not given is 0 in Go and
                // refused there as out of range; named here for what it is.
                let field = format!("spec.ports[{i}].port");
                match port.get("port") {
                    None | Some(Value::Null) => {
                        return Err(invalid(&field, "required value (no port given)".into()))
                    }
                    Some(Value::Number(p))
                        if !p.as_i64().is_some_and(|p| (1..=65535).contains(&p)) =>
                    {
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
    }
    Ok(())
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

/// `IsDNS1035Label`: a DNS-1123 label that starts with a letter.
pub fn dns1035_label(s: &str) -> Option<String> {
    if let Some(why) = dns1123_label(s) {
        return Some(why.replace("DNS-1123", "DNS-1035"));
    }
    (!s.as_bytes()[0].is_ascii_lowercase())
        .then(|| "must be a DNS-1035 label: it must start with a lower-case letter".into())
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
        object(kind, &serde_yaml_ng::from_str(yaml).unwrap())
    }

    #[test]
    fn names_as_the_api_server_checks_them() {
        assert_eq!(dns1035_label("web"), None);
        assert!(dns1035_label("1web").is_some());
        assert!(dns1035_label("a/b").is_some());
        assert!(dns1035_label(&"a".repeat(64)).is_some());
        assert_eq!(dns1123_subdomain("web-abcde.x"), None);
        assert!(dns1123_subdomain("Web").is_some());
        assert!(dns1123_subdomain("a..b").is_some());
        assert_eq!(qualified_name("kubernetes.io/service-name"), None);
        assert_eq!(qualified_name("app"), None);
        assert!(qualified_name("a/b/c").is_some());
        assert!(qualified_name("x/").is_some());
        assert_eq!(label_value(""), None);
        assert!(label_value("-x").is_some());
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
}

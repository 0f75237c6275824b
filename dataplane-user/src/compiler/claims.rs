//! Frontends asked for by Services, and who gets one several ask for.

use super::{
    any_frontend_addr, is_any_clusterip_marker, proto_name, AnyFrontend, FrontendKey, ObjectRef,
    ServicePortName, Skipped,
};

/// A frontend a Service asks for. When several ask for one, a ClusterIP (or its
/// marker) comes before an external or load-balancer IP, then the older Service (by
/// creation timestamp; without one, first), then namespace and name: the first keeps
/// it, and every one of them is reported.
#[derive(Clone, Debug)]
pub(super) struct Claim {
    pub(super) key: FrontendKey,
    /// Of the key's family.
    pub(super) frontend: AnyFrontend,
    pub(super) order: ClaimOrder,
}

/// (0 for a ClusterIP or its marker, 1 for an external or load-balancer IP; the
/// Service's creation timestamp).
pub(super) type ClaimOrder = (u8, Option<String>);

impl Claim {
    /// The Service asking.
    pub(super) fn by(&self) -> ObjectRef {
        ObjectRef {
            kind: "Service",
            namespace: self.frontend.service().namespace.to_string(),
            name: self.frontend.service().name.to_string(),
        }
    }
}

/// The messages of a frontend several Services ask for (`who` in precedence order):
/// each that does not get it, and the one that keeps it.
pub(super) fn conflict_messages(key: &FrontendKey, who: &[&Claim]) -> Vec<Skipped> {
    if who.len() < 2 {
        return Vec::new();
    }
    let owner = who[0].frontend.service();
    let mut out: Vec<Skipped> = who[1..]
        .iter()
        .map(|c| conflict(key, c.by(), owner))
        .collect();
    let others: Vec<String> = who[1..].iter().map(|c| c.by().to_string()).collect();
    out.push(Skipped {
        object: who[0].by(),
        code: "frontend_kept",
        reason: format!(
            "{} is also asked for by {}; this Service keeps it (a ClusterIP before an external IP, then the oldest Service)",
            any_frontend_addr(key),
            others.join(", ")
        ),
    });
    out
}

/// The message of a Service that asks for another one's frontend.
fn conflict(key: &FrontendKey, by: ObjectRef, winner: &ServicePortName) -> Skipped {
    let vip = key.ip();
    let number = key.port();
    if is_any_clusterip_marker(key) {
        return Skipped {
            object: by,
            code: "clusterip_conflict",
            reason: format!(
                "ClusterIP {vip} is already the ClusterIP of {winner}; its undeclared ports are rejected as that Service's"
            ),
        };
    }
    Skipped {
        object: by,
        code: "frontend_conflict",
        reason: format!(
            "{}:{number}/{} is already the frontend of {winner}; this one is skipped",
            match vip {
                std::net::IpAddr::V4(v4) => v4.to_string(),
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            },
            proto_name(key.proto()),
        ),
    }
}

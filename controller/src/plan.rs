//! A plan: the objects to create, update and delete, in the order they would be
//! applied, and its JSON and table renderings (`sliceway-controller plan`).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Serialize;

use crate::util;

/// An object the controllers manage. Serializes as the object itself, with
/// `apiVersion` and `kind`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Object {
    /// A `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice(EndpointSlice),
    /// A `v1` Endpoints.
    Endpoints(Endpoints),
}

impl Object {
    /// `EndpointSlice` or `Endpoints`.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::EndpointSlice(_) => "EndpointSlice",
            Object::Endpoints(_) => "Endpoints",
        }
    }
    /// The object's metadata.
    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Object::EndpointSlice(s) => &s.metadata,
            Object::Endpoints(e) => &e.metadata,
        }
    }
    /// Namespace (`default` when unset) and name (empty when not yet named).
    pub fn key(&self) -> (String, String) {
        let m = self.metadata();
        (
            m.namespace.clone().unwrap_or_else(|| "default".into()),
            m.name.clone().unwrap_or_default(),
        )
    }
    /// The Service this object belongs to: the service-name label of a slice, the
    /// name of an Endpoints.
    pub fn service(&self) -> String {
        match self {
            Object::EndpointSlice(s) => s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(util::LABEL_SERVICE_NAME))
                .cloned()
                .unwrap_or_default(),
            Object::Endpoints(e) => e.metadata.name.clone().unwrap_or_default(),
        }
    }
    /// Number of endpoints (slice) or addresses (Endpoints).
    pub fn endpoint_count(&self) -> usize {
        match self {
            Object::EndpointSlice(s) => s.endpoints.len(),
            Object::Endpoints(e) => e
                .subsets
                .iter()
                .flatten()
                .map(|s| {
                    s.addresses.as_ref().map_or(0, Vec::len)
                        + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
                })
                .sum(),
        }
    }
}

/// Creates, updates and deletes, each in application order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    /// Objects to create.
    pub create: Vec<Object>,
    /// Objects to update (full desired objects).
    pub update: Vec<Object>,
    /// Objects to delete (as they are now).
    pub delete: Vec<Object>,
}

impl Plan {
    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
    /// Appends EndpointSlices to create, update and delete.
    pub fn extend_slices(
        &mut self,
        create: Vec<EndpointSlice>,
        update: Vec<EndpointSlice>,
        delete: Vec<EndpointSlice>,
    ) {
        self.create
            .extend(create.into_iter().map(Object::EndpointSlice));
        self.update
            .extend(update.into_iter().map(Object::EndpointSlice));
        self.delete
            .extend(delete.into_iter().map(Object::EndpointSlice));
    }
    /// Appends another plan.
    pub fn extend(&mut self, other: Plan) {
        self.create.extend(other.create);
        self.update.extend(other.update);
        self.delete.extend(other.delete);
    }

    /// Names created slices deterministically, `<generateName><5 chars>`, as the API
    /// server would (randomly) on create. Used where there is no API server.
    pub fn assign_names(&mut self, taken: &BTreeSet<(String, String)>) {
        let mut used = taken.clone();
        for obj in self.create.iter().chain(self.update.iter()) {
            used.insert(obj.key());
        }
        for obj in &mut self.create {
            let Object::EndpointSlice(slice) = obj else {
                continue;
            };
            if slice.metadata.name.is_some() {
                continue;
            }
            let ns = slice
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
            let ports = util::port_map_key(slice.ports.as_deref().unwrap_or(&[]));
            let mut n = 0u32;
            loop {
                let seed = format!("{ns}/{prefix}/{}/{ports:?}/{n}", slice.address_type);
                let name = format!("{prefix}{}", util::name_suffix(&seed));
                if used.insert((ns.clone(), name.clone())) {
                    slice.metadata.name = Some(name);
                    break;
                }
                n += 1;
            }
        }
    }

    /// JSON: `{"create": [...], "update": [...], "delete": [...]}`.
    pub fn to_json(&self) -> crate::Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| crate::Error::Serialize(e.to_string()))
    }

    /// JSON with what the manifest reader skipped: `{"create": [...], "update":
    /// [...], "delete": [...], "skipped": [{"file", "object", "field", "code",
    /// "reason"}, ...]}`.
    pub fn to_json_with_skipped(
        &self,
        skipped: &[crate::local::Rejected],
    ) -> crate::Result<String> {
        #[derive(Serialize)]
        struct WithSkipped<'a> {
            #[serde(flatten)]
            plan: &'a Plan,
            skipped: &'a [crate::local::Rejected],
        }
        serde_json::to_string_pretty(&WithSkipped {
            plan: self,
            skipped,
        })
        .map_err(|e| crate::Error::Serialize(e.to_string()))
    }

    /// A readable summary, one block per Service.
    pub fn to_table(&self) -> String {
        let mut rows: Vec<(String, String, &'static str, &'static str, String, usize)> = Vec::new();
        for (action, list) in [
            ("create", &self.create),
            ("update", &self.update),
            ("delete", &self.delete),
        ] {
            for obj in list {
                let (ns, name) = obj.key();
                rows.push((
                    format!("{ns}/{}", obj.service()),
                    name,
                    action,
                    obj.kind(),
                    match obj {
                        Object::EndpointSlice(s) => s.address_type.clone(),
                        Object::Endpoints(_) => "-".into(),
                    },
                    obj.endpoint_count(),
                ));
            }
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = String::new();
        if rows.is_empty() {
            out.push_str("no changes\n");
            return out;
        }
        let _ = writeln!(
            out,
            "{:<7} {:<14} {:<32} {:<5} {:>9}",
            "ACTION", "KIND", "NAME", "TYPE", "ENDPOINTS"
        );
        let mut current = String::new();
        for (svc, name, action, kind, t, n) in rows {
            if svc != current {
                let _ = writeln!(out, "Service {svc}");
                current = svc;
            }
            let _ = writeln!(out, "{action:<7} {kind:<14} {name:<32} {t:<5} {n:>9}");
        }
        let _ = writeln!(
            out,
            "total: {} create, {} update, {} delete",
            self.create.len(),
            self.update.len(),
            self.delete.len()
        );
        out
    }
}

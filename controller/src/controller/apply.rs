//! Applying a plan to the API server: creates, updates and deletes under the field
//! manager, recorded in the slice tracker.

use std::sync::Mutex;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use super::SliceTracker;
use crate::plan::{Object, Plan};
use crate::{Error, Result};

/// The error of a failed write of `obj`.
fn write_error<'a>(op: &'static str, obj: &'a Object) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| {
        let (namespace, name) = obj.key();
        let name = if name.is_empty() {
            obj.metadata().generate_name.clone().unwrap_or_default()
        } else {
            name
        };
        Error::Write {
            op,
            kind: obj.kind(),
            namespace,
            name,
            source: Box::new(source),
        }
    }
}

/// Applies a plan through the API: creates, then updates, then deletes, each with
/// the field manager. Written slices are recorded in the tracker under the UID of
/// the Service they belong to.
pub async fn apply_plan(
    client: &Client,
    plan: &Plan,
    field_manager: &str,
    service_uid: &str,
    tracker: &Mutex<SliceTracker>,
) -> Result<()> {
    let pp = PostParams {
        field_manager: Some(field_manager.into()),
        ..Default::default()
    };
    let slices = |ns: &str| Api::<EndpointSlice>::namespaced(client.clone(), ns);
    let endpoints = |ns: &str| Api::<Endpoints>::namespaced(client.clone(), ns);
    for obj in &plan.create {
        let (ns, _) = obj.key();
        match obj {
            Object::EndpointSlice(s) => {
                let made = slices(&ns)
                    .create(&pp, s)
                    .await
                    .map_err(write_error("create", obj))?;
                tracker.lock().expect("tracker").written(service_uid, &made);
            }
            Object::Endpoints(e) => {
                endpoints(&ns)
                    .create(&pp, e)
                    .await
                    .map_err(write_error("create", obj))?;
                let name = e.metadata.name.as_deref().unwrap_or_default();
                tracker
                    .lock()
                    .expect("tracker")
                    .endpoints_written(&ns, name, None);
            }
        }
    }
    for obj in &plan.update {
        let (ns, name) = obj.key();
        match obj {
            Object::EndpointSlice(s) => {
                let made = slices(&ns)
                    .replace(&name, &pp, s)
                    .await
                    .map_err(write_error("update", obj))?;
                tracker.lock().expect("tracker").written(service_uid, &made);
            }
            Object::Endpoints(e) => {
                endpoints(&ns)
                    .replace(&name, &pp, e)
                    .await
                    .map_err(write_error("update", obj))?;
                tracker.lock().expect("tracker").endpoints_written(
                    &ns,
                    &name,
                    e.metadata.resource_version.clone(),
                );
            }
        }
    }
    for obj in &plan.delete {
        let (ns, name) = obj.key();
        let result = match obj {
            Object::EndpointSlice(s) => {
                let r = slices(&ns)
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ());
                tracker.lock().expect("tracker").deleted(service_uid, s);
                r
            }
            Object::Endpoints(_) => endpoints(&ns)
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {}
            // Already gone: what we wanted.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(write_error("delete", obj)(e)),
        }
    }
    Ok(())
}

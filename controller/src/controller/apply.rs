//! Applying a plan to the API server: creates, updates and deletes under the field
//! manager, recorded in the slice tracker.

use std::sync::Mutex;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams};
use kube::core::Request;
use kube::{Api, Client, Resource};

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

/// What this controller reads of the API server's answer to a create or an update:
/// the written object's UID and generation. The answer holds the whole object
/// (its managedFields too); the rest of it is skipped unread instead of decoded
/// into a typed object that nothing reads.
#[derive(serde::Deserialize)]
struct Answer {
    metadata: AnswerMeta,
}

#[derive(serde::Deserialize)]
struct AnswerMeta {
    uid: Option<String>,
    generation: Option<i64>,
}

/// Which write.
enum Write<'a> {
    Create,
    Replace(&'a str),
}

/// Sends a create or a replace of `obj` (as `Api::create` and `Api::replace` do,
/// with the field manager) and reads only its [`Answer`].
async fn write<K>(
    client: &Client,
    ns: &str,
    write: Write<'_>,
    pp: &PostParams,
    obj: &K,
) -> kube::Result<AnswerMeta>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope> + serde::Serialize,
{
    let request = Request::new(K::url_path(&(), Some(ns)));
    let body = serde_json::to_vec(obj).map_err(kube::Error::SerdeError)?;
    let (req, verb) = match write {
        Write::Create => (request.create(pp, body), "create"),
        Write::Replace(name) => (request.replace(name, pp, body), "replace"),
    };
    let mut req = req.map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert(verb);
    Ok(client.request::<Answer>(req).await?.metadata)
}

/// The slice as written: the labels sent (its managed-by) with the UID and
/// generation of the answer, for the tracker.
fn as_written(sent: &EndpointSlice, answer: AnswerMeta) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            labels: sent.metadata.labels.clone(),
            uid: answer.uid,
            generation: answer.generation,
            ..Default::default()
        },
        ..Default::default()
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
                let made = write(client, &ns, Write::Create, &pp, s)
                    .await
                    .map_err(write_error("create", obj))?;
                tracker
                    .lock()
                    .expect("tracker")
                    .written(service_uid, &as_written(s, made));
            }
            Object::Endpoints(e) => {
                write(client, &ns, Write::Create, &pp, e)
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
                let made = write(client, &ns, Write::Replace(&name), &pp, s)
                    .await
                    .map_err(write_error("update", obj))?;
                tracker
                    .lock()
                    .expect("tracker")
                    .written(service_uid, &as_written(s, made));
            }
            Object::Endpoints(e) => {
                write(client, &ns, Write::Replace(&name), &pp, e)
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

//! Which slice generations and Endpoints this controller wrote, so it never acts
//! on a cache that does not show its own writes yet (upstream's EndpointSliceTracker
//! and staleEndpointsTracker).

use std::borrow::Borrow;
use std::collections::HashMap;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Generations this controller wrote, per slice UID (upstream's EndpointSliceTracker).
///
/// Kept per Service and per `endpointslice.kubernetes.io/managed-by` value: the
/// EndpointSlice controller and the mirroring controller each track their own slices,
/// as upstream's two controllers each have a tracker, so a mirrored slice is never
/// looked for among the EndpointSlice controller's slices.
///
/// It also knows the Endpoints this controller wrote whose newer version the cache
/// may not show yet (upstream's staleEndpointsTracker in
/// pkg/controller/endpoint/endpoints_controller.go): acting on such a cache would
/// send a write bound to fail with a conflict.
#[derive(Debug, Default)]
pub struct SliceTracker {
    by_service: HashMap<(String, String), HashMap<String, i64>>,
    /// Per Endpoints (namespace, name): the resourceVersion this controller replaced,
    /// or `None` for one it created.
    endpoints: HashMap<(String, String), Option<String>>,
}

/// Marks a slice this controller deleted and expects gone from the cache.
const DELETION_EXPECTED: i64 = -1;

pub(super) fn managed_by(slice: &EndpointSlice) -> String {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::util::LABEL_MANAGED_BY))
        .cloned()
        .unwrap_or_default()
}

impl SliceTracker {
    fn entry(&mut self, service_uid: &str, slice: &EndpointSlice) -> &mut HashMap<String, i64> {
        self.by_service
            .entry((service_uid.into(), managed_by(slice)))
            .or_default()
    }
    /// Records a written slice.
    pub fn written(&mut self, service_uid: &str, slice: &EndpointSlice) {
        if let Some(uid) = &slice.metadata.uid {
            let generation = slice.metadata.generation.unwrap_or(0);
            self.entry(service_uid, slice)
                .insert(uid.clone(), generation);
        }
    }
    /// Whether a slice event should sync its Service: not when it only shows this
    /// controller's own write coming back (upstream's endpointSliceTracker
    /// `ShouldSync`, <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/util/endpointslice/endpointslice_tracker.go>):
    /// a generation newer than the one written, or a slice never written, syncs.
    pub fn should_sync(&self, slice: &EndpointSlice) -> bool {
        let Some(uid) = slice.metadata.uid.as_deref() else {
            return true;
        };
        let generation = slice.metadata.generation.unwrap_or(0);
        let managed = managed_by(slice);
        let owner = slice
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        let written = match owner.and_then(|owner| self.by_service.get(&(owner, managed.clone()))) {
            Some(gens) => gens.get(uid).copied(),
            None => self.by_service.iter().find_map(|((_, m), gens)| {
                (*m == managed).then(|| gens.get(uid).copied()).flatten()
            }),
        };
        match written {
            Some(g) => generation > g,
            None => true,
        }
    }
    /// Records a deleted slice.
    pub fn deleted(&mut self, service_uid: &str, slice: &EndpointSlice) {
        if let Some(uid) = &slice.metadata.uid {
            self.entry(service_uid, slice)
                .insert(uid.clone(), DELETION_EXPECTED);
        }
    }
    /// Records an Endpoints write: `replaced` is the resourceVersion it replaced
    /// (`None` for a create).
    pub fn endpoints_written(&mut self, ns: &str, name: &str, replaced: Option<String>) {
        self.endpoints.insert((ns.into(), name.into()), replaced);
    }
    /// Forgets the last write of Endpoints `ns/name` (they were deleted).
    pub fn endpoints_forget(&mut self, ns: &str, name: &str) {
        self.endpoints.remove(&(ns.to_string(), name.to_string()));
    }
    /// Whether the cached Endpoints `ns/name` is older than this controller's last
    /// write of it; forgets the write once the cache has caught up.
    pub fn endpoints_stale(&mut self, ns: &str, name: &str, cached: Option<&Endpoints>) -> bool {
        let key = (ns.to_string(), name.to_string());
        let Some(written) = self.endpoints.get(&key) else {
            return false;
        };
        let stale = match (written, cached) {
            (None, None) => true,
            (Some(rv), Some(c)) => c.metadata.resource_version.as_ref() == Some(rv),
            _ => false,
        };
        if !stale {
            self.endpoints.remove(&key);
        }
        stale
    }
    /// Forgets everything recorded for a deleted Service.
    pub fn forget_service(&mut self, service_uid: &str) {
        self.by_service.retain(|(uid, _), _| uid != service_uid);
    }
    /// Forgets a slice that is gone or no longer managed by `managed_by`, whoever
    /// removed it (upstream's HandleDeletion): the cache cannot be stale about a slice
    /// the controller will never see again.
    pub fn forget(&mut self, slice_uid: &str) {
        for gens in self.by_service.values_mut() {
            gens.remove(slice_uid);
        }
        self.by_service.retain(|_, gens| !gens.is_empty());
    }
    /// Whether the cached slices of `service_uid` managed by `managed_by` are older
    /// than what this controller wrote (StaleSlices).
    pub fn stale<S: Borrow<EndpointSlice>>(
        &self,
        service_uid: &str,
        managed_by: &str,
        cached: &[S],
    ) -> bool {
        let Some(gens) = self
            .by_service
            .get(&(service_uid.to_string(), managed_by.to_string()))
        else {
            return false;
        };
        let mut seen = std::collections::HashSet::new();
        for s in cached.iter().map(Borrow::borrow) {
            let uid = s.metadata.uid.clone().unwrap_or_default();
            if let Some(g) = gens.get(&uid) {
                if *g == DELETION_EXPECTED || *g > s.metadata.generation.unwrap_or(0) {
                    return true;
                }
            }
            seen.insert(uid);
        }
        gens.iter()
            .any(|(uid, g)| *g != DELETION_EXPECTED && !seen.contains(uid))
    }
    /// Forgets deletions the cache has caught up with.
    pub fn settle<S: Borrow<EndpointSlice>>(
        &mut self,
        service_uid: &str,
        managed_by: &str,
        cached: &[S],
    ) {
        if let Some(gens) = self
            .by_service
            .get_mut(&(service_uid.to_string(), managed_by.to_string()))
        {
            let present: std::collections::HashSet<String> = cached
                .iter()
                .map(Borrow::borrow)
                .filter_map(|s| s.metadata.uid.clone())
                .collect();
            gens.retain(|uid, g| *g != DELETION_EXPECTED || present.contains(uid));
        }
    }
}

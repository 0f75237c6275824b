//! Local mode source: a directory of ordinary Kubernetes YAML, read as
//! [`conventions::manifests`] reads it (the controller reads it the same way).
//!
//! Services (v1), EndpointSlices (discovery.k8s.io/v1), Nodes (v1) and ServiceCIDRs
//! (networking.k8s.io/v1) are kept; a kind the agent reads under another API version
//! is reported; other kinds are not the agent's business and are passed over. A file
//! that fails to parse is reported and skipped; if it parsed before, its last good
//! objects are kept, so a half-written file never makes Services vanish.
//!
//! Each object is turned into the agent's model as soon as it is read, so a large
//! file never exists as a tree of API objects. A rescan hands the objects of changed
//! files to the incremental compiler, which keeps them and notices which ones
//! actually differ.

use std::{
    collections::{BTreeSet, HashMap},
    path::Path,
    sync::Arc,
};

use conventions::manifests::{self, Files, Object, Reader};
pub use conventions::manifests::{Problem, Scan};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};

use super::Sink;
use crate::model::{NodeInfo, Origin, ServiceCidrInfo, ServiceId, ServiceInfo, SliceId, SliceInfo};

/// The objects of one directory.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
    pub service_cidrs: Vec<ServiceCIDR>,
}

/// The objects of one file in the agent's model (of Nodes, only name and zone: the
/// compiler reads the zone of its own).
#[derive(Clone, Debug, Default)]
pub struct ModelObjects {
    pub services: Vec<ServiceInfo>,
    pub slices: Vec<SliceInfo>,
    pub nodes: Vec<NodeInfo>,
    pub service_cidrs: Vec<ServiceCidrInfo>,
}

/// What a file last gave: the identities of its objects (the compiler holds them),
/// its Nodes and its ServiceCIDRs (handed over all together after a rescan).
#[derive(Debug, Default)]
struct FileObjects {
    services: Vec<ServiceId>,
    slices: Vec<SliceId>,
    nodes: Vec<NodeInfo>,
    service_cidrs: Vec<ServiceCidrInfo>,
}

/// Reads a manifest directory and re-reads only the files that changed.
#[derive(Debug)]
pub struct ManifestDir {
    files: Files<FileObjects>,
    /// The own Node, whose zone is handed to the sink.
    node_name: Option<String>,
    /// Services and EndpointSlices defined more than once, as last found.
    duplicates: Vec<Problem>,
}

/// Brings a sink to the files a rescan reads.
struct ToSink<'a>(&'a mut dyn Sink);

impl Reader<FileObjects> for ToSink<'_> {
    fn read(
        &mut self,
        path: &Path,
        file: &mut dyn std::io::BufRead,
        old: Option<&FileObjects>,
        problems: &mut Vec<Problem>,
    ) -> Option<FileObjects> {
        let (objects, mut parsed) = parse_into(path, file, add_model);
        problems.append(&mut parsed);
        let mut objects = objects?;
        // Kept here whole; the compiler takes only the Services and slices.
        let nodes = std::mem::take(&mut objects.nodes);
        let service_cidrs = std::mem::take(&mut objects.service_cidrs);
        let (services, slices) = put_file(path, objects, old, self.0);
        Some(FileObjects {
            services,
            slices,
            nodes,
            service_cidrs,
        })
    }

    fn gone(&mut self, _path: &Path, kept: FileObjects) {
        for id in &kept.services {
            self.0.remove_service(id);
        }
        for id in &kept.slices {
            self.0.remove_slice(id);
        }
    }
}

impl ManifestDir {
    /// A directory; `node_name` is the own Node, whose zone its Node object gives.
    pub fn new(dir: impl Into<std::path::PathBuf>, node_name: Option<String>) -> Self {
        Self {
            files: Files::new(dir),
            node_name,
            duplicates: Vec::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        self.files.dir()
    }

    /// Looks for added, changed and removed files, parses the changed ones and brings
    /// `sink` to the directory's objects: those of removed files go, those of
    /// changed files are put (the sink tells which really differ), and a file that
    /// no longer parses keeps the objects it last gave. The own Node's zone and the
    /// ServiceCIDRs of every file are set every time (a no-op when they did not
    /// change).
    pub fn rescan(&mut self, sink: &mut dyn Sink) -> std::io::Result<Scan> {
        let mut scan = self.files.rescan(&mut ToSink(sink))?;
        if scan.changed {
            let now = self.duplicates();
            scan.new_problems
                .extend(now.iter().filter(|p| !self.duplicates.contains(p)).cloned());
            self.duplicates = now;
        }
        let node = self.node_name.as_deref().and_then(|name| self.node(name));
        sink.set_zone(node.and_then(|n| n.zone.clone()));
        sink.set_node_ip(node.and_then(|n| n.primary_ipv4));
        sink.set_node_ip6(node.and_then(|n| n.primary_ipv6));
        sink.set_pod_cidrs(node.map(|n| n.pod_cidrs.clone()).unwrap_or_default());
        sink.set_service_cidrs(self.service_cidrs());
        Ok(scan)
    }

    /// Every ServiceCIDR of the directory, in file order.
    pub fn service_cidrs(&self) -> Vec<ServiceCidrInfo> {
        self.files
            .kept()
            .flat_map(|(_, f)| f.service_cidrs.iter().cloned())
            .collect()
    }

    /// The own Node (the first in file order named as it), if there is one.
    pub fn own_node(&self) -> Option<&NodeInfo> {
        self.node_name.as_deref().and_then(|name| self.node(name))
    }

    /// The zone of the Node named `name`: the first such Node in file order.
    pub fn node_zone(&self, name: &str) -> Option<String> {
        self.node(name).and_then(|n| n.zone.clone())
    }

    /// The Node named `name`: the first such Node in file order.
    fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.files
            .kept()
            .flat_map(|(_, f)| &f.nodes)
            .find(|n| n.name == name)
    }

    /// Problems of the files as they are now, duplicates included.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = self.files.problems();
        problems.extend(self.duplicates.iter().cloned());
        problems
    }

    /// Each Service and EndpointSlice defined again later in the directory (file
    /// order, then order in a file), named as [`manifests::duplicates`] names it.
    /// Every definition goes to the sink, each with its origin (file and place),
    /// and the compiler uses the last one of each object, as `kubectl apply -f` of
    /// the directory leaves it; so a file that stops parsing keeps its last good
    /// definitions for when a later one goes.
    fn duplicates(&self) -> Vec<Problem> {
        let mut defs = Vec::new();
        for (path, f) in self.files.kept() {
            let services = f
                .services
                .iter()
                .map(|id| ("Service", id.namespace.clone(), id.name.clone()));
            let slices = f.slices.iter().map(|id| {
                (
                    "EndpointSlice",
                    id.namespace.clone().unwrap_or_default(),
                    id.name.clone().unwrap_or_default(),
                )
            });
            for (kind, namespace, name) in services.chain(slices) {
                defs.push(manifests::Definition {
                    kind: kind.into(),
                    namespace,
                    name,
                    file: path.to_path_buf(),
                    place: None,
                });
            }
        }
        manifests::duplicates(&defs)
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }
}

/// A manifest directory as the agent follows it: read at once, then every `poll`.
/// Files are read and parsed on a blocking thread while the agent loop waits (its
/// health endpoint, interface scans and sweeps go on); `feed` only hands over what
/// that reading recorded.
#[derive(Debug)]
pub struct LocalSource {
    /// `None` only while a reading thread holds it.
    dir: Option<ManifestDir>,
    poll: std::time::Duration,
    started: bool,
    /// What the last reading found, for `feed` to hand over.
    read: Option<(Recorded, std::io::Result<Scan>)>,
}

impl LocalSource {
    pub fn new(dir: ManifestDir, poll: std::time::Duration) -> Self {
        Self {
            dir: Some(dir),
            poll,
            started: false,
            read: None,
        }
    }

    fn dir(&self) -> &ManifestDir {
        self.dir
            .as_ref()
            .expect("the directory is back once wait returns")
    }
}

/// What a reading handed to its sink, in order, replayed into the real one.
#[derive(Debug, Default)]
pub struct Recorded(Vec<Op>);

#[derive(Debug)]
enum Op {
    // Boxed: an operation is as large as its largest kind, and a directory of
    // 10,000 Services records 20,000 of them.
    PutService(Origin, Box<ServiceInfo>),
    RemoveService(ServiceId),
    PutSlice(Origin, Box<SliceInfo>),
    RemoveSlice(SliceId),
    Zone(Option<String>),
    NodeIp(Option<std::net::Ipv4Addr>),
    NodeIp6(Option<std::net::Ipv6Addr>),
    PodCidrs(crate::model::PodCidrs),
    ServiceCidrs(Vec<ServiceCidrInfo>),
}

impl Sink for Recorded {
    fn put_service(&mut self, origin: Origin, svc: ServiceInfo) -> bool {
        self.0.push(Op::PutService(origin, Box::new(svc)));
        true
    }
    fn remove_service(&mut self, id: &ServiceId) -> bool {
        self.0.push(Op::RemoveService(id.clone()));
        true
    }
    fn put_slice(&mut self, origin: Origin, slice: SliceInfo) -> bool {
        self.0.push(Op::PutSlice(origin, Box::new(slice)));
        true
    }
    fn remove_slice(&mut self, id: &SliceId) -> bool {
        self.0.push(Op::RemoveSlice(id.clone()));
        true
    }
    fn set_zone(&mut self, zone: Option<String>) -> bool {
        self.0.push(Op::Zone(zone));
        true
    }
    fn set_node_ip(&mut self, ip: Option<std::net::Ipv4Addr>) -> bool {
        self.0.push(Op::NodeIp(ip));
        true
    }
    fn set_node_ip6(&mut self, ip: Option<std::net::Ipv6Addr>) -> bool {
        self.0.push(Op::NodeIp6(ip));
        true
    }
    fn set_pod_cidrs(&mut self, cidrs: crate::model::PodCidrs) -> bool {
        self.0.push(Op::PodCidrs(cidrs));
        true
    }
    fn set_service_cidrs(&mut self, cidrs: Vec<ServiceCidrInfo>) -> bool {
        self.0.push(Op::ServiceCidrs(cidrs));
        true
    }
    // The directory's reading never asks what is held.
    fn services_held(&self) -> Vec<ServiceId> {
        Vec::new()
    }
    fn slices_held(&self) -> Vec<SliceId> {
        Vec::new()
    }
}

impl Recorded {
    fn replay(self, sink: &mut dyn Sink) {
        for op in self.0 {
            match op {
                Op::PutService(origin, svc) => sink.put_service(origin, *svc),
                Op::RemoveService(id) => sink.remove_service(&id),
                Op::PutSlice(origin, slice) => sink.put_slice(origin, *slice),
                Op::RemoveSlice(id) => sink.remove_slice(&id),
                Op::Zone(zone) => sink.set_zone(zone),
                Op::NodeIp(ip) => sink.set_node_ip(ip),
                Op::NodeIp6(ip) => sink.set_node_ip6(ip),
                Op::PodCidrs(cidrs) => sink.set_pod_cidrs(cidrs),
                Op::ServiceCidrs(cidrs) => sink.set_service_cidrs(cidrs),
            };
        }
    }
}

impl super::Source for LocalSource {
    type Error = std::convert::Infallible;

    async fn wait(&mut self) -> Result<(), Self::Error> {
        if std::mem::replace(&mut self.started, true) {
            tokio::time::sleep(self.poll).await;
        }
        // Issue 19: a large file is read and parsed off the agent's (single-threaded)
        // loop, which keeps answering /healthz meanwhile.
        let mut dir = self.dir.take().expect("wait is polled to completion");
        let reading = tokio::task::spawn_blocking(move || {
            let mut recorded = Recorded::default();
            let scan = dir.rescan(&mut recorded);
            (dir, recorded, scan)
        });
        let (dir, recorded, scan) = match reading.await {
            Ok(done) => done,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        self.dir = Some(dir);
        self.read = Some((recorded, scan));
        Ok(())
    }

    fn node_eligible(&self) -> Option<bool> {
        self.dir().own_node().map(|n| n.eligible)
    }

    fn skipped_by_reason(&self) -> std::collections::BTreeMap<String, i64> {
        let mut counts = std::collections::BTreeMap::new();
        for p in self.dir().problems() {
            *counts.entry(p.code.to_string()).or_default() += 1;
        }
        counts
    }

    fn feed(&mut self, sink: &mut dyn Sink) -> super::Fed {
        let Some((recorded, scan)) = self.read.take() else {
            return super::Fed::Unchanged;
        };
        recorded.replay(sink);
        match scan {
            Ok(scan) => {
                for p in &scan.new_problems {
                    tracing::warn!(file = %p.file.display(), "{}", p.reason);
                }
                if scan.changed {
                    super::Fed::Changed
                } else {
                    super::Fed::Unchanged
                }
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir().dir().display(), "cannot read the manifest directory: {e}; keeping the current state");
                super::Fed::Failed
            }
        }
    }
}

/// Where the next object named `key` in `file` comes from: the file, and how many of
/// that name came before it there.
fn next_origin<K: std::hash::Hash + Eq>(
    seen: &mut HashMap<K, u32>,
    key: K,
    file: &Arc<Path>,
) -> Origin {
    let n = seen.entry(key).or_default();
    let origin = Origin {
        file: Some(file.clone()),
        occurrence: *n,
    };
    *n += 1;
    origin
}

/// Puts the objects of a file that parsed into `compiler` and removes those the file
/// held before and no longer does. Returns the identities of the file's objects:
/// namespace and name, and where in the directory (the file, and how many of that
/// name came before in it).
fn put_file(
    path: &Path,
    objects: ModelObjects,
    old: Option<&FileObjects>,
    compiler: &mut dyn Sink,
) -> (Vec<ServiceId>, Vec<SliceId>) {
    let file: Arc<Path> = Arc::from(path);
    let mut seen: HashMap<(String, String), u32> = HashMap::new();
    let mut services = Vec::with_capacity(objects.services.len());
    for svc in objects.services {
        let mut id = ServiceId::of(&svc, Origin::default());
        id.origin = next_origin(&mut seen, (id.namespace.clone(), id.name.clone()), &file);
        compiler.put_service(id.origin.clone(), svc);
        services.push(id);
    }
    let mut seen: HashMap<(Option<String>, Option<String>), u32> = HashMap::new();
    let mut slices = Vec::with_capacity(objects.slices.len());
    for slice in objects.slices {
        let mut id = SliceId::of(&slice, Origin::default());
        id.origin = next_origin(&mut seen, (id.namespace.clone(), id.name.clone()), &file);
        compiler.put_slice(id.origin.clone(), slice);
        slices.push(id);
    }
    if let Some(old) = old {
        let now: BTreeSet<&ServiceId> = services.iter().collect();
        for id in old.services.iter().filter(|id| !now.contains(id)) {
            compiler.remove_service(id);
        }
        let now: BTreeSet<&SliceId> = slices.iter().collect();
        for id in old.slices.iter().filter(|id| !now.contains(id)) {
            compiler.remove_slice(id);
        }
    }
    (services, slices)
}

/// A usable object of a document (boxed: API objects are large and of unequal sizes).
enum Found {
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
    Node(Box<Node>),
    ServiceCidr(Box<ServiceCIDR>),
}

/// Parses one file's text. `None` when the YAML itself is broken (nothing in the
/// file is trusted then); otherwise the usable objects and a problem per unusable
/// document.
pub fn parse_file(path: &Path, text: &str) -> (Option<Objects>, Vec<Problem>) {
    parse_into(
        path,
        text.as_bytes(),
        |objects: &mut Objects, found| match found {
            Found::Service(s) => objects.services.push(*s),
            Found::Slice(s) => objects.slices.push(*s),
            Found::Node(n) => objects.nodes.push(*n),
            Found::ServiceCidr(c) => objects.service_cidrs.push(*c),
        },
    )
}

/// [`parse_file`], each object turned into the agent's model as soon as it is read.
pub fn parse_file_model(path: &Path, text: &str) -> (Option<ModelObjects>, Vec<Problem>) {
    parse_into(path, text.as_bytes(), add_model)
}

/// An object in the agent's model, the API object dropped.
fn add_model(objects: &mut ModelObjects, found: Found) {
    match found {
        Found::Service(s) => objects.services.push(ServiceInfo::from(&*s)),
        Found::Slice(s) => objects.slices.push(SliceInfo::from(&*s)),
        Found::Node(n) => objects.nodes.push(NodeInfo::from(&*n)),
        Found::ServiceCidr(c) => objects.service_cidrs.push(ServiceCidrInfo::from(&*c)),
    }
}

/// Reads a file's documents as they come (one at a time, see
/// [`manifests::read_from`]), adding each object of a kind the agent reads to `T`.
fn parse_into<T: Default>(
    path: &Path,
    file: impl std::io::BufRead,
    add: impl Fn(&mut T, Found),
) -> (Option<T>, Vec<Problem>) {
    let mut objects = T::default();
    let read = manifests::read_from(path, file, &mut |o| {
        if let Some(found) = accept(o)? {
            add(&mut objects, found);
        }
        Ok(())
    });
    match read {
        Ok(read) => (Some(objects), read.problems),
        Err(problem) => (None, vec![problem]),
    }
}

/// The kinds the agent reads: the object if it is one, `None` for kinds that are not
/// the agent's business, why not for one it cannot use.
fn accept(o: Object) -> Result<Option<Found>, String> {
    let (kind, name) = (o.kind.clone(), o.name.clone());
    let found = match (o.api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => Found::Service(Box::new(
            o.typed().map_err(|e| format!("Service {name}: {e}; skipped"))?,
        )),
        ("discovery.k8s.io/v1", "EndpointSlice") => Found::Slice(Box::new(
            o.typed()
                .map_err(|e| format!("EndpointSlice {name}: {e}; skipped"))?,
        )),
        ("v1", "Node") => Found::Node(Box::new(
            o.typed().map_err(|e| format!("Node {name}: {e}; skipped"))?,
        )),
        ("networking.k8s.io/v1", "ServiceCIDR") => Found::ServiceCidr(Box::new(
            o.typed()
                .map_err(|e| format!("ServiceCIDR {name}: {e}; skipped"))?,
        )),
        ("discovery.k8s.io/v1beta1", "EndpointSlice") => {
            return Err(format!("EndpointSlice {name}: discovery.k8s.io/v1beta1 is gone since Kubernetes 1.25, use v1; skipped"))
        }
        // A kind the agent reads under another API version: said, not ignored.
        (api_version, "Service" | "Node") => {
            return Err(format!(
                "{kind} {name}: apiVersion {api_version:?} is not v1; skipped"
            ))
        }
        (api_version, "EndpointSlice") => {
            return Err(format!(
            "EndpointSlice {name}: apiVersion {api_version:?} is not discovery.k8s.io/v1; skipped"
        ))
        }
        (api_version, "ServiceCIDR") => {
            return Err(format!(
                "ServiceCIDR {name}: apiVersion {api_version:?} is not networking.k8s.io/v1; skipped"
            ))
        }
        // Pods, Deployments, Endpoints, ...: not the agent's business.
        _ => return Ok(None),
    };
    Ok(Some(found))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::compiler::Incremental;

    /// A directory of one test's own, emptied first (a killed run's leftovers) and
    /// removed when dropped, also when the test fails.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("sliceway-local-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl std::ops::Deref for TempDir {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn multi_document_file_yields_each_kind() {
        let text = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.1]}]
ports: [{port: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: ignored}
---
"#;
        let (objects, problems) = parse_file(Path::new("x.yaml"), text);
        let objects = objects.unwrap();
        assert_eq!(problems, vec![]);
        assert_eq!(objects.services.len(), 1);
        assert_eq!(objects.slices.len(), 1);
    }

    #[test]
    fn bad_document_is_reported_and_others_kept() {
        let text = r#"
apiVersion: v1
kind: Service
metadata: {name: bad}
spec: {ports: "not a list"}
---
apiVersion: v1
kind: Service
metadata: {name: good}
spec: {clusterIP: 10.96.0.11}
"#;
        let (objects, problems) = parse_file(Path::new("x.yaml"), text);
        assert_eq!(objects.unwrap().services.len(), 1);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].reason.contains("document 1: Service bad"),
            "{:?}",
            problems[0]
        );
    }

    #[test]
    fn a_known_kind_under_another_api_version_is_reported() {
        let (objects, problems) = parse_file(
            Path::new("f.yaml"),
            "apiVersion: apps/v1\nkind: Service\nmetadata: {name: odd}\n",
        );
        assert!(objects.unwrap().services.is_empty());
        assert_eq!(problems.len(), 1);
        assert!(problems[0]
            .reason
            .contains("apiVersion \"apps/v1\" is not v1"));
    }

    #[test]
    fn broken_yaml_keeps_last_good_objects() {
        let dir = TempDir::new("yaml");
        let file = dir.join("svc.yaml");
        fs::write(
            &file,
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.1}\n",
        )
        .unwrap();
        let mut m = ManifestDir::new(dir.to_path_buf(), None);
        let mut c = Incremental::default();
        assert!(m.rescan(&mut c).unwrap().changed);
        assert_eq!(c.service_count(), 1);
        assert!(!m.rescan(&mut c).unwrap().changed);
        fs::write(
            &file,
            "apiVersion: v1\nkind: Service\nmetadata: {name: a\n  spec: [",
        )
        .unwrap();
        let scan = m.rescan(&mut c).unwrap();
        assert!(scan.changed);
        assert_eq!(scan.new_problems.len(), 1);
        assert!(scan.new_problems[0].reason.starts_with("not valid YAML"));
        assert!(scan.new_problems[0]
            .reason
            .ends_with("(its last good version is kept)"));
        assert_eq!(c.service_count(), 1, "last good objects kept");
        fs::remove_file(&file).unwrap();
        assert!(m.rescan(&mut c).unwrap().changed);
        assert_eq!(c.service_count(), 0);
    }

    /// The own Node's zone comes from the directory: topology hints are read against
    /// it, and a relabelled or removed Node recompiles the Services.
    #[test]
    fn the_own_nodes_zone_filters_hinted_endpoints() {
        let dir = TempDir::new("zone");
        fs::write(
            dir.join("svc.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec: {clusterIP: 10.96.0.1, ports: [{name: http, port: 80}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n- {addresses: [10.244.0.1], hints: {forZones: [{name: zone-a}]}}\n- {addresses: [10.244.0.2], hints: {forZones: [{name: zone-b}]}}\n",
        )
        .unwrap();
        let node = |zone: &str| {
            format!("apiVersion: v1\nkind: Node\nmetadata: {{name: node-1, labels: {{topology.kubernetes.io/zone: {zone}}}}}\n---\napiVersion: v1\nkind: Node\nmetadata: {{name: node-2, labels: {{topology.kubernetes.io/zone: zone-b}}}}\n")
        };
        fs::write(dir.join("node.yaml"), node("zone-a")).unwrap();
        let mut m = ManifestDir::new(dir.to_path_buf(), Some("node-1".into()));
        let mut c = Incremental::new(crate::compiler::Options {
            node_name: Some("node-1".into()),
            ..Default::default()
        });
        let backends = |m: &mut ManifestDir, c: &mut Incremental| -> Vec<u32> {
            m.rescan(c).unwrap();
            c.compile();
            let f = c
                .frontends()
                .iter()
                .find(|(k, _)| !crate::compiler::is_clusterip_marker(k))
                .expect("one frontend")
                .1;
            f.backends
                .iter()
                .map(|b| u32::from_be(b.addr_be) & 0xff)
                .collect()
        };
        assert_eq!(backends(&mut m, &mut c), [1], "zone-a");
        // A different size too, so the rescan sees the file changed at once.
        fs::write(dir.join("node.yaml"), node("zone-b") + "# moved\n").unwrap();
        assert_eq!(backends(&mut m, &mut c), [2], "zone-b");
        fs::remove_file(dir.join("node.yaml")).unwrap();
        assert_eq!(
            backends(&mut m, &mut c),
            [1, 2],
            "no Node: no zone, no filtering"
        );
    }

    /// ServiceCIDRs of every file reach the compiler together, follow their files,
    /// and one under another API version is reported.
    #[test]
    fn service_cidrs_of_every_file_reach_the_compiler() {
        let dir = TempDir::new("cidr");
        let cidr = |name: &str, cidrs: &str| {
            format!("apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {{name: {name}}}\nspec: {{cidrs: [{cidrs}]}}\n")
        };
        fs::write(
            dir.join("a.yaml"),
            cidr("kubernetes", "10.96.0.0/16, fd00:96::/112"),
        )
        .unwrap();
        fs::write(
            dir.join("b.yaml"),
            cidr("extra", "10.200.0.0/24") + "---\napiVersion: networking.k8s.io/v1beta1\nkind: ServiceCIDR\nmetadata: {name: old}\nspec: {cidrs: [10.201.0.0/24]}\n",
        )
        .unwrap();
        let mut m = ManifestDir::new(dir.to_path_buf(), None);
        let mut c = Incremental::default();
        let scan = m.rescan(&mut c).unwrap();
        let v4 = |c: &Incremental| -> Vec<String> {
            c.service_cidrs()
                .v4
                .iter()
                .map(|(a, l)| format!("{a}/{l}"))
                .collect()
        };
        assert_eq!(v4(&c), ["10.96.0.0/16", "10.200.0.0/24"]);
        assert_eq!(c.service_cidrs().v6.len(), 1);
        assert_eq!(scan.new_problems.len(), 1, "{:?}", scan.new_problems);
        assert!(scan.new_problems[0].reason.contains(
            "ServiceCIDR old: apiVersion \"networking.k8s.io/v1beta1\" is not networking.k8s.io/v1"
        ));
        fs::remove_file(dir.join("a.yaml")).unwrap();
        m.rescan(&mut c).unwrap();
        assert_eq!(v4(&c), ["10.200.0.0/24"]);
        assert!(c.service_cidrs().v6.is_empty());
    }

    #[test]
    fn a_rewritten_file_changes_only_what_differs() {
        let dir = TempDir::new("diff");
        let file = dir.join("svc.yaml");
        let doc = |name: &str, ip: &str| {
            format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n")
        };
        fs::write(&file, doc("a", "10.96.0.1") + &doc("b", "10.96.0.2")).unwrap();
        let mut m = ManifestDir::new(dir.to_path_buf(), None);
        let mut c = Incremental::default();
        m.rescan(&mut c).unwrap();
        // A frontend and a ClusterIP marker each.
        assert_eq!(c.compile().len(), 4);
        // b moves, a stays, c is new (written longer, so the stamp differs).
        fs::write(
            &file,
            doc("a", "10.96.0.1") + &doc("b", "10.96.0.3") + &doc("c", "10.96.0.4"),
        )
        .unwrap();
        assert!(m.rescan(&mut c).unwrap().changed);
        assert_eq!(
            c.compile().len(),
            6,
            "b's old and new frontends and markers, c's"
        );
        assert_eq!(c.service_count(), 3);
    }

    #[test]
    fn list_items_and_document_numbers() {
        let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: one}
  spec: {clusterIP: 10.96.0.1}
- apiVersion: v1
  kind: Node
  metadata: {name: node-1}
---
---
kind: Service
"#;
        let (objects, problems) = parse_file_model(Path::new("x.yaml"), text);
        let objects = objects.unwrap();
        assert_eq!((objects.services.len(), objects.nodes.len()), (1, 1));
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].reason,
            "document 2: no apiVersion or kind; skipped"
        );
    }

    /// Issue 19: an object defined twice is settled as `kubectl apply -f` of the
    /// directory leaves it: the last definition (file order, then order in the file)
    /// is used, the others are named; when the later one goes, the earlier is used
    /// again, even from a file that no longer parses (its last good version).
    #[test]
    fn the_last_definition_of_an_object_is_used() {
        let dir = TempDir::new("dup");
        let svc = |name: &str, ip: &str| {
            format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: {ip}, ports: [{{name: http, port: 80}}]}}\n")
        };
        let slice = |name: &str, addr: &str| {
            format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [{addr}]}}]\n")
        };
        fs::write(
            dir.join("a.yaml"),
            svc("web", "10.96.0.1") + &slice("web-1", "10.244.0.1") + &svc("web", "10.96.0.2"),
        )
        .unwrap();
        fs::write(
            dir.join("b.yaml"),
            svc("web", "10.96.0.3") + &slice("web-1", "10.244.0.2"),
        )
        .unwrap();
        let mut m = ManifestDir::new(dir.to_path_buf(), None);
        let mut c = Incremental::default();
        // (ClusterIP, backends) of each frontend.
        let frontends = |m: &mut ManifestDir, c: &mut Incremental| {
            let scan = m.rescan(c).unwrap();
            c.compile();
            let got: Vec<(u32, Vec<u32>)> = c
                .frontends()
                .iter()
                .filter(|(k, _)| !crate::compiler::is_clusterip_marker(k))
                .map(|(k, f)| {
                    (
                        u32::from_be(k.addr_be) & 0xff,
                        f.backends
                            .iter()
                            .map(|b| u32::from_be(b.addr_be) & 0xff)
                            .collect(),
                    )
                })
                .collect();
            (got, scan.new_problems)
        };
        let (got, problems) = frontends(&mut m, &mut c);
        assert_eq!(got, [(3, vec![2])]);
        let reasons: Vec<&str> = problems.iter().map(|p| p.reason.as_str()).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons
            .iter()
            .all(|r| r.contains("is defined again later, in")));
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with("Service default/web in ")
                    && r.contains("a.yaml is defined again later, in ")
                    && r.contains("b.yaml;")),
            "{reasons:?}"
        );
        assert_eq!(m.problems().len(), 3);
        // The later file goes: the last definition of the earlier one is used again.
        fs::remove_file(dir.join("b.yaml")).unwrap();
        let (got, _) = frontends(&mut m, &mut c);
        assert_eq!(got, [(2, vec![1])]);
        assert_eq!(m.problems().len(), 1, "{:?}", m.problems());
        // A later file defines the Service again: the earlier leaves the compiler.
        fs::write(dir.join("c.yaml"), svc("web", "10.96.0.4")).unwrap();
        let (got, _) = frontends(&mut m, &mut c);
        assert_eq!(got, [(4, vec![1])]);
        // b.yaml again, then broken: its last good definition stays, and is used once
        // the later one goes.
        fs::write(dir.join("b.yaml"), svc("web", "10.96.0.3")).unwrap();
        let (got, _) = frontends(&mut m, &mut c);
        assert_eq!(got, [(4, vec![1])]);
        fs::write(dir.join("b.yaml"), "kind: Service\nmetadata: {name: [\n").unwrap();
        let (got, problems) = frontends(&mut m, &mut c);
        assert_eq!(got, [(4, vec![1])]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        fs::remove_file(dir.join("c.yaml")).unwrap();
        let (got, _) = frontends(&mut m, &mut c);
        assert_eq!(got, [(3, vec![1])]);
    }
}

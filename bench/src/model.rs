//! The synthetic cluster every benchmark programs: `n` ClusterIP Services with one TCP
//! port each and their endpoints, rendered as Kubernetes YAML for sliceway and as
//! kube-proxy rules for the baselines, so all three get the same Services.

use std::{fmt::Write as _, net::Ipv4Addr};

/// One Service port and its endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Svc {
    pub namespace: String,
    pub name: String,
    /// Name of the (only) port.
    pub port_name: String,
    pub vip: Ipv4Addr,
    pub port: u16,
    /// Endpoints (pod IP, target port).
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

impl Svc {
    /// kube-proxy's `ServicePortName.String()`: `namespace/name:port`.
    pub fn port_name_string(&self) -> String {
        format!("{}/{}:{}", self.namespace, self.name, self.port_name)
    }
}

/// The VIP of Service `i`: 10.96.0.0/12, skipping .0 and .255 of each /24.
pub fn vip(i: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 96, 0, 0));
    let i = i as u32;
    Ipv4Addr::from(base + (i / 250) * 256 + (i % 250) + 1)
}

/// Endpoint `j` of Service `i` when endpoints are made up (never sent traffic):
/// 10.128.0.0/10, unique per (i, j).
pub fn fake_endpoint(i: usize, j: usize, per_service: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 128, 0, 0));
    Ipv4Addr::from(base + (i * per_service + j) as u32 + 1)
}

/// `n` Services whose endpoints are `endpoints(i)`.
pub fn cluster(n: usize, endpoints: impl Fn(usize) -> Vec<(Ipv4Addr, u16)>) -> Vec<Svc> {
    (0..n)
        .map(|i| Svc {
            namespace: "bench".into(),
            name: format!("svc-{i}"),
            port_name: "http".into(),
            vip: vip(i),
            port: 80,
            endpoints: endpoints(i),
        })
        .collect()
}

/// `n` Services with `k` made-up endpoints each, on port 8080.
pub fn fake_cluster(n: usize, k: usize) -> Vec<Svc> {
    cluster(n, |i| {
        (0..k).map(|j| (fake_endpoint(i, j, k), 8080)).collect()
    })
}

/// The Services as Kubernetes YAML (a Service and an EndpointSlice each), as the
/// agent's manifest directory takes them.
pub fn yaml(services: &[Svc]) -> String {
    let mut out = String::with_capacity(services.len() * 900);
    for s in services {
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  type: ClusterIP\n  clusterIP: {vip}\n  clusterIPs: [{vip}]\n  ports:\n  - {{name: {pn}, port: {port}, protocol: TCP}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-abcde\n  namespace: {ns}\n  labels:\n    kubernetes.io/service-name: {name}\n    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io\naddressType: IPv4\nports:\n- {{name: {pn}, port: {tport}, protocol: TCP}}\nendpoints:\n",
            name = s.name,
            ns = s.namespace,
            vip = s.vip,
            pn = s.port_name,
            port = s.port,
            tport = s.endpoints.first().map_or(8080, |e| e.1),
        );
        if s.endpoints.is_empty() {
            out.push_str("  []\n");
        }
        for (ip, _) in &s.endpoints {
            let _ = writeln!(
                out,
                "  - addresses: [\"{ip}\"]\n    conditions: {{ready: true}}\n    nodeName: node-1"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vips_and_endpoints_are_unique() {
        let c = fake_cluster(1000, 10);
        let vips: std::collections::BTreeSet<_> = c.iter().map(|s| s.vip).collect();
        assert_eq!(vips.len(), 1000);
        let eps: std::collections::BTreeSet<_> =
            c.iter().flat_map(|s| s.endpoints.iter()).collect();
        assert_eq!(eps.len(), 10_000);
        assert_eq!(vip(0), Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(vip(250), Ipv4Addr::new(10, 96, 1, 1));
    }

    #[test]
    fn yaml_parses_and_compiles_to_the_same_frontends() {
        let c = fake_cluster(3, 2);
        let (objects, problems) =
            sliceway_agent::source::local::parse_file(std::path::Path::new("x.yaml"), &yaml(&c));
        assert!(problems.is_empty(), "{problems:?}");
        let objects = objects.unwrap();
        let compiled = sliceway_agent::compiler::compile(
            &objects.services,
            &objects.slices,
            &Default::default(),
        );
        assert!(compiled.skipped.is_empty(), "{:?}", compiled.skipped);
        // Three Service ports and a ClusterIP marker each.
        let ports: Vec<_> = compiled
            .frontends
            .iter()
            .filter(|(k, _)| !sliceway_agent::compiler::is_clusterip_marker(k))
            .collect();
        assert_eq!(ports.len(), 3);
        assert_eq!(compiled.frontends.len(), 6);
        assert!(ports.iter().all(|(_, f)| f.backends.len() == 2));
    }
}

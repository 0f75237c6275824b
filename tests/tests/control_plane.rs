//! The cluster lab's control plane on its own: etcd and kube-apiserver built from
//! upstream's Go modules, reached with the lab's kubectl and with kube-rs.

use anyhow::Result;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use sliceway_lab::cluster;

#[test]
fn control_plane_serves_the_kubernetes_service_with_rbac_on() -> Result<()> {
    let c = cluster::shared_control_plane()?;
    let ip = c.cluster_ip("default", "kubernetes")?;
    assert_eq!(ip.to_string(), cluster::KUBERNETES_SERVICE_IP);
    // RBAC is on: an identity without grants is refused.
    let err = c
        .kubectl(&["get", "pods", "--as=nobody"])
        .expect_err("an unauthorized user must be refused");
    assert!(format!("{err:#}").contains("forbidden"), "{err:#}");
    let rt = tokio::runtime::Runtime::new()?;
    let svc = rt.block_on(async {
        let client = c.client().await?;
        Api::<Service>::namespaced(client, "default")
            .get("kubernetes")
            .await
            .map_err(anyhow::Error::from)
    })?;
    assert_eq!(
        svc.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some(cluster::KUBERNETES_SERVICE_IP)
    );
    Ok(())
}

/// Every document of `deploy/` is accepted by the real API server (server-side dry
/// run: admission and validation, nothing stored).
#[test]
fn the_deploy_manifests_are_valid_for_the_real_api_server() -> Result<()> {
    let c = cluster::shared_control_plane()?;
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    for file in ["sliceway-agent.yaml", "sliceway-controller.yaml"] {
        let path = deploy.join(file);
        let out = c.kubectl(&[
            "apply",
            "--dry-run=server",
            "-f",
            path.to_str().expect("utf-8 path"),
        ])?;
        assert!(out.contains("(server dry run)"), "{file}: {out}");
    }
    Ok(())
}

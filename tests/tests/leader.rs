//! sliceway-controller's leader election on the real API server: two replicas, one
//! Lease; renewals keep it, a paused holder loses it after the lease duration as the
//! other replica observes it, and a graceful release hands it over at once.

use std::time::{Duration, Instant};

use anyhow::Result;
use controller::leader::LeaseLock;
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::Api;
use sliceway_lab::cluster;

const DURATION: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_one_leader_a_paused_one_loses_and_a_release_hands_over() -> Result<()> {
    let cp = cluster::shared_control_plane()?;
    let client = cp.client().await?;
    let api = || Api::<Lease>::namespaced(client.clone(), "default");
    let name = format!("leader-test-{}", std::process::id());
    let a = LeaseLock::new(api(), &name, "replica-a", DURATION);
    let b = LeaseLock::new(api(), &name, "replica-b", DURATION);

    assert!(
        a.try_acquire_or_renew(Timestamp::now()).await?,
        "a takes the free Lease"
    );
    // a renews in time (keep() renews every third of the duration); b never gets in.
    let keeping = tokio::spawn({
        let a = a.clone();
        async move { a.keep().await }
    });
    let until = Instant::now() + DURATION * 2;
    while Instant::now() < until {
        assert!(
            !b.try_acquire_or_renew(Timestamp::now()).await?,
            "b took a renewed Lease"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        !keeping.is_finished(),
        "a lost a Lease it renewed: {:?}",
        keeping.await
    );

    // a is paused (its renewals stop): b takes over once the record has stood
    // unchanged for the duration, measured on b's own clock from when it saw it.
    keeping.abort();
    let paused = Instant::now();
    let mut taken = None;
    while paused.elapsed() < DURATION * 4 {
        if b.try_acquire_or_renew(Timestamp::now()).await? {
            taken = Some(paused.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let taken = taken.expect("b never took the Lease of a paused holder");
    assert!(
        taken >= DURATION - Duration::from_millis(1100),
        "taken after {taken:?}"
    );
    // a, resumed, finds it lost.
    assert!(
        !a.try_acquire_or_renew(Timestamp::now()).await?,
        "two leaders"
    );
    let err = a
        .keep()
        .await
        .expect_err("keep() ends when the Lease is lost");
    assert!(
        err.to_string().contains("leader") || err.to_string().contains("Lease"),
        "{err}"
    );

    // b releases gracefully: a takes over at its next try, without waiting.
    b.release().await?;
    assert!(
        a.try_acquire_or_renew(Timestamp::now()).await?,
        "a did not take a released Lease"
    );
    Ok(())
}

/// Issue 47: a leading `sliceway-controller` stopped by SIGTERM (a rolling update or
/// a drain: the kubelet's stop signal) releases its Lease before it exits, so
/// another replica takes it at once instead of after the 15 s lease duration.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_releases_the_lease_so_another_replica_takes_it_at_once() -> Result<()> {
    let cp = cluster::shared_control_plane()?;
    let client = cp.client().await?;
    let api = Api::<Lease>::namespaced(client.clone(), "default");
    let name = format!("leader-sigterm-{}", std::process::id());
    let mut controller =
        std::process::Command::new(sliceway_lab::workspace_binary("sliceway-controller")?)
            .args(["run", "--metrics-addr", "127.0.0.1:0"])
            .args(["--lease-namespace", "default", "--lease-name", &name])
            .args(["--identity", "replica-term"])
            .env("KUBECONFIG", &cp.state.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
    let holder = |lease: Option<Lease>| lease.and_then(|l| l.spec?.holder_identity);
    let until = Instant::now() + Duration::from_secs(30);
    while holder(api.get_opt(&name).await?).as_deref() != Some("replica-term") {
        if Instant::now() > until || controller.try_wait()?.is_some() {
            let _ = controller.kill();
            anyhow::bail!("the controller never took the Lease");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pid = controller.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()?;
    assert!(killed.success());
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = controller.try_wait()? {
            break status;
        }
        if Instant::now() > until {
            let _ = controller.kill();
            anyhow::bail!("the controller did not exit on SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");
    assert_eq!(
        holder(api.get_opt(&name).await?),
        None,
        "the Lease is released"
    );
    let b = LeaseLock::new(api.clone(), &name, "replica-b", Duration::from_secs(15));
    assert!(
        b.try_acquire_or_renew(Timestamp::now()).await?,
        "another replica takes the released Lease at once"
    );
    b.release().await?;
    Ok(())
}

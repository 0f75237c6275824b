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

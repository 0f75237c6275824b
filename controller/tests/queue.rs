//! The API edge's queue semantics, as upstream's workqueue for the EndpointSlice
//! controller (pkg/controller/endpointslice/endpointslice_controller.go): Pod-triggered
//! syncs delayed from the first change, not by a trailing debounce (issue 14); the
//! rate limiter; dropping after `MAX_RETRIES`.

use std::time::{Duration, Instant};

use controller::controller::{backoff, batched, RateLimiter, Retry, MAX_RETRIES};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;

fn svc(name: &str) -> ObjectRef<Service> {
    ObjectRef::new(name).within("default")
}

/// A Service whose Pods keep changing is still synced one period after the first
/// change; a trailing debounce would postpone it as long as the changes go on.
#[tokio::test(start_paused = true)]
async fn a_busy_service_is_synced_one_period_after_its_first_change() {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<ObjectRef<Service>>>();
    let requests =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut out = Box::pin(batched(requests, Duration::from_secs(1)));
    let start = tokio::time::Instant::now();
    // A change every 100 ms for 3 s.
    tokio::spawn(async move {
        for _ in 0..30 {
            tx.send(vec![svc("web")]).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let first = out.next().await.unwrap();
    assert_eq!(first, svc("web"));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let second = out.next().await.unwrap();
    assert_eq!(second, svc("web"));
    assert!(
        start.elapsed() <= Duration::from_millis(2100),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_period_passes_requests_at_once_and_keeps_services_apart() {
    let requests = futures::stream::iter(vec![vec![svc("a"), svc("b")], vec![svc("a")]]);
    let out: Vec<_> = batched(requests, Duration::ZERO).collect().await;
    assert_eq!(out, vec![svc("a"), svc("b"), svc("a")]);
}

#[test]
fn retries_back_off_per_service_and_stop_after_the_maximum() {
    let mut limiter = RateLimiter::default();
    let now = Instant::now();
    for n in 1..=MAX_RETRIES {
        assert_eq!(
            limiter.failed("default/web", now),
            Retry::After(backoff(n), n)
        );
    }
    assert_eq!(limiter.failed("default/web", now), Retry::Drop);
    // Dropped means forgotten: the next failure starts over.
    assert_eq!(
        limiter.failed("default/web", now),
        Retry::After(backoff(1), 1)
    );
    assert_eq!(backoff(1), Duration::from_secs(1));
    assert_eq!(backoff(11), Duration::from_secs(1000));
    // Another Service has its own count; a success forgets the count.
    assert_eq!(
        limiter.failed("default/other", now),
        Retry::After(backoff(1), 1)
    );
    limiter.forget("default/web");
    assert_eq!(
        limiter.failed("default/web", now),
        Retry::After(backoff(1), 1)
    );
}

#[test]
fn the_overall_bucket_spaces_retries_past_its_burst() {
    let mut limiter = RateLimiter::default();
    let now = Instant::now();
    // 100 distinct Services fail at once: the burst absorbs them.
    for i in 0..100 {
        assert_eq!(
            limiter.failed(&format!("default/s{i}"), now),
            Retry::After(backoff(1), 1)
        );
    }
    // The next ones wait for tokens at 10 a second: the 20th past the burst waits 2 s
    // (more than its own 1 s backoff).
    let mut last = Duration::ZERO;
    for i in 100..120 {
        match limiter.failed(&format!("default/s{i}"), now) {
            Retry::After(d, 1) => last = d,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(last, Duration::from_secs(2));
    // A second later, 10 tokens came back, all of them owed already.
    match limiter.failed("default/late", now + Duration::from_secs(1)) {
        Retry::After(d, 1) => assert!(d > Duration::from_secs(1), "{d:?}"),
        other => panic!("{other:?}"),
    }
}

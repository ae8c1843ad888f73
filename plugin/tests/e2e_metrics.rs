//! End to end, metrics (issue 7): the real daemon serves `/metrics` and `/healthz` on a loopback
//! port; `/healthz` is 503 until the runtime's Synchronize and 200 after it, a prepare moves the
//! prepare histogram's count, and the gauges follow the claims.

mod e2e_common;

use e2e_common::*;
use nri_accel::claims_api::Family;
use tokio::net::UnixListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_healthz_follow_the_daemon() {
    let (node, addr) = TestNode::with_metrics(Shape::default());

    // A runtime that accepts but never answers: the daemon serves metrics, but is not healthy.
    let silent = UnixListener::bind(&node.nri_socket).unwrap();
    let _daemon = node.spawn(&[]);
    let (held, _) = tokio::time::timeout(WAIT, silent.accept())
        .await
        .expect("the daemon dials")
        .unwrap();
    let (code, body) = wait_for("the metrics endpoint", || http_get_async(addr, "/healthz")).await;
    assert_eq!(code, 503, "{body}");
    assert!(!body.trim().is_empty(), "the reason is given");

    // The real runtime: Synchronize opens the gate and /healthz turns 200.
    drop(held);
    drop(silent);
    let fake = runtime(&node).await;
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let (code, body) = wait_for("/healthz 200", || async {
        http_get_async(addr, "/healthz")
            .await
            .filter(|(c, _)| *c == 200)
    })
    .await;
    assert_eq!(code, 200, "{body}");

    let count = r#"nri_accel_prepare_duration_seconds_count{result="ok"}"#;
    let (code, before) = http_get_async(addr, "/metrics").await.expect("metrics");
    assert_eq!(code, 200);
    let before_n = sample(&before, count).unwrap_or(0.0);
    assert!(sample(&before, "nri_accel_gate_open").is_some(), "{before}");

    prepare_ok(&client, count_claim("m-1", Family::Exclusive, None)).await;
    prepare_ok(&client, count_claim("m-2", Family::Shared, None)).await;
    let refused = client
        .prepare(vec![count_claim("m-3", Family::Sliced, Some("nope"))])
        .await
        .unwrap();
    assert!(refused["m-3"].is_err());

    let (_, after) = http_get_async(addr, "/metrics").await.expect("metrics");
    assert_eq!(sample(&after, count), Some(before_n + 2.0), "{after}");
    assert_eq!(
        sample(
            &after,
            r#"nri_accel_prepare_duration_seconds_count{result="error"}"#
        ),
        Some(1.0),
        "{after}"
    );
    assert_eq!(sample(&after, "nri_accel_gate_open"), Some(1.0), "{after}");
    // The claim gauges are refreshed periodically: wait for them to catch up.
    wait_for("the claims gauge", || async {
        let (_, m) = http_get_async(addr, "/metrics").await?;
        (sample(&m, r#"nri_accel_claims{state="prepared"}"#) == Some(2.0)).then_some(())
    })
    .await;

    // The runtime goes away: /healthz says so.
    fake.stop().await;
    let (_, body) = wait_for("/healthz 503 after the runtime left", || async {
        http_get_async(addr, "/healthz")
            .await
            .filter(|(c, _)| *c == 503)
    })
    .await;
    assert!(body.contains("runtime"), "{body}");
    assert_eq!(
        http_get_async(addr, "/nope").await.map(|(c, _)| c),
        Some(404)
    );
}

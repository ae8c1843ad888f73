//! End to end, crashes at named steps through the real binary: `NRI_ACCEL_TEST_CRASH_AT=<step>`
//! makes the daemon abort there; started again without it, the node is consistent (records and
//! specs agree, no temp file left, no unit held twice), the claim is prepared exactly when its
//! spec was in place, and the retried call succeeds.

mod e2e_common;

use std::os::unix::process::ExitStatusExt;

use e2e_common::*;
use nri_accel::claims_api::{ClaimsClient, Family};
use nri_accel::engine::CRASH_ENV;

/// Which call dies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    Prepare,
    Unprepare,
}

async fn consistent(node: &TestNode, client: &ClaimsClient) -> Vec<String> {
    let doc = node.status_json().await;
    let records = status_claims(&doc);
    let specs = node.spec_uids();
    assert_eq!(records, specs, "records and specs disagree");
    assert_eq!(
        node.cdi_entries().len(),
        specs.len(),
        "a temp file was left: {:?}",
        node.cdi_entries()
    );
    assert_no_unit_granted_twice(&doc);
    let listed: Vec<String> = client
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.uid)
        .collect();
    assert_eq!(listed, records.iter().cloned().collect::<Vec<_>>());
    listed
}

/// Dies at `step` during `call` of claim `victim` (a neighbour claim is prepared first and must
/// survive untouched); after the restart the victim is prepared iff `survives`.
async fn crash_at(step: &str, call: Call, survives: bool) {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut dying = node.spawn(&[(CRASH_ENV, step)]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    // A neighbour prepared before the crash (in the prepare case it dies on its own prepare).
    if call == Call::Unprepare {
        prepare_ok(&client, count_claim("neighbour", Family::Shared, None)).await;
        prepare_ok(&client, count_claim("victim", Family::Exclusive, None)).await;
        let r = client.unprepare(vec![claim_ref("victim")]).await;
        assert!(
            r.is_err(),
            "{step}: the daemon answered {r:?} instead of dying"
        );
    } else {
        let r = client
            .prepare(vec![count_claim("victim", Family::Exclusive, None)])
            .await;
        assert!(
            r.is_err(),
            "{step}: the daemon answered {r:?} instead of dying"
        );
    }
    let st = dying.wait_exit().await;
    assert_eq!(
        st.signal(),
        Some(nix::sys::signal::Signal::SIGABRT as i32),
        "{step}: {st:?}; log:\n{}",
        dying.log_text()
    );
    assert!(
        dying.log_text().contains(step),
        "the log names the step: {}",
        dying.log_text()
    );

    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(2, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let held = consistent(&node, &client).await;
    assert_eq!(
        held.contains(&"victim".to_string()),
        survives,
        "{step}: claims after restart {held:?}"
    );
    if call == Call::Unprepare {
        assert!(held.contains(&"neighbour".to_string()), "{held:?}");
    }

    // The retried call completes.
    match call {
        Call::Prepare => {
            let ids = prepare_ok(&client, count_claim("victim", Family::Exclusive, None)).await;
            assert_eq!(ids, vec![format!("{CDI_KIND}=claim-victim-0")]);
            let held = consistent(&node, &client).await;
            assert!(held.contains(&"victim".to_string()));
        }
        Call::Unprepare => {
            let r = client.unprepare(vec![claim_ref("victim")]).await.unwrap();
            assert_eq!(r["victim"], Ok(()));
            let held = consistent(&node, &client).await;
            assert_eq!(held, vec!["neighbour".to_string()]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_allocate() {
    crash_at("after-allocate", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_checkpoint() {
    crash_at("after-checkpoint", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_update_push() {
    crash_at("after-update-push", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_spec_temp() {
    crash_at("after-spec-temp", Call::Prepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_dies_after_spec_rename() {
    crash_at("after-spec-rename", Call::Prepare, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepare_dies_after_release() {
    crash_at("after-release", Call::Unprepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepare_dies_after_spec_remove() {
    crash_at("after-spec-remove", Call::Unprepare, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_crash_step_is_refused_at_startup() {
    let node = TestNode::new(Shape::default(), "");
    let _fake = runtime(&node).await;
    let mut d = node.spawn(&[(CRASH_ENV, "after-lunch")]);
    let st = d.wait_exit().await;
    assert!(!st.success());
    assert!(d.log_text().contains("after-allocate"), "{}", d.log_text());
}

//! Any DRA driver may delegate its devices to nri-accel through the claims API (issue 38, item
//! 2): through the claims API's real socket and the real engine, a claim whose allocation results
//! name a third-party driver is prepared, and claims of two drivers for the same device are never
//! both prepared: the second is refused naming the first, and is prepared once the first is
//! unprepared.

mod claims_common;
mod engine_common;

use claims_common::*;
use engine_common::*;
use nri_accel::claims_api::{ClaimAsk, ClaimRef, ClaimSpec, DraResult};

fn spec(uid: &str, driver: &str, device: &str) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: driver.into(),
            pool: "gpus".into(),
            device: format!("gpus-{device}"),
            share_id: None,
        }]),
        env: Default::default(),
    }
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_drivers_results_are_prepared_and_arbitrated_with_the_own_drivers() {
    let ClaimsNode {
        d, client, _server, ..
    } = serve(2).await;

    // A third-party driver's claim is prepared like the own driver's.
    let first = client
        .prepare(vec![spec("ext", "gpu.example.com", "gpu0")])
        .await
        .unwrap();
    let devices = first["ext"]
        .as_ref()
        .expect("the third-party claim is prepared");
    assert_eq!(devices[0].device, "gpus-gpu0");
    assert_eq!(spec_uids(&d), vec!["ext"]);

    // nri-accel's own driver asks for the same device: refused, the holder named.
    let second = client
        .prepare(vec![spec("own", "accel.nri.io", "gpu0")])
        .await
        .unwrap();
    let e = second["own"].as_ref().expect_err("the device is held");
    assert!(
        e.starts_with("claim own refused: device gpu0 is held by claim ext"),
        "{e}"
    );
    // And the other way round, on another device.
    let own = client
        .prepare(vec![spec("own1", "accel.nri.io", "gpu1")])
        .await
        .unwrap();
    assert!(own["own1"].is_ok(), "{own:?}");
    let ext = client
        .prepare(vec![spec("ext1", "gpu.example.com", "gpu1")])
        .await
        .unwrap();
    let e = ext["ext1"].as_ref().expect_err("the device is held");
    assert!(
        e.starts_with("claim ext1 refused: device gpu1 is held by claim own1"),
        "{e}"
    );
    assert_eq!(spec_uids(&d), vec!["ext", "own1"]);

    // Once the holder is unprepared, the retry is prepared.
    let answer = client.unprepare(vec![claim_ref("ext")]).await.unwrap();
    assert!(answer["ext"].is_ok(), "{answer:?}");
    let retry = client
        .prepare(vec![spec("own", "accel.nri.io", "gpu0")])
        .await
        .unwrap();
    assert!(retry["own"].is_ok(), "{retry:?}");
    assert_eq!(spec_uids(&d), vec!["own", "own1"]);
}

//! End to end, bad input through the claims API against the real daemon: a path-like UID, an
//! oversized request, an unknown family, unknown devices and profiles, more units than the node
//! has, and garbage bytes each get a clear error, write nothing, and leave the daemon serving.

mod e2e_common;

use std::io::Write;

use e2e_common::*;
use nri_accel::claims_api::proto::{claims as pb, claims_ttrpc};
use nri_accel::claims_api::{
    ClaimAsk, ClaimSpec, ClaimsApiError, ClaimsClient, CountAsk, DraResult, Family, Selector,
};
use protobuf::EnumOrUnknown;

fn rpc_code(e: &ClaimsApiError) -> Option<ttrpc::Code> {
    match e {
        ClaimsApiError::Rpc { code, .. } => Some(*code),
        _ => None,
    }
}

async fn nothing_written(node: &TestNode, client: &ClaimsClient) {
    assert!(node.cdi_entries().is_empty(), "{:?}", node.cdi_entries());
    assert!(client.list().await.unwrap().is_empty());
    let doc = node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
    assert_eq!(assert_no_unit_granted_twice(&doc), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_write_nothing() {
    let node = TestNode::new(Shape::default(), "");
    // A small message limit, so an oversized request is cheap to build.
    let cfg = std::fs::read_to_string(&node.config)
        .unwrap()
        .replace("claims_api:\n", "claims_api:\n  max_message_bytes: 4096\n");
    std::fs::write(&node.config, cfg).unwrap();
    let fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    // A UID that would escape the CDI dir: refused per claim, naming the value; the sibling is
    // served.
    let answer = client
        .prepare(vec![
            count_claim("../x", Family::Exclusive, None),
            count_claim("a/b", Family::Exclusive, None),
        ])
        .await
        .expect("prepare");
    let err = answer["../x"].as_ref().expect_err("bad uid");
    assert!(err.contains("\"../x\""), "{err}");
    assert!(answer["a/b"].is_err());
    let gone = client.unprepare(vec![claim_ref("../x")]).await.unwrap();
    assert!(gone["../x"].as_ref().unwrap_err().contains("\"../x\""));
    nothing_written(&node, &client).await;

    // Oversized: refused whole with the limit named; the connection stays usable.
    let claims: Vec<ClaimSpec> = (0..40)
        .map(|i| ClaimSpec {
            name: "n".repeat(200),
            ..count_claim(&format!("big-{i}"), Family::Exclusive, None)
        })
        .collect();
    let err = client.prepare(claims).await.expect_err("oversized");
    assert_eq!(
        rpc_code(&err),
        Some(ttrpc::Code::RESOURCE_EXHAUSTED),
        "{err}"
    );
    assert!(err.to_string().contains("4096"), "{err}");
    nothing_written(&node, &client).await;

    // An unknown family, sent on the wire as the generated client would never send it.
    let stream = tokio::net::UnixStream::connect(&node.claims_socket)
        .await
        .unwrap();
    let raw = claims_ttrpc::ClaimsClient::new(ttrpc::r#async::Client::new(
        ttrpc::r#async::transport::Socket::new(stream),
    ));
    let mut req = pb::CountRequest::new();
    req.request = "gpu".into();
    req.count = 1;
    req.family = EnumOrUnknown::from_i32(42);
    let mut count = pb::CountRequests::new();
    count.requests.push(req);
    let mut claim = pb::Claim::new();
    claim.uid = "fam-1".into();
    claim.namespace = "e2e".into();
    claim.set_count(count);
    let mut prep = pb::PrepareRequest::new();
    prep.claims.push(claim);
    let resp = raw
        .prepare(ttrpc::context::with_duration(WAIT), &prep)
        .await
        .expect("per-claim answer");
    let err = &resp.claims["fam-1"].error;
    println!("unknown family: {err}");
    assert!(
        err.contains("fam-1") && err.contains("family") && err.contains("exclusive"),
        "{err}"
    );
    nothing_written(&node, &client).await;

    // Refusals by the policy: one sentence naming the claim and the device or the reason.
    let named = |uid: &str, device: &str| ClaimSpec {
        uid: uid.into(),
        namespace: "e2e".into(),
        name: uid.into(),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: "accel.nri.io".into(),
            pool: "whole".into(),
            device: device.into(),
            share_id: None,
        }]),
        env: Default::default(),
    };
    let answer = client
        .prepare(vec![
            named("ghost-1", "gpu99"),
            count_claim("profile-1", Family::Sliced, Some("9g")),
            ClaimSpec {
                ask: ClaimAsk::Count(vec![CountAsk {
                    request: "gpu".into(),
                    count: 9,
                    family: Family::Exclusive,
                    selector: Selector::default(),
                    profile: None,
                    shares: None,
                }]),
                ..count_claim("greedy-1", Family::Exclusive, None)
            },
        ])
        .await
        .unwrap();
    let ghost = answer["ghost-1"].as_ref().unwrap_err();
    assert!(
        ghost.contains("ghost-1") && ghost.contains("gpu99"),
        "{ghost}"
    );
    let profile = answer["profile-1"].as_ref().unwrap_err();
    assert!(
        profile.contains("profile-1") && profile.contains("9g"),
        "{profile}"
    );
    let greedy = answer["greedy-1"].as_ref().unwrap_err();
    assert!(greedy.contains("greedy-1"), "{greedy}");
    for e in [ghost, profile, greedy] {
        println!("refusal: {e}");
        assert_eq!(e.lines().count(), 1, "one sentence: {e}");
    }
    nothing_written(&node, &client).await;

    // Garbage bytes close that connection only.
    let mut junk = std::os::unix::net::UnixStream::connect(&node.claims_socket).unwrap();
    let _ = junk.write_all(&[0xff; 64]);
    drop(junk);
    let ok = prepare_ok(&client, count_claim("fine-1", Family::Exclusive, None)).await;
    assert_eq!(ok, vec![format!("{CDI_KIND}=claim-fine-1-0")]);
    assert_eq!(node.spec_uids(), ["fine-1".to_string()].into());
}

//! A claim UID belongs to one namespace/name (issue 39, item 5): through the claims API's real
//! socket and the real engine, a Prepare or an Unprepare naming a held UID under another
//! namespace or name is refused for that claim and changes nothing; the same names, a release by
//! UID alone and records that name no one (older checkpoints, adopted claims) still work.

mod claims_common;
mod engine_common;

use claims_common::*;
use engine_common::*;
use nri_accel::claims_api::{ClaimAsk, ClaimRef, ClaimSpec, DraResult};
use nri_accel::daemon::Agent;

fn spec(uid: &str, namespace: &str, name: &str, device: &str) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: namespace.into(),
        name: name.into(),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: "accel.nri.io".into(),
            pool: "gpus".into(),
            device: format!("gpus-{device}"),
            share_id: None,
        }]),
        env: Default::default(),
    }
}

fn named(uid: &str, namespace: &str, name: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// (uid, namespace, name) of every claim the engine holds.
fn held(agent: &Agent) -> Vec<(String, String, String)> {
    agent
        .engine()
        .claims()
        .into_iter()
        .map(|(a, _)| (a.claim_uid, a.namespace, a.name))
        .collect()
}

fn x_as_a_n1() -> Vec<(String, String, String)> {
    vec![("x".into(), "a".into(), "n1".into())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_uid_under_another_namespace_or_name_is_refused_and_changes_nothing() {
    let f = serve(4).await;
    let first = f
        .client
        .prepare(vec![spec("x", "a", "n1", "gpu0")])
        .await
        .unwrap();
    assert!(first["x"].is_ok(), "{first:?}");

    // The same UID as another claim: not the holder's grant.
    for (ns, name) in [("b", "n2"), ("b", "n1"), ("a", "n2")] {
        let answer = f
            .client
            .prepare(vec![spec("x", ns, name, "gpu0")])
            .await
            .unwrap();
        let e = answer["x"].as_ref().expect_err("another claim's prepare");
        assert_eq!(
            e,
            &format!(
                "claim x not prepared: it is held as a/n1 and this Prepare names it {ns}/{name}; nothing was changed: a claim UID belongs to one namespace/name, so give that claim a UID of its own, or unprepare a/n1 first"
            )
        );
    }
    // Nor does another claim's Unprepare release it.
    let answer = f
        .client
        .unprepare(vec![named("x", "b", "n2")])
        .await
        .unwrap();
    let e = answer["x"].as_ref().expect_err("another claim's unprepare");
    assert_eq!(
        e,
        "claim x not unprepared: it is held as a/n1 and this Unprepare names it b/n2; nothing was changed: a claim UID belongs to one namespace/name, so unprepare it as a/n1, or by its UID alone (an empty namespace and name, as nri-accel unprepare <uid> does)"
    );
    assert_eq!(held(&f.agent), x_as_a_n1());
    assert_eq!(spec_uids(&f.d), vec!["x"]);
    let record = f
        .agent
        .engine()
        .checkpoint()
        .record("x")
        .expect("the record stays");
    assert_eq!(
        (
            record.allocation.namespace.as_str(),
            record.allocation.name.as_str()
        ),
        ("a", "n1")
    );

    // The holder's own names still repeat and release it.
    let again = f
        .client
        .prepare(vec![spec("x", "a", "n1", "gpu0")])
        .await
        .unwrap();
    assert_eq!(again["x"], first["x"]);
    let answer = f
        .client
        .unprepare(vec![named("x", "a", "n1")])
        .await
        .unwrap();
    assert!(answer["x"].is_ok(), "{answer:?}");
    assert!(held(&f.agent).is_empty());
    assert!(spec_uids(&f.d).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprepare_by_uid_alone_releases_and_a_record_naming_no_one_matches_any_names() {
    let f = serve(4).await;
    f.client
        .prepare(vec![spec("x", "a", "n1", "gpu0")])
        .await
        .unwrap()["x"]
        .as_ref()
        .unwrap();
    // `nri-accel unprepare <uid>` names neither namespace nor name: the operator's release.
    let answer = f.client.unprepare(vec![named("x", "", "")]).await.unwrap();
    assert!(answer["x"].is_ok(), "{answer:?}");
    assert!(held(&f.agent).is_empty());

    // A record that names no one (written before names were kept, or adopted) does not know
    // whom it belongs to: a caller's names match it, so a kubelet re-preparing after an
    // upgrade gets its grant back.
    let mut legacy = claim_for("old", "gpu1");
    legacy.namespace.clear();
    legacy.name.clear();
    let first = f.agent.engine().prepare(legacy).await.unwrap();
    let again = f
        .client
        .prepare(vec![spec("old", "a", "n1", "gpu1")])
        .await
        .unwrap();
    let devices = again["old"]
        .as_ref()
        .expect("matches a record naming no one");
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![first.devices[0].cdi_id.clone()]
    );
    let answer = f
        .client
        .unprepare(vec![named("old", "b", "n2")])
        .await
        .unwrap();
    assert!(answer["old"].is_ok(), "{answer:?}");
    assert!(held(&f.agent).is_empty());
    assert!(spec_uids(&f.d).is_empty());
}

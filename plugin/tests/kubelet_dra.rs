//! The DRA driver's kubelet side through real unix sockets: the simulated kubelet (kube-sim,
//! messages declared by hand from the kubelet's field numbers) registers the plugin from its
//! registry directory and calls NodePrepareResources / NodeUnprepareResources (v1 and v1beta1)
//! and NodeWatchResources on the real engine, with a fake API server behind the claim source.

mod kubelet_common;

use std::time::Duration;

use kube_sim::kubelet::wire::dra::{Claim, NodePrepareResourcesRequest};
use kube_sim::kubelet::{
    DraApi, DraClient, GrpcCaller, HealthApi, HealthWatch, PluginWatcher, SimError,
};
use kubelet_common::*;
use nri_accel::claims_api::DraResult;
use nri_accel::kubelet::RegistrationState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_prepare_repeat_unprepare_v1() {
    let rig = Rig::start().await;
    let (_kubelet, plugin, client) = rig.kubelet().await;
    assert_eq!(plugin.kind, "DRAPlugin");
    assert_eq!(plugin.endpoint, rig.endpoint());
    assert_eq!(plugin.dra_version, "v1.DRAPlugin");
    for v in [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ] {
        assert!(plugin.supported_versions.iter().any(|s| s == v), "{v}");
    }
    let mut state = rig.driver().subscribe();
    tokio::time::timeout(
        WAIT,
        state.wait_for(|s| *s == RegistrationState::Registered),
    )
    .await
    .expect("verdict in time")
    .unwrap();

    // A whole GPU and a share of the shared one, chosen by the scheduler from the published names.
    let c = rig.allocate("uid-1", "train", &["whole-gpu0", "shared-gpu2"]);
    let answer = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    let devices = answer["uid-1"].as_ref().expect("prepared").clone();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].pool_name, POOL);
    assert_eq!(devices[0].device_name, "whole-gpu0");
    assert_eq!(devices[0].request_names, ["req-0"]);
    assert_eq!(
        devices[0].cdi_device_ids,
        [format!("{CDI_KIND}=claim-uid-1-0")]
    );
    assert_eq!(devices[0].share_id, None);
    assert_eq!(devices[1].device_name, "shared-gpu2");
    assert_eq!(
        devices[1].share_id.as_deref(),
        Some("share-uid-1-1"),
        "the share ID of a result on a shared device is answered back"
    );
    assert_eq!(rig.spec_uids(), ["uid-1"]);

    // The kubelet repeats the call (e.g. after it restarted): the same answer, nothing new.
    let again = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(again["uid-1"].as_ref().unwrap(), &devices);
    assert_eq!(rig.held(), ["uid-1"]);

    // Unprepare, twice, and of a claim never seen: all success.
    let gone = client
        .unprepare(&[c.clone(), claim("uid-never", "x")])
        .await
        .unwrap();
    assert!(gone.values().all(Result::is_ok), "{gone:?}");
    assert!(client.unprepare(&[c]).await.unwrap()["uid-1"].is_ok());
    assert!(rig.spec_uids().is_empty());
    assert!(rig.held().is_empty());
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_configured_env_reaches_its_requests_devices_even_when_the_spec_is_rewritten() {
    let rig = Rig::start().await;
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    let slice = rig
        .names_of("gpu3")
        .into_iter()
        .find(|p| p.kind == policies::PublishedKind::Slice)
        .expect("gpu3 publishes slices")
        .name
        .clone();
    let c = rig.allocate("uid-env", "env", &["whole-gpu0", &slice]);
    rig.configure("env", "req-0", &[("INFERENCE_MODE", "batch")]);
    // A variable the sliced policy sets itself: its value stays the policy's.
    rig.configure(
        "env",
        "req-1",
        &[("ACCEL_SLICE_PROFILE", "all-of-it"), ("TIER", "gold")],
    );
    let answer = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    assert!(answer["uid-env"].is_ok(), "{answer:?}");
    let env = rig.spec_env("uid-env");
    assert_eq!(env[0], ["INFERENCE_MODE=batch"], "req-0's device: {env:?}");
    assert!(
        env[1].contains(&"TIER=gold".to_string()),
        "req-1's device: {env:?}"
    );
    let profiles: Vec<_> = env[1]
        .iter()
        .filter(|e| e.starts_with("ACCEL_SLICE_PROFILE="))
        .collect();
    assert_eq!(profiles.len(), 1, "{env:?}");
    assert_ne!(profiles[0], "ACCEL_SLICE_PROFILE=all-of-it", "{env:?}");

    // The spec lost and the API server down: the kubelet's repeat writes it again from the
    // record, configured env included.
    std::fs::remove_file(rig.spec_path("uid-env")).unwrap();
    rig.claims.set_down(true);
    let again = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(again["uid-env"], answer["uid-env"]);
    assert_eq!(rig.spec_env("uid-env"), env);
    rig.shutdown().await;
}

/// The kubelet names every claim by namespace, name and UID; a held UID named as another claim
/// is that claim's bug (or an adversary's), never the holder's grant or release (issue 39,
/// item 5): both calls are refused for that claim and the holder keeps its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_uid_named_as_another_claim_is_neither_granted_nor_released() {
    let rig = Rig::start().await;
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    let holder = rig.allocate("uid-x", "n1", &["whole-gpu0"]);
    let first = client.prepare(std::slice::from_ref(&holder)).await.unwrap();
    let ids = cdi_ids(&first, "uid-x");
    let other = Claim {
        namespace: "other".into(),
        uid: "uid-x".into(),
        name: "n2".into(),
    };
    let answer = client.prepare(std::slice::from_ref(&other)).await.unwrap();
    let e = error_of(&answer, "uid-x");
    assert!(
        e.starts_with(
            "claim uid-x not prepared: it is held as default/n1 and this Prepare names it other/n2;"
        ),
        "{e}"
    );
    let answer = client
        .unprepare(std::slice::from_ref(&other))
        .await
        .unwrap();
    let e = answer["uid-x"]
        .as_ref()
        .expect_err("another claim's unprepare");
    assert!(
        e.starts_with("claim uid-x not unprepared: it is held as default/n1 and this Unprepare names it other/n2;"),
        "{e}"
    );
    assert_eq!(rig.held(), ["uid-x"]);
    assert_eq!(rig.spec_uids(), ["uid-x"]);
    let again = client.prepare(std::slice::from_ref(&holder)).await.unwrap();
    assert_eq!(cdi_ids(&again, "uid-x"), ids);
    assert!(client.unprepare(&[holder]).await.unwrap()["uid-x"].is_ok());
    assert!(rig.held().is_empty());
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_claim_is_answered_without_the_api_server_unless_it_holds_shares() {
    let rig = Rig::start().await;
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    let whole = rig.allocate("uid-w", "w", &["whole-gpu0"]);
    let shared = rig.allocate("uid-s", "s", &["shared-gpu2"]);
    let first = client
        .prepare(&[whole.clone(), shared.clone()])
        .await
        .unwrap();
    assert_eq!(rig.claims.reads(), 2);
    let again = client
        .prepare(&[whole.clone(), shared.clone()])
        .await
        .unwrap();
    for uid in ["uid-w", "uid-s"] {
        assert_eq!(again[uid].as_ref().unwrap(), first[uid].as_ref().unwrap());
    }
    assert_eq!(
        rig.claims.reads(),
        3,
        "only the claim holding a share is read again (for its share ID)"
    );
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_kubelet_speaks_v1beta1() {
    let rig = Rig::start().await;
    let mut kubelet = PluginWatcher::speaking(&rig.registry, &["v1beta1.DRAPlugin"]);
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.unwrap();
    assert_eq!(plugin.dra_version, "v1beta1.DRAPlugin");
    let client = DraClient::for_plugin(&plugin).await.unwrap();
    let c = rig.allocate("uid-b", "old", &["shared-gpu2"]);
    let answer = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    let devices = answer["uid-b"].as_ref().unwrap();
    assert_eq!(
        devices[0].cdi_device_ids,
        [format!("{CDI_KIND}=claim-uid-b-0")]
    );
    assert_eq!(devices[0].share_id, None, "v1beta1 has no share_id field");
    assert!(client.unprepare(&[c]).await.unwrap()["uid-b"].is_ok());
    assert!(rig.spec_uids().is_empty());
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_claim_never_fails_its_siblings_and_bad_input_writes_nothing() {
    let rig = Rig::start().await;
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    let slices = rig.names_of("gpu3");
    let big = slices
        .iter()
        .find(|p| p.name.contains("3g-40gb-0"))
        .expect("a 3g slice at 0")
        .name
        .clone();
    let small = slices
        .iter()
        .find(|p| p.name.contains("1g-10gb-1"))
        .expect("a 1g slice at 1")
        .name
        .clone();
    // A slice already held: an overlapping one must be refused.
    let held = rig.allocate("uid-held", "held", &[&big]);
    assert!(client.prepare(&[held]).await.unwrap()["uid-held"].is_ok());

    let result = |device: &str, pool: &str, driver: &str| DraResult {
        request: "gpu".into(),
        driver: driver.into(),
        pool: pool.into(),
        device: device.into(),
        share_id: None,
    };
    let good = rig.allocate("uid-good", "good", &["whole-gpu1"]);
    let unknown = rig.store(
        "uid-unknown",
        "unknown",
        Some(vec![result("whole-gpu9", POOL, DRIVER)]),
    );
    let foreign_pool = rig.store(
        "uid-pool",
        "pool",
        Some(vec![result("whole-gpu0", "node-2", DRIVER)]),
    );
    let other_driver = rig.store(
        "uid-driver",
        "driver",
        Some(vec![
            result("whole-gpu0", POOL, DRIVER),
            result("eth0", POOL, "nic.example.com"),
        ]),
    );
    let overlap = rig.allocate("uid-overlap", "overlap", &[&small]);
    let unallocated = rig.store("uid-unalloc", "unalloc", None);
    let recreated = {
        rig.allocate("uid-new", "recreated", &["whole-gpu0"]);
        claim("uid-old", "recreated")
    };
    let missing = claim("uid-missing", "missing");
    let bad_ns = Claim {
        namespace: "Not_A_Label".into(),
        ..claim("uid-ns", "x")
    };
    let bad_name = claim("uid-name", "../../etc/passwd");
    let bad_uid = claim("../escape", "x");
    let all = [
        good,
        unknown,
        foreign_pool,
        other_driver,
        overlap,
        unallocated,
        recreated,
        missing,
        bad_ns,
        bad_name,
        bad_uid,
    ];
    let reads_before = rig.claims.reads();
    let answer = client.prepare(&all).await.unwrap();
    assert_eq!(
        answer.len(),
        all.len(),
        "every claim is answered: {answer:?}"
    );
    assert_eq!(
        cdi_ids(&answer, "uid-good"),
        [format!("{CDI_KIND}=claim-uid-good-0")]
    );
    let expect = [
        ("uid-unknown", "which this node does not publish"),
        ("uid-pool", "not this node's pool node-1"),
        ("uid-driver", "belongs to driver nic.example.com"),
        ("uid-overlap", "held by claim uid-held"),
        ("uid-unalloc", "is not allocated"),
        ("uid-old", "has UID uid-new"),
        ("uid-missing", "does not exist"),
        ("uid-ns", "is not a DNS label"),
        ("uid-name", "is not a DNS subdomain"),
        ("../escape", "claim uid"),
    ];
    for (uid, words) in expect {
        let e = error_of(&answer, uid);
        assert!(e.contains(words), "{uid}: {e}");
        assert!(!e.contains("Some(") && !e.contains("Ok("), "{e}");
    }
    // Names that cannot name a claim never reach the API server.
    assert_eq!(rig.claims.reads() - reads_before, 8);
    // Nothing was written for any refused claim.
    assert_eq!(rig.spec_uids(), ["uid-good", "uid-held"]);
    let mut held = rig.held();
    held.sort();
    assert_eq!(held, ["uid-good", "uid-held"]);
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_call_is_unavailable_while_the_gate_is_closed() {
    let rig = Rig::closed().await;
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    let c = rig.allocate("uid-g", "g", &["whole-gpu0"]);
    let err = client.prepare(std::slice::from_ref(&c)).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert!(err.to_string().contains("Synchronize"), "{err}");
    let err = client
        .unprepare(std::slice::from_ref(&c))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert_eq!(rig.claims.reads(), 0);
    assert!(rig.spec_uids().is_empty());

    rig.gate.open();
    assert!(client.prepare(&[c]).await.unwrap()["uid-g"].is_ok());
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_claims_or_too_large_a_request_fail_the_whole_call() {
    let rig = Rig::start().await;
    let (_kubelet, plugin, client) = rig.kubelet().await;
    let many: Vec<Claim> = (0..=nri_accel::kubelet::MAX_CLAIMS)
        .map(|i| claim(&format!("uid-{i}"), &format!("c{i}")))
        .collect();
    let err = client.prepare(&many).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    let err = client.unprepare(&many).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");

    let huge = Claim {
        namespace: "default".into(),
        uid: "uid-huge".into(),
        name: "x".repeat(nri_accel::kubelet::MAX_MESSAGE_BYTES + 1),
    };
    let caller = GrpcCaller::connect(&plugin.endpoint).await.unwrap();
    let err = caller
        .unary::<_, kube_sim::kubelet::wire::dra::NodePrepareResourcesResponse>(
            kube_sim::kubelet::wire::dra::V1_PREPARE,
            NodePrepareResourcesRequest { claims: vec![huge] },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.code(),
            Some(tonic::Code::OutOfRange | tonic::Code::ResourceExhausted)
        ),
        "{err}"
    );
    assert_eq!(rig.claims.reads(), 0);
    assert!(rig.spec_uids().is_empty());
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepare_and_repeats_need_no_api_server_and_prepare_is_retried_after_it_returns() {
    let rig = Rig::start().await;
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    let held = rig.allocate("uid-a", "a", &["whole-gpu0"]);
    let first = client.prepare(std::slice::from_ref(&held)).await.unwrap();
    let ids = cdi_ids(&first, "uid-a");

    rig.claims.set_down(true);
    let fresh = rig.allocate("uid-b", "b", &["whole-gpu1"]);
    let answer = client
        .prepare(&[held.clone(), fresh.clone()])
        .await
        .unwrap();
    assert_eq!(
        cdi_ids(&answer, "uid-a"),
        ids,
        "a repeat is answered from the node's record"
    );
    let e = error_of(&answer, "uid-b");
    assert!(e.contains("cannot be reached"), "{e}");
    assert_eq!(rig.spec_uids(), ["uid-a"]);

    // The claim is deleted while the API server is down: unprepare needs neither.
    rig.claims.delete("default", "a");
    assert!(client.unprepare(&[held]).await.unwrap()["uid-a"].is_ok());
    assert!(rig.spec_uids().is_empty());

    // The kubelet retries the failed prepare once the API server is back.
    rig.claims.set_down(false);
    let answer = client.prepare(&[fresh]).await.unwrap();
    assert_eq!(
        cdi_ids(&answer, "uid-b"),
        [format!("{CDI_KIND}=claim-uid-b-0")]
    );
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_the_kubelet_gave_up_on_still_completes() {
    let rig = Rig::start().await;
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    let c = rig.allocate("uid-slow", "slow", &["whole-gpu0"]);
    let stall = rig.claims.stall();
    // The kubelet's call is cancelled while the claim is being read.
    let call = tokio::time::timeout(
        Duration::from_millis(300),
        client.prepare(std::slice::from_ref(&c)),
    )
    .await;
    assert!(call.is_err(), "the call is still waiting on the API server");
    assert_eq!(rig.claims.reads(), 1);
    assert!(rig.spec_uids().is_empty());

    // The read answers: the prepare the caller abandoned goes on to the end.
    stall.add_permits(1);
    let deadline = tokio::time::Instant::now() + WAIT;
    while rig.spec_uids().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "prepare never finished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rig.held(), ["uid-slow"]);
    // The kubelet's retry finds it prepared.
    stall.add_permits(1);
    let answer = client.prepare(&[c]).await.unwrap();
    assert_eq!(
        cdi_ids(&answer, "uid-slow"),
        [format!("{CDI_KIND}=claim-uid-slow-0")]
    );
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_and_wiped_sockets_lead_to_a_new_registration() {
    let rig = Rig::start().await;
    let (mut kubelet, _plugin, client) = rig.kubelet().await;
    let c = rig.allocate("uid-r", "r", &["whole-gpu0"]);
    let ids = cdi_ids(
        &client.prepare(std::slice::from_ref(&c)).await.unwrap(),
        "uid-r",
    );

    // The kubelet restarts: it forgets its plugins and finds ours again in the registry dir.
    kubelet.restart();
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.unwrap();
    let client = DraClient::for_plugin(&plugin).await.unwrap();
    assert_eq!(
        cdi_ids(
            &client.prepare(std::slice::from_ref(&c)).await.unwrap(),
            "uid-r"
        ),
        ids
    );

    // Both directories are wiped: the sockets are served again and the plugin registers anew.
    let mut state = rig.driver().subscribe();
    std::fs::remove_dir_all(&rig.registry).unwrap();
    std::fs::remove_dir_all(&rig.plugins).unwrap();
    kubelet.scan().await;
    assert_eq!(kubelet.registered().count(), 0);
    tokio::time::timeout(WAIT, state.wait_for(|s| *s == RegistrationState::Waiting))
        .await
        .expect("served again")
        .unwrap();
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.unwrap();
    tokio::time::timeout(
        WAIT,
        state.wait_for(|s| *s == RegistrationState::Registered),
    )
    .await
    .expect("registered again")
    .unwrap();
    let client = DraClient::connect(&plugin.endpoint, DraApi::V1)
        .await
        .unwrap();
    assert!(client.unprepare(&[c]).await.unwrap()["uid-r"].is_ok());

    // Shutdown unlinks both sockets.
    let (endpoint, registration) = (rig.endpoint(), rig.registration_socket());
    let _dir = rig.shutdown().await;
    assert!(!exists(&endpoint));
    assert!(!exists(&registration));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_changes_are_streamed_per_published_device() {
    let rig = Rig::start().await;
    let (_kubelet, plugin, _client) = rig.kubelet().await;
    assert_eq!(HealthApi::of(&plugin), Some(HealthApi::V1));
    let mut watch = HealthWatch::start(&plugin.endpoint, HealthApi::V1)
        .await
        .unwrap();
    let first = watch.next(WAIT).await.unwrap();
    assert_eq!(first.len(), rig.published.len(), "the full picture first");
    assert!(first.iter().all(|d| d.is_healthy() && d.pool == POOL));
    assert!(first.iter().all(|d| d.timeout_seconds > 0));

    // The sliced GPU's driver goes away: every name it is published under turns unhealthy.
    rig.set_health(
        "gpu3",
        false,
        "device gpu3 (PCI 0000:48:00.0) was unbound from its driver nvidia",
    );
    let names: Vec<String> = rig
        .names_of("gpu3")
        .iter()
        .map(|p| p.name.clone())
        .collect();
    assert!(names.len() > 1, "{names:?}");
    let now = watch
        .wait_for(WAIT, |d| d.iter().any(|e| !e.is_healthy()))
        .await
        .unwrap();
    assert_eq!(
        now.len(),
        rig.published.len(),
        "every message is the complete list"
    );
    let mut sick: Vec<String> = now
        .iter()
        .filter(|d| !d.is_healthy())
        .map(|d| d.device.clone())
        .collect();
    sick.sort();
    let mut want = names.clone();
    want.sort();
    assert_eq!(sick, want);
    assert!(
        now.iter()
            .find(|d| !d.is_healthy())
            .unwrap()
            .message
            .contains("unbound")
    );

    // An older kubelet watches v1alpha1 and sees the same; then the device recovers.
    let mut old = HealthWatch::start(&plugin.endpoint, HealthApi::V1alpha1)
        .await
        .unwrap();
    let first = old.next(WAIT).await.unwrap();
    assert_eq!(
        first.iter().filter(|d| !d.is_healthy()).count(),
        names.len()
    );
    rig.set_health("gpu3", true, "");
    for w in [&mut watch, &mut old] {
        w.wait_for(WAIT, |d| d.iter().all(|e| e.is_healthy()))
            .await
            .unwrap();
    }
    // Shutting down ends the streams rather than waiting on them.
    rig.shutdown().await;
    let ended = watch.next(WAIT).await.unwrap_err();
    assert!(matches!(ended, SimError::Status { .. }), "{ended}");
}

//! End to end, the annotation path (no DRA): a pod annotation asks for a GPU per container; the
//! real daemon prepares a container-scoped claim in CreateContainer, answers the grant in the
//! adjustment (device nodes and cgroup rules, on every runtime: the spec it writes is never named
//! in the same reply), writes the spec, and releases it on RemoveContainer.
//! Refused requests fail the creation with one readable sentence and leave nothing behind.

mod e2e_common;

use e2e_common::*;
use fake_runtime::{FakeError, RuntimeConfig};
use nri_proto::api::Event;

const KEY: &str = "accel.nri.io/container.app";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_grant_as_device_nodes_then_released_on_remove() {
    let node = TestNode::new(Shape::default(), "");
    let (fake, _daemon) = start_with(&node, RuntimeConfig::default()).await;

    let p = pod("notebook", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(p.clone());
    let c = container("c-app-0001", &p, "app", &[]);
    fake.create_container(&p, &c).await.expect("create");
    fake.add_container(c.clone());

    let adj = last_adjustment(&fake, "c-app-0001");
    assert!(adj.CDI_devices.is_empty(), "{adj:?}");
    let linux = adj.linux.as_ref().expect("linux adjustment");
    let paths: Vec<&str> = linux.devices.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths.contains(&"/dev/nvidiactl"), "{paths:?}");
    let gpu = linux
        .devices
        .iter()
        .find(|d| d.path != "/dev/nvidiactl")
        .unwrap();
    assert!(gpu.path.starts_with("/dev/nvidia"), "{}", gpu.path);
    assert_eq!((gpu.type_.as_str(), gpu.major), ("c", 195));
    let res = linux.resources.as_ref().expect("resources");
    let rules: Vec<(i64, i64, &str, bool)> = res
        .devices
        .iter()
        .map(|r| {
            (
                r.major.as_ref().map(|m| m.value).unwrap_or(-1),
                r.minor.as_ref().map(|m| m.value).unwrap_or(-1),
                r.access.as_str(),
                r.allow,
            )
        })
        .collect();
    assert!(rules.contains(&(195, gpu.minor, "rw", true)), "{rules:?}");
    assert!(rules.contains(&(195, 255, "rw", true)), "{rules:?}");
    // The whole-GPU pool gives two local CPUs with the device.
    let cpu = res.cpu.as_ref().expect("cpuset");
    assert!(!cpu.cpus.is_empty());

    // The spec is written in this path too: it is the proof of the grant.
    let uid = "ctr-capp0001";
    assert_eq!(node.spec_uids(), [uid.to_string()].into());
    let doc = node.status_json().await;
    let claim = doc["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["uid"] == uid)
        .unwrap_or_else(|| panic!("{doc:#}"));
    assert_eq!(claim["origin"]["kind"], "annotation");
    assert_eq!(claim["origin"]["container_id"], "c-app-0001");
    assert_eq!(
        claim["results"][0]["device_id"],
        format!("gpu{}", gpu.minor)
    );
    assert_no_unit_granted_twice(&doc);

    // The container is removed: the claim is released, the spec removed.
    fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    fake.forget_container("c-app-0001");
    assert!(node.spec_uids().is_empty(), "{:?}", node.cdi_entries());
    let doc = node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
    assert_eq!(assert_no_unit_granted_twice(&doc), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_grant_never_names_the_spec_it_writes_even_where_cdi_is_honoured() {
    // containerd 2.1+ honours CDI names in adjustments, but its CDI cache learns of a spec file
    // from directory events: a name in the reply that wrote the spec failed 2-5 % of grants.
    let node = TestNode::new(Shape::default(), "");
    let yaml = std::fs::read_to_string(&node.config).expect("config");
    let yaml = yaml.replacen("nri:\n", "nri:\n  cdi_injection: cdi\n", 1);
    std::fs::write(&node.config, yaml).expect("config");
    let config = RuntimeConfig {
        runtime_name: "containerd".into(),
        runtime_version: "v2.1.0".into(),
        ..RuntimeConfig::default()
    };
    let (fake, daemon) = start_with(&node, config).await;

    let p = pod("share", &[(KEY, "count=1,family=shared")]);
    fake.add_pod(p.clone());
    let c = container("c-share-0001", &p, "app", &[]);
    fake.create_container(&p, &c).await.expect("create");
    fake.add_container(c.clone());

    let adj = last_adjustment(&fake, "c-share-0001");
    let uid = "ctr-cshare0001";
    assert!(adj.CDI_devices.is_empty(), "{adj:?}");
    let paths: Vec<&str> = adj
        .linux
        .as_ref()
        .map(|l| l.devices.iter().map(|d| d.path.as_str()).collect())
        .unwrap_or_default();
    assert!(paths.contains(&"/dev/nvidia2"), "{paths:?}");
    assert!(
        daemon
            .log_text()
            .contains("nri.cdi_injection: cdi is no longer honoured"),
        "{}",
        daemon.log_text()
    );
    // The shared family's limits travel as env.
    assert!(
        adj.env.iter().any(|kv| kv.value.contains("20000")),
        "{:?}",
        adj.env
    );
    assert_eq!(node.spec_uids(), [uid.to_string()].into());
    let spec = std::fs::read_to_string(node.cdi_dir.join(format!("{SPEC_PREFIX}{uid}.yaml")))
        .expect("spec");
    assert!(spec.contains(&format!("claim-{uid}-0")), "{spec}");

    fake.notify(Event::REMOVE_CONTAINER, &p, Some(&c))
        .await
        .expect("remove");
    assert!(node.spec_uids().is_empty(), "{:?}", node.cdi_entries());
    assert!(status_claims(&node.status_json().await).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_annotation_requests_fail_the_creation_and_write_nothing() {
    let node = TestNode::new(Shape::default(), "");
    let (fake, _daemon) = start_with(&node, RuntimeConfig::default()).await;

    // Two vendors in one pod.
    let p = pod(
        "mixed",
        &[
            (KEY, "count=1,vendor=nvidia"),
            ("accel.nri.io/container.other", "count=1,vendor=amd"),
        ],
    );
    fake.add_pod(p.clone());
    let c = container("c-mixed-0001", &p, "app", &[]);
    let err = fake
        .create_container(&p, &c)
        .await
        .expect_err("mixed vendors");
    let msg = status_message(&err);
    assert!(
        msg.contains("two vendors") && msg.contains("e2e/mixed"),
        "{msg}"
    );

    // More devices than the node has (it has two whole GPUs).
    let p = pod("greedy", &[(KEY, "count=9,family=exclusive")]);
    fake.add_pod(p.clone());
    let c = container("c-greedy-0001", &p, "app", &[]);
    let err = fake.create_container(&p, &c).await.expect_err("too many");
    let msg = status_message(&err);
    assert!(
        msg.contains("container app of pod e2e/greedy") && msg.contains('9'),
        "{msg}"
    );

    // A malformed value.
    let p = pod("typo", &[(KEY, "cuont=1")]);
    fake.add_pod(p.clone());
    let c = container("c-typo-0001", &p, "app", &[]);
    let err = fake.create_container(&p, &c).await.expect_err("malformed");
    assert!(status_message(&err).contains("unknown key"), "{err}");

    // Nothing was written or held, and the daemon still serves.
    assert!(node.cdi_entries().is_empty(), "{:?}", node.cdi_entries());
    let doc = node.status_json().await;
    assert!(status_claims(&doc).is_empty(), "{doc:#}");
    let ok = pod("fine", &[(KEY, "count=2,family=exclusive")]);
    fake.add_pod(ok.clone());
    let c = container("c-fine-0001", &ok, "app", &[]);
    fake.create_container(&ok, &c).await.expect("two GPUs fit");
    assert_eq!(node.spec_uids().len(), 1);
}

fn status_message(e: &FakeError) -> String {
    match e {
        FakeError::Status { message, .. } => message.clone(),
        other => panic!("expected an error status from the plugin, got {other}"),
    }
}

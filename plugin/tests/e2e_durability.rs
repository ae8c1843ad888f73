//! End to end through the `nri-accel` binary (issue 13): a prepared claim asked again for
//! something else, results for another driver and a share id on an exclusive device are
//! refused per claim with nothing written; the read-only commands leave the state and CDI dirs
//! byte-identical with and without a daemon; a CDI dir that is a symbolic link stops the
//! daemon with a message and nothing created.

mod e2e_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use e2e_common::*;
use nri_accel::claims_api::{ClaimAsk, ClaimSpec, ClaimsClient, DraResult, Family};

/// Every file and directory under `dirs`, with its bytes: equal maps are byte-identical trees.
fn snapshot(dirs: &[&Path]) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for root in dirs {
        let mut stack = vec![root.to_path_buf()];
        if !root.exists() {
            out.insert(root.to_path_buf(), b"<missing>".to_vec());
            continue;
        }
        while let Some(d) = stack.pop() {
            out.insert(d.clone(), b"<dir>".to_vec());
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    out.insert(e.path(), std::fs::read(e.path()).unwrap());
                }
            }
        }
    }
    out
}

/// A checksum of the snapshot, for the failure messages.
fn checksum(s: &BTreeMap<PathBuf, Vec<u8>>) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for (p, b) in s {
        h.update(p.as_os_str().as_encoded_bytes());
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    }
    h.finalize()
}

fn named(uid: &str, results: &[(&str, &str, Option<&str>)]) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: "e2e".into(),
        name: uid.into(),
        ask: ClaimAsk::Results(
            results
                .iter()
                .map(|(driver, device, share)| DraResult {
                    request: "gpu".into(),
                    driver: (*driver).into(),
                    pool: device.split('-').next().unwrap().into(),
                    device: (*device).into(),
                    share_id: share.map(str::to_string),
                })
                .collect(),
        ),
        env: Default::default(),
    }
}

async fn refused(client: &ClaimsClient, spec: ClaimSpec) -> String {
    let uid = spec.uid.clone();
    let answer = client.prepare(vec![spec]).await.expect("prepare call");
    match answer.get(&uid) {
        Some(Err(e)) => e.clone(),
        other => panic!("claim {uid} was not refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_asks_and_stray_share_ids_are_refused_per_claim() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let ours = "accel.nri.io";
    prepare_ok(&client, named("idem", &[(ours, "whole-gpu0", None)])).await;
    let dirs = [node.state_dir.as_path(), node.cdi_dir.as_path()];
    let before = snapshot(&dirs);

    let e = refused(&client, named("idem", &[(ours, "whole-gpu1", None)])).await;
    assert!(
        e.contains("idem") && e.contains("whole-gpu0") && e.contains("whole-gpu1"),
        "{e}"
    );
    // The same claim (its namespace and name) asking for something else.
    let changed = ClaimSpec {
        name: "idem".into(),
        ..count_claim("idem", Family::Shared, None)
    };
    let e = refused(&client, changed).await;
    assert!(e.contains("idem") && e.contains("shared"), "{e}");
    // Another claim under the same UID (issue 39, item 5).
    let e = refused(&client, count_claim("idem", Family::Shared, None)).await;
    assert!(
        e.contains("it is held as e2e/idem and this Prepare names it e2e/idem-claim"),
        "{e}"
    );
    let e = refused(&client, named("sid", &[(ours, "whole-gpu1", Some("s-1"))])).await;
    assert!(
        e.contains("sid") && e.contains("whole-gpu1") && e.contains("not shared"),
        "{e}"
    );
    let after = snapshot(&dirs);
    assert_eq!(
        checksum(&before),
        checksum(&after),
        "refusals wrote nothing"
    );
    assert_eq!(before, after);

    // The same ask again is the same grant; a share id on a shared device is taken and echoed.
    let again = prepare_ok(&client, named("idem", &[(ours, "whole-gpu0", None)])).await;
    assert_eq!(again, vec![format!("{CDI_KIND}=claim-idem-0")]);
    let answer = client
        .prepare(vec![named("shr", &[(ours, "shared-gpu2", Some("s-7"))])])
        .await
        .unwrap();
    let devices = answer["shr"].as_ref().expect("prepared");
    assert_eq!(devices[0].share_id.as_deref(), Some("s-7"));

    // After a restart the recorded ask still decides.
    daemon.terminate().await;
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("synchronized again");
    let client = node.client_gate_open().await;
    let e = refused(&client, named("idem", &[(ours, "whole-gpu1", None)])).await;
    assert!(e.contains("whole-gpu0") && e.contains("whole-gpu1"), "{e}");
    prepare_ok(&client, named("idem", &[(ours, "whole-gpu0", None)])).await;
}

/// Runs every read-only command and checks the dirs are unchanged.
async fn read_only_commands_change_nothing(node: &TestNode, what: &str) {
    let dirs = [node.state_dir.as_path(), node.cdi_dir.as_path()];
    let before = snapshot(&dirs);
    for args in [
        vec!["reconcile", "--dry-run"],
        vec!["status"],
        vec!["status", "--json"],
        vec!["discover"],
        vec!["discover", "--json"],
        vec!["check-config"],
    ] {
        let (_st, _out, _err) = node.cli(&args).await;
        let after = snapshot(&dirs);
        assert_eq!(
            checksum(&before),
            checksum(&after),
            "{what}: `nri-accel {}` changed the state or CDI dir",
            args.join(" ")
        );
        assert_eq!(before, after, "{what}: {args:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_leave_the_state_and_cdi_dirs_byte_identical() {
    let node = TestNode::new(Shape::default(), "");
    // Before any daemon ran: nothing exists and nothing may be created.
    read_only_commands_change_nothing(&node, "no state yet").await;
    assert!(!node.state_dir.exists() && !node.cdi_dir.exists());

    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    for uid in ["ro-1", "ro-2"] {
        prepare_ok(&client, count_claim(uid, Family::Exclusive, None)).await;
    }
    // A dead writer's temp file, which a writable listing would remove.
    std::fs::write(
        node.cdi_dir.join(".accel.nri.io-device_ro-9.yaml.1-1.tmp"),
        b"partial",
    )
    .unwrap();
    read_only_commands_change_nothing(&node, "daemon running").await;
    let (st, out, _) = node.cli(&["reconcile", "--dry-run"]).await;
    assert!(
        st.success() && out.contains("prepared (record + spec): 2"),
        "{out}"
    );

    daemon.terminate().await;
    // A torn tail in the log (a crash during a commit) and the boot of the checkpoint: a
    // writable open would cut the tail; the dry run only reports it.
    let wal = node.state_dir.join("checkpoint/wal");
    let mut bytes = std::fs::read(&wal).unwrap();
    bytes.extend_from_slice(&[7, 0, 0, 0, 1, 2]);
    std::fs::write(&wal, &bytes).unwrap();
    read_only_commands_change_nothing(&node, "daemon stopped").await;
    let (st, out, err) = node.cli(&["reconcile", "--dry-run"]).await;
    assert!(st.success(), "{err}");
    assert!(out.contains("would cut 6 bytes"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdi_dir_that_is_a_symlink_stops_the_daemon_with_a_message_and_creates_nothing() {
    let node = TestNode::new(Shape::default(), "");
    let _fake = runtime(&node).await;
    let target = node.dir.path().join("etc");
    std::fs::create_dir(&target).unwrap();
    std::os::unix::fs::symlink(&target, &node.cdi_dir).unwrap();
    let mut daemon = node.spawn(&[]);
    let st = daemon.wait_exit().await;
    assert!(!st.success());
    let log = daemon.log_text();
    assert!(log.contains("is a symbolic link"), "{log}");
    assert!(log.contains(&target.display().to_string()), "{log}");
    assert!(std::fs::read_dir(&target).unwrap().next().is_none());
    assert!(!node.state_dir.exists(), "a refused start creates nothing");
}

/// Issue 39: the CDI dir moved away and a symbolic link put at its path while the daemon runs.
/// Prepares went on succeeding, their specs written through the handle opened at start into the
/// moved dir, with no word anywhere. Now a prepare is refused with a sentence naming the dir and
/// leaves no record and no spec, and /healthz, `status` and a metric say so until the dir is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdi_dir_swapped_while_running_refuses_prepares_and_says_so() {
    let (node, addr) = TestNode::with_metrics(Shape::default());
    let fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    prepare_ok(&client, count_claim("before", Family::Exclusive, None)).await;

    let moved = node.dir.path().join("cdi.moved");
    std::fs::rename(&node.cdi_dir, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &node.cdi_dir).unwrap();
    let cdi = node.cdi_dir.display().to_string();

    let answer = client
        .prepare(vec![count_claim("after", Family::Exclusive, None)])
        .await
        .unwrap();
    let err = answer["after"].as_ref().unwrap_err();
    assert!(err.contains(&cdi), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert!(err.contains("nothing was granted"), "{err}");
    let in_moved: Vec<String> = std::fs::read_dir(&moved)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(in_moved, vec![format!("{SPEC_PREFIX}before.yaml")]);
    assert_eq!(
        list_uids(&client).await,
        ["before".to_string()].into_iter().collect()
    );

    let (_, body) = wait_for("/healthz 503 while the CDI dir is swapped", || async {
        http_get_async(addr, "/healthz")
            .await
            .filter(|(c, _)| *c == 503)
    })
    .await;
    assert!(body.contains(&cdi), "{body}");
    let (_, metrics) = http_get_async(addr, "/metrics").await.expect("metrics");
    assert_eq!(
        sample(&metrics, "nri_accel_cdi_dir_moved"),
        Some(1.0),
        "{metrics}"
    );
    let doc = node.status_json().await;
    assert_eq!(doc["cdi_dir"]["in_place"], false, "{doc}");
    let (_, out, _) = node.cli(&["status"]).await;
    assert!(out.contains("symbolic link"), "{out}");

    // Put back, the node serves again.
    std::fs::remove_file(&node.cdi_dir).unwrap();
    std::fs::rename(&moved, &node.cdi_dir).unwrap();
    wait_for("/healthz 200 with the CDI dir back", || async {
        http_get_async(addr, "/healthz")
            .await
            .filter(|(c, _)| *c == 200)
    })
    .await;
    prepare_ok(&client, count_claim("after", Family::Exclusive, None)).await;
    let (_, metrics) = http_get_async(addr, "/metrics").await.expect("metrics");
    assert_eq!(
        sample(&metrics, "nri_accel_cdi_dir_moved"),
        Some(0.0),
        "{metrics}"
    );
}

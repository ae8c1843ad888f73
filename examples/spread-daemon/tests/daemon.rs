//! The example daemon built from this crate (`nri-accel-spread`), driven end to end as an operator
//! would: its version names the extra policy, check-config accepts a `kind: custom, policy:
//! spread` pool, claims prepared through the claims API and the CLI are answered by the spread
//! policy, status shows them, and a restart restores them from the checkpoint.
//!
//! The harness is the stock binary's (`plugin/tests/e2e_common`): real unix sockets, the fake
//! runtime speaking NRI, the daemon as a child process.

#[path = "../../../plugin/tests/e2e_common/mod.rs"]
mod e2e_common;

use std::collections::BTreeSet;

use e2e_common::*;
use nri_accel::claims_api::{ClaimAsk, ClaimSpec, CountAsk, Family, Selector};
use serde_json::Value;

/// Four GPUs, two per NUMA node (gpu0, gpu1 on node 0; gpu2, gpu3 on node 1), all in one pool of
/// the spread policy: at most one result of a claim per NUMA node.
const NODE: &str = "discovery:
  sysfs: false
  cpus: \"0-15\"
  static_devices:
    - { id: gpu0, vendor: nvidia, model: H100, numa_node: 0, local_cpus: \"0-7\", nodes: [{ path: /dev/nvidia0, major: 195, minor: 0 }] }
    - { id: gpu1, vendor: nvidia, model: H100, numa_node: 0, local_cpus: \"0-7\", nodes: [{ path: /dev/nvidia1, major: 195, minor: 1 }] }
    - { id: gpu2, vendor: nvidia, model: H100, numa_node: 1, local_cpus: \"8-15\", nodes: [{ path: /dev/nvidia2, major: 195, minor: 2 }] }
    - { id: gpu3, vendor: nvidia, model: H100, numa_node: 1, local_cpus: \"8-15\", nodes: [{ path: /dev/nvidia3, major: 195, minor: 3 }] }
pools:
  - name: wide
    family: { kind: custom, policy: spread, params: { max_per_numa: \"1\" } }
";

/// A count claim for `count` units of the spread family.
fn spread_claim(uid: &str, count: u32) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: "e2e".into(),
        name: format!("{uid}-claim"),
        ask: ClaimAsk::Count(vec![CountAsk {
            request: "gpus".into(),
            count,
            family: Family::Custom(spread::NAME.into()),
            selector: Selector::default(),
            profile: None,
            shares: None,
        }]),
        env: Default::default(),
    }
}

/// Device ids held per claim in a status document.
fn holders(doc: &Value) -> Vec<(String, Vec<String>)> {
    doc["claims"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let ids = c["results"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| g["device_id"].as_str().unwrap_or_default().to_string())
                .collect();
            (c["uid"].as_str().unwrap_or_default().to_string(), ids)
        })
        .collect()
}

#[tokio::test]
async fn version_and_check_config_name_the_spread_policy() {
    let (st, out, err) = run_bin(&["--version".to_string()]).await;
    assert!(st.success(), "{err}");
    assert_eq!(
        out.trim(),
        format!(
            "nri-accel {} (extra policies: spread)",
            env!("CARGO_PKG_VERSION")
        )
    );
    let node = TestNode::with_sections(NODE, "");
    let (st, out, err) = node.cli(&["check-config", "--strict"]).await;
    assert!(st.success(), "{out}{err}");
    assert!(
        out.contains("policies in this build: exclusive, shared, sliced, spread"),
        "{out}"
    );
    assert!(err.is_empty(), "no warning expected: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_answered_by_spread_shown_in_status_and_restored_after_a_restart() {
    let node = TestNode::with_sections(NODE, "");
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;

    // Through the claims API: two GPUs, one per NUMA node (exclusive would take gpu0 and gpu1).
    let ids = prepare_ok(&client, spread_claim("c1", 2)).await;
    assert_eq!(
        ids,
        [
            "accel.nri.io/device=claim-c1-0",
            "accel.nri.io/device=claim-c1-1"
        ]
    );
    // Through the CLI, naming the family by the policy's name: the other two.
    let (st, out, err) = node
        .cli(&["prepare", "c2", "--family", "spread", "--count", "2"])
        .await;
    assert!(st.success(), "{out}{err}");
    assert!(
        out.contains("wide wide-gpu1") && out.contains("wide wide-gpu3"),
        "{out}"
    );
    assert!(err.is_empty(), "{err}");
    // Nothing is left to spread over: the policy's own refusal comes back.
    let answer = client
        .prepare(vec![spread_claim("c3", 1)])
        .await
        .expect("prepare call");
    let refusal = answer["c3"].as_ref().expect_err("no device is free");
    assert!(
        refusal.starts_with("claim c3 refused: request gpus cannot be met by the devices free now: gpu0 is held by claim c1"),
        "{refusal}"
    );

    let doc = node.status_json().await;
    let pool = &doc["policy"]["pools"][0];
    assert_eq!(pool["name"], "wide");
    assert_eq!(pool["family"], "spread");
    let before = holders(&doc);
    assert_eq!(
        before,
        [
            (
                "c1".to_string(),
                vec!["gpu0".to_string(), "gpu2".to_string()]
            ),
            (
                "c2".to_string(),
                vec!["gpu1".to_string(), "gpu3".to_string()]
            ),
        ]
    );
    assert_eq!(assert_no_unit_granted_twice(&doc), 4);
    let (st, table, err) = node.cli(&["status"]).await;
    assert!(st.success(), "{err}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("wide ") && l.contains("spread") && l.contains("c1[whole]")),
        "{table}"
    );

    // A clean stop, then a new process restores both claims from the checkpoint.
    assert!(daemon.terminate().await.success());
    let mut restarted = node.spawn(&[]);
    fake.wait_synchronized(2, WAIT)
        .await
        .expect("synchronized again");
    let client = node.client_gate_open().await;
    let doc = node.status_json().await;
    assert_eq!(holders(&doc), before, "{doc:#}");
    assert_eq!(node.spec_uids(), BTreeSet::from(["c1".into(), "c2".into()]));
    assert!(
        restarted.log_text().contains("restored=2"),
        "{}",
        restarted.log_text()
    );
    // The restored policy still decides: a released device is the only one granted again.
    let gone = client
        .unprepare(vec![claim_ref("c1")])
        .await
        .expect("unprepare");
    assert!(gone["c1"].is_ok());
    let ids = prepare_ok(&client, spread_claim("c4", 1)).await;
    assert_eq!(ids, ["accel.nri.io/device=claim-c4-0"]);
    let doc = node.status_json().await;
    let c4 = holders(&doc).into_iter().find(|(uid, _)| uid == "c4");
    assert_eq!(c4, Some(("c4".to_string(), vec!["gpu0".to_string()])));
    assert!(restarted.terminate().await.success());
}

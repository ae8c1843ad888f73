//! Device taints (KEP-5055) and devices held through other doors, through the publisher against
//! the simulated API server: a pool set to taint publishes an unhealthy device with its taint
//! (key, reason, time) and drops the taint once healthy; a server that drops taints gets the
//! device withdrawn and says the gate is missing; a held device leaves the slices and comes back
//! on release.

mod kube_common;

use std::collections::BTreeSet;

use kube_common::*;
use kube_sim::apiserver::{ApiServer, Gates};
use nri_accel::kube::KubeSide;
use nri_accel::kube::slices::HeldElsewhere;
use policies::{UnhealthyDevices, Unit};
use serde_json::Value;

fn tainting(mode: UnhealthyDevices) -> nri_accel::kube::publisher::PublishSource {
    let mut src = source(2);
    for p in &mut src.pools {
        p.unhealthy = mode;
    }
    src
}

fn device(server: &kube_sim::apiserver::ApiServer, name: &str) -> Option<Value> {
    devices(&server.resource_slices())
        .into_iter()
        .find(|d| d["name"] == name)
}

/// Waits until the server's copy of device `name` satisfies `ok` (`None`: not published).
async fn wait_device(
    server: &ApiServer,
    side: &KubeSide,
    what: &str,
    ok: impl Fn(Option<&Value>) -> bool,
) -> Option<Value> {
    tokio::time::timeout(WAIT, async {
        loop {
            let d = device(server, "whole-g0000");
            if ok(d.as_ref()) {
                return d;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: {:?}", side.publisher().status()))
}

#[tokio::test]
async fn an_unhealthy_device_is_tainted_and_the_taint_goes_when_it_recovers() {
    let server = server().await;
    let side = side(client(&server), tainting(UnhealthyDevices::TaintNoExecute));
    published_after(&side, 0).await;
    assert!(
        device(&server, "whole-g0000").unwrap()["taints"].is_null(),
        "healthy: no taint"
    );

    side.set_unhealthy(BTreeSet::from(["g0000".to_string()]));
    let d = wait_device(&server, &side, "the taint", |d| {
        d.is_some_and(|d| !d["taints"].is_null())
    })
    .await
    .unwrap();
    let taints = d["taints"].as_array().unwrap();
    assert_eq!(taints.len(), 1, "{d:#}");
    assert_eq!(taints[0]["key"], "accel.nri.io/unhealthy");
    assert_eq!(taints[0]["value"], "unhealthy");
    assert_eq!(taints[0]["effect"], "NoExecute");
    let added = taints[0]["timeAdded"].clone();
    assert!(added.is_string(), "{d:#}");
    let st = side.publisher().status();
    assert_eq!(st.tainted.len(), 1, "{st:?}");
    assert!(st.withdrawn.is_empty(), "{st:?}");
    assert!(st.missing_gates.is_empty(), "{st:?}");
    // Still one device per name: tainted, not withdrawn.
    assert_eq!(devices(&server.resource_slices()).len(), 14);

    // A second device turns unhealthy: the first one's taint keeps its time.
    side.set_unhealthy(BTreeSet::from(["g0000".to_string(), "g0001".to_string()]));
    tokio::time::timeout(WAIT, side.publisher().wait_for(|s| s.tainted.len() == 2))
        .await
        .expect("the second taint");
    let d = device(&server, "whole-g0000").unwrap();
    assert_eq!(d["taints"][0]["timeAdded"], added);

    side.set_unhealthy(BTreeSet::new());
    let d = wait_device(&server, &side, "the taint gone", |d| {
        d.is_some_and(|d| d["taints"].is_null())
    })
    .await;
    assert!(d.is_some());
    tokio::time::timeout(WAIT, side.publisher().wait_for(|s| s.tainted.is_empty()))
        .await
        .expect("status without taints");
}

#[tokio::test]
async fn a_server_that_drops_taints_gets_the_device_withdrawn() {
    let server = ApiServer::start_with(Gates {
        device_taints: false,
        ..Gates::ALL
    })
    .await
    .unwrap();
    server.add_node(NODE);
    let side = side(client(&server), tainting(UnhealthyDevices::TaintNoSchedule));
    let st = published_after(&side, 0).await;
    // Asked for taints, the server keeps none: the gate is reported missing.
    assert_eq!(st.missing_gates, vec!["DRADeviceTaints"]);
    assert!(st.api_server.is_some_and(|c| !c.taints));

    side.set_unhealthy(BTreeSet::from(["g0000".to_string()]));
    wait_device(&server, &side, "the device withdrawn", |d| d.is_none()).await;
    let st = tokio::time::timeout(WAIT, side.publisher().wait_for(|s| !s.withdrawn.is_empty()))
        .await
        .expect("withdrawn in status");
    let w = serde_json::to_value(&st.withdrawn).unwrap();
    assert_eq!(
        w,
        serde_json::json!([{"reason": "unhealthy", "device": "g0000", "taint_dropped": true}])
    );
    assert!(st.tainted.is_empty());
    assert!(
        devices(&server.resource_slices())
            .iter()
            .all(|d| d["taints"].is_null())
    );
}

#[tokio::test]
async fn a_pool_that_withdraws_reports_no_missing_taint_gate() {
    let server = ApiServer::start_with(Gates {
        device_taints: false,
        ..Gates::ALL
    })
    .await
    .unwrap();
    server.add_node(NODE);
    let side = side(client(&server), source(2));
    let st = published_after(&side, 0).await;
    assert!(st.missing_gates.is_empty(), "{st:?}");
}

#[tokio::test]
async fn a_held_device_leaves_the_slices_and_comes_back_on_release() {
    let server = server().await;
    let side = side(client(&server), source(2));
    published_after(&side, 0).await;
    let hold = |units: &[(&str, &str, Unit)]| -> HeldElsewhere {
        let mut h = HeldElsewhere::new();
        for (dev, claim, unit) in units {
            h.entry(dev.to_string())
                .or_default()
                .insert((claim.to_string(), unit.clone()));
        }
        h
    };
    side.set_held(hold(&[
        ("g0000", "ctr-a", Unit::Whole),
        ("s0", "ctr-b", Unit::Share { index: 0, count: 1 }),
    ]));
    wait_device(&server, &side, "the held device withdrawn", |d| d.is_none()).await;
    let shared = device(&server, "shared-s0").unwrap();
    assert_eq!(shared["capacity"]["shares"]["value"], "3");
    let st = side.publisher().status();
    let w = serde_json::to_value(&st.withdrawn).unwrap();
    assert_eq!(w[0]["reason"], "held-elsewhere", "{w:#}");
    assert_eq!(w[0]["claims"], serde_json::json!(["ctr-a"]));

    side.set_held(HeldElsewhere::new());
    wait_device(&server, &side, "the device back", |d| d.is_some()).await;
    let shared = device(&server, "shared-s0").unwrap();
    assert_eq!(shared["capacity"]["shares"]["value"], "4");
}

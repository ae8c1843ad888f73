//! KEP-5304 device metadata through the DRA driver's kubelet side: the simulated kubelet
//! prepares claims named directly and made from templates; each request gets exactly one
//! `<driver>-metadata.json` with the published attributes (the standard pciBusID included),
//! mounted by the claim's CDI spec (read back with the official CDI crate) at the upstream
//! path, and removed at unprepare. A refused claim leaves no file.

mod kubelet_common;

use std::path::PathBuf;

use kubelet_common::*;
use nri_accel::claims_api::DraResult;
use nri_accel::engine::RequestEnv;
use nri_accel::metadata::DeviceMetadata;

fn result(request: &str, device: &str, share: Option<&str>) -> DraResult {
    DraResult {
        request: request.into(),
        driver: DRIVER.into(),
        pool: POOL.into(),
        device: device.into(),
        share_id: share.map(str::to_string),
    }
}

/// Stores claim `name` with `results` and, for a template's claim, its pod claim name.
fn store(rig: &Rig, uid: &str, name: &str, pod_claim_name: Option<&str>, results: Vec<DraResult>) {
    rig.claims.put(
        "default",
        name,
        StoredClaim {
            uid: uid.into(),
            results: Some(results),
            env: RequestEnv::new(),
            pod_claim_name: pod_claim_name.map(str::to_string),
        },
    );
}

/// Every file under `dir`, relative, sorted.
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in read {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// The mounts of each device of claim `uid`'s spec as the official CDI crate reads the file:
/// (hostPath, containerPath, options).
fn spec_mounts(rig: &Rig, uid: &str) -> Vec<Vec<(String, String, Vec<String>)>> {
    let spec = container_device_interface::spec::read_spec(&rig.spec_path(uid), 10)
        .unwrap_or_else(|e| panic!("the official parser refuses the spec of {uid}: {e:#}"));
    let json = serde_json::to_value(&spec.cdi_spec).unwrap();
    json["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["containerEdits"]["mounts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    (
                        m["hostPath"].as_str().unwrap().to_string(),
                        m["containerPath"].as_str().unwrap().to_string(),
                        m["options"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|o| o.as_str().unwrap().to_string())
                            .collect(),
                    )
                })
                .collect()
        })
        .collect()
}

fn read(path: &std::path::Path) -> DeviceMetadata {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directly_named_claim_gets_one_file_per_request_mounted_by_its_spec() {
    let rig = Rig::with_metadata().await;
    let md = rig.metadata.clone().unwrap();
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    store(
        &rig,
        "uid-1",
        "train",
        None,
        vec![
            result("gpus", "whole-gpu0", None),
            result("gpus", "whole-gpu1", None),
            result("share", "shared-gpu2", Some("share-1")),
        ],
    );
    let c = claim("uid-1", "train");
    let answer = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    assert!(answer["uid-1"].is_ok(), "{answer:?}");

    let file = "accel.nri.io-metadata.json";
    assert_eq!(
        files(&md),
        [
            format!("uid-1/resourceclaims/train/gpus/{file}"),
            format!("uid-1/resourceclaims/train/share/{file}"),
        ],
        "exactly one file per request directory"
    );
    let gpus: PathBuf = md.join(format!("uid-1/resourceclaims/train/gpus/{file}"));
    let doc = read(&gpus);
    assert_eq!(doc.api_version, "metadata.resource.k8s.io/v1alpha1");
    assert_eq!(doc.kind, "DeviceMetadata");
    assert_eq!(
        (
            doc.metadata.name.as_str(),
            doc.metadata.namespace.as_str(),
            doc.metadata.uid.as_str()
        ),
        ("train", "default", "uid-1")
    );
    assert_eq!(doc.pod_claim_name, None);
    assert_eq!(doc.requests.len(), 1);
    assert_eq!(doc.requests[0].name, "gpus");
    let devices = &doc.requests[0].devices;
    assert_eq!(
        devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["whole-gpu0", "whole-gpu1"]
    );
    for d in devices {
        assert_eq!((d.driver.as_str(), d.pool.as_str()), (DRIVER, POOL));
        assert_eq!(
            d.attributes["resource.kubernetes.io/pciBusID"], d.attributes["pciAddress"],
            "{}",
            d.name
        );
    }
    // The fixture's gpu0 sits at 0000:18:00.0.
    assert_eq!(
        devices[0].attributes["resource.kubernetes.io/pciBusID"],
        serde_json::json!({"string": "0000:18:00.0"})
    );

    // The spec mounts each request's file once, on the request's first device, read-only.
    let mounts = spec_mounts(&rig, "uid-1");
    assert_eq!(mounts.len(), 3);
    assert_eq!(
        mounts[0],
        [(
            gpus.to_string_lossy().into_owned(),
            format!(
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/gpus/{file}"
            ),
            ["ro", "nosuid", "nodev", "bind"].map(String::from).to_vec()
        )]
    );
    assert!(mounts[1].is_empty(), "{mounts:?}");
    assert_eq!(
        mounts[2][0].1,
        format!("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/share/{file}")
    );

    // A repeat changes nothing; unprepare removes the files with the spec.
    let again = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    assert_eq!(again["uid-1"], answer["uid-1"]);
    assert_eq!(files(&md).len(), 2);
    assert!(client.unprepare(&[c]).await.unwrap()["uid-1"].is_ok());
    assert!(rig.spec_uids().is_empty());
    assert!(files(&md).is_empty(), "{:?}", files(&md));
    assert!(!md.join("uid-1").exists());
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_claim_goes_under_its_pod_claim_name_and_a_refused_claim_writes_nothing() {
    let rig = Rig::with_metadata().await;
    let md = rig.metadata.clone().unwrap();
    let (_kubelet, _plugin, client) = rig.kubelet().await;
    store(
        &rig,
        "uid-t",
        "pod-a-gpu-x7k2p",
        Some("gpu"),
        vec![result("big/large", "whole-gpu0", None)],
    );
    let c = claim("uid-t", "pod-a-gpu-x7k2p");
    let answer = client.prepare(std::slice::from_ref(&c)).await.unwrap();
    assert!(answer["uid-t"].is_ok(), "{answer:?}");
    let rel = "uid-t/resourceclaimtemplates/gpu/big/accel.nri.io-metadata.json";
    assert_eq!(files(&md), [rel]);
    let doc = read(&md.join(rel));
    assert_eq!(doc.pod_claim_name.as_deref(), Some("gpu"));
    assert_eq!(doc.metadata.name, "pod-a-gpu-x7k2p");
    // The subrequest stays in the document; the directory is the base request's.
    assert_eq!(doc.requests[0].name, "big/large");
    assert_eq!(
        spec_mounts(&rig, "uid-t")[0][0].1,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/big/accel.nri.io-metadata.json"
    );

    // Another claim allocated the same GPU (its unprepare has not come): refused, no file.
    store(
        &rig,
        "uid-late",
        "late",
        None,
        vec![result("r", "whole-gpu0", None)],
    );
    let late = client.prepare(&[claim("uid-late", "late")]).await.unwrap();
    assert!(late["uid-late"].is_err(), "{late:?}");
    assert!(!md.join("uid-late").exists());
    assert_eq!(files(&md), [rel]);

    assert!(client.unprepare(&[c]).await.unwrap()["uid-t"].is_ok());
    assert!(files(&md).is_empty());
    rig.shutdown().await;
}

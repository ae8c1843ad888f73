//! End to end, vendor CDI composition on the kubelet's doors (docs/gpus.md): a DRA claim prepared
//! through kube-sim's kubelet client is answered nri-accel's CDI device and the vendor's, matched
//! by device node (the vendor spec names GPUs by index only); a device plugin with
//! `device_ids: uuid` advertises GPUs by UUID, answers Allocate with both CDI names, and does
//! not offer the device a `vendor_cdi: required` pool's specs do not describe until a spec does.

mod dra_common;
mod e2e_common;

use std::path::Path;

use dra_common::*;
use e2e_common::*;
use kube_sim::kubelet::DevicePluginKubelet;

/// A vendor spec naming the GPUs `gpus` by index (and by UUID with `uuids`), with common edits.
fn spec(gpus: &[usize], uuids: bool) -> String {
    let mut s = String::from("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n");
    for &i in gpus {
        let edits = format!("  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{i}\n");
        s.push_str(&format!("- name: \"{i}\"\n{edits}"));
        if uuids {
            s.push_str(&format!("- name: {}\n{edits}", uuid(i)));
        }
    }
    s.push_str(
        "containerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n  mounts:\n  \
         - {hostPath: /usr/bin/nvidia-smi, containerPath: /usr/bin/nvidia-smi, options: [ro, bind]}\n",
    );
    s
}

fn uuid(i: usize) -> String {
    format!("GPU-{i:08x}-0000-4000-8000-00000000beef")
}

/// Points `cdi.vendor_spec_dirs` at `dir` and sets `vendor_cdi: <mode>` on pool `whole`.
fn compose(config: &Path, dir: &Path, mode: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    let text = text.replacen(
        "cdi:\n",
        &format!("cdi:\n  vendor_spec_dirs: [{}]\n", dir.display()),
        1,
    );
    let text = text.replacen(
        "  - name: whole\n",
        &format!("  - name: whole\n    vendor_cdi: {mode}\n"),
        1,
    );
    std::fs::write(config, text).unwrap();
}

fn write_spec(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_claim_is_answered_the_vendor_device_beside_its_own() {
    let n = DraNode::new().await;
    let vendor = n.node.dir.path().join("vendor-cdi");
    std::fs::create_dir_all(&vendor).unwrap();
    write_spec(&vendor.join("nvidia.yaml"), &spec(&[0, 1, 2, 3], false));
    compose(&n.node.config, &vendor, "auto");
    let _daemon = n.start(&[], 1).await;
    n.published().await;
    let (_kubelet, client) = n.kubelet().await;

    let claim = n.schedule("uid-v1", "v1", "exclusive");
    let answer = client.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let ids = cdi_ids(&answer, "uid-v1");
    let device = devices(&answer, "uid-v1")[0].device_name.clone();
    let index = device.trim_start_matches("whole-gpu");
    assert_eq!(
        ids,
        [
            format!("{CDI_KIND}=claim-uid-v1-0"),
            format!("nvidia.com/gpu={index}")
        ]
    );
    // The kubelet repeats the call: the same answer.
    let again = client.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(cdi_ids(&again, "uid-v1"), ids);
    // A shared pool without vendor_cdi composes nothing.
    let shared = n.schedule("uid-v2", "v2", "shared");
    let answer = client.prepare(std::slice::from_ref(&shared)).await.unwrap();
    assert_eq!(cdi_ids(&answer, "uid-v2").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_uuid_ids_and_an_undescribed_device_not_offered_until_a_spec_describes_it() {
    let mut y = String::from(
        "discovery:\n  sysfs: false\n  cpus: \"0-15\"\n  health_check_secs: 1\n  static_devices:\n",
    );
    for i in 0..2 {
        y.push_str(&format!(
            "    - id: gpu{i}\n      vendor: nvidia\n      uuid: {}\n      \
             nodes:\n        - {{ path: /dev/nvidia{i}, major: 195, minor: {i} }}\n      \
             control_nodes:\n        - {{ path: /dev/nvidiactl, major: 195, minor: 255 }}\n",
            uuid(i)
        ));
    }
    y.push_str("pools:\n  - name: whole\n    family: { kind: exclusive }\n");
    let node = TestNode::with_sections(&y, "");
    let dp_dir = node.dir.path().join("device-plugins");
    let vendor = node.dir.path().join("vendor-cdi");
    std::fs::create_dir_all(&vendor).unwrap();
    write_spec(&vendor.join("nvidia.yaml"), &spec(&[0], true));
    compose(&node.config, &vendor, "required");
    let mut text = std::fs::read_to_string(&node.config).unwrap();
    text.push_str(&format!(
        "device_plugin:\n  enabled: true\n  dir: {}\n  device_ids: uuid\n",
        dp_dir.display()
    ));
    std::fs::write(&node.config, text).unwrap();

    let fake = runtime(&node).await;
    let kubelet = DevicePluginKubelet::start(&dp_dir).unwrap();
    let daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let resource = "accel.nri.io/whole";
    kubelet
        .wait_registered(resource, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log_text()));
    // GPU 1 is described by no spec: listed unhealthy, so the kubelet never hands it out.
    let listed = wait_for("gpu1 listed unhealthy", || async {
        let p = kubelet.plugin(resource)?;
        (p.unhealthy() == [uuid(1).as_str()]).then_some(p)
    })
    .await;
    let ids: Vec<String> = listed.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids, [uuid(0), uuid(1)]);
    let doc = node.status_json().await;
    let why = doc["device_health"]["unhealthy"]["gpu1"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        why.contains("described by no vendor CDI spec in")
            && why.contains(&vendor.display().to_string()),
        "{doc:#}"
    );

    let (ids, answer) = kubelet.admit("train/app", resource, 1).await.unwrap();
    assert_eq!(ids, [uuid(0)]);
    let cdi: Vec<String> = answer.cdi_devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(cdi.len(), 2, "{cdi:?}");
    assert_eq!(cdi[1], format!("nvidia.com/gpu={}", uuid(0)));

    // The vendor's generator runs again and now describes GPU 1: offered without a restart.
    write_spec(&vendor.join("nvidia.yaml"), &spec(&[0, 1], true));
    wait_for("gpu1 healthy again", || async {
        kubelet
            .plugin(resource)
            .filter(|p| p.unhealthy().is_empty())
    })
    .await;
    let (st, text, _) = node.cli(&["status"]).await;
    assert!(st.success());
    assert!(
        text.contains(&uuid(1)) && text.contains("VENDOR DEVICE"),
        "{text}"
    );
}

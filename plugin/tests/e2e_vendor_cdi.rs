//! End to end, vendor CDI composition (docs/gpus.md): a pool with `vendor_cdi` on grants each
//! device with the vendor's own CDI device (an NVIDIA-shaped spec in a temp dir, devices by index,
//! UUID, MIG id and `all`, common edits with control nodes, library mounts, `nvidia-cdi-hook`
//! hooks and env). The claims API names the vendor device beside nri-accel's own; the annotation
//! path merges the vendor edits into its adjustment; a rewritten spec is used by the next grant
//! while a granted claim keeps its answer, across a kill and restart too; two specs that disagree
//! and a `required` pool's undescribed device are refused with one sentence.

mod e2e_common;

use std::path::{Path, PathBuf};

use e2e_common::*;
use fake_runtime::RuntimeConfig;
use nri_accel::claims_api::{ClaimSpec, Family, Selector};

const KEY: &str = "accel.nri.io/container.app";

fn uuid(i: usize) -> String {
    format!("GPU-{i:08x}-5f1c-3b7e-a0d2-0000c0ffee00")
}

/// Two GPUs with UUIDs in pool `whole` (`vendor_cdi: <mode>`), and `cdi.vendor_spec_dirs` of the
/// node's two vendor dirs.
fn vendor_node(mode: &str) -> (TestNode, PathBuf, PathBuf) {
    let mut y = String::from("discovery:\n  sysfs: false\n  cpus: \"0-15\"\n  static_devices:\n");
    for i in 0..2 {
        y.push_str(&format!(
            "    - id: gpu{i}\n      vendor: nvidia\n      model: H100\n      uuid: {}\n      \
             nodes:\n        - {{ path: /dev/nvidia{i}, major: 195, minor: {i} }}\n      \
             control_nodes:\n        - {{ path: /dev/nvidiactl, major: 195, minor: 255 }}\n",
            uuid(i)
        ));
    }
    y.push_str(&format!(
        "pools:\n  - name: whole\n    family: {{ kind: exclusive }}\n    vendor_cdi: {mode}\n"
    ));
    let node = TestNode::with_sections(&y, "");
    let (etc, run) = (
        node.dir.path().join("etc-cdi"),
        node.dir.path().join("run-cdi"),
    );
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    let cfg = std::fs::read_to_string(&node.config).unwrap();
    let cfg = cfg.replacen(
        "cdi:\n",
        &format!(
            "cdi:\n  vendor_spec_dirs: [{}, {}]\n",
            etc.display(),
            run.display()
        ),
        1,
    );
    std::fs::write(&node.config, cfg).unwrap();
    (node, etc, run)
}

/// An NVIDIA-shaped spec for the GPUs `gpus`, named by index and (when `by_uuid`) UUID, with a
/// MIG device of GPU 0 and `all`; `lib` is the driver version in the library names.
fn nvidia_spec(gpus: &[usize], by_uuid: bool, lib: &str) -> String {
    let mut s = String::from("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n");
    for &i in gpus {
        let node = format!("  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{i}\n");
        s.push_str(&format!("- name: \"{i}\"\n{node}"));
        if by_uuid {
            s.push_str(&format!("- name: {}\n{node}", uuid(i)));
        }
    }
    s.push_str(
        "- name: \"0:1\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n    \
         - {path: /dev/nvidia-caps/nvidia-cap12, major: 237, minor: 12}\n\
         - name: MIG-7a3e1f52-1d2b-5c8e-9a01-4b6c8d2e0f13\n  containerEdits:\n    deviceNodes:\n    \
         - path: /dev/nvidia0\n    - {path: /dev/nvidia-caps/nvidia-cap12, major: 237, minor: 12}\n\
         - name: all\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n    - path: /dev/nvidia1\n",
    );
    s.push_str(&format!(
        "containerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n  - NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu\n  \
         deviceNodes:\n  - path: /dev/nvidiactl\n  - {{path: /dev/nvidia-uvm, major: 510, minor: 0}}\n  \
         mounts:\n  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{lib}\n    \
         containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{lib}\n    options: [ro, nosuid, nodev, bind]\n  \
         - hostPath: /usr/bin/nvidia-smi\n    containerPath: /usr/bin/nvidia-smi\n    options: [ro, nosuid, nodev, bind]\n  \
         hooks:\n  - hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n    \
         args: [nvidia-cdi-hook, create-symlinks, --link, libcuda.so.{lib}::/usr/lib/x86_64-linux-gnu/libcuda.so.1]\n  \
         - hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n    \
         args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]\n"
    ));
    s
}

fn claim_on(uid: &str, device: &str) -> ClaimSpec {
    let mut c = count_claim(uid, Family::Exclusive, None);
    if let nri_accel::claims_api::ClaimAsk::Count(asks) = &mut c.ask {
        asks[0].selector = Selector {
            device_ids: vec![device.into()],
            ..Selector::default()
        };
    }
    c
}

/// Writes `text` to `path` the way a generator does: a temp file renamed over it.
fn write_spec(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn refusal(node: &TestNode, spec: ClaimSpec) -> String {
    let uid = spec.uid.clone();
    let client = node.client_gate_open().await;
    let answer = client.prepare(vec![spec]).await.expect("prepare call");
    match answer.get(&uid) {
        Some(Err(e)) => e.clone(),
        other => panic!("claim {uid} was not refused: {other:?}"),
    }
}

/// Checks a spec with the official CDI crate (the oracle the repo's CDI tests use).
fn official_parse(path: &Path) {
    container_device_interface::spec::read_spec(&path.to_path_buf(), 1)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_api_names_the_vendor_device_and_a_granted_claim_keeps_it_across_rewrite_and_restart()
 {
    let (node, _etc, run) = vendor_node("auto");
    let spec_file = run.join("nvidia.yaml");
    write_spec(&spec_file, &nvidia_spec(&[0, 1], true, "550.54.15"));
    official_parse(&spec_file);
    let (fake, mut daemon) = start_with(&node, RuntimeConfig::default()).await;
    let client = node.client_gate_open().await;

    let ids = prepare_ok(&client, claim_on("c-0", "gpu0")).await;
    assert_eq!(
        ids,
        [
            "accel.nri.io/device=claim-c-0-0".to_string(),
            format!("nvidia.com/gpu={}", uuid(0))
        ]
    );
    // nri-accel's own spec records it, and stays valid for the official parser.
    let own = node.cdi_dir.join(format!("{SPEC_PREFIX}c-0.yaml"));
    let text = std::fs::read_to_string(&own).unwrap();
    assert!(
        text.contains(&format!(
            "NRI_ACCEL_VENDOR_CDI_DEVICES=nvidia.com/gpu={}",
            uuid(0)
        )),
        "{text}"
    );
    official_parse(&own);

    // A driver upgrade rewrites the spec: index names only, new library version.
    write_spec(&spec_file, &nvidia_spec(&[0, 1], false, "560.35.03"));
    let ids = prepare_ok(&client, claim_on("c-1", "gpu1")).await;
    assert_eq!(ids[1], "nvidia.com/gpu=1", "{ids:?}");
    // The granted claim answers as before.
    let again = prepare_ok(&client, claim_on("c-0", "gpu0")).await;
    assert_eq!(again[1], format!("nvidia.com/gpu={}", uuid(0)));

    // Killed and restarted: the answers stay.
    daemon.kill9().await;
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(2, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    let again = prepare_ok(&client, claim_on("c-0", "gpu0")).await;
    assert_eq!(again[1], format!("nvidia.com/gpu={}", uuid(0)));
    let again = prepare_ok(&client, claim_on("c-1", "gpu1")).await;
    assert_eq!(again[1], "nvidia.com/gpu=1");
    // Something new after the restart is composed from the spec as it is now.
    client
        .unprepare(vec![claim_ref("c-0")])
        .await
        .expect("unprepare");
    let ids = prepare_ok(&client, claim_on("c-2", "gpu0")).await;
    assert_eq!(ids[1], "nvidia.com/gpu=0", "{ids:?}");

    let doc = node.status_json().await;
    let v = &doc["vendor_cdi"];
    assert_eq!(v["pools"]["whole"], "auto", "{doc:#}");
    assert_eq!(v["mig_entries_skipped"], 2, "{doc:#}");
    assert_eq!(v["devices"][0]["uuid"], uuid(0), "{doc:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotation_path_merges_the_vendor_edits_into_its_adjustment() {
    let (node, etc, _run) = vendor_node("auto");
    write_spec(
        &etc.join("nvidia.json"),
        &yaml_to_json(&nvidia_spec(&[0, 1], true, "550.54.15")),
    );
    let (fake, _daemon) = start_with(&node, RuntimeConfig::default()).await;

    let p = pod("cuda", &[(KEY, "count=1,family=exclusive")]);
    fake.add_pod(p.clone());
    let c = container("c-cuda-0001", &p, "app", &[]);
    fake.create_container(&p, &c).await.expect("create");
    let adj = last_adjustment(&fake, "c-cuda-0001");
    assert!(adj.CDI_devices.is_empty(), "{adj:?}");
    let linux = adj.linux.as_ref().expect("linux");
    let paths: Vec<&str> = linux.devices.iter().map(|d| d.path.as_str()).collect();
    for want in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert_eq!(paths.iter().filter(|p| **p == want).count(), 1, "{paths:?}");
    }
    let uvm = linux
        .devices
        .iter()
        .find(|d| d.path == "/dev/nvidia-uvm")
        .unwrap();
    assert_eq!((uvm.major, uvm.minor), (510, 0));
    let rules = &linux.resources.as_ref().unwrap().devices;
    assert!(
        rules
            .iter()
            .any(|r| r.major.as_ref().map(|m| m.value) == Some(510)),
        "{rules:?}"
    );
    assert!(
        !paths.iter().any(|p| p.starts_with("/dev/nvidia-caps")),
        "{paths:?}"
    );
    let mounts: Vec<&str> = adj.mounts.iter().map(|m| m.destination.as_str()).collect();
    assert!(
        mounts.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
        "{mounts:?}"
    );
    assert!(mounts.contains(&"/usr/bin/nvidia-smi"), "{mounts:?}");
    let lib = adj
        .mounts
        .iter()
        .find(|m| m.destination.ends_with("550.54.15"))
        .unwrap();
    assert_eq!(lib.type_, "bind");
    assert!(lib.options.iter().any(|o| o == "ro"), "{lib:?}");
    let hooks = adj.hooks.as_ref().expect("hooks");
    let args: Vec<&str> = hooks
        .create_container
        .iter()
        .map(|h| h.args[1].as_str())
        .collect();
    assert_eq!(args, ["create-symlinks", "update-ldcache"]);
    let env: Vec<(String, String)> = adj
        .env
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    assert!(
        env.contains(&(
            "NVIDIA_CTK_LIBCUDA_DIR".into(),
            "/usr/lib/x86_64-linux-gnu".into()
        )),
        "{env:?}"
    );
    let recorded = env
        .iter()
        .find(|(k, _)| k == "NRI_ACCEL_VENDOR_CDI_DEVICES");
    assert!(
        recorded.is_some_and(|(_, v)| v.starts_with("nvidia.com/gpu=GPU-")),
        "{env:?}"
    );

    // The spec the annotation path wrote records the vendor device and parses.
    let own: Vec<PathBuf> = std::fs::read_dir(&node.cdi_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(own.len(), 1, "{own:?}");
    official_parse(&own[0]);
    let text = std::fs::read_to_string(&own[0]).unwrap();
    assert!(
        text.contains("NRI_ACCEL_VENDOR_CDI_DEVICES=nvidia.com/gpu=GPU-"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreeing_specs_bad_specs_and_required_pools_refuse_with_one_sentence() {
    let (node, etc, run) = vendor_node("required");
    // Only GPU 0 is described.
    write_spec(
        &run.join("nvidia.yaml"),
        &nvidia_spec(&[0], true, "550.54.15"),
    );
    let (_fake, _daemon) = start_with(&node, RuntimeConfig::default()).await;
    let client = node.client_gate_open().await;

    let e = refusal(&node, claim_on("r-1", "gpu1")).await;
    assert!(
        e.contains("device gpu1 of pool whole is described by no vendor CDI spec in")
            && e.contains(&run.display().to_string())
            && e.contains("vendor_cdi: required")
            && e.contains("nothing was granted"),
        "{e}"
    );
    let ids = prepare_ok(&client, claim_on("r-0", "gpu0")).await;
    assert_eq!(ids[1], format!("nvidia.com/gpu={}", uuid(0)));
    client
        .unprepare(vec![claim_ref("r-0")])
        .await
        .expect("unprepare");

    // A second spec describes GPU 0 under another kind: both files are named.
    let other = etc.join("other.yaml");
    write_spec(
        &other,
        "cdiVersion: 0.5.0\nkind: example.com/gpu\ndevices:\n- name: g0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n",
    );
    let e = refusal(&node, claim_on("r-2", "gpu0")).await;
    assert!(
        e.contains(&other.display().to_string())
            && e.contains(&run.join("nvidia.yaml").display().to_string())
            && e.contains("both describe device gpu0"),
        "{e}"
    );
    // A spec that does not parse: one sentence naming it; nothing held.
    write_spec(
        &other,
        "cdiVersion: 0.5.0\nkind: example.com/gpu\ndevices: [\n",
    );
    let e = refusal(&node, claim_on("r-3", "gpu0")).await;
    assert!(
        e.contains(&other.display().to_string()) && e.contains("cannot be used"),
        "{e}"
    );
    std::fs::remove_file(&other).unwrap();
    let ids = prepare_ok(&client, claim_on("r-4", "gpu0")).await;
    assert_eq!(ids.len(), 2, "{ids:?}");
    let doc = node.status_json().await;
    assert_eq!(status_claims(&doc), ["r-4".to_string()].into(), "{doc:#}");
}

/// The same spec as JSON (CDI reads both).
fn yaml_to_json(yaml: &str) -> String {
    let v: serde_json::Value = serde_saphyr::from_str(yaml).expect("yaml");
    serde_json::to_string_pretty(&v).unwrap()
}

#[tokio::test]
async fn check_config_warns_of_devices_the_vendor_specs_cannot_compose() {
    let (node, etc, run) = vendor_node("required");
    write_spec(
        &run.join("nvidia.yaml"),
        &nvidia_spec(&[0], true, "550.54.15"),
    );
    let (st, out, err) = node.cli(&["check-config", "--strict"]).await;
    assert_eq!(st.code(), Some(3), "{out}{err}");
    let text = out + &err;
    assert!(
        text.contains("pool whole composes grants with vendor CDI specs, and for now: device gpu1 of pool whole is described by no vendor CDI spec in")
            && text.contains(&run.display().to_string()),
        "{text}"
    );
    assert!(!text.contains("device gpu0"), "{text}");
    // A spec that cannot be used is one warning, not one per device.
    write_spec(
        &etc.join("bad.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com\ndevices: []\n",
    );
    let (_, out, err) = node.cli(&["check-config"]).await;
    let text = out + &err;
    assert_eq!(text.matches("bad.yaml cannot be used").count(), 1, "{text}");
    std::fs::remove_file(etc.join("bad.yaml")).unwrap();
    write_spec(
        &run.join("nvidia.yaml"),
        &nvidia_spec(&[0, 1], true, "550.54.15"),
    );
    let (st, out, err) = node.cli(&["check-config", "--strict"]).await;
    assert!(st.success(), "{out}{err}");
}

//! The vendor catalog over fixture spec files in temp dirs: which vendor device describes which
//! inventory device, what is refused, and what the annotation path merges.

use std::path::{Path, PathBuf};

use policies::{Device, DeviceNode, Inventory, NodeKind};

use super::*;

fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        host_path: None,
        kind: NodeKind::Char,
        major,
        minor,
        permissions: "rw".into(),
    }
}

fn nvidia(i: u32, uuid: Option<&str>) -> Device {
    Device {
        id: format!("0000:{:02x}:00.0", 0x18 + i),
        vendor: "nvidia".into(),
        model: String::new(),
        pci_address: Some(format!("0000:{:02x}:00.0", 0x18 + i)),
        pci_id: None,
        numa_node: None,
        local_cpus: Default::default(),
        memory_mib: 0,
        compute_units: 0,
        driver: None,
        nodes: vec![node(&format!("/dev/nvidia{i}"), 195, i)],
        control_nodes: vec![node("/dev/nvidiactl", 195, 255)],
        uuid: uuid.map(str::to_string),
    }
}

fn amd(bdf: &str, render: u32) -> Device {
    Device {
        id: bdf.into(),
        vendor: "amd".into(),
        pci_address: Some(bdf.into()),
        nodes: vec![node(&format!("/dev/dri/renderD{render}"), 226, render)],
        control_nodes: vec![node("/dev/kfd", 240, 0)],
        uuid: None,
        ..nvidia(0, None)
    }
}

const U0: &str = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c";

fn nvidia_spec(common_env: &str) -> String {
    format!(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n\
         - name: \"0\"\n  containerEdits:\n    deviceNodes: [{{path: /dev/nvidia0}}]\n\
         - name: {U0}\n  containerEdits:\n    deviceNodes: [{{path: /dev/nvidia0}}]\n\
         - name: \"0:1\"\n  containerEdits:\n    deviceNodes: [{{path: /dev/nvidia0}}, {{path: /dev/nvidia-caps/nvidia-cap12}}]\n\
         - name: \"1\"\n  containerEdits:\n    deviceNodes: [{{path: /dev/nvidia1}}]\n\
         - name: all\n  containerEdits:\n    deviceNodes: [{{path: /dev/nvidia0}}, {{path: /dev/nvidia1}}]\n\
         containerEdits:\n  env: [{common_env}]\n  deviceNodes: [{{path: /dev/nvidiactl}}, {{path: /dev/nvidia-uvm, major: 510, minor: 0}}]\n  \
         mounts: [{{hostPath: /usr/lib/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1, options: [ro, bind]}}]\n  \
         hooks: [{{hookName: createContainer, path: /usr/bin/nvidia-cdi-hook, args: [nvidia-cdi-hook, update-ldcache]}}]\n"
    )
}

struct Dirs {
    _tmp: tempfile::TempDir,
    etc: PathBuf,
    run: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let (etc, run) = (tmp.path().join("etc"), tmp.path().join("run"));
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    Dirs {
        _tmp: tmp,
        etc,
        run,
    }
}

fn load(d: &Dirs) -> Result<Catalog, String> {
    load_dirs(
        &[d.etc.clone(), d.run.clone()],
        "accel.nri.io/device",
        "accel.nri.io-device_",
    )
    .map_err(|e| e.to_string())
}

fn write(p: &Path, text: &str) {
    std::fs::write(p, text).unwrap();
}

#[test]
fn uuid_named_entries_win_then_nodes_and_mig_and_all_never_describe_a_whole_gpu() {
    let d = dirs();
    write(&d.run.join("nvidia.yaml"), &nvidia_spec("A=1"));
    let c = load(&d).unwrap();
    assert_eq!(c.mig_entries(), 1);
    let m = c.find(&nvidia(0, Some(U0))).unwrap().unwrap();
    assert_eq!(m.name, format!("nvidia.com/gpu={U0}"));
    assert_eq!(m.common.env, [("A".to_string(), "1".to_string())]);
    // Without a UUID known, found by its node: the UUID-named of the entries that match.
    let m = c.find(&nvidia(0, None)).unwrap().unwrap();
    assert_eq!(m.name, format!("nvidia.com/gpu={U0}"));
    let m = c
        .find(&nvidia(1, Some("GPU-ffffffff-06c0-7d70-1a51-e59b25b2c16c")))
        .unwrap();
    assert_eq!(m.unwrap().name, "nvidia.com/gpu=1");
    // A GPU the spec does not name: `all` does not stand for it.
    assert_eq!(c.find(&nvidia(2, None)).unwrap(), None);
}

#[test]
fn amd_devices_match_by_node_or_by_pci_path() {
    let d = dirs();
    write(
        &d.etc.join("amd.json"),
        r#"{"cdiVersion":"0.6.0","kind":"amd.com/gpu","devices":[
        {"name":"gpu0","containerEdits":{"deviceNodes":[{"path":"/dev/dri/renderD128"},{"path":"/dev/kfd"}]}},
        {"name":"gpu1","containerEdits":{"deviceNodes":[{"path":"/dev/dri/by-path/pci-0000:c1:00.0-render"}]}}]}"#,
    );
    let c = load(&d).unwrap();
    let m = c.find(&amd("0000:c0:00.0", 128)).unwrap().unwrap();
    assert_eq!(m.name, "amd.com/gpu=gpu0");
    let m = c.find(&amd("0000:c1:00.0", 129)).unwrap().unwrap();
    assert_eq!(m.name, "amd.com/gpu=gpu1");
    assert_eq!(c.find(&amd("0000:c2:00.0", 130)).unwrap(), None);
}

#[test]
fn two_files_describing_one_gpu_are_refused_naming_both_unless_identical() {
    let d = dirs();
    write(&d.etc.join("nvidia.yaml"), &nvidia_spec("A=1"));
    write(&d.run.join("nvidia.yaml"), &nvidia_spec("A=1"));
    let c = load(&d).unwrap();
    assert!(c.find(&nvidia(0, Some(U0))).unwrap().is_some());
    write(&d.run.join("nvidia.yaml"), &nvidia_spec("A=2"));
    let e = load(&d).unwrap().find(&nvidia(0, Some(U0))).unwrap_err();
    assert!(
        e.contains(&d.etc.join("nvidia.yaml").display().to_string())
            && e.contains(&d.run.join("nvidia.yaml").display().to_string())
            && e.contains("with different edits"),
        "{e}"
    );
    let e = load(&d)
        .unwrap()
        .by_name(&format!("nvidia.com/gpu={U0}"))
        .unwrap_err();
    assert!(e.contains("both define"), "{e}");
}

#[test]
fn own_specs_are_skipped_and_a_bad_file_is_one_sentence() {
    let d = dirs();
    // nri-accel's own files: skipped by name, and by kind under any name.
    write(
        &d.run.join("accel.nri.io-device_u1.yaml"),
        "not even yaml: [",
    );
    write(
        &d.run.join("copied.yaml"),
        "cdiVersion: 0.3.0\nkind: accel.nri.io/device\ndevices:\n- name: claim-u1-0\n  containerEdits:\n    env: [A=1]\n",
    );
    write(&d.run.join("notes.txt"), "ignored");
    let c = load(&d).unwrap();
    assert!(c.specs.is_empty());
    write(
        &d.etc.join("broken.yaml"),
        "cdiVersion: 0.5.0\nkind: x.com/gpu\ndevices: [",
    );
    let e = load(&d).unwrap_err();
    assert!(
        e.contains("broken.yaml") && e.contains("cannot be used"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    // A missing directory holds no spec.
    let gone = load_dirs(&[d.etc.join("nope")], "a.io/b", "a.io-b_").unwrap();
    assert!(gone.specs.is_empty());
}

#[test]
fn a_rewritten_file_changes_the_signature_and_the_live_specs_follow() {
    let d = dirs();
    let f = d.run.join("nvidia.yaml");
    write(&f, &nvidia_spec("A=1"));
    let live = VendorSpecs::new(
        vec![d.etc.clone(), d.run.clone()],
        "accel.nri.io/device".into(),
        "accel.nri.io-device_".into(),
    );
    let first = live.current().unwrap();
    assert!(
        Arc::ptr_eq(&first, &live.current().unwrap()),
        "read again without a change"
    );
    let before = signature(live.dirs(), "accel.nri.io-device_");
    // A generator writes a new file and renames it over the old one (new inode).
    let tmp = d.run.join("nvidia.tmp");
    write(&tmp, &nvidia_spec("A=22"));
    std::fs::rename(&tmp, &f).unwrap();
    assert_ne!(signature(live.dirs(), "accel.nri.io-device_"), before);
    let now = live.current().unwrap();
    let m = now.find(&nvidia(0, Some(U0))).unwrap().unwrap();
    assert_eq!(m.common.env[0].1, "22");
}

#[test]
fn composer_modes_auto_and_required() {
    let d = dirs();
    write(&d.run.join("nvidia.yaml"), &nvidia_spec("A=1"));
    let live = Arc::new(VendorSpecs::new(
        vec![d.run.clone()],
        "accel.nri.io/device".into(),
        "accel.nri.io-device_".into(),
    ));
    let inventory = Inventory {
        devices: vec![nvidia(0, Some(U0)), nvidia(2, None)],
        cpus: Default::default(),
    };
    let mut pools = vec![policies::PoolConfig::of_ids(
        "p",
        &[],
        policies::FamilyConfig::Exclusive,
    )];
    assert!(VendorComposer::new(live.clone(), &inventory, &pools).is_none());
    pools[0].vendor_cdi = VendorCdi::Auto;
    let c = VendorComposer::new(live.clone(), &inventory, &pools).unwrap();
    let gpu2 = inventory.devices[1].id.clone();
    assert_eq!(c.device("p", &gpu2).unwrap(), None);
    assert_eq!(c.device("other", &gpu2).unwrap(), None);
    pools[0].vendor_cdi = VendorCdi::Required;
    let c = VendorComposer::new(live, &inventory, &pools).unwrap();
    let e = c.device("p", &gpu2).unwrap_err();
    assert!(
        e.contains(&format!(
            "device {gpu2} of pool p is described by no vendor CDI spec in {}",
            d.run.display()
        )),
        "{e}"
    );
    assert!(c.device("p", &inventory.devices[0].id).unwrap().is_some());
}

#[test]
fn the_recorded_names_round_trip_through_the_env_value() {
    let names = vec![
        Some("nvidia.com/gpu=0".to_string()),
        None,
        Some("nvidia.com/gpu=GPU-x".into()),
    ];
    let v = env_value(&names).unwrap();
    assert_eq!(v, "nvidia.com/gpu=0,,nvidia.com/gpu=GPU-x");
    assert_eq!(names_from_env(&v, 3), names);
    assert_eq!(env_value(&[None, None]), None);
    assert_eq!(names_from_env("", 2), [None, None]);
}

#[test]
fn merging_takes_common_edits_once_resolves_nodes_and_refuses_what_it_cannot_carry() {
    let d = dirs();
    write(&d.run.join("nvidia.yaml"), &nvidia_spec("A=1"));
    let c = load(&d).unwrap();
    let inventory = Inventory {
        devices: vec![nvidia(0, Some(U0)), nvidia(1, None)],
        cpus: Default::default(),
    };
    let names = [
        format!("nvidia.com/gpu={U0}"),
        "nvidia.com/gpu=1".to_string(),
    ];
    let g = merge_for_container(&c, &names, &inventory, &d.run).unwrap();
    let paths: Vec<(&str, u32, u32)> = g
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.major, n.minor))
        .collect();
    assert_eq!(
        paths,
        [
            ("/dev/nvidiactl", 195, 255),
            ("/dev/nvidia-uvm", 510, 0),
            ("/dev/nvidia0", 195, 0),
            ("/dev/nvidia1", 195, 1)
        ]
    );
    assert_eq!(g.mounts.len(), 1);
    assert_eq!(g.hooks.len(), 1);
    assert_eq!(g.env, [("A".to_string(), "1".to_string())]);

    // A MIG entry's capability node is not on this host (and not a device node here).
    let e =
        merge_for_container(&c, &["nvidia.com/gpu=0:1".into()], &inventory, &d.run).unwrap_err();
    assert!(
        e.contains("/dev/nvidia-caps/nvidia-cap12") && e.contains("nvidia.yaml"),
        "{e}"
    );
    let e = merge_for_container(&c, &["nvidia.com/gpu=9".into()], &inventory, &d.run).unwrap_err();
    assert!(
        e.contains("nvidia.com/gpu=9 is defined by no vendor CDI spec"),
        "{e}"
    );

    write(
        &d.etc.join("nic.json"),
        r#"{"cdiVersion":"1.1.0","kind":"example.com/nic","devices":[{"name":"n0","containerEdits":{"netDevices":[{"hostInterfaceName":"eth1","name":"net1"}]}}]}"#,
    );
    let c = load(&d).unwrap();
    let e =
        merge_for_container(&c, &["example.com/nic=n0".into()], &inventory, &d.run).unwrap_err();
    assert!(e.contains("uses netDevices"), "{e}");
}

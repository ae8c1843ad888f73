//! `check-config` runs the checks `run` runs, short of connecting: the policies the build has,
//! the pools against the node's inventory (from the config or `--sysfs-root`), and warnings for a
//! config that serves nothing, which `--strict` turns into a failure and which the daemon logs
//! at start in the same words.

mod e2e_common;

use e2e_common::*;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sysfs/dgx-8xh100"
);

/// Two NVIDIA H100s and no CPU pinning, as static devices.
const TWO_GPUS: &str = "discovery:
  sysfs: false
  cpus: \"0-15\"
  static_devices:
    - { id: gpu0, vendor: nvidia, model: H100, numa_node: 0, nodes: [{ path: /dev/nvidia0, major: 195, minor: 0 }] }
    - { id: gpu1, vendor: nvidia, model: H100, numa_node: 1, nodes: [{ path: /dev/nvidia1, major: 195, minor: 1 }] }
";

fn node_with_pools(pools: &str) -> TestNode {
    TestNode::with_sections(&format!("{TWO_GPUS}pools:\n{pools}"), "")
}

/// Exit code of `check-config --strict` on warnings.
const STRICT_WARNINGS: i32 = 3;

#[tokio::test]
async fn the_stock_binary_refuses_a_custom_policy_it_does_not_have_and_lists_its_own() {
    let node = node_with_pools(
        "  - name: wide\n    family: { kind: custom, policy: spread, params: { max_per_numa: \"1\" } }\n",
    );
    let (st, out, err) = node.cli(&["check-config"]).await;
    assert_eq!(st.code(), Some(1), "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.trim(),
        format!(
            "{}: pool wide: no policy is registered under the name spread; this build registers \
             exclusive, shared, sliced: use one of those, or run a daemon built with spread \
             (docs/policy-guide.md); fix the pools in the config",
            node.config.display()
        )
    );
    // `run` refuses it with the same sentence, before touching anything.
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    let st = daemon.wait_exit().await;
    assert!(!st.success());
    assert!(
        daemon
            .log_text()
            .contains("pool wide: no policy is registered under the name spread; this build registers exclusive, shared, sliced"),
        "{}",
        daemon.log_text()
    );
    assert!(fake.plugin().is_none(), "run must stop before connecting");
}

#[tokio::test]
async fn a_pool_that_selects_nothing_is_a_warning_and_strict_fails_on_it() {
    let node = node_with_pools(
        "  - name: gpus\n    select: { vendor: nvidia }\n    family: { kind: exclusive }\n\
         \x20 - name: amd\n    select: { vendor: amd }\n    family: { kind: exclusive }\n",
    );
    let (st, out, err) = node.cli(&["check-config"]).await;
    assert!(st.success(), "{out}{err}");
    assert!(out.contains(": ok (2 pool(s), 2 device(s) found"), "{out}");
    assert!(
        out.contains("policies in this build: exclusive, shared, sliced"),
        "{out}"
    );
    assert_eq!(
        err.trim(),
        "warning: pool amd selects none of this node's 2 device(s): claims for it will be \
         refused; compare its select with nri-accel discover"
    );
    let (st, _, err) = node.cli(&["check-config", "--strict"]).await;
    assert_eq!(st.code(), Some(STRICT_WARNINGS), "{err}");
    assert!(
        err.contains("1 warning(s) and --strict: not accepted"),
        "{err}"
    );
}

#[tokio::test]
async fn a_pool_behind_an_empty_select_can_never_get_a_device() {
    let node = node_with_pools(
        "  - name: all\n    select: {}\n    family: { kind: exclusive }\n\
         \x20 - name: shared\n    select: { vendor: nvidia }\n    family: { kind: shared, replicas: 4 }\n",
    );
    let (st, out, err) = node.cli(&["check-config"]).await;
    assert!(st.success(), "{out}{err}");
    assert_eq!(
        err.trim(),
        "warning: pool shared can never get a device: the earlier pool all selects every device \
         shared could (a device goes to the first pool that selects it); move shared before all \
         or narrow the select of all"
    );
}

#[tokio::test]
async fn a_pool_whose_devices_an_earlier_pool_takes_is_shadowed_and_the_daemon_says_so_too() {
    // Neither select covers the other in general, but on this node `nvidia` takes both H100s.
    let node = node_with_pools(
        "  - name: nvidia\n    select: { vendor: nvidia }\n    family: { kind: exclusive }\n\
         \x20 - name: h100\n    select: { model: H100 }\n    family: { kind: shared, replicas: 2 }\n",
    );
    let (st, out, err) = node.cli(&["check-config", "--strict"]).await;
    assert_eq!(st.code(), Some(STRICT_WARNINGS), "{out}{err}");
    let warning = "pool h100 gets no device: the devices it selects (gpu0, gpu1) go to the \
                   earlier pool nvidia first; move h100 up or narrow the earlier select";
    assert!(err.contains(&format!("warning: {warning}")), "{err}");

    // The daemon logs the same warning at start, and starts.
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    let log = daemon.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(warning)),
        "{log}"
    );
    let st = daemon.terminate().await;
    assert!(st.success(), "{st}:\n{}", daemon.log_text());
}

#[tokio::test]
async fn an_empty_inventory_is_a_warning_from_the_config_and_from_a_sysfs_root() {
    let node = TestNode::with_sections("discovery:\n  sysfs: false\n  cpus: \"0-3\"\n", "");
    let (st, out, err) = node.cli(&["check-config"]).await;
    assert!(st.success(), "{out}{err}");
    assert!(out.contains("0 device(s) found"), "{out}");
    assert_eq!(
        err.trim(),
        "warning: discovery.sysfs is off and discovery.static_devices lists no device: nothing \
         can be handed out; turn discovery.sysfs on or list the devices"
    );
    // A host root with a sysfs but no accelerator.
    let root = tempfile::tempdir().expect("root");
    std::fs::create_dir_all(root.path().join("sys/bus/pci/devices")).expect("sysfs");
    let (st, _, err) = node
        .cli(&[
            "check-config",
            "--strict",
            "--sysfs-root",
            root.path().to_str().expect("utf-8"),
        ])
        .await;
    assert_eq!(st.code(), Some(STRICT_WARNINGS), "{err}");
    assert!(
        err.contains(&format!(
            "warning: no accelerator was found under {} and discovery.static_devices lists none",
            root.path().display()
        )),
        "{err}"
    );
    assert!(
        err.contains("check that the devices' drivers are loaded"),
        "{err}"
    );
    // discover prints the same warning: it must not send the user to run discover.
    let (_, _, err) = node
        .cli(&[
            "discover",
            "--sysfs-root",
            root.path().to_str().expect("utf-8"),
        ])
        .await;
    assert!(err.contains("no accelerator was found under"), "{err}");
    assert!(!err.contains("nri-accel discover"), "{err}");
}

#[tokio::test]
async fn sysfs_root_checks_the_pools_against_a_fixture_tree_and_names_the_flag_on_errors() {
    let node = TestNode::with_sections(
        "pools:\n  - name: h100\n    select: { vendor: nvidia }\n    \
         family: { kind: exclusive }\n",
        "",
    );
    let (st, out, err) = node
        .cli(&["check-config", "--strict", "--sysfs-root", FIXTURE])
        .await;
    assert!(st.success(), "{out}{err}");
    assert!(out.contains("8 device(s) found"), "{out}");

    let empty = tempfile::tempdir().expect("dir");
    let root = empty.path().to_str().expect("utf-8");
    for cmd in ["check-config", "discover"] {
        let (st, _, err) = node.cli(&[cmd, "--sysfs-root", root]).await;
        assert!(!st.success(), "{cmd}");
        assert!(
            err.contains(&format!(
                "--sysfs-root {root}: {root}/sys is not a readable directory; point --sysfs-root at"
            )),
            "{cmd}: {err}"
        );
        assert!(!err.contains("discovery.root"), "{cmd}: {err}");
    }
}

/// One device under two ids (issue 39, item 2): two static entries sharing a device node are
/// refused by `check-config` and by `run` with the same sentence; a static entry that is a device
/// sysfs finds under another id keeps the device once, under the static id, with a warning
/// `--strict` fails on.
#[tokio::test]
async fn one_device_under_two_ids_is_refused_or_kept_once_with_a_warning() {
    let node = TestNode::with_sections(
        "discovery:\n  sysfs: false\n  cpus: \"0-15\"\n  static_devices:\n    \
         - { id: gpu0, vendor: nvidia, nodes: [{ path: /dev/nvidia0, major: 195, minor: 0 }] }\n    \
         - { id: alias, vendor: nvidia, nodes: [{ path: /dev/nvidia-alias, major: 195, minor: 0 }] }\n",
        "",
    );
    let sentence = "discovery.static_devices[1].nodes[0]: device \"alias\" has device node c 195:0 \
                    (/dev/nvidia-alias), which device \"gpu0\" (discovery.static_devices[0]) has too: \
                    one device under two ids would be granted twice; list each device once";
    let (st, out, err) = node.cli(&["check-config"]).await;
    assert_eq!(st.code(), Some(1), "{out}{err}");
    assert!(err.contains(sentence), "{err}");
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    assert!(!daemon.wait_exit().await.success());
    assert!(
        daemon.log_text().contains(sentence),
        "{}",
        daemon.log_text()
    );
    assert!(fake.plugin().is_none(), "run must stop before connecting");

    // The first H100 of the fixture is 0000:18:00.0 with /dev/nvidia0.
    let twin = TestNode::with_sections(
        "discovery:\n  static_devices:\n    \
         - { id: gpu0, vendor: nvidia, pci_address: \"0000:18:00.0\", nodes: [{ path: /dev/nvidia0, major: 195, minor: 0 }] }\n",
        "",
    );
    let (st, out, err) = twin.cli(&["check-config", "--sysfs-root", FIXTURE]).await;
    assert!(st.success(), "{out}{err}");
    assert!(
        out.contains("8 device(s) found"),
        "seven found and gpu0: {out}"
    );
    assert!(
        err.contains(
            "device 0000:18:00.0: found by discovery with PCI address 0000:18:00.0, which static \
             device gpu0 (discovery.static_devices[0]) has too: one device under two ids, so only \
             the static entry is kept"
        ),
        "{err}"
    );
    let (st, _, err) = twin
        .cli(&["check-config", "--strict", "--sysfs-root", FIXTURE])
        .await;
    assert_eq!(st.code(), Some(STRICT_WARNINGS), "{err}");
}

#[tokio::test]
async fn a_value_of_the_wrong_type_names_its_field_and_what_is_expected() {
    let dir = tempfile::tempdir().expect("dir");
    let cases = [
        (
            "claims_api:\n  max_message_bytes: lots\n",
            "2:22: claims_api.max_message_bytes: expected a whole number from 4096 to 67108864",
        ),
        (
            "pools:\n- name: s\n  family:\n    kind: shared\n    replicas: many\n",
            "5:5: pools[0].family.replicas: expected a whole number from 1 to 4294967295",
        ),
        (
            "discovery:\n  cpus: \"0-3,x\"\n",
            "2:9: discovery.cpus: invalid CPU list \"0-3,x\": not a number; write CPU ids in the \
             kernel's list format, e.g. \"0-3,8,10-11\"",
        ),
        (
            "metrics:\n  listen: localhost\n",
            "2:11: metrics.listen: expected an address and port such as 127.0.0.1:9464",
        ),
    ];
    for (i, (text, wanted)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("c{i}.yaml"));
        std::fs::write(&path, text).expect("write");
        let (st, _, err) = run_bin(&["check-config".to_string(), path.display().to_string()]).await;
        assert_eq!(st.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("{}:{wanted}", path.display())),
            "{err}"
        );
    }
}

#[tokio::test]
async fn the_shipped_binary_has_no_demo_and_says_where_it_is() {
    // The demo runs on simulators the shipped binary does not link (tests/demo has it, and
    // tests/demo/tests/demo.rs checks its refusal of --config).
    let node = node_with_pools("  - name: all\n    family: { kind: exclusive }\n");
    let (st, out, err) = node.cli(&["demo"]).await;
    assert_eq!(st.code(), Some(2), "{out}{err}");
    assert!(err.contains("this build has no demo"), "{err}");
    assert!(err.contains("cargo run --release -- demo"), "{err}");
    assert!(out.is_empty(), "{out}");
    let (st, out, err) = run_bin(&["--help".to_string()]).await;
    assert!(st.success(), "{out}{err}");
    assert!(!out.contains("  demo "), "{out}");
    // With --config before the subcommand too, the answer is the same.
    let (st, _, err) = run_bin(&["--config".into(), "/x.yaml".into(), "demo".into()]).await;
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(err.contains("this build has no demo"), "{err}");
    let (_, help, _) = run_bin(&["run".into(), "--help".into()]).await;
    assert!(help.contains("--config"), "{help}");
}

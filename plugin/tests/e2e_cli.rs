//! End to end, the command line: `check-config` on the shipped and a broken config,
//! `discover` on a fixture tree, `--version`, and `status`, `prepare`, `unprepare` and
//! `reconcile --dry-run` against a running daemon on the DGX fixture tree.

mod e2e_common;

use e2e_common::*;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sysfs/dgx-8xh100"
);
const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/config.yaml");

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn check_config_accepts_the_shipped_file_and_points_at_errors() {
    let (st, out, err) = run_bin(&args(&["check-config", SHIPPED])).await;
    assert!(st.success(), "{out}{err}");
    assert!(out.contains("ok"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "state_dir: /var/lib/nri-accel\nnri:\n  plugin_nmae: x\n",
    )
    .unwrap();
    let (st, out, err) = run_bin(&args(&["check-config", bad.to_str().unwrap()])).await;
    assert!(!st.success());
    let text = format!("{out}{err}");
    assert!(
        text.contains(&format!("{}:3:3:", bad.display())),
        "file:line:col expected: {text}"
    );
    assert!(text.contains("plugin_nmae"), "{text}");

    let wrong = dir.path().join("wrong.yaml");
    std::fs::write(&wrong, "pools:\n  - name: a\n    family: { kind: exclusive }\n  - name: a\n    family: { kind: exclusive }\n").unwrap();
    let (st, out, err) = run_bin(&args(&["check-config", wrong.to_str().unwrap()])).await;
    assert!(!st.success());
    let text = format!("{out}{err}");
    assert!(text.contains(&format!("{}:", wrong.display())), "{text}");
    assert!(text.contains("used twice"), "{text}");

    // A missing file: the path and the cause, each said once.
    let missing = dir.path().join("missing.yaml");
    let (st, _, err) = run_bin(&args(&["status", "--config", missing.to_str().unwrap()])).await;
    assert!(!st.success());
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
    assert_eq!(err.matches("no such config file").count(), 1, "{err}");
}

/// One rule for a missing config file, the same for every subcommand that reads one: a file
/// named that is not there is an error naming it; the default path missing means the built-in
/// defaults, and the command says so once (`check-config` in its answer).
#[tokio::test]
async fn every_subcommand_follows_one_rule_for_a_missing_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let missing = missing.to_str().unwrap();
    let said = format!("{missing}: no such config file; name a file that exists");
    let commands: [&[&str]; 9] = [
        &["run"],
        &["webhook", "--listen", "127.0.0.1:0"],
        &["check-config"],
        &["discover"],
        &["cleanup"],
        &["reconcile", "--dry-run"],
        &["status"],
        &["prepare", "c1"],
        &["unprepare", "c1"],
    ];
    for command in commands {
        let mut a = args(command);
        a.extend(args(&["--config", missing]));
        let (st, out, err) = run_bin(&a).await;
        assert!(!st.success(), "{command:?} ran without its config: {out}");
        assert_eq!(err.matches(&said).count(), 1, "{command:?}: {err}");
    }
    let (st, _, err) = run_bin(&args(&["check-config", missing])).await;
    assert_eq!(st.code(), Some(1), "{err}");
    assert_eq!(err.matches(&said).count(), 1, "{err}");

    // The default path: the built-in defaults where no file is there (CI's machines), the file
    // where the package installed one.
    let default = std::path::Path::new("/etc/nri-accel/config.yaml");
    let absent = !default.exists();
    let note = "nri-accel: /etc/nri-accel/config.yaml does not exist: using the built-in defaults";
    let (st, out, err) = run_bin(&args(&["check-config"])).await;
    if absent {
        assert!(st.success(), "{out}{err}");
        assert!(
            out.starts_with(
                "the built-in defaults (/etc/nri-accel/config.yaml does not exist): ok ("
            ),
            "{out}"
        );
    } else {
        assert!(!out.contains("built-in defaults"), "{out}");
    }
    let commands: [&[&str]; 3] = [&["discover"], &["reconcile", "--dry-run"], &["cleanup"]];
    for command in commands {
        let (_, _, err) = run_bin(&args(command)).await;
        let expected = usize::from(absent);
        assert_eq!(err.matches(note).count(), expected, "{command:?}: {err}");
    }
}

#[tokio::test]
async fn discover_lists_the_eight_gpus_of_the_fixture() {
    let (st, out, err) = run_bin(&args(&["discover", "--sysfs-root", FIXTURE, "--json"])).await;
    assert!(st.success(), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    let devices = doc["inventory"]["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 8, "{out}");
    assert!(devices.iter().all(|d| d["vendor"] == "nvidia"));
    let (st, table, _) = run_bin(&args(&["discover", "--sysfs-root", FIXTURE])).await;
    assert!(st.success());
    let gpus = table.lines().filter(|l| l.contains("/dev/nvidia")).count();
    assert_eq!(gpus, 8, "{table}");
}

#[tokio::test]
async fn version_names_the_package_version() {
    let (st, out, _) = run_bin(&args(&["--version"])).await;
    assert!(st.success());
    assert_eq!(
        out.trim(),
        format!("nri-accel {}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prepare_unprepare_against_a_daemon_on_the_fixture_tree() {
    let node = TestNode::with_sections(
        &format!(
            "discovery:\n  root: {FIXTURE}\npools:\n  - name: h100\n    select: {{ vendor: nvidia }}\n    \
             family: {{ kind: exclusive }}\n    cpus_per_device: 4\n"
        ),
        "",
    );
    // Without a daemon, status says what to do, once.
    let (st, _, err) = node.cli(&["status"]).await;
    assert!(!st.success());
    assert_eq!(err.matches("start nri-accel").count(), 1, "{err}");

    let fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;

    let (st, out, err) = node
        .cli(&[
            "prepare",
            "cli-1",
            "--family",
            "exclusive",
            "--vendor",
            "nvidia",
        ])
        .await;
    assert!(st.success(), "{out}{err}");
    assert!(out.contains("accel.nri.io/device=claim-cli-1-0"), "{out}");
    let spec = std::fs::read_to_string(node.cdi_dir.join(format!("{SPEC_PREFIX}cli-1.yaml")))
        .expect("spec");
    for node_path in ["/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert!(spec.contains(node_path), "{spec}");
    }

    let (st, table, err) = node.cli(&["status"]).await;
    assert!(st.success(), "{err}");
    assert!(table.contains("gate: open"), "{table}");
    assert!(table.contains("cli-1"), "{table}");
    assert_eq!(
        table.lines().filter(|l| l.starts_with("h100 ")).count(),
        8,
        "{table}"
    );
    assert!(table.contains("1/1"), "one device is used: {table}");

    let (st, out, err) = node.cli(&["reconcile", "--dry-run"]).await;
    assert!(st.success(), "{err}");
    assert!(out.contains("nothing to do"), "{out}");

    let (st, out, err) = node.cli(&["unprepare", "cli-1"]).await;
    assert!(st.success(), "{out}{err}");
    assert!(node.spec_uids().is_empty());
    let (_, table, _) = node.cli(&["status"]).await;
    assert!(table.contains("(no claims)"), "{table}");

    // A refused prepare exits non-zero with the reason.
    let (st, out, err) = node
        .cli(&["prepare", "cli-2", "--count", "9", "--family", "exclusive"])
        .await;
    assert!(!st.success(), "{out}");
    assert!(format!("{out}{err}").contains("cli-2"), "{out}{err}");
}

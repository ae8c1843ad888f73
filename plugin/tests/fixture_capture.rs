//! The fixture capture script (plugin/tests/fixtures/sysfs/capture.sh, docs/gpus.md "A fixture
//! from a real machine") run without a GPU: against copies of the fixture trees standing in for
//! a host's root. What it writes must reproduce the inventory discovery finds on that root, keep
//! file modes, and list device nodes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_nri-accel");

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs")
}

/// Copies fixture `name` into `dst` (symlinks kept) and adds stand-in device nodes.
fn host_like(name: &str, dst: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(fixtures().join(name))
        .arg(dst)
        .status()
        .unwrap();
    assert!(st.success());
    let dev = dst.join("dev");
    std::fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
    for (n, mode) in [
        ("nvidia0", 0o666),
        ("nvidiactl", 0o666),
        ("nvidia-caps/nvidia-cap1", 0o400),
    ] {
        let p = dev.join(n);
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

fn capture(root: &Path, out: &Path) -> std::process::Output {
    Command::new("bash")
        .arg(fixtures().join("capture.sh"))
        .arg(out)
        .arg("--root")
        .arg(root)
        .arg("--bin")
        .arg(BIN)
        .env("NRI_ACCEL_LOG", "error")
        .output()
        .unwrap()
}

fn inventory(p: &Path) -> serde_json::Value {
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    doc["inventory"].clone()
}

#[test]
fn a_captured_fixture_reproduces_the_hosts_inventory() {
    for name in ["dgx-8xh100", "mi300x-8", "accel-gaudi", "workstation-mixed"] {
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host");
        host_like(name, &host);
        let out = tmp.path().join("out");
        let run = capture(&host, &out);
        assert!(
            run.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        let found = inventory(&out.join("discover-host.json"));
        assert!(
            found["devices"].as_array().is_some_and(|d| !d.is_empty()),
            "{name}: {found:#}"
        );
        assert_eq!(
            found,
            inventory(&out.join("discover-fixture.json")),
            "{name}"
        );

        // Discovery on the fixture alone (the script's copy) finds what it found on the host.
        let again = Command::new(BIN)
            .args(["discover", "--json", "--sysfs-root"])
            .arg(out.join("root"))
            .env("NRI_ACCEL_LOG", "error")
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
        assert_eq!(doc["inventory"], found, "{name}");

        // Device nodes are listed and stood in for with their modes.
        let nodes = std::fs::read_to_string(out.join("dev-nodes.txt")).unwrap();
        assert!(
            nodes.contains("/dev/nvidia-caps/nvidia-cap1 file - 400"),
            "{nodes}"
        );
        let mode = std::fs::metadata(out.join("root/dev/nvidia-caps/nvidia-cap1"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
        // Only the real host's vendor tools are asked; a fixture root has none.
        assert!(!out.join("cdi").exists(), "{name}");
    }
}

#[test]
fn an_inventory_the_fixture_does_not_reproduce_fails_the_script() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    host_like("dgx-8xh100", &host);
    // A stand-in for nri-accel whose discovery finds a device on the host and none on the
    // fixture: what a file the script failed to copy would do.
    let fake = tmp.path().join("fake-nri-accel");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ncase \"$*\" in *{}*) echo '{{\"inventory\":{{\"devices\":[1]}}}}' ;; *) echo '{{\"inventory\":{{\"devices\":[]}}}}' ;; esac\n",
            tmp.path().join("out").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tmp.path().join("out");
    let run = Command::new("bash")
        .arg(fixtures().join("capture.sh"))
        .arg(&out)
        .arg("--root")
        .arg(&host)
        .arg("--bin")
        .arg(&fake)
        .output()
        .unwrap();
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("does not reproduce this machine's inventory"),
        "{err}"
    );
    assert!(out.join("inventory.diff").exists());
}

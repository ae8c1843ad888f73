//! `nri-accel demo` runs the whole path from a fresh state and exits 0.

use std::process::Command;

#[test]
fn demo_completes_and_shows_cdi_ids_and_an_adjustment() {
    let out = Command::new(env!("CARGO_BIN_EXE_nri-accel"))
        .arg("demo")
        .env_remove("RUST_LOG")
        .output()
        .expect("run nri-accel demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("-> CDI accel.nri.io/device=claim-"),
        "{stdout}"
    );
    assert!(stdout.contains("adjustment cpuset"), "{stdout}");
    assert!(
        stdout.contains("adjustment device node: /dev/nvidia"),
        "{stdout}"
    );
    assert!(stdout.contains("refused, as it must be"), "{stdout}");
    assert!(
        stdout.contains(
            "GetPreferredAllocation picked gpu1; Allocate answered accel.nri.io/device=claim-dp-"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("is still held by container c-serve-"),
        "{stdout}"
    );
    assert!(
        stdout.contains("rolled back (record without spec): claim-crash"),
        "{stdout}"
    );
    assert!(stdout.contains("demo complete"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

//! The demo build's `demo` (what `cargo run --release -- demo` runs) goes the whole path from a
//! fresh state and exits 0: the claims API, the annotation path and the Kubernetes DRA path
//! (slices, scheduler, kubelet); it explains each step in words, without Rust Debug forms.

use std::process::Command;

/// The demo build of the nri-accel command line.
const DEMO: &str = env!("CARGO_BIN_EXE_nri-accel-demo");

/// Text that only a Rust Debug form puts in a message (as plugin/tests/e2e_messages.rs checks
/// for the shipped binary's messages).
const DEBUG_FORMS: [&str; 5] = ["Some(", "Ok(", "Err(", "{ ", "special_fields"];

#[test]
fn demo_completes_and_shows_cdi_ids_and_an_adjustment_on_both_paths() {
    let out = Command::new(DEMO)
        .arg("demo")
        .env_remove("RUST_LOG")
        .env_remove("NRI_ACCEL_CONFIG")
        .output()
        .expect("run the demo");
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
    // The Kubernetes DRA path: slices published, a claim scheduled from them, prepared over the
    // kubelet's socket, its container given CPUs.
    let dra = stdout
        .split("── 2.")
        .nth(1)
        .and_then(|s| s.split("── 3.").next())
        .expect("the DRA step");
    assert!(dra.contains("published to the API server: "), "{dra}");
    assert!(
        dra.contains("the scheduler allocated ResourceClaim default/train-gpu: device whole-gpu"),
        "{dra}"
    );
    assert!(
        dra.contains(
            "kubelet NodePrepareResources over the DRA socket -> CDI accel.nri.io/device=claim-uid-k8s-train-0"
        ),
        "{dra}"
    );
    assert!(dra.contains("adjustment cpuset: cpus "), "{dra}");
    assert!(dra.contains("NodeUnprepareResources: released"), "{dra}");
    assert!(stdout.contains("demo complete"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let words = format!("{stdout}{stderr}");
    let debug: Vec<&str> = words
        .lines()
        .filter(|l| DEBUG_FORMS.iter().any(|f| l.contains(f)))
        .collect();
    assert!(
        debug.is_empty(),
        "Debug forms in the demo's text:\n{}",
        debug.join("\n")
    );
}

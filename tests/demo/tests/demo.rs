//! The demo build's `demo` (what `cargo run --release -- demo` runs) goes the whole path from a
//! fresh state and exits 0: the claims API, the annotation path and the Kubernetes DRA path
//! (slices, scheduler, kubelet); it explains each step in words, without Rust Debug forms, tells
//! its story on stdout with no stray log line, and the glossary it points to explains its words.

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

    // The refusals and the crash the story causes on purpose are told by the story, not repeated
    // as warnings; any other log line (a stalled shutdown's, say) would show as `log:`.
    assert!(stderr.trim().is_empty(), "{stderr}");
    assert!(!stdout.contains("   log: "), "{stdout}");

    // Step 4 explains the cpuset and shows the container it moved off the claim's CPUs.
    let four = section(&stdout, 4);
    assert!(
        four.contains("adjustment cpuset: cpus 0-1 mems 0"),
        "{four}"
    );
    assert!(four.contains("claim-whole took CPUs 0-1"), "{four}");
    assert!(
        four.contains("container update in the same reply: c-web-0000000000000001 -> cpus 2-15"),
        "{four}"
    );
    assert!(four.contains("shared CPUs now: 2-15"), "{four}");

    // Status: a device held through another door is not offered, not broken.
    let status = section(&stdout, 7);
    assert!(
        status.contains("not offered gpu0: claim claim-whole holds it"),
        "{status}"
    );
    assert!(
        !status.to_lowercase().contains("unhealthy"),
        "every device of the demo works: {status}"
    );
}

/// The text of step `n`.
fn section(stdout: &str, n: u32) -> &str {
    stdout
        .split(&format!("── {n}."))
        .nth(1)
        .and_then(|s| s.split("\n── ").next())
        .unwrap_or_else(|| panic!("no step {n}: {stdout}"))
}

#[test]
fn the_demo_points_to_a_glossary_that_explains_its_words() {
    let out = Command::new(DEMO)
        .arg("demo")
        .output()
        .expect("run nri-accel-demo demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let intro = stdout.split("── 1.").next().unwrap_or_default();
    assert!(intro.contains("docs/glossary.md"), "{intro}");
    let glossary = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/glossary.md"),
    )
    .expect("docs/glossary.md");
    for term in [
        "Adjustment",
        "CDI spec",
        "Claim",
        "Container update",
        "Counter set",
        "cpus_per_device",
        "Device plugin",
        "Gate",
        "Grant",
        "NUMA node",
        "Pool",
        "Prepare / unprepare",
        "Record",
        "ResourceSlice",
        "Shared CPUs",
        "Synchronize",
    ] {
        assert!(
            glossary.contains(&format!("**{term}")),
            "docs/glossary.md does not explain {term}"
        );
        let word = term.split([' ', '_']).next().unwrap().to_lowercase();
        assert!(
            stdout.to_lowercase().contains(&word),
            "the glossary explains {term}, which the demo never says"
        );
    }
}

#[test]
fn the_demo_refuses_a_config_and_does_not_offer_one() {
    // Its own simulated node needs none; given after or before the subcommand, it is refused.
    for args in [
        &["demo", "--config", "/x.yaml"][..],
        &["--config", "/x.yaml", "demo"][..],
    ] {
        let out = Command::new(DEMO).args(args).output().expect("run demo");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("demo runs on its own simulated node and takes no --config"),
            "{stderr}"
        );
    }
    let out = Command::new(DEMO)
        .args(["demo", "--help"])
        .output()
        .expect("run demo --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(help.contains("--keep"), "{help}");
    assert!(!help.contains("--config"), "{help}");
    let out = Command::new(DEMO)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(String::from_utf8_lossy(&out.stdout).contains("  demo "));
}

//! The demo build is the whole nri-accel command line plus `demo`, and its `demo` refuses a
//! config it would ignore.

use std::process::Command;

/// The demo build of the nri-accel command line.
const DEMO: &str = env!("CARGO_BIN_EXE_nri-accel-demo");

#[test]
fn demo_refuses_a_config_it_would_ignore() {
    let out = Command::new(DEMO)
        .args(["--config", "/nonexistent/config.yaml", "demo"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("demo runs on its own simulated node and takes no --config"),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn the_demo_build_is_the_whole_command_line() {
    let out = Command::new(DEMO)
        .arg("--help")
        .output()
        .expect("run the demo");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for sub in [
        "run",
        "demo",
        "status",
        "discover",
        "check-config",
        "prepare",
    ] {
        assert!(help.contains(&format!("  {sub} ")), "no {sub} in:\n{help}");
    }
}

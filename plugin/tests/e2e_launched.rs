//! End to end, the daemon launched by the runtime (NRI socket on fd 3, `NRI_PLUGIN_SOCKET=3`):
//! it registers over the inherited socket without any NRI socket path, serves claims, and exits
//! when the runtime closes the connection (an inherited socket cannot be reconnected; the runtime
//! launches a new instance, which must not find the node lock held by an orphan).

mod e2e_common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;

use e2e_common::*;
use fake_runtime::{FakeRuntime, RuntimeConfig};
use nri_accel::claims_api::Family;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_launched_daemon_serves_and_exits_with_its_connection() {
    let node = TestNode::new(Shape::default(), "");
    // The runtime passes no arguments: a wrapper names the subcommand and the config.
    let wrapper = node.dir.path().join("nri-accel-launch");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {BIN} run --config {} >>{} 2>&1\n",
            node.config.display(),
            node.dir.path().join("launched.log").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();

    let fake = FakeRuntime::new(RuntimeConfig::default());
    let theirs = fake.socketpair().expect("socketpair");
    let mut child = fake_runtime::launch::spawn_with_fd3(
        wrapper.to_str().unwrap(),
        theirs.as_raw_fd(),
        &[("NRI_PLUGIN_NAME", "accel"), ("NRI_PLUGIN_IDX", "10")],
    )
    .expect("launch");
    drop(theirs);
    let log = || std::fs::read_to_string(node.dir.path().join("launched.log")).unwrap_or_default();
    if let Err(e) = fake.wait_synchronized(1, WAIT).await {
        panic!("{e}; log:\n{}", log());
    }
    assert!(!node.nri_socket.exists());
    let client = node.client_gate_open().await;
    prepare_ok(&client, count_claim("fd3-1", Family::Exclusive, None)).await;

    // The runtime goes away: the plugin's connection closes, and the process ends.
    fake.stop().await;
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the daemon outlived its runtime connection; log:\n{}",
                log()
            )
        })
        .expect("wait");
    assert!(
        status.code().is_some(),
        "it exits, it is not killed: {status:?}"
    );

    // The runtime's next instance of the plugin gets the node and the claim.
    let fake = FakeRuntime::new(RuntimeConfig::default());
    let theirs = fake.socketpair().expect("socketpair");
    let mut child =
        fake_runtime::launch::spawn_with_fd3(wrapper.to_str().unwrap(), theirs.as_raw_fd(), &[])
            .expect("launch");
    drop(theirs);
    if let Err(e) = fake.wait_synchronized(1, WAIT).await {
        panic!("{e}; log:\n{}", log());
    }
    let client = node.client_gate_open().await;
    let ids = prepare_ok(&client, count_claim("fd3-1", Family::Exclusive, None)).await;
    assert_eq!(ids, vec![format!("{CDI_KIND}=claim-fd3-1-0")]);
    let _ = child.kill().await;
}

//! End to end, the probes the Helm chart runs (issue 37): `nri-accel probe ready|live` against
//! the real daemon's loopback `/readyz` and `/livez`. Ready waits for the runtime's Synchronize
//! and then for the kubelet's registration of the DRA driver, each step with its sentence; live
//! holds while the daemon answers and fails against a SIGSTOPped (hung) daemon, and holds again
//! once it runs.

mod e2e_common;

use e2e_common::*;
use kube_sim::apiserver::ApiServer;
use kube_sim::kubelet::PluginWatcher;
use nix::sys::signal::Signal;

const NODE: &str = "node-1";

/// Runs `nri-accel probe <kind>` against the node's config: (success, stdout + stderr).
async fn probe(node: &TestNode, kind: &str, timeout: &str) -> (bool, String) {
    let (status, out, err) = node.cli(&["probe", kind, "--timeout", timeout]).await;
    (status.success(), format!("{out}{err}"))
}

/// Polls the probe until it gives `want` (each answer is kept for the failure message).
async fn probe_until(node: &TestNode, kind: &str, want: bool, what: &str) -> String {
    wait_for(what, || async {
        let (ok, text) = probe(node, kind, "5").await;
        (ok == want).then_some(text)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_waits_for_the_runtime_and_the_kubelet_and_live_fails_on_a_hung_daemon() {
    let (node, _addr) = TestNode::with_metrics(Shape::default());
    let api = ApiServer::start().await.expect("api server");
    api.add_node(NODE);
    let kubeconfig = node.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    node.enable_dra(NODE, &kubeconfig);
    let (registry, _) = node.kubelet_dirs();

    // Nothing listens yet: the probe names the endpoint, and fails.
    let (ok, text) = probe(&node, "ready", "1").await;
    assert!(!ok && text.contains("/readyz"), "{text}");

    // A runtime that accepts but never synchronizes: alive, not ready, and says why.
    let silent = tokio::net::UnixListener::bind(&node.nri_socket).unwrap();
    let mut daemon = node.spawn(&[]);
    let (held, _) = tokio::time::timeout(WAIT, silent.accept())
        .await
        .expect("the daemon dials")
        .unwrap();
    let text = probe_until(&node, "live", true, "probe live 0 while starting").await;
    assert!(text.contains("/livez: ok"), "{text}");
    let (ok, text) = probe(&node, "ready", "5").await;
    assert!(!ok, "ready before the runtime synchronized: {text}");
    assert!(
        text.contains("/readyz answered 503") && text.contains("runtime"),
        "{text}"
    );

    // The runtime synchronizes; the kubelet has not registered the driver yet.
    drop(held);
    drop(silent);
    let fake = runtime(&node).await;
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let text = wait_for("probe ready names the DRA registration", || async {
        let (ok, text) = probe(&node, "ready", "5").await;
        (!ok && text.contains("has not registered DRA driver accel.nri.io")).then_some(text)
    })
    .await;
    assert!(
        text.contains("-reg.sock"),
        "the sentence names the socket: {text}"
    );

    // The kubelet registers it: ready.
    let mut kubelet = PluginWatcher::new(&registry);
    kubelet
        .wait_for("accel.nri.io", WAIT)
        .await
        .expect("registered");
    probe_until(&node, "ready", true, "probe ready 0 once registered").await;

    // A hung daemon: the kernel still accepts the connection, nothing answers; live fails
    // within its timeout and says which endpoint did not answer.
    daemon.signal(Signal::SIGSTOP);
    let (ok, text) = probe(&node, "live", "1").await;
    daemon.signal(Signal::SIGCONT);
    assert!(!ok, "live answered for a stopped daemon: {text}");
    assert!(
        text.contains("no answer from the daemon's /livez"),
        "{text}"
    );
    probe_until(
        &node,
        "live",
        true,
        "probe live 0 once the daemon runs again",
    )
    .await;
    assert!(daemon.try_exit().is_none(), "{}", daemon.log_text());
    fake.stop().await;
}

//! The kubelet-facing socket layer against the simulated kubelet (kube-sim, which declares the
//! kubelet's messages by hand): registration through the registry directory, a refusal the
//! operator sees, stale and foreign sockets, and a socket wiped while served.

use std::path::Path;
use std::time::Duration;

use kube_sim::kubelet::PluginWatcher;
use nri_accel::kubelet::{KubeletError, RegistrationService, RegistrationState, ServedSocket};
use tonic::transport::Server;

const WAIT: Duration = Duration::from_secs(30);
const DRIVER: &str = "accel.nri.io";

/// Serves a DRA registration for `DRIVER` in `registry`, pointing at a served endpoint in `plugins`.
fn serve_registration(
    registry: &Path,
    endpoint: &Path,
    versions: &[&str],
) -> (
    ServedSocket,
    tokio::sync::watch::Receiver<RegistrationState>,
) {
    let service = RegistrationService::dra(DRIVER, endpoint, versions);
    let state = service.subscribe();
    let router = Server::builder().add_service(service.into_server());
    let socket = ServedSocket::serve(
        &registry.join(format!("{DRIVER}-reg.sock")),
        router,
        Default::default(),
    )
    .expect("registration socket");
    (socket, state)
}

/// Some service on the endpoint, so the kubelet finds it there.
fn serve_endpoint(path: &Path) -> ServedSocket {
    let filler = RegistrationService::dra(DRIVER, path, &[]);
    ServedSocket::serve(
        path,
        Server::builder().add_service(filler.into_server()),
        Default::default(),
    )
    .expect("endpoint socket")
}

async fn wait_state(
    rx: &mut tokio::sync::watch::Receiver<RegistrationState>,
    want: impl Fn(&RegistrationState) -> bool,
) -> RegistrationState {
    tokio::time::timeout(WAIT, rx.wait_for(|s| want(s)))
        .await
        .expect("registration verdict in time")
        .expect("state channel")
        .clone()
}

#[tokio::test]
async fn the_kubelet_registers_the_plugin_and_a_refusal_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("plugins_registry");
    let endpoint = dir.path().join("plugins").join(DRIVER).join("dra.sock");
    let _ep = serve_endpoint(&endpoint);
    let (reg, mut state) = serve_registration(
        &registry,
        &endpoint,
        &["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"],
    );

    let mut kubelet = PluginWatcher::new(&registry);
    let plugin = kubelet.wait_for(DRIVER, WAIT).await.expect("registered");
    assert_eq!(plugin.kind, "DRAPlugin");
    assert_eq!(plugin.endpoint, endpoint);
    assert_eq!(plugin.dra_version, "v1.DRAPlugin");
    assert_eq!(
        wait_state(&mut state, |s| *s != RegistrationState::Waiting).await,
        RegistrationState::Registered
    );

    // An older kubelet that speaks only v1beta1 picks that version.
    let mut older = PluginWatcher::speaking(&registry, &["v1beta1.DRAPlugin"]);
    assert_eq!(
        older.wait_for(DRIVER, WAIT).await.unwrap().dra_version,
        "v1beta1.DRAPlugin"
    );

    // A kubelet that speaks none of our versions refuses, and the plugin keeps the reason.
    drop(reg);
    let (_reg, mut state) = serve_registration(&registry, &endpoint, &["v1.DRAPlugin"]);
    let mut alien = PluginWatcher::speaking(&registry, &["v9.DRAPlugin"]);
    alien.scan().await;
    assert_eq!(alien.registered().count(), 0);
    assert_eq!(alien.refused().len(), 1);
    match wait_state(&mut state, |s| matches!(s, RegistrationState::Refused(_))).await {
        RegistrationState::Refused(reason) => assert!(reason.contains("v9.DRAPlugin"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn stale_sockets_are_replaced_and_foreign_files_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg").join("x-reg.sock");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();

    // A socket left by a process that is gone: replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let served = serve_endpoint(&path);
    assert!(served.is_present());
    served.shutdown().await;
    assert!(!path.exists(), "shutdown unlinks its own socket");

    // A socket another process serves: refused, left alone.
    let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let filler = RegistrationService::dra(DRIVER, &path, &[]);
    let err = ServedSocket::serve(
        &path,
        Server::builder().add_service(filler.into_server()),
        Default::default(),
    )
    .unwrap_err();
    assert!(matches!(err, KubeletError::InUse { .. }), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    drop(live);
    std::fs::remove_file(&path).unwrap();

    // A regular file: refused and never deleted.
    std::fs::write(&path, b"not a socket").unwrap();
    let filler = RegistrationService::dra(DRIVER, &path, &[]);
    let err = ServedSocket::serve(
        &path,
        Server::builder().add_service(filler.into_server()),
        Default::default(),
    )
    .unwrap_err();
    assert!(matches!(err, KubeletError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
}

#[tokio::test]
async fn a_wiped_socket_is_noticed_served_again_and_registered_again() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("plugins_registry");
    let endpoint = dir.path().join("plugins").join(DRIVER).join("dra.sock");
    let _ep = serve_endpoint(&endpoint);
    let (reg, _state) = serve_registration(&registry, &endpoint, &["v1.DRAPlugin"]);
    let mut kubelet = PluginWatcher::new(&registry);
    kubelet.wait_for(DRIVER, WAIT).await.unwrap();

    // The directory is wiped (a kubelet restart that cleans up): the server notices.
    std::fs::remove_dir_all(&registry).unwrap();
    assert!(!reg.is_present());
    kubelet.scan().await;
    assert_eq!(kubelet.registered().count(), 0);

    // Another process's socket now sits at the path: shutting down the old server leaves it.
    std::fs::create_dir_all(&registry).unwrap();
    let theirs = registry.join(format!("{DRIVER}-reg.sock"));
    let other = std::os::unix::net::UnixListener::bind(&theirs).unwrap();
    reg.shutdown().await;
    assert!(
        theirs.exists(),
        "a socket that is not ours is never unlinked"
    );
    drop(other);

    // Served again (the stale one replaced), the restarted kubelet registers it again.
    let (_reg, mut state) = serve_registration(&registry, &endpoint, &["v1.DRAPlugin"]);
    kubelet.restart();
    kubelet.wait_for(DRIVER, WAIT).await.unwrap();
    assert_eq!(
        wait_state(&mut state, |s| *s != RegistrationState::Waiting).await,
        RegistrationState::Registered
    );
}

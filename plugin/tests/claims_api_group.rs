//! `claims_api.group` through the directory as packaged (issue 27, item 6): the socket's
//! directory starts 0750 root:root, as the unit's RuntimeDirectory and tmpfiles.d make it; with
//! a group the daemon hands the directory to the group too, so a member (not root) can connect,
//! and someone outside the group still cannot.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use nri_accel::claims_api::{
    ClaimInfo, ClaimRef, ClaimService, ClaimSpec, ClaimsServer, PrepareResults, ServerOptions,
    UnprepareResults,
};
use nri_accel::gate::Gate;

struct Engine;

#[async_trait]
impl ClaimService for Engine {
    async fn prepare(&self, _claims: Vec<ClaimSpec>) -> PrepareResults {
        Default::default()
    }
    async fn unprepare(&self, _claims: Vec<ClaimRef>) -> UnprepareResults {
        Default::default()
    }
    async fn list(&self) -> Vec<ClaimInfo> {
        Vec::new()
    }
    async fn status(&self, gate_open: bool) -> String {
        format!("{{\"gate\":{{\"open\":{gate_open}}}}}")
    }
}

/// A `run/nri-accel` dir made as the packaging makes it: 0750, owned by us.
fn packaged_dir(root: &Path) -> std::path::PathBuf {
    let dir = root.join("run/nri-accel");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(root, PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(root.join("run"), PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o750)).unwrap();
    dir
}

async fn bind(path: &Path, gid: nix::unistd::Gid) -> ClaimsServer {
    let gate = Gate::new();
    gate.open();
    ClaimsServer::bind(
        path,
        Arc::new(Engine),
        gate,
        ServerOptions::with_group(Some(gid)),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn with_a_group_the_socket_dir_is_the_groups_too() {
    let root = tempfile::tempdir().unwrap();
    let dir = packaged_dir(root.path());
    // Our own primary group: a group we may chown to without privileges.
    let gid = nix::unistd::getegid();
    let server = bind(&dir.join("claims.sock"), gid).await;
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(meta.gid(), gid.as_raw());
    assert_eq!(meta.mode() & 0o7777, 0o750, "group may enter, never write");
    server.shutdown().await.unwrap();
}

/// The system's Python, which any user may run.
const PYTHON: &str = "/usr/bin/python3";

/// Runs `connect` on the socket as uid 4243 with the given supplementary groups (through
/// util-linux's `setpriv`); answers the probe's exit status.
fn connect_as_member(socket: &Path, groups: &str) -> std::process::ExitStatus {
    std::process::Command::new("setpriv")
        .args([
            "--reuid=4243",
            "--regid=4243",
            &format!("--groups={groups}"),
        ])
        .args(["--inh-caps=-all", "--bounding-set=-all", PYTHON, "-c"])
        .arg("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])")
        .arg(socket)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
}

/// Needs root to act as other uids (`.ci/run` runs it as root, after the unprivileged run); the
/// mode and owner logic is tested without root by `with_a_group_the_socket_dir_is_the_groups_too`.
#[tokio::test]
#[ignore = "needs root, setpriv and /usr/bin/python3 to act as other uids; .ci/run runs it as root"]
async fn a_member_who_is_not_root_reaches_the_socket_and_a_stranger_does_not() {
    let have = |cmd: &str| {
        std::process::Command::new(cmd)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        nix::unistd::geteuid().is_root(),
        "run as root: it connects as other uids"
    );
    assert!(
        have("setpriv") && have(PYTHON),
        "needs setpriv (util-linux) and {PYTHON}"
    );
    let root = tempfile::tempdir().unwrap();
    let dir = packaged_dir(root.path());
    let socket = dir.join("claims.sock");
    let group = nix::unistd::Gid::from_raw(4242);
    let server = bind(&socket, group).await;
    assert!(
        connect_as_member(&socket, "4242").success(),
        "a member connects"
    );
    assert!(
        !connect_as_member(&socket, "4244").success(),
        "a stranger gets EACCES"
    );
    server.shutdown().await.unwrap();
}

//! The claims API over real unix sockets in temp dirs, against a fake engine that records calls.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use nri_accel::claims_api::{
    ClaimAsk, ClaimInfo, ClaimRef, ClaimService, ClaimSpec, ClaimState, ClaimsApiError,
    ClaimsClient, ClaimsServer, CountAsk, DefaultPeerPolicy, DraResult, Family, Limits, PeerCred,
    PeerPolicy, PrepareResults, PreparedDevice, Selector, ServerOptions, UnprepareResults,
};
use nri_accel::gate::Gate;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use ttrpc::Code;

/// Guards against a hang only; no assertion depends on how long anything takes.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// A claim engine that records every call and answers every claim it is given, except the UIDs
/// it is told to leave out.
#[derive(Default)]
struct FakeEngine {
    prepared: Mutex<Vec<Vec<String>>>,
    unprepared: Mutex<Vec<Vec<String>>>,
    leave_out: Mutex<BTreeSet<String>>,
    panic_on: Mutex<Option<String>>,
}

impl FakeEngine {
    fn prepare_calls(&self) -> Vec<Vec<String>> {
        self.prepared.lock().expect("lock").clone()
    }
    fn unprepare_calls(&self) -> Vec<Vec<String>> {
        self.unprepared.lock().expect("lock").clone()
    }
    fn device(uid: &str) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu".into()],
            pool: "node-a".into(),
            device: "gpu-0".into(),
            cdi_device_ids: vec![format!("example.com/gpu=claim-{uid}-0")],
            share_id: None,
        }
    }
}

#[async_trait]
impl ClaimService for FakeEngine {
    async fn prepare(&self, claims: Vec<ClaimSpec>) -> PrepareResults {
        self.prepared
            .lock()
            .expect("lock")
            .push(claims.iter().map(|c| c.uid.clone()).collect());
        let panic_on = self.panic_on.lock().expect("lock").clone();
        if claims.iter().any(|c| Some(&c.uid) == panic_on.as_ref()) {
            panic!("fake engine told to panic");
        }
        let leave_out = self.leave_out.lock().expect("lock").clone();
        claims
            .into_iter()
            .filter(|c| !leave_out.contains(&c.uid))
            .map(|c| {
                let device = Self::device(&c.uid);
                (c.uid, Ok(vec![device]))
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        self.unprepared
            .lock()
            .expect("lock")
            .push(claims.iter().map(|c| c.uid.clone()).collect());
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }

    async fn list(&self) -> Vec<ClaimInfo> {
        vec![ClaimInfo {
            uid: "held-1".into(),
            namespace: "ns".into(),
            name: "gpu".into(),
            state: ClaimState::Prepared,
            devices: vec![Self::device("held-1")],
        }]
    }

    async fn status(&self, gate_open: bool) -> String {
        serde_json::json!({ "devices": [{ "name": "gpu-0" }], "gate": { "open": gate_open } })
            .to_string()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    engine: Arc<FakeEngine>,
    gate: Gate,
    server: ClaimsServer,
}

fn options() -> ServerOptions {
    // The test's own uid is the daemon's own uid, so the daemon policy admits it.
    ServerOptions::default()
}

async fn start_with(opts: ServerOptions, gate_open: bool) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run/nri-accel/claims.sock");
    let engine = Arc::new(FakeEngine::default());
    let gate = Gate::new();
    if gate_open {
        gate.open();
    }
    let server = ClaimsServer::bind(&path, Arc::clone(&engine), gate.clone(), opts)
        .await
        .expect("bind");
    Fixture {
        _dir: dir,
        path,
        engine,
        gate,
        server,
    }
}

async fn client(path: &Path) -> ClaimsClient {
    ClaimsClient::connect(path)
        .await
        .expect("connect")
        .with_timeout(HANG_GUARD)
}

fn dra_claim(uid: &str) -> ClaimSpec {
    ClaimSpec {
        uid: uid.into(),
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
        ask: ClaimAsk::Results(vec![DraResult {
            request: "gpu".into(),
            driver: "gpu.example.com".into(),
            pool: "node-a".into(),
            device: "gpu-0".into(),
            share_id: None,
        }]),
        env: Default::default(),
    }
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
    }
}

fn rpc_code(e: &ClaimsApiError) -> Option<Code> {
    match e {
        ClaimsApiError::Rpc { code, .. } => Some(*code),
        _ => None,
    }
}

#[tokio::test]
async fn gate_closed_refuses_prepare_and_unprepare_whole_then_serves_after_open() {
    let f = start_with(options(), false).await;
    let c = client(&f.path).await;

    let err = c
        .prepare(vec![dra_claim("u1"), dra_claim("u2")])
        .await
        .expect_err("gate closed");
    assert_eq!(rpc_code(&err), Some(Code::UNAVAILABLE), "{err}");
    assert!(err.is_unavailable());
    assert!(err.to_string().contains("Synchronize"), "{err}");
    let err = c
        .unprepare(vec![claim_ref("u1")])
        .await
        .expect_err("gate closed");
    assert_eq!(rpc_code(&err), Some(Code::UNAVAILABLE), "{err}");
    assert!(f.engine.prepare_calls().is_empty());
    assert!(f.engine.unprepare_calls().is_empty());

    // List and Status are served while closed, and Status reports the gate.
    assert_eq!(c.list().await.expect("list").len(), 1);
    let status = c.status().await.expect("status");
    assert!(!status.gate_open);
    assert_eq!(status.document["gate"]["open"], serde_json::json!(false));

    f.gate.open();
    let answers = c
        .prepare(vec![dra_claim("u1"), dra_claim("u2")])
        .await
        .expect("prepare after open");
    assert_eq!(answers.len(), 2);
    assert_eq!(
        answers["u1"].as_ref().expect("u1 prepared")[0].cdi_device_ids,
        vec!["example.com/gpu=claim-u1-0".to_string()]
    );
    assert_eq!(
        f.engine.prepare_calls(),
        vec![vec!["u1".to_string(), "u2".to_string()]]
    );
    let status = c.status().await.expect("status");
    assert!(status.gate_open);
    assert_eq!(status.document["gate"]["open"], serde_json::json!(true));
    assert_eq!(status.document["devices"][0]["name"], "gpu-0");
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn socket_is_0600_in_a_created_directory_and_unlinked_on_shutdown() {
    let f = start_with(options(), true).await;
    let meta = std::fs::metadata(&f.path).expect("socket metadata");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let path = f.path.clone();
    f.server.shutdown().await.expect("shutdown");
    assert!(!path.exists(), "shutdown unlinks the socket");
}

#[tokio::test]
async fn socket_with_group_is_0660_and_owned_by_the_group() {
    // The test's own primary group is one it may chown to without privileges.
    let gid = nix::unistd::getegid();
    let f = start_with(ServerOptions::with_group(Some(gid)), true).await;
    let meta = std::fs::metadata(&f.path).expect("socket metadata");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), gid.as_raw());
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn stale_socket_is_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale listener"));
    assert!(path.exists(), "a dead listener leaves its socket file");
    let engine = Arc::new(FakeEngine::default());
    let gate = Gate::new();
    gate.open();
    let server = ClaimsServer::bind(&path, Arc::clone(&engine), gate, options())
        .await
        .expect("bind over stale socket");
    let answers = client(&path)
        .await
        .prepare(vec![dra_claim("u1")])
        .await
        .expect("prepare");
    assert!(answers["u1"].is_ok());
    server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn live_socket_is_refused_naming_the_path() {
    let f = start_with(options(), true).await;
    let err = ClaimsServer::bind(
        &f.path,
        Arc::new(FakeEngine::default()),
        Gate::new(),
        options(),
    )
    .await
    .expect_err("second server");
    assert!(
        matches!(err, ClaimsApiError::AlreadyRunning { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains(&f.path.display().to_string()),
        "{err}"
    );
    // The first server is untouched.
    assert_eq!(client(&f.path).await.list().await.expect("list").len(), 1);
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.sock");
    std::fs::write(&path, "keep me").expect("write");
    let err = ClaimsServer::bind(
        &path,
        Arc::new(FakeEngine::default()),
        Gate::new(),
        options(),
    )
    .await
    .expect_err("not a socket");
    assert!(matches!(err, ClaimsApiError::NotASocket { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(&path).expect("still there"),
        "keep me"
    );
}

/// Refuses everyone and records who asked.
#[derive(Default)]
struct RefuseAll {
    seen: Mutex<Vec<PeerCred>>,
}

impl PeerPolicy for RefuseAll {
    fn admit(&self, peer: &PeerCred) -> Result<(), String> {
        self.seen.lock().expect("lock").push(*peer);
        Err("not on the list".into())
    }
}

#[tokio::test]
async fn a_peer_whose_uid_is_not_allowed_is_refused() {
    let me = nix::unistd::geteuid().as_raw();
    // An allow-list without the test's own uid (which may be root in CI).
    let others = DefaultPeerPolicy::new([me.wrapping_add(1)], None);
    let f = start_with(
        ServerOptions {
            policy: Arc::new(others),
            ..options()
        },
        true,
    )
    .await;
    let c = client(&f.path).await;
    let err = c
        .prepare(vec![dra_claim("u1")])
        .await
        .expect_err("refused peer");
    // The caller is told why, not left with a closed connection.
    assert_eq!(rpc_code(&err), Some(Code::PERMISSION_DENIED), "{err}");
    assert!(
        err.to_string().contains(&format!(
            "uid {me} (pid {}) may not use the claims API",
            std::process::id()
        )),
        "{err}"
    );
    assert!(f.engine.prepare_calls().is_empty());
    f.server.shutdown().await.expect("shutdown");

    // The policy sees the kernel's credentials of this very process.
    let policy = Arc::new(RefuseAll::default());
    let f = start_with(
        ServerOptions {
            policy: Arc::clone(&policy) as Arc<dyn PeerPolicy>,
            ..options()
        },
        true,
    )
    .await;
    let c = client(&f.path).await;
    assert!(c.list().await.is_err());
    let seen = policy.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].uid, me);
    assert_eq!(seen[0].pid, std::process::id() as i32);
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn oversized_request_is_refused_with_a_clear_error_before_the_engine() {
    let opts = ServerOptions {
        limits: Limits {
            max_message_bytes: 4096,
            ..Limits::default()
        },
        ..options()
    };
    let f = start_with(opts, true).await;
    let c = client(&f.path).await;
    let mut big = dra_claim("big");
    big.name = "n".repeat(200);
    let claims: Vec<ClaimSpec> = (0..40)
        .map(|i| ClaimSpec {
            uid: format!("big-{i}"),
            ..big.clone()
        })
        .collect();
    let err = c.prepare(claims).await.expect_err("oversized");
    assert_eq!(rpc_code(&err), Some(Code::RESOURCE_EXHAUSTED), "{err}");
    let text = err.to_string();
    assert!(text.contains("Prepare") && text.contains("4096"), "{text}");
    assert!(f.engine.prepare_calls().is_empty());
    // The connection stays usable for a request within the limit.
    let answers = c.prepare(vec![dra_claim("small")]).await.expect("small");
    assert!(answers["small"].is_ok());
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn too_many_claims_are_refused_whole() {
    let opts = ServerOptions {
        limits: Limits {
            max_claims: 3,
            ..Limits::default()
        },
        ..options()
    };
    let f = start_with(opts, true).await;
    let c = client(&f.path).await;
    let claims = (0..4).map(|i| dra_claim(&format!("u{i}"))).collect();
    let err = c.prepare(claims).await.expect_err("too many");
    assert_eq!(rpc_code(&err), Some(Code::INVALID_ARGUMENT), "{err}");
    assert!(f.engine.prepare_calls().is_empty());
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_bad_uid_is_a_per_claim_error_and_siblings_are_served() {
    let f = start_with(options(), true).await;
    let c = client(&f.path).await;
    let answers = c
        .prepare(vec![
            dra_claim("../x"),
            dra_claim("good-1"),
            dra_claim("a..b"),
        ])
        .await
        .expect("prepare");
    assert_eq!(answers.len(), 3);
    let err = answers["../x"].as_ref().expect_err("bad uid");
    assert!(err.contains("\"../x\""), "{err}");
    assert!(answers["a..b"].is_err());
    assert!(answers["good-1"].is_ok());
    assert_eq!(f.engine.prepare_calls(), vec![vec!["good-1".to_string()]]);

    let released = c
        .unprepare(vec![claim_ref("../x"), claim_ref("good-1")])
        .await
        .expect("unprepare");
    assert!(
        released["../x"]
            .as_ref()
            .expect_err("bad uid")
            .contains("\"../x\"")
    );
    assert_eq!(released["good-1"], Ok(()));
    assert_eq!(f.engine.unprepare_calls(), vec![vec!["good-1".to_string()]]);
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn every_requested_uid_is_in_the_answer() {
    let f = start_with(options(), true).await;
    f.engine
        .leave_out
        .lock()
        .expect("lock")
        .insert("silent".to_string());
    let c = client(&f.path).await;
    let mut no_ask = dra_claim("empty");
    no_ask.ask = ClaimAsk::Results(vec![]);
    let count = ClaimSpec {
        ask: ClaimAsk::Count(vec![CountAsk {
            request: "gpu".into(),
            count: 1,
            family: Family::Exclusive,
            selector: Selector::default(),
            profile: None,
            shares: None,
        }]),
        ..dra_claim("count-1")
    };
    let asked = vec![
        dra_claim("ok-1"),
        dra_claim("silent"),
        dra_claim("twice"),
        dra_claim("twice"),
        no_ask,
        count,
        dra_claim(""),
    ];
    let answers = c.prepare(asked).await.expect("prepare");
    let keys: BTreeSet<&str> = answers.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["", "count-1", "empty", "ok-1", "silent", "twice"])
    );
    assert!(answers["ok-1"].is_ok());
    assert!(answers["count-1"].is_ok());
    assert!(
        answers["silent"]
            .as_ref()
            .expect_err("left out")
            .contains("no answer")
    );
    assert!(
        answers["twice"]
            .as_ref()
            .expect_err("dup")
            .contains("appears 2 times")
    );
    assert!(
        answers["empty"]
            .as_ref()
            .expect_err("empty")
            .contains("empty list")
    );
    assert!(answers[""].is_err());
    assert_eq!(
        f.engine.prepare_calls(),
        vec![vec![
            "ok-1".to_string(),
            "silent".to_string(),
            "count-1".to_string()
        ]]
    );
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn list_reports_held_claims() {
    let f = start_with(options(), true).await;
    let claims = client(&f.path).await.list().await.expect("list");
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].uid, "held-1");
    assert_eq!(claims[0].state, ClaimState::Prepared);
    assert_eq!(
        claims[0].devices[0].cdi_device_ids,
        vec!["example.com/gpu=claim-held-1-0".to_string()]
    );
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn malformed_bytes_close_the_connection_and_the_server_lives_on() {
    let f = start_with(options(), true).await;

    // Not ttrpc at all: the first "header" declares a huge frame; the server hangs up.
    let mut raw = tokio::net::UnixStream::connect(&f.path)
        .await
        .expect("connect");
    raw.write_all(b"GET /claims HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut sink = Vec::new();
    let read = tokio::time::timeout(HANG_GUARD, raw.read_to_end(&mut sink))
        .await
        .expect("server closes the connection");
    assert!(
        read.is_err() || sink.is_empty(),
        "no answer to garbage: {sink:?}"
    );

    // A well-framed request whose payload is garbage gets an error response, no panic.
    let mut raw = tokio::net::UnixStream::connect(&f.path)
        .await
        .expect("connect");
    let mut frame = 5u32.to_be_bytes().to_vec();
    frame.extend_from_slice(&1u32.to_be_bytes());
    frame.extend_from_slice(&[1, 0]);
    frame.extend_from_slice(&[0xff; 5]);
    raw.write_all(&frame).await.expect("write");
    let mut header = [0u8; 10];
    tokio::time::timeout(HANG_GUARD, raw.read_exact(&mut header))
        .await
        .expect("answer")
        .expect("read header");
    assert_eq!(header[8], 2, "a response frame");

    // The server still serves a proper client.
    let answers = client(&f.path)
        .await
        .prepare(vec![dra_claim("after-garbage")])
        .await
        .expect("prepare");
    assert!(answers["after-garbage"].is_ok());
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn an_undecodable_payload_is_invalid_argument() {
    let f = start_with(options(), true).await;
    let stream = tokio::net::UnixStream::connect(&f.path)
        .await
        .expect("connect");
    let raw = ttrpc::r#async::Client::new(ttrpc::r#async::transport::Socket::new(stream));
    let mut req = ttrpc::Request::new();
    req.service = "nriaccel.claims.v1.Claims".into();
    req.method = "Prepare".into();
    req.payload = vec![0xff; 7];
    let err = raw.request(req).await.expect_err("garbage payload");
    let ttrpc::Error::RpcStatus(status) = err else {
        panic!("expected a status, got {err:?}");
    };
    assert_eq!(status.code(), Code::INVALID_ARGUMENT, "{status:?}");
    assert!(
        status
            .message
            .contains("Prepare request could not be decoded"),
        "{status:?}"
    );
    assert!(f.engine.prepare_calls().is_empty());
    f.server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn an_engine_panic_is_internal_and_the_server_lives_on() {
    let f = start_with(options(), true).await;
    *f.engine.panic_on.lock().expect("lock") = Some("boom".to_string());
    let c = client(&f.path).await;
    let err = c.prepare(vec![dra_claim("boom")]).await.expect_err("panic");
    assert_eq!(rpc_code(&err), Some(Code::INTERNAL), "{err}");
    let answers = c
        .prepare(vec![dra_claim("calm")])
        .await
        .expect("after panic");
    assert!(answers["calm"].is_ok());
    f.server.shutdown().await.expect("shutdown");
}

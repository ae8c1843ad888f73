//! Connections to the claims API (issue 27, item 4): past the connection cap a connection is
//! refused with RESOURCE_EXHAUSTED naming the setting while the open ones are still served, a
//! freed slot serves again, and a connection idle past the timeout is closed, while one whose
//! call is in flight is not.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nri_accel::claims_api::{
    ClaimInfo, ClaimRef, ClaimService, ClaimSpec, ClaimsClient, ClaimsServer, Limits,
    PrepareResults, ServerOptions, UnprepareResults,
};
use nri_accel::gate::Gate;
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

/// Guards against a hang only; no assertion depends on how long anything takes.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Answers Status at once, or after `release` when told to hold.
#[derive(Default)]
struct Engine {
    hold: std::sync::atomic::AtomicBool,
    release: Notify,
}

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
        if self.hold.load(std::sync::atomic::Ordering::SeqCst) {
            self.release.notified().await;
        }
        format!("{{\"gate\":{{\"open\":{gate_open}}}}}")
    }
}

async fn start(limits: Limits) -> (tempfile::TempDir, PathBuf, Arc<Engine>, ClaimsServer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.sock");
    let engine = Arc::new(Engine::default());
    let gate = Gate::new();
    gate.open();
    let opts = ServerOptions {
        limits,
        ..ServerOptions::default()
    };
    let server = ClaimsServer::bind(&path, Arc::clone(&engine), gate, opts)
        .await
        .unwrap();
    (dir, path, engine, server)
}

async fn client(path: &Path) -> ClaimsClient {
    ClaimsClient::connect(path)
        .await
        .unwrap()
        .with_timeout(HANG_GUARD)
}

#[tokio::test]
async fn past_the_cap_a_connection_is_refused_and_the_open_ones_are_served() {
    let limits = Limits {
        max_connections: 4,
        ..Limits::default()
    };
    let (_dir, path, _engine, server) = start(limits).await;
    // Four connections: one client that calls, three that only sit there.
    let first = client(&path).await;
    first.status().await.expect("served under the cap");
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(tokio::net::UnixStream::connect(&path).await.unwrap());
    }
    // The fifth (and more) are refused with a status that names the setting.
    for _ in 0..3 {
        let excess = client(&path).await;
        let err = excess.status().await.expect_err("over the cap");
        assert_eq!(err.code(), ttrpc::Code::RESOURCE_EXHAUSTED, "{err}");
        let text = err.to_string();
        assert!(text.contains("claims_api.max_connections"), "{text}");
        assert!(text.contains("4 connections"), "{text}");
    }
    // Status still answers on a connection inside the cap.
    first.status().await.expect("still served");
    // A freed slot serves a new connection (the server sees the close asynchronously).
    drop(idle.pop());
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        match client(&path).await.status().await {
            Ok(_) => break,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("a freed slot is not served again: {e}"),
        }
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_a_call_in_flight_keeps_its_connection() {
    let limits = Limits {
        idle_timeout: Some(Duration::from_millis(200)),
        ..Limits::default()
    };
    let (_dir, path, engine, server) = start(limits).await;
    // A connection that sends nothing is closed by the server: the read ends (EOF).
    let mut silent = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut sink = Vec::new();
    tokio::time::timeout(HANG_GUARD, silent.read_to_end(&mut sink))
        .await
        .expect("the idle connection was closed")
        .unwrap();
    assert!(sink.is_empty());
    // A call that takes several idle periods is answered on its connection.
    engine.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let busy = client(&path).await;
    let call = tokio::spawn(async move { busy.status().await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    engine.release.notify_one();
    let answer = tokio::time::timeout(HANG_GUARD, call)
        .await
        .unwrap()
        .unwrap();
    answer.expect("answered on the connection it came on");
    server.shutdown().await.unwrap();
}

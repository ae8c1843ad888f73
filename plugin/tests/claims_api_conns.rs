//! Connections to the claims API (issue 27, item 4; issue 39, item 6): past the connection cap a
//! new connection takes the place of one with no call in flight, and is refused with
//! RESOURCE_EXHAUSTED naming the setting only while every connection has a call in flight; a
//! flood of idle connections never keeps a new client out and is logged in a line; a connection
//! idle past the timeout, or silent past the first-request timeout, is closed, while one whose
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
    /// Status calls that reached the engine.
    entered: std::sync::atomic::AtomicUsize,
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
        let released = self.release.notified();
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.hold.load(std::sync::atomic::Ordering::SeqCst) {
            released.await;
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

/// Log text written while the guard lives (this thread's tasks: the tests run on one thread).
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

async fn client(path: &Path) -> ClaimsClient {
    ClaimsClient::connect(path)
        .await
        .unwrap()
        .with_timeout(HANG_GUARD)
}

#[tokio::test]
async fn past_the_cap_a_peer_is_refused_only_while_every_connection_has_a_call_in_flight() {
    let limits = Limits {
        max_connections: 4,
        ..Limits::default()
    };
    let (_dir, path, engine, server) = start(limits).await;
    // Four connections, each with a call held in the engine.
    engine.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut calls = Vec::new();
    for _ in 0..4 {
        let busy = client(&path).await;
        calls.push(tokio::spawn(async move { busy.status().await }));
    }
    while engine.entered.load(std::sync::atomic::Ordering::SeqCst) < 4 {
        tokio::task::yield_now().await;
    }
    // The fifth (and more) are refused with a status that names the setting.
    for _ in 0..3 {
        let excess = client(&path).await;
        let err = excess.status().await.expect_err("over the cap");
        assert_eq!(err.code(), ttrpc::Code::RESOURCE_EXHAUSTED, "{err}");
        let text = err.to_string();
        assert!(text.contains("claims_api.max_connections"), "{text}");
        assert!(text.contains("4 connections"), "{text}");
        assert!(text.contains("call in flight"), "{text}");
    }
    // The calls in flight are answered; then their connections sit idle, and a new peer takes
    // the place of one.
    engine
        .hold
        .store(false, std::sync::atomic::Ordering::SeqCst);
    engine.release.notify_waiters();
    for call in calls {
        tokio::time::timeout(HANG_GUARD, call)
            .await
            .unwrap()
            .unwrap()
            .expect("answered");
    }
    client(&path)
        .await
        .status()
        .await
        .expect("a new peer is served in an idle connection's place");
    server.shutdown().await.unwrap();
}

/// Issue 39 item 6: `max_connections` connections that never send anything, then a burst of
/// 100 more, never keep a new client out: each new connection takes the place of the oldest one
/// that sent no request. The flood is one line in the log, not a line per connection.
#[tokio::test]
async fn an_idle_flood_never_shuts_a_new_client_out_and_is_logged_in_a_line() {
    let (logs, _logging) = capture_logs();
    let limits = Limits {
        max_connections: 8,
        ..Limits::default()
    };
    let (_dir, path, _engine, server) = start(limits).await;
    // A client that called once and sits idle, then the flood.
    let early = client(&path).await;
    early.status().await.expect("served");
    let mut flood = Vec::new();
    for _ in 0..(8 + 100) {
        let s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        s.set_nonblocking(true).unwrap();
        flood.push(s);
    }
    // A new client is served, and so is the early one (its connection had sent requests: the
    // flood's connections, which never did, went first).
    let late = client(&path).await;
    late.status()
        .await
        .expect("a new client is served under the flood");
    early
        .status()
        .await
        .expect("the early client is still served");
    // Every connection of the flood but the 6 slots left for it was closed to make room (the
    // slot is freed with the socket, before the new connection is served).
    let closed = flood
        .iter()
        .filter(|s| matches!(std::io::Read::read(&mut &**s, &mut [0u8; 16]), Ok(0)))
        .count();
    assert_eq!(closed, flood.len() - 6);
    let text = logs.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("claims API connection"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("closed to admit a new peer"), "{text}");
    assert!(lines[0].contains("summed up every"), "{text}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_connection_that_sends_no_request_in_time_is_closed() {
    let limits = Limits {
        idle_timeout: None,
        first_request_timeout: Some(Duration::from_millis(100)),
        ..Limits::default()
    };
    let (_dir, path, _engine, server) = start(limits).await;
    let mut silent = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut sink = Vec::new();
    tokio::time::timeout(HANG_GUARD, silent.read_to_end(&mut sink))
        .await
        .expect("the silent connection was closed")
        .unwrap();
    assert!(sink.is_empty());
    // One that called is not held to it.
    let caller = client(&path).await;
    caller.status().await.expect("served");
    tokio::time::sleep(Duration::from_millis(300)).await;
    caller
        .status()
        .await
        .expect("still served on its connection");
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

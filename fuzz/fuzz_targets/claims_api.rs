//! The claims API server as a DRA driver or a CLI reaches it: a real `ClaimsServer` on a unix
//! socket in a temp dir, with a fake engine. Each input is one connection carrying either raw bytes
//! (the frame guard and ttrpc's reader) or well-framed ttrpc requests for Prepare, Unprepare, List
//! and Status with arbitrary message bytes (protobuf decode, UID and name checks, limits and the
//! conversion to domain types). Every well-framed request must get exactly one response.
#![no_main]

#[path = "common/ttrpc_wire.rs"]
mod ttrpc_wire;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use nri_accel::claims_api::{
    ClaimInfo, ClaimRef, ClaimService, ClaimSpec, ClaimState, ClaimsServer, DefaultPeerPolicy,
    Limits, PrepareResults, PreparedDevice, ServerOptions, UnprepareResults,
};
use nri_accel::gate::Gate;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const SERVICE: &str = "nriaccel.claims.v1.Claims";
const METHODS: [&str; 5] = ["Prepare", "Unprepare", "List", "Status", "Nope"];
/// A server that answers nothing within this time is hung: a finding.
const HANG: Duration = Duration::from_secs(10);

/// Grants one device per claim; leaves out claims whose UID ends in `0` (the API must answer them).
struct FakeEngine;

fn device(uid: &str) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpu".into()],
        pool: "node".into(),
        device: format!("gpu-{}", uid.len()),
        cdi_device_ids: vec![format!("accel.nri.io/device={uid}-0")],
        share_id: None,
    }
}

#[async_trait]
impl ClaimService for FakeEngine {
    async fn prepare(&self, claims: Vec<ClaimSpec>) -> PrepareResults {
        claims
            .into_iter()
            .filter(|c| !c.uid.ends_with('0'))
            .map(|c| {
                let d = device(&c.uid);
                (c.uid, Ok(vec![d]))
            })
            .collect()
    }
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims
            .into_iter()
            .filter(|c| !c.uid.ends_with('0'))
            .map(|c| (c.uid, Ok(())))
            .collect()
    }
    async fn list(&self) -> Vec<ClaimInfo> {
        vec![ClaimInfo {
            uid: "a1".into(),
            namespace: "ns".into(),
            name: "claim".into(),
            state: ClaimState::Prepared,
            devices: vec![device("a1")],
        }]
    }
    async fn status(&self, gate_open: bool) -> String {
        format!(r#"{{"devices": 1, "gate": {{"open": {gate_open}}}}}"#)
    }
}

struct Env {
    rt: tokio::runtime::Runtime,
    path: PathBuf,
    _dir: tempfile::TempDir,
    // In a Mutex only to make Env Sync (the server is never touched again).
    _server: std::sync::Mutex<ClaimsServer>,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("claims.sock");
        let gate = Gate::new();
        gate.open();
        let opts = ServerOptions {
            group: None,
            policy: Arc::new(DefaultPeerPolicy::for_daemon(None)),
            // Small limits so the fuzzer reaches them.
            limits: Limits {
                max_message_bytes: 64 * 1024,
                max_claims: 8,
                max_results_per_claim: 4,
                ..Limits::default()
            },
        };
        let server = rt
            .block_on(ClaimsServer::bind(&path, Arc::new(FakeEngine), gate, opts))
            .expect("bind the claims server");
        Env {
            rt,
            path,
            _dir: dir,
            _server: std::sync::Mutex::new(server),
        }
    })
}

async fn raw(path: &PathBuf, bytes: &[u8]) {
    let mut s = UnixStream::connect(path).await.expect("connect");
    // The server may close early on garbage; a write error is then expected.
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink).await;
}

async fn calls(path: &PathBuf, data: &[u8]) {
    let calls = ttrpc_wire::split_calls(data, 8);
    if calls.is_empty() {
        return;
    }
    let mut wire = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let method = METHODS[c.method as usize % METHODS.len()];
        ttrpc_wire::push_request(&mut wire, 2 * i as u32 + 1, SERVICE, method, c.payload);
    }
    let mut s = UnixStream::connect(path).await.expect("connect");
    s.write_all(&wire).await.expect("write requests");
    let mut reader = ttrpc_wire::Reader::default();
    let mut answered = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while answered < calls.len() {
        let n = s.read(&mut buf).await.expect("read responses");
        assert!(
            n > 0,
            "connection closed after {answered} of {} well-framed requests",
            calls.len()
        );
        for (id, ty, _) in reader.push(&buf[..n]) {
            assert_eq!(ty, ttrpc_wire::TYPE_RESPONSE);
            assert!(
                id % 2 == 1 && (id as usize) < 2 * calls.len(),
                "response for unknown stream {id}"
            );
            answered += 1;
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let env = env();
    env.rt.block_on(async {
        let work = async {
            if mode & 1 == 0 {
                calls(&env.path, rest).await
            } else {
                raw(&env.path, rest).await
            }
        };
        tokio::time::timeout(HANG, work)
            .await
            .expect("claims server hung");
    });
});

//! Hostile peers: garbage, truncated and oversized frames and messages. The stub must log an
//! error and close the connection, never panic, hang or allocate beyond the protocol limits.
//! And the fake runtime must refuse a plugin that breaks the 4096-byte frame rule.

mod common;

use common::*;
use fake_runtime::wire::{self, Request, Response};
use fake_runtime::{FakeRuntime, RuntimeConfig};
use nri_proto::api::Event;
use nri_proto::{EventMask, StubError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// Runs a stub against a raw peer that sends `bytes` right after accepting, then either closes
/// (`then_close`) or keeps the socket open; returns what `connect_once` returned.
async fn stub_against(bytes: Vec<u8>, then_close: bool) -> (Result<(), StubError>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let stub = stub(&path);
    let plugin = Recorder::new(EventMask::of(&[Event::CREATE_CONTAINER]));
    let s = stub.clone();
    let task = tokio::spawn(async move { s.connect_once(plugin).await });
    let (mut peer, _) = listener.accept().await.unwrap();
    peer.write_all(&bytes).await.unwrap();
    let mut got = Vec::new();
    if then_close {
        drop(peer);
    } else {
        // Keep the peer open: the stub itself must close the connection.
        tokio::time::timeout(HANG_GUARD, peer.read_to_end(&mut got))
            .await
            .expect("stub closes")
            .unwrap();
    }
    let r = tokio::time::timeout(HANG_GUARD, task)
        .await
        .expect("stub returns")
        .unwrap();
    (r, got)
}

fn frame_header(conn: u32, len: u32) -> Vec<u8> {
    let mut v = conn.to_be_bytes().to_vec();
    v.extend_from_slice(&len.to_be_bytes());
    v
}

#[tokio::test]
async fn oversized_frame_closes_the_connection() {
    let (r, _) = stub_against(frame_header(1, u32::MAX), false).await;
    let e = r.unwrap_err().to_string();
    assert!(e.contains("limit"), "{e}");
    // Just over 4 MiB + 10 as well.
    let (r, _) = stub_against(frame_header(1, 4 * 1024 * 1024 + 11), false).await;
    assert!(r.is_err());
}

#[tokio::test]
async fn truncated_frame_then_eof_ends_the_connection() {
    let mut bytes = frame_header(1, 100);
    bytes.extend_from_slice(&[0u8; 10]);
    let (r, _) = stub_against(bytes, true).await;
    assert!(r.is_err());
}

#[tokio::test]
async fn ttrpc_message_announcing_more_than_4_mib_closes_the_connection() {
    let mut msg = (0xFFFF_FF00u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&1u32.to_be_bytes());
    msg.extend_from_slice(&[1, 0]);
    let mut bytes = frame_header(1, msg.len() as u32);
    bytes.extend(msg);
    let (r, _) = stub_against(bytes, false).await;
    let e = r.unwrap_err().to_string();
    assert!(e.contains("4 MiB"), "{e}");
}

#[tokio::test]
async fn garbage_message_type_closes_the_connection() {
    let garbage = vec![0, 0, 0, 5, 0, 0, 0, 1, 9, 0, 1, 2, 3, 4, 5];
    let mut bytes = frame_header(1, garbage.len() as u32);
    bytes.extend(garbage);
    let (r, _) = stub_against(bytes, false).await;
    let e = r.unwrap_err().to_string();
    assert!(e.contains("unknown message type"), "{e}");
}

#[tokio::test]
async fn garbage_reply_to_register_plugin_fails_registration() {
    // A response on conn 2 for stream 1 (the RegisterPlugin call) whose body is not protobuf.
    let body = vec![0xff; 32];
    let bytes = wire::frame_message(2, 1, wire::TYPE_RESPONSE, &body);
    let (r, _) = stub_against(bytes, true).await;
    assert!(r.is_err());
}

#[tokio::test]
async fn frames_for_unknown_conns_are_dropped_and_garbage_payload_gets_an_error_status() {
    let dir = tempfile::tempdir().unwrap();
    let (stub, task, mut peer) = stub_with_raw_peer(dir.path()).await;
    let mut out = wire::frame(7, b"ignored");
    let req = Request {
        service: "nri.pkg.api.v1alpha1.Plugin".into(),
        method: "CreateContainer".into(),
        payload: vec![0xff, 0xff, 0xff],
        timeout_nano: 0,
    };
    out.extend(wire::frame_message(1, 1, wire::TYPE_REQUEST, &req.encode()));
    peer.write_all(&out).await.unwrap();
    // Read frames until the response on conn 1 arrives (conn 2 carries RegisterPlugin).
    let resp = tokio::time::timeout(HANG_GUARD, async {
        let mut acc = Vec::new();
        loop {
            let mut h = [0u8; 8];
            peer.read_exact(&mut h).await.unwrap();
            let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
            assert!(len <= 4096, "stub wrote a {len}-byte frame");
            let mut p = vec![0u8; len];
            peer.read_exact(&mut p).await.unwrap();
            if u32::from_be_bytes([h[0], h[1], h[2], h[3]]) == 1 {
                acc.extend(p);
                if acc.len() >= 10 {
                    let blen = u32::from_be_bytes([acc[0], acc[1], acc[2], acc[3]]) as usize;
                    if acc.len() >= 10 + blen {
                        return Response::decode(&acc[10..10 + blen]).unwrap();
                    }
                }
            }
        }
    })
    .await
    .unwrap();
    assert_ne!(resp.code, 0, "garbage request must get an error status");
    let _ = close_and_join(&stub, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_drops_a_plugin_that_breaks_the_frame_rule() {
    let rt = FakeRuntime::new(RuntimeConfig::default());
    let theirs = rt.socketpair().unwrap();
    theirs.set_nonblocking(true).unwrap();
    let mut plugin_side = UnixStream::from_std(theirs).unwrap();
    // A RegisterPlugin request with a long name, written as one 5000-byte frame (header + body):
    // Go's 4096-byte buffered reader cannot take it.
    let mut reg = nri_proto::api::RegisterPluginRequest::new();
    reg.plugin_name = "x".repeat(4900);
    reg.plugin_idx = "10".into();
    let req = Request {
        service: "nri.pkg.api.v1alpha1.Runtime".into(),
        method: "RegisterPlugin".into(),
        payload: nri_proto::protobuf::Message::write_to_bytes(&reg).unwrap(),
        timeout_nano: 0,
    };
    let body = req.encode();
    let mut msg = (body.len() as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&1u32.to_be_bytes());
    msg.extend_from_slice(&[1, 0]);
    msg.extend(body);
    assert!(msg.len() > 4096);
    plugin_side.write_all(&wire::frame(2, &msg)).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(HANG_GUARD, plugin_side.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let errors = rt.errors();
    assert!(errors.iter().any(|e| e.contains("ENOMEM")), "{errors:?}");
}

/// Reads frames from `s` until one whole ttrpc message has arrived on `conn`; returns its stream
/// id and body.
async fn read_message_on(s: &mut UnixStream, conn: u32) -> (u32, Vec<u8>) {
    let mut acc = Vec::new();
    loop {
        let mut h = [0u8; 8];
        s.read_exact(&mut h).await.unwrap();
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).await.unwrap();
        if u32::from_be_bytes([h[0], h[1], h[2], h[3]]) != conn {
            continue;
        }
        acc.extend(p);
        if acc.len() >= 10 {
            let blen = u32::from_be_bytes([acc[0], acc[1], acc[2], acc[3]]) as usize;
            if acc.len() >= 10 + blen {
                let sid = u32::from_be_bytes([acc[4], acc[5], acc[6], acc[7]]);
                return (sid, acc[10..10 + blen].to_vec());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_refuses_events_its_nri_version_does_not_know() {
    use nri_proto::protobuf::Message;
    let rt = FakeRuntime::new(RuntimeConfig {
        nri_version: "v0.8.0".into(),
        ..Default::default()
    });
    let theirs = rt.socketpair().unwrap();
    theirs.set_nonblocking(true).unwrap();
    let mut plugin_side = UnixStream::from_std(theirs).unwrap();
    let mut reg = nri_proto::api::RegisterPluginRequest::new();
    reg.plugin_name = "raw".into();
    reg.plugin_idx = "10".into();
    let req = Request {
        service: "nri.pkg.api.v1alpha1.Runtime".into(),
        method: "RegisterPlugin".into(),
        payload: reg.write_to_bytes().unwrap(),
        timeout_nano: 0,
    };
    plugin_side
        .write_all(&wire::frame_message(
            2,
            1,
            wire::TYPE_REQUEST,
            &req.encode(),
        ))
        .await
        .unwrap();
    let (sid, body) = tokio::time::timeout(HANG_GUARD, read_message_on(&mut plugin_side, 1))
        .await
        .unwrap();
    let configure = Request::decode(&body).unwrap();
    assert_eq!(configure.method, "Configure");
    let creq = nri_proto::api::ConfigureRequest::parse_from_bytes(&configure.payload).unwrap();
    assert_eq!(creq.NRI_version, "v0.8.0");
    // Subscribe to UPDATE_POD_SANDBOX (bit 11), unknown before v0.10.
    let mut cresp = nri_proto::api::ConfigureResponse::new();
    cresp.events = 1 << 11;
    let resp = Response {
        code: 0,
        message: String::new(),
        payload: cresp.write_to_bytes().unwrap(),
    };
    plugin_side
        .write_all(&wire::frame_message(
            1,
            sid,
            wire::TYPE_RESPONSE,
            &resp.encode(),
        ))
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(HANG_GUARD, plugin_side.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let errors = rt.errors();
    assert!(
        errors.iter().any(|e| e.contains("outside the valid mask")),
        "{errors:?}"
    );
    assert!(rt.plugin().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_cuts_off_a_plugin_that_never_registers() {
    let cfg = RuntimeConfig {
        registration_timeout: std::time::Duration::from_millis(100),
        ..Default::default()
    };
    let rt = FakeRuntime::new(cfg);
    let theirs = rt.socketpair().unwrap();
    theirs.set_nonblocking(true).unwrap();
    let mut silent = UnixStream::from_std(theirs).unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(HANG_GUARD, silent.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let errors = rt.errors();
    assert!(
        errors.iter().any(|e| e.contains("did not register")),
        "{errors:?}"
    );
}

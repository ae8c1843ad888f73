//! The stub's ttrpc server as the runtime sees it: requests in flight at once are served at once,
//! names it does not serve answer Unimplemented, bad envelopes get an error status, and a handler
//! running when the runtime goes away is allowed to finish.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use fake_runtime::FakeRuntime;
use fake_runtime::fixtures::{container, node_state, pod};
use fake_runtime::wire::{self, Request, Response};
use nri_proto::api::*;
use nri_proto::protobuf::{Message, MessageField};
use nri_proto::{EventMask, Plugin, PluginError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::Notify;

const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// UpdateContainer waits until a CreateContainer has been handled; CreateContainer can take a
/// while and records that it finished.
#[derive(Default)]
struct Gated {
    created: Notify,
    create_delay: Option<Duration>,
    create_done: AtomicBool,
}

#[async_trait]
impl Plugin for Gated {
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER, Event::UPDATE_CONTAINER])
    }

    async fn create_container(
        &self,
        _pod: &PodSandbox,
        _c: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        if let Some(d) = self.create_delay {
            tokio::time::sleep(d).await;
        }
        self.create_done.store(true, Ordering::SeqCst);
        self.created.notify_one();
        Ok((ContainerAdjustment::new(), Vec::new()))
    }

    async fn update_container(
        &self,
        _pod: &PodSandbox,
        _c: &Container,
        _r: Option<&LinuxResources>,
    ) -> Result<(Vec<ContainerUpdate>, Vec<ContainerEviction>), PluginError> {
        self.created.notified().await;
        Ok((Vec::new(), Vec::new()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_does_not_hold_up_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let rt = FakeRuntime::start(&path).await.unwrap();
    let (stub, task) = spawn_stub(&path, Arc::new(Gated::default()));
    rt.wait_synchronized(1, HANG_GUARD).await.unwrap();

    // UpdateContainer goes first and can only finish once the CreateContainer sent after it has
    // been handled: served one at a time, the pair would miss the 2 s request timeout.
    let pd = pod(0);
    let (c1, c2) = (container(1, &pd, 0), container(2, &pd, 0));
    let update = rt.update_container(&pd, &c1, None);
    let create = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        rt.create_container(&pd, &c2).await
    };
    let (u, c) = tokio::join!(update, create);
    u.expect("UpdateContainer answered");
    c.expect("CreateContainer answered");
    assert!(rt.errors().is_empty(), "{:?}", rt.errors());
    close_and_join(&stub, task).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_running_when_the_runtime_goes_away_is_let_finish() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let rt = FakeRuntime::start(&path).await.unwrap();
    let (pods, containers) = node_state(1, 1);
    pods.into_iter().for_each(|p| rt.add_pod(p));
    containers.into_iter().for_each(|c| rt.add_container(c));
    let plugin = Arc::new(Gated {
        create_delay: Some(Duration::from_millis(300)),
        ..Gated::default()
    });
    let (stub, task) = spawn_stub(&path, plugin.clone());
    rt.wait_synchronized(1, HANG_GUARD).await.unwrap();

    let pd = pod(0);
    let c = container(7, &pd, 0);
    let call = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.create_container(&pd, &c).await })
    };
    // The runtime goes away while the handler sleeps.
    tokio::time::sleep(Duration::from_millis(50)).await;
    rt.stop().await;
    assert!(call.await.unwrap().is_err(), "the runtime gets no answer");
    close_and_join(&stub, task).await.unwrap();
    assert!(
        plugin.create_done.load(Ordering::SeqCst),
        "the stub returned before the running handler finished"
    );
}

/// Writes `requests` on conn 1 of a stub's connection and returns the responses by stream id,
/// in the order they arrived.
async fn raw_exchange(requests: Vec<(u32, Vec<u8>)>) -> Vec<(u32, Response)> {
    let n = requests.len();
    let wire: Vec<u8> = requests
        .into_iter()
        .flat_map(|(sid, body)| wire::frame_message(1, sid, wire::TYPE_REQUEST, &body))
        .collect();
    raw_exchange_bytes(wire, n).await
}

/// Writes `socket_bytes` to a stub's connection and returns the first `n` responses on conn 1.
async fn raw_exchange_bytes(socket_bytes: Vec<u8>, n: usize) -> Vec<(u32, Response)> {
    let dir = tempfile::tempdir().unwrap();
    let (stub, task, mut peer) = stub_with_raw_peer(dir.path()).await;
    peer.write_all(&socket_bytes).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(HANG_GUARD, async {
        let mut acc = Vec::new();
        while got.len() < n {
            let (conn, p) = read_frame(&mut peer).await;
            if conn != 1 {
                continue;
            }
            acc.extend(p);
            while acc.len() >= 10 {
                let blen = u32::from_be_bytes([acc[0], acc[1], acc[2], acc[3]]) as usize;
                if acc.len() < 10 + blen {
                    break;
                }
                let sid = u32::from_be_bytes([acc[4], acc[5], acc[6], acc[7]]);
                assert_eq!(acc[8], wire::TYPE_RESPONSE);
                got.push((sid, Response::decode(&acc[10..10 + blen]).unwrap()));
                acc.drain(..10 + blen);
            }
        }
    })
    .await
    .expect("every request answered");
    // The peer never answered RegisterPlugin, so how the stub ends does not matter here.
    let _ = close_and_join(&stub, task).await;
    got
}

async fn read_frame(s: &mut UnixStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).await.unwrap();
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    assert!(len <= 4096, "stub wrote a {len}-byte frame");
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).await.unwrap();
    (u32::from_be_bytes([h[0], h[1], h[2], h[3]]), p)
}

fn request(service: &str, method: &str, payload: Vec<u8>) -> Vec<u8> {
    Request {
        service: service.into(),
        method: method.into(),
        payload,
        timeout_nano: 0,
    }
    .encode()
}

#[tokio::test]
async fn unknown_names_answer_unimplemented_and_bad_envelopes_an_error() {
    let got = raw_exchange(vec![
        (1, request(PLUGIN_SERVICE, "NoSuchMethod", Vec::new())),
        (
            3,
            request("nri.pkg.api.v1alpha1.Elsewhere", "Configure", Vec::new()),
        ),
        // A request envelope whose method name is not UTF-8.
        (5, vec![18, 2, 0xff, 0xfe]),
        // Even stream ids belong to the server side and are refused.
        (6, request(PLUGIN_SERVICE, "Shutdown", Vec::new())),
        (7, request(PLUGIN_SERVICE, "Shutdown", Vec::new())),
    ])
    .await;
    let code = |sid| {
        got.iter()
            .find(|(s, _)| *s == sid)
            .map(|(_, r)| r.code)
            .unwrap_or_else(|| panic!("no answer for stream {sid}: {got:?}"))
    };
    assert_eq!(code(1), 12, "unknown method");
    assert_eq!(code(3), 12, "unknown service");
    assert_eq!(code(5), 3, "bad envelope: InvalidArgument");
    assert_eq!(code(6), 3, "even stream id: InvalidArgument");
    assert_eq!(code(7), 0, "Shutdown is served");
}

/// A ttrpc message (header and body) as the bytes of a conn.
fn message(sid: u32, body: &[u8]) -> Vec<u8> {
    let mut m = (body.len() as u32).to_be_bytes().to_vec();
    m.extend_from_slice(&sid.to_be_bytes());
    m.extend_from_slice(&[wire::TYPE_REQUEST, 0]);
    m.extend_from_slice(body);
    m
}

#[tokio::test]
async fn messages_packed_into_or_split_across_frames_are_all_answered() {
    // A message alone in its frame is taken without copying; everything else is read as a byte
    // stream. Mix the two and come back: every request must be answered once, in full.
    let create = |n| {
        let pd = pod(0);
        let mut req = CreateContainerRequest::new();
        req.container = MessageField::some(container(n, &pd, 40));
        req.pod = MessageField::some(pd);
        request(
            PLUGIN_SERVICE,
            "CreateContainer",
            req.write_to_bytes().unwrap(),
        )
    };
    let (m1, m3, m5, m7, m9) = (
        message(1, &create(1)),
        message(3, &create(3)),
        message(5, &create(5)),
        message(7, &create(7)),
        message(9, &create(9)),
    );
    let frames: Vec<Vec<u8>> = vec![
        [m1.clone(), m3.clone()].concat(),
        m5[..7].to_vec(),
        [&m5[7..], &m7[..m7.len() / 2]].concat(),
        m7[m7.len() / 2..].to_vec(),
        m9.clone(),
    ];
    let socket_bytes: Vec<u8> = frames.iter().flat_map(|f| wire::frame(1, f)).collect();
    let got = raw_exchange_bytes(socket_bytes, 5).await;
    let mut sids: Vec<u32> = got.iter().map(|(s, _)| *s).collect();
    sids.sort();
    assert_eq!(sids, vec![1, 3, 5, 7, 9], "{got:?}");
    for (sid, resp) in &got {
        assert_eq!(resp.code, 0, "stream {sid}: {resp:?}");
        let answer = CreateContainerResponse::parse_from_bytes(&resp.payload);
        assert!(answer.unwrap().adjust.is_some(), "stream {sid}");
    }
}

/// CreateContainer panics for container 13 and takes a while for every other one.
struct Panicky;

#[async_trait]
impl Plugin for Panicky {
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER])
    }

    async fn create_container(
        &self,
        _pod: &PodSandbox,
        c: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        if c.id == "ctr-000013" {
            panic!("container 13 is unlucky");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok((ContainerAdjustment::new(), Vec::new()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_answers_only_its_own_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let rt = FakeRuntime::start(&path).await.unwrap();
    let (stub, task) = spawn_stub(&path, Arc::new(Panicky));
    rt.wait_synchronized(1, HANG_GUARD).await.unwrap();

    // The healthy request is in flight (it sleeps) when its sibling panics.
    let pd = pod(0);
    let (healthy, unlucky) = (container(12, &pd, 0), container(13, &pd, 0));
    let first = rt.create_container(&pd, &healthy);
    let second = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        rt.create_container(&pd, &unlucky).await
    };
    let (first, second) = tokio::join!(first, second);
    first.expect("the healthy sibling is answered");
    match second {
        Err(fake_runtime::FakeError::Status { code, message, .. }) => {
            assert_eq!(code, 13, "INTERNAL: {message}");
            assert!(
                message.contains("CreateContainer") && message.contains("unlucky"),
                "{message}"
            );
        }
        other => panic!("the panicking request got {other:?}"),
    }
    // The connection goes on: still registered, and the next request is served.
    assert!(rt.plugin().is_some());
    rt.create_container(&pd, &container(14, &pd, 0))
        .await
        .expect("served after the panic");
    assert!(rt.errors().is_empty(), "{:?}", rt.errors());
    close_and_join(&stub, task).await.unwrap();
}

/// Pushes an update from inside CreateContainer and waits for it: what must never be done.
struct UpdatesInsideHandler {
    updater: std::sync::Mutex<Option<nri_proto::Updater>>,
}

#[async_trait]
impl Plugin for UpdatesInsideHandler {
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER])
    }

    async fn create_container(
        &self,
        _pod: &PodSandbox,
        c: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        let updater = self.updater.lock().unwrap().clone().expect("updater set");
        let mut u = ContainerUpdate::new();
        u.container_id = c.id.clone();
        updater
            .update_containers(vec![u], Vec::new())
            .await
            .map_err(|e| PluginError::failed(e.to_string()))?;
        Ok((ContainerAdjustment::new(), Vec::new()))
    }
}

/// The fake runtime's model of NRI before v0.12.1 can fail a plugin: one that waits for its own
/// UpdateContainers inside a handler is dropped at the deadline; on a runtime without the lock
/// the same plugin is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_awaited_inside_a_handler_gets_the_plugin_dropped_by_an_older_runtime() {
    for older in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let cfg = fake_runtime::RuntimeConfig {
            request_timeout: Duration::from_millis(500),
            updates_wait_for_events: older,
            ..Default::default()
        };
        let rt = FakeRuntime::start_with(&path, cfg).await.unwrap();
        let plugin = Arc::new(UpdatesInsideHandler {
            updater: std::sync::Mutex::new(None),
        });
        let (stub, task) = spawn_stub(&path, plugin.clone());
        *plugin.updater.lock().unwrap() = Some(stub.updater());
        rt.wait_synchronized(1, HANG_GUARD).await.unwrap();
        let pd = pod(0);
        let r = rt.create_container(&pd, &container(1, &pd, 0)).await;
        if older {
            assert!(
                matches!(r, Err(fake_runtime::FakeError::Timeout(_))),
                "older runtime: {r:?}"
            );
            assert!(rt.plugin().is_none(), "the plugin was dropped");
            assert!(rt.updates().is_empty(), "the update waited for the event");
        } else {
            r.expect("a runtime without the lock answers");
            assert_eq!(rt.updates().len(), 1);
            assert_eq!(rt.updates_held(), 0);
        }
        let _ = close_and_join(&stub, task).await;
    }
}

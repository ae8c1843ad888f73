//! The stub against the fake runtime over real unix sockets: registration, Configure, Synchronize
//! (socket and fd-3 mode), paging, large messages, StateChange fallback and reconnects.

mod common;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use fake_runtime::fixtures::{container, node_state, pod};
use fake_runtime::{FakeRuntime, RuntimeConfig};
use nri_proto::api::*;
use nri_proto::protobuf::MessageField;
use nri_proto::{EventMask, Stub, StubEvent};

fn mask() -> EventMask {
    EventMask::of(&[
        Event::CREATE_CONTAINER,
        Event::POST_START_CONTAINER,
        Event::UPDATE_POD_SANDBOX,
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_mode_registers_configures_and_synchronizes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let rt = FakeRuntime::start(&path).await.unwrap();
    let (pods, containers) = node_state(12, 10);
    pods.into_iter().for_each(|p| rt.add_pod(p));
    containers.into_iter().for_each(|c| rt.add_container(c));

    let plugin = Recorder::new(mask());
    let stub = stub(&path);
    let s = stub.clone();
    let p = plugin.clone();
    let task = tokio::spawn(async move { s.connect_once(p).await });

    let info = rt.wait_synchronized(1, HANG_GUARD).await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.index.as_str()),
        ("recorder", "10")
    );
    assert_eq!(info.nri_version, nri_proto::NRI_VERSION);
    assert_eq!(info.events, mask().bits());
    {
        let seen = plugin.seen();
        assert_eq!(seen.configure.len(), 1);
        assert_eq!(seen.configure[0].runtime_name, "fake-runtime");
        assert_eq!(seen.configure[0].request_timeout, 2000);
        assert_eq!(seen.syncs, vec![(4, 12)]);
    }
    assert_eq!(rt.sync_chunks(), vec![1]);
    assert_eq!(rt.sync_updates()[0].container_id, "ctr-000011");
    close_and_join(&stub, task).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_runtime_gets_only_events_it_knows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let cfg = RuntimeConfig {
        nri_version: "v0.8.0".into(),
        ..Default::default()
    };
    let rt = FakeRuntime::start_with(&path, cfg).await.unwrap();
    let plugin = Recorder::new(mask());
    let stub = stub(&path);
    let s = stub.clone();
    tokio::spawn(async move { s.connect_once(plugin).await });
    let info = rt.wait_synchronized(1, HANG_GUARD).await.unwrap();
    // UPDATE_POD_SANDBOX (bit 11) is unknown before v0.10 and must not be subscribed.
    assert_eq!(
        info.events,
        mask().intersect(nri_proto::MASK_PRE_V0_10).bits()
    );
    assert_eq!(info.events & !0x7FF, 0);
    assert!(rt.errors().is_empty(), "{:?}", rt.errors());
    stub.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd3_mode_child_process_registers_and_synchronizes() {
    let rt = FakeRuntime::new(RuntimeConfig::default());
    let p = pod(1);
    rt.add_pod(p.clone());
    rt.add_container(container(7, &p, 0));
    let theirs = rt.socketpair().unwrap();
    let mut child = fake_runtime::launch::spawn_with_fd3(
        env!("CARGO_BIN_EXE_nri-test-plugin"),
        theirs.as_raw_fd(),
        &[("NRI_PLUGIN_NAME", "testfd"), ("NRI_PLUGIN_IDX", "20")],
    )
    .unwrap();
    drop(theirs);

    let info = rt.wait_synchronized(1, HANG_GUARD).await.unwrap();
    assert_eq!((info.name.as_str(), info.index.as_str()), ("testfd", "20"));
    assert_eq!(rt.sync_updates()[0].container_id, "ctr-000007");
    let resp = rt.create_container(&p, &container(8, &p, 0)).await.unwrap();
    assert_eq!(resp.adjust.env[0].value, "ctr-000008");

    // The runtime goes away: a launched plugin cannot reconnect and exits.
    rt.stop().await;
    let status = tokio::time::timeout(HANG_GUARD, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.code().is_some(),
        "child ended by a signal: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronize_of_10000_containers_is_paged_with_updates_on_the_last_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let rt = FakeRuntime::start(&path).await.unwrap();
    // ~600 bytes each: 10,000 containers exceed the 4 MiB ttrpc limit and force paging.
    let (pods, containers) = node_state(10_000, 500);
    pods.into_iter().for_each(|p| rt.add_pod(p));
    containers.into_iter().for_each(|c| rt.add_container(c));

    let plugin = Recorder::new(mask());
    let stub = stub(&path);
    let s = stub.clone();
    let p = plugin.clone();
    tokio::spawn(async move { s.connect_once(p).await });
    rt.wait_synchronized(1, HANG_GUARD).await.unwrap();

    let chunks = rt.sync_chunks();
    assert!(
        chunks[0] > 1,
        "expected a paged Synchronize, got {chunks:?}"
    );
    // The plugin saw everything once, reassembled.
    assert_eq!(plugin.seen().syncs, vec![(2_501, 10_000)]);
    assert_eq!(rt.sync_updates().len(), 1);
    assert_eq!(rt.sync_updates()[0].container_id, "ctr-009999");
    // Told once the whole Synchronize was freed, once per Synchronize (not per page).
    wait_until(|| plugin.seen().syncs_freed == 1).await;
    rt.resynchronize().await.unwrap();
    wait_until(|| plugin.seen().syncs_freed == 2).await;
    assert_eq!(plugin.seen().syncs.len(), 2);
    stub.close();
}

/// Polls `done` until it holds (a hang guard, not a timing assertion).
async fn wait_until(done: impl Fn() -> bool) {
    tokio::time::timeout(HANG_GUARD, async {
        while !done() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("waited too long");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjustment_and_update_over_4096_bytes_arrive_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    // The stub's UpdateContainers on the wire, against a runtime that takes pushes.
    let cfg = RuntimeConfig {
        nri_version: "v0.12.1".into(),
        ..RuntimeConfig::default()
    };
    let rt = FakeRuntime::start_with(&path, cfg).await.unwrap();
    let mut plugin = Recorder::new(mask());
    Arc::get_mut(&mut plugin).unwrap().adjust_bytes = 50_000;
    let stub = stub(&path);
    let s = stub.clone();
    let p = plugin.clone();
    tokio::spawn(async move { s.connect_once(p).await });
    rt.wait_synchronized(1, HANG_GUARD).await.unwrap();

    let pd = pod(3);
    let resp = rt
        .create_container(&pd, &container(30, &pd, 9_000))
        .await
        .unwrap();
    assert_eq!(*resp.adjust, big_adjustment(50_000));
    assert_eq!(
        rt.adjustments(),
        vec![("ctr-000030".to_string(), big_adjustment(50_000))]
    );

    let mut update = ContainerUpdate::new();
    update.container_id = "ctr-000030".into();
    let mut res = LinuxResources::new();
    res.unified.insert("memory.high".into(), "9".repeat(20_000));
    let mut lu = LinuxContainerUpdate::new();
    lu.resources = MessageField::some(res);
    update.linux = MessageField::some(lu);
    let failed = stub
        .updater()
        .update_containers(vec![update.clone()], vec![])
        .await
        .unwrap();
    assert!(failed.is_empty());
    let got = rt.updates();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].update, vec![update.clone()]);

    // A runtime that reports failures: the caller gets the failed updates back.
    rt.fail_next_updates(1);
    let failed = stub
        .updater()
        .update_containers(vec![update.clone()], vec![])
        .await
        .unwrap();
    assert_eq!(failed, vec![update]);
    assert!(rt.errors().is_empty(), "{:?}", rt.errors());
    stub.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_event_reaches_the_plugin_through_state_change() {
    for version in ["v0.12.0", "v0.8.0"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let cfg = RuntimeConfig {
            nri_version: version.into(),
            ..Default::default()
        };
        let rt = FakeRuntime::start_with(&path, cfg).await.unwrap();
        let plugin = Recorder::new(mask());
        let stub = stub(&path);
        let s = stub.clone();
        let p = plugin.clone();
        tokio::spawn(async move { s.connect_once(p).await });
        rt.wait_synchronized(1, HANG_GUARD).await.unwrap();

        let pd = pod(1);
        let used_state_change = rt
            .notify(
                Event::POST_START_CONTAINER,
                &pd,
                Some(&container(1, &pd, 0)),
            )
            .await
            .unwrap();
        assert!(used_state_change, "{version}");
        assert_eq!(
            plugin.seen().state_changes,
            vec![Event::POST_START_CONTAINER],
            "{version}"
        );
        stub.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implemented_notification_uses_the_dedicated_rpc_or_state_change() {
    for (version, via_state_change) in [("v0.12.0", false), ("v0.8.0", true)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let cfg = RuntimeConfig {
            nri_version: version.into(),
            ..Default::default()
        };
        let rt = FakeRuntime::start_with(&path, cfg).await.unwrap();
        let mut plugin = Recorder::new(mask());
        Arc::get_mut(&mut plugin).unwrap().handle_post_start = true;
        let stub = stub(&path);
        let s = stub.clone();
        let p = plugin.clone();
        tokio::spawn(async move { s.connect_once(p).await });
        rt.wait_synchronized(1, HANG_GUARD).await.unwrap();
        let pd = pod(1);
        let used = rt
            .notify(
                Event::POST_START_CONTAINER,
                &pd,
                Some(&container(5, &pd, 0)),
            )
            .await
            .unwrap();
        assert_eq!(used, via_state_change, "{version}");
        assert_eq!(
            plugin.seen().post_starts,
            vec!["ctr-000005".to_string()],
            "{version}"
        );
        assert!(plugin.seen().state_changes.is_empty());
        stub.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_restart_makes_the_stub_reconnect_and_resynchronize() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let rt = FakeRuntime::start(&path).await.unwrap();
    let plugin = Recorder::new(mask());
    let stub = stub(&path);
    let mut events = stub.subscribe();
    let s = stub.clone();
    let p = plugin.clone();
    let run = tokio::spawn(async move { s.run(p).await });
    rt.wait_synchronized(1, HANG_GUARD).await.unwrap();
    wait_event(&mut events, |e| matches!(e, StubEvent::Synchronized { .. })).await;

    let pd = pod(2);
    rt.add_pod(pd.clone());
    rt.add_container(container(40, &pd, 0));
    rt.restart().await.unwrap();
    wait_event(
        &mut events,
        |e| matches!(e, StubEvent::Disconnected { registered, .. } if *registered),
    )
    .await;
    rt.wait_synchronized(2, HANG_GUARD).await.unwrap();
    let e = wait_event(&mut events, |e| matches!(e, StubEvent::Synchronized { .. })).await;
    assert_eq!(
        e,
        StubEvent::Synchronized {
            pods: 1,
            containers: 1
        }
    );
    assert_eq!(plugin.seen().syncs, vec![(0, 0), (1, 1)]);
    // The updater follows the new connection.
    stub.updater()
        .update_containers(vec![ContainerUpdate::new()], vec![])
        .await
        .unwrap();
    assert_eq!(rt.updates().len(), 1);

    stub.close();
    tokio::time::timeout(HANG_GUARD, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[test]
fn builder_validates_name_and_index() {
    let b = || nri_proto::Stub::builder().socket("/nonexistent");
    assert!(b().name("accel").index("10").build().is_ok());
    assert!(matches!(
        b().name("bad name").index("10").build(),
        Err(nri_proto::StubError::InvalidName(_))
    ));
    assert!(matches!(
        b().name("accel").index("1").build(),
        Err(nri_proto::StubError::InvalidIndex(_))
    ));
    assert!(matches!(
        b().name("accel").index("1a").build(),
        Err(nri_proto::StubError::InvalidIndex(_))
    ));
    assert!(matches!(
        nri_proto::Stub::builder().name("a").index("10").build(),
        Err(nri_proto::StubError::NoSocket)
    ));
}

/// Sleeps far past the runtime's request timeout in CreateContainer.
struct Slow;

#[async_trait::async_trait]
impl nri_proto::Plugin for Slow {
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER])
    }

    async fn create_container(
        &self,
        _pod: &PodSandbox,
        _c: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), nri_proto::PluginError> {
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        Ok((ContainerAdjustment::new(), Vec::new()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_missing_the_request_timeout_is_dropped_and_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let cfg = RuntimeConfig {
        request_timeout: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    let rt = FakeRuntime::start_with(&path, cfg).await.unwrap();
    let stub = stub(&path);
    let mut events = stub.subscribe();
    let s = stub.clone();
    let run = tokio::spawn(async move { s.run(Arc::new(Slow)).await });
    rt.wait_synchronized(1, HANG_GUARD).await.unwrap();

    let pd = pod(1);
    let r = rt.create_container(&pd, &container(1, &pd, 0)).await;
    assert_eq!(
        r.unwrap_err(),
        fake_runtime::FakeError::Timeout("CreateContainer".into())
    );
    assert!(
        rt.errors().iter().any(|e| e.contains("timed out")),
        "{:?}",
        rt.errors()
    );
    // The stub notices the dropped connection and registers again.
    wait_event(&mut events, |e| matches!(e, StubEvent::Disconnected { .. })).await;
    rt.wait_synchronized(2, HANG_GUARD).await.unwrap();
    stub.close();
    tokio::time::timeout(HANG_GUARD, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Log lines written by the thread's default subscriber, for a test on a current-thread runtime.
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A runtime that accepts the socket but never answers (issue 39 item 8): every attempt ends at
/// RegisterPlugin's deadline and is retried. The stub says so once, in words (not ttrpc's
/// "Request deadline elapsed"), and each ended attempt is reported as never registered, so a
/// daemon does not call it a lost connection.
#[tokio::test]
async fn a_runtime_that_never_answers_is_reported_once_not_per_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(conn);
        }
    });
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let stub = Arc::new(
        Stub::builder()
            .name("recorder")
            .index("10")
            .socket(&path)
            .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(20))
            .call_timeout(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    let mut events = stub.subscribe();
    let s = stub.clone();
    let run = tokio::spawn(async move { s.run(Recorder::new(mask())).await });
    for _ in 0..4 {
        let e = wait_event(&mut events, |e| matches!(e, StubEvent::Disconnected { .. })).await;
        assert!(
            matches!(
                e,
                StubEvent::Disconnected {
                    registered: false,
                    ..
                }
            ),
            "{e:?}"
        );
    }
    stub.close();
    tokio::time::timeout(HANG_GUARD, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    silent.abort();
    assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) >= 4);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one line for one state, not one per attempt:\n{text}"
    );
    assert!(
        warnings[0].contains("cannot register with the runtime")
            && warnings[0].contains("RegisterPlugin")
            && warnings[0].contains("gave no answer before the call's deadline"),
        "{text}"
    );
    assert!(!text.contains("Request deadline elapsed"), "{text}");
}

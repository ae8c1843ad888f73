//! Helpers shared by the NRI protocol tests: a recording plugin and a stub runner.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use nri_proto::api::*;
use nri_proto::{EventMask, Plugin, PluginError, Stub, StubError, StubEvent};
use tokio::task::JoinHandle;

/// Generous guard against hangs (not a timing assertion).
pub const HANG_GUARD: Duration = Duration::from_secs(30);

/// What the recording plugin saw.
#[derive(Default, Debug)]
pub struct Seen {
    pub configure: Vec<ConfigureRequest>,
    pub syncs: Vec<(usize, usize)>,
    pub created: Vec<String>,
    pub state_changes: Vec<Event>,
    pub post_starts: Vec<String>,
    /// Synchronizes whose requests were freed ([`Plugin::synchronize_freed`]).
    pub syncs_freed: usize,
}

/// A plugin that records every call; its replies are driven by the container's annotations.
pub struct Recorder {
    pub seen: Mutex<Seen>,
    pub mask: EventMask,
    /// Implement post_start_container (otherwise Unimplemented -> StateChange).
    pub handle_post_start: bool,
    /// Size of the env value in each CreateContainer adjustment.
    pub adjust_bytes: usize,
}

impl Recorder {
    pub fn new(mask: EventMask) -> Arc<Recorder> {
        Arc::new(Recorder {
            seen: Mutex::new(Seen::default()),
            mask,
            handle_post_start: false,
            adjust_bytes: 8,
        })
    }

    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }
}

#[async_trait]
impl Plugin for Recorder {
    fn events(&self) -> EventMask {
        self.mask
    }

    async fn configure(&self, req: &ConfigureRequest) -> Result<Option<EventMask>, PluginError> {
        self.seen().configure.push(req.clone());
        Ok(None)
    }

    async fn synchronize(
        &self,
        pods: &[PodSandbox],
        containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        self.seen().syncs.push((pods.len(), containers.len()));
        let mut u = ContainerUpdate::new();
        u.container_id = containers
            .last()
            .map(|c| c.id.clone())
            .unwrap_or_else(|| "none".into());
        Ok(vec![u])
    }

    fn synchronize_freed(&self) {
        self.seen().syncs_freed += 1;
    }

    async fn create_container(
        &self,
        _pod: &PodSandbox,
        container: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        self.seen().created.push(container.id.clone());
        Ok((big_adjustment(self.adjust_bytes), Vec::new()))
    }

    async fn post_start_container(
        &self,
        _pod: &PodSandbox,
        c: &Container,
    ) -> Result<(), PluginError> {
        if !self.handle_post_start {
            return Err(PluginError::Unimplemented);
        }
        self.seen().post_starts.push(c.id.clone());
        Ok(())
    }

    async fn state_change(
        &self,
        event: Event,
        _pod: Option<&PodSandbox>,
        _c: Option<&Container>,
    ) -> Result<(), PluginError> {
        self.seen().state_changes.push(event);
        Ok(())
    }
}

/// An adjustment with an env value of `n` bytes and a device, annotation and mount.
pub fn big_adjustment(n: usize) -> ContainerAdjustment {
    let mut adj = ContainerAdjustment::new();
    let mut kv = KeyValue::new();
    kv.key = "ACCEL_VISIBLE_DEVICES".into();
    kv.value = "d".repeat(n);
    adj.env.push(kv);
    adj.annotations
        .insert("accel/granted".into(), "gpu0".into());
    let mut m = Mount::new();
    m.destination = "/dev/shm".into();
    m.source = "tmpfs".into();
    m.options = vec!["rw".into(), "nosuid".into()];
    adj.mounts.push(m);
    adj
}

/// A stub for `path` with a short reconnect backoff.
pub fn stub(path: &std::path::Path) -> Arc<Stub> {
    Arc::new(
        Stub::builder()
            .name("recorder")
            .index("10")
            .socket(path)
            .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
            .build()
            .unwrap(),
    )
}

/// Waits for the next event matching `pred`.
pub async fn wait_event(
    rx: &mut tokio::sync::broadcast::Receiver<StubEvent>,
    pred: impl Fn(&StubEvent) -> bool,
) -> StubEvent {
    tokio::time::timeout(HANG_GUARD, async {
        loop {
            match rx.recv().await {
                Ok(e) if pred(&e) => return e,
                Ok(_) => {}
                Err(e) => panic!("event stream ended: {e}"),
            }
        }
    })
    .await
    .expect("stub event in time")
}

/// The task of a stub's `connect_once`.
pub type StubTask = JoinHandle<Result<(), StubError>>;

/// A stub for `path` (see [`stub`]) serving `plugin` in its own task, one connection.
pub fn spawn_stub<P: Plugin>(path: &std::path::Path, plugin: Arc<P>) -> (Arc<Stub>, StubTask) {
    let stub = stub(path);
    let s = stub.clone();
    (
        stub,
        tokio::spawn(async move { s.connect_once(plugin).await }),
    )
}

/// Closes the stub and waits for its task; what `connect_once` returned.
pub async fn close_and_join(stub: &Stub, task: StubTask) -> Result<(), StubError> {
    stub.close();
    tokio::time::timeout(HANG_GUARD, task)
        .await
        .expect("the stub ends once closed")
        .expect("the stub task does not panic")
}

/// A stub (serving a [`Recorder`] of CreateContainer) connected to a raw peer socket that the
/// test drives byte by byte; the listener lives in `dir`.
pub async fn stub_with_raw_peer(
    dir: &std::path::Path,
) -> (Arc<Stub>, StubTask, tokio::net::UnixStream) {
    let path = dir.join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (stub, task) = spawn_stub(
        &path,
        Recorder::new(EventMask::of(&[Event::CREATE_CONTAINER])),
    );
    let (peer, _) = listener.accept().await.unwrap();
    (stub, task, peer)
}

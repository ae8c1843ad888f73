//! A test plugin process for the fd-3 mode test and the round-trip benchmark.
//!
//! `nri-test-plugin` (with `NRI_PLUGIN_SOCKET` etc. set by the launcher): serve as a plugin.
//! `nri-test-plugin --socket PATH`: connect to `PATH` as plugin `test` index `50`.
//! `nri-test-plugin --echo PATH SIZE`: the benchmark floor; connect to `PATH` and echo
//! `SIZE`-byte messages until the peer closes.
//! `NRI_TEST_PLUGIN_SYNC=lean`: take Synchronize decoded lean (`nri_proto::SyncDecoding`).

use std::sync::Arc;

use async_trait::async_trait;
use nri_proto::api::{
    Container, ContainerAdjustment, ContainerUpdate, Event, KeyValue, PodSandbox,
};
use nri_proto::{EventMask, Plugin, PluginError, Stub, SyncContainer, SyncDecoding, SyncPod};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Synchronize's answer: an empty update of the last container, so that a test sees the
/// answer reached the runtime.
fn touch_last(container_id: Option<&str>) -> Vec<ContainerUpdate> {
    let mut u = ContainerUpdate::new();
    u.container_id = container_id.unwrap_or_default().to_string();
    vec![u]
}

/// Adds `TEST_PLUGIN=<container id>` to each container; when a container has the annotation
/// `test/adjust-bytes: N`, the adjustment carries an env value of N bytes.
struct TestPlugin;

#[async_trait]
impl Plugin for TestPlugin {
    fn events(&self) -> EventMask {
        EventMask::of(&[
            Event::CREATE_CONTAINER,
            Event::STOP_CONTAINER,
            Event::POST_START_CONTAINER,
        ])
    }

    async fn synchronize(
        &self,
        _pods: &[PodSandbox],
        containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        Ok(touch_last(containers.last().map(|c| c.id.as_str())))
    }

    fn synchronize_decoding(&self) -> SyncDecoding {
        // NRI_TEST_PLUGIN_SYNC=lean: the scale bench's second baseline, a no-op plugin that
        // skips on the wire what it does not read, as nri-accel does.
        match std::env::var("NRI_TEST_PLUGIN_SYNC").as_deref() {
            Ok("lean") => SyncDecoding::Lean,
            _ => SyncDecoding::Full,
        }
    }

    async fn synchronize_lean(
        &self,
        _pods: &[SyncPod],
        containers: &[SyncContainer],
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        Ok(touch_last(containers.last().map(|c| c.id.as_str())))
    }

    async fn create_container(
        &self,
        _pod: &PodSandbox,
        container: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        let mut adj = ContainerAdjustment::new();
        let mut kv = KeyValue::new();
        kv.key = "TEST_PLUGIN".into();
        kv.value = match container
            .annotations
            .get("test/adjust-bytes")
            .and_then(|n| n.parse().ok())
        {
            Some(n) => "a".repeat(n),
            None => container.id.clone(),
        };
        adj.env.push(kv);
        Ok((adj, Vec::new()))
    }
}

async fn echo(path: &str, size: usize) -> std::io::Result<()> {
    let mut s = tokio::net::UnixStream::connect(path).await?;
    let mut buf = vec![0u8; size];
    loop {
        if s.read_exact(&mut buf).await.is_err() {
            return Ok(());
        }
        s.write_all(&buf).await?;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("--echo") => {
            let size = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1024);
            echo(args.get(2).map(String::as_str).unwrap_or(""), size)
                .await
                .map_err(|e| e.to_string())
        }
        Some("--socket") => {
            let path = args.get(2).cloned().unwrap_or_default();
            match Stub::builder()
                .name("test")
                .index("50")
                .socket(path)
                .build()
            {
                Ok(stub) => stub
                    .connect_once(Arc::new(TestPlugin))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
        _ => match Stub::builder().from_env().build() {
            Ok(stub) => stub
                .run(Arc::new(TestPlugin))
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
    };
    if let Err(e) = result {
        eprintln!("nri-test-plugin: {e}");
        std::process::exit(1);
    }
}

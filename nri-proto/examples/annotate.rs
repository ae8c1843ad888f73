//! A runnable NRI plugin: adds an annotation and an env variable to every new container, logs the
//! lifecycle of the connection.
//!
//! Socket mode:   `cargo run -p nri-proto --example annotate -- /var/run/nri/nri.sock`
//! Launched mode: install the binary as `/opt/nri/plugins/10-annotate`; the runtime starts it with
//! the socket on fd 3 and `NRI_PLUGIN_SOCKET=3` (then `from_env()` picks it up).

use std::sync::Arc;

use async_trait::async_trait;
use nri_proto::api::{
    Container, ContainerAdjustment, ContainerUpdate, Event, KeyValue, PodSandbox,
};
use nri_proto::{EventMask, Plugin, PluginError, Stub};

struct Annotate;

#[async_trait]
impl Plugin for Annotate {
    fn events(&self) -> EventMask {
        EventMask::of(&[Event::CREATE_CONTAINER, Event::REMOVE_CONTAINER])
    }

    async fn synchronize(
        &self,
        pods: &[PodSandbox],
        containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, PluginError> {
        eprintln!(
            "annotate: synchronized {} pods, {} containers",
            pods.len(),
            containers.len()
        );
        Ok(Vec::new())
    }

    async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<(ContainerAdjustment, Vec<ContainerUpdate>), PluginError> {
        eprintln!(
            "annotate: creating {}/{} in pod {}",
            pod.namespace, container.name, pod.name
        );
        let mut adjust = ContainerAdjustment::new();
        adjust
            .annotations
            .insert("example.nri-accel/annotated".into(), "true".into());
        let mut env = KeyValue::new();
        env.key = "ANNOTATED_BY".into();
        env.value = "nri-accel-example".into();
        adjust.env.push(env);
        Ok((adjust, Vec::new()))
    }

    async fn remove_container(
        &self,
        _pod: &PodSandbox,
        container: &Container,
    ) -> Result<(), PluginError> {
        eprintln!("annotate: removed {}", container.id);
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let builder = Stub::builder().name("annotate").index("10");
    let builder = match std::env::args().nth(1) {
        Some(path) => builder.socket(path),
        None if std::env::var_os("NRI_PLUGIN_SOCKET").is_some() => builder.from_env(),
        None => builder.socket(nri_proto::DEFAULT_SOCKET),
    };
    let stub = match builder.build() {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("annotate: {e}");
            std::process::exit(2);
        }
    };
    // Follow the connection. Unsolicited updates go through `stub.updater()` from tasks like this
    // one, never from inside a handler (some runtimes deadlock), and not while a Synchronize is
    // still being answered.
    let mut events = stub.subscribe();
    tokio::spawn(async move {
        while let Ok(e) = events.recv().await {
            eprintln!("annotate: {e:?}");
        }
    });
    let s = stub.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        s.close();
    });
    if let Err(e) = stub.run(Arc::new(Annotate)).await {
        eprintln!("annotate: {e}");
        std::process::exit(1);
    }
}

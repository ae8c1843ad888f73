//! Dialling a gRPC server on a unix socket (the kubelet's device plugin registration socket).

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use super::KubeletError;

/// How long a connection attempt to the kubelet may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A gRPC channel to the server on the unix socket `path`, connected now.
pub async fn dial(path: &Path) -> Result<Channel, KubeletError> {
    let target = path.to_path_buf();
    let fail = |reason: String| KubeletError::Dial {
        path: path.to_path_buf(),
        reason,
    };
    // The URI is required by the API and never resolved: the connector dials the socket.
    let endpoint = Endpoint::try_from("http://kubelet.invalid")
        .map_err(|e| fail(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT);
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let target = target.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(target).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| fail(error_text(&e)))
}

/// The error and its sources in one line (tonic's transport error alone says only "transport error").
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

//! Unary and server-streaming gRPC calls by method path, over a unix socket, without generated
//! client code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use super::SimError;

/// A connection to one gRPC server on a unix socket.
#[derive(Clone, Debug)]
pub struct GrpcCaller {
    socket: PathBuf,
    channel: Channel,
}

/// An error and its causes in one line (tonic's transport error alone says only "transport
/// error").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

impl GrpcCaller {
    /// Connects to the server on `socket`.
    pub async fn connect(socket: &Path) -> Result<GrpcCaller, SimError> {
        let target = socket.to_path_buf();
        let fail = |reason: String| SimError::Connect {
            socket: socket.display().to_string(),
            reason,
        };
        let channel = Endpoint::try_from("http://kubelet-sim.invalid")
            .map_err(|e| fail(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_| {
                let target = target.clone();
                async move {
                    let s = tokio::net::UnixStream::connect(target).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(s))
                }
            }))
            .await
            .map_err(|e| fail(with_causes(&e)))?;
        Ok(GrpcCaller {
            socket: socket.to_path_buf(),
            channel,
        })
    }

    /// The socket this caller talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Calls the unary method at `path` (`/package.Service/Method`).
    pub async fn unary<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, SimError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| SimError::Connect {
            socket: self.socket.display().to_string(),
            reason: e.to_string(),
        })?;
        let codec: ProstCodec<Req, Resp> = ProstCodec::default();
        grpc.unary(
            tonic::Request::new(req),
            PathAndQuery::from_static(path),
            codec,
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| status(path, s))
    }

    /// Calls the server-streaming method at `path` and returns the stream of answers.
    pub async fn server_streaming<Req, Resp>(
        &self,
        path: &'static str,
        req: Req,
    ) -> Result<tonic::Streaming<Resp>, SimError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| SimError::Connect {
            socket: self.socket.display().to_string(),
            reason: e.to_string(),
        })?;
        let codec: ProstCodec<Req, Resp> = ProstCodec::default();
        grpc.server_streaming(
            tonic::Request::new(req),
            PathAndQuery::from_static(path),
            codec,
        )
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| status(path, s))
    }
}

/// A status error of the call to `method`.
pub(crate) fn status(method: &str, s: tonic::Status) -> SimError {
    SimError::Status {
        method: method.to_string(),
        code: s.code(),
        message: s.message().to_string(),
    }
}

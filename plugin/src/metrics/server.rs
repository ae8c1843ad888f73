//! The loopback HTTP server behind `/metrics`, `/healthz`, `/readyz` and `/livez` (hyper 1,
//! HTTP/1 only).

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::{HealthState, Metrics};

/// Content type of the OpenMetrics text exposition that `prometheus-client` writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// At most this many scrape connections are served at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 16;
/// A client has this long to send its request headers (a stuck client cannot pin a slot).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection (one request: no keep-alive) is closed after this long whatever it does, so
/// a client that stops reading its answer cannot pin a slot either.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// `/livez` fails once the engine has not answered the daemon's 2-second round for this long:
/// long past any commit's disk wait, short enough that a hung daemon is restarted within a
/// minute of the kubelet's liveness probe.
pub const LIVENESS_SILENCE: Duration = Duration::from_secs(30);
/// The paths served.
const PATHS: [&str; 4] = ["/metrics", "/healthz", "/readyz", "/livez"];

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The configured address is not a loopback address.
    #[error(
        "metrics address {addr} is not a loopback address: /metrics and /healthz are served on \
         127.0.0.1 or [::1] only; put a loopback address in the config's metrics address"
    )]
    NotLoopback {
        /// The refused address.
        addr: SocketAddr,
    },
    /// Binding the listening socket failed.
    #[error("cannot listen on metrics address {addr}: {source}; pick a free loopback port")]
    Bind {
        /// The address that could not be bound.
        addr: SocketAddr,
        /// The underlying error.
        source: io::Error,
    },
}

/// A running metrics server.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// The address actually bound (useful when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The accept loop's task; it runs until aborted.
    pub fn into_task(self) -> JoinHandle<()> {
        self.task
    }

    /// Stop accepting connections (connections in flight are dropped with the task).
    pub fn shutdown(self) {
        self.task.abort();
    }
}

/// Serve `GET /metrics` (OpenMetrics text), `GET /healthz`, `/readyz` and `/livez` (200 `ok`,
/// or 503 with the reason; docs/operator-guide.md, "Health and readiness") on `addr`, which
/// must be a loopback address.
///
/// Binds before returning, so a port conflict is a startup error rather than a log line later.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: HealthState,
) -> Result<MetricsServer, MetricsError> {
    if !addr.ip().is_loopback() {
        return Err(MetricsError::NotLoopback { addr });
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    tracing::info!(%local_addr, "serving /metrics, /healthz, /readyz and /livez");
    let task = tokio::spawn(accept_loop(listener, metrics, health));
    Ok(MetricsServer { local_addr, task })
}

async fn accept_loop(listener: TcpListener, metrics: Arc<Metrics>, health: HealthState) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return; // the semaphore is never closed; nothing left to serve if it were
        };
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                // Accept errors (EMFILE, ECONNABORTED) are transient: log, pause, go on.
                tracing::warn!(error = %err, "metrics server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let answer = answer(&req, &metrics, &health);
                async move { Ok::<_, Infallible>(answer) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::debug!(%peer, error = %err, "metrics server: connection ended with an error");
                }
                Err(_) => {
                    tracing::info!(%peer, "metrics server: closed a connection still open after {}s (a client that stopped reading)", CONNECTION_TIMEOUT.as_secs());
                }
            }
        });
    }
}

fn answer(
    req: &Request<Incoming>,
    metrics: &Metrics,
    health: &HealthState,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if !PATHS.contains(&path) {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz or /livez\n".to_owned(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD\n".to_owned(),
        );
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return resp;
    }
    if path == "/metrics" {
        let mut resp = Response::new(Full::new(Bytes::from(metrics.encode())));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
        return resp;
    }
    let verdict = match path {
        "/readyz" => health.ready(),
        "/livez" => health.live(LIVENESS_SILENCE),
        _ => health.check(),
    };
    match verdict {
        Ok(()) => plain(StatusCode::OK, "ok\n".to_owned()),
        Err(reason) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

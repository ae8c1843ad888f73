//! The HTTPS server: `POST /validate` (AdmissionReview v1) and `GET /healthz`, over rustls,
//! with the limits every socket of nri-accel has: a connection cap, a time limit for the
//! request headers and for the whole connection, and a bounded request body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::WebhookError;
use super::admit::ClaimLookup;
use super::check::Rules;
use super::fleet::Fleet;
use super::review;
use super::tls::Certificates;

/// Largest AdmissionReview read. The API server stores objects of at most 1.5 MiB, and a review
/// carries the object once (twice on UPDATE): 3 MiB holds any real pod's review.
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// At most this many connections are served at once; more wait in the accept queue.
pub const MAX_CONNECTIONS: usize = 64;
/// A client has this long for the TLS handshake and its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection (one request: no keep-alive) is closed after this long whatever it does.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What each request is answered from.
#[derive(Clone)]
pub struct State {
    /// The annotation prefix and the config's pools.
    pub rules: Arc<Rules>,
    /// What the nodes publish.
    pub fleet: Fleet,
    /// Where DRA claims and templates are read (none: DRA asks are not judged).
    pub claims: Option<Arc<dyn ClaimLookup>>,
    /// The device plugin's resource prefix (`device_plugin.resource_prefix`): a VM's devices
    /// by resource name `<prefix>/<pool>` are judged against the pool.
    pub resource_prefix: String,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("rules", &self.rules)
            .field("fleet", &self.fleet)
            .field("claims", &self.claims.is_some())
            .field("resource_prefix", &self.resource_prefix)
            .finish()
    }
}

/// A running webhook server.
#[derive(Debug)]
pub struct WebhookServer {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl WebhookServer {
    /// The address bound (useful when `--listen` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The accept loop's task; it runs until aborted.
    pub fn into_task(self) -> JoinHandle<()> {
        self.task
    }
}

/// Binds `addr` and serves the webhook with the current certificate of `certs`. Binds before
/// returning, so a port conflict is a startup error.
pub async fn serve(
    addr: SocketAddr,
    certs: &Arc<Certificates>,
    state: State,
) -> Result<WebhookServer, WebhookError> {
    let acceptor = TlsAcceptor::from(certs.server_config()?);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| WebhookError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| WebhookError::Bind { addr, source })?;
    tracing::info!(%local_addr, "webhook: serving /validate and /healthz over TLS");
    let task = tokio::spawn(accept_loop(listener, acceptor, state));
    Ok(WebhookServer { local_addr, task })
}

async fn accept_loop(listener: TcpListener, acceptor: TlsAcceptor, state: State) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(error = %err, "webhook: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let served = async {
                let tls = match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "webhook: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "webhook: TLS handshake timed out");
                        return;
                    }
                };
                let service = service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(answer(req, &state).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "webhook: connection ended with an error");
                }
            };
            if tokio::time::timeout(CONNECTION_TIMEOUT, served)
                .await
                .is_err()
            {
                tracing::info!(%peer, "webhook: closed a connection still open after {}s", CONNECTION_TIMEOUT.as_secs());
            }
        });
    }
}

async fn answer(req: Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => plain(StatusCode::OK, "ok".into()),
        (&Method::POST, "/validate") => match validate(req, state).await {
            Ok(body) => {
                let mut resp = Response::new(Full::new(Bytes::from(body)));
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                resp
            }
            Err(e @ WebhookError::TooLarge { .. }) => {
                plain(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
            }
            Err(e) => plain(StatusCode::BAD_REQUEST, e.to_string()),
        },
        (_, "/validate") => plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "only POST on /validate".into(),
        ),
        (_, "/healthz") => plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET on /healthz".into(),
        ),
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: the webhook serves POST /validate and GET /healthz".into(),
        ),
    }
}

async fn validate(req: Request<Incoming>, state: &State) -> Result<Vec<u8>, WebhookError> {
    let too_large = WebhookError::TooLarge { limit: MAX_BODY };
    // A declared length over the limit is refused before a byte of the body is read.
    if let Some(len) = req.headers().get(CONTENT_LENGTH)
        && len
            .to_str()
            .ok()
            .and_then(|l| l.parse::<u64>().ok())
            .is_some_and(|l| l > MAX_BODY as u64)
    {
        return Err(too_large);
    }
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                WebhookError::TooLarge { limit: MAX_BODY }
            } else {
                WebhookError::Body(e.to_string())
            }
        })?
        .to_bytes();
    let request = review::decode(&body)?;
    drop(body);
    let namespace = request.namespace.clone().unwrap_or_default();
    let verdict = super::admit::review(
        &state.rules,
        &state.fleet,
        state.claims.as_deref(),
        &state.resource_prefix,
        &request,
    )
    .await?;
    if let Some(why) = &verdict.message {
        let what = if request.is_vmi() { "a VMI" } else { "a pod" };
        tracing::info!(uid = %request.uid, namespace = %namespace, reason = %why, "webhook: refused {what}");
    }
    Ok(review::encode(&request.uid, &verdict))
}

fn plain(status: StatusCode, mut body: String) -> Response<Full<Bytes>> {
    body.push('\n');
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

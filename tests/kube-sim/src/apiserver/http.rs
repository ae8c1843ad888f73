//! The HTTP side: accepting connections, turning a request into a store call, and the faults
//! a test injects on the way.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::Shared;
use super::events::TooOld;
use super::resources::Resource;
use super::routes::{self, Route};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;

/// Largest request body accepted (the real server's limit is about 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Accepts connections until the task is aborted; aborting it drops every open connection.
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                connections.spawn(async move {
                    let svc = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(handle(shared, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A response body: one JSON document, or a watch's stream of events.
type Body = BoxBody<Bytes, Infallible>;

fn respond(code: u16, body: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(e: &ApiError) -> Response<Body> {
    respond(e.code(), &e.body())
}

/// Decodes `%XX` and `+` in a query component.
fn decode(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    // A stalled server holds the request until the test releases it (or the server goes down).
    let mut stall = shared.stall.subscribe();
    let _ = stall.wait_for(|stalled| !*stalled).await;
    if let Some(code) = shared.faults.lock().map_or(None, |mut f| f.take(write)) {
        return error(&ApiError::Injected(code));
    }
    if is_watch(&req) {
        return watch(shared, &req).unwrap_or_else(|e| error(&e));
    }
    match route(&shared, req).await {
        Ok((code, body)) => respond(code, &body),
        Err(e) => error(&e),
    }
}

fn is_watch(req: &Request<Incoming>) -> bool {
    query(req)
        .get("watch")
        .is_some_and(|w| w == "true" || w == "1")
}

/// Events sent on a watch before the stream waits for its reader.
const WATCH_BUFFER: usize = 64;

/// A watch (`GET <collection>?watch=true`): events after `resourceVersion` (or, without one or
/// with `0`, every matching object as `ADDED` first), filtered by the selectors, one JSON object
/// a line, until `timeoutSeconds` or the client goes. A resourceVersion older than the history
/// gets an `ERROR` event with `410 Expired`, as from a real server. No bookmarks are sent (a
/// server may send none).
fn watch(shared: Arc<Shared>, req: &Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let Route {
        resource,
        namespace,
        name,
        ..
    } = routes::parse(req.uri().path())?;
    if name.is_some() || *req.method() != Method::GET {
        return Err(ApiError::MethodNotAllowed);
    }
    let q = query(req);
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), resource)?;
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(std::time::Duration::from_secs);
    let (mut after, initial, mut changed) = {
        let store = shared
            .store
            .lock()
            .map_err(|_| ApiError::BadRequest("the store is poisoned".into()))?;
        let changed = store.events.subscribe();
        match q.get("resourceVersion").map_or("", String::as_str) {
            "" | "0" => {
                let list = store.list(resource, namespace.as_deref(), &labels, &fields);
                let lines: Vec<String> = list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|item| {
                        let mut object = item.clone();
                        object["apiVersion"] = json!(resource.api_version());
                        object["kind"] = json!(resource.kind);
                        let mut line = json!({"type": "ADDED", "object": object}).to_string();
                        line.push('\n');
                        line
                    })
                    .collect();
                (store.resource_version(), lines, changed)
            }
            v => {
                let after = v.parse::<u64>().map_err(|_| {
                    ApiError::BadRequest(format!("invalid resourceVersion {v:?} for a watch"))
                })?;
                (after, Vec::new(), changed)
            }
        }
    };
    let matches = move |object: &Value| {
        namespace
            .as_deref()
            .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
            && labels.matches(object)
            && fields.matches(object)
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(WATCH_BUFFER);
    tokio::spawn(async move {
        let send = |line: String| tx.send(Ok(Frame::data(Bytes::from(line))));
        for line in initial {
            if send(line).await.is_err() {
                return;
            }
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let batch = match shared.store.lock() {
                Ok(store) => store.events.since(resource.plural, after),
                Err(_) => return,
            };
            match batch {
                Ok(events) => {
                    for e in events {
                        after = e.rv;
                        if matches(&e.object) && send(e.line()).await.is_err() {
                            return;
                        }
                    }
                }
                Err(TooOld) => {
                    let _ = send(expired(resource, after)).await;
                    return;
                }
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                () = until(deadline) => return,
                () = tx.closed() => return,
            }
        }
    });
    let mut r =
        Response::new(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// Resolves at `deadline`, never without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The `ERROR` event a real server sends to a watch resuming from a version it no longer has.
fn expired(resource: &Resource, after: u64) -> String {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version: {after} ({})", resource.plural),
        "reason": "Expired", "code": 410,
    });
    let mut line = json!({"type": "ERROR", "object": status}).to_string();
    line.push('\n');
    line
}

async fn route(shared: &Shared, req: Request<Incoming>) -> Result<(u16, Value), ApiError> {
    let Route {
        resource,
        namespace,
        name,
        subresource,
    } = routes::parse(req.uri().path())?;
    let q = query(&req);
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let dry_run = q.get("dryRun").is_some_and(|d| d == "All");
    let method = req.method().clone();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(ApiError::TooLarge(MAX_BODY)),
    };
    let json = || -> Result<Value, ApiError> {
        if body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))
    };
    let ns = namespace.clone().unwrap_or_default();
    let mut store = shared
        .store
        .lock()
        .map_err(|_| ApiError::BadRequest("the store is poisoned".into()))?;
    if let Some(sub) = subresource {
        let Some(name) = name else {
            return Err(ApiError::NoRoute);
        };
        return match method {
            Method::GET => store.get(resource, &ns, &name).map(|v| (200, v)),
            Method::PATCH
                if sub == "status"
                    && std::ptr::eq(resource, &super::resources::RESOURCE_CLAIMS) =>
            {
                if !content_type.starts_with("application/apply-patch") {
                    return Err(ApiError::BadRequest(format!(
                        "this server takes only a server-side apply on a claim's status, not {content_type:?}"
                    )));
                }
                let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
                    return Err(ApiError::Invalid {
                        resource,
                        name,
                        field: "fieldManager".into(),
                        why: "Required value: is required for apply patch".into(),
                    });
                };
                store
                    .apply_claim_status(&ns, &name, manager, &json()?)
                    .map(|v| (200, v))
            }
            _ => Err(ApiError::MethodNotAllowed),
        };
    }
    match (method, name) {
        (Method::GET, Some(name)) => store.get(resource, &ns, &name).map(|v| (200, v)),
        (Method::GET, None) => {
            let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?;
            let fields =
                FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), resource)?;
            Ok((
                200,
                store.list(resource, namespace.as_deref(), &labels, &fields),
            ))
        }
        (Method::POST, None) => store
            .create(resource, &ns, json()?, dry_run)
            .map(|v| (201, v)),
        (Method::PUT, Some(name)) => store
            .replace(resource, &ns, &name, json()?, dry_run)
            .map(|v| (200, v)),
        (Method::DELETE, Some(name)) => store
            .delete(resource, &ns, &name, &json()?, dry_run)
            .map(|v| (200, v)),
        (Method::DELETE, None) => {
            let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?;
            let fields =
                FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str), resource)?;
            Ok((
                200,
                store.delete_collection(resource, namespace.as_deref(), &labels, &fields, dry_run),
            ))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn query_components_are_decoded() {
        assert_eq!(
            decode("spec.nodeName%3Dn1%2Cspec.driver%3Dd"),
            "spec.nodeName=n1,spec.driver=d"
        );
        assert_eq!(decode("a+in+%28x%29"), "a in (x)");
        assert_eq!(decode("100%"), "100%");
    }
}

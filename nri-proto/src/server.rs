//! The ttrpc server of the plugin service on conn 1: one task reads the runtime's requests, runs
//! them on the service and writes the answers.
//!
//! The `ttrpc` crate's server spawns a task per request, waits on a oneshot for it and hands each
//! response to a writer task through a channel; its dispatch decodes the request envelope into
//! owned strings and looks the method up in two `String`-keyed maps. On a CreateContainer round
//! trip those hand-offs and copies cost about as much as everything else the plugin does
//! (docs/nri-proto.md has the measurements). Here handlers run inside the connection's task, as a
//! set of futures (so they still overlap), the envelope is read in place, the method is found by a
//! `match`, and a finished answer goes straight to the socket. Handlers borrow their request, and
//! the request is freed only after the answer is written: freeing a decoded request (a String per
//! field, a map per label set) is work the runtime need not wait for.
//!
//! A handler that panics answers its own request with INTERNAL (logged with the method); the
//! panic is caught per request, so the connection and the handlers running beside it go on.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use protobuf::{CodedInputStream, Message};
use tokio::io::AsyncReadExt;
use ttrpc::{Code, MessageHeader, Status};

use crate::api::*;
use crate::lean_sync::{LeanKeep, LeanSynchronize};
use crate::mux::{ConnSender, MuxConn, Next};

/// The service name on the wire.
const SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// ttrpc message header length.
const HEADER_LEN: usize = 10;
/// Largest ttrpc message body, either way.
const MAX_BODY: usize = 4 << 20;
const TYPE_REQUEST: u8 = 1;
const TYPE_RESPONSE: u8 = 2;
/// How long handlers still running when the connection closes may go on (their answers are
/// dropped): a handler stopped halfway would leave the plugin's own bookkeeping half done.
const DRAIN: Duration = Duration::from_secs(2);

/// What a finished request leaves to free once its answer is written: the message buffer and the
/// decoded request.
type Spent = (Vec<u8>, Option<Box<dyn Send>>);

/// A request in progress: resolves to the stream id, the answer and what to free after it.
type Pending = Pin<Box<dyn Future<Output = (u32, Answer, Spent)> + Send>>;

/// Serves `service` on `conn` until the runtime closes it, then lets running handlers finish.
pub(crate) async fn serve<S: Rpc>(conn: MuxConn, service: Arc<S>) {
    let out = conn.sender();
    // The read state lives in the stream, so a read cut short by a finished handler resumes.
    let requests = futures::stream::unfold(conn, |mut conn| async move {
        let next = read_message(&mut conn).await;
        next.map(|m| (m, conn))
    });
    let mut requests = std::pin::pin!(requests);
    let mut running: FuturesUnordered<Pending> = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some(done) = running.next(), if !running.is_empty() => finish(&out, done),
            msg = requests.next() => match msg {
                Some((header, body)) => {
                    if let Some(mut p) = dispatch(&service, header, body) {
                        // Most handlers finish without waiting: answer at once, outside the set.
                        // One that waits is polled again, with a real waker, once in the set.
                        match (&mut p).now_or_never() {
                            Some(done) => finish(&out, done),
                            None => running.push(p),
                        }
                    }
                }
                None => break,
            },
        }
    }
    let drained =
        tokio::time::timeout(DRAIN, async { while running.next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            handlers = running.len(),
            "NRI handlers still running {DRAIN:?} after the connection closed; stopping them"
        );
    }
}

/// Writes a finished request's answer, then frees what the request left.
fn finish(out: &ConnSender, (stream_id, answer, spent): (u32, Answer, Spent)) {
    respond(out, stream_id, &answer);
    drop(spent);
}

/// A message body: the buffer and where the body starts in it.
type Body = (Vec<u8>, usize);

/// Reads one message; `None` at end of stream or on a read error (the mux has logged it).
async fn read_message(conn: &mut MuxConn) -> Option<(MessageHeader, Body)> {
    match conn.next_message().await.ok()? {
        Next::End => return None,
        Next::Whole(buf) => return Some((header_of(&buf), (buf, HEADER_LEN))),
        Next::Bytes => {}
    }
    let mut h = [0u8; HEADER_LEN];
    conn.read_exact(&mut h).await.ok()?;
    let header = header_of(&h);
    // The mux's message guard has already refused bodies over the limit; this keeps the
    // allocation bounded even if it did not.
    if header.length as usize > MAX_BODY {
        return None;
    }
    let mut body = vec![0u8; header.length as usize];
    conn.read_exact(&mut body).await.ok()?;
    Some((header, (body, 0)))
}

/// The ttrpc message header at the start of `h` (at least [`HEADER_LEN`] bytes).
fn header_of(h: &[u8]) -> MessageHeader {
    MessageHeader {
        length: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
        stream_id: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        type_: h[8],
        flags: h[9],
    }
}

/// The fields of a ttrpc request envelope, borrowed from its body.
#[derive(Debug, PartialEq)]
struct Envelope<'a> {
    service: &'a str,
    method: &'a str,
    payload: &'a [u8],
    timeout_nano: i64,
}

/// Reads a request envelope (service = 1, method = 2, payload = 3, timeout_nano = 4; metadata = 5
/// and unknown fields are skipped) without copying it.
fn parse_envelope(body: &[u8]) -> Result<Envelope<'_>, String> {
    let mut env = Envelope {
        service: "",
        method: "",
        payload: &[],
        timeout_nano: 0,
    };
    let mut is = CodedInputStream::from_bytes(body);
    let bad = |e: protobuf::Error| format!("bad ttrpc request: {e}");
    let slice = |is: &mut CodedInputStream<'_>| -> Result<&[u8], String> {
        let len = is.read_raw_varint32().map_err(bad)?;
        // Positions are within `body`, whose length fits usize.
        let start = is.pos() as usize;
        is.skip_raw_bytes(len).map_err(bad)?;
        Ok(&body[start..start + len as usize])
    };
    while let Some(tag) = is.read_raw_tag_or_eof().map_err(bad)? {
        match tag {
            10 => env.service = utf8(slice(&mut is)?)?,
            18 => env.method = utf8(slice(&mut is)?)?,
            26 => env.payload = slice(&mut is)?,
            32 => env.timeout_nano = is.read_int64().map_err(bad)?,
            t => {
                let wire = protobuf::rt::WireType::new(t & 7)
                    .ok_or_else(|| format!("bad ttrpc request: wire type in tag {t}"))?;
                is.skip_field(wire).map_err(bad)?;
            }
        }
    }
    Ok(env)
}

fn utf8(b: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(b).map_err(|_| "bad ttrpc request: a name is not UTF-8".to_string())
}

/// Starts handling one message; `None` for messages that get no answer.
fn dispatch<S: Rpc>(service: &Arc<S>, header: MessageHeader, body: Body) -> Option<Pending> {
    let sid = header.stream_id;
    let answer = |code, msg: String| -> Option<Pending> {
        let answer = encode_response(Err(ttrpc::get_status(code, msg)));
        Some(Box::pin(std::future::ready((
            sid,
            answer,
            (Vec::new(), None),
        ))))
    };
    if header.type_ != TYPE_REQUEST {
        if header.type_ == TYPE_RESPONSE {
            tracing::warn!(
                stream_id = sid,
                "NRI runtime sent a response on the plugin conn"
            );
            return None;
        }
        return answer(
            Code::INVALID_ARGUMENT,
            format!(
                "message type {} is not served (no streams here)",
                header.type_
            ),
        );
    }
    if sid % 2 != 1 {
        return answer(
            Code::INVALID_ARGUMENT,
            format!("stream id {sid} must be odd"),
        );
    }
    let service = service.clone();
    Some(Box::pin(async move {
        let (buf, start) = body;
        let (result, request) = match parse_envelope(&buf[start..]) {
            Err(why) => (Err(ttrpc::get_status(Code::INVALID_ARGUMENT, why)), None),
            Ok(env) if env.service != SERVICE => (
                Err(ttrpc::get_status(
                    Code::UNIMPLEMENTED,
                    format!("service {} is not served", env.service),
                )),
                None,
            ),
            Ok(env) => {
                let method = env.method;
                // A panic answers only this request: the connection, and the handlers running
                // beside it, go on. The request being decoded or handled is dropped with it.
                match AssertUnwindSafe(run(&*service, env)).catch_unwind().await {
                    Ok(done) => done,
                    Err(panic) => (Err(panicked(method, sid, &*panic)), None),
                }
            }
        };
        (sid, encode_response(result), (buf, request))
    }))
}

/// The status a panicking handler answers with (INTERNAL), logged with the method.
fn panicked(method: &str, stream_id: u32, panic: &(dyn std::any::Any + Send)) -> Status {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("no message");
    tracing::error!(
        method,
        stream_id,
        panic = what,
        "NRI handler panicked; answering this request with an internal error"
    );
    ttrpc::get_status(
        Code::INTERNAL,
        format!("{method} failed: the plugin hit an internal error ({what})"),
    )
}

/// Runs one request under its deadline (`timeout_nano`; a handler past it is stopped).
async fn run<S: Rpc>(service: &S, env: Envelope<'_>) -> Served {
    let call = call(service, env.method, env.payload);
    if env.timeout_nano <= 0 {
        return call.await;
    }
    let t = Duration::from_nanos(env.timeout_nano as u64);
    tokio::time::timeout(t, call).await.unwrap_or_else(|_| {
        tracing::warn!(
            method = env.method,
            ?t,
            "NRI handler missed the request's deadline"
        );
        let why = format!("{} timed out", env.method);
        (Err(ttrpc::get_status(Code::DEADLINE_EXCEEDED, why)), None)
    })
}

/// The status of a failed call.
fn status_of(e: ttrpc::Error) -> Status {
    match e {
        ttrpc::Error::RpcStatus(s) => s,
        other => ttrpc::get_status(Code::UNKNOWN, other.to_string()),
    }
}

/// A request served: the encoded answer (or the status to answer), and the decoded request for
/// the caller to free once the answer is written.
type Served = (Result<Vec<u8>, Status>, Option<Box<dyn Send>>);

/// The answer to a `method` request that does not decode.
fn bad_request(method: &str, e: impl std::fmt::Display) -> Served {
    let why = format!("bad {method} request: {e}");
    (Err(ttrpc::get_status(Code::INVALID_ARGUMENT, why)), None)
}

/// A handler's answer to a `method` request, encoded.
fn encoded<M: Message>(method: &str, answer: ttrpc::Result<M>) -> Result<Vec<u8>, Status> {
    match answer {
        Ok(resp) => resp.write_to_bytes().map_err(|e| {
            let why = format!("encoding the {method} answer: {e}");
            ttrpc::get_status(Code::INTERNAL, why)
        }),
        Err(e) => Err(status_of(e)),
    }
}

/// Declares the service trait the server calls and the dispatch onto it, from one list of
/// (method name, handler, request, response).
macro_rules! plugin_service {
    ($($name:literal => $f:ident($req:ty) -> $resp:ty),* $(,)?) => {
        /// The NRI plugin service as this server calls it. Each handler borrows its request
        /// (mutably, so it may move parts out or hand parts back); the server frees the request
        /// after the answer is written.
        pub(crate) trait Rpc: Send + Sync + 'static {
            $(
                #[doc = concat!("Serves `", $name, "`.")]
                fn $f(&self, req: &mut $req)
                    -> impl Future<Output = ttrpc::Result<$resp>> + Send;
            )*

            /// Whether Synchronize is decoded lean ([`LeanSynchronize`]), keeping what the
            /// answer says, and served by [`Rpc::synchronize_lean`].
            fn lean_synchronize(&self) -> Option<LeanKeep>;

            /// Serves a `Synchronize` decoded lean.
            fn synchronize_lean(&self, req: &mut LeanSynchronize)
                -> impl Future<Output = ttrpc::Result<SynchronizeResponse>> + Send;

            /// What the server frees once the answer to a `method` request is written: the
            /// decoded request, or a value that frees it and then does more.
            fn spent(&self, _method: &'static str, req: Box<dyn Send>) -> Box<dyn Send> {
                req
            }
        }

        /// Decodes the request of `method` from `payload`, runs it on `service` and encodes the
        /// answer; returns the answer and the decoded request, for the caller to free.
        async fn call<S: Rpc>(
            service: &S,
            method: &str,
            payload: &[u8],
        ) -> Served {
            let lean = match method {
                "Synchronize" => service.lean_synchronize(),
                _ => None,
            };
            if let Some(keep) = lean {
                let descriptor = <SynchronizeRequest as protobuf::MessageFull>::descriptor();
                if let Err(e) = crate::strict::check(payload, &descriptor) {
                    return bad_request("Synchronize", e);
                }
                let mut req = match LeanSynchronize::decode_keeping(payload, &keep) {
                    Ok(req) => req,
                    Err(e) => return bad_request("Synchronize", e),
                };
                let answer = encoded("Synchronize", service.synchronize_lean(&mut req).await);
                return (answer, Some(service.spent("Synchronize", Box::new(req))));
            }
            match method {
                $($name => {
                    let mut req = match crate::strict::parse::<$req>(payload) {
                        Ok(req) => req,
                        Err(e) => return bad_request($name, e),
                    };
                    let answer = encoded($name, service.$f(&mut req).await);
                    (answer, Some(service.spent($name, Box::new(req))))
                })*
                other => {
                    let why = format!("{SERVICE}/{other} is not served");
                    (Err(ttrpc::get_status(Code::UNIMPLEMENTED, why)), None)
                }
            }
        }
    };
}

plugin_service! {
    "Configure" => configure(ConfigureRequest) -> ConfigureResponse,
    "Synchronize" => synchronize(SynchronizeRequest) -> SynchronizeResponse,
    "Shutdown" => shutdown(Empty) -> Empty,
    "RunPodSandbox" => run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse,
    "UpdatePodSandbox" => update_pod_sandbox(UpdatePodSandboxRequest) -> UpdatePodSandboxResponse,
    "PostUpdatePodSandbox" => post_update_pod_sandbox(PostUpdatePodSandboxRequest) -> PostUpdatePodSandboxResponse,
    "StopPodSandbox" => stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse,
    "RemovePodSandbox" => remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse,
    "CreateContainer" => create_container(CreateContainerRequest) -> CreateContainerResponse,
    "PostCreateContainer" => post_create_container(PostCreateContainerRequest) -> PostCreateContainerResponse,
    "StartContainer" => start_container(StartContainerRequest) -> StartContainerResponse,
    "PostStartContainer" => post_start_container(PostStartContainerRequest) -> PostStartContainerResponse,
    "UpdateContainer" => update_container(UpdateContainerRequest) -> UpdateContainerResponse,
    "PostUpdateContainer" => post_update_container(PostUpdateContainerRequest) -> PostUpdateContainerResponse,
    "StopContainer" => stop_container(StopContainerRequest) -> StopContainerResponse,
    "RemoveContainer" => remove_container(RemoveContainerRequest) -> RemoveContainerResponse,
    "StateChange" => state_change(StateChangeEvent) -> Empty,
    "ValidateContainerAdjustment" => validate_container_adjustment(ValidateContainerAdjustmentRequest) -> ValidateContainerAdjustmentResponse,
}

/// A response body in two parts, so that the payload is not copied again: `head` is the
/// `status = 1` field (always present, empty for OK, as Go's server sends it) and, on success, the
/// tag and length of `payload = 2`.
struct Answer {
    head: Vec<u8>,
    payload: Vec<u8>,
}

impl Answer {
    fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }
}

/// Encodes an answer. One over the size limit becomes a ResourceExhausted status.
fn encode_response(result: Result<Vec<u8>, Status>) -> Answer {
    let (status, payload) = match result {
        Ok(p) if p.len() + 16 > MAX_BODY => {
            let why = format!(
                "answer of {} bytes is over the {MAX_BODY}-byte ttrpc limit",
                p.len()
            );
            tracing::error!("{why}");
            (
                Some(ttrpc::get_status(Code::RESOURCE_EXHAUSTED, why)),
                Vec::new(),
            )
        }
        Ok(p) => (None, p),
        Err(s) => (Some(s), Vec::new()),
    };
    let status = status.map(|s| s.write_to_bytes().unwrap_or_default());
    let mut head = Vec::with_capacity(16 + status.as_ref().map_or(0, Vec::len));
    let mut os = protobuf::CodedOutputStream::vec(&mut head);
    // Writing into a Vec fails only past 2 GiB; both parts are bounded above.
    let _ = os.write_bytes(1, status.as_deref().unwrap_or_default());
    if !payload.is_empty() {
        let _ = os.write_tag(2, protobuf::rt::WireType::LengthDelimited);
        // Under the 4 MiB limit, checked above.
        let _ = os.write_raw_varint32(payload.len() as u32);
    }
    let _ = os.flush();
    drop(os);
    Answer { head, payload }
}

/// Writes one response message for `stream_id`.
fn respond(out: &ConnSender, stream_id: u32, answer: &Answer) {
    let mut header = [0u8; HEADER_LEN];
    // The body is under the 4 MiB limit (encode_response replaces larger ones), so it fits u32.
    header[..4].copy_from_slice(&(answer.len() as u32).to_be_bytes());
    header[4..8].copy_from_slice(&stream_id.to_be_bytes());
    header[8] = TYPE_RESPONSE;
    if let Err(e) = out.send_parts(&[&header, &answer.head, &answer.payload]) {
        tracing::debug!(stream_id, error = %e, "NRI response not sent: connection closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_is_read_in_place_and_bad_ones_are_refused() {
        let mut req = ttrpc::Request::new();
        req.service = SERVICE.into();
        req.method = "CreateContainer".into();
        req.payload = vec![1, 2, 3];
        req.timeout_nano = 2_000_000_000;
        let mut kv = ttrpc::proto::KeyValue::new();
        kv.key = "k".into();
        kv.value = "v".into();
        req.metadata.push(kv);
        let body = req.write_to_bytes().unwrap();
        assert_eq!(
            parse_envelope(&body).unwrap(),
            Envelope {
                service: SERVICE,
                method: "CreateContainer",
                payload: &[1, 2, 3],
                timeout_nano: 2_000_000_000,
            }
        );
        // A length running past the end, and a name that is not UTF-8.
        assert!(parse_envelope(&[10, 50, b'a']).is_err());
        assert!(parse_envelope(&[18, 2, 0xff, 0xfe]).is_err());
        assert!(parse_envelope(&[0x0e]).is_err());
    }

    #[test]
    fn responses_carry_an_empty_status_on_success() {
        let body = |a: Answer| [a.head, a.payload].concat();
        let resp =
            ttrpc::Response::parse_from_bytes(&body(encode_response(Ok(vec![7, 7])))).unwrap();
        assert_eq!(resp.status.code.value(), 0);
        assert_eq!(resp.payload, vec![7, 7]);
        let no = encode_response(Err(ttrpc::get_status(Code::UNIMPLEMENTED, "no")));
        let resp = ttrpc::Response::parse_from_bytes(&body(no)).unwrap();
        assert_eq!(resp.status.code.value(), Code::UNIMPLEMENTED as i32);
        assert_eq!(resp.status.message, "no");
        let big = encode_response(Ok(vec![0; MAX_BODY]));
        let resp = ttrpc::Response::parse_from_bytes(&body(big)).unwrap();
        assert_eq!(resp.status.code.value(), Code::RESOURCE_EXHAUSTED as i32);
    }
}

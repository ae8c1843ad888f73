//! The ttrpc server of the plugin service on conn 1: one task reads the runtime's requests, runs
//! them on the service and writes the answers.
//!
//! The `ttrpc` crate's server spawns a task per request, waits on a oneshot for it and hands each
//! response to a writer task through a channel; its dispatch decodes the request envelope into
//! owned strings and looks the method up in two `String`-keyed maps. On a CreateContainer round
//! trip those hand-offs and copies cost about as much as everything else the plugin does
//! (docs/nri-proto.md has the measurements). Here handlers run inside the connection's task, as a
//! set of futures (so they still overlap), the envelope is read in place, the method is found by a
//! `match`, and a finished answer goes straight to the socket. The service itself is the trait
//! `ttrpc-codegen` generates, and the messages are the generated ones.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use protobuf::{CodedInputStream, Message};
use tokio::io::AsyncReadExt;
use ttrpc::r#async::TtrpcContext;
use ttrpc::{Code, MessageHeader, Status};

use crate::api::*;
use crate::generated::nri_ttrpc::Plugin as PluginRpc;
use crate::mux::{ConnSender, MuxConn};

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

/// The service as the server calls it.
pub(crate) type RpcService = Arc<dyn PluginRpc + Send + Sync>;

/// A request in progress: resolves to the stream id and the response body.
type Pending = Pin<Box<dyn Future<Output = (u32, Vec<u8>)> + Send>>;

/// Serves `service` on `conn` until the runtime closes it, then lets running handlers finish.
pub(crate) async fn serve(conn: MuxConn, service: RpcService) {
    let out = conn.sender();
    let data = Arc::new(ttrpc::ConnectionData);
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
            Some((stream_id, body)) = running.next(), if !running.is_empty() => {
                respond(&out, stream_id, body);
            }
            msg = requests.next() => match msg {
                Some((header, body)) => {
                    if let Some(p) = dispatch(&service, &data, header, body) {
                        running.push(p);
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

/// Reads one message; `None` at end of stream or on a read error (the mux has logged it).
async fn read_message(conn: &mut MuxConn) -> Option<(MessageHeader, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    conn.read_exact(&mut h).await.ok()?;
    let header = MessageHeader {
        length: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
        stream_id: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        type_: h[8],
        flags: h[9],
    };
    // The mux's message guard has already refused bodies over the limit; this keeps the
    // allocation bounded even if it did not.
    if header.length as usize > MAX_BODY {
        return None;
    }
    let mut body = vec![0u8; header.length as usize];
    conn.read_exact(&mut body).await.ok()?;
    Some((header, body))
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
fn dispatch(
    service: &RpcService,
    data: &Arc<ttrpc::ConnectionData>,
    header: MessageHeader,
    body: Vec<u8>,
) -> Option<Pending> {
    let sid = header.stream_id;
    let answer = |code, msg: String| -> Option<Pending> {
        let body = encode_response(Err(ttrpc::get_status(code, msg)));
        Some(Box::pin(std::future::ready((sid, body))))
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
    let (service, data) = (service.clone(), data.clone());
    Some(Box::pin(async move {
        let result = match parse_envelope(&body) {
            Err(why) => Err(ttrpc::get_status(Code::INVALID_ARGUMENT, why)),
            Ok(env) if env.service != SERVICE => Err(ttrpc::get_status(
                Code::UNIMPLEMENTED,
                format!("service {} is not served", env.service),
            )),
            Ok(env) => run(&*service, header, data, env).await,
        };
        (sid, encode_response(result))
    }))
}

/// Runs one request under its deadline (`timeout_nano`; a handler past it is stopped).
async fn run(
    service: &(dyn PluginRpc + Send + Sync),
    header: MessageHeader,
    data: Arc<ttrpc::ConnectionData>,
    env: Envelope<'_>,
) -> Result<Vec<u8>, Status> {
    let ctx = TtrpcContext {
        mh: header,
        metadata: Default::default(),
        timeout_nano: env.timeout_nano,
        connection_data: data,
    };
    let call = call(service, &ctx, env.method, env.payload);
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
        Err(ttrpc::get_status(
            Code::DEADLINE_EXCEEDED,
            format!("{} timed out", env.method),
        ))
    })
}

/// The status of a failed call.
fn status_of(e: ttrpc::Error) -> Status {
    match e {
        ttrpc::Error::RpcStatus(s) => s,
        other => ttrpc::get_status(Code::UNKNOWN, other.to_string()),
    }
}

/// Decodes the request of `method` from `payload`, runs it on `service` and encodes the answer.
async fn call(
    service: &(dyn PluginRpc + Send + Sync),
    ctx: &TtrpcContext,
    method: &str,
    payload: &[u8],
) -> Result<Vec<u8>, Status> {
    macro_rules! methods {
        ($($name:literal => $f:ident($req:ty)),* $(,)?) => {
            match method {
                $($name => {
                    let req = <$req>::parse_from_bytes(payload).map_err(|e| {
                        ttrpc::get_status(
                            Code::INVALID_ARGUMENT,
                            format!("bad {} request: {e}", $name),
                        )
                    })?;
                    let resp = service.$f(ctx, req).await.map_err(status_of)?;
                    resp.write_to_bytes().map_err(|e| {
                        ttrpc::get_status(Code::INTERNAL, format!("encoding the {} answer: {e}", $name))
                    })
                })*
                other => Err(ttrpc::get_status(
                    Code::UNIMPLEMENTED,
                    format!("{SERVICE}/{other} is not served"),
                )),
            }
        };
    }
    methods! {
        "Configure" => configure(ConfigureRequest),
        "Synchronize" => synchronize(SynchronizeRequest),
        "Shutdown" => shutdown(Empty),
        "RunPodSandbox" => run_pod_sandbox(RunPodSandboxRequest),
        "UpdatePodSandbox" => update_pod_sandbox(UpdatePodSandboxRequest),
        "PostUpdatePodSandbox" => post_update_pod_sandbox(PostUpdatePodSandboxRequest),
        "StopPodSandbox" => stop_pod_sandbox(StopPodSandboxRequest),
        "RemovePodSandbox" => remove_pod_sandbox(RemovePodSandboxRequest),
        "CreateContainer" => create_container(CreateContainerRequest),
        "PostCreateContainer" => post_create_container(PostCreateContainerRequest),
        "StartContainer" => start_container(StartContainerRequest),
        "PostStartContainer" => post_start_container(PostStartContainerRequest),
        "UpdateContainer" => update_container(UpdateContainerRequest),
        "PostUpdateContainer" => post_update_container(PostUpdateContainerRequest),
        "StopContainer" => stop_container(StopContainerRequest),
        "RemoveContainer" => remove_container(RemoveContainerRequest),
        "StateChange" => state_change(StateChangeEvent),
        "ValidateContainerAdjustment" => validate_container_adjustment(ValidateContainerAdjustmentRequest),
    }
}

/// A response body: `status = 1` (always present, empty for OK, as Go's server sends it) and, on
/// success, `payload = 2`. An answer over the size limit becomes a ResourceExhausted status.
fn encode_response(result: Result<Vec<u8>, Status>) -> Vec<u8> {
    let (status, payload) = match result {
        Ok(p) if p.len() + 16 > MAX_BODY => {
            let why = format!(
                "answer of {} bytes is over the {MAX_BODY}-byte ttrpc limit",
                p.len()
            );
            tracing::error!("{why}");
            (ttrpc::get_status(Code::RESOURCE_EXHAUSTED, why), Vec::new())
        }
        Ok(p) => (Status::new(), p),
        Err(s) => (s, Vec::new()),
    };
    let status = status.write_to_bytes().unwrap_or_default();
    let mut body = Vec::with_capacity(payload.len() + status.len() + 12);
    let mut os = protobuf::CodedOutputStream::vec(&mut body);
    // Writing into a Vec fails only past 2 GiB; both parts are bounded above.
    let _ = os.write_bytes(1, &status);
    if !payload.is_empty() {
        let _ = os.write_bytes(2, &payload);
    }
    let _ = os.flush();
    drop(os);
    body
}

/// Writes one response message for `stream_id`.
fn respond(out: &ConnSender, stream_id: u32, body: Vec<u8>) {
    let mut msg = Vec::with_capacity(HEADER_LEN + body.len());
    // The body is under the 4 MiB limit (encode_response replaces larger ones), so it fits u32.
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes());
    msg.extend_from_slice(&stream_id.to_be_bytes());
    msg.extend_from_slice(&[TYPE_RESPONSE, 0]);
    msg.extend_from_slice(&body);
    if let Err(e) = out.send(&msg) {
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
        let body = encode_response(Ok(vec![7, 7]));
        let resp = ttrpc::Response::parse_from_bytes(&body).unwrap();
        assert_eq!(resp.status.code.value(), 0);
        assert_eq!(resp.payload, vec![7, 7]);
        let body = encode_response(Err(ttrpc::get_status(Code::UNIMPLEMENTED, "no")));
        let resp = ttrpc::Response::parse_from_bytes(&body).unwrap();
        assert_eq!(resp.status.code.value(), Code::UNIMPLEMENTED as i32);
        assert_eq!(resp.status.message, "no");
        let big = encode_response(Ok(vec![0; MAX_BODY]));
        let resp = ttrpc::Response::parse_from_bytes(&big).unwrap();
        assert_eq!(resp.status.code.value(), Code::RESOURCE_EXHAUSTED as i32);
    }
}

//! A gRPC client written straight on HTTP/2 frames, so that it can send what the kubelet's
//! grpc-go clients send and no Rust HTTP library lets through: the percent-encoded socket path as
//! `:authority`. Its HPACK encoder indexes as grpc-go's does (a repeated field goes out as a
//! dynamic table index), so a second call on one connection names the authority by index.
//! Written here from RFC 9113 / RFC 7541, independently of the plugin's own frame code.

use std::path::Path;
use std::time::Duration;

use loona_hpack::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The authority grpc-go sends when the kubelet dials this socket path.
pub fn kubelet_authority(socket: &Path) -> String {
    socket
        .to_string_lossy()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;
const ACK: u8 = 1;
/// Guards against a hang only.
const READ_WAIT: Duration = Duration::from_secs(20);

/// How the server answered a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Trailers came: the gRPC status and the messages of the response.
    Done {
        grpc_status: String,
        grpc_message: String,
        messages: Vec<Vec<u8>>,
    },
    /// The first message of a streaming response came (the stream stays open).
    Streaming { stream: u32, first: Vec<u8> },
    /// The server reset the stream with this HTTP/2 error code (1 = PROTOCOL_ERROR).
    Reset(u32),
    /// The server closed the connection with this HTTP/2 error code.
    GoAway(u32),
}

pub struct RawGrpc {
    io: UnixStream,
    /// The HPACK dynamic table as this encoder filled it, oldest first.
    table: Vec<(Vec<u8>, Vec<u8>)>,
    decoder: Decoder<'static>,
    next_stream: u32,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend(stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn integer(mut value: usize, prefix: u8, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A gRPC message frame.
pub fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend((message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

impl RawGrpc {
    /// Connects and sends the preface and an empty SETTINGS frame.
    pub async fn connect(socket: &Path) -> std::io::Result<RawGrpc> {
        let mut io = UnixStream::connect(socket).await?;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        io.write_all(&hello).await?;
        Ok(RawGrpc {
            io,
            table: Vec::new(),
            decoder: Decoder::new(),
            next_stream: 1,
        })
    }

    fn encode(&mut self, headers: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(name, value) in headers {
            if let Some(i) = self.table.iter().position(|(n, v)| n == name && v == value) {
                integer(62 + self.table.len() - 1 - i, 7, 0x80, &mut out);
                continue;
            }
            // Literal with incremental indexing, new name.
            out.push(0x40);
            for s in [name, value] {
                integer(s.len(), 7, 0, &mut out);
                out.extend_from_slice(s);
            }
            self.table.push((name.to_vec(), value.to_vec()));
        }
        out
    }

    /// Calls `path` with `message` (protobuf bytes), `authority` as `:authority`; waits for the
    /// trailers, or for the first message when `streaming`.
    pub async fn call(
        &mut self,
        path: &str,
        authority: &str,
        message: &[u8],
        streaming: bool,
    ) -> std::io::Result<Answer> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let block = self.request_headers(path, authority);
        let mut out = frame(HEADERS, END_HEADERS, stream, &block);
        out.extend(frame(DATA, END_STREAM, stream, &grpc_message(message)));
        self.io.write_all(&out).await?;
        tokio::time::timeout(READ_WAIT, self.answer(stream, streaming))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))?
    }

    /// Opens a call to `path` whose request never ends (HEADERS without END_STREAM); returns
    /// its stream.
    pub async fn start(&mut self, path: &str, authority: &str) -> std::io::Result<u32> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let block = self.request_headers(path, authority);
        self.io
            .write_all(&frame(HEADERS, END_HEADERS, stream, &block))
            .await?;
        Ok(stream)
    }

    fn request_headers(&mut self, path: &str, authority: &str) -> Vec<u8> {
        self.encode(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", authority.as_bytes()),
            (b"content-type", b"application/grpc"),
            (b"user-agent", b"grpc-go/1.75.0"),
            (b"te", b"trailers"),
        ])
    }

    /// Sends a reset of `stream` (the client cancels a call).
    pub async fn cancel(&mut self, stream: u32) -> std::io::Result<()> {
        self.io
            .write_all(&frame(RST_STREAM, 0, stream, &8u32.to_be_bytes()))
            .await
    }

    /// Reads until the connection ends (Ok) or `wait` passes (Err).
    pub async fn wait_closed(&mut self, wait: Duration) -> Result<(), ()> {
        let mut buf = [0u8; 4096];
        tokio::time::timeout(wait, async {
            loop {
                match self.io.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .map_err(|_| ())
    }

    async fn read_frame(&mut self) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.io.read_exact(&mut head).await?;
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.io.read_exact(&mut payload).await?;
        Ok((head[3], head[4], stream, payload))
    }

    async fn answer(&mut self, stream: u32, streaming: bool) -> std::io::Result<Answer> {
        let mut block = Vec::new();
        let mut data = Vec::new();
        loop {
            let (kind, flags, on, payload) = self.read_frame().await?;
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.io.write_all(&frame(SETTINGS, ACK, 0, &[])).await?;
                }
                PING if flags & ACK == 0 => {
                    self.io.write_all(&frame(PING, ACK, 0, &payload)).await?;
                }
                GOAWAY => {
                    let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                    return Ok(Answer::GoAway(code));
                }
                RST_STREAM if on == stream => {
                    return Ok(Answer::Reset(u32::from_be_bytes(
                        payload[..4].try_into().unwrap(),
                    )));
                }
                HEADERS | CONTINUATION => {
                    // Every header block is decoded, whichever stream, to keep the table right.
                    block.extend_from_slice(&payload);
                    if flags & END_HEADERS == 0 {
                        continue;
                    }
                    let fields = self.decoder.decode(&block).expect("server headers decode");
                    block.clear();
                    if on != stream {
                        continue;
                    }
                    let has_status = fields.iter().any(|(n, _)| n == b"grpc-status");
                    if has_status || flags & END_STREAM != 0 {
                        let get = |name: &[u8]| {
                            fields
                                .iter()
                                .find(|(n, _)| n == name)
                                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                                .unwrap_or_default()
                        };
                        return Ok(Answer::Done {
                            grpc_status: get(b"grpc-status"),
                            grpc_message: get(b"grpc-message"),
                            messages: split_messages(&data),
                        });
                    }
                }
                DATA if on == stream => {
                    data.extend_from_slice(&payload);
                    if !payload.is_empty() {
                        // Give the window back, as any client does.
                        let inc = (payload.len() as u32).to_be_bytes();
                        let mut w = frame(8, 0, 0, &inc);
                        w.extend(frame(8, 0, stream, &inc));
                        self.io.write_all(&w).await?;
                    }
                    let messages = split_messages(&data);
                    if streaming && let Some(first) = messages.into_iter().next() {
                        return Ok(Answer::Streaming { stream, first });
                    }
                }
                _ => {}
            }
        }
    }
}

/// The complete gRPC messages in `data`.
fn split_messages(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while data.len() >= 5 {
        let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
        if data.len() < 5 + len {
            break;
        }
        out.push(data[5..5 + len].to_vec());
        data = &data[5 + len..];
    }
    out
}

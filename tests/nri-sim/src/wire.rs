//! The fake runtime's own framing and ttrpc codec, written from the protocol facts (not from
//! nri-proto's mux or the ttrpc crate), emulating what the Go runtime does on the wire.
//!
//! Reading emulates Go: each mux conn's `Read` hands over one whole frame and fails (like
//! ENOMEM) when the frame is longer than the caller's buffer; ttrpc reads each conn through a
//! 4096-byte `bufio.Reader`. A plugin that writes a frame longer than 4096 bytes that is not
//! exactly the rest of a message body therefore makes [`GoConnReader`] fail, as it would in Go.

use protobuf::CodedInputStream;
use protobuf::CodedOutputStream;
use protobuf::rt::WireType;

/// Frame header size.
pub const FRAME_HEADER: usize = 8;
/// Largest frame payload accepted from the plugin.
pub const MAX_FRAME: usize = 4 * 1024 * 1024 + 10;
/// ttrpc message header size.
pub const MSG_HEADER: usize = 10;
/// Largest ttrpc message body.
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// Go's default bufio buffer size.
pub const GO_BUF: usize = 4096;
/// ttrpc message type: request.
pub const TYPE_REQUEST: u8 = 1;
/// ttrpc message type: response.
pub const TYPE_RESPONSE: u8 = 2;

/// Wire errors; any of them makes the fake runtime drop the plugin, as the Go runtime does.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// A frame was longer than the reader's buffer (Go's mux fails the read with ENOMEM).
    #[error("frame of {frame} bytes does not fit the {buf}-byte read buffer (ENOMEM in Go's mux)")]
    FrameTooLong {
        /// Frame length.
        frame: usize,
        /// Buffer length.
        buf: usize,
    },
    /// A ttrpc message announced a body over 4 MiB.
    #[error("ttrpc message of {0} bytes exceeds the 4 MiB limit")]
    MessageTooLarge(usize),
    /// A ttrpc body failed to decode.
    #[error("bad ttrpc body: {0}")]
    Decode(String),
}

/// Encodes one mux frame.
pub fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend_from_slice(&conn.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Frames one ttrpc message the way Go's `bufio.Writer` (4096 bytes) over the mux does: the header
/// and the start of the body fill a 4096-byte frame, and a remainder of 4096 bytes or more goes out
/// whole in one frame. Returns the bytes to write to the socket.
pub fn frame_message(conn: u32, stream_id: u32, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(MSG_HEADER + body.len());
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes());
    msg.extend_from_slice(&stream_id.to_be_bytes());
    msg.push(kind);
    msg.push(0);
    let first = body.len().min(GO_BUF - MSG_HEADER);
    msg.extend_from_slice(&body[..first]);
    let mut out = frame(conn, &msg);
    let mut rest = &body[first..];
    if rest.len() >= GO_BUF {
        out.extend(frame(conn, rest));
        rest = &[];
    }
    if !rest.is_empty() {
        out.extend(frame(conn, rest));
    }
    out
}

/// Length of the request envelope (service = 1, method = 2, payload = 3, timeout_nano = 4).
pub fn request_len(service: &str, method: &str, payload_len: usize, timeout_nano: i64) -> usize {
    let field = |n: usize| 1 + protobuf::rt::compute_raw_varint64_size(n as u64) as usize + n;
    let timeout = match timeout_nano {
        0 => 0,
        t => 1 + protobuf::rt::compute_raw_varint64_size(t as u64) as usize,
    };
    field(service.len()) + field(method.len()) + field(payload_len) + timeout
}

/// Appends `v` as a protobuf varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a length-delimited field (wire type 2).
fn put_bytes(out: &mut Vec<u8>, field: u8, data: &[u8]) {
    out.push(field << 3 | 2);
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// Appends a request envelope to `out`.
fn write_request(
    out: &mut Vec<u8>,
    service: &str,
    method: &str,
    payload: &[u8],
    timeout_nano: i64,
) {
    put_bytes(out, 1, service.as_bytes());
    put_bytes(out, 2, method.as_bytes());
    put_bytes(out, 3, payload);
    if timeout_nano != 0 {
        out.push(4 << 3); // field 4, varint
        // int64 goes on the wire as the varint of its two's-complement bits.
        put_varint(out, timeout_nano as u64);
    }
}

/// The bytes [`frame_message`] writes for this request, built in one buffer (the envelope is
/// not encoded on its own first): the same frames, one allocation and one copy of the payload
/// fewer, which is most of what the fake runtime spends sending a small request.
pub fn frame_request(
    conn: u32,
    stream_id: u32,
    (service, method): (&str, &str),
    payload: &[u8],
    timeout_nano: i64,
) -> Vec<u8> {
    let body_len = request_len(service, method, payload.len(), timeout_nano);
    if MSG_HEADER + body_len > GO_BUF {
        let mut body = Vec::with_capacity(body_len);
        write_request(&mut body, service, method, payload, timeout_nano);
        return frame_message(conn, stream_id, TYPE_REQUEST, &body);
    }
    let mut out = Vec::with_capacity(FRAME_HEADER + MSG_HEADER + body_len);
    out.extend_from_slice(&conn.to_be_bytes());
    // Both lengths are under 4096 here.
    out.extend_from_slice(&((MSG_HEADER + body_len) as u32).to_be_bytes());
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(&[TYPE_REQUEST, 0]);
    write_request(&mut out, service, method, payload, timeout_nano);
    out
}

/// One conn as Go's ttrpc reads it: a 4096-byte `bufio.Reader` over the mux conn, where each
/// `Read` of the conn takes one whole frame and fails (ENOMEM) when the frame is longer than the
/// slice it reads into. Frames are pushed in as the socket delivers them; whole messages come out.
#[derive(Default)]
pub struct GoConnReader {
    /// bufio's buffer: the last frame read into it, consumed up to `pos`.
    buffered: Vec<u8>,
    pos: usize,
    header: [u8; MSG_HEADER],
    header_len: usize,
    /// The message whose body is being read.
    body: Option<PartialMessage>,
}

struct PartialMessage {
    stream_id: u32,
    kind: u8,
    body: Vec<u8>,
    len: usize,
}

/// A whole ttrpc message: `(stream_id, type, body)`.
pub type WireMessage = (u32, u8, Vec<u8>);

impl GoConnReader {
    /// A reader at the start of the conn.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands `frame` to the next `Read` of the conn and appends the messages it completes to `out`.
    pub fn push(&mut self, frame: &[u8], out: &mut Vec<WireMessage>) -> Result<(), WireError> {
        // A push comes only when bufio's buffer is empty (everything before was consumed). The
        // next Read's slice is then the rest of the body when that is at least a buffer's worth
        // (bufio passes large reads through), else bufio's own buffer.
        let direct = self
            .body
            .as_ref()
            .map(|m| m.len - m.body.len())
            .filter(|r| *r >= GO_BUF);
        let cap = direct.unwrap_or(GO_BUF);
        if frame.len() > cap {
            return Err(WireError::FrameTooLong {
                frame: frame.len(),
                buf: cap,
            });
        }
        match (direct, self.body.as_mut()) {
            (Some(_), Some(m)) => m.body.extend_from_slice(frame),
            _ => {
                self.buffered.clear();
                self.buffered.extend_from_slice(frame);
                self.pos = 0;
            }
        }
        self.consume(out)
    }

    /// Moves buffered bytes into the header or body being read, emitting finished messages.
    fn consume(&mut self, out: &mut Vec<WireMessage>) -> Result<(), WireError> {
        loop {
            let avail = &self.buffered[self.pos..];
            if let Some(m) = self.body.as_mut() {
                if m.body.len() == m.len {
                    if let Some(m) = self.body.take() {
                        out.push((m.stream_id, m.kind, m.body));
                    }
                    continue;
                }
                if avail.is_empty() {
                    return Ok(());
                }
                let n = (m.len - m.body.len()).min(avail.len());
                m.body.extend_from_slice(&avail[..n]);
                self.pos += n;
                continue;
            }
            if avail.is_empty() {
                return Ok(());
            }
            let n = (MSG_HEADER - self.header_len).min(avail.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&avail[..n]);
            self.header_len += n;
            self.pos += n;
            if self.header_len == MSG_HEADER {
                self.header_len = 0;
                let h = &self.header;
                let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
                if len > MAX_BODY {
                    return Err(WireError::MessageTooLarge(len));
                }
                self.body = Some(PartialMessage {
                    stream_id: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
                    kind: h[8],
                    body: Vec::with_capacity(len),
                    len,
                });
            }
        }
    }
}

/// A ttrpc request body.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Request {
    /// Service name.
    pub service: String,
    /// Method name.
    pub method: String,
    /// Encoded request message.
    pub payload: Vec<u8>,
    /// Timeout in nanoseconds (0 = none).
    pub timeout_nano: i64,
}

/// A ttrpc response body.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Response {
    /// Status code (0 = OK).
    pub code: i32,
    /// Status message.
    pub message: String,
    /// Encoded response message.
    pub payload: Vec<u8>,
}

fn de(e: protobuf::Error) -> WireError {
    WireError::Decode(e.to_string())
}

fn skip(is: &mut CodedInputStream<'_>, tag: u32) -> Result<(), WireError> {
    let wt = WireType::new(tag & 7)
        .ok_or_else(|| WireError::Decode(format!("bad wire type in tag {tag}")))?;
    is.skip_field(wt).map_err(de)
}

impl Request {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(request_len(
            &self.service,
            &self.method,
            self.payload.len(),
            self.timeout_nano,
        ));
        write_request(
            &mut out,
            &self.service,
            &self.method,
            &self.payload,
            self.timeout_nano,
        );
        out
    }

    /// Decodes a body.
    pub fn decode(body: &[u8]) -> Result<Request, WireError> {
        let mut r = Request::default();
        let mut is = CodedInputStream::from_bytes(body);
        while let Some(tag) = is.read_raw_tag_or_eof().map_err(de)? {
            match tag {
                10 => r.service = is.read_string().map_err(de)?,
                18 => r.method = is.read_string().map_err(de)?,
                26 => r.payload = is.read_bytes().map_err(de)?,
                32 => r.timeout_nano = is.read_int64().map_err(de)?,
                t => skip(&mut is, t)?,
            }
        }
        Ok(r)
    }
}

impl Response {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut status = Vec::new();
        {
            let mut os = CodedOutputStream::vec(&mut status);
            if self.code != 0 {
                let _ = os.write_int32(1, self.code);
            }
            if !self.message.is_empty() {
                let _ = os.write_string(2, &self.message);
            }
            let _ = os.flush();
        }
        let mut out = Vec::with_capacity(self.payload.len() + status.len() + 16);
        {
            let mut os = CodedOutputStream::vec(&mut out);
            if !status.is_empty() {
                let _ = os.write_bytes(1, &status);
            }
            let _ = os.write_bytes(2, &self.payload);
            let _ = os.flush();
        }
        out
    }

    /// Decodes a body.
    pub fn decode(body: &[u8]) -> Result<Response, WireError> {
        let mut r = Response::default();
        let mut is = CodedInputStream::from_bytes(body);
        while let Some(tag) = is.read_raw_tag_or_eof().map_err(de)? {
            match tag {
                10 => {
                    let status = is.read_bytes().map_err(de)?;
                    let mut s = CodedInputStream::from_bytes(&status);
                    while let Some(t) = s.read_raw_tag_or_eof().map_err(de)? {
                        match t {
                            8 => r.code = s.read_int32().map_err(de)?,
                            18 => r.message = s.read_string().map_err(de)?,
                            t => skip(&mut s, t)?,
                        }
                    }
                }
                18 => r.payload = is.read_bytes().map_err(de)?,
                t => skip(&mut is, t)?,
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits socket bytes into `(conn, payload)` frames.
    fn frames(mut wire: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        while !wire.is_empty() {
            let len = u32::from_be_bytes([wire[4], wire[5], wire[6], wire[7]]) as usize;
            out.push(&wire[8..8 + len]);
            wire = &wire[8 + len..];
        }
        out
    }

    #[test]
    fn requests_framed_in_one_buffer_match_the_encoded_body_framed() {
        for (len, timeout_nano) in [(0, 0), (560, 2_000_000_000), (4_000, 5), (20_000, -1)] {
            let req = Request {
                service: "nri.pkg.api.v1alpha1.Plugin".into(),
                method: "CreateContainer".into(),
                payload: (0..len).map(|i| i as u8).collect(),
                timeout_nano,
            };
            let body = req.encode();
            // The same bytes as rust-protobuf's own writer produces.
            let mut expected = Vec::new();
            let mut os = CodedOutputStream::vec(&mut expected);
            os.write_string(1, &req.service).unwrap();
            os.write_string(2, &req.method).unwrap();
            os.write_bytes(3, &req.payload).unwrap();
            if timeout_nano != 0 {
                os.write_int64(4, timeout_nano).unwrap();
            }
            os.flush().unwrap();
            drop(os);
            assert_eq!(body, expected, "payload {len}, timeout {timeout_nano}");
            assert_eq!(
                body.len(),
                request_len(&req.service, &req.method, len, timeout_nano)
            );
            assert_eq!(Request::decode(&body).unwrap(), req);
            assert_eq!(
                frame_request(
                    1,
                    7,
                    (&req.service, &req.method),
                    &req.payload,
                    timeout_nano
                ),
                frame_message(1, 7, TYPE_REQUEST, &body),
                "payload {len}, timeout {timeout_nano}"
            );
        }
    }

    #[test]
    fn go_reader_rejects_a_big_frame_that_is_not_a_body_remainder() {
        let body = vec![1u8; 6000];
        // Header and whole body in one 6010-byte frame: Go's bufio asks for 4096 and fails.
        let mut msg = (6000u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&1u32.to_be_bytes());
        msg.extend_from_slice(&[1, 0]);
        msg.extend_from_slice(&body);
        let mut r = GoConnReader::new();
        assert_eq!(
            r.push(&msg, &mut Vec::new()),
            Err(WireError::FrameTooLong {
                frame: 6010,
                buf: 4096
            })
        );
    }

    #[test]
    fn go_reader_accepts_go_style_framing_and_4096_byte_frames() {
        let body: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let mut r = GoConnReader::new();
        let mut got = Vec::new();
        for f in frames(&frame_message(1, 3, TYPE_REQUEST, &body)) {
            r.push(f, &mut got).unwrap();
        }
        assert_eq!(got, vec![(3, TYPE_REQUEST, body.clone())]);
        // The same message (and a second, empty one) cut into frames of at most 4096 bytes at
        // arbitrary points, as a plugin that obeys the frame rule writes it.
        let mut msg = (body.len() as u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&[0, 0, 0, 5, TYPE_RESPONSE, 0]);
        msg.extend_from_slice(&body);
        msg.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 7, TYPE_RESPONSE, 0]);
        let mut got = Vec::new();
        for f in msg.chunks(4096) {
            r.push(f, &mut got).unwrap();
        }
        assert_eq!(
            got,
            vec![(5, TYPE_RESPONSE, body), (7, TYPE_RESPONSE, Vec::new())]
        );
    }

    #[test]
    fn go_reader_refuses_a_body_over_4_mib() {
        let mut h = (4u32 * 1024 * 1024 + 1).to_be_bytes().to_vec();
        h.extend_from_slice(&[0, 0, 0, 1, TYPE_REQUEST, 0]);
        assert_eq!(
            GoConnReader::new().push(&h, &mut Vec::new()),
            Err(WireError::MessageTooLarge(4 * 1024 * 1024 + 1))
        );
    }

    #[test]
    fn request_and_response_round_trip() {
        let req = Request {
            service: "s".into(),
            method: "m".into(),
            payload: vec![1, 2],
            timeout_nano: 5,
        };
        assert_eq!(Request::decode(&req.encode()).unwrap(), req);
        let resp = Response {
            code: 12,
            message: "no".into(),
            payload: vec![],
        };
        assert_eq!(Response::decode(&resp.encode()).unwrap(), resp);
        assert!(Response::decode(&[0xff, 0xff]).is_err());
    }
}

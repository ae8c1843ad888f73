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
use tokio::sync::mpsc;

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
    /// The connection ended.
    #[error("connection closed")]
    Closed,
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

/// One conn as Go's ttrpc sees it: a `bufio.Reader` of 4096 bytes over the mux conn.
pub struct GoConnReader {
    frames: mpsc::UnboundedReceiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl GoConnReader {
    /// A reader over the frames the socket reader routes to this conn.
    pub fn new(frames: mpsc::UnboundedReceiver<Vec<u8>>) -> Self {
        GoConnReader {
            frames,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Go mux `conn.Read(p)` with `len(p) == cap`: one whole frame, or an error if it does not fit.
    async fn mux_read(&mut self, cap: usize) -> Result<Vec<u8>, WireError> {
        let f = self.frames.recv().await.ok_or(WireError::Closed)?;
        if f.len() > cap {
            return Err(WireError::FrameTooLong {
                frame: f.len(),
                buf: cap,
            });
        }
        Ok(f)
    }

    /// `bufio.Reader.Read(p)`.
    async fn read(&mut self, p: &mut [u8]) -> Result<usize, WireError> {
        if self.pos < self.buf.len() {
            let n = p.len().min(self.buf.len() - self.pos);
            p[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(n);
        }
        if p.len() >= GO_BUF {
            let f = self.mux_read(p.len()).await?;
            p[..f.len()].copy_from_slice(&f);
            return Ok(f.len());
        }
        self.buf = self.mux_read(GO_BUF).await?;
        self.pos = 0;
        let n = p.len().min(self.buf.len());
        p[..n].copy_from_slice(&self.buf[..n]);
        self.pos = n;
        Ok(n)
    }

    async fn read_full(&mut self, p: &mut [u8]) -> Result<(), WireError> {
        let mut done = 0;
        while done < p.len() {
            done += self.read(&mut p[done..]).await?;
        }
        Ok(())
    }

    /// Reads one ttrpc message: `(stream_id, type, body)`.
    pub async fn read_message(&mut self) -> Result<(u32, u8, Vec<u8>), WireError> {
        let mut h = [0u8; MSG_HEADER];
        self.read_full(&mut h).await?;
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let sid = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        if len > MAX_BODY {
            return Err(WireError::MessageTooLarge(len));
        }
        let mut body = vec![0u8; len];
        self.read_full(&mut body).await?;
        Ok((sid, h[8], body))
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
        let mut out = Vec::with_capacity(self.payload.len() + 64);
        {
            let mut os = CodedOutputStream::vec(&mut out);
            // Writing into a Vec cannot fail.
            let _ = os.write_string(1, &self.service);
            let _ = os.write_string(2, &self.method);
            let _ = os.write_bytes(3, &self.payload);
            if self.timeout_nano != 0 {
                let _ = os.write_int64(4, self.timeout_nano);
            }
            let _ = os.flush();
        }
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

    #[tokio::test]
    async fn go_reader_rejects_a_big_frame_that_is_not_a_body_remainder() {
        let (tx, rx) = mpsc::unbounded_channel();
        let body = vec![1u8; 6000];
        // Header and whole body in one 6010-byte frame: Go's bufio asks for 4096 and fails.
        let mut msg = (6000u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&1u32.to_be_bytes());
        msg.extend_from_slice(&[1, 0]);
        msg.extend_from_slice(&body);
        tx.send(msg).unwrap();
        let mut r = GoConnReader::new(rx);
        assert_eq!(
            r.read_message().await,
            Err(WireError::FrameTooLong {
                frame: 6010,
                buf: 4096
            })
        );
    }

    #[tokio::test]
    async fn go_reader_accepts_go_style_framing() {
        let (tx, rx) = mpsc::unbounded_channel();
        let body: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let wire = frame_message(1, 3, TYPE_REQUEST, &body);
        let mut rest = &wire[..];
        while !rest.is_empty() {
            let len = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
            tx.send(rest[8..8 + len].to_vec()).unwrap();
            rest = &rest[8 + len..];
        }
        let mut r = GoConnReader::new(rx);
        assert_eq!(r.read_message().await.unwrap(), (3, TYPE_REQUEST, body));
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

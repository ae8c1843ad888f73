//! Rewriting the request headers a kubelet sends so that the HTTP/2 server accepts them.
//!
//! The kubelet's gRPC clients (grpc-go) dial the bare socket path, and grpc-go then sends the
//! percent-encoded path (`%2Fvar%2Flib%2Fkubelet%2F...`) as `:authority`. The HTTP/2 server under
//! tonic (h2) resets every such stream as malformed. [`Rewriter`] sits between the socket and the
//! server and, in the client-to-server direction only, decodes each header block (a HEADERS frame
//! and its CONTINUATIONs) with the client's HPACK context, replaces an `:authority` the server
//! would refuse by [`REPLACEMENT_AUTHORITY`], and encodes the block again with literals that are
//! never indexed, so the server's HPACK table stays empty and in step whatever the client
//! indexed. Every other frame passes byte for byte. Padding is dropped (it carries nothing);
//! priority fields and END_STREAM are kept; a block larger than a frame once re-encoded is cut
//! into CONTINUATION frames of at most [`MAX_FRAME`] bytes.
//!
//! Memory is bounded: a header block is held until it is complete, at most
//! [`MAX_HEADER_BLOCK`] bytes encoded and [`MAX_HEADER_LIST`] bytes decoded; the HPACK table is at
//! most [`HEADER_TABLE_SIZE`] bytes (the server never advertises more). Anything else is a
//! connection error: the adapter closes the connection and logs why.

use loona_hpack::Decoder;
use tonic::codegen::http::uri::Authority;

use super::frames::{self, HEAD_LEN, Head, MAX_FRAME, PREFACE};
use super::streams::{Streams, TooManyStreams};

/// The largest header block (HEADERS plus CONTINUATIONs, encoded) a client may send.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// The largest decoded header list (RFC 7541 section 4.1 sizes: name + value + 32 per field).
pub const MAX_HEADER_LIST: usize = 64 * 1024;

/// The HPACK dynamic table size the server allows its clients (the HTTP/2 default; the
/// kubelet-facing servers do not change `SETTINGS_HEADER_TABLE_SIZE`).
pub const HEADER_TABLE_SIZE: usize = 4096;

/// What an `:authority` the server would refuse becomes.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Why a client's bytes cannot be passed to the server; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// A header block grew past [`MAX_HEADER_BLOCK`].
    #[error(
        "stream {stream}: a header block of more than {MAX_HEADER_BLOCK} bytes (no kubelet sends one)"
    )]
    BlockTooLarge {
        /// The stream.
        stream: u32,
    },
    /// A decoded header list grew past [`MAX_HEADER_LIST`].
    #[error("stream {stream}: headers of more than {MAX_HEADER_LIST} bytes once decoded")]
    ListTooLarge {
        /// The stream.
        stream: u32,
    },
    /// A HEADERS or CONTINUATION frame larger than the server's frame size.
    #[error(
        "stream {stream}: a header frame of {len} bytes, more than the {MAX_FRAME} the server allows"
    )]
    FrameTooLarge {
        /// The stream.
        stream: u32,
        /// The frame's payload length.
        len: usize,
    },
    /// The HPACK block does not decode.
    #[error("stream {stream}: the header block does not decode (HPACK): {reason}")]
    Hpack {
        /// The stream.
        stream: u32,
        /// The decoder's reason.
        reason: String,
    },
    /// Frames in an order or shape HTTP/2 forbids.
    #[error("stream {stream}: {what}")]
    Protocol {
        /// The stream.
        stream: u32,
        /// What was wrong.
        what: &'static str,
    },
    /// More streams open than the connection may hold.
    #[error("more than {0} streams open on one connection")]
    TooManyStreams(usize),
}

impl From<TooManyStreams> for RewriteError {
    fn from(e: TooManyStreams) -> Self {
        RewriteError::TooManyStreams(e.0)
    }
}

/// Where the client's byte stream is.
#[derive(Debug)]
enum Stage {
    /// Matching the connection preface; this many bytes of it seen.
    Preface(usize),
    /// Reading frames.
    Frames,
    /// Not HTTP/2 with prior knowledge: passed through for the server to refuse.
    Passthrough,
}

/// The frame being read.
#[derive(Debug)]
enum Frame {
    /// A frame passed through; this many payload bytes still to come.
    Pass(usize),
    /// A HEADERS or CONTINUATION frame being collected.
    Collect { head: Head, payload: Vec<u8> },
}

/// A header block whose CONTINUATIONs are still to come.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server half of one connection.
pub struct Rewriter {
    stage: Stage,
    head: [u8; HEAD_LEN],
    head_len: usize,
    frame: Option<Frame>,
    block: Option<Block>,
    decoder: Decoder<'static>,
    replaced: Option<String>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Rewriter {
            stage: Stage::Preface(0),
            head: [0; HEAD_LEN],
            head_len: 0,
            frame: None,
            block: None,
            decoder,
            replaced: None,
        }
    }
}

impl Rewriter {
    /// Takes the last `:authority` replaced since the previous call (for a log line).
    pub fn take_replaced(&mut self) -> Option<String> {
        self.replaced.take()
    }

    /// Whether a header block is held, waiting for its CONTINUATION frames.
    pub fn holds_block(&self) -> bool {
        self.block.is_some() || matches!(self.frame, Some(Frame::Collect { .. }))
    }

    /// Consumes the client's next bytes, appending what the server is to read to `out` and
    /// following the streams the client opens and closes.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        out: &mut Vec<u8>,
        streams: &mut Streams,
    ) -> Result<(), RewriteError> {
        while !input.is_empty() {
            match self.stage {
                Stage::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                Stage::Preface(seen) => {
                    let take = (PREFACE.len() - seen).min(input.len());
                    if input[..take] != PREFACE[seen..seen + take] {
                        out.extend_from_slice(&PREFACE[..seen]);
                        self.stage = Stage::Passthrough;
                        continue;
                    }
                    input = &input[take..];
                    self.stage = if seen + take == PREFACE.len() {
                        out.extend_from_slice(PREFACE);
                        Stage::Frames
                    } else {
                        Stage::Preface(seen + take)
                    };
                }
                Stage::Frames => input = self.feed_frames(input, out, streams)?,
            }
        }
        Ok(())
    }

    /// Reads frames from `input` until it is used up; returns what is left (nothing).
    fn feed_frames<'a>(
        &mut self,
        mut input: &'a [u8],
        out: &mut Vec<u8>,
        streams: &mut Streams,
    ) -> Result<&'a [u8], RewriteError> {
        while !input.is_empty() {
            match &mut self.frame {
                None => {
                    let take = (HEAD_LEN - self.head_len).min(input.len());
                    self.head[self.head_len..self.head_len + take].copy_from_slice(&input[..take]);
                    self.head_len += take;
                    input = &input[take..];
                    if self.head_len == HEAD_LEN {
                        self.head_len = 0;
                        self.start_frame(Head::parse(&self.head), out, streams)?;
                    }
                }
                Some(Frame::Pass(left)) => {
                    let take = (*left).min(input.len());
                    out.extend_from_slice(&input[..take]);
                    *left -= take;
                    input = &input[take..];
                    if *left == 0 {
                        self.frame = None;
                    }
                }
                Some(Frame::Collect { head, payload }) => {
                    let take = (head.len - payload.len()).min(input.len());
                    payload.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if payload.len() == head.len {
                        self.end_collect(out, streams)?;
                    }
                }
            }
        }
        Ok(input)
    }

    fn start_frame(
        &mut self,
        head: Head,
        out: &mut Vec<u8>,
        streams: &mut Streams,
    ) -> Result<(), RewriteError> {
        let protocol = |what| RewriteError::Protocol {
            stream: head.stream,
            what,
        };
        if let Some(block) = &self.block
            && (head.kind != frames::CONTINUATION || head.stream != block.stream)
        {
            return Err(protocol(
                "a header block interrupted before its last CONTINUATION",
            ));
        }
        match head.kind {
            frames::HEADERS | frames::CONTINUATION => {
                if head.kind == frames::CONTINUATION && self.block.is_none() {
                    return Err(protocol("a CONTINUATION frame without a header block"));
                }
                if head.len > MAX_FRAME {
                    return Err(RewriteError::FrameTooLarge {
                        stream: head.stream,
                        len: head.len,
                    });
                }
                self.frame = Some(Frame::Collect {
                    head,
                    payload: Vec::with_capacity(head.len),
                });
                if head.len == 0 {
                    self.end_collect(out, streams)?;
                }
                return Ok(());
            }
            frames::PUSH_PROMISE => return Err(protocol("a client sent PUSH_PROMISE")),
            frames::DATA if head.flags & frames::END_STREAM != 0 => streams.client_end(head.stream),
            frames::RST_STREAM => streams.reset(head.stream),
            _ => {}
        }
        out.extend_from_slice(&self.head);
        self.frame = (head.len > 0).then_some(Frame::Pass(head.len));
        Ok(())
    }

    /// A HEADERS or CONTINUATION frame is complete.
    fn end_collect(
        &mut self,
        out: &mut Vec<u8>,
        streams: &mut Streams,
    ) -> Result<(), RewriteError> {
        let Some(Frame::Collect { head, payload }) = self.frame.take() else {
            return Ok(());
        };
        let stream = head.stream;
        let protocol = |what| RewriteError::Protocol { stream, what };
        if head.kind == frames::HEADERS {
            let mut start = 0;
            let mut end = payload.len();
            if head.flags & frames::PADDED != 0 {
                let pad = usize::from(
                    *payload
                        .first()
                        .ok_or(protocol("a padded HEADERS frame without its pad length"))?,
                );
                start = 1;
                end = end
                    .checked_sub(pad)
                    .filter(|&e| e >= start)
                    .ok_or(protocol("HEADERS padding longer than the frame"))?;
            }
            let mut priority = None;
            if head.flags & frames::PRIORITY != 0 {
                let fields: [u8; 5] = payload
                    .get(start..start + 5)
                    .filter(|_| start + 5 <= end)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(protocol("HEADERS too short for its priority fields"))?;
                priority = Some(fields);
                start += 5;
            }
            self.block = Some(Block {
                stream,
                end_stream: head.flags & frames::END_STREAM != 0,
                priority,
                fragment: payload[start..end].to_vec(),
            });
        } else if let Some(block) = &mut self.block {
            if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                return Err(RewriteError::BlockTooLarge { stream });
            }
            block.fragment.extend_from_slice(&payload);
        }
        if head.flags & frames::END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.finish(block, out, streams)?;
        }
        Ok(())
    }

    /// Decodes a complete header block and writes it again for the server.
    fn finish(
        &mut self,
        block: Block,
        out: &mut Vec<u8>,
        streams: &mut Streams,
    ) -> Result<(), RewriteError> {
        let stream = block.stream;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        let mut size = 0usize;
        let mut replaced = None;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                size += name.len() + value.len() + 32;
                if size > MAX_HEADER_LIST {
                    return;
                }
                let value = if &*name == b":authority" && Authority::try_from(&*value).is_err() {
                    replaced = Some(String::from_utf8_lossy(&value).into_owned());
                    REPLACEMENT_AUTHORITY
                } else {
                    &value
                };
                literal(&name, value, &mut encoded);
            })
            .map_err(|e| RewriteError::Hpack {
                stream,
                reason: e.to_string(),
            })?;
        if size > MAX_HEADER_LIST {
            return Err(RewriteError::ListTooLarge { stream });
        }
        if replaced.is_some() {
            self.replaced = replaced;
        }
        streams.client_headers(stream, block.end_stream)?;
        write_block(&block, &encoded, out);
        Ok(())
    }
}

/// Appends a "literal header field without indexing, new name" (RFC 7541 section 6.2.2),
/// strings not Huffman-coded.
fn literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0);
    for s in [name, value] {
        integer(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// Appends an HPACK integer with an `n`-bit prefix after `flags` (RFC 7541 section 5.1).
fn integer(mut value: usize, n: u8, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
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

/// Writes `encoded` as a HEADERS frame and as many CONTINUATION frames as it needs.
fn write_block(block: &Block, encoded: &[u8], out: &mut Vec<u8>) {
    let prio_len = if block.priority.is_some() { 5 } else { 0 };
    let first = encoded.len().min(MAX_FRAME - prio_len);
    let (head_part, mut rest) = encoded.split_at(first);
    let mut flags = 0;
    if block.end_stream {
        flags |= frames::END_STREAM;
    }
    if block.priority.is_some() {
        flags |= frames::PRIORITY;
    }
    if rest.is_empty() {
        flags |= frames::END_HEADERS;
    }
    Head {
        len: prio_len + head_part.len(),
        kind: frames::HEADERS,
        flags,
        stream: block.stream,
    }
    .write(out);
    if let Some(p) = &block.priority {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(head_part);
    while !rest.is_empty() {
        let (part, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        Head {
            len: part.len(),
            kind: frames::CONTINUATION,
            flags: if rest.is_empty() {
                frames::END_HEADERS
            } else {
                0
            },
            stream: block.stream,
        }
        .write(out);
        out.extend_from_slice(part);
    }
}

#[cfg(test)]
#[path = "rewrite_tests.rs"]
mod tests;

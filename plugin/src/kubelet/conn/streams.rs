//! Which HTTP/2 streams of one connection are open, from the frames each side sends, and what the
//! server side says about the streams it rejects.
//!
//! A connection with no stream open is idle: the kubelet's long-lived calls (ListAndWatch, the
//! DRA health watch) each keep a stream open, so they are never cut as idle.

use std::collections::HashMap;

use super::frames::{self, HEAD_LEN, Head};

/// The client closed its half of the stream.
const CLIENT_DONE: u8 = 1;
/// The server closed its half.
const SERVER_DONE: u8 = 2;

/// The streams of one connection that are not closed yet.
#[derive(Debug)]
pub struct Streams {
    open: HashMap<u32, u8>,
    cap: usize,
}

/// A client opened more streams than the connection may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyStreams(pub usize);

impl Streams {
    /// No stream open; at most `cap` tracked at once.
    pub fn new(cap: usize) -> Streams {
        Streams {
            open: HashMap::new(),
            cap,
        }
    }

    /// How many streams are open.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// The client sent a header block on `stream` (a request, or trailers).
    pub fn client_headers(&mut self, stream: u32, end: bool) -> Result<(), TooManyStreams> {
        if !self.open.contains_key(&stream) {
            if self.open.len() >= self.cap {
                return Err(TooManyStreams(self.cap));
            }
            self.open.insert(stream, 0);
        }
        if end {
            self.close_half(stream, CLIENT_DONE);
        }
        Ok(())
    }

    /// The client ended its half of `stream` with a DATA frame.
    pub fn client_end(&mut self, stream: u32) {
        self.close_half(stream, CLIENT_DONE);
    }

    /// The server ended its half of `stream`.
    pub fn server_end(&mut self, stream: u32) {
        self.close_half(stream, SERVER_DONE);
    }

    /// Either side reset `stream`.
    pub fn reset(&mut self, stream: u32) {
        self.open.remove(&stream);
    }

    fn close_half(&mut self, stream: u32, half: u8) {
        if let Some(state) = self.open.get_mut(&stream) {
            *state |= half;
            if *state == CLIENT_DONE | SERVER_DONE {
                self.open.remove(&stream);
            }
        }
    }
}

/// What the server wrote that is worth a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSaid {
    /// The server reset a stream.
    Reset {
        /// The stream.
        stream: u32,
        /// The HTTP/2 error code.
        code: u32,
    },
    /// The server is closing the connection.
    GoAway {
        /// The HTTP/2 error code.
        code: u32,
    },
}

/// Follows the frames the server writes (passively: they are never changed).
#[derive(Debug, Default)]
pub struct ServerWatch {
    head: [u8; HEAD_LEN],
    head_len: usize,
    /// The frame being written and how much of its payload is still to come.
    current: Option<(Head, usize)>,
    /// The first bytes of an RST_STREAM or GOAWAY payload (their error codes).
    payload: Vec<u8>,
}

impl ServerWatch {
    /// Follows `written` (the next bytes the server wrote), updating `streams` and returning
    /// the resets and GOAWAYs seen.
    pub fn observe(&mut self, mut written: &[u8], streams: &mut Streams) -> Vec<ServerSaid> {
        let mut said = Vec::new();
        while !written.is_empty() {
            let Some((head, left)) = self.current else {
                let take = (HEAD_LEN - self.head_len).min(written.len());
                self.head[self.head_len..self.head_len + take].copy_from_slice(&written[..take]);
                self.head_len += take;
                written = &written[take..];
                if self.head_len == HEAD_LEN {
                    self.head_len = 0;
                    let head = Head::parse(&self.head);
                    self.payload.clear();
                    self.current = Some((head, head.len));
                    self.frame_started(&head, streams);
                    self.maybe_finish(streams, &mut said);
                }
                continue;
            };
            let take = left.min(written.len());
            let wanted: usize = match head.kind {
                frames::RST_STREAM => 4,
                frames::GOAWAY => 8,
                _ => 0,
            };
            let keep = wanted.saturating_sub(self.payload.len()).min(take);
            self.payload.extend_from_slice(&written[..keep]);
            self.current = Some((head, left - take));
            written = &written[take..];
            self.maybe_finish(streams, &mut said);
        }
        said
    }

    fn frame_started(&mut self, head: &Head, streams: &mut Streams) {
        if matches!(head.kind, frames::DATA | frames::HEADERS)
            && head.flags & frames::END_STREAM != 0
        {
            streams.server_end(head.stream);
        }
    }

    fn maybe_finish(&mut self, streams: &mut Streams, said: &mut Vec<ServerSaid>) {
        let Some((head, 0)) = self.current else {
            return;
        };
        self.current = None;
        let code_at = |at: usize| {
            self.payload
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        };
        match head.kind {
            frames::RST_STREAM => {
                streams.reset(head.stream);
                if let Some(code) = code_at(0) {
                    said.push(ServerSaid::Reset {
                        stream: head.stream,
                        code,
                    });
                }
            }
            frames::GOAWAY => {
                if let Some(code) = code_at(4) {
                    said.push(ServerSaid::GoAway { code });
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Head {
            len: payload.len(),
            kind,
            flags,
            stream,
        }
        .write(&mut out);
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn a_stream_closes_when_both_halves_end_or_either_resets() {
        let mut s = Streams::new(8);
        s.client_headers(1, false).unwrap();
        s.client_headers(3, true).unwrap();
        assert_eq!(s.open(), 2);
        s.client_end(1);
        s.server_end(1);
        assert_eq!(s.open(), 1);
        s.reset(3);
        assert_eq!(s.open(), 0);
        // A server frame on a stream never opened changes nothing.
        s.server_end(9);
        assert_eq!(s.open(), 0);
    }

    #[test]
    fn more_streams_than_the_cap_are_refused() {
        let mut s = Streams::new(2);
        s.client_headers(1, false).unwrap();
        s.client_headers(3, false).unwrap();
        // Trailers on an open stream are fine.
        s.client_headers(3, true).unwrap();
        assert_eq!(s.client_headers(5, false), Err(TooManyStreams(2)));
    }

    #[test]
    fn the_watch_sees_ends_and_resets_across_split_writes() {
        let mut s = Streams::new(8);
        s.client_headers(1, true).unwrap();
        s.client_headers(3, true).unwrap();
        let mut bytes = frame(frames::HEADERS, frames::END_HEADERS, 1, b"abc");
        bytes.extend(frame(frames::DATA, 0, 1, &[0; 100]));
        bytes.extend(frame(
            frames::HEADERS,
            frames::END_HEADERS | frames::END_STREAM,
            1,
            b"t",
        ));
        bytes.extend(frame(frames::RST_STREAM, 0, 3, &1u32.to_be_bytes()));
        let mut goaway = 3u32.to_be_bytes().to_vec();
        goaway.extend(0u32.to_be_bytes());
        goaway.extend(b"debug data");
        bytes.extend(frame(frames::GOAWAY, 0, 0, &goaway));
        // Byte by byte: every boundary falls somewhere.
        let mut w = ServerWatch::default();
        let mut said = Vec::new();
        for b in &bytes {
            said.extend(w.observe(std::slice::from_ref(b), &mut s));
        }
        assert_eq!(s.open(), 0);
        assert_eq!(
            said,
            [
                ServerSaid::Reset { stream: 3, code: 1 },
                ServerSaid::GoAway { code: 0 }
            ]
        );
    }
}

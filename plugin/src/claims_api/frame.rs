//! A guard on the bytes a claims API peer sends, below ttrpc.
//!
//! It follows the ttrpc framing (10-byte header: length u32 BE, stream id u32 BE, type u8, flags u8)
//! and ends the connection on the first frame that is not a request or that declares a payload
//! over ttrpc's 4 MiB frame limit. ttrpc alone would try to read and discard such a body, holding
//! the connection open on garbage; with the guard, malformed bytes close the connection.
//! The finer, configurable message limit is checked per request before decoding (see `service.rs`),
//! so a well-formed but too large request gets a clear status instead of a closed connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::peer::PeerCred;

const HEADER_LEN: usize = ttrpc::proto::MESSAGE_HEADER_LENGTH;

/// Wraps a connected stream and checks every inbound frame header.
pub(crate) struct FrameGuard<S> {
    inner: S,
    peer: PeerCred,
    header: [u8; HEADER_LEN],
    header_filled: usize,
    body_left: usize,
    max_frame: usize,
    broken: bool,
}

impl<S> FrameGuard<S> {
    /// Guards `inner`, refusing frames whose payload exceeds `max_frame` bytes.
    pub(crate) fn new(inner: S, peer: PeerCred, max_frame: usize) -> Self {
        Self {
            inner,
            peer,
            header: [0; HEADER_LEN],
            header_filled: 0,
            body_left: 0,
            max_frame,
            broken: false,
        }
    }

    /// Follows the frames in `bytes`; an error names what was wrong.
    fn inspect(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len());
                self.body_left -= take;
                bytes = &bytes[take..];
                continue;
            }
            let take = (HEADER_LEN - self.header_filled).min(bytes.len());
            self.header[self.header_filled..self.header_filled + take]
                .copy_from_slice(&bytes[..take]);
            self.header_filled += take;
            bytes = &bytes[take..];
            if self.header_filled == HEADER_LEN {
                self.header_filled = 0;
                let [a, b, c, d, ..] = self.header;
                let length = u32::from_be_bytes([a, b, c, d]) as usize;
                let kind = self.header[8];
                if kind != ttrpc::proto::MESSAGE_TYPE_REQUEST {
                    return Err(format!(
                        "frame type {kind} is not a ttrpc request (the claims API has no streams)"
                    ));
                }
                if length > self.max_frame {
                    return Err(format!(
                        "frame declares {length} bytes, over the limit of {} bytes",
                        self.max_frame
                    ));
                }
                self.body_left = length;
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FrameGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "claims API connection closed after a malformed frame",
            )));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Err(why) = this.inspect(&buf.filled()[before..]) {
            this.broken = true;
            tracing::warn!(
                peer_uid = this.peer.uid,
                peer_pid = this.peer.pid,
                "closing claims API connection: {why}"
            );
            buf.set_filled(before);
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FrameGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> FrameGuard<()> {
        FrameGuard::new(
            (),
            PeerCred {
                uid: 0,
                gid: 0,
                pid: 0,
            },
            100,
        )
    }

    fn header(len: u32, kind: u8) -> Vec<u8> {
        let mut h = len.to_be_bytes().to_vec();
        h.extend_from_slice(&1u32.to_be_bytes());
        h.extend_from_slice(&[kind, 0]);
        h
    }

    #[test]
    fn follows_frames_split_anywhere() {
        let mut stream = header(5, 1);
        stream.extend_from_slice(b"hello");
        stream.extend(header(0, 1));
        stream.extend(header(3, 1));
        stream.extend_from_slice(b"abc");
        for split in 0..stream.len() {
            let mut g = guard();
            g.inspect(&stream[..split]).expect("first part");
            g.inspect(&stream[split..]).expect("second part");
            assert_eq!((g.header_filled, g.body_left), (0, 0));
        }
    }

    #[test]
    fn refuses_oversized_and_non_request_frames() {
        let err = guard().inspect(&header(101, 1)).expect_err("oversized");
        assert!(err.contains("101"), "{err}");
        let err = guard().inspect(&header(1, 3)).expect_err("data frame");
        assert!(err.contains("type 3"), "{err}");
        assert!(guard().inspect(b"GET / HTTP/1.1\r\n").is_err());
    }
}

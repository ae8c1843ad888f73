//! A guard on the bytes a claims API peer sends, below ttrpc.
//!
//! It follows the ttrpc framing (10-byte header: length u32 BE, stream id u32 BE, type u8, flags u8)
//! and ends the connection on the first frame that is not a request or that declares a payload
//! over ttrpc's 4 MiB frame limit. ttrpc alone would try to read and discard such a body, holding
//! the connection open on garbage; with the guard, malformed bytes close the connection.
//! It also counts the calls in flight (request frames read, response frames written), so a
//! connection silent past the idle timeout with none in flight can be closed, and it holds the
//! connection's slot under the connection cap until the connection ends. A connection that sends
//! no request within the first-request timeout is closed, and so is one the acceptor evicts to
//! make room for a new peer (see `flood.rs`).
//! The finer, configurable message limit is checked per request before decoding (see `service.rs`),
//! so a well-formed but too large request gets a clear status instead of a closed connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use super::flood::{ConnEvent, ConnLog, ConnState};
use super::peer::PeerCred;

const HEADER_LEN: usize = ttrpc::proto::MESSAGE_HEADER_LENGTH;

/// Follows ttrpc frame headers across arbitrary chunks of one direction of a connection.
#[derive(Default)]
struct Framer {
    header: [u8; HEADER_LEN],
    header_filled: usize,
    body_left: usize,
}

impl Framer {
    /// Follows the frames in `bytes`, calling `on_header(length, type)` for each whole header;
    /// its error stops the walk.
    fn feed(
        &mut self,
        mut bytes: &[u8],
        mut on_header: impl FnMut(usize, u8) -> Result<(), String>,
    ) -> Result<(), String> {
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
                on_header(length, self.header[8])?;
                self.body_left = length;
            }
        }
        Ok(())
    }
}

/// Closes a connection that has no call in flight and has been silent this long.
struct Idle {
    after: Duration,
    timer: Pin<Box<Sleep>>,
}

/// Wraps a connected stream and checks every inbound frame header.
pub(crate) struct FrameGuard<S> {
    inner: S,
    peer: PeerCred,
    inbound: Framer,
    outbound: Framer,
    /// Requests read whose response has not been written yet.
    in_flight: usize,
    max_frame: usize,
    broken: bool,
    idle: Option<Idle>,
    /// Until the first request: closes the connection when it passes.
    first_request: Option<Pin<Box<Sleep>>>,
    /// Whether a request was read.
    requested: bool,
    /// What the acceptor sees of the connection (for eviction), and where closes are counted.
    tracked: Option<(Arc<ConnState>, Arc<ConnLog>)>,
    /// The connection's slot under the connection cap, freed with the connection.
    _slot: Option<OwnedSemaphorePermit>,
}

impl<S> FrameGuard<S> {
    /// Guards `inner`, refusing frames whose payload exceeds `max_frame` bytes.
    pub(crate) fn new(inner: S, peer: PeerCred, max_frame: usize) -> Self {
        Self {
            inner,
            peer,
            inbound: Framer::default(),
            outbound: Framer::default(),
            in_flight: 0,
            max_frame,
            broken: false,
            idle: None,
            first_request: None,
            requested: false,
            tracked: None,
            _slot: None,
        }
    }

    /// Ends the connection unless it sends a request within `within`. Needs a tokio runtime.
    pub(crate) fn close_without_request(mut self, within: Duration) -> Self {
        self.first_request = Some(Box::pin(tokio::time::sleep(within)));
        self
    }

    /// Reports activity to `state` (which the acceptor may evict the connection through) and
    /// counts closes in `log`.
    pub(crate) fn tracked(mut self, state: Arc<ConnState>, log: Arc<ConnLog>) -> Self {
        self.tracked = Some((state, log));
        self
    }

    /// Counts a close of this connection (or logs it, untracked).
    fn closing(&self, event: ConnEvent, why: &str) {
        match &self.tracked {
            Some((_, log)) => log.note(event, Some(self.peer.uid), why),
            None => tracing::info!(
                peer_uid = self.peer.uid,
                peer_pid = self.peer.pid,
                "claims API connection {why}"
            ),
        }
    }

    /// Ends the connection (as the peer closing it would) once it has been idle for `after`
    /// with no call in flight. Needs a tokio runtime.
    pub(crate) fn close_when_idle(mut self, after: Duration) -> Self {
        self.idle = Some(Idle {
            after,
            timer: Box::pin(tokio::time::sleep(after)),
        });
        self
    }

    /// Holds `slot` for as long as the connection lives.
    pub(crate) fn holding(mut self, slot: OwnedSemaphorePermit) -> Self {
        self._slot = Some(slot);
        self
    }

    fn touch(&mut self) {
        if let Some(idle) = &mut self.idle {
            let at = tokio::time::Instant::now() + idle.after;
            idle.timer.as_mut().reset(at);
        }
        if let Some((state, _)) = &self.tracked {
            state.active(self.in_flight, self.requested);
        }
    }

    /// Follows the frames in `bytes`; an error names what was wrong.
    fn inspect(&mut self, bytes: &[u8]) -> Result<(), String> {
        let max_frame = self.max_frame;
        let mut requests = 0;
        self.inbound.feed(bytes, |length, kind| {
            if kind != ttrpc::proto::MESSAGE_TYPE_REQUEST {
                return Err(format!(
                    "frame type {kind} is not a ttrpc request (the claims API has no streams)"
                ));
            }
            if length > max_frame {
                return Err(format!(
                    "frame declares {length} bytes, over the limit of {max_frame} bytes"
                ));
            }
            requests += 1;
            Ok(())
        })?;
        self.in_flight += requests;
        if requests > 0 {
            self.requested = true;
            self.first_request = None;
        }
        Ok(())
    }

    /// Counts the responses in what was written.
    fn written(&mut self, bytes: &[u8]) {
        let mut responses = 0;
        let _ = self.outbound.feed(bytes, |_, kind| {
            if kind == ttrpc::proto::MESSAGE_TYPE_RESPONSE {
                responses += 1;
            }
            Ok(())
        });
        self.in_flight = self.in_flight.saturating_sub(responses);
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
        if let Some((state, _)) = &this.tracked
            && state.evicted(cx)
        {
            // Made room for a new peer (counted by the acceptor). As if the peer had closed:
            // ttrpc ends the connection, freeing its slot.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_pending() {
            if let Some(timer) = &mut this.first_request
                && timer.as_mut().poll(cx).is_ready()
            {
                this.first_request = None;
                this.closing(
                    ConnEvent::NoFirstRequest,
                    "closed: no request came within claims_api.first_request_timeout_seconds",
                );
                return Poll::Ready(Ok(()));
            }
            let in_flight = this.in_flight;
            let mut idle_for = None;
            if let Some(idle) = &mut this.idle {
                // Polled even while calls are in flight, so the timer always holds this task's
                // waker; a deadline passed during a call just starts a new period.
                while idle.timer.as_mut().poll(cx).is_ready() {
                    if in_flight == 0 {
                        idle_for = Some(idle.after);
                        break;
                    }
                    let at = tokio::time::Instant::now() + idle.after;
                    idle.timer.as_mut().reset(at);
                }
            }
            if let Some(after) = idle_for {
                this.closing(
                    ConnEvent::Idle,
                    &format!(
                        "closed: idle for {}s with no call in flight (claims_api.idle_timeout_seconds); the caller reconnects",
                        after.as_secs_f64()
                    ),
                );
                // As if the peer had closed: ttrpc ends the connection, freeing its slot.
                return Poll::Ready(Ok(()));
            }
            return Poll::Pending;
        }
        ready!(read)?;
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
        this.touch();
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FrameGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
        self.written(&buf[..n]);
        self.touch();
        Poll::Ready(Ok(n))
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
            assert_eq!((g.inbound.header_filled, g.inbound.body_left), (0, 0));
            assert_eq!(g.in_flight, 3);
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

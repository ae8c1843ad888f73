//! One accepted kubelet connection as the HTTP/2 server sees it: the client's bytes go through
//! the [`Rewriter`], the server's bytes are followed by a [`ServerWatch`], and a connection with
//! no stream open for the idle timeout reads as closed by the client.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::time::{Instant, Sleep};

use super::frames;
use super::listen::Slot;
use super::rewrite::Rewriter;
use super::streams::{ServerSaid, ServerWatch, Streams};

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// A kubelet connection wrapped for the HTTP/2 server.
pub struct KubeletConn {
    inner: UnixStream,
    socket: Arc<str>,
    rewriter: Rewriter,
    watch: ServerWatch,
    streams: Streams,
    /// Rewritten bytes the server has not read yet, from `pending_at`.
    pending: Vec<u8>,
    pending_at: usize,
    chunk: Box<[u8]>,
    idle_timeout: Option<Duration>,
    idle: Pin<Box<Sleep>>,
    /// Whether the idle timer runs (no stream open).
    idle_armed: bool,
    /// Set once the connection was closed for being idle or broken: reads end.
    ended: bool,
    /// The reader's waker, to wake when a write leaves the connection idle.
    read_waker: Option<Waker>,
    _slot: Slot,
}

impl KubeletConn {
    pub(super) fn new(
        inner: UnixStream,
        socket: Arc<str>,
        idle_timeout: Option<Duration>,
        slot: Slot,
    ) -> KubeletConn {
        let deadline = Instant::now() + idle_timeout.unwrap_or(Duration::ZERO);
        KubeletConn {
            inner,
            socket,
            rewriter: Rewriter::default(),
            watch: ServerWatch::default(),
            streams: Streams::new(4 * super::MAX_STREAMS as usize),
            pending: Vec::new(),
            pending_at: 0,
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            idle_timeout,
            idle: Box::pin(tokio::time::sleep_until(deadline)),
            idle_armed: idle_timeout.is_some(),
            ended: false,
            read_waker: None,
            _slot: slot,
        }
    }

    /// How many streams are open now.
    pub fn open_streams(&self) -> usize {
        self.streams.open()
    }

    /// Arms or disarms the idle timer after the open streams changed.
    fn streams_changed(&mut self) {
        let idle = self.streams.open() == 0;
        match (idle, self.idle_armed, self.idle_timeout) {
            (true, false, Some(t)) => {
                self.idle.as_mut().reset(Instant::now() + t);
                self.idle_armed = true;
                if let Some(w) = self.read_waker.take() {
                    w.wake();
                }
            }
            (false, true, _) => self.idle_armed = false,
            _ => {}
        }
    }

    /// Rewrites `n` bytes just read into `pending`.
    fn take_in(&mut self, n: usize) -> io::Result<()> {
        let Self {
            rewriter,
            chunk,
            pending,
            streams,
            ..
        } = &mut *self;
        if let Err(e) = rewriter.feed(&chunk[..n], pending, streams) {
            tracing::warn!(socket = %self.socket, error = %e,
                "closing a kubelet connection: its HTTP/2 request cannot be passed on");
            self.ended = true;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        if let Some(authority) = self.rewriter.take_replaced() {
            tracing::debug!(socket = %self.socket, %authority,
                "replaced a request's :authority the HTTP/2 server would refuse by localhost");
        }
        self.streams_changed();
        Ok(())
    }
}

impl AsyncRead for KubeletConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.pending_at < this.pending.len() {
                let n = (this.pending.len() - this.pending_at).min(buf.remaining());
                buf.put_slice(&this.pending[this.pending_at..this.pending_at + n]);
                this.pending_at += n;
                if this.pending_at == this.pending.len() {
                    this.pending.clear();
                    this.pending_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        if this.rewriter.holds_block() {
                            tracing::warn!(socket = %this.socket,
                                "a kubelet connection closed in the middle of a request's headers");
                        }
                        return Poll::Ready(Ok(()));
                    }
                    this.take_in(n)?;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    if this.idle_armed && this.idle.as_mut().poll(cx).is_ready() {
                        tracing::info!(socket = %this.socket, timeout = ?this.idle_timeout,
                            "closing a kubelet connection with no call open for the idle timeout");
                        this.ended = true;
                        return Poll::Ready(Ok(()));
                    }
                    this.read_waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
            }
        }
    }
}

impl AsyncWrite for KubeletConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let n = match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        this.written(&[&buf[..n]]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let n = match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        // The first n bytes across the slices went out.
        let mut left = n;
        let mut sent: Vec<&[u8]> = Vec::with_capacity(bufs.len());
        for b in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(b.len());
            sent.push(&b[..take]);
            left -= take;
        }
        this.written(&sent);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl KubeletConn {
    /// Follows what the server wrote (`parts`, in order): resets and GOAWAYs logged, the
    /// streams it ended closed.
    fn written(&mut self, parts: &[&[u8]]) {
        let mut said = Vec::new();
        for part in parts {
            said.extend(self.watch.observe(part, &mut self.streams));
        }
        for said in said {
            match said {
                ServerSaid::Reset { stream, code } if code == 0x1 || code == 0x2 => {
                    tracing::warn!(socket = %self.socket, stream, code = frames::error_name(code),
                        "the HTTP/2 server rejected a kubelet request (malformed or failed); the kubelet sees the call fail");
                }
                ServerSaid::Reset { stream, code } => {
                    tracing::debug!(socket = %self.socket, stream, code = frames::error_name(code),
                        "the HTTP/2 server reset a stream");
                }
                ServerSaid::GoAway { code } if code != 0 => {
                    tracing::warn!(socket = %self.socket, code = frames::error_name(code),
                        "the HTTP/2 server closed a kubelet connection for an error");
                }
                ServerSaid::GoAway { .. } => {}
            }
        }
        self.streams_changed();
    }
}

impl tonic::transport::server::Connected for KubeletConn {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

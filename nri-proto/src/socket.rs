//! The multiplexer's socket: a nonblocking unix stream that the reactor watches for readability
//! only.
//!
//! A request/response protocol spends nearly all its time waiting to read. Registered for
//! writability as well (as tokio's `UnixStream` always is), an edge-triggered socket wakes the
//! process each time the peer drains what this side wrote, which is once per message: one context
//! switch per message for nothing, the largest single cost of a round trip on a VM. Writes here go
//! straight to the socket; only a write that finds the socket full asks for writability, through
//! a duplicate descriptor registered for as long as that backlog lasts.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest, ReadBuf};

use crate::fd;

/// The socket, shared by the frame reader and the writers.
pub(crate) struct MuxSocket {
    io: AsyncFd<StdUnixStream>,
}

impl MuxSocket {
    /// Takes over `stream` (its registration with the reactor is replaced by a read-only one).
    pub(crate) fn new(stream: tokio::net::UnixStream) -> io::Result<MuxSocket> {
        let std = stream.into_std()?;
        Ok(MuxSocket {
            io: fd::register(std, Interest::READABLE)?,
        })
    }

    /// Writes what the socket takes now; `WouldBlock` when it is full.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.io.get_ref().write(buf)
    }

    /// A registration for writability, for a writer that found the socket full. Drop it once the
    /// backlog is written, so the socket goes back to waking this process for reads only.
    pub(crate) fn write_waiter(&self) -> io::Result<WriteWaiter> {
        let dup = self.io.get_ref().try_clone()?;
        Ok(WriteWaiter(fd::register(dup, Interest::WRITABLE)?))
    }

    /// Shuts both directions down: the peer sees end of stream, local readers too.
    pub(crate) fn shutdown(&self) {
        let _ = self.io.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

/// Waits for the socket to take more bytes (see [`MuxSocket::write_waiter`]).
pub(crate) struct WriteWaiter(AsyncFd<StdUnixStream>);

impl WriteWaiter {
    /// Writes part of `buf` once the socket can take it; returns how much was written.
    pub(crate) async fn write(&self, buf: &[u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.0.writable().await?;
            match ready.try_io(|s| s.get_ref().write(buf)) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(r) => return r,
                Err(_would_block) => {}
            }
        }
    }
}

/// The socket's read side as a byte stream.
pub(crate) struct SocketReader(pub(crate) Arc<MuxSocket>);

impl AsyncRead for SocketReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut ready = ready!(self.0.io.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let want = unfilled.len();
            match ready.try_io(|s| s.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    // A short read emptied the socket: wait for the next readiness event instead
                    // of paying a read that can only answer EAGAIN (as tokio's own streams do).
                    // A byte that arrived meanwhile raised a newer event, which this does not clear.
                    if n > 0 && n < want {
                        ready.clear_ready();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

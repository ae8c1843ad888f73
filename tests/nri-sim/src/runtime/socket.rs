//! The fake runtime's end of a plugin socket: frames read as they arrive, whole messages written in
//! order, and the socket watched for readability only.
//!
//! tokio's `UnixStream` registers for writability too, and with edge-triggered epoll the plugin
//! draining each request then wakes the runtime for nothing: a context switch per message that the
//! round-trip benchmark would charge to the plugin. Written for the fake alone (it shares no
//! transport code with nri-proto).
#![allow(unsafe_code)]

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream as StdUnixStream;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::wire;

/// A connected plugin socket.
pub(super) struct PluginSocket {
    io: AsyncFd<StdUnixStream>,
    /// Held for a whole message, so concurrent writers never interleave frames.
    write_turn: tokio::sync::Mutex<()>,
}

fn register(s: StdUnixStream, interest: Interest) -> io::Result<AsyncFd<StdUnixStream>> {
    // SAFETY: the `UnixStream` owns its descriptor and is moved into the `AsyncFd`, its only
    // owner, so the descriptor stays open and names the same socket for the registration's life.
    unsafe { AsyncFd::register_with_interest(s, interest) }.map_err(io::Error::from)
}

impl PluginSocket {
    pub(super) fn new(stream: tokio::net::UnixStream) -> io::Result<PluginSocket> {
        Ok(PluginSocket {
            io: register(stream.into_std()?, Interest::READABLE)?,
            write_turn: tokio::sync::Mutex::new(()),
        })
    }

    async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.io.readable().await?;
            match ready.try_io(|s| s.get_ref().read(buf)) {
                Ok(Ok(n)) => {
                    // A short read drained the socket; the next read waits for a new event.
                    if n > 0 && n < buf.len() {
                        ready.clear_ready();
                    }
                    return Ok(n);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(r) => return r,
                Err(_would_block) => {}
            }
        }
    }

    /// Writes all of `bytes`; waits (registered for writability only then) while the socket is full.
    pub(super) async fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        let _turn = self.write_turn.lock().await;
        let mut off = 0;
        while off < bytes.len() {
            match self.io.get_ref().write(&bytes[off..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let dup = register(self.io.get_ref().try_clone()?, Interest::WRITABLE)?;
                    let _ = dup.writable().await?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Closes both directions: the plugin sees end of stream.
    pub(super) fn shutdown(&self) {
        let _ = self.io.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

/// Reads mux frames: as many bytes per read as have arrived, frames cut out of that buffer.
pub(super) struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl FrameReader {
    pub(super) fn new() -> FrameReader {
        FrameReader {
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
        }
    }

    /// The next frame as `(conn, payload)`; `Ok(None)` at end of stream, `Err` with the reason
    /// the connection is unusable.
    pub(super) async fn next<'a>(
        &'a mut self,
        sock: &PluginSocket,
    ) -> Result<Option<(u32, &'a [u8])>, String> {
        loop {
            let have = self.end - self.start;
            let mut need = wire::FRAME_HEADER;
            if have >= wire::FRAME_HEADER {
                let h = &self.buf[self.start..self.start + wire::FRAME_HEADER];
                let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
                let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
                if len > wire::MAX_FRAME {
                    return Err(format!("frame of {len} bytes over the limit"));
                }
                need = wire::FRAME_HEADER + len;
                if have >= need {
                    let payload = self.start + wire::FRAME_HEADER..self.start + need;
                    self.start += need;
                    return Ok(Some((id, &self.buf[payload])));
                }
            }
            if have == 0 {
                (self.start, self.end) = (0, 0);
            } else if self.start + need > self.buf.len() {
                self.buf.copy_within(self.start..self.end, 0);
                self.end = have;
                self.start = 0;
                if need > self.buf.len() {
                    self.buf.resize(need, 0);
                }
            }
            let n = sock
                .read(&mut self.buf[self.end..])
                .await
                .map_err(|e| format!("reading the plugin socket failed: {e}"))?;
            if n == 0 {
                return if have == 0 {
                    Ok(None)
                } else {
                    Err("truncated frame".into())
                };
            }
            self.end += n;
        }
    }
}

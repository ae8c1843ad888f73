//! The NRI connection multiplexer: several byte streams ("conns") over one socket.
//!
//! Wire format: each frame is an 8-byte big-endian header `{conn_id: u32, length: u32}` followed
//! by `length` payload bytes. Conn 1 carries the plugin service (the plugin is the ttrpc server),
//! conn 2 the runtime service (the runtime is the server). There is no open or close frame.
//!
//! Writing obeys the Go runtime's frame rule: every write is split into frames of at most
//! [`MAX_WRITE_FRAME`] bytes, so the runtime's 4096-byte buffered reader never sees a frame larger
//! than the buffer it reads into. Reading treats each conn as a byte stream, since the Go writer
//! emits frames of any size up to [`MAX_FRAME_PAYLOAD`]. A frame longer than that limit is a
//! protocol error: it is logged and the whole socket is closed, without allocating its length.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use crate::socket::{MuxSocket, SocketReader};

/// Conn id of the plugin service (the plugin serves, the runtime calls).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Conn id of the runtime service (the runtime serves, the plugin calls).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Largest frame payload the peer may send: the ttrpc message limit (4 MiB) plus its 10-byte header.
pub const MAX_FRAME_PAYLOAD: usize = 4 * 1024 * 1024 + 10;
/// Largest frame this side writes, so Go's 4096-byte buffered reads never fail.
pub const MAX_WRITE_FRAME: usize = 4096;
/// Size of the frame header.
pub const FRAME_HEADER_LEN: usize = 8;
/// The frame reader's buffer: a message and its frame headers usually arrive in one read.
const READ_BUFFER: usize = 64 * 1024;

/// Errors of the multiplexer.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// The peer announced a frame larger than the protocol allows.
    #[error(
        "NRI mux: peer sent a frame of {len} bytes for conn {conn}, over the {MAX_FRAME_PAYLOAD}-byte limit; closing the connection"
    )]
    FrameTooLarge {
        /// Conn id from the frame header.
        conn: u32,
        /// Announced payload length.
        len: u32,
    },
    /// The peer used the reserved conn id 0.
    #[error("NRI mux: peer sent a frame for the reserved conn id 0; closing the connection")]
    ReservedConn,
    /// A ttrpc message header on a conn was malformed or announced a body over 4 MiB.
    #[error("NRI mux: bad ttrpc message on conn {conn}: {why}; closing the connection")]
    BadMessage {
        /// Conn id.
        conn: u32,
        /// What was wrong.
        why: String,
    },
    /// A conn id was opened twice.
    #[error("NRI mux: conn {0} is already open")]
    ConnInUse(u32),
    /// Reading or writing the socket failed.
    #[error("NRI mux: socket I/O failed: {0}")]
    Io(#[from] io::Error),
}

type Routes = Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Vec<u8>>>>>;

/// One multiplexed socket. Open conns with [`Mux::open`]; dropping every conn and the `Mux` closes
/// the socket.
pub struct Mux {
    routes: Routes,
    out: Arc<WriteShared>,
    closed: watch::Receiver<Option<String>>,
    closed_tx: Arc<watch::Sender<Option<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Mux {
    /// Starts multiplexing `stream`: spawns one reader and one writer task on the current runtime.
    /// Fails only if the socket cannot be registered with the runtime's reactor.
    pub fn new(stream: UnixStream) -> Result<Mux, MuxError> {
        let sock = Arc::new(MuxSocket::new(stream)?);
        let rd = BufReader::with_capacity(READ_BUFFER, SocketReader(sock.clone()));
        let routes: Routes = Arc::new(Mutex::new(HashMap::new()));
        let out = Arc::new(WriteShared {
            sock,
            state: Mutex::new(WriteState::default()),
            wake: tokio::sync::Notify::new(),
        });
        let (closed_tx, closed) = watch::channel(None);
        let closed_tx = Arc::new(closed_tx);
        let reader = tokio::spawn(read_loop(rd, routes.clone(), closed_tx.clone()));
        let writer = tokio::spawn(write_loop(out.clone(), closed_tx.clone()));
        Ok(Mux {
            routes,
            out,
            closed,
            closed_tx,
            tasks: vec![reader, writer],
        })
    }

    /// Opens conn `id` and returns it as a byte stream (AsyncRead + AsyncWrite).
    pub fn open(&self, id: u32) -> Result<MuxConn, MuxError> {
        if id == 0 {
            return Err(MuxError::ReservedConn);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if routes.contains_key(&id) {
            return Err(MuxError::ConnInUse(id));
        }
        routes.insert(id, tx);
        Ok(MuxConn {
            id,
            rx,
            pending: Vec::new(),
            pos: 0,
            out: self.out.clone(),
            guard: MessageGuard::default(),
            closed: self.closed_tx.clone(),
        })
    }

    /// A watch that turns `Some(reason)` once the socket is closed or failed.
    pub fn closed(&self) -> watch::Receiver<Option<String>> {
        self.closed.clone()
    }

    /// Closes the socket now: both tasks stop, every conn sees end of stream.
    pub fn close(&self) {
        if self.closed_tx.borrow().is_none() {
            self.closed_tx.send_replace(Some("closed locally".into()));
        }
        for t in &self.tasks {
            t.abort();
        }
        // Conns handed to ttrpc may outlive the Mux and keep the write half alive: shut the socket
        // down so the peer sees the close now.
        {
            let mut st = self.out.lock();
            st.failed.get_or_insert_with(|| "connection closed".into());
        }
        self.out.sock.shutdown();
        self.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.close();
    }
}

async fn read_loop(
    mut rd: impl AsyncRead + Unpin,
    routes: Routes,
    closed: Arc<watch::Sender<Option<String>>>,
) {
    let reason = match read_frames(&mut rd, &routes).await {
        Ok(()) => "peer closed the connection".to_string(),
        Err(e) => {
            tracing::error!(error = %e, "NRI connection failed");
            e.to_string()
        }
    };
    // Dropping the senders gives every conn end of stream.
    routes.lock().unwrap_or_else(|e| e.into_inner()).clear();
    closed.send_replace(Some(reason));
}

async fn read_frames(rd: &mut (impl AsyncRead + Unpin), routes: &Routes) -> Result<(), MuxError> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    loop {
        match rd.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        if len as usize > MAX_FRAME_PAYLOAD {
            return Err(MuxError::FrameTooLarge { conn, len });
        }
        if conn == 0 {
            return Err(MuxError::ReservedConn);
        }
        let mut payload = vec![0u8; len as usize];
        rd.read_exact(&mut payload).await?;
        let route = routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&conn)
            .cloned();
        match route {
            Some(tx) if !payload.is_empty() => {
                // A conn dropped by its user just loses its data, like an unknown conn.
                let _ = tx.send(payload);
            }
            Some(_) => {}
            None => tracing::debug!(conn, len, "dropping NRI frame for an unknown conn"),
        }
    }
}

/// The socket's write side, shared by all conns. A write goes straight to the socket when nothing
/// is queued (saving a task hand-off per message); otherwise, or when the socket would block, it
/// is queued whole for the writer task, so frames never interleave and order is kept.
struct WriteShared {
    sock: Arc<MuxSocket>,
    state: Mutex<WriteState>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct WriteState {
    queue: std::collections::VecDeque<Vec<u8>>,
    /// The writer task is writing a popped buffer.
    busy: bool,
    /// Set once a write failed; later writes fail.
    failed: Option<String>,
}

impl WriteShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, WriteState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `framed` now if possible, else queues it.
    fn submit(&self, mut framed: Vec<u8>) -> io::Result<()> {
        let mut st = self.lock();
        if let Some(why) = &st.failed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone()));
        }
        if st.queue.is_empty() && !st.busy {
            let mut off = 0;
            while off < framed.len() {
                match self.sock.try_write(&framed[off..]) {
                    Ok(n) => off += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        st.failed = Some(e.to_string());
                        drop(st);
                        self.wake.notify_one();
                        return Err(e);
                    }
                }
            }
            if off == framed.len() {
                return Ok(());
            }
            framed.drain(..off);
        }
        st.queue.push_back(framed);
        drop(st);
        self.wake.notify_one();
        Ok(())
    }
}

async fn write_loop(shared: Arc<WriteShared>, closed: Arc<watch::Sender<Option<String>>>) {
    // Registered for writability only while a backlog is being written.
    let mut waiter = None;
    loop {
        let next = {
            let mut st = shared.lock();
            if let Some(why) = &st.failed {
                tracing::error!(error = %why, "NRI connection write failed");
                closed.send_replace(Some(format!("write failed: {why}")));
                return;
            }
            let next = st.queue.pop_front();
            st.busy = next.is_some();
            next
        };
        let Some(buf) = next else {
            waiter = None;
            shared.wake.notified().await;
            continue;
        };
        if let Err(e) = write_backlog(&shared.sock, &buf, &mut waiter).await {
            shared.lock().failed = Some(e.to_string());
        }
    }
}

/// Writes all of `buf`, waiting for writability whenever the socket is full.
async fn write_backlog(
    sock: &MuxSocket,
    buf: &[u8],
    waiter: &mut Option<crate::socket::WriteWaiter>,
) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let r = match waiter {
            Some(w) => w.write(&buf[off..]).await,
            None => sock.try_write(&buf[off..]),
        };
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => *waiter = Some(sock.write_waiter()?),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Appends `data` to `out` as frames of conn `id`, each at most [`MAX_WRITE_FRAME`] payload bytes.
pub fn encode_frames(id: u32, data: &[u8], out: &mut Vec<u8>) {
    for chunk in data.chunks(MAX_WRITE_FRAME) {
        out.extend_from_slice(&id.to_be_bytes());
        // A chunk is at most 4096 bytes, so the cast cannot truncate.
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// One conn of a [`Mux`]: a byte stream that reads the payloads of this conn's frames in order and
/// writes through the shared socket in frames of at most 4096 bytes.
pub struct MuxConn {
    id: u32,
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    pending: Vec<u8>,
    pos: usize,
    out: Arc<WriteShared>,
    guard: MessageGuard,
    closed: Arc<watch::Sender<Option<String>>>,
}

/// Follows the ttrpc message headers in a conn's byte stream so that a peer announcing a body over
/// 4 MiB or an unknown message type is cut off at once, instead of ttrpc discarding (and waiting
/// for) up to 4 GiB of announced bytes.
#[derive(Default)]
struct MessageGuard {
    header: [u8; 10],
    filled: usize,
    body_left: usize,
}

/// Largest ttrpc message body.
const MAX_MESSAGE_BODY: usize = 4 * 1024 * 1024;

impl MessageGuard {
    /// Whether the bytes seen so far end exactly at a message boundary.
    fn at_boundary(&self) -> bool {
        self.filled == 0 && self.body_left == 0
    }

    fn check(&mut self, mut data: &[u8]) -> Result<(), String> {
        while !data.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(data.len());
                self.body_left -= n;
                data = &data[n..];
                continue;
            }
            let n = (10 - self.filled).min(data.len());
            self.header[self.filled..self.filled + n].copy_from_slice(&data[..n]);
            self.filled += n;
            data = &data[n..];
            if self.filled == 10 {
                self.filled = 0;
                let h = &self.header;
                let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
                if len > MAX_MESSAGE_BODY {
                    return Err(format!("message body of {len} bytes over the 4 MiB limit"));
                }
                if !(1..=3).contains(&h[8]) {
                    return Err(format!("unknown message type {}", h[8]));
                }
                self.body_left = len;
            }
        }
        Ok(())
    }
}

impl MuxConn {
    /// The conn id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// A handle that writes to this conn without borrowing it, so one task can keep a read
    /// pending while it writes.
    pub fn sender(&self) -> ConnSender {
        ConnSender {
            id: self.id,
            out: self.out.clone(),
        }
    }
}

/// Writes to one conn (see [`MuxConn::sender`]). Writes never wait: what the socket does not
/// take at once is queued whole, in order.
#[derive(Clone)]
pub struct ConnSender {
    id: u32,
    out: Arc<WriteShared>,
}

impl ConnSender {
    /// Writes `data` to the conn in frames of at most [`MAX_WRITE_FRAME`] bytes; fails once the
    /// socket has failed or been closed.
    pub fn send(&self, data: &[u8]) -> io::Result<()> {
        self.send_parts(&[data])
    }

    /// Writes the concatenation of `parts` as [`ConnSender::send`] does, without concatenating
    /// them first.
    pub fn send_parts(&self, parts: &[&[u8]]) -> io::Result<()> {
        self.out.submit(framed(self.id, parts))
    }
}

/// The frames of conn `id` that carry the concatenation of `parts`, in one buffer.
fn framed(id: u32, parts: &[&[u8]]) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut out =
        Vec::with_capacity(total + FRAME_HEADER_LEN * total.div_ceil(MAX_WRITE_FRAME).max(1));
    let (mut left, mut room) = (total, 0usize);
    for part in parts {
        let mut part = *part;
        while !part.is_empty() {
            if room == 0 {
                room = left.min(MAX_WRITE_FRAME);
                out.extend_from_slice(&id.to_be_bytes());
                // At most 4096, so the cast cannot truncate.
                out.extend_from_slice(&(room as u32).to_be_bytes());
            }
            let n = room.min(part.len());
            out.extend_from_slice(&part[..n]);
            (part, room, left) = (&part[n..], room - n, left - n);
        }
    }
    out
}

/// What [`MuxConn::next_message`] found.
pub(crate) enum Next {
    /// A frame holding exactly one whole ttrpc message (header and body), uncopied.
    Whole(Vec<u8>),
    /// Anything else: read the conn as a byte stream (the bytes stay buffered for it).
    Bytes,
    /// End of stream.
    End,
}

impl MuxConn {
    /// Waits for the next frame and hands it over whole when it carries exactly one ttrpc
    /// message, the usual case (a runtime writes each message of up to 4 KiB as one frame), so
    /// the server need not copy it out of the stream. Only valid between messages.
    pub(crate) async fn next_message(&mut self) -> io::Result<Next> {
        if self.pos < self.pending.len() || !self.guard.at_boundary() {
            return Ok(Next::Bytes);
        }
        let Some(data) = self.rx.recv().await else {
            return Ok(Next::End);
        };
        self.checked(&data)?;
        let announced = |h: &[u8]| u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if data.len() >= 10 && announced(&data) == data.len() - 10 {
            return Ok(Next::Whole(data));
        }
        self.pending = data;
        self.pos = 0;
        Ok(Next::Bytes)
    }

    /// Runs the message guard over newly received bytes; a violation closes the connection.
    fn checked(&mut self, data: &[u8]) -> io::Result<()> {
        let Err(why) = self.guard.check(data) else {
            return Ok(());
        };
        let e = MuxError::BadMessage { conn: self.id, why };
        tracing::error!(error = %e, "NRI connection failed");
        self.closed.send_replace(Some(e.to_string()));
        self.rx.close();
        Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    }
}

impl AsyncRead for MuxConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos >= this.pending.len() {
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(data)) => {
                    this.checked(&data)?;
                    this.pending = data;
                    this.pos = 0;
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = buf.remaining().min(this.pending.len() - this.pos);
        buf.put_slice(&this.pending[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MuxConn {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(
            self.out
                .submit(framed(self.id, &[data]))
                .map(|()| data.len()),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn writes_split_into_4096_byte_frames() {
        let data = vec![7u8; 10_000];
        let mut out = Vec::new();
        encode_frames(1, &data, &mut out);
        let mut sizes = Vec::new();
        let mut rest = &out[..];
        while !rest.is_empty() {
            let len = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
            assert_eq!(u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]), 1);
            sizes.push(len);
            rest = &rest[8 + len..];
        }
        assert_eq!(sizes, vec![4096, 4096, 1808]);
    }

    #[test]
    fn parts_are_framed_as_their_concatenation() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut whole = Vec::new();
        encode_frames(3, &data, &mut whole);
        for cuts in [
            vec![0, 10_000],
            vec![10, 4096, 4097, 9_999],
            vec![0, 0, 5000, 5000],
        ] {
            let mut parts = Vec::new();
            let mut at = 0;
            for c in cuts.iter().chain([&10_000]) {
                parts.push(&data[at..*c]);
                at = *c;
            }
            assert_eq!(framed(3, &parts), whole, "cuts {cuts:?}");
        }
        assert!(framed(3, &[&[], &[]]).is_empty());
    }

    #[tokio::test]
    async fn oversized_frame_closes_without_allocating() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mux = Mux::new(a).unwrap();
        let mut conn = mux.open(1).unwrap();
        let mut closed = mux.closed();
        b.write_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff])
            .await
            .unwrap();
        let mut buf = Vec::new();
        conn.read_to_end(&mut buf).await.unwrap();
        assert!(buf.is_empty());
        let reason = closed
            .wait_for(|r| r.is_some())
            .await
            .unwrap()
            .clone()
            .unwrap();
        assert!(reason.contains("over the"), "{reason}");
    }

    #[tokio::test]
    async fn reader_reassembles_frames_of_any_size_and_drops_unknown_conns() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mux = Mux::new(a).unwrap();
        let mut conn = mux.open(2).unwrap();
        // One ttrpc message (10-byte header + body) spread over frames of odd sizes.
        let mut big = Vec::with_capacity(100_000);
        big.extend_from_slice(&99_990u32.to_be_bytes());
        big.extend_from_slice(&[0, 0, 0, 1, 2, 0]);
        big.resize(100_000, 3u8);
        let mut wire = Vec::new();
        for (id, part) in [(2u32, &big[..60_000]), (9, &big[..5]), (2, &big[60_000..])] {
            wire.extend_from_slice(&id.to_be_bytes());
            wire.extend_from_slice(&(part.len() as u32).to_be_bytes());
            wire.extend_from_slice(part);
        }
        b.write_all(&wire).await.unwrap();
        drop(b);
        let mut got = Vec::new();
        conn.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, big);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writers_on_a_full_socket_keep_frames_whole_and_ordered() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mux = Mux::new(a).unwrap();
        let mut writers = Vec::new();
        for id in [1u32, 2] {
            let mut conn = mux.open(id).unwrap();
            writers.push(tokio::spawn(async move {
                for i in 0..64u32 {
                    // 32 KiB writes: the socket buffer fills, so later writes are queued.
                    let chunk = vec![(i as u8) ^ (id as u8); 32 * 1024];
                    conn.write_all(&chunk).await.unwrap();
                }
                conn
            }));
        }
        let want = 64 * 32 * 1024;
        let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
        while got.values().map(Vec::len).sum::<usize>() < 2 * want {
            let mut h = [0u8; 8];
            b.read_exact(&mut h).await.unwrap();
            let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
            assert!(
                len <= MAX_WRITE_FRAME && (id == 1 || id == 2),
                "frame {id}/{len}"
            );
            let mut p = vec![0u8; len];
            b.read_exact(&mut p).await.unwrap();
            got.entry(id).or_default().extend(p);
        }
        for w in writers {
            w.await.unwrap();
        }
        for id in [1u32, 2] {
            let data = &got[&id];
            assert_eq!(data.len(), want);
            for (i, block) in data.chunks(32 * 1024).enumerate() {
                assert!(
                    block.iter().all(|x| *x == (i as u8) ^ (id as u8)),
                    "conn {id} block {i}"
                );
            }
        }
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        fn routes_with(ids: &[u32]) -> (Routes, Vec<mpsc::UnboundedReceiver<Vec<u8>>>) {
            let routes: Routes = Arc::new(Mutex::new(HashMap::new()));
            let mut rxs = Vec::new();
            for id in ids {
                let (tx, rx) = mpsc::unbounded_channel();
                routes.lock().unwrap().insert(*id, tx);
                rxs.push(rx);
            }
            (routes, rxs)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Arbitrary bytes from the peer: the frame reader ends (error or EOF) without
            /// panicking, and never delivers a payload over the limit.
            #[test]
            fn frame_reader_survives_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let (routes, mut rxs) = routes_with(&[1, 2]);
                let mut input = &bytes[..];
                let _ = rt.block_on(read_frames(&mut input, &routes));
                for rx in &mut rxs {
                    while let Ok(p) = rx.try_recv() {
                        prop_assert!(p.len() <= MAX_FRAME_PAYLOAD);
                    }
                }
            }

            /// Valid ttrpc messages split at arbitrary points pass the guard; arbitrary bytes
            /// never make it panic.
            #[test]
            fn message_guard_accepts_any_split_of_valid_messages(
                sizes in proptest::collection::vec(0usize..9000, 1..6),
                cuts in proptest::collection::vec(1usize..5000, 0..20),
                garbage in proptest::collection::vec(any::<u8>(), 0..512),
            ) {
                let mut stream = Vec::new();
                for (i, n) in sizes.iter().enumerate() {
                    stream.extend_from_slice(&(*n as u32).to_be_bytes());
                    stream.extend_from_slice(&(2 * i as u32 + 1).to_be_bytes());
                    stream.extend_from_slice(&[1 + (i % 3) as u8, 0]);
                    stream.resize(stream.len() + n, 0xab);
                }
                let mut guard = MessageGuard::default();
                let mut rest = &stream[..];
                for c in cuts {
                    let c = c.min(rest.len());
                    prop_assert!(guard.check(&rest[..c]).is_ok());
                    rest = &rest[c..];
                }
                prop_assert!(guard.check(rest).is_ok());
                let mut g2 = MessageGuard::default();
                let _ = g2.check(&garbage);
            }
        }
    }
}

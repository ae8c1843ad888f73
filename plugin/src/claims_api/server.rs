//! The claims API server: binds the unix socket, admits peers by credentials and serves the
//! ttrpc service until shut down.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use nix::unistd::Gid;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use super::error::ClaimsApiError;
use super::flood::{ConnEvent, ConnLog, ConnTable, Eviction};
use super::frame::FrameGuard;
use super::peer::{DefaultPeerPolicy, PeerCred, PeerPolicy};
use super::service;
use super::types::ClaimService;
use super::validate::Limits;
use crate::gate::Gate;

/// The default socket path of the claims API.
pub const DEFAULT_SOCKET_PATH: &str = "/run/nri-accel/claims.sock";

/// How the claims API socket is set up and guarded.
#[derive(Clone)]
pub struct ServerOptions {
    /// A group whose members may use the API: the socket becomes 0660 and is chowned to it, and
    /// so does its directory (mode 0750 at most, see `group_dir_mode`). Without one the socket
    /// is 0600.
    pub group: Option<Gid>,
    /// Who may connect, by SO_PEERCRED credentials.
    pub policy: Arc<dyn PeerPolicy>,
    /// Size and count limits.
    pub limits: Limits,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("group", &self.group)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self::with_group(None)
    }
}

impl ServerOptions {
    /// Default limits, and the daemon's policy (root, own uid, members of `group`).
    pub fn with_group(group: Option<Gid>) -> Self {
        Self {
            group,
            policy: Arc::new(DefaultPeerPolicy::for_daemon(group)),
            limits: Limits::default(),
        }
    }

    /// The socket file mode these options give.
    pub fn socket_mode(&self) -> u32 {
        if self.group.is_some() { 0o660 } else { 0o600 }
    }
}

/// A running claims API server. Call [`ClaimsServer::shutdown`] to stop it and unlink the socket.
pub struct ClaimsServer {
    server: ttrpc::r#async::Server,
    path: PathBuf,
}

impl std::fmt::Debug for ClaimsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ClaimsServer {
    /// Binds `path` and starts serving `engine` behind `gate`.
    ///
    /// Creates the parent directory (0755) if needed. A socket left by a dead process is replaced;
    /// a socket someone listens on is an error naming the path ([`ClaimsApiError::AlreadyRunning`]);
    /// any other file there is left alone and reported. The socket gets mode 0600, or 0660 and the
    /// configured group. Must be called inside a tokio runtime.
    pub async fn bind<S: ClaimService>(
        path: impl AsRef<Path>,
        engine: Arc<S>,
        gate: Gate,
        opts: ServerOptions,
    ) -> Result<Self, ClaimsApiError> {
        let path = path.as_ref().to_path_buf();
        prepare_path(&path)?;
        let listener = UnixListener::bind(&path).map_err(|source| ClaimsApiError::Bind {
            path: path.clone(),
            source,
        })?;
        set_permissions(&path, &opts)?;

        let cap = connection_cap(opts.limits.max_connections);
        let accept = Arc::new(Acceptor {
            policy: Arc::clone(&opts.policy),
            slots: Arc::new(Semaphore::new(cap)),
            refusals: Arc::new(Semaphore::new(REFUSALS_ANSWERED)),
            max_frame: ttrpc::proto::MESSAGE_LENGTH_MAX,
            idle_timeout: opts.limits.idle_timeout,
            first_request_timeout: opts.limits.first_request_timeout,
            cap,
            table: ConnTable::default(),
            log: ConnLog::new(cap),
        });
        let incoming = futures::stream::unfold(listener, move |listener| {
            let accept = Arc::clone(&accept);
            async move {
                let stream = accept.next(&listener).await;
                Some((Ok::<_, io::Error>(stream), listener))
            }
        });
        let mut server = ttrpc::r#async::Server::new()
            .register_service(service::services(engine, gate, opts.limits))
            .add_listener(ttrpc::r#async::transport::Listener::new(incoming));
        server.start().await.map_err(|e| ClaimsApiError::Server {
            path: path.clone(),
            message: e.to_string(),
        })?;
        tracing::debug!(path = %path.display(), mode = %format!("{:o}", opts.socket_mode()), "claims API socket bound");
        Ok(Self { server, path })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting, closes connections (waiting a bounded time for calls in flight) and
    /// unlinks the socket.
    pub async fn shutdown(mut self) -> Result<(), ClaimsApiError> {
        self.server
            .shutdown()
            .await
            .map_err(|e| ClaimsApiError::Server {
                path: self.path.clone(),
                message: e.to_string(),
            })?;
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ClaimsApiError::RemoveStale {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

/// Creates the parent directory and clears a stale socket; refuses a live one or a non-socket.
fn prepare_path(path: &Path) -> Result<(), ClaimsApiError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|source| ClaimsApiError::CreateDir {
                path: parent.to_path_buf(),
                source,
            })?;
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ClaimsApiError::Inspect {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ClaimsApiError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(ClaimsApiError::AlreadyRunning {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing stale claims API socket");
            std::fs::remove_file(path).map_err(|source| ClaimsApiError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })
        }
        Err(source) => Err(ClaimsApiError::Inspect {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The mode of the socket's directory when a group may use the socket: the group may enter it
/// (`g+x`, and list it, `g+r`), never write in it; others keep what they had, minus write.
pub(crate) fn group_dir_mode(current: u32) -> u32 {
    (current & 0o7777 & !0o022) | 0o050
}

/// With a group, the socket's directory is handed to that group too (the packaged
/// `/run/nri-accel` is 0750 root:root, which a member cannot enter: EACCES before the socket's
/// own mode is even read). Only a directory nri-accel owns is changed; another is left alone
/// with a warning.
fn open_dir_to_group(path: &Path, group: Gid) -> Result<(), ClaimsApiError> {
    use std::os::unix::fs::MetadataExt;
    let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let err = |source| ClaimsApiError::Permissions {
        path: dir.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(dir).map_err(err)?;
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        tracing::warn!(dir = %dir.display(), owner = meta.uid(), "the claims socket's directory is not nri-accel's: its group and mode are left as they are, so members of claims_api.group may not reach the socket");
        return Ok(());
    }
    let mode = group_dir_mode(meta.mode());
    if meta.gid() != group.as_raw() {
        nix::unistd::chown(dir, None, Some(group)).map_err(|e| err(io::Error::from(e)))?;
    }
    if meta.mode() & 0o7777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    }
    tracing::info!(dir = %dir.display(), gid = group.as_raw(), mode = %format!("{mode:o}"), "claims socket directory opened to claims_api.group");
    Ok(())
}

fn set_permissions(path: &Path, opts: &ServerOptions) -> Result<(), ClaimsApiError> {
    let err = |source| ClaimsApiError::Permissions {
        path: path.to_path_buf(),
        source,
    };
    if let Some(group) = opts.group {
        open_dir_to_group(path, group)?;
        nix::unistd::chown(path, None, Some(group)).map_err(|e| err(io::Error::from(e)))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(opts.socket_mode())).map_err(err)
}

/// Reads the peer's credentials from the kernel.
fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    let cred = getsockopt(stream, PeerCredentials).map_err(io::Error::from)?;
    Ok(PeerCred {
        uid: cred.uid(),
        gid: cred.gid(),
        pid: cred.pid(),
    })
}

/// File descriptors kept free for everything but claims API connections (the checkpoint, spec
/// files, the NRI and kubelet sockets, refused peers' answers).
pub(crate) const FD_RESERVE: u64 = 256;
/// Refused connections answered at once; beyond that a refused connection is just closed.
const REFUSALS_ANSWERED: usize = 16;

/// The connection cap actually enforced: `asked`, lowered so that the open file limit keeps
/// [`FD_RESERVE`] descriptors (and the refusals' answers) free.
pub(crate) fn connection_cap(asked: usize) -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(u64::MAX);
    let room = soft.saturating_sub(FD_RESERVE + REFUSALS_ANSWERED as u64);
    let cap = (asked as u64).min(room).max(1) as usize;
    if cap < asked {
        tracing::warn!(
            asked,
            cap,
            open_file_limit = soft,
            "claims API: claims_api.max_connections lowered to keep {FD_RESERVE} file descriptors in reserve; raise LimitNOFILE in the unit to serve more"
        );
    }
    cap
}

/// Admits connections: by credentials, then under the connection cap, making room by evicting
/// a connection with no call in flight when the cap is reached (see `flood.rs`).
struct Acceptor {
    policy: Arc<dyn PeerPolicy>,
    slots: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
    max_frame: usize,
    idle_timeout: Option<Duration>,
    first_request_timeout: Option<Duration>,
    cap: usize,
    table: ConnTable,
    log: Arc<ConnLog>,
}

/// How long a new connection waits for the slot of the connection it evicted (that
/// connection's task only has to see the eviction and end).
const EVICTION_WAIT: Duration = Duration::from_secs(2);

/// How long a new connection waits, when every connection has a call in flight, for one of
/// those calls to end before it is refused: long enough for a connection's task to count an
/// answer its peer has already read, short enough not to stall the accept loop.
const BUSY_GRACE: Duration = Duration::from_millis(100);

impl Acceptor {
    /// Accepts connections until one is admitted; refused ones are told why (while few) and
    /// closed. Every refusal and eviction is counted in the rate-limited connection log.
    async fn next(&self, listener: &UnixListener) -> FrameGuard<UnixStream> {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning; the listener stays open.
                    tracing::warn!("claims API accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let peer = match peer_cred(&stream) {
                Ok(peer) => peer,
                Err(e) => {
                    self.log.note(
                        ConnEvent::NoCredentials,
                        None,
                        &format!("refused: cannot read peer credentials: {e}"),
                    );
                    continue;
                }
            };
            if let Err(why) = self.policy.admit(&peer) {
                self.log.note(
                    ConnEvent::RefusedPeer,
                    Some(peer.uid),
                    &format!("refused (pid {}): {why}", peer.pid),
                );
                self.refuse(stream, ttrpc::Code::PERMISSION_DENIED, why);
                continue;
            }
            let Some(slot) = self.slot(&peer).await else {
                let why = format!(
                    "{} connections are open and every one has a call in flight, the most it serves at once (claims_api.max_connections); retry shortly",
                    self.cap
                );
                self.log.note(
                    ConnEvent::RefusedFull,
                    Some(peer.uid),
                    &format!("refused (pid {}): {why}", peer.pid),
                );
                self.refuse(stream, ttrpc::Code::RESOURCE_EXHAUSTED, why);
                continue;
            };
            let mut guard = FrameGuard::new(stream, peer, self.max_frame)
                .holding(slot)
                .tracked(self.table.register(), Arc::clone(&self.log));
            if let Some(within) = self.first_request_timeout {
                guard = guard.close_without_request(within);
            }
            return match self.idle_timeout {
                Some(after) => guard.close_when_idle(after),
                None => guard,
            };
        }
    }

    /// A slot under the cap: a free one, or the one a connection with no call in flight gives
    /// up when evicted. `None` when every connection has a call in flight.
    async fn slot(&self, peer: &PeerCred) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some(slot);
        }
        loop {
            let eviction = self.table.evict_one_within(BUSY_GRACE).await?;
            let event = match eviction {
                Eviction::NeverRequested => ConnEvent::EvictedNeverRequested,
                Eviction::Idle => ConnEvent::EvictedIdle,
            };
            self.log.note(
                event,
                Some(peer.uid),
                &format!(
                    "closed to admit a new peer: all {} connections (claims_api.max_connections) were taken, and it had no call in flight",
                    self.cap
                ),
            );
            match tokio::time::timeout(EVICTION_WAIT, Arc::clone(&self.slots).acquire_owned()).await
            {
                Ok(Ok(slot)) => return Some(slot),
                // The evicted connection did not end in time (its task is busy): try another.
                Err(_) => continue,
                Ok(Err(_)) => return None,
            }
        }
    }

    /// Answers a refused connection's first request with `code` and `why`, unless too many
    /// refusals are being answered already: then it is closed at once, so refused peers never
    /// hold more than [`REFUSALS_ANSWERED`] descriptors.
    fn refuse(&self, stream: UnixStream, code: ttrpc::Code, why: String) {
        if let Ok(permit) = Arc::clone(&self.refusals).try_acquire_owned() {
            tokio::spawn(async move {
                answer_refused(stream, code, why).await;
                drop(permit);
            });
        }
    }
}

/// Largest request a refused peer may send before its answer: the payload is read and dropped.
const REFUSED_REQUEST_MAX: usize = 64 * 1024;
/// How long a refused peer has to send its request.
const REFUSED_WAIT: Duration = Duration::from_secs(5);

/// Tells a refused peer why, instead of only closing: its first request is answered with `code`
/// (PERMISSION_DENIED, RESOURCE_EXHAUSTED) and the reason, then the connection is closed. The request is never decoded
/// or served; anything that is not a small request frame just closes the connection.
async fn answer_refused(mut stream: UnixStream, code: ttrpc::Code, why: String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let header = ttrpc::MessageHeader::read_from(&mut stream).await.ok()?;
        let len = header.length as usize;
        if header.type_ != ttrpc::proto::MESSAGE_TYPE_REQUEST || len > REFUSED_REQUEST_MAX {
            return None;
        }
        let mut body = vec![0; len];
        stream.read_exact(&mut body).await.ok()?;
        let mut answer = ttrpc::Response::new();
        answer.set_status(ttrpc::get_status(
            code,
            format!("nri-accel refused this connection: {why}"),
        ));
        let bytes = protobuf::Message::write_to_bytes(&answer).ok()?;
        let reply = ttrpc::MessageHeader::new_response(header.stream_id, bytes.len() as u32);
        reply.write_to(&mut stream).await.ok()?;
        stream.write_all(&bytes).await.ok()?;
        stream.shutdown().await.ok()
    };
    let _ = tokio::time::timeout(REFUSED_WAIT, exchange).await;
}

#[cfg(test)]
mod tests {
    use super::group_dir_mode;

    #[test]
    fn a_group_may_enter_the_socket_dir_and_never_write_in_it() {
        assert_eq!(group_dir_mode(0o40750), 0o750);
        assert_eq!(group_dir_mode(0o40700), 0o750);
        assert_eq!(group_dir_mode(0o40755), 0o755);
        assert_eq!(group_dir_mode(0o40777), 0o755);
        assert_eq!(group_dir_mode(0o40770), 0o750);
    }
}

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

use super::error::ClaimsApiError;
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
    /// A group whose members may use the API: the socket becomes 0660 and is chowned to it.
    /// Without one the socket is 0600.
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

        let policy = Arc::clone(&opts.policy);
        let max_frame = ttrpc::proto::MESSAGE_LENGTH_MAX;
        let incoming =
            futures::stream::unfold((listener, policy), move |(listener, policy)| async move {
                let stream = accept_admitted(&listener, policy.as_ref(), max_frame).await;
                Some((Ok::<_, io::Error>(stream), (listener, policy)))
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

fn set_permissions(path: &Path, opts: &ServerOptions) -> Result<(), ClaimsApiError> {
    let err = |source| ClaimsApiError::Permissions {
        path: path.to_path_buf(),
        source,
    };
    if let Some(group) = opts.group {
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

/// Accepts connections until one passes the policy; refused ones are logged and closed.
async fn accept_admitted(
    listener: &UnixListener,
    policy: &dyn PeerPolicy,
    max_frame: usize,
) -> FrameGuard<UnixStream> {
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
                tracing::warn!("claims API connection refused: cannot read peer credentials: {e}");
                continue;
            }
        };
        match policy.admit(&peer) {
            Ok(()) => return FrameGuard::new(stream, peer, max_frame),
            Err(why) => {
                tracing::warn!(
                    peer_uid = peer.uid,
                    peer_pid = peer.pid,
                    "claims API connection refused: {why}"
                );
                tokio::spawn(answer_refused(stream, why));
            }
        }
    }
}

/// Largest request a refused peer may send before its answer: the payload is read and dropped.
const REFUSED_REQUEST_MAX: usize = 64 * 1024;
/// How long a refused peer has to send its request.
const REFUSED_WAIT: Duration = Duration::from_secs(5);

/// Tells a refused peer why, instead of only closing: its first request is answered with status
/// PERMISSION_DENIED and the reason, then the connection is closed. The request is never decoded
/// or served; anything that is not a small request frame just closes the connection.
async fn answer_refused(mut stream: UnixStream, why: String) {
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
            ttrpc::Code::PERMISSION_DENIED,
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

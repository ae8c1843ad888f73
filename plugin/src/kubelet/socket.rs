//! Serving a gRPC router on a unix socket path the kubelet connects to.
//!
//! The path may hold a stale socket from an earlier run (replaced), a live one of another process
//! (refused: the node lock already keeps a second nri-accel away, so it is someone else's), or
//! something that is not a socket (refused, never deleted). While serving, the file can vanish
//! under us (the kubelet wipes its device-plugins directory on restart): [`ServedSocket::is_present`]
//! tells, so the owner can serve again and re-register. On shutdown the socket is unlinked only if
//! the file at the path is still the one this server bound.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::Router;

use super::KubeletError;
use super::conn::{self, ConnCount, ConnLimits};

/// How long a shutdown waits for calls in flight before it stops the server anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// A router served on a unix socket until [`ServedSocket::shutdown`].
#[derive(Debug)]
pub struct ServedSocket {
    path: PathBuf,
    /// (device, inode) of the socket file this server bound.
    identity: (u64, u64),
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    connections: ConnCount,
}

/// Creates the socket's parent directory and clears a stale socket at `path`; refuses a socket
/// another process serves and anything that is not a socket.
pub fn prepare_socket_path(path: &Path) -> Result<(), KubeletError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)
            .map_err(|source| KubeletError::CreateDir {
                path: parent.to_path_buf(),
                source,
            })?;
    }
    let bind_err = |source| KubeletError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(bind_err(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(KubeletError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(KubeletError::InUse {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(socket = %path.display(), "replacing a stale socket left by an earlier run");
            std::fs::remove_file(path).map_err(bind_err)
        }
        Err(e) => Err(bind_err(e)),
    }
}

impl ServedSocket {
    /// Binds `path` (mode 0600: only root, which the kubelet runs as, may connect) and serves
    /// `router` on it in a task, every connection through the kubelet adapter
    /// ([`super::conn`]: any `:authority` accepted, at most `limits.max_connections` at once,
    /// idle ones closed).
    pub fn serve(
        path: &Path,
        router: Router,
        limits: ConnLimits,
    ) -> Result<ServedSocket, KubeletError> {
        prepare_socket_path(path)?;
        let bind_err = |source| KubeletError::Bind {
            path: path.to_path_buf(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
        let meta = std::fs::symlink_metadata(path).map_err(bind_err)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let shown = path.display().to_string();
        let connections = ConnCount::default();
        let incoming = conn::incoming(listener, shown.as_str().into(), limits, connections.clone());
        let task = tokio::spawn(async move {
            let signal = async {
                let _ = stopped.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, signal).await {
                tracing::error!(socket = %shown, error = %e, "kubelet socket server failed");
            }
        });
        Ok(ServedSocket {
            path: path.to_path_buf(),
            identity: (meta.dev(), meta.ino()),
            stop: Some(stop),
            task: Some(task),
            connections,
        })
    }

    /// How many connections are open now.
    pub fn connections(&self) -> usize {
        self.connections.get()
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file at the path is still the socket this server bound (not removed, not
    /// replaced). When it is not, the kubelet can no longer reach this server: serve again.
    pub fn is_present(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .map(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == self.identity)
            .unwrap_or(false)
    }

    /// Whether the server task is still running.
    pub fn is_serving(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops serving (calls in flight get a short grace period) and unlinks the socket if it is
    /// still ours.
    pub async fn shutdown(mut self) {
        self.stop_and_unlink().await;
    }

    async fn stop_and_unlink(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
        {
            tracing::warn!(socket = %self.path.display(), "kubelet socket calls still running after {SHUTDOWN_GRACE:?}; stopping them");
            task.abort();
        }
        self.unlink_if_ours();
    }

    fn unlink_if_ours(&self) {
        if self.is_present()
            && let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(socket = %self.path.display(), error = %e, "could not remove the socket");
        }
    }
}

impl Drop for ServedSocket {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.unlink_if_ours();
    }
}

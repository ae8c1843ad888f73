//! Errors of the kubelet-facing sockets.

use std::path::PathBuf;

/// Why a kubelet-facing socket could not be served or the kubelet could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The socket's directory could not be created.
    #[error(
        "cannot create the directory {path} for a kubelet socket: {source}; check that the kubelet's directories exist and nri-accel may write there"
    )]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Something other than a socket is in the socket's place.
    #[error("{path} exists and is not a socket; nri-accel will not replace it: move it away")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another process serves the socket.
    #[error(
        "another process is serving {path}; stop it (or give nri-accel another driver or resource name)"
    )]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// The path could not be inspected, cleared or bound.
    #[error("cannot serve the kubelet socket {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kubelet's socket could not be reached.
    #[error("cannot reach the kubelet at {path}: {reason}; is the kubelet running?")]
    Dial {
        /// The kubelet's socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

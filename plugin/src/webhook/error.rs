//! What can go wrong in the admission webhook: each message names the file, field or request
//! part at fault and what to do.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors of the admission webhook.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A certificate or key file could not be read.
    #[error(
        "cannot read {path}: {source}; mount the webhook's kubernetes.io/tls Secret there (tls.crt and tls.key)"
    )]
    ReadTls {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The certificate or key file does not hold what it must.
    #[error("{path}: {why}")]
    BadTls {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        why: String,
    },
    /// Binding the listening socket failed.
    #[error("cannot listen on {addr}: {source}; pick a free port for --listen")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The underlying error.
        source: io::Error,
    },
    /// The request body is larger than the webhook reads.
    #[error(
        "the AdmissionReview is larger than {limit} bytes, the most this webhook reads; a pod that large is refused by the API server anyway"
    )]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request is not an AdmissionReview v1 this webhook can answer.
    #[error("bad AdmissionReview: {why}")]
    BadReview {
        /// What is wrong.
        why: String,
    },
    /// The body could not be read (the client went away, or sent a broken chunk).
    #[error("cannot read the request body: {0}")]
    Body(String),
}

//! The connections of a kubelet-facing socket: how many may be open, when an idle one is closed,
//! and the adapter every accepted connection goes through before the HTTP/2 server sees it.
//!
//! - [`frames`]: the HTTP/2 framing the adapter reads;
//! - [`rewrite`]: the client's header blocks re-encoded with an `:authority` the server accepts
//!   (the kubelet's grpc-go clients send the percent-encoded socket path, which h2 refuses);
//! - [`streams`]: the streams open on a connection (idle = none open) and the server's resets,
//!   logged at WARN;
//! - `io`: the adapter itself, an `AsyncRead + AsyncWrite` over the accepted socket;
//! - `listen`: the accept loop with the connection cap.

pub mod frames;
mod io;
mod listen;
pub mod rewrite;
pub mod streams;

use std::time::Duration;

pub use io::KubeletConn;
pub use listen::{ConnCount, incoming};

/// The most connections a kubelet-facing socket holds at once by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = crate::config::DEFAULT_KUBELET_MAX_CONNECTIONS;

/// How long a connection with no stream open is kept by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration =
    Duration::from_secs(crate::config::DEFAULT_KUBELET_IDLE_TIMEOUT_SECS);

/// The most streams one connection may have open (the server refuses more with
/// REFUSED_STREAM, the adapter closes a connection that keeps several times as many).
pub const MAX_STREAMS: u32 = 64;

/// Limits on one socket's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once; one more is accepted and closed at once, and logged.
    pub max_connections: usize,
    /// A connection with no stream open for this long is closed; `None` keeps it.
    pub idle_timeout: Option<Duration>,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }
}

impl ConnLimits {
    /// The limits of the `dra` section (for [`crate::kubelet::DraDriver::start_with_limits`]).
    pub fn of_dra(dra: &crate::config::DraConfig) -> ConnLimits {
        ConnLimits::from_config(dra.max_connections, dra.idle_timeout_secs)
    }

    /// The limits a config gives: `max_connections` (0 is read as 1) and `idle_timeout_secs`
    /// (0 keeps idle connections).
    pub fn from_config(max_connections: usize, idle_timeout_secs: u64) -> ConnLimits {
        ConnLimits {
            max_connections: max_connections.max(1),
            idle_timeout: (idle_timeout_secs > 0).then(|| Duration::from_secs(idle_timeout_secs)),
        }
    }
}

/// A tonic server set up for a kubelet-facing socket: streams per connection capped at
/// [`MAX_STREAMS`].
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder().max_concurrent_streams(MAX_STREAMS)
}

//! Errors the simulated kubelet reports to tests.

/// What went wrong talking to a plugin.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The plugin's socket could not be reached.
    #[error("cannot connect to {socket}: {reason}")]
    Connect {
        /// The socket.
        socket: String,
        /// Why.
        reason: String,
    },
    /// A call answered a gRPC error status.
    #[error("{method} answered {code:?}: {message}")]
    Status {
        /// The full method path.
        method: String,
        /// The gRPC code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// The plugin's registration is not what the kubelet accepts.
    #[error("plugin at {socket} refused: {reason}")]
    Refused {
        /// The registration socket.
        socket: String,
        /// Why the kubelet would refuse it.
        reason: String,
    },
    /// Waiting for something took too long.
    #[error("timed out waiting for {0}")]
    Timeout(String),
}

impl SimError {
    /// The gRPC code, for a status error.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            SimError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

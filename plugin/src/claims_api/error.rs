//! Errors of the claims API and the one place that maps them to ttrpc status codes.

use std::path::PathBuf;

use ttrpc::{Code, Status};

/// The message a caller sees while the gate is closed.
pub const GATE_CLOSED_MESSAGE: &str =
    "nri-accel is waiting for the container runtime's Synchronize; retry shortly";

/// Everything that can go wrong in the claims API: serving a request, binding the socket, or
/// calling the API as a client.
#[derive(Debug, thiserror::Error)]
pub enum ClaimsApiError {
    /// The gate is closed: Prepare and Unprepare are refused as a whole request.
    #[error("{GATE_CLOSED_MESSAGE}")]
    GateClosed,
    /// The request payload is larger than the configured limit.
    #[error(
        "{method} request of {size} bytes exceeds the claims API limit of {max} bytes; send fewer claims per request"
    )]
    RequestTooLarge {
        /// Method called.
        method: String,
        /// Payload size in bytes.
        size: usize,
        /// Configured limit in bytes.
        max: usize,
    },
    /// The request carries more claims than one request may.
    #[error("request carries {count} claims, more than the limit of {max}; split it")]
    TooManyClaims {
        /// Claims in the request.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The request payload does not decode as the method's message.
    #[error("{method} request could not be decoded: {reason}")]
    Undecodable {
        /// Method called.
        method: String,
        /// What the decoder reported.
        reason: String,
    },
    /// The claim engine failed as a whole (for example it panicked); no claim was answered.
    #[error("nri-accel's claim engine failed: {0}; retry, and see the daemon's log")]
    Engine(String),
    /// The socket's parent directory could not be created.
    #[error("cannot create the claims API socket directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The socket path could not be inspected.
    #[error("cannot inspect the claims API socket path {path}: {source}")]
    Inspect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Something already listens on the socket path.
    #[error(
        "another nri-accel is already serving the claims API on {path}; stop it or choose another socket path"
    )]
    AlreadyRunning {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path exists and is not a socket; it is left alone.
    #[error(
        "{path} exists and is not a unix socket; nri-accel will not remove it, move it away or choose another socket path"
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A stale socket could not be removed.
    #[error("cannot remove the stale claims API socket {path}: {source}")]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Binding the socket failed.
    #[error("cannot bind the claims API socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Setting the socket's mode or group failed.
    #[error("cannot set the permissions of the claims API socket {path}: {source}")]
    Permissions {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The ttrpc server could not start or stop.
    #[error("claims API server on {path}: {message}")]
    Server {
        /// The socket path.
        path: PathBuf,
        /// What ttrpc reported.
        message: String,
    },
    /// A client could not connect.
    #[error(
        "cannot connect to the claims API socket {path}: {source}; {}",
        connect_hint(source)
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The server answered a call with a non-OK status.
    #[error("the claims API answered {}: {message}", code_words(*code))]
    Rpc {
        /// The ttrpc status code.
        code: Code,
        /// The server's message.
        message: String,
    },
    /// The call failed on the way (connection closed, timeout, encoding).
    #[error(
        "the claims API call failed: {0}; the daemon may have stopped or restarted (check \
         systemctl status nri-accel and its log), retry"
    )]
    Transport(String),
    /// The server's answer could not be understood.
    #[error("claims API answer is malformed: {0}")]
    InvalidResponse(String),
}

/// What to do when connecting failed, by why it failed.
fn connect_hint(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::NotFound => {
            "no daemon has created it: start the daemon (systemctl start nri-accel), or point \
             --config at the daemon's config (claims_api.socket)"
        }
        ErrorKind::ConnectionRefused => {
            "nothing listens on it (a daemon that stopped left it): start the daemon \
             (systemctl start nri-accel)"
        }
        ErrorKind::PermissionDenied => {
            "run this as root, or as a member of the group set in claims_api.group"
        }
        _ => "check the path and that nri-accel is running (systemctl status nri-accel)",
    }
}

/// A ttrpc status code as words: `PERMISSION_DENIED` -> `permission denied`.
fn code_words(code: Code) -> String {
    format!("{code:?}").to_ascii_lowercase().replace('_', " ")
}

impl ClaimsApiError {
    /// The ttrpc status code for this error: the single mapping from internal errors to codes.
    pub fn code(&self) -> Code {
        match self {
            Self::GateClosed => Code::UNAVAILABLE,
            Self::RequestTooLarge { .. } => Code::RESOURCE_EXHAUSTED,
            Self::TooManyClaims { .. } | Self::Undecodable { .. } => Code::INVALID_ARGUMENT,
            Self::Rpc { code, .. } => *code,
            Self::Engine(_)
            | Self::CreateDir { .. }
            | Self::Inspect { .. }
            | Self::AlreadyRunning { .. }
            | Self::NotASocket { .. }
            | Self::RemoveStale { .. }
            | Self::Bind { .. }
            | Self::Permissions { .. }
            | Self::Server { .. }
            | Self::Connect { .. }
            | Self::Transport(_)
            | Self::InvalidResponse(_) => Code::INTERNAL,
        }
    }

    /// The ttrpc status a server answers with for this error.
    pub fn to_status(&self) -> Status {
        ttrpc::get_status(self.code(), self.to_string())
    }

    /// Whether the call was refused because the gate is closed (the caller should retry).
    pub fn is_unavailable(&self) -> bool {
        self.code() == Code::UNAVAILABLE
    }
}

impl From<ClaimsApiError> for ttrpc::Error {
    fn from(e: ClaimsApiError) -> Self {
        ttrpc::Error::RpcStatus(e.to_status())
    }
}

impl From<ttrpc::Error> for ClaimsApiError {
    fn from(e: ttrpc::Error) -> Self {
        match e {
            ttrpc::Error::RpcStatus(status) => Self::Rpc {
                code: status.code(),
                message: status.message,
            },
            other => Self::Transport(nri_proto::describe_ttrpc(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_closed_is_unavailable_with_the_retry_message() {
        let status = ClaimsApiError::GateClosed.to_status();
        assert_eq!(status.code(), Code::UNAVAILABLE);
        assert_eq!(status.code() as i32, 14);
        assert!(status.message.contains("Synchronize"));
    }

    #[test]
    fn rpc_status_round_trips_through_ttrpc_error() {
        let e: ttrpc::Error = ClaimsApiError::TooManyClaims {
            count: 2000,
            max: 1024,
        }
        .into();
        let back = ClaimsApiError::from(e);
        assert_eq!(back.code(), Code::INVALID_ARGUMENT);
        assert!(back.to_string().contains("2000"));
    }
}

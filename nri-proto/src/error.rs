//! Errors of the plugin stub and the one place that maps them to ttrpc status codes.

use std::path::PathBuf;

/// What a plugin's event handler returns on failure.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The plugin does not handle this event. Answered as ttrpc code Unimplemented (12), which makes
    /// NRI v0.12+ runtimes fall back to StateChange for notification events.
    #[error("not implemented by this plugin")]
    Unimplemented,
    /// The event failed; the runtime fails the operation (e.g. the container is not created).
    #[error("{0}")]
    Failed(String),
}

impl PluginError {
    /// A failure with a message for the runtime's log.
    pub fn failed(msg: impl Into<String>) -> PluginError {
        PluginError::Failed(msg.into())
    }
}

/// Maps a plugin error to the ttrpc status the runtime sees.
pub(crate) fn to_ttrpc(e: PluginError) -> ttrpc::Error {
    let code = match e {
        PluginError::Unimplemented => ttrpc::Code::UNIMPLEMENTED,
        PluginError::Failed(_) => ttrpc::Code::UNKNOWN,
    };
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, e.to_string()))
}

/// Errors of the plugin stub.
#[derive(Debug, thiserror::Error)]
pub enum StubError {
    /// The plugin name has characters outside `[a-zA-Z0-9_.+-]` or is empty.
    #[error("invalid NRI plugin name {0:?}: use a non-empty name of [a-zA-Z0-9_.+-]")]
    InvalidName(String),
    /// The plugin index is not exactly two digits.
    #[error("invalid NRI plugin index {0:?}: use exactly two digits, e.g. \"10\"")]
    InvalidIndex(String),
    /// Neither a socket path nor a pre-connected socket was given.
    #[error(
        "no NRI socket: call .socket(path) or run under the runtime with NRI_PLUGIN_SOCKET set"
    )]
    NoSocket,
    /// `NRI_PLUGIN_SOCKET` holds something other than a file descriptor number.
    #[error("NRI_PLUGIN_SOCKET={0:?} is not a file descriptor number")]
    BadSocketEnv(String),
    /// Connecting to the runtime socket failed.
    #[error("cannot connect to NRI socket {path}: {source}; is NRI enabled in the runtime?")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Using the inherited socket failed.
    #[error("cannot use the NRI socket inherited from the runtime: {0}")]
    Inherited(std::io::Error),
    /// The inherited socket was already used by an earlier session (it cannot reconnect).
    #[error("the NRI socket inherited from the runtime was already used and cannot be reconnected")]
    InheritedUsed,
    /// Setting up the mux or ttrpc failed.
    #[error("NRI transport setup failed: {0}")]
    Transport(String),
    /// A ttrpc call to the runtime failed.
    #[error("NRI call {call} failed: {}", describe_ttrpc(error))]
    Call {
        /// The call.
        call: &'static str,
        /// The error. Not the `source` of this error: ttrpc's own `Display` of a status is its
        /// Debug form, so it is told only through [`describe_ttrpc`].
        error: ttrpc::Error,
    },
    /// There is no live connection to the runtime.
    #[error("not connected to the NRI runtime; retry after the next Synchronize")]
    NotConnected,
    /// The runtime never configured the plugin.
    #[error("the runtime closed the connection before the plugin was configured: {0}")]
    NotConfigured(String),
}

/// A ttrpc error in words for logs and messages: a status as its code and message
/// (`unknown: container c1 not found`) rather than ttrpc's own Debug-based text.
pub fn describe_ttrpc(e: &ttrpc::Error) -> String {
    match e {
        ttrpc::Error::RpcStatus(status) => {
            let code = format!("{:?}", status.code())
                .to_ascii_lowercase()
                .replace('_', " ");
            if status.message.is_empty() {
                format!("the peer answered {code}")
            } else {
                format!("the peer answered {code}: {}", status.message)
            }
        }
        ttrpc::Error::Socket(m) => format!("the connection failed: {m}"),
        ttrpc::Error::Eof => "the connection closed".to_string(),
        // ttrpc's words for a call whose deadline passed with no answer.
        ttrpc::Error::Others(m) if m == "Request deadline elapsed" => {
            "the peer accepted the connection but gave no answer before the call's deadline"
                .to_string()
        }
        ttrpc::Error::Others(m) => m.clone(),
        other => other.to_string(),
    }
}

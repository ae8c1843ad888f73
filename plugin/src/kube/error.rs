//! Errors of the API server side, and how a kube-rs error maps onto them.

/// Why a call to the API server failed. `what` names the object (`ResourceClaim ns/name`,
/// `ResourceSlice name`, `Node name`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeError {
    /// The object does not exist (404).
    #[error("{what} does not exist on the API server")]
    NotFound {
        /// The object asked for.
        what: String,
    },
    /// The object changed under us (409: stale resourceVersion, or a name already taken).
    #[error("{what} was changed by someone else: {message}")]
    Conflict {
        /// The object written.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The server refused the object as invalid (422).
    #[error("the API server refused {what} as invalid: {message}")]
    Invalid {
        /// The object written.
        what: String,
        /// The server's message (names the field and the rule).
        message: String,
    },
    /// A watch asked for a resourceVersion the server no longer has (410 Gone, `Expired`):
    /// list again and watch from the list's version.
    #[error("the API server no longer has the history of {what} a watch asked for: {message}")]
    Expired {
        /// The objects watched.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The credentials are missing or lack the permission (401, 403).
    #[error(
        "the API server denied access to {what}: {message}; check the service account's RBAC (packaging/kubernetes/rbac.yaml)"
    )]
    Denied {
        /// The object asked for.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The server could not be reached, failed (5xx, 429) or did not answer in time.
    #[error("the API server is unavailable for {what}: {message}")]
    Unavailable {
        /// The object asked for.
        what: String,
        /// What went wrong.
        message: String,
    },
    /// No client could be built: the kubeconfig or in-cluster credentials are missing or bad.
    #[error("cannot set up the Kubernetes client: {0}")]
    Config(String),
    /// Anything else the server answered (a 4xx we do not expect, a body that does not decode).
    #[error("the API server answered an unexpected error for {what}: {message}")]
    Other {
        /// The object asked for.
        what: String,
        /// What went wrong.
        message: String,
    },
}

impl KubeError {
    /// Whether trying again later may succeed (the server is down, stalls or is overloaded).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            KubeError::Unavailable { .. } | KubeError::Conflict { .. }
        )
    }

    /// Maps an error of the kube client for a call about `what`.
    pub fn from_kube(what: impl Into<String>, e: kube::Error) -> KubeError {
        let what = what.into();
        match e {
            kube::Error::Api(status) => {
                let message = if status.message.is_empty() {
                    status.reason.clone()
                } else {
                    status.message.clone()
                };
                match status.code {
                    404 => KubeError::NotFound { what },
                    409 => KubeError::Conflict { what, message },
                    410 => KubeError::Expired { what, message },
                    422 => KubeError::Invalid { what, message },
                    401 | 403 => KubeError::Denied { what, message },
                    408 | 429 | 500..=599 => KubeError::Unavailable { what, message },
                    code => KubeError::Other {
                        what,
                        message: format!("HTTP {code}: {message}"),
                    },
                }
            }
            kube::Error::HyperError(e) => KubeError::Unavailable {
                what,
                message: e.to_string(),
            },
            kube::Error::Service(e) => KubeError::Unavailable {
                what,
                message: chain(e.as_ref()),
            },
            // A watch whose connection broke or went silent.
            kube::Error::ReadEvents(e) => KubeError::Unavailable {
                what,
                message: chain(&e),
            },
            kube::Error::Auth(e) => KubeError::Denied {
                what,
                message: e.to_string(),
            },
            other => KubeError::Other {
                what,
                message: chain(&other),
            },
        }
    }
}

/// An error and its sources on one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

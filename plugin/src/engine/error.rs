//! Errors of the claim engine.

use super::CrashPoint;

/// Why a claim operation or the engine's startup failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The policy refused the claim; the sentence names claim, device and reason.
    #[error("{0}")]
    Refused(#[from] policies::Refusal),
    /// The claim UID cannot be used (it would break file names or CDI names).
    #[error("claim {uid:?} refused: {reason}")]
    InvalidClaim {
        /// The UID as given.
        uid: String,
        /// Why it is refused.
        reason: String,
    },
    /// The checkpoint could not be written or read.
    #[error(
        "claim {claim}: checkpoint: {source}; nothing was granted, retry once the state dir is writable"
    )]
    Checkpoint {
        /// Claim being worked on (or `startup`).
        claim: String,
        /// The underlying error (names the file).
        #[source]
        source: crate::checkpoint::CheckpointError,
    },
    /// The CDI spec could not be written, read or removed.
    #[error("claim {claim}: CDI spec: {source}")]
    Spec {
        /// Claim being worked on.
        claim: String,
        /// The underlying error (names the file).
        #[source]
        source: cdi::CdiError,
    },
    /// The committed records do not fit the policy (a device disappeared, or the
    /// pools changed so that two records overlap).
    #[error(
        "cannot restore the committed claims into the policy: {0}; the checkpoint was kept: fix the config or inventory, or move the checkpoint aside to start empty"
    )]
    Restore(String),
    /// A crash was injected at this step by a test hook.
    #[error("crash injected at step {0}")]
    Crashed(CrashPoint),
    /// A blocking task failed to run.
    #[error("claim {claim}: internal task failed: {reason}")]
    Task {
        /// Claim being worked on.
        claim: String,
        /// What went wrong.
        reason: String,
    },
}

impl EngineError {
    /// Whether the error is a test-injected crash (the caller must stop at once).
    pub fn is_crash(&self) -> bool {
        matches!(self, EngineError::Crashed(_))
    }
}

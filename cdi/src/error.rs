//! The error type of the CDI spec store.

use std::path::PathBuf;

/// Everything that can go wrong while checking, writing, listing or reading CDI specs.
///
/// Every variant names the value, claim or file involved so that a log line alone says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A claim UID that could escape the spec directory or break the CDI naming rules.
    #[error(
        "invalid claim UID {uid:?}: {reason} (allowed: 1-128 chars, [A-Za-z0-9] at both ends, [A-Za-z0-9_.-] inside, no \"..\")"
    )]
    InvalidClaimUid {
        /// The refused UID.
        uid: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A vendor or class name in the store configuration that CDI would reject.
    #[error("invalid CDI {what} name {name:?} in the store configuration: {reason}")]
    InvalidKind {
        /// `"vendor"` or `"class"`.
        what: &'static str,
        /// The refused name.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A container edit the official CDI parser would reject.
    #[error("claim {claim}: result {result}: invalid {field}: {reason}")]
    InvalidEdit {
        /// The claim UID the edits belong to.
        claim: String,
        /// Index of the result (device) within the claim.
        result: usize,
        /// The field that is wrong, e.g. `env[0]` or `deviceNodes[1].permissions`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A write with no results, or a result with no edits at all.
    #[error("claim {claim}: {reason}; a CDI device needs at least one container edit")]
    EmptyEdits {
        /// The claim UID.
        claim: String,
        /// Which part is empty.
        reason: String,
    },
    /// The encoded spec or a spec on disk exceeds the size bound.
    #[error("CDI spec {path} is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// The spec file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// The bound.
        limit: u64,
    },
    /// Serialising a spec failed.
    #[error("cannot encode the CDI spec for claim {claim}: {reason}")]
    Encode {
        /// The claim UID.
        claim: String,
        /// The serializer's message.
        reason: String,
    },
    /// A spec on disk could not be parsed, or is not of our kind.
    #[error("cannot parse CDI spec {path}: {reason}; remove the file or rewrite the claim")]
    Parse {
        /// The spec file.
        path: PathBuf,
        /// The parser's message (with line and column for YAML).
        reason: String,
    },
    /// A vendor's CDI spec (read, never written) that cannot be used.
    #[error(
        "vendor CDI spec {path} cannot be used: {reason}; fix or remove the file (nri-accel reads it again before the next grant)"
    )]
    Vendor {
        /// The vendor spec file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The CDI directory cannot be used as one (a symbolic link, not a directory).
    #[error("CDI directory: {0}")]
    Dir(String),
    /// A file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done, e.g. `"fsync directory"`.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl CdiError {
    /// Wraps an I/O error with the operation and path it concerns.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CdiError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

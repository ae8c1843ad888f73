//! Errors of the claim engine.

use super::CrashPoint;

/// What a failed claim operation means for the claim and what to do, ending its error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Nothing to add (startup, reconciliation: the claim's state is told elsewhere).
    Unsaid,
    /// A Prepare granted nothing: no spec, no record, no units held.
    NotGranted,
    /// A repeated Prepare failed; the earlier grant stands.
    KeptAsBefore,
    /// An Unprepare did not finish.
    NotReleased,
    /// An Unprepare failed and left the claim as it was: its spec is in place.
    StillPrepared,
}

impl std::fmt::Display for Then {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Then::Unsaid => "",
            Then::NotGranted => NOT_GRANTED,
            Then::KeptAsBefore => "; the claim stays prepared as it was before this Prepare",
            Then::NotReleased => NOT_RELEASED,
            Then::StillPrepared => STILL_PREPARED,
        })
    }
}

/// Ends the error of a Prepare that granted nothing (no spec, no record, no units held).
pub const NOT_GRANTED: &str = "; nothing was granted: retry the Prepare once the cause is fixed";

/// Ends the error of an Unprepare that did not finish.
pub const NOT_RELEASED: &str = "; the Unprepare did not finish and the claim may still hold its devices: retry the Unprepare (it is idempotent) until it succeeds";

/// Ends the error of an Unprepare that failed and left the claim as it was (its spec in place).
pub const STILL_PREPARED: &str = "; nothing was released: the claim stays prepared as it was, its CDI spec in place: retry the Unprepare (it is idempotent) once the cause is fixed";

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
    /// An unprepare of a claim that running containers still use: releasing it would let the
    /// next claim take a device those containers hold.
    #[error(
        "claim {claim} not unprepared: it is in use by container(s) {containers}; nothing was released: stop those containers first (the kubelet does before it unprepares), then unprepare again"
    )]
    InUse {
        /// The claim.
        claim: String,
        /// The containers, each as `id (namespace/pod/container)`.
        containers: String,
    },
    /// A request admitted while the claims API's gate was open reached its claim after the gate
    /// closed (the NRI connection was lost): nri-accel no longer knows which containers run,
    /// so nothing is allocated or released until the runtime synchronizes again.
    #[error(
        "claim {claim} not {what}: the connection to the container runtime was lost after this request was admitted, so nri-accel does not know which containers run until the runtime synchronizes again; nothing was changed: retry"
    )]
    NoLongerAdmitted {
        /// The claim.
        claim: String,
        /// `prepared`, `unprepared` or `released`.
        what: &'static str,
    },
    /// A Prepare or Unprepare named a held claim UID under another namespace/name than the
    /// claim's: a UID belongs to one claim, so nothing is answered from or done to the holder.
    #[error(
        "claim {claim} not {verb}: it is held as {held} and this {call} names it {asked}; nothing was changed: a claim UID belongs to one namespace/name, so {todo}",
        verb = .call.verb(),
        todo = .call.todo(.held)
    )]
    OtherClaim {
        /// The claim UID.
        claim: String,
        /// The call refused.
        call: super::ClaimCall,
        /// The holder's `namespace/name`.
        held: String,
        /// The `namespace/name` the call gave.
        asked: String,
    },
    /// The node lock was removed or replaced, or its state dir moved, while this nri-accel held
    /// it (issue 39): another nri-accel may take the lock and change the same state, so this one
    /// changes nothing any more until it is restarted.
    #[error(
        "claim {claim} not {what}: {lost} while this nri-accel held it, so another nri-accel may take the lock and change the same state; this one grants and releases nothing any more: stop every nri-accel on this node, then start one{then}"
    )]
    NodeLockLost {
        /// The claim (or what was being committed).
        claim: String,
        /// `prepared`, `unprepared`, `reconciled` or `changed`.
        what: &'static str,
        /// How the lock was lost: `the node lock <path> was removed`, ...
        lost: String,
        /// What the failure means for the claim.
        then: Then,
    },
    /// The configured CDI dir is no longer the directory opened at start (moved away, or a file,
    /// a symbolic link or another directory put at its path; issue 39): the runtime reads specs
    /// by that path, so a spec written through the open handle is a grant nobody can use.
    #[error(
        "claim {claim} not prepared: since nri-accel opened the CDI dir, {moved}; the container runtime reads CDI specs by that path, so it would not find this claim's spec: put the directory back, or restart nri-accel{then}"
    )]
    CdiDirMoved {
        /// The claim.
        claim: String,
        /// What is at the path now: `<dir> was replaced by a symbolic link (to <target>)`, ...
        moved: String,
        /// What the failure means for the claim.
        then: Then,
    },
    /// The checkpoint could not be written or read.
    #[error("claim {claim}: checkpoint: {source}{then}")]
    Checkpoint {
        /// Claim being worked on (or `startup`).
        claim: String,
        /// What the failure means for the claim and what to do.
        then: Then,
        /// The underlying error (names the file).
        #[source]
        source: crate::checkpoint::CheckpointError,
    },
    /// The CDI spec could not be written, read or removed.
    #[error("claim {claim}: CDI spec: {source}{then}")]
    Spec {
        /// Claim being worked on.
        claim: String,
        /// What the failure means for the claim, as for `Checkpoint`.
        then: Then,
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
    /// CDI specs prove grants the checkpoint does not hold: it lost commits (an older copy, a
    /// cut log) or the specs come from elsewhere. Startup stops; nothing was changed.
    #[error(
        "refusing to start: {count} CDI spec file(s) in {cdi_dir} prove grants that the checkpoint {checkpoint} does not hold ({last}): {files}. The checkpoint lost commits (restored from an older copy, or its log was cut) or the specs were copied in. Nothing was changed or deleted. Way out: put the newest checkpoint back if there is one; otherwise stop nri-accel, move the listed spec files out of {cdi_dir} (keep them) and start again: devices that running containers use are then adopted, and DRA drivers prepare their claims again"
    )]
    LostHistory {
        /// How many spec files.
        count: usize,
        /// The files and why each is unproven (the first 20).
        files: String,
        /// The CDI dir.
        cdi_dir: std::path::PathBuf,
        /// The checkpoint dir.
        checkpoint: std::path::PathBuf,
        /// What the checkpoint holds: `it ends at commit N of boot B`.
        last: String,
    },
    /// A prepared claim was asked to prepare again with a different ask.
    #[error(
        "claim {claim} is already prepared with {holds} and this Prepare asks for {asked}: a claim's allocation never changes under one UID. Unprepare it first, or prepare the new ask under a new UID; nothing was changed"
    )]
    AskChanged {
        /// The claim.
        claim: String,
        /// What it holds.
        holds: String,
        /// What was asked now.
        asked: String,
    },
    /// A share id on a device that is not shared.
    #[error(
        "claim {claim} refused: device {device} of pool {pool} is not shared, so it takes no share id (got {share_id}); nothing was prepared"
    )]
    ShareIdNotShared {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// Its pool.
        pool: String,
        /// The share id given.
        share_id: String,
    },
    /// The grant's vendor CDI composition cannot be decided (docs/gpus.md): a vendor spec cannot
    /// be used, two disagree, or a `vendor_cdi: required` pool's device is described by none.
    #[error("claim {claim} not prepared: {reason}{then}")]
    Vendor {
        /// The claim.
        claim: String,
        /// The sentence naming the spec file(s) or the spec dirs read.
        reason: String,
        /// What the failure means for the claim.
        then: Then,
    },
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

//! Files a claim's grant carries beside its CDI spec (the KEP-5304 device metadata of a DRA
//! claim, `crate::metadata`), which the spec mounts into the containers.
//!
//! They follow the spec's rules: written after the record is committed and right before the
//! spec, so a crash between the two leaves a record without a spec, which startup rolls back;
//! removed after the spec and the record. A claim with files but no record is an orphan: the
//! daemon's sweep ([`super::Engine::sweep_claim_files`]) removes it at startup and with every
//! periodic reconciliation, under the claim's lock.

use std::sync::Arc;

use policies::Allocation;

use super::{DeviceCheck, Engine, EngineError, Then, blocking};

/// Where a claim's extra files are written, found and removed. Every method runs in a blocking
/// task, under the claim's lock.
pub trait ClaimFiles: Send + Sync + 'static {
    /// Writes the files claim `uid` is to have (what a door staged for it; nothing for a claim
    /// nothing was staged for) and answers, for each result (whose request `requests` names,
    /// in the allocation's order), the mounts its CDI device adds.
    fn write(&self, uid: &str, requests: &[String]) -> Result<Vec<Vec<cdi::Mount>>, cdi::CdiError>;
    /// The mounts of the files claim `uid` has now, per result as [`ClaimFiles::write`] answers
    /// (a spec written again, or compared, without writing anything).
    fn mounts(&self, uid: &str, requests: &[String])
    -> Result<Vec<Vec<cdi::Mount>>, cdi::CdiError>;
    /// Removes every file of claim `uid`; nothing to remove is success.
    fn remove(&self, uid: &str) -> Result<(), cdi::CdiError>;
    /// The claims that have files.
    fn list(&self) -> Result<Vec<String>, cdi::CdiError>;
}

/// Adds `mounts` (per result) to `edits` (per result).
pub(super) fn add_mounts(edits: &mut [cdi::DeviceEdits], mounts: Vec<Vec<cdi::Mount>>) {
    for (e, m) in edits.iter_mut().zip(mounts) {
        e.mounts.extend(m);
    }
}

impl Engine {
    /// Sets the check every fresh grant's devices pass (a device that fails it refuses the
    /// claim, whatever the door: docs/refusals.md, "cannot be handed out now"); only the first
    /// call counts. A claim already granted is never refused by it.
    pub fn set_device_check(&self, check: DeviceCheck) {
        let _ = self.device_check.set(check);
    }

    /// The refusal of claim `uid` when a device of `allocation` fails the device check.
    pub(super) fn unavailable(
        &self,
        uid: &str,
        allocation: &Allocation,
    ) -> Option<policies::Refusal> {
        let check = self.device_check.get()?;
        allocation.results.iter().find_map(|g| {
            check(&g.device_id).map(|why| {
                policies::Refusal::new(
                    uid,
                    Some(&g.device_id),
                    policies::RefusalReason::Unavailable { why },
                )
            })
        })
    }

    /// Sets where grants' extra files (device metadata) go; only the first call counts. Set it
    /// before the doors open, then run [`Engine::sweep_claim_files`].
    pub fn set_claim_files(&self, files: Arc<dyn ClaimFiles>) {
        let _ = self.files.set(files);
    }

    /// Removes the files of claims that have no record (orphans: a crash after the files and
    /// before the spec, which startup rolled back, or between an unprepare's release and the
    /// files' removal), each under its claim's lock. Answers the claims whose files it removed.
    pub async fn sweep_claim_files(&self) -> Result<Vec<String>, EngineError> {
        let Some(files) = self.files.get().cloned() else {
            return Ok(Vec::new());
        };
        let listed = files.clone();
        let uids = blocking("sweep", move || listed.list())
            .await?
            .map_err(|source| EngineError::Spec {
                then: Then::Unsaid,
                claim: "sweep".into(),
                source,
            })?;
        let mut removed = Vec::new();
        for uid in uids {
            let _claim = self.claims.lock(&uid).await;
            if self.state().node.allocation(&uid).is_some() || self.journal.record(&uid).is_some() {
                continue;
            }
            let f = files.clone();
            let id = uid.clone();
            match blocking(&uid, move || f.remove(&id)).await? {
                Ok(()) => {
                    tracing::warn!(claim = %uid, "removed the device metadata of a claim without a record (an orphan)");
                    removed.push(uid);
                }
                Err(e) => {
                    tracing::error!(claim = %uid, error = %e, "the device metadata of a claim without a record could not be removed; the next sweep tries again")
                }
            }
        }
        Ok(removed)
    }

    /// Removes claim `uid`'s extra files after its spec and record went; a failure is logged
    /// (the files are an orphan the next sweep removes).
    pub(crate) async fn remove_claim_files(&self, uid: &str) {
        let Some(files) = self.files.get().cloned() else {
            return;
        };
        let id = uid.to_string();
        match blocking(uid, move || files.remove(&id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(claim = %uid, error = %e, "the claim's device metadata could not be removed; the next sweep removes it")
            }
            Err(e) => {
                tracing::warn!(claim = %uid, error = %e, "removing the claim's device metadata failed")
            }
        }
    }

    /// The mounts of claim `uid`'s extra files now, per result (none without files).
    pub(crate) fn claim_file_mounts(
        &self,
        uid: &str,
        requests: &[String],
    ) -> Result<Vec<Vec<cdi::Mount>>, cdi::CdiError> {
        match self.files.get() {
            Some(files) => files.mounts(uid, requests),
            None => Ok(Vec::new()),
        }
    }
}

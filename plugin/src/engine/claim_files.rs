//! Files a claim's grant carries beside its CDI spec (the KEP-5304 device metadata of a DRA
//! claim, `crate::metadata`), which the spec mounts into the containers.
//!
//! They follow the spec's rules: written after the record is committed and right before the
//! spec, so a crash between the two leaves a record without a spec, which startup rolls back;
//! removed after the spec and the record. A claim with files but no record is an orphan: the
//! daemon's sweep ([`super::Engine::sweep_claim_files`]) removes it at startup and with every
//! periodic reconciliation, under the claim's lock.

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

//! The work of an Unprepare under its claim's lock: the spec goes, then the release is
//! committed (docs/state.md, "The spec goes first").
//!
//! An Unprepare answered with an error leaves the claim as it was, and one that removed the
//! spec finishes (issue 39, item 7: a failed directory sync used to answer an error with the
//! spec deleted under a record still PREPARED):
//! - the spec's unlink failed (the spec is still there): nothing changed; the error says so;
//! - the unlink happened and only the CDI directory's fsync failed: every reader already sees
//!   the spec gone, and only a power loss could bring it back, after which the boot id has
//!   changed and the start removes it as another boot's orphan. The Unprepare goes on and
//!   answers success (the failed sync is logged and counted);
//! - the release's commit failed: the spec is written back as it was (same edits, same stamp),
//!   so the runtime sees the claim prepared as before. The checkpoint then refuses commits
//!   until a restart, which finds the claim prepared (record and spec), or released for good
//!   when the failed sync's entry reached the disk anyway (the spec is then an orphan the start
//!   removes). While it waits for that restart, an Unprepare retried is refused before it
//!   touches the spec.

use super::{CrashPoint, Engine, EngineError, Then, blocking, edits, spec_absent};

/// What a claim's spec holds, to write it back.
struct SpecContent {
    stamp: cdi::Stamp,
    edits: Vec<cdi::DeviceEdits>,
}

impl Engine {
    /// Removes the claim's spec, then releases it and commits the release; see the module docs
    /// for what each failure leaves.
    ///
    /// The spec goes before the release: a runtime that is not connected to nri-accel
    /// (restarting, or between its restart and its Synchronize) starts containers from any spec
    /// on disk without asking, so a spec that outlived its claim's release could start a
    /// container on devices the next claim already holds. A crash between the two leaves a
    /// record without a spec, which the next start rolls back.
    pub(super) async fn unprepare_locked(&self, uid: &str) -> Result<(), EngineError> {
        // A lost node lock: another nri-accel may hold the state now; nothing is touched.
        if let Err(lost) = self.check_lock(uid).await? {
            return Err(EngineError::NodeLockLost {
                claim: uid.to_string(),
                what: "unprepared",
                lost,
                then: Then::NotReleased,
            });
        }
        let content = self.spec_content(uid);
        if content.is_none() && self.journal.record(uid).is_some() {
            // Released in memory but not on disk: an earlier release's commit failed and the
            // checkpoint refuses commits until a restart. Trying again answers that refusal;
            // the spec (written back then) stays.
            self.release_committed(uid).await?;
        }
        self.remove_spec(uid).await?;
        let Some(content) = content else {
            return Ok(());
        };
        let updates = match self.release_committed(uid).await {
            Ok(updates) => updates,
            Err(e) if e.is_crash() => return Err(e),
            Err(e) => return Err(self.put_spec_back(uid, content, e).await),
        };
        // The files the spec mounted go after it and the record.
        self.remove_claim_files(uid).await;
        self.step(CrashPoint::AfterCheckpoint)?;
        self.step(CrashPoint::AfterRelease)?;
        if !updates.is_empty() {
            self.flush_pending().await;
        }
        self.step(CrashPoint::AfterUpdatePush)?;
        Ok(())
    }

    /// The spec a held claim has, computed as [`Engine::grant`] computes it (the policy's
    /// edits with the env its record keeps, stamped with the record's commit; a test compares
    /// the bytes); `None` when the policy does not hold the claim.
    fn spec_content(&self, uid: &str) -> Option<SpecContent> {
        let env = self.journal.record(uid).map(|r| r.env).unwrap_or_default();
        let st = self.state();
        let allocation = st.node.allocation(uid)?;
        let mut edits: Vec<cdi::DeviceEdits> = st
            .node
            .edits(uid)?
            .iter()
            .zip(&allocation.results)
            .map(|(e, g)| edits::to_cdi(e, env.get(&g.request)))
            .collect();
        let requests: Vec<String> = allocation
            .results
            .iter()
            .map(|g| g.request.clone())
            .collect();
        drop(st);
        match self.claim_file_mounts(uid, &requests) {
            Ok(mounts) => super::claim_files::add_mounts(&mut edits, mounts),
            Err(e) => {
                tracing::warn!(claim = %uid, error = %e, "the claim's device metadata could not be listed; a spec written back would not mount it")
            }
        }
        let stamp = cdi::Stamp {
            seq: self.journal.record_seq(uid).unwrap_or(0),
            boot_id: self.journal.boot_id().to_string(),
        };
        Some(SpecContent { stamp, edits })
    }

    /// Removes the claim's spec. An error means the spec is still in place; an unlink whose
    /// directory sync failed is no error (module docs).
    async fn remove_spec(&self, uid: &str) -> Result<(), EngineError> {
        let specs = self.specs.clone();
        let id = uid.to_string();
        let source = match blocking(uid, move || specs.remove(&id)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(source)) => source,
            Err(e) => return Err(self.crash_or(e)),
        };
        self.tally.spec_failed();
        let specs = self.specs.clone();
        let id = uid.to_string();
        let left = blocking(uid, move || specs.exists(&id)).await?;
        if spec_absent(&left) {
            tracing::warn!(claim = %uid, error = %source,
                "the claim's CDI spec is removed but the CDI directory could not be synced; the Unprepare goes on (a spec a power loss brings back is removed at the next start)");
            return Ok(());
        }
        let then = if matches!(left, Ok(true)) {
            Then::StillPrepared
        } else {
            Then::NotReleased
        };
        Err(EngineError::Spec {
            then,
            claim: uid.to_string(),
            source,
        })
    }

    /// After the release of `uid` could not be committed (`failed`): writes its spec back as it
    /// was, and answers `failed` saying what the claim is left as.
    async fn put_spec_back(
        &self,
        uid: &str,
        content: SpecContent,
        failed: EngineError,
    ) -> EngineError {
        let specs = self.specs.clone();
        let id = uid.to_string();
        let written = blocking(uid, move || {
            specs.write_stamped(&id, &content.stamp, &content.edits)
        })
        .await;
        let then = match written {
            Ok(Ok(_)) => {
                tracing::warn!(claim = %uid, "the release could not be committed; the claim's CDI spec was written back, so the claim stays prepared as it was");
                Then::StillPrepared
            }
            Ok(Err(e)) => {
                self.tally.spec_failed();
                tracing::error!(claim = %uid, error = %e, "the release could not be committed and the claim's CDI spec could not be written back: the claim has a record without a spec, which the next start rolls back");
                Then::NotReleased
            }
            Err(e) => return self.crash_or(e),
        };
        match failed {
            EngineError::Checkpoint { claim, source, .. } => EngineError::Checkpoint {
                claim,
                then,
                source,
            },
            other => other,
        }
    }
}

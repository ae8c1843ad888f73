//! Claims that live and die with a container (annotation and adopted claims): which claims a
//! container owns, and the handover of an adopted claim to another container that still uses its
//! device.
//!
//! An adopted claim records a device found in use without a record. Several running containers
//! can use one such device (a whole device shared by the containers of a pod, or more containers
//! than the shares a shared device has left); the claim is owned by one of them. When that one
//! goes and another still runs on the device, the claim is handed over instead of released, so
//! the device stays held for as long as any running container uses it. The handover rewrites
//! the record with its new owner in one commit: a crash leaves either owner on disk, and the next
//! Synchronize hands the claim over again (or releases it) from the containers it finds.

use super::{ClaimRecord, Engine, EngineError, Origin, check_uid};
use crate::checkpoint::Change;

impl Engine {
    /// The claims whose origin names `container_id` (its annotation and adopted claims).
    pub fn owned_by(&self, container_id: &str) -> Vec<(String, Origin)> {
        self.state()
            .origins
            .iter()
            .filter(|(_, o)| o.container() == Some(container_id))
            .map(|(u, o)| (u.clone(), o.clone()))
            .collect()
    }

    /// Where a committed claim came from; `None` for an unknown claim.
    pub fn origin_of(&self, uid: &str) -> Option<Origin> {
        let st = self.state();
        st.node.allocation(uid)?;
        Some(st.origins.get(uid).cloned().unwrap_or_default())
    }

    /// Hands adopted claim `uid` over to `container_id`, a running container that uses its
    /// device: the record is rewritten with the new owner (durable before memory changes).
    /// Answers `false`, changing nothing, when `uid` is not (or no longer) an adopted claim.
    pub async fn hand_over(&self, uid: &str, container_id: &str) -> Result<bool, EngineError> {
        check_uid(uid)?;
        let _claim = self.claims.lock(uid).await;
        let from = match self.origin_of(uid) {
            Some(Origin::Adopted { container_id: from }) => from,
            _ => return Ok(false),
        };
        if from == container_id {
            return Ok(true);
        }
        let Some(record) = self.journal.record(uid) else {
            return Ok(false);
        };
        let origin = Origin::Adopted {
            container_id: container_id.to_string(),
        };
        let allocation = record.allocation.clone();
        let record = ClaimRecord {
            allocation: record.allocation,
            origin: origin.clone(),
            ask: record.ask,
            env: record.env,
        };
        let seq = self
            .commit(uid, vec![Change::PutRecord(uid.to_string(), record)])
            .await?;
        self.state().set_origin(uid, origin);
        // The spec must carry the stamp of the record's commit, or reconciliation would take it
        // for the spec of an earlier, released grant.
        self.grant(uid, &allocation, Some(seq), Some(Vec::new()))
            .await?;
        tracing::warn!(claim = %uid, from = %from, to = %container_id,
            "an adopted device outlives the container it was adopted for; another running container still uses it and now holds it");
        Ok(true)
    }
}

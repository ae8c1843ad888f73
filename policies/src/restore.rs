//! Restoring the node from committed records (startup, or a replayed checkpoint).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::node::Node;
use crate::{Allocation, ClaimUid, Grant, PolicyError};

impl Node {
    /// Rebuilds all state from committed records, replacing what the node held.
    ///
    /// A record naming a pool, device or unit that is gone, or conflicting with
    /// another record, is an error naming the claim and the device; the node
    /// then keeps what it held before.
    pub fn restore(&mut self, records: &[Allocation]) -> Result<(), PolicyError> {
        let shared: Vec<Arc<Allocation>> = records.iter().cloned().map(Arc::new).collect();
        self.restore_shared(&shared)
    }

    /// [`Node::restore`] from records held elsewhere too (the checkpoint's): the node keeps the
    /// same allocations instead of copies.
    pub fn restore_shared(&mut self, records: &[Arc<Allocation>]) -> Result<(), PolicyError> {
        let previous: Vec<Arc<Allocation>> = self.claims.values().cloned().collect();
        match self.restore_inner(records) {
            Ok(()) => Ok(()),
            Err(e) => {
                // The previous state was consistent, so restoring it cannot fail.
                let _ = self.restore_inner(&previous);
                Err(e)
            }
        }
    }

    fn restore_inner(&mut self, records: &[Arc<Allocation>]) -> Result<(), PolicyError> {
        let mut per_pool: Vec<Vec<(ClaimUid, Grant)>> = vec![Vec::new(); self.pools.len()];
        let mut claims = BTreeMap::new();
        let mut shared = self.inventory.cpus.clone();
        for r in records {
            let err = |device: &str, why: String| PolicyError::Restore {
                claim: r.claim_uid.clone(),
                device: device.to_string(),
                why,
            };
            if claims.contains_key(&r.claim_uid) {
                return Err(err("-", "the claim has two records".to_string()));
            }
            for g in &r.results {
                let Some(&p) = self.pool_index.get(&g.pool) else {
                    return Err(err(
                        &g.device_id,
                        format!("pool {} is not configured", g.pool),
                    ));
                };
                per_pool[p].push((r.claim_uid.clone(), g.clone()));
            }
            if !r.cpus.is_subset(&shared) {
                return Err(err(
                    r.results.first().map_or("-", |g| g.device_id.as_str()),
                    format!(
                        "CPUs {} are offline or given to another claim",
                        r.cpus.difference(&shared)
                    ),
                ));
            }
            shared = shared.difference(&r.cpus);
            claims.insert(r.claim_uid.clone(), r.clone());
        }
        for (pool, grants) in self.pools.iter_mut().zip(&per_pool) {
            if let Err(e) = pool.policy.restore(grants) {
                for pool in &mut self.pools {
                    let _ = pool.policy.restore(&[]);
                }
                self.claims.clear();
                self.shared = self.inventory.cpus.clone();
                return Err(e);
            }
        }
        self.claims = claims;
        self.shared = shared;
        let _ = self.refresh_containers();
        Ok(())
    }
}

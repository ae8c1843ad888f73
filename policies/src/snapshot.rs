//! The node's status for `nri-accel status`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::node::Node;
use crate::{ClaimUid, CpuSet, PoolSnapshot, PoolUsage};

/// Everything `status` shows about allocation: per pool and device, units
/// total/used and who holds them; unpooled devices; the CPU pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Pools in config order.
    pub pools: Vec<PoolSnapshot>,
    /// Devices no pool matches (never handed out), by id.
    pub unpooled: Vec<String>,
    /// CPUs not given exclusively to any claim.
    pub shared_cpus: CpuSet,
    /// Exclusive CPUs per claim (claims without any are left out).
    pub exclusive_cpus: BTreeMap<ClaimUid, CpuSet>,
    /// Number of claims allocated.
    pub claims: usize,
}

impl Node {
    /// Each pool's name and usage, in config order: the cheap part of [`Node::snapshot`].
    pub fn usage(&self) -> Vec<(&str, PoolUsage)> {
        self.pools
            .iter()
            .map(|p| (p.config.name.as_str(), p.policy.usage()))
            .collect()
    }

    /// The node's status.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pools: self.pools.iter().map(|p| p.policy.snapshot()).collect(),
            unpooled: self.unpooled.clone(),
            shared_cpus: self.shared.clone(),
            exclusive_cpus: self
                .claims
                .iter()
                .filter(|(_, a)| !a.cpus.is_empty())
                .map(|(uid, a)| (uid.clone(), a.cpus.clone()))
                .collect(),
            claims: self.claims.len(),
        }
    }
}

//! An example author policy, `spread`: whole devices, with the results of a
//! count request spread over NUMA nodes (at most `max_per_numa` per node), for
//! jobs that want memory bandwidth on every socket rather than locality.
//!
//! It implements [`Policy`] directly and registers through the same
//! [`policies::Registry`] door as the built-ins; `src/main.rs` turns it into a
//! whole nri-accel daemon. `docs/policy-guide.md` walks through both (its Rust
//! code is compiled as this crate's doc-tests, below), `tests/policy.rs`
//! drives the policy through the node and `tests/daemon.rs` drives the built
//! daemon end to end.

use std::collections::BTreeMap;

use policies::naming::device_name;
use policies::{
    ClaimUid, ContainerEdits, Device, DeviceSnapshot, FamilyConfig, FamilyKind, Grant, HeldUnit,
    Policy, PolicyError, PoolConfig, PoolRequest, PoolSnapshot, PublishedDevice, PublishedKind,
    Refusal, RefusalReason, Unit,
};

/// The name the policy is registered under; pools select it with
/// `family: { kind: custom, policy: spread, params: { max_per_numa: "1" } }`.
pub const NAME: &str = "spread";

/// The factory the registry calls for each pool of this policy.
pub fn factory(
    pool: &PoolConfig,
    mut devices: Vec<Device>,
) -> Result<Box<dyn Policy>, PolicyError> {
    let FamilyConfig::Custom { params, .. } = &pool.family else {
        return Err(PolicyError::InvalidPool {
            pool: pool.name.clone(),
            why: "the spread policy needs a custom family".to_string(),
        });
    };
    let max_per_numa =
        match params.get("max_per_numa") {
            None => 1,
            Some(text) => text.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                PolicyError::InvalidPool {
                    pool: pool.name.clone(),
                    why: format!("max_per_numa must be a positive number, not {text:?}"),
                }
            })?,
        };
    devices.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Box::new(Spread {
        pool: pool.name.clone(),
        max_per_numa,
        devices,
        holders: BTreeMap::new(),
    }))
}

/// The policy's whole state: who holds which device. Everything else is
/// derived from it, so `restore` rebuilds it exactly from the grants.
struct Spread {
    pool: String,
    max_per_numa: u32,
    devices: Vec<Device>,
    /// Device id -> (claim, grant).
    holders: BTreeMap<String, (ClaimUid, Grant)>,
}

impl Spread {
    fn grant(&self, d: &Device, request: &str) -> Grant {
        Grant {
            request: request.to_string(),
            pool: self.pool.clone(),
            device: device_name(&self.pool, &d.id),
            device_id: d.id.clone(),
            unit: Unit::Whole,
        }
    }

    fn held_by(&self, claim: &str) -> impl Iterator<Item = &Grant> {
        self.holders
            .values()
            .filter(move |(c, _)| c == claim)
            .map(|(_, g)| g)
    }
}

impl Policy for Spread {
    fn family(&self) -> FamilyKind {
        FamilyKind::Custom(NAME.to_string())
    }

    fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn restore(&mut self, grants: &[(ClaimUid, Grant)]) -> Result<(), PolicyError> {
        self.holders.clear();
        for (claim, g) in grants {
            let err = |why: &str| PolicyError::Restore {
                claim: claim.clone(),
                device: g.device_id.clone(),
                why: why.to_string(),
            };
            if !self.devices.iter().any(|d| d.id == g.device_id) || g.unit != Unit::Whole {
                self.holders.clear();
                return Err(err("no such whole device in this pool"));
            }
            if self.holders.contains_key(&g.device_id) {
                self.holders.clear();
                return Err(err("the device is in two records"));
            }
            self.holders
                .insert(g.device_id.clone(), (claim.clone(), g.clone()));
        }
        Ok(())
    }

    fn allocate(&mut self, claim: &str, request: &PoolRequest) -> Result<Vec<Grant>, Refusal> {
        // Idempotent: what the claim already holds for this request is the answer.
        let mine: Vec<Grant> = self
            .held_by(claim)
            .filter(|g| g.request == request.request())
            .filter(|g| match request {
                PoolRequest::Named { device, .. } => g.device == *device,
                PoolRequest::Count { .. } => true,
            })
            .cloned()
            .collect();
        if !mine.is_empty() {
            return Ok(mine);
        }
        let refuse = |device: Option<&str>, reason| Err(Refusal::new(claim, device, reason));
        match request {
            PoolRequest::Named { request, device } => {
                let Some(d) = self
                    .devices
                    .iter()
                    .find(|d| device_name(&self.pool, &d.id) == *device)
                else {
                    return refuse(Some(device), RefusalReason::UnknownDevice);
                };
                if let Some((holder, _)) = self.holders.get(&d.id) {
                    return refuse(
                        Some(&d.id),
                        RefusalReason::HeldByOther {
                            holder: holder.clone(),
                        },
                    );
                }
                let g = self.grant(d, request);
                self.holders
                    .insert(d.id.clone(), (claim.to_string(), g.clone()));
                Ok(vec![g])
            }
            PoolRequest::Count {
                request,
                count,
                selector,
                profile,
                shares,
                ..
            } => {
                if profile.is_some() || shares.is_some() {
                    return refuse(
                        None,
                        RefusalReason::WrongFamily {
                            pool: self.pool.clone(),
                            family: NAME.to_string(),
                            asked: if profile.is_some() {
                                "sliced"
                            } else {
                                "shared"
                            }
                            .to_string(),
                        },
                    );
                }
                // Walk free devices in id order, skipping NUMA nodes that are full.
                let mut per_numa: BTreeMap<Option<u32>, u32> = BTreeMap::new();
                let mut chosen = Vec::new();
                for d in &self.devices {
                    if chosen.len() == *count as usize {
                        break;
                    }
                    let taken = per_numa.entry(d.numa_node).or_default();
                    if selector.matches(d)
                        && !self.holders.contains_key(&d.id)
                        && *taken < self.max_per_numa
                    {
                        *taken += 1;
                        chosen.push(self.grant(d, request));
                    }
                }
                if chosen.len() < *count as usize {
                    // Nothing was taken yet, so refusing changes nothing.
                    return refuse(
                        None,
                        RefusalReason::NoCapacity {
                            request: request.clone(),
                            context: None,
                        },
                    );
                }
                for g in &chosen {
                    self.holders
                        .insert(g.device_id.clone(), (claim.to_string(), g.clone()));
                }
                Ok(chosen)
            }
        }
    }

    fn release(&mut self, claim: &str) -> Vec<Grant> {
        let gone: Vec<Grant> = self.held_by(claim).cloned().collect();
        self.holders.retain(|_, (c, _)| c != claim);
        gone
    }

    fn adopt(&mut self, claim: &str, device_id: &str) -> Result<Grant, Refusal> {
        let Some(d) = self.devices.iter().find(|d| d.id == device_id) else {
            return Err(Refusal::new(
                claim,
                Some(device_id),
                RefusalReason::UnknownDevice,
            ));
        };
        match self.holders.get(device_id) {
            Some((c, g)) if c == claim => Ok(g.clone()),
            Some((holder, _)) => Err(Refusal::new(
                claim,
                Some(device_id),
                RefusalReason::HeldByOther {
                    holder: holder.clone(),
                },
            )),
            None => {
                let g = self.grant(d, "adopted");
                self.holders
                    .insert(d.id.clone(), (claim.to_string(), g.clone()));
                Ok(g)
            }
        }
    }

    fn edits(&self, grant: &Grant) -> ContainerEdits {
        let Some(d) = self.devices.iter().find(|d| d.id == grant.device_id) else {
            return ContainerEdits::default();
        };
        ContainerEdits {
            device_nodes: d.nodes.iter().chain(&d.control_nodes).cloned().collect(),
            ..ContainerEdits::default()
        }
    }

    fn env(&self, _grant: &Grant) -> Vec<(String, String)> {
        Vec::new()
    }

    fn holders(&self, device_id: &str) -> Vec<ClaimUid> {
        self.holders
            .get(device_id)
            .map(|(c, _)| vec![c.clone()])
            .unwrap_or_default()
    }

    fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            name: self.pool.clone(),
            family: NAME.to_string(),
            devices: self
                .devices
                .iter()
                .map(|d| {
                    let held: Vec<HeldUnit> = self
                        .holders
                        .get(&d.id)
                        .map(|(c, _)| HeldUnit {
                            unit: Unit::Whole,
                            claim: c.clone(),
                        })
                        .into_iter()
                        .collect();
                    DeviceSnapshot {
                        id: d.id.clone(),
                        units_total: 1,
                        units_used: held.len() as u32,
                        held,
                    }
                })
                .collect(),
        }
    }

    fn published(&self) -> Vec<PublishedDevice> {
        let mut out: Vec<PublishedDevice> = self
            .devices
            .iter()
            .map(|d| PublishedDevice {
                pool: self.pool.clone(),
                name: device_name(&self.pool, &d.id),
                device_id: d.id.clone(),
                kind: PublishedKind::Whole,
                unit: None,
            })
            .collect();
        out.sort();
        out
    }
}

/// `docs/policy-guide.md`, compiled as doc-tests: every `rust` block of the guide builds against
/// this crate's dependencies (`nri-accel`, `nri-accel-policies`), so the guide cannot drift from
/// the API it documents.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/policy-guide.md")]
pub struct PolicyGuide;

//! The shared machinery of the built-in policies: a pool's devices, the claim
//! index, published names and device choice, over a per-family unit model.

use std::collections::BTreeMap;

use crate::naming::{device_name, pci_distance, pci_root};
use crate::{
    ClaimUid, ContainerEdits, Device, DeviceSelector, DeviceSnapshot, FamilyKind, Grant, HeldUnit,
    Mount, Near, Policy, PolicyError, PoolRequest, PoolSnapshot, PoolUsage, PublishedDevice,
    PublishedKind, Refusal, RefusalReason, Unit,
};

/// What one result of a count request takes from a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UnitAsk {
    /// The whole device.
    Whole,
    /// This many contiguous replicas.
    Shares(u32),
    /// One slice of the profile with this index.
    Slice(usize),
}

/// Why a unit cannot be placed exactly.
pub(crate) enum PlaceError {
    /// The unit does not exist on the device.
    Invalid(String),
    /// Held by this claim.
    Held(ClaimUid),
}

/// How a family counts and places units on one device.
pub(crate) trait UnitModel: Send {
    /// The family.
    fn kind(&self) -> FamilyKind;
    /// Turns a count request's family parameters into a unit ask.
    fn ask(
        &self,
        pool: &str,
        profile: Option<&str>,
        shares: Option<u32>,
    ) -> Result<UnitAsk, RefusalReason>;
    /// Units one result of `ask` takes.
    fn units_of(&self, ask: &UnitAsk) -> u32;
    /// Units device `dev` offers.
    fn total(&self, dev: usize) -> u32;
    /// Units of device `dev` held.
    fn used(&self, dev: usize) -> u32;
    /// How many more results of `ask` device `dev` can give.
    fn capacity(&self, dev: usize, ask: &UnitAsk) -> u32;
    /// Whether `dev` has the free units for `ask` but no allowed placement.
    fn fragmented(&self, _dev: usize, _ask: &UnitAsk) -> bool {
        false
    }
    /// Takes the best unit for `ask` on `dev`.
    fn take(&mut self, dev: usize, ask: &UnitAsk, claim: &str) -> Option<Unit>;
    /// Takes exactly `unit` on `dev`.
    fn place(&mut self, dev: usize, unit: &Unit, claim: &str) -> Result<(), PlaceError>;
    /// Gives `unit` of `dev` back.
    fn free(&mut self, dev: usize, unit: &Unit);
    /// Held units of `dev`, sorted.
    fn held(&self, dev: usize) -> Vec<HeldUnit>;
    /// Forgets every holder.
    fn reset(&mut self);
    /// The unit an adopted device is marked with, if the device is free enough.
    fn adopt_unit(&self, dev: usize) -> Option<Unit>;
    /// Slice names to publish for `dev`: (name, unit). Whole/shareable names are added by the caller.
    fn slices(&self, _pool: &str, _device: &Device) -> Vec<(String, Unit)> {
        Vec::new()
    }
    /// The published name of a granted unit.
    fn grant_name(&self, pool: &str, device: &Device, _unit: &Unit) -> String {
        device_name(pool, &device.id)
    }
    /// Limit env for a unit of `device`.
    fn env(&self, device: &Device, unit: &Unit) -> Vec<(String, String)>;
    /// Bind mounts a unit of `device` needs (an MPS pool's daemon directories); none by default.
    fn mounts(&self, _device: &Device) -> Vec<Mount> {
        Vec::new()
    }
}

/// What a published name resolves to.
#[derive(Debug, Clone)]
enum Target {
    /// The whole device.
    Whole,
    /// One share (the best free replica).
    Share,
    /// Exactly this unit.
    Exact(Unit),
}

/// A [`Policy`] over a [`UnitModel`]: the built-in exclusive, shared and sliced policies.
pub(crate) struct UnitPolicy<M: UnitModel> {
    pool: String,
    devices: Vec<Device>,
    index: BTreeMap<String, usize>,
    names: BTreeMap<String, (usize, Target)>,
    model: M,
    /// What each claim holds here. A grant is rebuilt from its device, request and unit when
    /// needed ([`UnitPolicy::grant`] is a function of those), so the index does not keep a copy of
    /// the grant's names: with 10,000 claims that copy was a tenth of the daemon's memory.
    claims: BTreeMap<ClaimUid, Vec<Held>>,
}

/// One unit a claim holds in the pool.
#[derive(Debug, Clone)]
struct Held {
    dev: usize,
    request: Box<str>,
    unit: Unit,
}

impl<M: UnitModel> UnitPolicy<M> {
    /// A policy for `pool` over `devices` (sorted here by id).
    pub(crate) fn new(pool: &str, mut devices: Vec<Device>, model: M) -> Result<Self, PolicyError> {
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        let mut index = BTreeMap::new();
        let mut names = BTreeMap::new();
        let shared = model.kind() == FamilyKind::Shared;
        for (i, d) in devices.iter().enumerate() {
            if index.insert(d.id.clone(), i).is_some() {
                return Err(PolicyError::DuplicateDevice {
                    device: d.id.clone(),
                });
            }
            let whole = device_name(pool, &d.id);
            let target = if shared { Target::Share } else { Target::Whole };
            let mut all = vec![(whole, target)];
            all.extend(
                model
                    .slices(pool, d)
                    .into_iter()
                    .map(|(n, u)| (n, Target::Exact(u))),
            );
            for (name, target) in all {
                if names.insert(name.clone(), (i, target)).is_some() {
                    return Err(PolicyError::DuplicatePublished { name });
                }
            }
        }
        Ok(UnitPolicy {
            pool: pool.to_string(),
            devices,
            index,
            names,
            model,
            claims: BTreeMap::new(),
        })
    }

    fn grant(&self, dev: usize, request: &str, unit: Unit) -> Grant {
        let d = &self.devices[dev];
        Grant {
            request: request.to_string(),
            pool: self.pool.clone(),
            device: self.model.grant_name(&self.pool, d, &unit),
            device_id: d.id.clone(),
            unit,
        }
    }

    fn holder_of(&self, dev: usize) -> ClaimUid {
        self.model
            .held(dev)
            .into_iter()
            .map(|h| h.claim)
            .next()
            .unwrap_or_default()
    }

    fn record(&mut self, claim: &str, taken: &[(usize, Grant)]) {
        let held = self.claims.entry(claim.to_string()).or_default();
        held.extend(taken.iter().map(|(dev, g)| Held {
            dev: *dev,
            request: g.request.as_str().into(),
            unit: g.unit.clone(),
        }));
        // Kept for the claim's life; a first extend leaves room for four.
        held.shrink_to_fit();
    }

    /// The grant `h` stands for.
    fn grant_of(&self, h: &Held) -> Grant {
        self.grant(h.dev, &h.request, h.unit.clone())
    }

    fn allocate_named(
        &mut self,
        claim: &str,
        request: &str,
        name: &str,
    ) -> Result<Vec<Grant>, Refusal> {
        if let Some(held) = self.claims.get(claim)
            && let Some(g) = held
                .iter()
                .filter(|h| &*h.request == request)
                .map(|h| self.grant_of(h))
                .find(|g| g.device == name)
        {
            return Ok(vec![g]);
        }
        let Some((dev, target)) = self.names.get(name).cloned() else {
            return Err(Refusal::new(
                claim,
                Some(name),
                RefusalReason::UnknownDevice,
            ));
        };
        let id = self.devices[dev].id.clone();
        let unit = match target {
            Target::Share => match self.model.take(dev, &UnitAsk::Shares(1), claim) {
                Some(u) => u,
                None => {
                    return Err(Refusal::new(
                        claim,
                        Some(&id),
                        RefusalReason::HeldByOther {
                            holder: self.holder_of(dev),
                        },
                    ));
                }
            },
            Target::Whole | Target::Exact(_) => {
                let unit = match target {
                    Target::Exact(u) => u,
                    _ => Unit::Whole,
                };
                match self.model.place(dev, &unit, claim) {
                    Ok(()) => unit,
                    Err(PlaceError::Held(holder)) if holder == claim => {
                        return Err(Refusal::new(
                            claim,
                            Some(&id),
                            RefusalReason::InvalidRequest {
                                why: format!("its results overlap on device {id}"),
                            },
                        ));
                    }
                    Err(PlaceError::Held(holder)) => {
                        return Err(Refusal::new(
                            claim,
                            Some(&id),
                            RefusalReason::HeldByOther { holder },
                        ));
                    }
                    Err(PlaceError::Invalid(why)) => {
                        return Err(Refusal::new(
                            claim,
                            Some(&id),
                            RefusalReason::InvalidRequest { why },
                        ));
                    }
                }
            }
        };
        let g = self.grant(dev, request, unit);
        self.record(claim, &[(dev, g.clone())]);
        Ok(vec![g])
    }

    #[allow(clippy::too_many_arguments)]
    fn allocate_count(
        &mut self,
        claim: &str,
        request: &str,
        count: u32,
        selector: &DeviceSelector,
        profile: Option<&str>,
        shares: Option<u32>,
        near: &Near,
    ) -> Result<Vec<Grant>, Refusal> {
        if let Some(held) = self.claims.get(claim) {
            let mine: Vec<Grant> = held
                .iter()
                .filter(|h| &*h.request == request)
                .map(|h| self.grant_of(h))
                .collect();
            if !mine.is_empty() {
                return Ok(mine);
            }
        }
        let refuse = |reason| Refusal::new(claim, None, reason);
        if count == 0 {
            return Err(refuse(RefusalReason::InvalidRequest {
                why: format!("request {request} asks for 0 results"),
            }));
        }
        let ask = self
            .model
            .ask(&self.pool, profile, shares)
            .map_err(refuse)?;
        let per = self.model.units_of(&ask);
        let cands: Vec<usize> = (0..self.devices.len())
            .filter(|&i| selector.matches(&self.devices[i]))
            .collect();
        if cands.is_empty() {
            return Err(refuse(RefusalReason::NoMatchingPool {
                request: request.to_string(),
            }));
        }
        let most_dev = cands
            .iter()
            .map(|&i| self.model.total(i))
            .max()
            .unwrap_or(0);
        if per > most_dev {
            return Err(refuse(RefusalReason::TooManyUnits {
                pool: self.pool.clone(),
                asked: per,
                most: most_dev,
            }));
        }
        let most_results: u32 = cands
            .iter()
            .map(|&i| self.model.total(i) / per.max(1))
            .sum();
        if count > most_results {
            return Err(refuse(RefusalReason::TooManyUnits {
                pool: self.pool.clone(),
                asked: count.saturating_mul(per),
                most: most_results.saturating_mul(per),
            }));
        }
        let mut caps: Vec<u32> = cands
            .iter()
            .map(|&i| self.model.capacity(i, &ask))
            .collect();
        // The NUMA node to keep the claim on: the claim's own if it fits,
        // else the least used node that can take every result.
        let mut groups: BTreeMap<Option<u32>, (u32, u32)> = BTreeMap::new();
        for (j, &i) in cands.iter().enumerate() {
            let g = groups.entry(self.devices[i].numa_node).or_default();
            g.0 += caps[j];
            g.1 += self.model.used(i);
        }
        let target = match near.numa {
            Some(n) if groups.get(&Some(n)).is_some_and(|g| g.0 >= count) => Some(Some(n)),
            _ => groups
                .iter()
                .filter(|(_, g)| g.0 >= count)
                .min_by_key(|(numa, g)| (g.1, **numa))
                .map(|(numa, _)| *numa),
        };
        let mut anchor: Option<String> = near.pci_root.clone();
        let mut taken: Vec<(usize, Grant)> = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let best = cands
                .iter()
                .enumerate()
                .filter(|(j, _)| caps[*j] > 0)
                .min_by_key(|(_, i)| {
                    let d = &self.devices[**i];
                    (
                        u8::from(target.is_some_and(|t| t != d.numa_node)),
                        pci_distance(anchor.as_deref(), d.pci_address.as_deref()),
                        self.model.used(**i),
                        **i,
                    )
                })
                .map(|(j, i)| (j, *i));
            let unit = best.and_then(|(_, i)| self.model.take(i, &ask, claim));
            let (Some((j, i)), Some(unit)) = (best, unit) else {
                for (i, g) in &taken {
                    self.model.free(*i, &g.unit);
                }
                let reason = match (&ask, profile) {
                    (UnitAsk::Slice(_), Some(p))
                        if cands.iter().any(|&i| self.model.fragmented(i, &ask)) =>
                    {
                        RefusalReason::NoPlacement {
                            profile: p.to_string(),
                        }
                    }
                    _ => RefusalReason::NoCapacity {
                        request: request.to_string(),
                        context: None,
                    },
                };
                return Err(refuse(reason));
            };
            caps[j] = self.model.capacity(i, &ask);
            if anchor.is_none() {
                anchor = self.devices[i]
                    .pci_address
                    .as_deref()
                    .map(|a| pci_root(a).to_string());
            }
            let g = self.grant(i, request, unit);
            taken.push((i, g));
        }
        self.record(claim, &taken);
        Ok(taken.into_iter().map(|(_, g)| g).collect())
    }

    fn restore_one(&mut self, claim: &str, grant: &Grant) -> Result<(), PolicyError> {
        let err = |why: String| PolicyError::Restore {
            claim: claim.to_string(),
            device: grant.device_id.clone(),
            why,
        };
        if grant.pool != self.pool {
            return Err(err(format!(
                "the record names pool {} but the device is in pool {}",
                grant.pool, self.pool
            )));
        }
        let Some(&dev) = self.index.get(&grant.device_id) else {
            return Err(err(format!("the device is not in pool {}", self.pool)));
        };
        let expected = self
            .model
            .grant_name(&self.pool, &self.devices[dev], &grant.unit);
        if grant.device != expected {
            return Err(err(format!(
                "the record names published device {} but the unit is published as {expected}",
                grant.device
            )));
        }
        match self.model.place(dev, &grant.unit, claim) {
            Ok(()) => {}
            Err(PlaceError::Held(holder)) => {
                return Err(err(format!("the unit is also held by claim {holder}")));
            }
            Err(PlaceError::Invalid(why)) => return Err(err(why)),
        }
        self.claims
            .entry(claim.to_string())
            .or_default()
            .push(Held {
                dev,
                request: grant.request.as_str().into(),
                unit: grant.unit.clone(),
            });
        Ok(())
    }
}

impl<M: UnitModel> Policy for UnitPolicy<M> {
    fn family(&self) -> FamilyKind {
        self.model.kind()
    }

    fn devices(&self) -> &[Device] {
        &self.devices
    }

    fn restore(&mut self, grants: &[(ClaimUid, Grant)]) -> Result<(), PolicyError> {
        self.model.reset();
        self.claims.clear();
        for (claim, grant) in grants {
            if let Err(e) = self.restore_one(claim, grant) {
                self.model.reset();
                self.claims.clear();
                return Err(e);
            }
        }
        Ok(())
    }

    fn allocate(&mut self, claim: &str, request: &PoolRequest) -> Result<Vec<Grant>, Refusal> {
        match request {
            PoolRequest::Named { request, device } => self.allocate_named(claim, request, device),
            PoolRequest::Count {
                request,
                count,
                selector,
                profile,
                shares,
                near,
            } => self.allocate_count(
                claim,
                request,
                *count,
                selector,
                profile.as_deref(),
                *shares,
                near,
            ),
        }
    }

    fn release(&mut self, claim: &str) -> Vec<Grant> {
        let Some(held) = self.claims.remove(claim) else {
            return Vec::new();
        };
        for h in &held {
            self.model.free(h.dev, &h.unit);
        }
        held.iter().map(|h| self.grant_of(h)).collect()
    }

    fn place(
        &mut self,
        claim: &str,
        request: &str,
        device_id: &str,
        unit: &Unit,
    ) -> Result<Grant, Refusal> {
        let Some(&dev) = self.index.get(device_id) else {
            return Err(Refusal::new(
                claim,
                Some(device_id),
                RefusalReason::UnknownDevice,
            ));
        };
        if let Some(h) = self.claims.get(claim).and_then(|held| {
            held.iter()
                .find(|h| h.dev == dev && &*h.request == request && h.unit == *unit)
        }) {
            return Ok(self.grant_of(h));
        }
        let refuse = |reason| Err(Refusal::new(claim, Some(device_id), reason));
        match self.model.place(dev, unit, claim) {
            Ok(()) => {}
            Err(PlaceError::Held(holder)) if holder == claim => {
                return refuse(RefusalReason::InvalidRequest {
                    why: format!("its results overlap on device {device_id}"),
                });
            }
            Err(PlaceError::Held(holder)) => {
                return refuse(RefusalReason::HeldByOther { holder });
            }
            Err(PlaceError::Invalid(why)) => return refuse(RefusalReason::InvalidRequest { why }),
        }
        let g = self.grant(dev, request, unit.clone());
        self.record(claim, &[(dev, g.clone())]);
        Ok(g)
    }

    fn adopt(&mut self, claim: &str, device_id: &str) -> Result<Grant, Refusal> {
        let Some(&dev) = self.index.get(device_id) else {
            return Err(Refusal::new(
                claim,
                Some(device_id),
                RefusalReason::UnknownDevice,
            ));
        };
        if let Some(h) = self
            .claims
            .get(claim)
            .and_then(|held| held.iter().find(|h| h.dev == dev))
        {
            return Ok(self.grant_of(h));
        }
        let Some(unit) = self.model.adopt_unit(dev) else {
            return Err(Refusal::new(
                claim,
                Some(device_id),
                RefusalReason::HeldByOther {
                    holder: self.holder_of(dev),
                },
            ));
        };
        if self.model.place(dev, &unit, claim).is_err() {
            return Err(Refusal::new(
                claim,
                Some(device_id),
                RefusalReason::HeldByOther {
                    holder: self.holder_of(dev),
                },
            ));
        }
        let g = self.grant(dev, "adopted", unit);
        self.record(claim, &[(dev, g.clone())]);
        Ok(g)
    }

    fn edits(&self, grant: &Grant) -> ContainerEdits {
        let Some(&dev) = self.index.get(&grant.device_id) else {
            return ContainerEdits::default();
        };
        let d = &self.devices[dev];
        let mut device_nodes = d.nodes.clone();
        device_nodes.extend(d.control_nodes.iter().cloned());
        ContainerEdits {
            env: self.model.env(d, &grant.unit),
            device_nodes,
            mounts: self.model.mounts(d),
            hooks: Vec::new(),
        }
    }

    fn env(&self, grant: &Grant) -> Vec<(String, String)> {
        self.index
            .get(&grant.device_id)
            .map(|&dev| self.model.env(&self.devices[dev], &grant.unit))
            .unwrap_or_default()
    }

    fn holders(&self, device_id: &str) -> Vec<ClaimUid> {
        let Some(&dev) = self.index.get(device_id) else {
            return Vec::new();
        };
        let mut claims: Vec<ClaimUid> = self.model.held(dev).into_iter().map(|h| h.claim).collect();
        claims.sort();
        claims.dedup();
        claims
    }

    fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            name: self.pool.clone(),
            family: self.model.kind().name().to_string(),
            devices: (0..self.devices.len())
                .map(|i| DeviceSnapshot {
                    id: self.devices[i].id.clone(),
                    units_total: self.model.total(i),
                    units_used: self.model.used(i),
                    held: self.model.held(i),
                })
                .collect(),
        }
    }

    fn usage(&self) -> PoolUsage {
        let mut u = PoolUsage::default();
        for i in 0..self.devices.len() {
            u.add(self.model.total(i), self.model.used(i));
        }
        u
    }

    fn published(&self) -> Vec<PublishedDevice> {
        let shared = self.model.kind() == FamilyKind::Shared;
        self.names
            .iter()
            .map(|(name, (dev, target))| PublishedDevice {
                pool: self.pool.clone(),
                name: name.clone(),
                device_id: self.devices[*dev].id.clone(),
                kind: match target {
                    Target::Exact(_) => PublishedKind::Slice,
                    _ if shared => PublishedKind::Shareable,
                    _ => PublishedKind::Whole,
                },
                unit: match target {
                    Target::Exact(u) => Some(u.clone()),
                    _ => None,
                },
            })
            .collect()
    }
}

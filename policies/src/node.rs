//! The node: every pool's policy, the claim index, the vendor check, the
//! accelerator-local CPU accounting and the containers whose cpusets follow it.
//! The claim engine talks only to [`Node`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::naming::pci_root;

/// How many devices a refusal names with their holders.
const CONTEXT_DEVICES: usize = 8;
use crate::{
    Allocation, Ask, ClaimRequest, ClaimUid, ContainerEdits, ContainerUpdate, CountRequest, CpuSet,
    Device, FamilyKind, Grant, Inventory, NamedResult, Near, Outcome, Policy, PolicyError,
    PoolConfig, PoolFree, PoolRequest, PublishedDevice, Refusal, RefusalReason, Registry,
    UnitResult,
};

/// One pool: its config and its policy.
pub(crate) struct Pool {
    pub(crate) config: PoolConfig,
    pub(crate) policy: Box<dyn Policy>,
}

/// A container the node knows, with the claims it uses and the cpuset it was last given.
#[derive(Debug, Clone, Default)]
pub(crate) struct Container {
    pub(crate) claims: Vec<ClaimUid>,
    pub(crate) cpus: CpuSet,
    pub(crate) mems: CpuSet,
}

/// The node's accelerators under their pools' policies.
///
/// Pure and deterministic: the same inventory, pools, records and calls give
/// the same answers. Every refusal leaves the node unchanged.
pub struct Node {
    pub(crate) inventory: Inventory,
    pub(crate) pools: Vec<Pool>,
    pub(crate) pool_index: BTreeMap<String, usize>,
    pub(crate) device_pool: BTreeMap<String, usize>,
    pub(crate) device_index: BTreeMap<String, usize>,
    pub(crate) unpooled: Vec<String>,
    pub(crate) by_node: BTreeMap<(u32, u32), usize>,
    pub(crate) numa_cpus: BTreeMap<u32, CpuSet>,
    /// Each claim's allocation, shared (not copied) with whoever keeps the record of it.
    pub(crate) claims: BTreeMap<ClaimUid, Arc<Allocation>>,
    pub(crate) shared: CpuSet,
    pub(crate) containers: BTreeMap<String, Container>,
    /// Claim -> the containers using it, so a claim that moves no CPU only
    /// touches its own containers.
    pub(crate) users: BTreeMap<ClaimUid, BTreeSet<String>>,
}

impl Node {
    /// Builds the node: each device goes to the first pool whose selector
    /// matches it (VFIO devices only to passthrough pools, others never to them); devices matching no pool are never handed out (they are
    /// listed as unpooled in the snapshot).
    pub fn new(
        mut inventory: Inventory,
        pools: &[PoolConfig],
        registry: &Registry,
    ) -> Result<Node, PolicyError> {
        inventory.devices.sort_by(|a, b| a.id.cmp(&b.id));
        let mut device_index = BTreeMap::new();
        for (i, d) in inventory.devices.iter().enumerate() {
            if device_index.insert(d.id.clone(), i).is_some() {
                return Err(PolicyError::DuplicateDevice {
                    device: d.id.clone(),
                });
            }
        }
        let mut pool_index = BTreeMap::new();
        for (i, p) in pools.iter().enumerate() {
            if p.name.is_empty() {
                return Err(PolicyError::InvalidPool {
                    pool: p.name.clone(),
                    why: "a pool needs a name".to_string(),
                });
            }
            if p.passthrough && p.family != crate::FamilyConfig::Exclusive {
                return Err(PolicyError::InvalidPool {
                    pool: p.name.clone(),
                    why: format!(
                        "a passthrough pool hands out whole IOMMU groups, one holder each, so its family must be exclusive, not {}",
                        p.family.kind().name()
                    ),
                });
            }
            if pool_index.insert(p.name.clone(), i).is_some() {
                return Err(PolicyError::DuplicatePool {
                    pool: p.name.clone(),
                });
            }
        }
        let mut members: Vec<Vec<Device>> = vec![Vec::new(); pools.len()];
        let mut device_pool = BTreeMap::new();
        let mut unpooled = Vec::new();
        for d in &inventory.devices {
            match pools.iter().position(|p| p.takes(d)) {
                Some(p) => {
                    members[p].push(d.clone());
                    device_pool.insert(d.id.clone(), p);
                }
                None => unpooled.push(d.id.clone()),
            }
        }
        let mut built = Vec::with_capacity(pools.len());
        let mut names = BTreeSet::new();
        for (config, devices) in pools.iter().zip(members) {
            let policy = registry.build(config, devices)?;
            for p in policy.published() {
                if !names.insert(p.name.clone()) {
                    return Err(PolicyError::DuplicatePublished { name: p.name });
                }
            }
            built.push(Pool {
                config: config.clone(),
                policy,
            });
        }
        let mut by_node = BTreeMap::new();
        let mut numa_cpus: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for (i, d) in inventory.devices.iter().enumerate() {
            for n in &d.nodes {
                by_node.entry((n.major, n.minor)).or_insert(i);
            }
            if let Some(numa) = d.numa_node {
                let set = numa_cpus.entry(numa).or_default();
                *set = set.union(&d.local_cpus);
            }
        }
        Ok(Node {
            shared: inventory.cpus.clone(),
            inventory,
            pools: built,
            pool_index,
            device_pool,
            device_index,
            unpooled,
            by_node,
            numa_cpus,
            claims: BTreeMap::new(),
            containers: BTreeMap::new(),
            users: BTreeMap::new(),
        })
    }

    pub(crate) fn device(&self, id: &str) -> Option<&Device> {
        self.device_index
            .get(id)
            .map(|&i| &self.inventory.devices[i])
    }

    /// Allocates a claim. Idempotent per UID: the same UID again returns the
    /// same allocation with `already` set. A refusal changes nothing.
    pub fn allocate(&mut self, req: &ClaimRequest) -> Result<Outcome, Refusal> {
        if let Some(a) = self.claims.get(&req.uid) {
            return Ok(Outcome {
                allocation: a.clone(),
                updates: Vec::new(),
                already: true,
            });
        }
        let mut grants = Vec::new();
        let result = self
            .take_grants(req, &mut grants)
            .and_then(|()| self.check_vendors(&req.uid, &grants))
            .and_then(|()| self.pick_cpus(&req.uid, &grants));
        let cpus = match result {
            Ok(cpus) => cpus,
            Err(refusal) => {
                let pools: BTreeSet<usize> = grants
                    .iter()
                    .filter_map(|g| self.pool_index.get(&g.pool).copied())
                    .collect();
                for p in pools {
                    self.pools[p].policy.release(&req.uid);
                }
                return Err(self.name_what_is_free(refusal));
            }
        };
        self.shared = self.shared.difference(&cpus);
        // Kept for the claim's life: most claims hold one grant, and a vector grown by pushes
        // has room for four (512 bytes a claim).
        grants.shrink_to_fit();
        let allocation = Arc::new(Allocation {
            claim_uid: req.uid.clone(),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            results: grants,
            cpus,
        });
        self.claims.insert(req.uid.clone(), allocation.clone());
        let updates = if allocation.cpus.is_empty() {
            self.refresh_users_of(&req.uid)
        } else {
            self.refresh_containers()
        };
        Ok(Outcome {
            allocation,
            updates,
            already: false,
        })
    }

    fn take_grants(&mut self, req: &ClaimRequest, grants: &mut Vec<Grant>) -> Result<(), Refusal> {
        let invalid = |why: String| {
            Err(Refusal::new(
                &req.uid,
                None,
                RefusalReason::InvalidRequest { why },
            ))
        };
        if req.uid.is_empty() {
            return invalid("the claim UID is empty".to_string());
        }
        match &req.ask {
            Ask::Named(results) => {
                if results.is_empty() {
                    return invalid("it names no device".to_string());
                }
                let mut seen = BTreeSet::new();
                for r in results {
                    if !seen.insert((&r.pool, &r.device)) {
                        return invalid(format!("device {} is named twice", r.device));
                    }
                }
                for r in results {
                    self.take_named(&req.uid, r, grants)?;
                }
            }
            Ask::Count(requests) => {
                if requests.is_empty() {
                    return invalid("it asks for nothing".to_string());
                }
                let mut seen = BTreeSet::new();
                for r in requests {
                    if !seen.insert(&r.request) {
                        return invalid(format!("request {} appears twice", r.request));
                    }
                }
                for r in requests {
                    self.take_count(&req.uid, r, grants)?;
                }
            }
            Ask::Units(units) => {
                if units.is_empty() {
                    return invalid("it names no device".to_string());
                }
                let mut seen = BTreeSet::new();
                for u in units {
                    if !seen.insert((&u.device_id, &u.unit)) {
                        return invalid(format!(
                            "{} of device {} is named twice",
                            u.unit, u.device_id
                        ));
                    }
                }
                for u in units {
                    self.take_unit(&req.uid, u, grants)?;
                }
            }
        }
        Ok(())
    }

    fn take_unit(
        &mut self,
        uid: &str,
        u: &UnitResult,
        grants: &mut Vec<Grant>,
    ) -> Result<(), Refusal> {
        let Some(&p) = self.pool_index.get(&u.pool) else {
            return Err(Refusal::new(
                uid,
                Some(&u.device_id),
                RefusalReason::NoPool {
                    pool: u.pool.clone(),
                },
            ));
        };
        if self.device_pool.get(&u.device_id) != Some(&p) {
            return Err(Refusal::new(
                uid,
                Some(&u.device_id),
                RefusalReason::UnknownDevice,
            ));
        }
        grants.push(
            self.pools[p]
                .policy
                .place(uid, &u.request, &u.device_id, &u.unit)?,
        );
        Ok(())
    }

    fn take_named(
        &mut self,
        uid: &str,
        r: &NamedResult,
        grants: &mut Vec<Grant>,
    ) -> Result<(), Refusal> {
        let Some(&p) = self.pool_index.get(&r.pool) else {
            return Err(Refusal::new(
                uid,
                Some(&r.device),
                RefusalReason::NoPool {
                    pool: r.pool.clone(),
                },
            ));
        };
        let request = PoolRequest::Named {
            request: r.request.clone(),
            device: r.device.clone(),
        };
        grants.extend(self.pools[p].policy.allocate(uid, &request)?);
        Ok(())
    }

    /// `refusal` with what the device's pool has free now when it is about a held device (after
    /// the claim's own partial grants were given back): the caller learns where to go instead of
    /// only who is in the way.
    fn name_what_is_free(&self, refusal: Refusal) -> Refusal {
        if !matches!(refusal.reason, RefusalReason::HeldByOther { .. }) {
            return refusal;
        }
        let Some(&p) = refusal
            .device
            .as_deref()
            .and_then(|d| self.device_pool.get(d))
        else {
            return refusal;
        };
        let snapshot = self.pools[p].policy.snapshot();
        let with_room: Vec<_> = snapshot
            .devices
            .iter()
            .filter(|d| d.units_used < d.units_total)
            .collect();
        let mut free: Vec<String> = with_room
            .iter()
            .take(CONTEXT_DEVICES)
            .map(|d| {
                if d.units_total > 1 {
                    let left = d.units_total - d.units_used;
                    format!("{} ({left} of {} units)", d.id, d.units_total)
                } else {
                    d.id.clone()
                }
            })
            .collect();
        if with_room.len() > CONTEXT_DEVICES {
            free.push(format!("{} more", with_room.len() - CONTEXT_DEVICES));
        }
        refusal.with_pool_free(PoolFree {
            pool: snapshot.name,
            free,
        })
    }

    fn take_count(
        &mut self,
        uid: &str,
        r: &CountRequest,
        grants: &mut Vec<Grant>,
    ) -> Result<(), Refusal> {
        let first = grants.first().and_then(|g| self.device(&g.device_id));
        let near = Near {
            numa: first.and_then(|d| d.numa_node),
            pci_root: first
                .and_then(|d| d.pci_address.as_deref())
                .map(|a| pci_root(a).to_string()),
        };
        let mut selector = r.selector.clone();
        if selector.vendor.is_none() {
            selector.vendor = first.map(|d| d.vendor.clone());
        }
        let mut matching: Vec<usize> = (0..self.pools.len())
            .filter(|&p| {
                self.pools[p]
                    .policy
                    .devices()
                    .iter()
                    .any(|d| selector.matches(d))
            })
            .collect();
        // A VFIO group is for a VM: a count ask takes one only when no pool of host devices
        // matches it (the asker selected groups, or the node has nothing else).
        if matching.iter().any(|&p| !self.pools[p].config.passthrough) {
            matching.retain(|&p| !self.pools[p].config.passthrough);
        }
        let fitting: Vec<usize> = matching
            .iter()
            .copied()
            .filter(|&p| {
                r.family
                    .as_ref()
                    .is_none_or(|f| *f == self.pools[p].policy.family())
            })
            .collect();
        if fitting.is_empty() {
            // Name the one pool that matched when there is one; with several, any one of them
            // would be arbitrary (and misleading), so the refusal names the family instead.
            let reason = match (&r.family, matching.as_slice()) {
                (Some(asked), &[p]) => RefusalReason::WrongFamily {
                    pool: self.pools[p].config.name.clone(),
                    family: self.pools[p].policy.family().name().to_string(),
                    asked: asked.name().to_string(),
                },
                (Some(asked), &[_, _, ..]) => RefusalReason::NoPoolOfFamily {
                    request: r.request.clone(),
                    family: asked.name().to_string(),
                },
                _ => RefusalReason::NoMatchingPool {
                    request: r.request.clone(),
                },
            };
            return Err(Refusal::new(uid, None, reason));
        }
        let request = PoolRequest::Count {
            request: r.request.clone(),
            count: r.count,
            selector,
            profile: r.profile.clone(),
            shares: r.shares,
            near,
        };
        let mut refusals = Vec::new();
        for &p in &fitting {
            match self.pools[p].policy.allocate(uid, &request) {
                Ok(g) => {
                    grants.extend(g);
                    return Ok(());
                }
                Err(refusal) => refusals.push(refusal),
            }
        }
        // The most telling refusal: one that is not about the family.
        let pick = refusals
            .iter()
            .position(|f| !matches!(f.reason, RefusalReason::WrongFamily { .. }))
            .unwrap_or(0);
        let refusal = refusals.swap_remove(pick);
        if matches!(refusal.reason, RefusalReason::NoCapacity { .. }) {
            let PoolRequest::Count { selector, .. } = &request else {
                return Err(refusal);
            };
            let devices: Vec<&Device> = fitting
                .iter()
                .flat_map(|&p| self.pools[p].policy.devices())
                .filter(|d| selector.matches(d))
                .collect();
            let context = self.capacity_context(&devices);
            return Err(refusal.with_context(context));
        }
        Err(refusal)
    }

    /// Who holds each of `devices` and which are free, for a refusal: at most
    /// [`CONTEXT_DEVICES`] devices are named.
    fn capacity_context(&self, devices: &[&Device]) -> Vec<String> {
        let mut held = Vec::new();
        let mut free = Vec::new();
        for d in devices.iter().take(CONTEXT_DEVICES) {
            let holders = self.holder_of(&d.id);
            if holders.is_empty() {
                free.push(d.id.clone());
                continue;
            }
            let named: Vec<String> = holders
                .iter()
                .take(3)
                .map(|h| match self.claims.get(h) {
                    Some(a) if !a.name.is_empty() => {
                        format!("claim {h} ({}/{})", a.namespace, a.name)
                    }
                    _ => format!("claim {h}"),
                })
                .collect();
            let more = holders.len().saturating_sub(3);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            held.push(format!("{} is held by {}{more}", d.id, named.join(", ")));
        }
        if devices.len() > CONTEXT_DEVICES {
            held.push(format!(
                "{} more matching devices not listed",
                devices.len() - CONTEXT_DEVICES
            ));
        }
        let free = if free.is_empty() {
            "no matching device is free".to_string()
        } else {
            format!("free: {} (not enough for the request)", free.join(", "))
        };
        held.push(free);
        held
    }

    fn check_vendors(&self, uid: &str, grants: &[Grant]) -> Result<(), Refusal> {
        let mut vendors: Vec<String> = Vec::new();
        let mut odd = None;
        for g in grants {
            if let Some(d) = self.device(&g.device_id) {
                let v = d.vendor.to_ascii_lowercase();
                if !vendors.contains(&v) {
                    if !vendors.is_empty() && odd.is_none() {
                        odd = Some(d.id.clone());
                    }
                    vendors.push(v);
                }
            }
        }
        match odd {
            None => Ok(()),
            Some(device) => {
                vendors.sort();
                Err(Refusal::new(
                    uid,
                    Some(&device),
                    RefusalReason::MixedVendors { vendors },
                ))
            }
        }
    }

    /// Exclusive accelerator-local CPUs for the grants: `cpus_per_device` per
    /// result from the device's local CPUs still in the shared pool (any shared
    /// CPU when the device reports none); one CPU always stays shared.
    fn pick_cpus(&self, uid: &str, grants: &[Grant]) -> Result<CpuSet, Refusal> {
        let mut free = self.shared.clone();
        let mut taken = CpuSet::new();
        for g in grants {
            let Some(&p) = self.pool_index.get(&g.pool) else {
                continue;
            };
            let k = self.pools[p].config.cpus_per_device;
            if k == 0 {
                continue;
            }
            let local = match self.device(&g.device_id) {
                Some(d) if !d.local_cpus.is_empty() => d.local_cpus.intersection(&free),
                _ => free.clone(),
            };
            let usable = local.len().min(free.len().saturating_sub(1));
            if usable < k as usize {
                return Err(Refusal::new(
                    uid,
                    Some(&g.device_id),
                    RefusalReason::NotEnoughCpus {
                        asked: k,
                        free: usable as u32,
                    },
                ));
            }
            for cpu in local.iter().take(k as usize) {
                free.remove(cpu);
                taken.insert(cpu);
            }
        }
        Ok(taken)
    }

    /// Releases the whole claim; an unknown UID is fine (nothing to do). Its
    /// CPUs go back to the shared pool; the answer holds the cpuset updates of
    /// the containers that grow back.
    pub fn release(&mut self, uid: &str) -> Vec<ContainerUpdate> {
        let Some(a) = self.claims.remove(uid) else {
            return Vec::new();
        };
        let pools: BTreeSet<usize> = a
            .results
            .iter()
            .filter_map(|g| self.pool_index.get(&g.pool).copied())
            .collect();
        for p in pools {
            self.pools[p].policy.release(uid);
        }
        if a.cpus.is_empty() {
            return self.refresh_users_of(uid);
        }
        self.shared = self.shared.union(&a.cpus);
        self.refresh_containers()
    }

    /// The allocation of a claim.
    pub fn allocation(&self, uid: &str) -> Option<&Allocation> {
        self.claims.get(uid).map(|a| &**a)
    }

    /// Every allocation, by claim UID (the records to checkpoint).
    pub fn allocations(&self) -> impl Iterator<Item = &Allocation> {
        self.claims.values().map(|a| &**a)
    }

    /// The container edits of each result of a claim, in result order (one CDI device each).
    pub fn edits(&self, uid: &str) -> Option<Vec<ContainerEdits>> {
        let a = self.claims.get(uid)?;
        Some(
            a.results
                .iter()
                .map(|g| match self.pool_index.get(&g.pool) {
                    Some(&p) => self.pools[p].policy.edits(g),
                    None => ContainerEdits::default(),
                })
                .collect(),
        )
    }

    /// Claims holding units of a device, sorted.
    pub fn holder_of(&self, device_id: &str) -> Vec<ClaimUid> {
        self.device_pool
            .get(device_id)
            .map(|&p| self.pools[p].policy.holders(device_id))
            .unwrap_or_default()
    }

    /// Marks a device found in use by a running container without a record as
    /// held by claim `uid`: the whole device (exclusive, sliced) or one share
    /// (shared). Repeating it for the same device is a no-op (`already`); a
    /// second device is added to the same claim. Adopted claims get no
    /// exclusive CPUs and are not checked for mixed vendors: they record what
    /// is running.
    pub fn adopt(&mut self, uid: &str, device_id: &str) -> Result<Outcome, Refusal> {
        if uid.is_empty() {
            return Err(Refusal::new(
                uid,
                Some(device_id),
                RefusalReason::InvalidRequest {
                    why: "the claim UID is empty".to_string(),
                },
            ));
        }
        if let Some(a) = self.claims.get(uid)
            && a.results.iter().any(|g| g.device_id == device_id)
        {
            return Ok(Outcome {
                allocation: a.clone(),
                updates: Vec::new(),
                already: true,
            });
        }
        let Some(&p) = self.device_pool.get(device_id) else {
            return Err(Refusal::new(
                uid,
                Some(device_id),
                RefusalReason::UnknownDevice,
            ));
        };
        let grant = self.pools[p].policy.adopt(uid, device_id)?;
        let a = self.claims.entry(uid.to_string()).or_insert_with(|| {
            Arc::new(Allocation {
                claim_uid: uid.to_string(),
                namespace: String::new(),
                name: "adopted".to_string(),
                results: Vec::new(),
                cpus: CpuSet::new(),
            })
        });
        // Copied on write if a record still shares the allocation as it was.
        Arc::make_mut(a).results.push(grant);
        let allocation = a.clone();
        Ok(Outcome {
            allocation,
            updates: self.refresh_users_of(uid),
            already: false,
        })
    }

    /// The CPUs not given exclusively to any claim.
    pub fn shared_cpus(&self) -> CpuSet {
        self.shared.clone()
    }

    /// The names a DRA driver would publish, sorted by pool then name.
    pub fn published(&self) -> Vec<PublishedDevice> {
        let mut all: Vec<PublishedDevice> = self
            .pools
            .iter()
            .flat_map(|p| p.policy.published())
            .collect();
        all.sort();
        all
    }

    /// The device owning the device node `major:minor` (its own nodes, not control nodes).
    pub fn device_by_node(&self, major: u32, minor: u32) -> Option<&Device> {
        self.by_node
            .get(&(major, minor))
            .map(|&i| &self.inventory.devices[i])
    }

    /// The inventory the node was built from (devices sorted by id).
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The family of the pool `device_id` belongs to; `None` for a device in no pool.
    pub fn device_family(&self, device_id: &str) -> Option<FamilyKind> {
        self.device_pool
            .get(device_id)
            .map(|&p| self.pools[p].policy.family())
    }

    /// The family of the pool named `pool`.
    pub fn pool_family(&self, pool: &str) -> Option<FamilyKind> {
        self.pool_index
            .get(pool)
            .map(|&p| self.pools[p].policy.family())
    }

    /// The devices of the pool named `pool`, sorted by id.
    pub fn pool_devices(&self, pool: &str) -> Option<&[Device]> {
        self.pool_index
            .get(pool)
            .map(|&p| self.pools[p].policy.devices())
    }

    /// The containers known to use claim `uid` (started and not removed), sorted.
    pub fn users_of(&self, uid: &str) -> impl Iterator<Item = &str> {
        self.users
            .get(uid)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// The claims container `container_id` was started with, if the node knows it.
    pub fn claims_of(&self, container_id: &str) -> Option<&[ClaimUid]> {
        self.containers
            .get(container_id)
            .map(|c| c.claims.as_slice())
    }
}

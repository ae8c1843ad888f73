//! The sliced family: a device is cut into non-overlapping slices by profile
//! (MIG-like); each profile has a size in slots and allowed start slots.
//! Placement is best fit: the allowed start that leaves the longest free run.

use std::collections::BTreeSet;

use crate::naming::{device_name, slice_name};
use crate::units::{PlaceError, UnitAsk, UnitModel, UnitPolicy};
use crate::{
    ClaimUid, Device, FamilyConfig, FamilyKind, HeldUnit, Policy, PolicyError, PoolConfig,
    ProfileConfig, RefusalReason, Unit,
};

/// Most slots a sliced device may be divided into.
pub const MAX_SLOTS: u32 = 64;

/// Builds the sliced policy for a pool (registered as `sliced`).
pub fn sliced(pool: &PoolConfig, devices: Vec<Device>) -> Result<Box<dyn Policy>, PolicyError> {
    let FamilyConfig::Sliced { slots, profiles } = &pool.family else {
        return Err(PolicyError::InvalidPool {
            pool: pool.name.clone(),
            why: "the sliced policy needs a family of kind sliced".to_string(),
        });
    };
    let bad = |why: String| PolicyError::InvalidPool {
        pool: pool.name.clone(),
        why,
    };
    if *slots == 0 || *slots > MAX_SLOTS {
        return Err(bad(format!(
            "slots must be between 1 and {MAX_SLOTS}, not {slots}"
        )));
    }
    let mut names = BTreeSet::new();
    for p in profiles {
        if p.name.is_empty() || !names.insert(p.name.as_str()) {
            return Err(bad(format!(
                "profile name {:?} is empty or defined twice",
                p.name
            )));
        }
        if p.size == 0 || p.size > *slots {
            return Err(bad(format!(
                "profile {} has size {} but a device has {slots} slots",
                p.name, p.size
            )));
        }
        if p.starts.is_empty() {
            return Err(bad(format!("profile {} has no allowed start", p.name)));
        }
        if let Some(s) = p.starts.iter().find(|s| s.saturating_add(p.size) > *slots) {
            return Err(bad(format!(
                "profile {} may start at slot {s} but would then end past slot {slots}",
                p.name
            )));
        }
    }
    let mut profiles = profiles.clone();
    for p in &mut profiles {
        p.starts.sort_unstable();
        p.starts.dedup();
    }
    let model = Sliced {
        slots: *slots,
        profiles,
        held: vec![Vec::new(); devices.len()],
        masks: vec![0; devices.len()],
    };
    Ok(Box::new(UnitPolicy::new(&pool.name, devices, model)?))
}

struct Sliced {
    slots: u32,
    profiles: Vec<ProfileConfig>,
    /// Per device: (mask of the unit, unit, claim), sorted by unit.
    held: Vec<Vec<(u64, Unit, ClaimUid)>>,
    masks: Vec<u64>,
}

fn span(start: u32, size: u32) -> u64 {
    let ones = if size >= 64 {
        u64::MAX
    } else {
        (1u64 << size) - 1
    };
    ones << start
}

impl Sliced {
    fn all(&self) -> u64 {
        span(0, self.slots)
    }

    /// Longest run of free slots in `mask`.
    fn longest_free(&self, mask: u64) -> u32 {
        let mut best = 0;
        let mut run = 0;
        for s in 0..self.slots {
            if mask & (1 << s) == 0 {
                run += 1;
                best = best.max(run);
            } else {
                run = 0;
            }
        }
        best
    }

    fn unit_mask(&self, unit: &Unit) -> Result<u64, PlaceError> {
        match unit {
            Unit::Whole => Ok(self.all()),
            Unit::Slice {
                profile,
                start,
                size,
            } => {
                let p = self
                    .profiles
                    .iter()
                    .find(|p| p.name == *profile)
                    .ok_or_else(|| PlaceError::Invalid(format!("profile {profile} is unknown")))?;
                if p.size != *size || !p.starts.contains(start) {
                    return Err(PlaceError::Invalid(format!(
                        "profile {profile} has no slice of size {size} at slot {start}"
                    )));
                }
                Ok(span(*start, *size))
            }
            Unit::Share { .. } => Err(PlaceError::Invalid(
                "a sliced device has no shares".to_string(),
            )),
        }
    }

    fn hold(&mut self, dev: usize, mask: u64, unit: Unit, claim: &str) {
        self.masks[dev] |= mask;
        let list = &mut self.held[dev];
        let at = list.partition_point(|(_, u, _)| *u < unit);
        list.insert(at, (mask, unit, claim.to_string()));
    }
}

impl UnitModel for Sliced {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Sliced
    }

    fn ask(
        &self,
        pool: &str,
        profile: Option<&str>,
        shares: Option<u32>,
    ) -> Result<UnitAsk, RefusalReason> {
        if shares.is_some() {
            return Err(RefusalReason::WrongFamily {
                pool: pool.to_string(),
                family: "sliced".to_string(),
                asked: "shared".to_string(),
            });
        }
        let Some(profile) = profile else {
            return Ok(UnitAsk::Whole);
        };
        self.profiles
            .iter()
            .position(|p| p.name == profile)
            .map(UnitAsk::Slice)
            .ok_or_else(|| RefusalReason::UnknownProfile {
                profile: profile.to_string(),
                pool: pool.to_string(),
            })
    }

    fn units_of(&self, ask: &UnitAsk) -> u32 {
        match ask {
            UnitAsk::Slice(p) => self.profiles[*p].size,
            _ => self.slots,
        }
    }

    fn total(&self, _dev: usize) -> u32 {
        self.slots
    }

    fn used(&self, dev: usize) -> u32 {
        self.masks[dev].count_ones()
    }

    fn capacity(&self, dev: usize, ask: &UnitAsk) -> u32 {
        match ask {
            UnitAsk::Slice(p) => {
                let p = &self.profiles[*p];
                let mut mask = self.masks[dev];
                let mut n = 0;
                for &s in &p.starts {
                    let m = span(s, p.size);
                    if mask & m == 0 {
                        mask |= m;
                        n += 1;
                    }
                }
                n
            }
            _ => u32::from(self.masks[dev] == 0),
        }
    }

    fn fragmented(&self, dev: usize, ask: &UnitAsk) -> bool {
        self.slots - self.used(dev) >= self.units_of(ask) && self.capacity(dev, ask) == 0
    }

    fn take(&mut self, dev: usize, ask: &UnitAsk, claim: &str) -> Option<Unit> {
        let mask = self.masks[dev];
        let (m, unit) = match ask {
            UnitAsk::Slice(p) => {
                let p = &self.profiles[*p];
                let start = p
                    .starts
                    .iter()
                    .copied()
                    .filter(|&s| mask & span(s, p.size) == 0)
                    .max_by_key(|&s| (self.longest_free(mask | span(s, p.size)), u32::MAX - s))?;
                (
                    span(start, p.size),
                    Unit::Slice {
                        profile: p.name.clone(),
                        start,
                        size: p.size,
                    },
                )
            }
            _ if mask == 0 => (self.all(), Unit::Whole),
            _ => return None,
        };
        self.hold(dev, m, unit.clone(), claim);
        Some(unit)
    }

    fn place(&mut self, dev: usize, unit: &Unit, claim: &str) -> Result<(), PlaceError> {
        let m = self.unit_mask(unit)?;
        if self.masks[dev] & m != 0 {
            let holder = self.held[dev]
                .iter()
                .find(|(hm, _, _)| hm & m != 0)
                .map(|(_, _, c)| c.clone())
                .unwrap_or_default();
            return Err(PlaceError::Held(holder));
        }
        self.hold(dev, m, unit.clone(), claim);
        Ok(())
    }

    fn free(&mut self, dev: usize, unit: &Unit) {
        if let Some(at) = self.held[dev].iter().position(|(_, u, _)| u == unit) {
            let (m, _, _) = self.held[dev].remove(at);
            self.masks[dev] &= !m;
        }
    }

    fn held(&self, dev: usize) -> Vec<HeldUnit> {
        self.held[dev]
            .iter()
            .map(|(_, unit, claim)| HeldUnit {
                unit: unit.clone(),
                claim: claim.clone(),
            })
            .collect()
    }

    fn reset(&mut self) {
        self.held.iter_mut().for_each(Vec::clear);
        self.masks.iter_mut().for_each(|m| *m = 0);
    }

    fn adopt_unit(&self, dev: usize) -> Option<Unit> {
        (self.masks[dev] == 0).then_some(Unit::Whole)
    }

    fn slices(&self, pool: &str, device: &Device) -> Vec<(String, Unit)> {
        let mut out = Vec::new();
        for p in &self.profiles {
            for &start in &p.starts {
                out.push((
                    slice_name(pool, &device.id, &p.name, start),
                    Unit::Slice {
                        profile: p.name.clone(),
                        start,
                        size: p.size,
                    },
                ));
            }
        }
        out
    }

    fn grant_name(&self, pool: &str, device: &Device, unit: &Unit) -> String {
        match unit {
            Unit::Slice { profile, start, .. } => slice_name(pool, &device.id, profile, *start),
            _ => device_name(pool, &device.id),
        }
    }

    fn env(&self, _device: &Device, unit: &Unit) -> Vec<(String, String)> {
        let Unit::Slice {
            profile,
            start,
            size,
        } = unit
        else {
            return Vec::new();
        };
        let mut env = vec![
            ("ACCEL_SLICE_PROFILE".to_string(), profile.clone()),
            ("ACCEL_SLICE_START".to_string(), start.to_string()),
            ("ACCEL_SLICE_SIZE".to_string(), size.to_string()),
        ];
        if let Some(p) = self.profiles.iter().find(|p| p.name == *profile) {
            if p.memory_mib > 0 {
                env.push((
                    "ACCEL_SLICE_MEMORY_MIB".to_string(),
                    p.memory_mib.to_string(),
                ));
            }
            if p.compute_units > 0 {
                env.push((
                    "ACCEL_SLICE_COMPUTE_UNITS".to_string(),
                    p.compute_units.to_string(),
                ));
            }
        }
        env
    }
}

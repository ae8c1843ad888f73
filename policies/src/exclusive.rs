//! The exclusive family: a whole device per result.

use crate::units::{PlaceError, UnitAsk, UnitModel, UnitPolicy};
use crate::{
    ClaimUid, Device, FamilyKind, HeldUnit, Policy, PolicyError, PoolConfig, RefusalReason, Unit,
};

/// Builds the exclusive policy for a pool (registered as `exclusive`).
pub fn exclusive(pool: &PoolConfig, devices: Vec<Device>) -> Result<Box<dyn Policy>, PolicyError> {
    let model = Exclusive {
        holders: vec![None; devices.len()],
    };
    Ok(Box::new(UnitPolicy::new(&pool.name, devices, model)?))
}

struct Exclusive {
    holders: Vec<Option<ClaimUid>>,
}

impl UnitModel for Exclusive {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Exclusive
    }

    fn ask(
        &self,
        pool: &str,
        profile: Option<&str>,
        shares: Option<u32>,
    ) -> Result<UnitAsk, RefusalReason> {
        let asked = if profile.is_some() {
            "sliced"
        } else if shares.is_some() {
            "shared"
        } else {
            return Ok(UnitAsk::Whole);
        };
        Err(RefusalReason::WrongFamily {
            pool: pool.to_string(),
            family: "exclusive".to_string(),
            asked: asked.to_string(),
        })
    }

    fn units_of(&self, _ask: &UnitAsk) -> u32 {
        1
    }

    fn total(&self, _dev: usize) -> u32 {
        1
    }

    fn used(&self, dev: usize) -> u32 {
        u32::from(self.holders[dev].is_some())
    }

    fn capacity(&self, dev: usize, _ask: &UnitAsk) -> u32 {
        u32::from(self.holders[dev].is_none())
    }

    fn take(&mut self, dev: usize, _ask: &UnitAsk, claim: &str) -> Option<Unit> {
        if self.holders[dev].is_some() {
            return None;
        }
        self.holders[dev] = Some(claim.to_string());
        Some(Unit::Whole)
    }

    fn place(&mut self, dev: usize, unit: &Unit, claim: &str) -> Result<(), PlaceError> {
        if *unit != Unit::Whole {
            return Err(PlaceError::Invalid(format!(
                "an exclusive device is only handed out whole, not as {unit}"
            )));
        }
        if let Some(holder) = &self.holders[dev] {
            return Err(PlaceError::Held(holder.clone()));
        }
        self.holders[dev] = Some(claim.to_string());
        Ok(())
    }

    fn free(&mut self, dev: usize, _unit: &Unit) {
        self.holders[dev] = None;
    }

    fn held(&self, dev: usize) -> Vec<HeldUnit> {
        self.holders[dev]
            .iter()
            .map(|c| HeldUnit {
                unit: Unit::Whole,
                claim: c.clone(),
            })
            .collect()
    }

    fn reset(&mut self) {
        self.holders.iter_mut().for_each(|h| *h = None);
    }

    fn adopt_unit(&self, dev: usize) -> Option<Unit> {
        self.holders[dev].is_none().then_some(Unit::Whole)
    }

    fn env(&self, device: &Device, _unit: &Unit) -> Vec<(String, String)> {
        match &device.vfio {
            Some(g) => vec![(g.env_name(), g.functions.join(","))],
            None => Vec::new(),
        }
    }
}

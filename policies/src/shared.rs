//! The shared family: each device offers N time-sliced replicas; a result
//! takes one (or `shares`) contiguous replicas, with optional limits as env.

use crate::units::{PlaceError, UnitAsk, UnitModel, UnitPolicy};
use crate::{
    ClaimUid, Device, FamilyConfig, FamilyKind, HeldUnit, Mount, MpsConfig, Policy, PolicyError,
    PoolConfig, RefusalReason, Unit,
};

/// The variable naming an MPS pool's pipe directory (where CUDA clients find the daemon).
pub const MPS_PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The variable naming an MPS pool's log directory.
pub const MPS_LOG_ENV: &str = "CUDA_MPS_LOG_DIRECTORY";

/// Upper bound on replicas per device, so a config typo cannot allocate without bound.
pub const MAX_REPLICAS: u32 = 1024;

/// Builds the shared policy for a pool (registered as `shared`).
pub fn shared(pool: &PoolConfig, devices: Vec<Device>) -> Result<Box<dyn Policy>, PolicyError> {
    let FamilyConfig::Shared {
        replicas,
        memory_mib_per_share,
        compute_percent_per_share,
        ref mps,
    } = pool.family
    else {
        return Err(PolicyError::InvalidPool {
            pool: pool.name.clone(),
            why: "the shared policy needs a family of kind shared".to_string(),
        });
    };
    if replicas == 0 || replicas > MAX_REPLICAS {
        return Err(PolicyError::InvalidPool {
            pool: pool.name.clone(),
            why: format!("replicas must be between 1 and {MAX_REPLICAS}, not {replicas}"),
        });
    }
    if compute_percent_per_share > 100 {
        return Err(PolicyError::InvalidPool {
            pool: pool.name.clone(),
            why: format!(
                "compute_percent_per_share must be at most 100, not {compute_percent_per_share}"
            ),
        });
    }
    if let Some(m) = mps {
        for (field, dir) in [
            ("mps.pipe_directory", &m.pipe_directory),
            ("mps.log_directory", &m.log_directory),
        ] {
            if !dir.starts_with('/') || dir.contains(['\0', ',']) {
                return Err(PolicyError::InvalidPool {
                    pool: pool.name.clone(),
                    why: format!("{field} must be an absolute path without commas, not {dir:?}"),
                });
            }
        }
    }
    let model = Shared {
        replicas,
        mps: mps.clone(),
        memory_mib: memory_mib_per_share,
        percent: compute_percent_per_share,
        slots: vec![vec![None; replicas as usize]; devices.len()],
    };
    Ok(Box::new(UnitPolicy::new(&pool.name, devices, model)?))
}

struct Shared {
    replicas: u32,
    mps: Option<MpsConfig>,
    memory_mib: u64,
    percent: u32,
    slots: Vec<Vec<Option<ClaimUid>>>,
}

impl Shared {
    /// Free runs of device `dev` as (start, length).
    fn runs(&self, dev: usize) -> Vec<(u32, u32)> {
        let mut runs = Vec::new();
        let mut start = None;
        for (i, s) in self.slots[dev].iter().enumerate() {
            match (s.is_none(), start) {
                (true, None) => start = Some(i as u32),
                (false, Some(b)) => {
                    runs.push((b, i as u32 - b));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(b) = start {
            runs.push((b, self.replicas - b));
        }
        runs
    }
}

impl UnitModel for Shared {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Shared
    }

    fn ask(
        &self,
        pool: &str,
        profile: Option<&str>,
        shares: Option<u32>,
    ) -> Result<UnitAsk, RefusalReason> {
        if profile.is_some() {
            return Err(RefusalReason::WrongFamily {
                pool: pool.to_string(),
                family: "shared".to_string(),
                asked: "sliced".to_string(),
            });
        }
        match shares.unwrap_or(1) {
            0 => Err(RefusalReason::InvalidRequest {
                why: "a result cannot take 0 shares".to_string(),
            }),
            n => Ok(UnitAsk::Shares(n)),
        }
    }

    fn units_of(&self, ask: &UnitAsk) -> u32 {
        match ask {
            UnitAsk::Shares(n) => *n,
            _ => self.replicas,
        }
    }

    fn total(&self, _dev: usize) -> u32 {
        self.replicas
    }

    fn used(&self, dev: usize) -> u32 {
        self.slots[dev].iter().filter(|s| s.is_some()).count() as u32
    }

    fn capacity(&self, dev: usize, ask: &UnitAsk) -> u32 {
        let n = self.units_of(ask).max(1);
        self.runs(dev).iter().map(|(_, len)| len / n).sum()
    }

    fn take(&mut self, dev: usize, ask: &UnitAsk, claim: &str) -> Option<Unit> {
        let n = self.units_of(ask);
        // Best fit: the shortest free run that holds the shares, lowest index on ties.
        let (start, _) = self
            .runs(dev)
            .into_iter()
            .filter(|(_, len)| *len >= n)
            .min_by_key(|(start, len)| (*len, *start))?;
        for s in &mut self.slots[dev][start as usize..(start + n) as usize] {
            *s = Some(claim.to_string());
        }
        Some(Unit::Share {
            index: start,
            count: n,
        })
    }

    fn place(&mut self, dev: usize, unit: &Unit, claim: &str) -> Result<(), PlaceError> {
        let (index, count) = match unit {
            Unit::Share { index, count } => (*index, *count),
            Unit::Whole => (0, self.replicas),
            Unit::Slice { .. } => {
                return Err(PlaceError::Invalid(
                    "a shared device has no slices".to_string(),
                ));
            }
        };
        if count == 0
            || index
                .checked_add(count)
                .is_none_or(|end| end > self.replicas)
        {
            return Err(PlaceError::Invalid(format!(
                "shares {index}..{} do not exist on a device of {} replicas",
                index.saturating_add(count),
                self.replicas
            )));
        }
        let range = index as usize..(index + count) as usize;
        if let Some(holder) = self.slots[dev][range.clone()].iter().flatten().next() {
            return Err(PlaceError::Held(holder.clone()));
        }
        for s in &mut self.slots[dev][range] {
            *s = Some(claim.to_string());
        }
        Ok(())
    }

    fn free(&mut self, dev: usize, unit: &Unit) {
        let (index, count) = match unit {
            Unit::Share { index, count } => (*index, *count),
            _ => (0, self.replicas),
        };
        let end = index.saturating_add(count).min(self.replicas);
        for s in &mut self.slots[dev][index.min(end) as usize..end as usize] {
            *s = None;
        }
    }

    fn held(&self, dev: usize) -> Vec<HeldUnit> {
        let mut out: Vec<HeldUnit> = Vec::new();
        let slots = &self.slots[dev];
        let mut i = 0;
        while i < slots.len() {
            let Some(claim) = &slots[i] else {
                i += 1;
                continue;
            };
            let mut j = i + 1;
            while j < slots.len() && slots[j].as_ref() == Some(claim) {
                j += 1;
            }
            out.push(HeldUnit {
                unit: Unit::Share {
                    index: i as u32,
                    count: (j - i) as u32,
                },
                claim: claim.clone(),
            });
            i = j;
        }
        out
    }

    fn reset(&mut self) {
        for d in &mut self.slots {
            d.iter_mut().for_each(|s| *s = None);
        }
    }

    fn adopt_unit(&self, dev: usize) -> Option<Unit> {
        let index = self.slots[dev].iter().position(|s| s.is_none())?;
        Some(Unit::Share {
            index: index as u32,
            count: 1,
        })
    }

    fn env(&self, device: &Device, unit: &Unit) -> Vec<(String, String)> {
        let count = match unit {
            Unit::Share { count, .. } => *count,
            _ => self.replicas,
        };
        let mut env = Vec::new();
        let nvidia = device.vendor.eq_ignore_ascii_case("nvidia");
        if self.percent > 0 {
            let pct = self.percent.saturating_mul(count).min(100).to_string();
            let key = if nvidia {
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
            } else {
                "ACCEL_SHARE_COMPUTE_PERCENT"
            };
            env.push((key.to_string(), pct));
        }
        if self.memory_mib > 0 {
            let mib = self.memory_mib.saturating_mul(u64::from(count));
            if nvidia {
                env.push((
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                    format!("0={mib}M"),
                ));
            } else {
                env.push(("ACCEL_SHARE_MEMORY_LIMIT_MIB".to_string(), mib.to_string()));
            }
        }
        if let Some(m) = &self.mps {
            env.push((MPS_PIPE_ENV.to_string(), m.pipe_directory.clone()));
            env.push((MPS_LOG_ENV.to_string(), m.log_directory.clone()));
        }
        env
    }

    fn mounts(&self, _device: &Device) -> Vec<Mount> {
        let Some(m) = &self.mps else {
            return Vec::new();
        };
        [&m.pipe_directory, &m.log_directory]
            .into_iter()
            .map(|dir| Mount {
                host_path: dir.clone(),
                container_path: dir.clone(),
                options: ["rw", "nosuid", "nodev", "bind"]
                    .map(str::to_string)
                    .to_vec(),
            })
            .collect()
    }
}

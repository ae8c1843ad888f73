//! Vendor CDI composition (docs/gpus.md): a grant of a pool with `vendor_cdi` on carries the
//! vendor's own CDI device for the granted device (the NVIDIA Container Toolkit's
//! `nvidia.com/gpu=GPU-...`) and so the vendor's user space: driver libraries, binaries, hooks.
//!
//! The vendor specs are read from `cdi.vendor_spec_dirs` (never nri-accel's own kind) and read
//! again whenever a file there changed (name, size, modification time or inode), so a spec a
//! driver upgrade rewrote is used from the next grant on without a restart. A claim already
//! granted keeps the vendor devices it was answered with: they are written into its own CDI
//! spec (the [`VENDOR_ENV`] variable of each of its devices) and read back on a repeated
//! prepare. The engine stays ignorant of vendors: it asks a [`Composer`].

mod catalog;
mod load;
mod merge;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use policies::{Allocation, Device, Inventory, PoolConfig, VendorCdi};

pub use catalog::{Catalog, LoadedSpec, Matched};
pub use load::{Signature, load_dirs, signature};
pub use merge::{VendorGrant, merge_for_container};

/// The variable of nri-accel's own per-claim spec that records the vendor CDI devices the
/// claim was answered with: their qualified names in result order, comma-separated, empty where
/// a result has none. The container sees it too.
pub const VENDOR_ENV: &str = "NRI_ACCEL_VENDOR_CDI_DEVICES";

/// The vendor devices a `VENDOR_ENV` value names, one slot per result.
pub fn names_from_env(value: &str, results: usize) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = value
        .split(',')
        .map(|s| (!s.is_empty()).then(|| s.to_string()))
        .collect();
    out.resize(results, None);
    out
}

/// The `VENDOR_ENV` value for `names`, `None` when no result has a vendor device.
pub fn env_value(names: &[Option<String>]) -> Option<String> {
    names.iter().any(Option::is_some).then(|| {
        names
            .iter()
            .map(|n| n.as_deref().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Decides the vendor CDI devices a new grant carries: what the engine asks (it stays ignorant
/// of vendors and only records the answer in the claim's spec).
pub trait Composer: Send + Sync {
    /// The vendor device of each result of `allocation` (`None` where there is none), or one
    /// sentence refusing the grant.
    fn compose(&self, allocation: &Allocation) -> Result<Vec<Option<String>>, String>;
}

/// The live vendor specs of the configured directories, read again when they change.
pub struct VendorSpecs {
    dirs: Vec<PathBuf>,
    own_kind: String,
    own_prefix: String,
    cached: Mutex<Option<(Signature, Read)>>,
    /// Whether each read is logged (the daemon's; the one-shot commands print warnings instead).
    logged: bool,
}

/// What a read of the spec dirs gave: the catalog, or the sentence naming the unusable file.
type Read = Result<Arc<Catalog>, String>;

impl VendorSpecs {
    /// Reads `dirs` on demand; files named `<own_prefix>*` and specs of kind `own_kind` are
    /// nri-accel's own and skipped.
    pub fn new(dirs: Vec<PathBuf>, own_kind: String, own_prefix: String) -> VendorSpecs {
        VendorSpecs {
            dirs,
            own_kind,
            own_prefix,
            cached: Mutex::new(None),
            logged: true,
        }
    }

    /// The same without a log line per read: for commands that print what they found.
    pub fn quiet(mut self) -> VendorSpecs {
        self.logged = false;
        self
    }

    /// The directories read.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The catalog as the files are now (read again only when a file changed), or the one
    /// sentence naming the file that cannot be used.
    pub fn current(&self) -> Read {
        let sig = signature(&self.dirs, &self.own_prefix);
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, c)) = cached.as_ref()
            && *s == sig
        {
            return c.clone();
        }
        let loaded = load_dirs(&self.dirs, &self.own_kind, &self.own_prefix)
            .map(Arc::new)
            .map_err(|e| e.to_string());
        match &loaded {
            _ if !self.logged => {}
            Ok(c) => {
                tracing::info!(dirs = %c.dirs_text(), specs = c.specs.len(), mig_entries = c.mig_entries(), "read the vendor CDI specs")
            }
            Err(e) => tracing::warn!(error = %e, "a vendor CDI spec cannot be used"),
        }
        *cached = Some((sig, loaded.clone()));
        loaded
    }
}

/// Decides the vendor devices of grants: the engine's [`Composer`].
pub struct VendorComposer {
    specs: Arc<VendorSpecs>,
    devices: BTreeMap<String, Device>,
    modes: BTreeMap<String, VendorCdi>,
}

impl VendorComposer {
    /// A composer for `inventory` under `pools`; `None` when no pool has `vendor_cdi` on.
    pub fn new(
        specs: Arc<VendorSpecs>,
        inventory: &Inventory,
        pools: &[PoolConfig],
    ) -> Option<VendorComposer> {
        let modes: BTreeMap<String, VendorCdi> = pools
            .iter()
            .filter(|p| !p.vendor_cdi.is_off())
            .map(|p| (p.name.clone(), p.vendor_cdi))
            .collect();
        (!modes.is_empty()).then(|| VendorComposer {
            specs,
            devices: inventory
                .devices
                .iter()
                .map(|d| (d.id.clone(), d.clone()))
                .collect(),
            modes,
        })
    }

    /// The live specs.
    pub fn specs(&self) -> &Arc<VendorSpecs> {
        &self.specs
    }

    /// The vendor device of `device_id` in pool `pool` as the specs are now: `Ok(None)` when the
    /// pool composes nothing or (`auto`) no spec describes it; `Err` with one sentence when a
    /// spec cannot be used, two disagree, or a `required` pool's device is described by none.
    pub fn device(&self, pool: &str, device_id: &str) -> Result<Option<Matched>, String> {
        let Some(mode) = self.modes.get(pool).copied() else {
            return Ok(None);
        };
        let Some(dev) = self.devices.get(device_id) else {
            return Ok(None);
        };
        let catalog = self.specs.current()?;
        match catalog.find(dev)? {
            Some(m) => Ok(Some(m)),
            None if mode == VendorCdi::Required => Err(format!(
                "device {device_id} of pool {pool} is described by no vendor CDI spec in {} (the pool has vendor_cdi: required): install the vendor's CDI spec (for NVIDIA: nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml)",
                catalog.dirs_text()
            )),
            None => Ok(None),
        }
    }

    /// For status: each device of a composing pool, with its vendor device or why it has none.
    pub fn describe(
        &self,
        pools_of: &BTreeMap<String, String>,
    ) -> Vec<(String, String, Result<Option<String>, String>)> {
        let mut out = Vec::new();
        for (id, pool) in pools_of {
            if !self.modes.contains_key(pool) {
                continue;
            }
            let r = self.device(pool, id).map(|m| m.map(|m| m.name));
            out.push((id.clone(), pool.clone(), r));
        }
        out
    }

    /// The pools that compose, with their mode.
    pub fn modes(&self) -> &BTreeMap<String, VendorCdi> {
        &self.modes
    }
}

/// The `vendor_cdi` member of the status document: the spec dirs read, the specs found (or the
/// sentence naming the file that cannot be used), and each composing pool's devices with their
/// vendor device or why they have none.
pub fn status(composer: &VendorComposer, pools_of: &BTreeMap<String, String>) -> serde_json::Value {
    let dirs: Vec<String> = composer
        .specs
        .dirs()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let catalog = composer.specs.current();
    let (specs, error, mig) = match &catalog {
        Ok(c) => (
            c.specs
                .iter()
                .map(|s| serde_json::json!({"file": s.file.display().to_string(), "kind": s.spec.kind, "devices": s.spec.devices.len()}))
                .collect::<Vec<_>>(),
            None,
            c.mig_entries(),
        ),
        Err(e) => (Vec::new(), Some(e.clone()), 0),
    };
    let devices: Vec<serde_json::Value> = composer
        .describe(pools_of)
        .into_iter()
        .map(|(id, pool, r)| {
            let uuid = composer.devices.get(&id).and_then(|d| d.uuid.clone());
            match r {
                Ok(Some(name)) => serde_json::json!({"device": id, "pool": pool, "uuid": uuid, "vendor_device": name}),
                Ok(None) => serde_json::json!({"device": id, "pool": pool, "uuid": uuid, "vendor_device": null, "why": format!("no vendor CDI spec in {} describes it; it is granted without the vendor's user space", dirs.join(", "))}),
                Err(why) => serde_json::json!({"device": id, "pool": pool, "uuid": uuid, "vendor_device": null, "why": why}),
            }
        })
        .collect();
    serde_json::json!({
        "spec_dirs": dirs,
        "specs": specs,
        "error": error,
        "mig_entries_skipped": mig,
        "pools": composer.modes.iter().map(|(p, m)| (p.clone(), m.as_str())).collect::<BTreeMap<_, _>>(),
        "devices": devices,
    })
}

impl Composer for VendorComposer {
    fn compose(&self, allocation: &Allocation) -> Result<Vec<Option<String>>, String> {
        allocation
            .results
            .iter()
            .map(|g| Ok(self.device(&g.pool, &g.device_id)?.map(|m| m.name)))
            .collect()
    }
}

#[cfg(test)]
mod tests;

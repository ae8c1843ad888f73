//! The checks `nri-accel run` makes before it serves anything, shared with `check-config` and
//! `discover`: discovery, the node built from the inventory and the pools under the build's
//! policy registry, and the warnings about a config that would serve nothing.
//!
//! One function ([`check`]) does it for all three commands, so a config `check-config` accepts is
//! one `run` starts with (short of connecting to the runtime), and the warnings the daemon logs at
//! start are the ones `check-config` prints.

use std::fmt;
use std::path::PathBuf;

use policies::{Device, DeviceSelector, Inventory, Node, Registry};

use crate::config::Config;
use crate::discovery::{Discovery, DiscoveryError, DiscoveryWarning};

/// What the checks found: the node `run` would serve, and what an operator should look at.
pub struct Checked {
    /// The node: every pool's policy built over its devices.
    pub node: Node,
    /// Everything worth a warning, in the order found.
    pub warnings: Vec<Warning>,
}

/// A config that is valid but serves less than it seems to. `check-config --strict` fails on any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Discovery skipped a device or a file.
    Discovery(DiscoveryWarning),
    /// Discovery found no device at all, and the config lists none.
    EmptyInventory {
        /// Whether sysfs was scanned.
        sysfs: bool,
        /// The root sysfs was read under.
        root: PathBuf,
    },
    /// An earlier pool's selector takes every device this pool's selector could match, whatever
    /// the inventory: the pool can never get a device.
    PoolNeverReached {
        /// The pool that gets nothing.
        pool: String,
        /// The earlier pool that takes its devices.
        by: String,
    },
    /// The pool's selector matches devices of this node, but earlier pools take all of them.
    PoolShadowed {
        /// The pool that gets nothing.
        pool: String,
        /// The earlier pools that take them, in config order.
        by: Vec<String>,
        /// The devices its selector matches.
        devices: Vec<String>,
    },
    /// The pool's selector matches no device of this node.
    PoolSelectsNothing {
        /// The pool.
        pool: String,
        /// How many devices the node has.
        devices: usize,
    },
    /// `nri.cdi_injection: cdi` is set: the annotation path injects device nodes whatever it
    /// says.
    CdiInjectionIgnored,
    /// A device of a pool with `vendor_cdi` on cannot be composed with a vendor CDI spec now:
    /// none describes it (`required`), a spec cannot be used, or two disagree (docs/gpus.md).
    VendorCdi {
        /// The pool.
        pool: String,
        /// The sentence naming the device, the spec file(s) or the spec dirs read.
        reason: String,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::Discovery(w) => write!(f, "discovery skipped something: {w}"),
            Warning::EmptyInventory { sysfs: true, root } => write!(
                f,
                "no accelerator was found under {} and discovery.static_devices lists none: \
                 nothing can be handed out; check that the devices' drivers are loaded (lspci -k \
                 names each device's driver) and that discovery.root is the host's root, or list \
                 the devices in discovery.static_devices",
                root.display()
            ),
            Warning::EmptyInventory { sysfs: false, .. } => f.write_str(
                "discovery.sysfs is off and discovery.static_devices lists no device: nothing \
                 can be handed out; turn discovery.sysfs on or list the devices",
            ),
            Warning::PoolNeverReached { pool, by } => write!(
                f,
                "pool {pool} can never get a device: the earlier pool {by} selects every device \
                 {pool} could (a device goes to the first pool that selects it); move {pool} \
                 before {by} or narrow the select of {by}"
            ),
            Warning::PoolShadowed { pool, by, devices } => write!(
                f,
                "pool {pool} gets no device: the devices it selects ({}) go to the earlier \
                 pool{} {} first; move {pool} up or narrow the earlier select",
                devices.join(", "),
                if by.len() == 1 { "" } else { "s" },
                by.join(", ")
            ),
            Warning::PoolSelectsNothing { pool, devices } => write!(
                f,
                "pool {pool} selects none of this node's {devices} device(s): claims for it will \
                 be refused; compare its select with nri-accel discover"
            ),
            Warning::CdiInjectionIgnored => f.write_str(
                "nri.cdi_injection: cdi is no longer honoured: the annotation path injects device \
                 nodes, cgroup rules, env and mounts, because its CDI spec is written inside \
                 CreateContainer and a runtime's CDI cache may not have seen it yet (containerd \
                 failed 2-5 % of such grants); remove the setting (docs/configuration.md)",
            ),
            Warning::VendorCdi { pool, reason } => write!(
                f,
                "pool {pool} composes grants with vendor CDI specs, and for now: {reason} \
                 (docs/gpus.md)"
            ),
        }
    }
}

/// Why the config cannot be served on this node.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Discovery could not read its root.
    #[error("{0}")]
    Discovery(#[from] DiscoveryError),
    /// The pools cannot be built over the inventory (an unregistered policy, bad parameters).
    #[error("{0}; fix the pools in the config")]
    Policy(#[from] policies::PolicyError),
}

/// Runs discovery as `config` says and builds the node under `registry`.
pub fn check(config: &Config, registry: &Registry) -> Result<Checked, CheckError> {
    let found = crate::discovery::discover_root(&config.discovery)?;
    check_inventory(config, registry, found)
}

/// [`check`] on an inventory already discovered.
pub fn check_inventory(
    config: &Config,
    registry: &Registry,
    found: Discovery,
) -> Result<Checked, CheckError> {
    let mut warnings: Vec<Warning> = found
        .warnings
        .iter()
        .cloned()
        .map(Warning::Discovery)
        .collect();
    warnings.extend(pool_warnings(config, &found.inventory));
    let node = Node::new(found.inventory, &config.pools, registry)?;
    warnings.extend(vendor_warnings(config, &node));
    Ok(Checked { node, warnings })
}

/// What the vendor CDI specs say now of the devices of pools with `vendor_cdi` on: one warning
/// per distinct sentence (a spec that cannot be used is named once, not once per device).
fn vendor_warnings(config: &Config, node: &Node) -> Vec<Warning> {
    let specs = std::sync::Arc::new(
        crate::vendor::VendorSpecs::new(
            config.cdi.vendor_spec_dirs.clone(),
            format!("{}/{}", config.cdi.vendor, config.cdi.class),
            format!("{}-{}_", config.cdi.vendor, config.cdi.class),
        )
        .quiet(),
    );
    let Some(composer) = crate::vendor::VendorComposer::new(specs, node.inventory(), &config.pools)
    else {
        return Vec::new();
    };
    let mut out: Vec<Warning> = Vec::new();
    for pool in config.pools.iter().filter(|p| !p.vendor_cdi.is_off()) {
        for d in node.pool_devices(&pool.name).unwrap_or_default() {
            if let Err(reason) = composer.device(&pool.name, &d.id)
                && !out
                    .iter()
                    .any(|w| matches!(w, Warning::VendorCdi { reason: r, .. } if *r == reason))
            {
                out.push(Warning::VendorCdi {
                    pool: pool.name.clone(),
                    reason,
                });
            }
        }
    }
    out
}

/// The warnings about the pools and the inventory, without building any policy.
pub fn pool_warnings(config: &Config, inventory: &Inventory) -> Vec<Warning> {
    let pools = &config.pools;
    let mut out = Vec::new();
    if config.nri.cdi_injection == crate::config::CdiInjection::Cdi {
        out.push(Warning::CdiInjectionIgnored);
    }
    if inventory.devices.is_empty() {
        out.push(Warning::EmptyInventory {
            sysfs: config.discovery.sysfs,
            root: config.discovery.root.clone(),
        });
    }
    let owner = |d: &Device| pools.iter().position(|p| p.select.matches(d));
    for (i, pool) in pools.iter().enumerate() {
        if let Some(by) = pools[..i].iter().find(|e| covers(&e.select, &pool.select)) {
            out.push(Warning::PoolNeverReached {
                pool: pool.name.clone(),
                by: by.name.clone(),
            });
            continue;
        }
        if inventory.devices.is_empty() {
            continue;
        }
        let selected: Vec<&Device> = inventory
            .devices
            .iter()
            .filter(|d| pool.select.matches(d))
            .collect();
        if selected.is_empty() {
            out.push(Warning::PoolSelectsNothing {
                pool: pool.name.clone(),
                devices: inventory.devices.len(),
            });
            continue;
        }
        if selected.iter().any(|d| owner(d) == Some(i)) {
            continue;
        }
        let mut by: Vec<usize> = selected.iter().filter_map(|d| owner(d)).collect();
        by.sort_unstable();
        by.dedup();
        out.push(Warning::PoolShadowed {
            pool: pool.name.clone(),
            by: by.into_iter().map(|p| pools[p].name.clone()).collect(),
            devices: selected.iter().map(|d| d.id.clone()).collect(),
        });
    }
    out
}

/// Whether every device `later` can match is matched by `earlier` too, on any inventory: each
/// field `earlier` sets is set the same way in `later`.
fn covers(earlier: &DeviceSelector, later: &DeviceSelector) -> bool {
    let same = |a: &Option<String>, b: &Option<String>, fold: bool| match (a, b) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => {
            if fold {
                a.eq_ignore_ascii_case(b)
            } else {
                a == b
            }
        }
    };
    same(&earlier.vendor, &later.vendor, true)
        && same(&earlier.model, &later.model, false)
        && same(&earlier.pci_id, &later.pci_id, true)
        && (earlier.ids.is_empty()
            || (!later.ids.is_empty() && later.ids.iter().all(|id| earlier.ids.contains(id))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(vendor: Option<&str>, model: Option<&str>, ids: &[&str]) -> DeviceSelector {
        DeviceSelector {
            vendor: vendor.map(str::to_string),
            model: model.map(str::to_string),
            pci_id: None,
            ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn an_empty_selector_covers_every_selector() {
        let all = DeviceSelector::default();
        assert!(covers(&all, &all));
        assert!(covers(&all, &sel(Some("nvidia"), None, &["g0"])));
    }

    #[test]
    fn a_narrower_earlier_selector_covers_nothing_wider() {
        let nvidia = sel(Some("nvidia"), None, &[]);
        let h100 = sel(Some("NVIDIA"), Some("H100"), &[]);
        assert!(covers(&nvidia, &h100));
        assert!(!covers(&h100, &nvidia));
        assert!(!covers(&nvidia, &sel(Some("amd"), None, &[])));
        assert!(!covers(&nvidia, &DeviceSelector::default()));
        let two = sel(None, None, &["g0", "g1"]);
        assert!(covers(&two, &sel(None, None, &["g1"])));
        assert!(!covers(&two, &sel(None, None, &["g1", "g2"])));
        assert!(!covers(&two, &DeviceSelector::default()));
    }
}

//! Pools: how the config maps devices to a policy family and its parameters.

use serde::{Deserialize, Serialize};

use crate::Device;

/// One pool of the config: the devices it matches and how they are handed out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Pool name; appears in DRA results, status and refusals.
    pub name: String,
    /// Which devices belong to the pool. A device belongs to the first pool that matches it.
    #[serde(default)]
    pub select: DeviceSelector,
    /// The family (policy) and its parameters.
    #[serde(deserialize_with = "family_from_mapping")]
    pub family: FamilyConfig,
    /// Exclusive CPUs from the device's NUMA node given with each granted device (0 = none).
    #[serde(default)]
    pub cpus_per_device: u32,
    /// What the DRA driver publishes of an unhealthy device of this pool (docs/dra.md, "Device
    /// health"): withdrawn (the default) or tainted. Policies ignore it.
    #[serde(default, skip_serializing_if = "UnhealthyDevices::is_withdraw")]
    pub unhealthy: UnhealthyDevices,
    /// Whether grants of this pool carry the device vendor's own CDI device and common edits
    /// (its user space: driver libraries, binaries, hooks), read from the vendor's CDI spec
    /// (docs/gpus.md). Policies ignore it.
    #[serde(default, skip_serializing_if = "VendorCdi::is_off")]
    pub vendor_cdi: VendorCdi,
}

/// Whether a pool's grants are composed with the vendor's CDI spec (docs/gpus.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VendorCdi {
    /// Grants carry nri-accel's own edits only.
    #[default]
    Off,
    /// A device a vendor spec describes is granted with that vendor device; others plainly.
    Auto,
    /// Only devices a vendor spec describes are offered; each grant carries its vendor device.
    Required,
}

impl VendorCdi {
    /// Whether this is the default, [`VendorCdi::Off`].
    pub fn is_off(&self) -> bool {
        *self == VendorCdi::Off
    }

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VendorCdi::Off => "off",
            VendorCdi::Auto => "auto",
            VendorCdi::Required => "required",
        }
    }
}

/// How the DRA driver publishes a pool's unhealthy devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnhealthyDevices {
    /// Left out of the ResourceSlices until healthy again: no claim can be allocated them, on
    /// any cluster.
    #[default]
    Withdraw,
    /// Published with a `NoSchedule` taint: the scheduler keeps new claims off it; claims
    /// already allocated keep it. Needs the API server's `DRADeviceTaints` (withdrawn without).
    TaintNoSchedule,
    /// Published with a `NoExecute` taint: as `NoSchedule`, and Kubernetes' device taint
    /// eviction controller evicts the pods whose claims use it.
    TaintNoExecute,
}

impl UnhealthyDevices {
    /// Whether this is the default, [`UnhealthyDevices::Withdraw`].
    pub fn is_withdraw(&self) -> bool {
        *self == UnhealthyDevices::Withdraw
    }

    /// The taint effect, for the taint modes.
    pub fn taint_effect(self) -> Option<&'static str> {
        match self {
            UnhealthyDevices::Withdraw => None,
            UnhealthyDevices::TaintNoSchedule => Some("NoSchedule"),
            UnhealthyDevices::TaintNoExecute => Some("NoExecute"),
        }
    }
}

impl PoolConfig {
    /// A pool of exactly the devices `ids` (every device when empty) handed out by `family`,
    /// without accelerator-local CPUs: the pool fixtures, tests and benches build.
    pub fn of_ids(name: &str, ids: &[&str], family: FamilyConfig) -> PoolConfig {
        PoolConfig {
            name: name.to_string(),
            select: DeviceSelector {
                ids: ids.iter().map(|s| s.to_string()).collect(),
                ..DeviceSelector::default()
            },
            family,
            cpus_per_device: 0,
            unhealthy: UnhealthyDevices::Withdraw,
            vendor_cdi: VendorCdi::Off,
        }
    }
}

/// Matches devices by vendor, model, PCI id or id; every field given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSelector {
    /// Vendor name, e.g. `nvidia`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Model name, matched exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// PCI id `vvvv:dddd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
    /// Device ids; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
}

impl DeviceSelector {
    /// Whether `device` satisfies every field given.
    pub fn matches(&self, device: &Device) -> bool {
        self.vendor
            .as_ref()
            .is_none_or(|v| v.eq_ignore_ascii_case(&device.vendor))
            && self.model.as_ref().is_none_or(|m| *m == device.model)
            && self.pci_id.as_ref().is_none_or(|p| {
                device
                    .pci_id
                    .as_ref()
                    .is_some_and(|d| p.eq_ignore_ascii_case(d))
            })
            && (self.ids.is_empty() || self.ids.contains(&device.id))
    }
}

/// Reads a family only from a mapping (`{kind: exclusive}`): serde's internally tagged enums
/// also take a sequence whose first item is the kind, so `family: [exclusive]` was accepted
/// silently. Anything else is refused as a value of the wrong type, in the words a string gets.
fn family_from_mapping<'de, D: serde::Deserializer<'de>>(d: D) -> Result<FamilyConfig, D::Error> {
    struct Mapping;
    impl<'de> serde::de::Visitor<'de> for Mapping {
        type Value = FamilyConfig;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            // The words serde uses for the enum itself, so one message path covers every form.
            f.write_str("internally tagged enum FamilyConfig")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<FamilyConfig, A::Error> {
            FamilyConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(Mapping)
}

/// The family of a pool and its parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum FamilyConfig {
    /// A whole device per result.
    Exclusive,
    /// Each device offers `replicas` time-sliced shares.
    Shared {
        /// Shares per device.
        replicas: u32,
        /// Memory limit per share in MiB, exported as env (0 = none).
        #[serde(default)]
        memory_mib_per_share: u64,
        /// Compute limit per share in percent, exported as env (0 = none).
        #[serde(default)]
        compute_percent_per_share: u32,
    },
    /// Each device is cut into non-overlapping slices by profile (MIG-like).
    Sliced {
        /// Slots a device is divided into (e.g. 8 for a MIG-capable GPU's 7 + 1 layout).
        slots: u32,
        /// The profiles slices may be cut by.
        profiles: Vec<ProfileConfig>,
    },
    /// A family registered by a policy author; `params` is handed to its factory.
    Custom {
        /// Registered policy name.
        policy: String,
        /// Parameters for the policy, as free-form YAML/JSON.
        #[serde(default)]
        params: std::collections::BTreeMap<String, String>,
    },
}

/// One slice profile: its size and where a slice of it may start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    /// Profile name, e.g. `1g.10gb`.
    pub name: String,
    /// Slots a slice of this profile covers.
    pub size: u32,
    /// Memory of one slice in MiB.
    #[serde(default)]
    pub memory_mib: u64,
    /// Compute units of one slice.
    #[serde(default)]
    pub compute_units: u32,
    /// Allowed start slots; a slice covers `start .. start + size`.
    pub starts: Vec<u32>,
}

/// The family a request asks for, or a pool is of: the three built-ins or a
/// policy registered by an author under its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FamilyKind {
    /// A whole device per result.
    Exclusive,
    /// Time-sliced replicas of a device.
    Shared,
    /// Non-overlapping slices cut by profile.
    Sliced,
    /// A registered author policy, by name.
    Custom(String),
}

impl FamilyKind {
    /// The name the family is registered under in the [`crate::Registry`].
    pub fn name(&self) -> &str {
        match self {
            FamilyKind::Exclusive => "exclusive",
            FamilyKind::Shared => "shared",
            FamilyKind::Sliced => "sliced",
            FamilyKind::Custom(name) => name,
        }
    }
}

impl std::fmt::Display for FamilyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FamilyConfig {
    /// The family this config selects.
    pub fn kind(&self) -> FamilyKind {
        match self {
            FamilyConfig::Exclusive => FamilyKind::Exclusive,
            FamilyConfig::Shared { .. } => FamilyKind::Shared,
            FamilyConfig::Sliced { .. } => FamilyKind::Sliced,
            FamilyConfig::Custom { policy, .. } => FamilyKind::Custom(policy.clone()),
        }
    }
}

//! The `Policy` trait: the door through which built-in and author policies
//! manage the units of one pool's devices.

use serde::{Deserialize, Serialize};

use crate::{
    ClaimUid, ContainerEdits, Device, DeviceSelector, FamilyKind, Grant, PolicyError, Refusal, Unit,
};

/// What the node asks one pool for, on behalf of one request of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolRequest {
    /// Take exactly this published device (a DRA result) or refuse.
    Named {
        /// The request name inside the claim.
        request: String,
        /// The published device name.
        device: String,
    },
    /// Choose `count` results among the devices matching `selector`.
    Count {
        /// The request name inside the claim.
        request: String,
        /// Number of results.
        count: u32,
        /// Which devices qualify.
        selector: DeviceSelector,
        /// Slice profile, for sliced pools.
        profile: Option<String>,
        /// Replicas per result, for shared pools.
        shares: Option<u32>,
        /// Where the claim's other results already are, to stay close to them.
        near: Near,
    },
}

impl PoolRequest {
    /// The request name.
    pub fn request(&self) -> &str {
        match self {
            PoolRequest::Named { request, .. } | PoolRequest::Count { request, .. } => request,
        }
    }
}

/// Where a claim's earlier results landed: the policy prefers the same NUMA
/// node, then the same PCIe root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Near {
    /// NUMA node of the claim's earlier results.
    pub numa: Option<u32>,
    /// PCI root (`domain:bus`) of the claim's earlier results.
    pub pci_root: Option<String>,
}

/// A device name a DRA driver publishes, and what it maps to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PublishedDevice {
    /// The pool publishing it.
    pub pool: String,
    /// The published name (a DNS label).
    pub name: String,
    /// The inventory device behind it.
    pub device_id: String,
    /// `whole`, `shareable` or `slice`.
    pub kind: PublishedKind,
    /// For slices: the unit the name stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Unit>,
}

/// What a published name stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PublishedKind {
    /// The whole device.
    Whole,
    /// One share of a shared device per result.
    Shareable,
    /// One slice at one placement.
    Slice,
}

/// Status of one pool, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSnapshot {
    /// Pool name.
    pub name: String,
    /// Family (policy) name.
    pub family: String,
    /// Devices of the pool, sorted by id.
    pub devices: Vec<DeviceSnapshot>,
}

/// Units and devices of a pool, offered and held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolUsage {
    /// Units the pool's devices offer.
    pub units_total: u64,
    /// Units held.
    pub units_used: u64,
    /// Devices in the pool.
    pub devices: u64,
    /// Devices with at least one unit held.
    pub devices_used: u64,
}

impl PoolUsage {
    /// Adds one device of `total` units with `used` held.
    pub fn add(&mut self, total: u32, used: u32) {
        self.units_total += u64::from(total);
        self.units_used += u64::from(used);
        self.devices += 1;
        self.devices_used += u64::from(used > 0);
    }

    /// The usage a snapshot shows.
    pub fn of(snapshot: &PoolSnapshot) -> PoolUsage {
        let mut u = PoolUsage::default();
        for d in &snapshot.devices {
            u.add(d.units_total, d.units_used);
        }
        u
    }
}

/// Status of one device of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// Device id.
    pub id: String,
    /// Units the device offers (1, replicas or slots).
    pub units_total: u32,
    /// Units held.
    pub units_used: u32,
    /// Who holds what, sorted.
    pub held: Vec<HeldUnit>,
}

/// One held unit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HeldUnit {
    /// The unit.
    pub unit: Unit,
    /// The claim holding it.
    pub claim: ClaimUid,
}

/// A policy managing the units of one pool's devices for claims.
///
/// Implementations are pure and deterministic: no I/O, no clocks, no
/// randomness, no `HashMap` iteration in decisions. The [`crate::Node`] owns
/// one policy per pool, checks vendors and accelerator-local CPUs across pools,
/// and rolls back a claim that fails half-way by calling [`Policy::release`].
pub trait Policy: Send {
    /// The family (registered policy name) of this policy.
    fn family(&self) -> FamilyKind;

    /// The pool's devices, sorted by id.
    fn devices(&self) -> &[Device];

    /// Replaces all state with these grants (from committed records).
    ///
    /// A grant naming an unknown device or unit, or conflicting with another,
    /// is an error naming the claim and the device.
    fn restore(&mut self, grants: &[(ClaimUid, Grant)]) -> Result<(), PolicyError>;

    /// Allocates one request of a claim. Idempotent: if the claim already
    /// holds grants for this request (and device, when named), those are returned.
    /// A refusal changes nothing.
    fn allocate(&mut self, claim: &str, request: &PoolRequest) -> Result<Vec<Grant>, Refusal>;

    /// Releases everything the claim holds in this pool (unknown claim: nothing).
    /// Returns what was released.
    fn release(&mut self, claim: &str) -> Vec<Grant>;

    /// Takes exactly `unit` of device `device_id` for one result of `claim` (the kubelet chose
    /// it for a device plugin). Idempotent: a unit the claim already holds for `request` is
    /// answered again. A unit held by another claim is refused naming that claim; a unit the
    /// device does not have is refused as invalid. A refusal changes nothing.
    ///
    /// The default refuses: a policy that cannot take a given unit is not served to the
    /// kubelet's device plugin API (the built-in families all can).
    fn place(
        &mut self,
        claim: &str,
        request: &str,
        device_id: &str,
        unit: &Unit,
    ) -> Result<Grant, Refusal> {
        let _ = (request, unit);
        Err(Refusal::new(
            claim,
            Some(device_id),
            crate::RefusalReason::InvalidRequest {
                why: format!(
                    "the {} policy cannot take a unit chosen by someone else",
                    self.family()
                ),
            },
        ))
    }

    /// Marks a device found in use without a record as held by `claim`: the
    /// whole device, or one share on shared pools.
    fn adopt(&mut self, claim: &str, device_id: &str) -> Result<Grant, Refusal>;

    /// The container edits a grant gives: device nodes (the device's and its
    /// vendor's control nodes) and limit env.
    fn edits(&self, grant: &Grant) -> ContainerEdits;

    /// The env a grant adds to a container's adjustment (share and slice limits).
    fn env(&self, grant: &Grant) -> Vec<(String, String)>;

    /// Claims holding units of the device, sorted.
    fn holders(&self, device_id: &str) -> Vec<ClaimUid>;

    /// Status of the pool.
    fn snapshot(&self) -> PoolSnapshot;

    /// How much of the pool is held, without who holds it: the metrics read this every few
    /// seconds, so it should not copy per-claim state. The default derives it from
    /// [`Policy::snapshot`].
    fn usage(&self) -> PoolUsage {
        PoolUsage::of(&self.snapshot())
    }

    /// The names a DRA driver publishes for this pool, sorted by name.
    fn published(&self) -> Vec<PublishedDevice>;
}

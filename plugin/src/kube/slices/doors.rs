//! What the published pool leaves to others: devices held through another door than this
//! node's DRA claims, and the taint an unhealthy device carries where its pool asks for one.
//!
//! The scheduler knows only the claims it allocated. A device held through the annotation path,
//! a device plugin, the claims API or by an adopted container looks free to it; were it
//! published, the scheduler would allocate it and the kubelet's prepare would be refused
//! ("device ... is held by claim ...") until the holder went, with the pod stuck in
//! ContainerCreating. So what the scheduler could allocate on top of such a holder is withdrawn
//! (not tainted: a claim tolerating the taint would be allocated it all the same, taints need a
//! gate on 1.34, and a taint cannot say "two of four shares"):
//! - an exclusive (or custom) device: all of its names;
//! - a shared device: nothing while shares are left; its `shares` capacity is lowered to the
//!   shares left (the scheduler counts its own claims against it), and it is withdrawn when none
//!   is;
//! - a sliced device: the whole device and every partition overlapping a held slot; the other
//!   partitions stay.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceTaint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use policies::{FamilyConfig, Unit};
use serde::Serialize;

use super::Withdrawal;

/// Units held through another door than this node's DRA claims: device id -> (claim UID, unit).
pub type HeldElsewhere = BTreeMap<String, BTreeSet<(String, Unit)>>;

/// An unhealthy device as a taint describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnhealthyDevice {
    /// When it was first seen unhealthy (Unix seconds): the taint's `timeAdded`.
    pub since_unix: i64,
    /// Why, as a label value (`device-node-gone`, `driver-unbound`, ...): the taint's value.
    pub reason: String,
}

/// An unhealthy device published with a taint, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tainted {
    /// Inventory device id.
    pub device: String,
    /// `NoSchedule` or `NoExecute`.
    pub effect: &'static str,
    /// The taint's value.
    pub reason: String,
}

/// The taint key's name under the driver's domain: `<driver>/unhealthy`.
pub const TAINT_NAME: &str = "unhealthy";

/// The taint of an unhealthy device: key `<driver>/unhealthy`, the reason as its value, the
/// time it was first seen unhealthy as `timeAdded` (kept across rounds, so a rewrite of its
/// slice does not restart the eviction controller's clock).
pub fn taint(driver: &str, effect: &str, sick: &UnhealthyDevice) -> DeviceTaint {
    DeviceTaint {
        key: format!("{driver}/{TAINT_NAME}"),
        value: Some(sick.reason.clone()).filter(|r| !r.is_empty()),
        effect: effect.to_string(),
        time_added: k8s_openapi::jiff::Timestamp::from_second(sick.since_unix)
            .ok()
            .map(Time),
    }
}

fn int_attr(d: &Device, name: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(name)?.int
}

fn is_partition(d: &Device) -> bool {
    d.attributes
        .as_ref()
        .and_then(|a| a.get("type"))
        .and_then(|t| t.string.as_deref())
        == Some("partition")
}

/// The slots of a sliced device with `slots` slots that `held` covers.
fn held_slots(held: &BTreeSet<(String, Unit)>, slots: u32) -> BTreeSet<u32> {
    held.iter()
        .flat_map(|(_, u)| match u {
            Unit::Slice { start, size, .. } => *start..start.saturating_add(*size).min(slots),
            Unit::Whole | Unit::Share { .. } => 0..slots,
        })
        .collect()
}

/// The replicas of a shared device with `replicas` replicas that `held` takes.
fn held_shares(held: &BTreeSet<(String, Unit)>, replicas: u32) -> u32 {
    held.iter()
        .map(|(_, u)| match u {
            Unit::Share { count, .. } => *count,
            Unit::Whole | Unit::Slice { .. } => replicas,
        })
        .fold(0u32, u32::saturating_add)
        .min(replicas)
}

/// Withdraws from `entries` (the DRA devices of inventory device `device`, of a pool of
/// `family`) what `held` leaves the scheduler no room for, and says what it did.
pub fn withdraw_held(
    device: &str,
    family: &FamilyConfig,
    held: &BTreeSet<(String, Unit)>,
    entries: &mut Vec<Device>,
) -> Withdrawal {
    let mut claims: Vec<String> = held.iter().map(|(c, _)| c.clone()).collect();
    claims.dedup();
    let before: Vec<String> = entries.iter().map(|d| d.name.clone()).collect();
    let mut shares_left = None;
    match family {
        FamilyConfig::Shared { replicas, .. } => {
            let left = replicas.saturating_sub(held_shares(held, *replicas));
            if left == 0 {
                entries.clear();
            } else {
                shares_left = Some(left);
                for d in entries.iter_mut() {
                    if let Some(c) = d.capacity.as_mut().and_then(|c| c.get_mut("shares")) {
                        c.value = Quantity(left.to_string());
                    }
                }
            }
        }
        FamilyConfig::Sliced { slots, .. } => {
            let taken = held_slots(held, *slots);
            entries.retain(|d| {
                if !is_partition(d) {
                    return taken.is_empty();
                }
                let (Some(start), Some(size)) =
                    (int_attr(d, "sliceStart"), int_attr(d, "sliceSize"))
                else {
                    return false;
                };
                !(start..start.saturating_add(size))
                    .any(|s| u32::try_from(s).is_ok_and(|s| taken.contains(&s)))
            });
        }
        FamilyConfig::Exclusive | FamilyConfig::Custom { .. } => entries.clear(),
    }
    let names = before
        .into_iter()
        .filter(|n| !entries.iter().any(|d| d.name == *n))
        .collect();
    Withdrawal::HeldElsewhere {
        device: device.to_string(),
        claims,
        names,
        shares_left,
    }
}

/// Whether `now` holds a unit `before` did not: a new holder must be withdrawn at once, while
/// a release may wait (published again after a short settle, so grant and release in quick
/// succession do not make the slices flap).
pub fn holds_more(now: &HeldElsewhere, before: &HeldElsewhere) -> bool {
    now.iter().any(|(id, units)| match before.get(id) {
        Some(was) => !units.is_subset(was),
        None => !units.is_empty(),
    })
}

//! What ListAndWatch tells the kubelet: every advertised device, its NUMA node, and whether the
//! kubelet may hand it out.
//!
//! The device plugin API has one word for a device the kubelet may not hand out: `Unhealthy`.
//! nri-accel sends it for two reasons, which it keeps apart everywhere else ([`Unavailable`]):
//! the health monitor found the device broken (its PCI function, driver binding or device node is
//! gone), or a claim made through another door (the claims API, a pod annotation, an adopted
//! device, another resource) holds any part of its unit. The kubelet only counts healthy devices
//! as allocatable, so the scheduler does not place a pod on units the node has already given
//! away. Units held by this resource's own allocations stay healthy: the kubelet tracks those
//! itself.

use std::collections::BTreeMap;

use kubelet_proto::deviceplugin as pb;
use policies::{Allocation, Unit};

use super::layout::Resource;
use crate::device_health::HealthReport;
use crate::engine::Origin;

/// One advertised device as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The kubelet device ID.
    pub id: String,
    /// Its NUMA node, if known.
    pub numa: Option<u32>,
    /// Why the kubelet may not hand it out; `None` when it may.
    pub unavailable: Option<Unavailable>,
}

/// Why the kubelet may not hand a device out (both are `Unhealthy` on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The health monitor found the device broken; the sentence names what.
    Unhealthy(String),
    /// The device works, but a claim granted through another door holds (part of) it.
    HeldElsewhere {
        /// The claim holding it.
        claim: String,
        /// The sentence for `status`: what is held, by which claim.
        reason: String,
    },
}

impl Unavailable {
    /// The sentence for `status`.
    pub fn reason(&self) -> &str {
        match self {
            Unavailable::Unhealthy(reason) | Unavailable::HeldElsewhere { reason, .. } => reason,
        }
    }
}

/// A unit of a device held by a claim, and whether the claim is this resource's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The unit held.
    pub unit: Unit,
    /// The claim holding it.
    pub claim: String,
    /// Whether the claim is a device plugin allocation of this resource.
    pub ours: bool,
}

/// The holds on the devices of `resource`'s pool, by device id, from the engine's claims.
pub fn holds<'a>(
    resource: &Resource,
    claims: impl Iterator<Item = (&'a Allocation, &'a Origin)>,
) -> BTreeMap<String, Vec<Hold>> {
    let mut out: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    for (a, origin) in claims {
        let ours = matches!(origin, Origin::DevicePlugin(dp) if dp.resource == resource.name);
        for g in a.results.iter().filter(|g| g.pool == resource.pool) {
            out.entry(g.device_id.clone()).or_default().push(Hold {
                unit: g.unit.clone(),
                claim: a.claim_uid.clone(),
                ours,
            });
        }
    }
    out
}

/// The slot range a unit covers (a whole device covers every slot).
fn range(unit: &Unit) -> (u32, u32) {
    match unit {
        Unit::Whole => (0, u32::MAX),
        Unit::Share { index, count } => (*index, index.saturating_add(*count)),
        Unit::Slice { start, size, .. } => (*start, start.saturating_add(*size)),
    }
}

fn overlaps(a: &Unit, b: &Unit) -> bool {
    let ((a0, a1), (b0, b1)) = (range(a), range(b));
    a0 < b1 && b0 < a1
}

/// Every device of `resource` with its health, given the `holds` on its pool and the devices'
/// `health`.
pub fn list(
    resource: &Resource,
    holds: &BTreeMap<String, Vec<Hold>>,
    health: &HealthReport,
) -> Vec<Listed> {
    resource
        .devices
        .iter()
        .map(|a| {
            let h = health.of(&a.device_id);
            let unavailable = if !h.healthy {
                Some(Unavailable::Unhealthy(h.reason))
            } else {
                holds
                    .get(&a.device_id)
                    .into_iter()
                    .flatten()
                    .find(|hold| {
                        overlaps(&hold.unit, &a.unit) && !(hold.ours && hold.unit == a.unit)
                    })
                    .map(|hold| {
                        let what = match hold.unit {
                            Unit::Whole => format!("device {}", a.device_id),
                            ref part => format!("{part} of device {}", a.device_id),
                        };
                        Unavailable::HeldElsewhere {
                            claim: hold.claim.clone(),
                            reason: format!(
                                "{what} is held by claim {}, granted outside this resource",
                                hold.claim
                            ),
                        }
                    })
            };
            Listed {
                id: a.id.clone(),
                numa: a.numa,
                unavailable,
            }
        })
        .collect()
}

/// The ListAndWatch message for `listed`.
pub fn to_response(listed: &[Listed]) -> pb::ListAndWatchResponse {
    pb::ListAndWatchResponse {
        devices: listed
            .iter()
            .map(|l| pb::Device {
                id: l.id.clone(),
                health: if l.unavailable.is_none() {
                    kubelet_proto::DEVICE_HEALTHY
                } else {
                    kubelet_proto::DEVICE_UNHEALTHY
                }
                .to_string(),
                topology: l.numa.map(|n| pb::TopologyInfo {
                    nodes: vec![pb::NumaNode { id: i64::from(n) }],
                }),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_health::DeviceHealth;
    use crate::kubelet::device_plugin::layout::Advertised;
    use std::time::SystemTime;

    fn resource() -> Resource {
        let share = |n| Advertised {
            id: format!("g0::{n}"),
            device_id: "g0".into(),
            unit: Unit::Share { index: n, count: 1 },
            numa: Some(1),
        };
        Resource::new(
            "accel.nri.io/shared".into(),
            "shared".into(),
            "s.sock".into(),
            vec![share(0), share(1), share(2)],
        )
    }

    #[test]
    fn foreign_holds_and_bad_health_are_unavailable_own_holds_are_not() {
        let r = resource();
        let mut holds = BTreeMap::new();
        holds.insert(
            "g0".to_string(),
            vec![
                Hold {
                    unit: Unit::Share { index: 0, count: 1 },
                    claim: "dp-1".into(),
                    ours: true,
                },
                Hold {
                    unit: Unit::Share { index: 1, count: 1 },
                    claim: "api-claim".into(),
                    ours: false,
                },
            ],
        );
        let mut health = HealthReport {
            devices: [("g0".to_string(), DeviceHealth::healthy())].into(),
            checked_at: SystemTime::now(),
        };
        let l = list(&r, &holds, &health);
        assert_eq!(l[0].unavailable, None);
        assert_eq!(
            l[1].unavailable,
            Some(Unavailable::HeldElsewhere {
                claim: "api-claim".into(),
                reason:
                    "replica 1 of device g0 is held by claim api-claim, granted outside this resource"
                        .into()
            })
        );
        assert_eq!(l[2].unavailable, None);
        let msg = to_response(&l);
        assert_eq!(msg.devices[1].health, "Unhealthy");
        assert_eq!(msg.devices[2].health, "Healthy");
        assert_eq!(msg.devices[2].topology.as_ref().unwrap().nodes[0].id, 1);

        health.devices.insert(
            "g0".into(),
            DeviceHealth {
                healthy: false,
                reason: "device g0 (PCI x) is gone from sysfs".into(),
            },
        );
        let l = list(&r, &holds, &health);
        // A broken device is unhealthy, whoever holds it.
        assert!(l.iter().all(|d| d.unavailable
            == Some(Unavailable::Unhealthy(
                "device g0 (PCI x) is gone from sysfs".into()
            ))));
    }
}

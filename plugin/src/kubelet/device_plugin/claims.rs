//! How a device plugin allocation becomes a claim, and what an Allocate does with the claims
//! that already hold the devices it names.
//!
//! The kubelet's Allocate names device IDs and nothing else: no pod, no container, and no later
//! call says the allocation ended. So the claim is named after what it holds: `dp-` and a hash of
//! the resource and the sorted IDs. The same IDs again (the kubelet repeating an Allocate after
//! a restart of its own or of nri-accel) is the same claim, answered with the same CDI names.
//!
//! When the IDs overlap a claim that already holds some of them ([`plan`]):
//! - a container using that claim still exists: refused, naming the container and its pod;
//! - the same IDs and no container used the claim yet: the same claim, answered again;
//! - a container used it and none is left: the kubelet is right that the devices are free, the
//!   old claim is released first;
//! - no container used it yet (a different set of IDs): released first once
//!   `unused_grace_secs` have passed since it was allocated (its pod was deleted before a
//!   container started), refused before that.

use std::collections::BTreeSet;

use super::DevicePluginError;
use crate::engine::DevicePluginClaim;

/// The claim UID of an allocation of `ids` (any order) from `resource`.
pub fn claim_uid(resource: &str, ids: &BTreeSet<String>) -> String {
    // FNV-1a, 64 bits: stable across releases and platforms, which a std hasher is not.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(resource.as_bytes());
    for id in ids {
        eat(b"\n");
        eat(id.as_bytes());
    }
    format!("dp-{h:016x}")
}

/// What an Allocate does before it prepares its claim.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Claims to release first (their users are gone, or they were never used and are old).
    pub release: Vec<String>,
}

/// Decides what an Allocate of `ids` from `resource` at `now` (seconds since the epoch) does
/// with the claims in `existing` that hold some of the same IDs.
pub fn plan(
    resource: &str,
    ids: &BTreeSet<String>,
    existing: &[DevicePluginClaim],
    now: u64,
    grace_secs: u64,
) -> Result<Plan, DevicePluginError> {
    let mut out = Plan::default();
    for c in existing.iter().filter(|c| c.resource == resource) {
        let Some(shared) = c.device_ids.iter().find(|id| ids.contains(*id)) else {
            continue;
        };
        let same: BTreeSet<&String> = c.device_ids.iter().collect();
        let same = same.len() == ids.len() && ids.iter().all(|id| same.contains(id));
        if let Some(container) = c.users.first() {
            return Err(DevicePluginError::HeldByContainer {
                resource: resource.to_string(),
                id: shared.clone(),
                claim: c.uid.clone(),
                container: container.clone(),
                pod: c
                    .user
                    .as_ref()
                    .filter(|u| u.container_id == *container)
                    .map_or_else(|| "-".to_string(), |u| u.pod.clone()),
            });
        }
        match &c.user {
            // Never used, the same IDs: the kubelet asks again; the same claim answers.
            None if same => {}
            None => {
                let age = now.saturating_sub(c.allocated_at);
                if age < grace_secs {
                    return Err(DevicePluginError::NotYetUsed {
                        resource: resource.to_string(),
                        id: shared.clone(),
                        claim: c.uid.clone(),
                        age_secs: age,
                        grace_secs,
                    });
                }
                out.release.push(c.uid.clone());
            }
            // Used, and every container that used it is gone.
            Some(_) => out.release.push(c.uid.clone()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DevicePluginUser;

    fn ids(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn claim(
        uid: &str,
        devices: &[&str],
        at: u64,
        used: bool,
        users: &[&str],
    ) -> DevicePluginClaim {
        DevicePluginClaim {
            uid: uid.into(),
            resource: "accel.nri.io/whole".into(),
            device_ids: devices.iter().map(|s| s.to_string()).collect(),
            allocated_at: at,
            user: used.then(|| DevicePluginUser {
                container_id: "c1".into(),
                pod_uid: "p1".into(),
                pod: "ns/train".into(),
            }),
            users: users.iter().map(|s| s.to_string()).collect(),
        }
    }

    const R: &str = "accel.nri.io/whole";

    #[test]
    fn uids_name_the_set_not_its_order_and_are_valid_claim_uids() {
        let a = claim_uid(R, &ids(&["gpu1", "gpu0"]));
        assert_eq!(a, claim_uid(R, &ids(&["gpu0", "gpu1"])));
        assert_ne!(a, claim_uid(R, &ids(&["gpu0"])));
        assert_ne!(a, claim_uid("accel.nri.io/other", &ids(&["gpu0", "gpu1"])));
        // Fixed forever: records name claims by it.
        assert_eq!(claim_uid(R, &ids(&["gpu0"])), "dp-a4395cb1a57f5adc");
        cdi::validate_claim_uid(&a).unwrap();
    }

    #[test]
    fn held_devices_are_refused_or_released_by_who_holds_them() {
        let want = ids(&["gpu0"]);
        // A live container: refused, naming it and its pod.
        let e = plan(
            R,
            &want,
            &[claim("x", &["gpu0"], 0, true, &["c1"])],
            100,
            60,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "resource accel.nri.io/whole: device gpu0 is still held by container c1 of pod ns/train (claim x); it is handed out again once that container stops"
        );
        // The same set, never used: answered again (nothing released).
        assert_eq!(
            plan(R, &want, &[claim("x", &["gpu0"], 90, false, &[])], 100, 60).unwrap(),
            Plan::default()
        );
        // Used and the containers gone: released first.
        let p = plan(
            R,
            &want,
            &[claim("x", &["gpu0", "gpu1"], 0, true, &[])],
            100,
            60,
        )
        .unwrap();
        assert_eq!(p.release, ["x"]);
        // Never used, another set: refused within the grace period, released after it.
        let young = claim("x", &["gpu0", "gpu1"], 90, false, &[]);
        let e = plan(R, &want, std::slice::from_ref(&young), 100, 60).unwrap_err();
        assert!(
            e.to_string().contains("allocated 10 s ago (claim x)"),
            "{e}"
        );
        let p = plan(R, &want, &[young], 200, 60).unwrap();
        assert_eq!(p.release, ["x"]);
        // Claims of other resources and other devices do not matter.
        let mut other = claim("y", &["gpu0"], 0, true, &["c9"]);
        other.resource = "accel.nri.io/other".into();
        assert_eq!(
            plan(
                R,
                &want,
                &[other, claim("z", &["gpu5"], 0, true, &["c9"])],
                100,
                60
            )
            .unwrap(),
            Plan::default()
        );
    }
}

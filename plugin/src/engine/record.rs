//! What the checkpoint holds per claim and per container.

use std::collections::BTreeMap;
use std::sync::Arc;

use policies::{Allocation, Ask, ContainerUpdate};
use serde::{Deserialize, Serialize};

/// The committed record of one claim: the policy's allocation and where the claim came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRecord {
    /// What the policy allocated; replayed into the policy at startup. Shared with the policy's
    /// own copy while the daemon runs (one allocation in memory per claim, not two).
    pub allocation: Arc<Allocation>,
    /// Who asked for the claim.
    #[serde(default)]
    pub origin: Origin,
    /// What the claim asked for, so a repeated Prepare can be told from a different one after
    /// a restart too (`None` for adopted claims and records written before asks were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
    /// Environment the claim's configuration sets for the containers using each request's
    /// devices; kept so the claim's CDI spec can be written again with it after a restart.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: RequestEnv,
}

/// Environment variables per request name of a claim (name -> value), from the opaque
/// configuration of its ResourceClaim and DeviceClass (docs/dra.md, "Opaque configuration").
/// The variables of a request go into the CDI edits of every device allocated for it.
pub type RequestEnv = BTreeMap<String, BTreeMap<String, String>>;

/// Where a claim came from; decides who may release it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Origin {
    /// The claims API (a DRA driver or an operator); released by Unprepare.
    #[default]
    ClaimsApi,
    /// A pod annotation; released when the container is removed.
    Annotation {
        /// The container the claim is scoped to.
        container_id: String,
    },
    /// A running container found holding a device without a record; released when it is removed.
    Adopted {
        /// The container found holding the device.
        container_id: String,
    },
    /// A kubelet device plugin's Allocate (docs/device-plugin.md): released when the last
    /// container that used it is removed, when its pod is gone, or when the kubelet hands its
    /// devices to another container. Boxed: the other origins are one id or none, and every
    /// record and origin in memory is as large as the largest variant.
    DevicePlugin(Box<DevicePluginOrigin>),
}

/// What a device plugin's claim records of its Allocate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicePluginOrigin {
    /// The extended resource the kubelet allocated, e.g. `accel.nri.io/whole`.
    pub resource: String,
    /// The kubelet device IDs it allocated, sorted.
    pub device_ids: Vec<String>,
    /// When it was allocated, in seconds since the Unix epoch.
    pub allocated_at: u64,
    /// The first container that used it, once one has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<DevicePluginUser>,
}

/// The container that first used a device plugin's claim, and its pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicePluginUser {
    /// The container.
    pub container_id: String,
    /// Its pod's UID: the claim lives as long as the pod may still start containers with it.
    pub pod_uid: String,
    /// `namespace/name` of the pod, for status and messages.
    pub pod: String,
}

impl Origin {
    /// The container this claim lives and dies with, if any.
    pub fn container(&self) -> Option<&str> {
        match self {
            Origin::ClaimsApi | Origin::DevicePlugin(_) => None,
            Origin::Annotation { container_id } | Origin::Adopted { container_id } => {
                Some(container_id)
            }
        }
    }
}

/// A container update waiting to reach the runtime, with the order it was made in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingUpdate {
    /// Order of the policy decision that produced it; a newer one replaces an older one.
    pub seq: u64,
    /// CPUs the container should run on.
    pub cpus: policies::CpuSet,
    /// Memory nodes the container should use.
    pub mems: policies::CpuSet,
}

impl PendingUpdate {
    /// The update as the policy expresses it.
    pub fn to_update(&self, container_id: &str) -> ContainerUpdate {
        ContainerUpdate {
            container_id: container_id.to_string(),
            cpus: self.cpus.clone(),
            mems: self.mems.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(env: RequestEnv) -> ClaimRecord {
        ClaimRecord {
            allocation: Arc::new(Allocation {
                claim_uid: "u1".into(),
                namespace: "ns".into(),
                name: "c".into(),
                results: Vec::new(),
                cpus: Default::default(),
            }),
            origin: Origin::ClaimsApi,
            ask: None,
            env,
        }
    }

    #[test]
    fn a_claims_env_is_kept_and_a_record_without_one_reads_as_before() {
        let env = RequestEnv::from([(
            "gpu".to_string(),
            BTreeMap::from([("MODE".to_string(), "batch".to_string())]),
        )]);
        let kept = record(env);
        let text = serde_json::to_string(&kept).unwrap();
        assert_eq!(serde_json::from_str::<ClaimRecord>(&text).unwrap(), kept);
        // Records without env (older daemons wrote none) read as empty, and an empty env is not
        // written, so an older daemon still reads what this one writes for such claims.
        let plain = serde_json::to_string(&record(RequestEnv::new())).unwrap();
        assert!(!plain.contains("\"env\""), "{plain}");
        assert!(
            serde_json::from_str::<ClaimRecord>(&plain)
                .unwrap()
                .env
                .is_empty()
        );
    }
}

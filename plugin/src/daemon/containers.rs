//! Which containers hold which claims, as the runtime reports them.
//!
//! A container is mapped to claims by the CDI device names of our kind it
//! carries (NRI 0.10+ reports them), or else by the major:minor of the device
//! nodes it has, looked up among the devices the policy knows.

use std::collections::{BTreeMap, BTreeSet};

/// What the daemon needs to know of a container, independent of the NRI messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerView {
    /// Container ID.
    pub id: String,
    /// Container name within its pod.
    pub name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod UID.
    pub pod_uid: String,
    /// The pod's annotations the annotation path reads (those under its prefix), for a
    /// container being created; empty for the running containers of a Synchronize, where
    /// nothing reads them.
    pub pod_annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names the container was created with.
    pub cdi_devices: Vec<String>,
    /// (major, minor) of the device nodes in the container.
    pub device_nodes: Vec<(u32, u32)>,
    /// The cpuset and memory nodes the runtime reports for the container.
    pub placement: policies::Placement,
}

/// The claim UID a CDI device name of our kind grants, e.g.
/// `accel.nri.io/device=claim-<uid>-3` -> `<uid>`.
pub fn claim_of_cdi_name(kind: &str, name: &str) -> Option<String> {
    let device = name.strip_prefix(kind)?.strip_prefix('=')?;
    let rest = device.strip_prefix("claim-")?;
    let (uid, index) = rest.rsplit_once('-')?;
    if uid.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(uid.to_string())
}

/// The running containers that hold claims, and the claims each holds. A container without
/// claims has no entry: the policy's node already knows it for its cpuset, and a big node
/// runs tens of thousands of them.
#[derive(Debug, Default)]
pub struct ContainerMap {
    claims: BTreeMap<String, BTreeSet<String>>,
}

impl ContainerMap {
    /// Records that `container` holds `claims` (replacing what was known; none: forgotten).
    pub fn set(&mut self, container: &str, claims: BTreeSet<String>) {
        if claims.is_empty() {
            self.claims.remove(container);
        } else {
            self.claims.insert(container.to_string(), claims);
        }
    }

    /// Forgets a container.
    pub fn remove(&mut self, container: &str) -> Option<BTreeSet<String>> {
        self.claims.remove(container)
    }

    /// Keeps only the containers in `live`.
    pub fn retain(&mut self, live: &BTreeSet<String>) {
        self.claims.retain(|c, _| live.contains(c));
    }

    /// Containers and their claims.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &BTreeSet<String>)> {
        self.claims.iter()
    }

    /// Number of containers holding claims.
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// Whether no container holds a claim.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// Containers holding `claim`.
    pub fn holders(&self, claim: &str) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, c)| c.contains(claim))
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_our_cdi_names_back_to_claims() {
        let kind = "accel.nri.io/device";
        assert_eq!(
            claim_of_cdi_name(
                kind,
                "accel.nri.io/device=claim-8c6f8987-f8b8-4534-a163-769716e8e4f6-0"
            ),
            Some("8c6f8987-f8b8-4534-a163-769716e8e4f6".into())
        );
        assert_eq!(claim_of_cdi_name(kind, "nvidia.com/gpu=0"), None);
        assert_eq!(claim_of_cdi_name(kind, "accel.nri.io/device=gpu0"), None);
        assert_eq!(
            claim_of_cdi_name(kind, "accel.nri.io/device=claim--0"),
            None
        );
        assert_eq!(
            claim_of_cdi_name(kind, "accel.nri.io/device=claim-a-x"),
            None
        );
    }
}

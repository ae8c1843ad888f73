//! Which containers hold which claims, as the runtime reports them.
//!
//! A container is mapped to claims by the CDI device names of our kind it
//! carries (NRI 0.10+ reports them), or else by the major:minor of the device
//! nodes it has, looked up among the devices the policy knows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

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
    /// The pod sandbox's ID (the runtime's, as its pod events name it).
    pub pod_id: String,
    /// Whether the runtime reports the container stopped (a Synchronize lists exited
    /// containers that were not removed yet).
    pub stopped: bool,
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

/// A container that holds claims, as the agent tracks it.
#[derive(Debug, Clone)]
struct Tracked {
    claims: BTreeSet<String>,
    /// The pod sandbox's ID: a pod that goes away takes its containers' grants with it.
    pod_id: String,
    /// `namespace/pod/container`, for messages.
    label: String,
    /// The container's name within its pod.
    name: String,
    /// Whether the runtime said the container exists (PostCreateContainer, StartContainer, or a
    /// Synchronize listed it). A grant whose container never comes to exist (the runtime's
    /// create failed after nri-accel answered) is released when the pod goes or creates its
    /// next attempt, or once it is older than `nri.unconfirmed_grant_secs`.
    created: bool,
    /// When the container was mapped (its CreateContainer was answered).
    since: Instant,
}

/// The running containers that hold claims, and the claims each holds. A container without
/// claims has no entry: the policy's node already knows it for its cpuset, and a big node
/// runs tens of thousands of them.
#[derive(Debug, Default)]
pub struct ContainerMap {
    tracked: BTreeMap<String, Tracked>,
}

impl ContainerMap {
    /// Records that container `c` holds `claims` (replacing what was known; none: forgotten).
    /// `created` says whether the runtime already reported the container as existing.
    pub fn set(&mut self, c: &ContainerView, claims: BTreeSet<String>, created: bool) {
        if claims.is_empty() {
            self.tracked.remove(&c.id);
        } else {
            self.tracked.insert(
                c.id.clone(),
                Tracked {
                    claims,
                    pod_id: c.pod_id.clone(),
                    label: format!("{}/{}/{}", c.pod_namespace, c.pod_name, c.name),
                    name: c.name.clone(),
                    created,
                    since: Instant::now(),
                },
            );
        }
    }

    /// Marks a container as existing (the runtime's PostCreateContainer or StartContainer).
    pub fn created(&mut self, container: &str) {
        if let Some(t) = self.tracked.get_mut(container) {
            t.created = true;
        }
    }

    /// Containers the runtime has not reported as existing although their CreateContainer was
    /// answered at least `age` before `now`, each with its `namespace/pod/container`: their
    /// create failed after nri-accel answered, on a runtime that says nothing of such a failure
    /// (CRI-O).
    pub fn unconfirmed(&self, age: Duration, now: Instant) -> Vec<(String, String)> {
        self.tracked
            .iter()
            .filter(|(_, t)| !t.created && now.saturating_duration_since(t.since) >= age)
            .map(|(id, t)| (id.clone(), t.label.clone()))
            .collect()
    }

    /// Forgets a container.
    pub fn remove(&mut self, container: &str) -> Option<BTreeSet<String>> {
        self.tracked.remove(container).map(|t| t.claims)
    }

    /// Keeps only the containers in `live`.
    pub fn retain(&mut self, live: &BTreeSet<String>) {
        self.tracked.retain(|c, _| live.contains(c));
    }

    /// Containers and their claims.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &BTreeSet<String>)> {
        self.tracked.iter().map(|(id, t)| (id, &t.claims))
    }

    /// Number of containers holding claims.
    pub fn len(&self) -> usize {
        self.tracked.len()
    }

    /// Whether no container holds a claim.
    pub fn is_empty(&self) -> bool {
        self.tracked.is_empty()
    }

    /// The containers holding `claim`.
    pub fn holders(&self, claim: &str) -> Vec<String> {
        self.tracked
            .iter()
            .filter(|(_, t)| t.claims.contains(claim))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The containers holding `claim`, each as `id (namespace/pod/container)`, for messages.
    pub fn holders_described(&self, claim: &str) -> Vec<String> {
        self.tracked
            .iter()
            .filter(|(_, t)| t.claims.contains(claim))
            .map(|(id, t)| format!("{} ({})", short_id(id), t.label))
            .collect()
    }

    /// The containers of pod sandbox `pod_id`.
    pub fn of_pod(&self, pod_id: &str) -> Vec<String> {
        self.tracked
            .iter()
            .filter(|(_, t)| t.pod_id == pod_id)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Earlier attempts at container `c`: containers of the same pod and name, other than `c`,
    /// that the runtime never reported as created (their creation failed after nri-accel
    /// answered: CRI-O sends no event for them).
    pub fn failed_attempts(&self, c: &ContainerView) -> Vec<String> {
        self.tracked
            .iter()
            .filter(|(id, t)| {
                !t.created && **id != c.id && t.pod_id == c.pod_id && t.name == c.name
            })
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// The first 12 characters of a container ID, as runtimes' CLIs print them.
pub fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
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

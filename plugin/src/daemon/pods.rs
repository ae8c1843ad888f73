//! What the pods on the annotation path asked for, by container name, and which of those names
//! the runtime created: a pod whose asked name never appears (a typo, or a CRI client that does
//! not set the `io.kubernetes.container.name` label CRI-O reads the name from) gets no device,
//! and that is said when the pod goes.

use std::collections::{BTreeMap, BTreeSet};

/// The pods with annotation asks that are present, by sandbox ID.
#[derive(Debug, Default)]
pub struct PodAsks {
    pods: BTreeMap<String, Asked>,
}

#[derive(Debug, Default)]
struct Asked {
    pod: String,
    names: BTreeSet<String>,
    seen: BTreeSet<String>,
}

/// Names a pod asked devices for that no container of it was created under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeverCreated {
    /// The pod, `namespace/name`.
    pub pod: String,
    /// The names asked for and never seen, sorted.
    pub names: Vec<String>,
    /// The names its containers were created under, sorted.
    pub seen: Vec<String>,
}

impl PodAsks {
    /// Pod `pod_id` (`pod` = `namespace/name`) asks devices for `asked`, and a container named
    /// `name` of it is being created.
    pub fn seen(&mut self, pod_id: &str, pod: &str, asked: Vec<String>, name: &str) {
        let entry = self.pods.entry(pod_id.to_string()).or_default();
        entry.pod = pod.to_string();
        entry.names.extend(asked);
        entry.seen.insert(name.to_string());
    }

    /// Pod `pod_id` is gone: what it asked for and never got a container for, if anything.
    pub fn pod_gone(&mut self, pod_id: &str) -> Option<NeverCreated> {
        let asked = self.pods.remove(pod_id)?;
        let names: Vec<String> = asked.names.difference(&asked.seen).cloned().collect();
        (!names.is_empty()).then(|| NeverCreated {
            pod: asked.pod,
            names,
            seen: asked.seen.into_iter().collect(),
        })
    }

    /// Keeps the pods in `present` only.
    pub fn retain(&mut self, present: &BTreeSet<String>) {
        self.pods.retain(|id, _| present.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_asked_and_never_created_is_reported_when_the_pod_goes() {
        let mut asks = PodAsks::default();
        asks.seen(
            "p1",
            "ns/train",
            vec!["trainer".into(), "worker".into()],
            "trainer",
        );
        asks.seen("p2", "ns/ok", vec!["app".into()], "app");
        asks.seen("p3", "ns/unlabelled", vec!["app".into()], "");
        assert_eq!(
            asks.pod_gone("p1"),
            Some(NeverCreated {
                pod: "ns/train".into(),
                names: vec!["worker".into()],
                seen: vec!["trainer".into()],
            })
        );
        assert_eq!(asks.pod_gone("p2"), None, "every asked name appeared");
        assert_eq!(asks.pod_gone("p1"), None, "said once");
        asks.retain(&BTreeSet::new());
        assert_eq!(asks.pod_gone("p3"), None, "forgotten when no longer listed");
    }
}

//! The `status` document: the policy's view, every claim with the containers holding it, the
//! containers, the pending updates and the gate, written as JSON text in one pass.
//!
//! With 10,000 claims the document is several megabytes; it is serialized from borrowed state
//! straight into one `String` (no intermediate JSON tree, no copy of the claims), because a tree
//! of that size is what made Status grow the daemon's memory by 80 MiB (docs/performance.md).

use std::collections::{BTreeMap, BTreeSet};

use policies::{Allocation, Grant, Snapshot};
use serde::Serialize;
use serde::ser::Serializer;

use crate::engine::Origin;

#[derive(Serialize)]
struct Gate {
    open: bool,
}

#[derive(Serialize)]
struct ClaimStatus<'a> {
    uid: &'a str,
    namespace: &'a str,
    name: &'a str,
    origin: &'a Origin,
    results: &'a [Grant],
    cpus: String,
    containers: &'a [&'a str],
}

/// Serializes the claims as a sequence while the engine's state is borrowed. The iterator is
/// consumed by the first `serialize` (the document is written once).
struct Claims<'a, I> {
    claims: std::cell::Cell<Option<I>>,
    holders: &'a BTreeMap<&'a str, Vec<&'a str>>,
}

impl<'a, 'b, I> Serialize for Claims<'a, I>
where
    I: Iterator<Item = (&'b Allocation, &'b Origin)>,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let none: &[&str] = &[];
        let claims = self.claims.take().into_iter().flatten();
        s.collect_seq(claims.map(|(a, origin)| {
            ClaimStatus {
                uid: &a.claim_uid,
                namespace: &a.namespace,
                name: &a.name,
                origin,
                results: &a.results,
                cpus: a.cpus.to_string(),
                containers: self
                    .holders
                    .get(a.claim_uid.as_str())
                    .map_or(none, Vec::as_slice),
            }
        }))
    }
}

#[derive(Serialize)]
struct Document<'a, C: Serialize> {
    gate: Gate,
    policy: &'a Snapshot,
    claims: C,
    containers: &'a BTreeMap<String, BTreeSet<String>>,
    pending_updates: usize,
    #[serde(flatten)]
    sections: &'a BTreeMap<&'static str, serde_json::Value>,
}

/// What the document is made of, gathered before the claims are walked.
pub struct StatusParts {
    /// Whether the gate is open.
    pub gate_open: bool,
    /// The policy's view.
    pub policy: Snapshot,
    /// The containers holding claims, and their claims.
    pub containers: BTreeMap<String, BTreeSet<String>>,
    /// Container updates waiting to reach the runtime.
    pub pending_updates: usize,
    /// Members of the parts that run only when configured (e.g. `kubelet`), by name.
    pub sections: BTreeMap<&'static str, serde_json::Value>,
}

/// Writes the document with `claims` (the engine's committed claims, borrowed under its lock).
pub fn render<'b>(
    parts: &StatusParts,
    claims: impl Iterator<Item = (&'b Allocation, &'b Origin)>,
) -> String {
    let mut holders: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (container, held) in &parts.containers {
        for claim in held {
            holders.entry(claim).or_default().push(container);
        }
    }
    let doc = Document {
        gate: Gate {
            open: parts.gate_open,
        },
        policy: &parts.policy,
        claims: Claims {
            claims: std::cell::Cell::new(Some(claims)),
            holders: &holders,
        },
        containers: &parts.containers,
        pending_updates: parts.pending_updates,
        sections: &parts.sections,
    };
    // Every part serializes to JSON without failing (string keys, no non-finite floats).
    serde_json::to_string(&doc).unwrap_or_else(|e| {
        tracing::error!(error = %e, "status document could not be written");
        "{}".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::{CpuSet, Unit};

    fn allocation(uid: &str, cpus: &str) -> Allocation {
        Allocation {
            claim_uid: uid.into(),
            namespace: "ns".into(),
            name: format!("{uid}-name"),
            results: vec![Grant {
                request: "gpu".into(),
                pool: "p".into(),
                device: "p-g0".into(),
                device_id: "g0".into(),
                unit: Unit::Whole,
            }],
            cpus: cpus.parse().unwrap(),
        }
    }

    #[test]
    fn the_document_has_every_part_and_the_containers_of_each_claim() {
        let parts = StatusParts {
            gate_open: true,
            policy: Snapshot {
                pools: Vec::new(),
                unpooled: vec!["g9".into()],
                shared_cpus: "0-3".parse().unwrap(),
                exclusive_cpus: BTreeMap::new(),
                claims: 2,
            },
            containers: BTreeMap::from([
                ("c1".to_string(), BTreeSet::from(["a".to_string()])),
                ("c2".to_string(), BTreeSet::from(["a".to_string()])),
            ]),
            pending_updates: 3,
            sections: BTreeMap::from([
                (
                    "kubelet",
                    serde_json::json!({"dra": {"registration": "waiting"}}),
                ),
                ("device_plugins", serde_json::json!({"resources": []})),
            ]),
        };
        let (a, b) = (allocation("a", "4"), allocation("b", ""));
        let annotation = Origin::Annotation {
            container_id: "c1".into(),
        };
        let claims = [(&a, &annotation), (&b, &Origin::ClaimsApi)];
        let doc: serde_json::Value =
            serde_json::from_str(&render(&parts, claims.into_iter())).unwrap();
        assert_eq!(doc["gate"]["open"], true);
        assert_eq!(doc["pending_updates"], 3);
        assert_eq!(doc["kubelet"]["dra"]["registration"], "waiting");
        assert_eq!(doc["device_plugins"]["resources"], serde_json::json!([]));
        assert_eq!(doc["policy"]["unpooled"][0], "g9");
        assert_eq!(doc["containers"]["c2"][0], "a");
        let claims = doc["claims"].as_array().unwrap();
        assert_eq!(claims.len(), 2);
        assert_eq!(claims[0]["uid"], "a");
        assert_eq!(claims[0]["name"], "a-name");
        assert_eq!(claims[0]["cpus"], CpuSet::from_iter([4]).to_string());
        assert_eq!(claims[0]["origin"]["kind"], "annotation");
        assert_eq!(claims[0]["containers"], serde_json::json!(["c1", "c2"]));
        assert_eq!(claims[0]["results"][0]["device_id"], "g0");
        assert_eq!(claims[1]["origin"]["kind"], "claims-api");
        assert_eq!(claims[1]["containers"], serde_json::json!([]));
    }
}

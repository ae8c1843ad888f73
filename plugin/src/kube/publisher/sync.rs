//! One publishing round: learn what the server keeps, read the node's slices, plan, write, and
//! read back what was stored.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::wire::{self, PoolMeta};
use super::{PublishSource, call, probe};
use crate::kube::slices::layout::{self, Plan, Write};
use crate::kube::slices::{self, Capabilities, PoolContent, PoolInput};
use crate::kube::{KubeApi, KubeError};

/// What the round learned about the server, kept until an error ends the session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The Node's UID (owner of the slices).
    pub node_uid: String,
    /// What the server keeps.
    pub caps: Capabilities,
}

/// How a round ended.
#[derive(Debug)]
pub struct Round {
    /// The plan carried out.
    pub plan: Plan,
    /// The content published.
    pub content: PoolContent,
    /// Writes made.
    pub writes: u64,
    /// The server dropped a gated field of a write: capabilities were lowered and the pool must
    /// be republished at once.
    pub again: bool,
}

/// Gates missing, as operators know them.
pub fn missing_gates(caps: Capabilities) -> Vec<&'static str> {
    let mut out = Vec::new();
    if !caps.partitions {
        out.push("DRAPartitionableDevices");
    }
    if !caps.multiple_allocations {
        out.push("DRAConsumableCapacity");
    }
    out
}

/// Opens a session: the Node's UID and what the server keeps.
pub async fn open(
    api: &dyn KubeApi,
    meta: &PoolMeta,
    timeout: Duration,
) -> Result<Session, KubeError> {
    let node = call(
        timeout,
        &format!("Node {}", meta.node),
        api.node(&meta.node),
    )
    .await?;
    let node_uid = node.metadata.uid.unwrap_or_default();
    let caps = probe::probe(api, meta, timeout).await?;
    if !caps.partitions {
        tracing::warn!(
            gate = "DRAPartitionableDevices",
            "the API server does not keep ResourceSlice counters (the gate is off, or it is a \
             Kubernetes 1.34 server, which wants counters beside the devices): sliced devices are \
             published whole, their partitions withdrawn"
        );
    }
    if !caps.multiple_allocations {
        tracing::warn!(
            gate = "DRAConsumableCapacity",
            "the API server does not keep allowMultipleAllocations: shared devices are published \
             as devices one claim holds at a time"
        );
    }
    Ok(Session { node_uid, caps })
}

/// One round against the server with `session`'s capabilities.
pub async fn round(
    api: &dyn KubeApi,
    meta: &PoolMeta,
    session: &mut Session,
    source: &Arc<PublishSource>,
    unhealthy: &BTreeSet<String>,
    timeout: Duration,
) -> Result<Round, KubeError> {
    let what = format!("the ResourceSlices of node {}", meta.node);
    let listed = call(timeout, &what, api.list_slices(&meta.driver, &meta.node)).await?;
    let existing: Vec<_> = listed.iter().map(wire::existing).collect();
    let content = slices::build(&PoolInput {
        inventory: &source.inventory,
        pools: &source.pools,
        published: &source.published,
        pcie_roots: &source.pcie_roots,
        unhealthy,
        caps: session.caps,
    });
    let plan = layout::plan(&existing, &content, &meta.node, &meta.driver, &meta.pool);
    let mut writes = 0;
    for w in &plan.writes {
        let (name, rv, body) = match w {
            Write::Delete {
                name,
                resource_version,
            } => {
                let what = format!("ResourceSlice {name}");
                match call(timeout, &what, api.delete_slice(name, resource_version)).await {
                    Ok(()) | Err(KubeError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
                writes += 1;
                continue;
            }
            Write::Create { name, body } => (name, None, body),
            Write::Replace {
                name,
                resource_version,
                body,
            } => (name, Some(resource_version.as_str()), body),
        };
        let slice = wire::render(meta, name, rv, plan.generation, plan.count, body);
        let what = format!("ResourceSlice {name}");
        let stored = match rv {
            None => call(timeout, &what, api.create_slice(&slice, false)).await?,
            Some(_) => call(timeout, &what, api.replace_slice(&slice)).await?,
        };
        writes += 1;
        let dropped = wire::dropped(&slice.spec, &stored.spec);
        if dropped.counters || dropped.multiple_allocations {
            let before = session.caps;
            session.caps.partitions &= !dropped.counters;
            session.caps.multiple_allocations &= !dropped.multiple_allocations;
            tracing::error!(
                slice = %name,
                missing_gates = ?missing_gates(session.caps),
                "the API server dropped fields of a written ResourceSlice although the dry run kept \
                 them; republishing at once without them so nothing can be allocated twice"
            );
            if session.caps != before {
                return Ok(Round {
                    plan,
                    content,
                    writes,
                    again: true,
                });
            }
        } else if dropped.other {
            tracing::warn!(slice = %name, "the API server stored a ResourceSlice that differs from what was written");
        }
    }
    Ok(Round {
        plan,
        content,
        writes,
        again: false,
    })
}

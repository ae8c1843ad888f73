//! One publishing round: learn what the server keeps, read the node's slices, plan, write, and
//! read back what was stored.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;

use super::wire::{self, PoolMeta};
use super::{Health, PublishSource, call, probe};
use crate::kube::slices::layout::{self, Body, Existing, Plan, SliceSummary, Write};
use crate::kube::slices::{self, Capabilities, PoolContent, PoolInput};
use crate::kube::{KubeApi, KubeError};

/// Slice writes in flight at once in one round.
const PARALLEL_WRITES: usize = 4;

/// What the round learned about the server, kept until an error ends the session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The Node's UID (owner of the slices).
    pub node_uid: String,
    /// What the server keeps.
    pub caps: Capabilities,
    /// The node's slices as the server stored them at the end of the last round (from its
    /// answers to our writes), so the next round need not list them again. `None`: list.
    pub known: Option<Vec<Existing>>,
}

/// How a round ended.
#[derive(Debug)]
pub struct Round {
    /// The plan carried out (its slice bodies moved into the requests).
    pub plan: Plan,
    /// The pool's slices as planned.
    pub summary: Vec<SliceSummary>,
    /// The content published.
    pub content: PoolContent,
    /// Writes made.
    pub writes: u64,
    /// The server dropped a gated field of a write: capabilities were lowered and the pool must
    /// be republished at once.
    pub again: bool,
}

/// Gates missing, as operators know them; `DRADeviceTaints` only when `wants_taints` (a pool
/// asks for taints): without it nothing is lost otherwise.
pub fn missing_gates(caps: Capabilities, wants_taints: bool) -> Vec<&'static str> {
    let mut out = Vec::new();
    if !caps.partitions {
        out.push("DRAPartitionableDevices");
    }
    if !caps.multiple_allocations {
        out.push("DRAConsumableCapacity");
    }
    if wants_taints && !caps.taints {
        out.push("DRADeviceTaints");
    }
    out
}

/// Whether a pool of `source` asks for its unhealthy devices to be tainted.
pub fn wants_taints(source: &PublishSource) -> bool {
    source.pools.iter().any(|p| !p.unhealthy.is_withdraw())
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

    Ok(Session {
        node_uid,
        caps,
        known: None,
    })
}

/// One round against the server with `session`'s capabilities.
pub async fn round(
    api: &dyn KubeApi,
    meta: &PoolMeta,
    session: &mut Session,
    source: &Arc<PublishSource>,
    health: &Health,
    timeout: Duration,
) -> Result<Round, KubeError> {
    let existing = match session.known.take() {
        Some(known) => known,
        None => {
            let what = format!("the ResourceSlices of node {}", meta.node);
            let listed = call(timeout, &what, api.list_slices(&meta.driver, &meta.node)).await?;
            listed.into_iter().map(wire::existing).collect()
        }
    };
    let content = slices::build(&PoolInput {
        inventory: &source.inventory,
        pools: &source.pools,
        published: &source.published,
        pcie_roots: &source.pcie_roots,
        unhealthy: &health.unhealthy,
        held: &health.held,
        driver: &meta.driver,
        caps: session.caps,
    });
    let mut plan = layout::plan(&existing, &content, &meta.node, &meta.driver, &meta.pool);
    let summary = plan.summary();
    // Creates and replaces first, a few at a time (within one plan they are independent: all
    // of one generation), then the deletes of slices the plan no longer has.
    // The bodies move into the requests: the plan keeps only the summary taken above.
    let mut sent: Vec<ResourceSlice> = Vec::new();
    for w in &plan.writes {
        let (i, rv) = match w {
            Write::Create { slice } => (*slice, None),
            Write::Replace {
                slice,
                resource_version,
            } => (*slice, Some(resource_version.as_str())),
            Write::Delete { .. } => continue,
        };
        let (name, body) = &mut plan.slices[i];
        let body = std::mem::replace(body, Body::Devices(Vec::new()));
        sent.push(wire::render(
            meta,
            name,
            rv,
            plan.generation,
            plan.count,
            body,
        ));
    }
    type Put<'a> = Pin<Box<dyn Future<Output = Result<ResourceSlice, KubeError>> + Send + 'a>>;
    let puts: Vec<Put<'_>> = sent
        .iter()
        .map(|slice| -> Put<'_> {
            let what = format!(
                "ResourceSlice {}",
                slice.metadata.name.as_deref().unwrap_or("")
            );
            Box::pin(async move {
                match slice.metadata.resource_version {
                    None => call(timeout, &what, api.create_slice(slice, false)).await,
                    Some(_) => call(timeout, &what, api.replace_slice(slice)).await,
                }
            })
        })
        .collect();
    let stored: Vec<Result<ResourceSlice, KubeError>> = futures::stream::iter(puts)
        .buffered(PARALLEL_WRITES)
        .collect()
        .await;
    let mut writes = 0;
    let mut first_error = None;
    let mut dropped = wire::Dropped::default();
    let mut now: BTreeMap<String, Existing> = BTreeMap::new();
    for (slice, result) in sent.iter().zip(stored) {
        let name = slice.metadata.name.as_deref().unwrap_or("");
        match result {
            Ok(stored) => {
                writes += 1;
                let d = wire::dropped(&slice.spec, &stored.spec);
                let stored = wire::existing(stored);
                now.insert(stored.name.clone(), stored);
                if d.other && !(d.counters || d.multiple_allocations || d.taints) {
                    tracing::warn!(slice = %name, "the API server stored a ResourceSlice that differs from what was written");
                }
                dropped.counters |= d.counters;
                dropped.multiple_allocations |= d.multiple_allocations;
                dropped.taints |= d.taints;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if dropped.counters || dropped.multiple_allocations || dropped.taints {
        let before = session.caps;
        session.caps.partitions &= !dropped.counters;
        session.caps.multiple_allocations &= !dropped.multiple_allocations;
        session.caps.taints &= !dropped.taints;
        tracing::error!(
            missing_gates = %missing_gates(session.caps, dropped.taints).join(", "),
            "the API server dropped fields of written ResourceSlices although the dry run kept \
             them; republishing at once without them so nothing can be allocated twice"
        );
        if session.caps != before {
            return Ok(Round {
                plan,
                summary,
                content,
                writes,
                again: true,
            });
        }
    }
    if let Some(KubeError::Invalid { message, .. }) = &first_error
        && session.caps.numa_list
        && message.contains(crate::kube::slices::NUMA_NODE)
    {
        // The probe saw the list kept, the write says otherwise (the gate went off meanwhile).
        session.caps.numa_list = false;
        tracing::warn!(
            error = %message,
            "the API server refused the list form of resource.kubernetes.io/numaNode although \
             the dry run kept it; publishing its scalar form"
        );
        return Ok(Round {
            plan,
            summary,
            content,
            writes,
            again: true,
        });
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    for w in &plan.writes {
        if let Write::Delete {
            name,
            resource_version,
        } = w
        {
            let what = format!("ResourceSlice {name}");
            match call(timeout, &what, api.delete_slice(name, resource_version)).await {
                Ok(()) | Err(KubeError::NotFound { .. }) => writes += 1,
                Err(e) => return Err(e),
            }
        }
    }
    // What the server holds now: the slices written as it answered them, the others as they were.
    let mut known = Vec::with_capacity(plan.slices.len());
    for (name, body) in std::mem::take(&mut plan.slices) {
        let e = match now.remove(&name) {
            Some(e) => e,
            None => match existing.iter().find(|e| e.name == name) {
                Some(e) => Existing {
                    body: Some(body),
                    ..e.clone_meta()
                },
                None => {
                    known.clear();
                    break;
                }
            },
        };
        known.push(e);
    }
    session.known = (known.len() == plan.count).then_some(known);
    Ok(Round {
        plan,
        summary,
        content,
        writes,
        again: false,
    })
}

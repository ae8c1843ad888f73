//! The claims API's view of the engine: converts the API's claims to policy
//! requests and answers per claim.

use std::sync::Arc;

use async_trait::async_trait;
use policies::{Ask, ClaimRequest, CountRequest, DeviceSelector, FamilyKind, NamedResult};

use super::Agent;
use crate::claims_api::{
    ClaimAsk, ClaimInfo, ClaimRef, ClaimService, ClaimSpec, ClaimState, Family, PrepareResults,
    PreparedDevice, UnprepareResults,
};
use crate::engine::{ClaimName, Origin};
use crate::gate::Gate;
use crate::metrics::{Metrics, Outcome};

/// Serves the claims API from the engine.
pub struct ClaimsFacade {
    agent: Arc<Agent>,
    metrics: Arc<Metrics>,
    gate: Option<Gate>,
}

impl ClaimsFacade {
    /// A facade over `agent` (the API enforces the gate and tells status about it). It takes
    /// DRA results of any driver: the caller is the driver the scheduler allocated for (this
    /// node's own DRA plugin, or a third-party driver delegating to nri-accel), and the engine
    /// arbitrates by pool and device whoever the driver is. The kubelet DRA plugin keeps only
    /// its own driver's results before it calls here (`kubelet/dra.rs`).
    pub fn new(agent: Arc<Agent>, metrics: Arc<Metrics>) -> Self {
        ClaimsFacade {
            agent,
            metrics,
            gate: None,
        }
    }

    /// Checks `gate` again under each claim's lock, where a request decides (allocates, or asks
    /// for the claim's users): the API admits a request while the gate is open, and one that
    /// reaches its claim after the gate closed is refused there, changing nothing
    /// ([`crate::engine::EngineError::NoLongerAdmitted`]). Without a gate (tests) every request
    /// admitted goes on.
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Whether a request may still decide: the gate, when there is one, is open.
    fn admitted(&self) -> bool {
        self.gate.as_ref().is_none_or(Gate::is_open)
    }
}

/// Checks a claim's DRA results (share ids) before it reaches the policy; answers the share ids
/// to echo per result.
fn check_results(
    engine: &crate::engine::Engine,
    spec: &ClaimSpec,
) -> Result<Vec<Option<String>>, String> {
    let ClaimAsk::Results(results) = &spec.ask else {
        return Ok(Vec::new());
    };
    let refs: Vec<crate::engine::ResultRef<'_>> = results
        .iter()
        .map(|r| crate::engine::ResultRef {
            request: &r.request,
            pool: &r.pool,
            device: &r.device,
            share_id: r.share_id.as_deref(),
        })
        .collect();
    engine
        .check_results(&spec.uid, &refs)
        .map_err(|e| e.to_string())?;
    Ok(results.iter().map(|r| r.share_id.clone()).collect())
}

/// The policy's form of a claims-API claim.
pub fn to_request(spec: ClaimSpec) -> ClaimRequest {
    let ask = match spec.ask {
        ClaimAsk::Results(results) => Ask::Named(
            results
                .into_iter()
                .map(|r| NamedResult {
                    request: r.request,
                    pool: r.pool,
                    device: r.device,
                })
                .collect(),
        ),
        ClaimAsk::Count(asks) => Ask::Count(
            asks.into_iter()
                .map(|a| CountRequest {
                    request: a.request,
                    count: a.count,
                    family: Some(match a.family {
                        Family::Exclusive => FamilyKind::Exclusive,
                        Family::Shared => FamilyKind::Shared,
                        Family::Sliced => FamilyKind::Sliced,
                        Family::Custom(name) => FamilyKind::Custom(name),
                    }),
                    selector: DeviceSelector {
                        vendor: a.selector.vendor,
                        model: a.selector.model,
                        pci_id: a.selector.pci_id,
                        ids: a.selector.device_ids,
                    },
                    profile: a.profile,
                    shares: a.shares,
                })
                .collect(),
        ),
    };
    ClaimRequest {
        uid: spec.uid,
        namespace: spec.namespace,
        name: spec.name,
        ask,
    }
}

#[async_trait]
impl ClaimService for ClaimsFacade {
    async fn prepare(&self, claims: Vec<ClaimSpec>) -> PrepareResults {
        let engine = self.agent.engine();
        let metrics = &self.metrics;
        let work = claims.into_iter().map(|mut spec| async move {
            let uid = spec.uid.clone();
            let started = std::time::Instant::now();
            let share_ids = match check_results(engine, &spec) {
                Ok(s) => s,
                Err(e) => {
                    metrics.record_prepare(Outcome::Error, started.elapsed());
                    tracing::warn!(claim = %uid, error = %e, "claim not prepared");
                    return (uid, Err(e));
                }
            };
            let env = std::mem::take(&mut spec.env);
            let result = engine
                .prepare_admitted(to_request(spec), env, || self.admitted())
                .await;
            let outcome = if result.is_ok() { Outcome::Ok } else { Outcome::Error };
            metrics.record_prepare(outcome, started.elapsed());
            let answer = match result {
                Ok(p) => {
                    tracing::info!(claim = %uid, already = p.already, devices = p.devices.len(), "claim prepared");
                    Ok(p.devices
                        .into_iter()
                        .enumerate()
                        .map(|(i, d)| PreparedDevice {
                            cdi_device_ids: d.cdi_ids(),
                            request_names: vec![d.request],
                            pool: d.pool,
                            device: d.device,
                            share_id: share_ids.get(i).cloned().flatten(),
                        })
                        .collect())
                }
                Err(e) => {
                    tracing::warn!(claim = %uid, error = %e, "claim not prepared");
                    Err(e.to_string())
                }
            };
            (uid, answer)
        });
        futures::future::join_all(work).await.into_iter().collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let (agent, engine) = (&self.agent, self.agent.engine());
        let metrics = &self.metrics;
        let work = claims.into_iter().map(|c| async move {
            let started = std::time::Instant::now();
            // Never under running containers: the device would go to the next claim while they
            // still hold it (docs/claims-api.md, "Unprepare").
            let result = engine
                .unprepare_unused(
                    &c.uid,
                    ClaimName::new(&c.namespace, &c.name),
                    || self.admitted(),
                    || agent.users_of(&c.uid),
                )
                .await
                .map_err(|e| e.to_string());
            let outcome = if result.is_ok() {
                Outcome::Ok
            } else {
                Outcome::Error
            };
            metrics.record_unprepare(outcome, started.elapsed());
            match &result {
                Ok(()) => tracing::info!(claim = %c.uid, "claim unprepared"),
                Err(e) => tracing::warn!(claim = %c.uid, error = %e, "claim not unprepared"),
            }
            (c.uid, result)
        });
        futures::future::join_all(work).await.into_iter().collect()
    }

    async fn list(&self) -> Vec<ClaimInfo> {
        let engine = self.agent.engine();
        engine
            .claims()
            .into_iter()
            .map(|(a, origin)| {
                let ids = engine
                    .spec_store()
                    .device_ids(&a.claim_uid, a.results.len())
                    .unwrap_or_default();
                let state = match origin {
                    Origin::Adopted { .. } => ClaimState::Adopted,
                    _ => ClaimState::Prepared,
                };
                ClaimInfo {
                    uid: a.claim_uid.clone(),
                    namespace: a.namespace.clone(),
                    name: a.name.clone(),
                    state,
                    devices: a
                        .results
                        .iter()
                        .zip(ids)
                        .map(|(g, id)| PreparedDevice {
                            request_names: vec![g.request.clone()],
                            pool: g.pool.clone(),
                            device: g.device.clone(),
                            cdi_device_ids: vec![id],
                            share_id: None,
                        })
                        .collect(),
                }
            })
            .collect()
    }

    async fn status(&self, gate_open: bool) -> String {
        self.agent.status(gate_open)
    }
}

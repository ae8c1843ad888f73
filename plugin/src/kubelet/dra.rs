//! The kubelet's DRA plugin service: `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and, for older
//! kubelets, `...dra.v1beta1.DRAPlugin` (the same calls without `Device.share_id`).
//!
//! The kubelet sends only the claims' identities. NodePrepareResources reads each claim's
//! allocation through a [`ClaimSource`] (the API server in the daemon), checks that every result
//! is this driver's, on this node's pool, of a device this node publishes, and prepares exactly
//! those devices through the claims API's results path (`daemon::ClaimsFacade`): the engine stays the
//! one place that allocates, commits and grants. NodeUnprepareResources needs nothing but the
//! engine's own record, so it works while the API server is down and for deleted claims.
//!
//! Every claim gets its own answer in a map keyed by UID; a gRPC error is only for the whole
//! call: the NRI gate closed (UNAVAILABLE, the kubelet retries), too many claims or a request
//! over the size limit. The work of a call runs in a task of its own, so a kubelet that gives up
//! (its timeout is 45 s) never leaves a prepare half-way.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubelet_proto::dra_v1 as v1;
use kubelet_proto::dra_v1beta1 as v1beta1;

use crate::claims_api::{
    ClaimAsk, ClaimRef, ClaimService, ClaimSpec, DraResult, PreparedDevice, check_uid,
};
use crate::engine::{Engine, RequestEnv};
use crate::gate::Gate;
use crate::metadata::{
    AttributeSource, ClaimMetadata, MetadataDevice, MetadataWriter, RequestMetadata,
};

/// Most claims one call may name (a pod's claims; the kubelet sends one pod's at a time).
pub const MAX_CLAIMS: usize = 128;
/// Largest request accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Most allocation results a claim may hold (the resource.k8s.io API's own limit).
pub const MAX_RESULTS: usize = 32;
/// How long reading one claim's allocation may take before that claim fails (the kubelet's
/// whole call times out after 45 s and retries).
pub const SOURCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Where NodePrepareResources reads a claim's allocation: the API server in the daemon, an
/// in-process fake in tests.
#[async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    /// The allocation results of `claim` for this driver, as the ResourceClaim's status has them
    /// (`pool` is the DRA pool, `device` the published device name, `share_id` set on a shared
    /// device), or one sentence naming the claim that says why it cannot be prepared: not found,
    /// another UID, not allocated, the API server unreachable.
    async fn allocation(&self, claim: &ClaimRef) -> Result<AllocatedClaim, String>;
}

/// Told what the DRA service prepared and unprepared, after the engine answered (the daemon writes
/// each claim's per-device status, KEP-4817, from it). Must return at once: it runs inside the
/// kubelet's call.
pub trait PrepareObserver: Send + Sync + 'static {
    /// `claim` was prepared (or found prepared) with `devices`, as the kubelet is answered.
    fn prepared(&self, claim: &ClaimRef, devices: &[PreparedDevice]);
    /// `claim` was unprepared (or was not held).
    fn unprepared(&self, claim: &ClaimRef);
}

/// A claim's allocation for this driver as a [`ClaimSource`] reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocatedClaim {
    /// The allocation results for this driver, in the claim's order.
    pub results: Vec<DraResult>,
    /// What the claim's opaque configuration sets in the environment of the containers using
    /// each request's devices (empty without configuration).
    pub env: RequestEnv,
    /// The pod's name for the claim when it was made from a ResourceClaimTemplate (the claim's
    /// `resource.kubernetes.io/pod-claim-name` annotation): its device metadata goes under
    /// `resourceclaimtemplates/<this name>` in the container.
    pub pod_claim_name: Option<String>,
}

/// Who this DRA driver is on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraSettings {
    /// The driver name (`dra.driver_name`); results of other drivers are refused.
    pub driver: String,
    /// This node's DRA pool (the pool the ResourceSlices are published under).
    pub pool: String,
}

/// Why a whole call is refused. Everything else is answered per claim.
#[derive(Debug, thiserror::Error)]
pub enum DraCallError {
    /// The NRI gate is closed: the runtime has not synchronized, so running containers have not
    /// reached the policy yet.
    #[error(
        "nri-accel is waiting for the container runtime's Synchronize (the NRI gate is closed); the kubelet retries"
    )]
    GateClosed,
    /// The call names more claims than one call may.
    #[error("the call names {count} claims, more than the {max} nri-accel takes in one call")]
    TooManyClaims {
        /// Claims named.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The task doing the call's work failed (a bug: it is logged).
    #[error("the call's work stopped unexpectedly: {0}")]
    Internal(String),
}

impl From<DraCallError> for tonic::Status {
    fn from(e: DraCallError) -> Self {
        match e {
            DraCallError::GateClosed => tonic::Status::unavailable(e.to_string()),
            DraCallError::TooManyClaims { .. } => tonic::Status::invalid_argument(e.to_string()),
            DraCallError::Internal(_) => tonic::Status::internal(e.to_string()),
        }
    }
}

/// Claim UID -> the devices prepared for it, or the one-sentence reason it was not.
pub type PreparedClaims = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;
/// Claim UID -> released, or the reason it was not.
pub type UnpreparedClaims = BTreeMap<String, Result<(), String>>;

/// The DRA service: one implementation behind the v1 and v1beta1 wrappers ([`DraV1`],
/// [`DraV1beta1`]). Cheap to clone.
#[derive(Clone)]
pub struct DraService {
    inner: Arc<Inner>,
}

struct Inner {
    settings: DraSettings,
    gate: Gate,
    engine: Arc<Engine>,
    claims: Arc<dyn ClaimService>,
    source: Arc<dyn ClaimSource>,
    /// Published device name -> the policy pool that publishes it (the engine's pool name).
    published: HashMap<String, String>,
    /// Told what was prepared and unprepared, once set.
    observer: std::sync::OnceLock<Arc<dyn PrepareObserver>>,
    /// Where each prepared request's device metadata (KEP-5304) is staged, once set.
    metadata: std::sync::OnceLock<DeviceMetadata>,
}

/// The device metadata writer the engine writes through, and the published attributes.
struct DeviceMetadata {
    writer: Arc<MetadataWriter>,
    attributes: Arc<dyn AttributeSource>,
}

impl DraService {
    /// The service: `claims` is the claims API's view of `engine` (the daemon's
    /// [`crate::daemon::ClaimsFacade`]), whose results path prepares what the claims' allocations
    /// name; it answers only while `gate` is open.
    pub fn new(
        settings: DraSettings,
        claims: Arc<dyn ClaimService>,
        engine: Arc<Engine>,
        gate: Gate,
        source: Arc<dyn ClaimSource>,
    ) -> Self {
        let published = engine.with_node(|n| {
            n.published()
                .into_iter()
                .map(|p| (p.name, p.pool))
                .collect()
        });
        DraService {
            inner: Arc::new(Inner {
                settings,
                gate,
                engine,
                claims,
                source,
                published,
                observer: std::sync::OnceLock::new(),
                metadata: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Tells `observer` what each later call prepared and unprepared. Only the first observer
    /// set is kept.
    pub fn set_observer(&self, observer: Arc<dyn PrepareObserver>) {
        let _ = self.inner.observer.set(observer);
    }

    /// Writes the KEP-5304 device metadata of each claim this service prepares: staged in
    /// `writer`, which must be the engine's [`crate::engine::ClaimFiles`], with each device's
    /// attributes from `attributes`. Only the first call counts.
    pub fn set_metadata(&self, writer: Arc<MetadataWriter>, attributes: Arc<dyn AttributeSource>) {
        let _ = self
            .inner
            .metadata
            .set(DeviceMetadata { writer, attributes });
    }

    /// Who this driver is.
    pub fn settings(&self) -> &DraSettings {
        &self.inner.settings
    }

    /// NodePrepareResources: every claim named gets an answer.
    pub async fn prepare(&self, claims: Vec<ClaimRef>) -> Result<PreparedClaims, DraCallError> {
        self.admit(claims.len())?;
        let inner = self.inner.clone();
        finish(tokio::spawn(async move { inner.prepare(claims).await })).await
    }

    /// NodeUnprepareResources: every claim named gets an answer; an unknown claim is success.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> Result<UnpreparedClaims, DraCallError> {
        self.admit(claims.len())?;
        let inner = self.inner.clone();
        finish(tokio::spawn(async move { inner.unprepare(claims).await })).await
    }

    fn admit(&self, count: usize) -> Result<(), DraCallError> {
        if !self.inner.gate.is_open() {
            return Err(DraCallError::GateClosed);
        }
        if count > MAX_CLAIMS {
            return Err(DraCallError::TooManyClaims {
                count,
                max: MAX_CLAIMS,
            });
        }
        Ok(())
    }

    /// The v1 gRPC service, bounded in request size.
    pub fn v1_server(&self) -> v1::dra_plugin_server::DraPluginServer<DraV1> {
        v1::dra_plugin_server::DraPluginServer::new(DraV1(self.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The v1beta1 gRPC service, bounded in request size.
    pub fn v1beta1_server(&self) -> v1beta1::dra_plugin_server::DraPluginServer<DraV1beta1> {
        v1beta1::dra_plugin_server::DraPluginServer::new(DraV1beta1(self.clone()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// Waits for a call's task; it keeps running when the caller goes away.
async fn finish<T>(task: tokio::task::JoinHandle<T>) -> Result<T, DraCallError> {
    task.await.map_err(|e| {
        tracing::error!(error = %e, "a DRA call's task failed");
        DraCallError::Internal(e.to_string())
    })
}

impl Inner {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PreparedClaims {
        let mut answers = PreparedClaims::new();
        let mut unique = Vec::with_capacity(claims.len());
        for c in claims {
            // The same UID twice in one call is one claim.
            if !unique.iter().any(|u: &ClaimRef| u.uid == c.uid) {
                unique.push(c);
            }
        }
        let looked_up = futures::future::join_all(unique.iter().map(|c| self.ask(c))).await;
        let mut specs = Vec::new();
        let mut asked = BTreeSet::new();
        let mut staged = Vec::new();
        for (c, a) in unique.iter().zip(looked_up) {
            match a {
                Ok((spec, metadata)) => {
                    specs.push(spec);
                    asked.insert(c.uid.clone());
                    if let (Some(m), Some(md)) = (metadata, self.metadata.get()) {
                        md.writer.stage(m);
                        staged.push(c.uid.clone());
                    }
                }
                Err(e) => {
                    tracing::warn!(claim = %c.uid, namespace = %c.namespace, name = %c.name, error = %e, "claim not prepared");
                    answers.insert(c.uid.clone(), Err(e));
                }
            }
        }
        if !specs.is_empty() {
            for (uid, answer) in self.claims.prepare(specs).await {
                asked.remove(&uid);
                answers.insert(uid, answer.map(|d| self.answer(d)));
            }
        }
        if let Some(md) = self.metadata.get() {
            for uid in &staged {
                md.writer.unstage(uid);
            }
        }
        for uid in asked {
            answers.insert(
                uid.clone(),
                Err(format!(
                    "claim {uid} was left unanswered by the engine; retry"
                )),
            );
        }
        if let Some(o) = self.observer.get() {
            for c in &unique {
                if let Some(Ok(devices)) = answers.get(&c.uid) {
                    o.prepared(c, devices);
                }
            }
        }
        answers
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnpreparedClaims {
        let mut answers = UnpreparedClaims::new();
        let mut valid = Vec::new();
        for c in claims {
            match check_uid(&c.uid) {
                Ok(()) => valid.push(c),
                Err(e) => {
                    answers.insert(c.uid, Err(e));
                }
            }
        }
        if !valid.is_empty() {
            answers.extend(self.claims.unprepare(valid.clone()).await);
        }
        if let Some(o) = self.observer.get() {
            for c in &valid {
                if matches!(answers.get(&c.uid), Some(Ok(()))) {
                    o.unprepared(c);
                }
            }
        }
        answers
    }

    /// What the engine is asked to prepare for `c`. A claim the engine already holds (a repeat:
    /// the kubelet retries, or re-prepares every claim after it restarts) is asked for with the
    /// held devices, which answers the same CDI IDs without reading the API server: an
    /// allocation never changes under one UID, and the first prepare checked it. A claim holding
    /// shares is read again, as the record does not keep the share IDs the answer carries; when
    /// that read fails, it too is answered from the record (without them).
    ///
    /// A claim read from the source also comes with its device metadata to stage (when
    /// metadata is written): the engine writes it only when it grants the claim afresh.
    async fn ask(&self, c: &ClaimRef) -> Result<(ClaimSpec, Option<ClaimMetadata>), String> {
        check_uid(&c.uid)?;
        check_claim_name(c)?;
        if let Some((spec, false)) = self.held(c) {
            return Ok((spec, None));
        }
        let read = tokio::time::timeout(SOURCE_TIMEOUT, self.source.allocation(c))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "claim {}/{}: its allocation could not be read within {} s; the kubelet retries",
                    c.namespace,
                    c.name,
                    SOURCE_TIMEOUT.as_secs()
                ))
            });
        let read = match read {
            Ok(read) => read,
            // Held meanwhile (a concurrent call prepared it): answered from the record.
            Err(e) => return self.held(c).map(|(spec, _)| (spec, None)).ok_or(e),
        };
        let spec = ClaimSpec {
            env: read.env.clone(),
            ..spec(c, self.engine_results(c, &read.results)?)
        };
        Ok((spec, self.metadata_of(c, &read)))
    }

    /// What the device metadata files of claim `c` say, from its allocation (in the claim's
    /// terms: the DRA pool and published names) and the devices' published attributes.
    fn metadata_of(&self, c: &ClaimRef, read: &AllocatedClaim) -> Option<ClaimMetadata> {
        let md = self.metadata.get()?;
        let mut requests: Vec<RequestMetadata> = Vec::new();
        for r in &read.results {
            let device = MetadataDevice {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                name: r.device.clone(),
                attributes: md.attributes.attributes(&r.device).unwrap_or_default(),
            };
            match requests.iter_mut().find(|q| q.name == r.request) {
                Some(q) => q.devices.push(device),
                None => requests.push(RequestMetadata {
                    name: r.request.clone(),
                    devices: vec![device],
                }),
            }
        }
        Some(ClaimMetadata {
            driver: self.settings.driver.clone(),
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
            pod_claim_name: read.pod_claim_name.clone(),
            requests,
        })
    }

    /// The claim as the engine holds it, if it does, and whether it holds a share of a shared
    /// device (whose share ID the record does not keep).
    fn held(&self, c: &ClaimRef) -> Option<(ClaimSpec, bool)> {
        let driver = &self.settings.driver;
        let (results, shares) = self.engine.with_node(|n| {
            n.allocation(&c.uid).map(|a| {
                let results: Vec<DraResult> = a
                    .results
                    .iter()
                    .map(|g| DraResult {
                        request: g.request.clone(),
                        driver: driver.clone(),
                        pool: g.pool.clone(),
                        device: g.device.clone(),
                        share_id: None,
                    })
                    .collect();
                let shares = a
                    .results
                    .iter()
                    .any(|g| matches!(g.unit, policies::Unit::Share { .. }));
                (results, shares)
            })
        })?;
        tracing::debug!(claim = %c.uid, "claim already prepared; answered from the node's record");
        Some((spec(c, results), shares))
    }

    /// The claim's results as the engine's results path takes them (the pool of each is the
    /// policy pool publishing the device). Refuses, naming the claim: no results, too many,
    /// another driver's, another pool's, a device this node does not publish.
    fn engine_results(
        &self,
        c: &ClaimRef,
        results: &[DraResult],
    ) -> Result<Vec<DraResult>, String> {
        let DraSettings { driver, pool } = &self.settings;
        let claim = format!("{}/{}", c.namespace, c.name);
        if results.is_empty() {
            return Err(format!(
                "claim {claim} has no allocation results for driver {driver}"
            ));
        }
        if results.len() > MAX_RESULTS {
            return Err(format!(
                "claim {claim} holds {} allocation results, more than the {MAX_RESULTS} the API allows",
                results.len()
            ));
        }
        results
            .iter()
            .map(|r| {
                if r.driver != *driver {
                    return Err(format!(
                        "claim {claim}: device {} of request {} belongs to driver {}, not {driver}; nri-accel prepares only its own driver's results",
                        r.device, r.request, r.driver
                    ));
                }
                if r.pool != *pool {
                    return Err(format!(
                        "claim {claim} was allocated device {} of pool {}, which is not this node's pool {pool}",
                        r.device, r.pool
                    ));
                }
                let Some(policy_pool) = self.published.get(&r.device) else {
                    return Err(format!(
                        "claim {claim} was allocated device {}, which this node does not publish",
                        r.device
                    ));
                };
                Ok(DraResult {
                    pool: policy_pool.clone(),
                    ..r.clone()
                })
            })
            .collect()
    }

    /// The engine's answer in the claim's terms: the DRA pool (the results path answers each
    /// result's share ID back itself).
    fn answer(&self, devices: Vec<PreparedDevice>) -> Vec<PreparedDevice> {
        devices
            .into_iter()
            .map(|d| PreparedDevice {
                pool: self.settings.pool.clone(),
                ..d
            })
            .collect()
    }
}

fn spec(c: &ClaimRef, results: Vec<DraResult>) -> ClaimSpec {
    ClaimSpec {
        uid: c.uid.clone(),
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        ask: ClaimAsk::Results(results),
        env: RequestEnv::new(),
    }
}

/// A ResourceClaim's namespace is a DNS label and its name a DNS subdomain; anything else cannot
/// name a claim and is refused before the API server is asked.
fn check_claim_name(c: &ClaimRef) -> Result<(), String> {
    let shown = |v: &str| v.chars().take(64).collect::<String>();
    if !is_dns_label(&c.namespace) {
        return Err(format!(
            "claim {}: namespace {:?} is not a DNS label (lower-case letters, digits and '-', at most 63)",
            c.uid,
            shown(&c.namespace)
        ));
    }
    if !is_dns_subdomain(&c.name) {
        return Err(format!(
            "claim {}: name {:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253)",
            c.uid,
            shown(&c.name)
        ));
    }
    Ok(())
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    b.len() <= 63
        && edge(b.first())
        && edge(b.last())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn refs<C>(claims: Vec<C>, parts: impl Fn(C) -> (String, String, String)) -> Vec<ClaimRef> {
    claims
        .into_iter()
        .map(|c| {
            let (namespace, uid, name) = parts(c);
            ClaimRef {
                uid,
                namespace,
                name,
            }
        })
        .collect()
}

/// Declares the gRPC service of one DRA API version over [`DraService`]: the versions differ only
/// in their generated types and in `Device.share_id` (v1 only), named by the optional last part.
macro_rules! dra_version {
    ($(#[$doc:meta])* $name:ident, $pb:ident $(, $share:ident)?) => {
        $(#[$doc])*
        pub struct $name(DraService);

        #[tonic::async_trait]
        impl $pb::dra_plugin_server::DraPlugin for $name {
            async fn node_prepare_resources(
                &self,
                req: tonic::Request<$pb::NodePrepareResourcesRequest>,
            ) -> Result<tonic::Response<$pb::NodePrepareResourcesResponse>, tonic::Status> {
                let claims = refs(req.into_inner().claims, |c| (c.namespace, c.uid, c.name));
                let claims = self
                    .0
                    .prepare(claims)
                    .await?
                    .into_iter()
                    .map(|(uid, answer)| {
                        let (devices, error) = match answer {
                            Ok(devices) => (devices, String::new()),
                            Err(e) => (Vec::new(), e),
                        };
                        let devices = devices
                            .into_iter()
                            .map(|d| $pb::Device {
                                request_names: d.request_names,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_device_ids,
                                $($share: d.share_id,)?
                            })
                            .collect();
                        (uid, $pb::NodePrepareResourceResponse { devices, error })
                    })
                    .collect();
                Ok(tonic::Response::new($pb::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                req: tonic::Request<$pb::NodeUnprepareResourcesRequest>,
            ) -> Result<tonic::Response<$pb::NodeUnprepareResourcesResponse>, tonic::Status> {
                let claims = refs(req.into_inner().claims, |c| (c.namespace, c.uid, c.name));
                let claims = self
                    .0
                    .unprepare(claims)
                    .await?
                    .into_iter()
                    .map(|(uid, r)| {
                        let error = r.err().unwrap_or_default();
                        (uid, $pb::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(tonic::Response::new($pb::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_version!(
    /// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`.
    DraV1, v1, share_id
);
dra_version!(
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin` (no share IDs in its answers).
    DraV1beta1, v1beta1
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_must_be_dns_names() {
        let c = |namespace: &str, name: &str| ClaimRef {
            uid: "u".into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        assert!(check_claim_name(&c("default", "gpu-claim.a1")).is_ok());
        for (ns, name) in [
            ("Default", "c"),
            ("", "c"),
            ("ns", ""),
            ("ns", "../etc"),
            ("ns", "c/d"),
            ("-ns", "c"),
            ("ns", "c."),
        ] {
            let e = check_claim_name(&c(ns, name)).unwrap_err();
            assert!(e.starts_with("claim u: "), "{e}");
        }
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain(&format!("{}.b", "a".repeat(63))));
    }

    #[test]
    fn whole_call_errors_map_to_the_kubelets_codes() {
        let s: tonic::Status = DraCallError::GateClosed.into();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        let s: tonic::Status = DraCallError::TooManyClaims {
            count: 200,
            max: 128,
        }
        .into();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().contains("200"), "{}", s.message());
    }
}

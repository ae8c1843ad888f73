//! Plain Rust domain types of the claims API and the [`ClaimService`] trait the engine implements.
//!
//! Nothing here depends on the generated protobuf types: the conversion lives in `convert.rs`, so
//! the engine never sees the wire format.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::engine::RequestEnv;

/// A claim to prepare: who it is and what it asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimSpec {
    /// Claim UID; validated by the API before the engine sees it (safe in a file name).
    pub uid: String,
    /// Namespace of the ResourceClaim (may be empty for claims outside Kubernetes).
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
    /// What the claim asks for.
    pub ask: ClaimAsk,
    /// Environment per request name for the containers using its devices: the claim's opaque
    /// configuration on the kubelet's path. The claims API's wire form has none (empty).
    #[serde(default, skip_serializing_if = "RequestEnv::is_empty")]
    pub env: RequestEnv,
}

/// What a claim asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimAsk {
    /// The DRA allocation results for this driver: the devices are already chosen.
    Results(Vec<DraResult>),
    /// Counts and selectors per request name: the policy chooses.
    Count(Vec<CountAsk>),
}

/// One DRA allocation result (resource.k8s.io DeviceRequestAllocationResult).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraResult {
    /// Name of the request in the claim this result satisfies.
    pub request: String,
    /// DRA driver that published the device.
    pub driver: String,
    /// Pool the device belongs to.
    pub pool: String,
    /// Published name of the device in the pool.
    pub device: String,
    /// Share identifier when the device allows multiple allocations.
    pub share_id: Option<String>,
}

/// Device family a count request draws from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// A whole device per unit.
    Exclusive,
    /// A time-sliced replica of a device per unit.
    Shared,
    /// A slice of a device (by profile) per unit.
    Sliced,
    /// The units of a policy an author registered, by its name (`kind: custom` pools).
    Custom(String),
}

/// A request for `count` units chosen by the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountAsk {
    /// Request name, reported back in [`PreparedDevice::request_names`].
    pub request: String,
    /// How many units.
    pub count: u32,
    /// Family to draw from.
    pub family: Family,
    /// Which devices qualify.
    pub selector: Selector,
    /// Slice profile (sliced family only).
    pub profile: Option<String>,
    /// Replicas per unit (shared family only); `None` means one.
    pub shares: Option<u32>,
}

/// Device selector; `None` or empty fields match anything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selector {
    /// Vendor name or PCI vendor id.
    pub vendor: Option<String>,
    /// Model name.
    pub model: Option<String>,
    /// PCI id `vvvv:dddd`.
    pub pci_id: Option<String>,
    /// Explicit device ids; when non-empty only these qualify.
    pub device_ids: Vec<String>,
}

/// A claim to release.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    /// Claim UID (validated by the API).
    pub uid: String,
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
}

/// One granted device, as kubelet's DRA `Device` message reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests this device satisfies.
    pub request_names: Vec<String>,
    /// Pool the device belongs to.
    pub pool: String,
    /// Published device name.
    pub device: String,
    /// Fully qualified CDI device ids (`vendor/class=name`).
    pub cdi_device_ids: Vec<String>,
    /// Share identifier when the device is shared.
    pub share_id: Option<String>,
}

/// Where a held claim stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimState {
    /// Record committed, no CDI spec yet: being prepared, or to be rolled back.
    HalfPrepared,
    /// Record committed and CDI spec written.
    Prepared,
    /// Devices of a running container found without a record; held until the container goes.
    Adopted,
}

/// A claim the node holds, for `List`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    /// Claim UID.
    pub uid: String,
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// Where the claim stands.
    pub state: ClaimState,
    /// Devices held, with their CDI ids.
    pub devices: Vec<PreparedDevice>,
}

/// The answer to Prepare: claim UID -> granted devices or a one-sentence refusal.
pub type PrepareResults = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;

/// The answer to Unprepare: claim UID -> released, or why not.
pub type UnprepareResults = BTreeMap<String, Result<(), String>>;

/// What the claims API asks of the claim engine.
///
/// The API has already checked the caller's credentials, the gate, the request size and every claim
/// UID; the engine gets only claims that passed. Both `prepare` and `unprepare` must be idempotent
/// per claim UID (kubelet repeats them) and should answer every claim they were given; a claim the
/// engine leaves out is answered with an error by the API.
///
/// `list` and `status` are also called while the gate is closed (during startup), so they must
/// not wait for it.
#[async_trait]
pub trait ClaimService: Send + Sync + 'static {
    /// Prepares each claim; already prepared claims get the same devices again.
    async fn prepare(&self, claims: Vec<ClaimSpec>) -> PrepareResults;
    /// Releases each claim; an unknown claim is success.
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults;
    /// The claims held now.
    async fn list(&self) -> Vec<ClaimInfo>;
    /// The status document `nri-accel status --json` prints, as JSON text: an object whose
    /// `gate` member is `{"open": gate_open}` (the gate as the API sees it). Text rather than a
    /// `serde_json::Value` so a document of megabytes is never held as a tree.
    async fn status(&self, gate_open: bool) -> String;
}

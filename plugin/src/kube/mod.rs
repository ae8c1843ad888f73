//! The API server half of the Kubernetes DRA driver: reading ResourceClaims, publishing the
//! node's devices as ResourceSlices, and removing them again.
//!
//! The API server is reached only through the [`KubeApi`] trait: [`KubeClient`] is the real
//! kube-rs client, and tests point it at the in-process server of the `kube-sim` crate.
//! What is published is a pure function of the inventory ([`slices`]); the [`publisher`] owns
//! the loop that writes it, retries while the server is away and reads back what was stored.
//! [`claims`] turns a fetched claim into what the engine prepares. docs/dra.md is the operator's
//! side of all this.

pub mod attributes;
mod claim_source;
pub mod claim_status;
pub mod claims;
pub mod cleanup;
mod client;
mod error;
pub mod opaque;
pub mod publisher;
mod side;
pub mod slices;
pub mod topology;

use async_trait::async_trait;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

pub use attributes::{SliceAttributes, published_attributes};
pub use claim_source::ApiServerClaims;
pub use claim_status::{ClaimStatusReport, ClaimStatusWriter, PreparedStatus};
pub use claims::{ClaimAllocation, ClaimError, allocation_for};
pub use client::{DEFAULT_CALL_TIMEOUT, KubeClient};
pub use error::KubeError;
pub use publisher::{Publisher, PublisherHandle, PublisherStatus};
pub use side::{KubeSide, source_of};

/// The field manager named on every write, so `kubectl get -o yaml --show-managed-fields`
/// shows which fields are ours.
pub const FIELD_MANAGER: &str = "nri-accel";

/// A change to one of the node's ResourceSlices, as a watch reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum SliceEvent {
    /// The slice was created or changed; this is it now.
    Applied(ResourceSlice),
    /// The slice was deleted; this is it as it was (with the deletion's resourceVersion).
    Deleted(ResourceSlice),
    /// Nothing changed up to this resourceVersion (a watch resumes from it).
    Bookmark(String),
}

/// The events of one watch, until the server ends it. An `Err` ends it too:
/// [`KubeError::Expired`] means the resourceVersion is too old and the slices must be listed
/// again.
pub type SliceEvents = BoxStream<'static, Result<SliceEvent, KubeError>>;

/// The API server calls the DRA driver makes. Implemented by [`KubeClient`]; tests run it
/// against the `kube-sim` API server.
#[async_trait]
pub trait KubeApi: Send + Sync + 'static {
    /// The ResourceClaim `namespace/name` as the API server has it.
    async fn resource_claim(&self, namespace: &str, name: &str)
    -> Result<ResourceClaim, KubeError>;

    /// The Node `name` (its UID makes it the owner of the node's ResourceSlices).
    async fn node(&self, name: &str) -> Result<Node, KubeError>;

    /// The ResourceSlices of `driver` on node `node` (a field selector on `spec.driver` and
    /// `spec.nodeName`).
    async fn list_slices(&self, driver: &str, node: &str) -> Result<Vec<ResourceSlice>, KubeError>;

    /// The same list and its resourceVersion, where a watch of the slices starts.
    async fn list_slices_versioned(
        &self,
        driver: &str,
        node: &str,
    ) -> Result<(Vec<ResourceSlice>, String), KubeError>;

    /// Watches the ResourceSlices of `driver` on `node` from `resource_version` on. Resolves
    /// once the server accepted the watch; the stream ends when the server ends it (it does
    /// after a few minutes) or the connection is lost.
    async fn watch_slices(
        &self,
        driver: &str,
        node: &str,
        resource_version: &str,
    ) -> Result<SliceEvents, KubeError>;

    /// Creates a ResourceSlice and returns it as stored. `dry_run` stores nothing: the answer
    /// shows what the server would keep (fields of gates that are off are gone).
    async fn create_slice(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, KubeError>;

    /// Replaces a ResourceSlice; its `metadata.resourceVersion` must be the stored one (else
    /// [`KubeError::Conflict`]). Returns it as stored.
    async fn replace_slice(&self, slice: &ResourceSlice) -> Result<ResourceSlice, KubeError>;

    /// Deletes a ResourceSlice if it is still at `resource_version`.
    async fn delete_slice(&self, name: &str, resource_version: &str) -> Result<(), KubeError>;

    /// Server-side applies, as [`FIELD_MANAGER`], `devices` (resource.k8s.io/v1
    /// AllocatedDeviceStatus objects as JSON) as this driver's entries of the `status.devices` of
    /// ResourceClaim `namespace/name`, which must still have UID `uid` (else
    /// [`KubeError::Conflict`] or [`KubeError::NotFound`]). An empty `devices` removes every entry
    /// written before. Returns the claim's `status.devices` as stored.
    async fn apply_claim_device_status(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        devices: &[serde_json::Value],
    ) -> Result<Vec<serde_json::Value>, KubeError> {
        let _ = (uid, devices);
        Err(KubeError::Other {
            what: format!("ResourceClaim {namespace}/{name}"),
            message: "this API client cannot write a claim's status".into(),
        })
    }
}

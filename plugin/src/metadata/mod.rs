//! KEP-5304 device metadata: for each prepared DRA request, a `DeviceMetadata` file
//! (`metadata.resource.k8s.io/v1alpha1`) naming the request's devices with the attributes their
//! ResourceSlice publishes, mounted into the containers that use the request at the path
//! Kubernetes' `k8s.io/dynamic-resource-allocation` reads it from (docs/dra.md, "Device
//! metadata").
//!
//! The module is a room of its own beside `cdi`: [`mod@file`] is the document and its paths (pure),
//! [`store`] the files on the host (durable, listed and removed per claim UID), and
//! [`MetadataWriter`] ties them to the claim engine through [`crate::engine::ClaimFiles`]: a
//! door stages what a claim's files say ([`MetadataWriter::stage`]), and the engine writes them
//! right before the claim's CDI spec, mounts them through that spec, and removes them after the
//! spec. Any door that prepares DRA claims (nri-accel's own DRA driver, and the VM passthrough
//! pools of issue 36, whose devices carry `resource.kubernetes.io/pciBusID` and their IOMMU
//! group) reuses it by staging a [`ClaimMetadata`].

pub mod file;
pub mod store;
mod writer;

pub use file::{
    API_VERSION, CONTAINER_DIR, ClaimMetadata, DeviceMetadata, FILE_SUFFIX, KIND, MetadataDevice,
    POD_CLAIM_NAME_ANNOTATION, RESOURCE_CLAIM_TEMPLATES_SUBDIR, RESOURCE_CLAIMS_SUBDIR,
    RequestMetadata, base_request, container_path,
};
pub use store::{MetadataError, MetadataMount, MetadataStore};
pub use writer::{AttributeSource, MetadataWriter};

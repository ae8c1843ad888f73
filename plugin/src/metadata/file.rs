//! The `DeviceMetadata` document (`metadata.resource.k8s.io/v1alpha1`, KEP-5304) and where it
//! lives in a container. Field names, the group and version, the container directory layout and
//! the pod claim name annotation are Kubernetes' (`k8s.io/dynamic-resource-allocation`
//! `api/metadata`, v0.37); the decoder there reads a stream of such documents, one per API
//! version, and nri-accel writes the one version it knows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The document's `apiVersion`.
pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// The document's `kind`.
pub const KIND: &str = "DeviceMetadata";
/// The directory in a container under which every claim's metadata lies.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// Subdirectory of [`CONTAINER_DIR`] for claims the pod names directly.
pub const RESOURCE_CLAIMS_SUBDIR: &str = "resourceclaims";
/// Subdirectory of [`CONTAINER_DIR`] for claims made from a ResourceClaimTemplate, by the
/// pod's name for the claim.
pub const RESOURCE_CLAIM_TEMPLATES_SUBDIR: &str = "resourceclaimtemplates";
/// Appended to the driver name to name the file: `<driver>-metadata.json`.
pub const FILE_SUFFIX: &str = "-metadata.json";
/// The annotation the ResourceClaim controller puts on a claim made from a template: the pod's
/// name for the claim (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// The request a DRA result names without its subrequest (`gpu/large` -> `gpu`): the directory
/// of a request's file.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// Where a container reads the file of `request` (its base name is used) of a claim: under
/// [`RESOURCE_CLAIM_TEMPLATES_SUBDIR`] by `pod_claim_name` for a claim made from a template,
/// else under [`RESOURCE_CLAIMS_SUBDIR`] by the claim's name.
pub fn container_path(
    driver: &str,
    claim_name: &str,
    pod_claim_name: Option<&str>,
    request: &str,
) -> String {
    let (sub, name) = match pod_claim_name {
        Some(p) => (RESOURCE_CLAIM_TEMPLATES_SUBDIR, p),
        None => (RESOURCE_CLAIMS_SUBDIR, claim_name),
    };
    format!(
        "{CONTAINER_DIR}/{sub}/{name}/{}/{driver}{FILE_SUFFIX}",
        base_request(request)
    )
}

/// What a claim's metadata files say, as a door stages it before the claim is prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimMetadata {
    /// The DRA driver name (the file's name and every device's `driver`).
    pub driver: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
    /// The pod's name for the claim when it was made from a template
    /// ([`POD_CLAIM_NAME_ANNOTATION`]); `None` for a claim the pod names directly.
    pub pod_claim_name: Option<String>,
    /// The claim's requests, each with its devices, in the claim's order.
    pub requests: Vec<RequestMetadata>,
}

/// One request (as the allocation result names it, `<request>[/<subrequest>]`) and its devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestMetadata {
    /// The request name.
    pub name: String,
    /// Its devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<MetadataDevice>,
}

/// One allocated device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataDevice {
    /// The DRA driver.
    pub driver: String,
    /// The DRA pool.
    pub pool: String,
    /// The device's name in the pool.
    pub name: String,
    /// Its attributes as its ResourceSlice publishes them: qualified name -> typed value
    /// (`{"string": ..}`, `{"int": ..}`, `{"bool": ..}`, `{"version": ..}`, `{"ints": [..]}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, serde_json::Value>,
}

/// The object metadata of the document: the claim it describes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// The claim's name.
    pub name: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's UID.
    pub uid: String,
    /// Bumped when a file is rewritten with new content; 1 when first written.
    pub generation: i64,
}

/// One `DeviceMetadata` document: one request of one claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMetadata {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The claim.
    pub metadata: ObjectMeta,
    /// The pod's name for a claim made from a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    /// The request (exactly one per file).
    pub requests: Vec<RequestMetadata>,
}

impl ClaimMetadata {
    /// The document of the request at `index`.
    pub fn document(&self, index: usize) -> Option<DeviceMetadata> {
        let request = self.requests.get(index)?;
        Some(DeviceMetadata {
            api_version: API_VERSION.to_string(),
            kind: KIND.to_string(),
            metadata: ObjectMeta {
                name: self.name.clone(),
                namespace: self.namespace.clone(),
                uid: self.uid.clone(),
                generation: 1,
            },
            pod_claim_name: self.pod_claim_name.clone(),
            requests: vec![request.clone()],
        })
    }

    /// Where a container reads the file of the request at `index`.
    pub fn container_path(&self, index: usize) -> Option<String> {
        let request = self.requests.get(index)?;
        Some(container_path(
            &self.driver,
            &self.name,
            self.pod_claim_name.as_deref(),
            &request.name,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_upstream_layout() {
        assert_eq!(
            container_path("gpu.example.com", "my-claim", None, "gpu"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/my-claim/gpu/gpu.example.com-metadata.json"
        );
        assert_eq!(
            container_path(
                "gpu.example.com",
                "pod-x-gpu-abcde",
                Some("gpu"),
                "big/large"
            ),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/big/gpu.example.com-metadata.json"
        );
    }

    #[test]
    fn a_document_has_the_upstream_field_names() {
        let claim = ClaimMetadata {
            driver: "accel.nri.io".into(),
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u-1".into(),
            pod_claim_name: Some("gpu".into()),
            requests: vec![RequestMetadata {
                name: "r".into(),
                devices: vec![MetadataDevice {
                    driver: "accel.nri.io".into(),
                    pool: "node-a".into(),
                    name: "whole-gpu0".into(),
                    attributes: [(
                        "resource.kubernetes.io/pciBusID".to_string(),
                        serde_json::json!({"string": "0000:18:00.0"}),
                    )]
                    .into(),
                }],
            }],
        };
        let v = serde_json::to_value(claim.document(0).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": "metadata.resource.k8s.io/v1alpha1",
                "kind": "DeviceMetadata",
                "metadata": {"name": "c", "namespace": "ns", "uid": "u-1", "generation": 1},
                "podClaimName": "gpu",
                "requests": [{"name": "r", "devices": [{
                    "driver": "accel.nri.io", "pool": "node-a", "name": "whole-gpu0",
                    "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"}}
                }]}]
            })
        );
        assert!(claim.document(1).is_none());
    }
}

//! AdmissionReview v1 as the API server sends it for a pod, and the answer it expects.
//!
//! Only the fields the check reads are declared; the rest of the pod is skipped by serde
//! without being kept. The body was bounded before it reached here (`server.rs`), so decoding
//! holds at most that much.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::WebhookError;

/// The API group and version of the reviews this webhook speaks.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The kind of a review.
pub const KIND: &str = "AdmissionReview";

/// An AdmissionReview as sent by the API server (only what the check reads).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Review {
    /// Must be [`API_VERSION`].
    #[serde(default)]
    pub api_version: String,
    /// Must be [`KIND`].
    #[serde(default)]
    pub kind: String,
    /// The request; a review without one cannot be answered.
    pub request: Option<Request>,
}

/// The request of a review.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// Copied into the answer: the API server matches answers to requests by it.
    pub uid: String,
    /// The namespace of the object (the pod's may be empty in `object` on create).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The name of the object, when known (a `generateName` pod has none yet).
    #[serde(default)]
    pub name: Option<String>,
    /// The kind of the object (`Pod`, or KubeVirt's `VirtualMachineInstance`).
    #[serde(default)]
    pub kind: Option<ObjectKind>,
    /// The object being admitted, decoded by [`Request::pod`] or [`super::vmi::Vmi`] after its
    /// kind; absent on DELETE.
    #[serde(default)]
    pub object: Option<serde_json::Value>,
}

/// The group, version and kind of the object under review.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectKind {
    /// API group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind, e.g. `Pod`.
    #[serde(default)]
    pub kind: String,
}

impl Request {
    /// Whether the object is a KubeVirt VirtualMachineInstance.
    pub fn is_vmi(&self) -> bool {
        self.kind
            .as_ref()
            .is_some_and(|k| k.group == "kubevirt.io" && k.kind == "VirtualMachineInstance")
    }

    /// The object as a pod (what every review but a VMI's carries); `None` when absent.
    pub fn pod(&self) -> Result<Option<Pod>, WebhookError> {
        self.object
            .as_ref()
            .map(|o| {
                Pod::deserialize(o).map_err(|e| WebhookError::BadReview {
                    why: format!("the object is not a pod ({e})"),
                })
            })
            .transpose()
    }
}

/// The parts of a pod the check reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    /// Name, namespace, annotations.
    #[serde(default)]
    pub metadata: PodMeta,
    /// The containers.
    #[serde(default)]
    pub spec: PodSpec,
}

/// A pod's metadata, as far as the check reads it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMeta {
    /// The pod's name; may be empty when `generateName` is used.
    #[serde(default)]
    pub name: Option<String>,
    /// `generateName`, to name a pod that has no name yet in messages.
    #[serde(default)]
    pub generate_name: Option<String>,
    /// The pod's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The annotations; the accelerator asks are among them.
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A pod's spec, as far as the check reads it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// The app containers.
    #[serde(default)]
    pub containers: Vec<Container>,
    /// The init containers (the node serves them through the same path).
    #[serde(default)]
    pub init_containers: Vec<Container>,
    /// The pod's DRA claims (direct or from templates).
    #[serde(default)]
    pub resource_claims: Vec<PodClaim>,
}

/// One entry of a pod's (or a VMI's) `resourceClaims`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodClaim {
    /// The name the pod gives the claim.
    pub name: String,
    /// A ResourceClaim by name.
    #[serde(default)]
    pub resource_claim_name: Option<String>,
    /// A ResourceClaimTemplate to make the claim from.
    #[serde(default)]
    pub resource_claim_template_name: Option<String>,
}

/// A container: its name is what the annotation key names.
#[derive(Debug, Clone, Deserialize)]
pub struct Container {
    /// The container's name.
    pub name: String,
}

/// Decodes a review body and checks its apiVersion and kind.
pub fn decode(body: &[u8]) -> Result<Request, WebhookError> {
    let review: Review = serde_json::from_slice(body).map_err(|e| WebhookError::BadReview {
        why: format!("the body is not an AdmissionReview in JSON ({e})"),
    })?;
    if review.api_version != API_VERSION || review.kind != KIND {
        return Err(WebhookError::BadReview {
            why: format!(
                "apiVersion {:?} and kind {:?} are not {API_VERSION} {KIND}; list only \"v1\" in the webhook's admissionReviewVersions",
                review.api_version, review.kind
            ),
        });
    }
    review.request.ok_or_else(|| WebhookError::BadReview {
        why: "the AdmissionReview has no request".to_string(),
    })
}

/// The verdict on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Admit the pod?
    pub allowed: bool,
    /// Why not (the node's sentence), or nothing.
    pub message: Option<String>,
    /// Warnings `kubectl` prints even when the pod is admitted (e.g. capacity unknown).
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Admit, with `warnings`.
    pub fn allow(warnings: Vec<String>) -> Verdict {
        Verdict {
            allowed: true,
            message: None,
            warnings,
        }
    }

    /// Refuse, saying `message`.
    pub fn refuse(message: String) -> Verdict {
        Verdict {
            allowed: false,
            message: Some(message),
            warnings: Vec::new(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: Response<'a>,
}

#[derive(Serialize)]
struct Response<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

#[derive(Serialize)]
struct Status<'a> {
    code: u16,
    message: &'a str,
    reason: &'static str,
}

/// The AdmissionReview answering request `uid` with `verdict`, as JSON. A refusal carries code
/// 403 and reason `Forbidden`, which `kubectl` prints after "admission webhook ... denied the
/// request:".
pub fn encode(uid: &str, verdict: &Verdict) -> Vec<u8> {
    let answer = Answer {
        api_version: API_VERSION,
        kind: KIND,
        response: Response {
            uid,
            allowed: verdict.allowed,
            status: verdict.message.as_deref().map(|message| Status {
                code: 403,
                message,
                reason: "Forbidden",
            }),
            warnings: &verdict.warnings,
        },
    };
    // Plain strings, numbers and booleans: serializing cannot fail.
    serde_json::to_vec(&answer).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_pod_review_and_answers_with_its_uid() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
            "request":{"uid":"u1","namespace":"ns","operation":"CREATE",
            "object":{"metadata":{"name":"p","annotations":{"a":"b"}},
                      "spec":{"containers":[{"name":"c","image":"x"}]}}}}"#;
        let r = decode(body).unwrap();
        assert_eq!(r.uid, "u1");
        let pod = r.pod().unwrap().unwrap();
        assert_eq!(pod.spec.containers[0].name, "c");
        let out: serde_json::Value =
            serde_json::from_slice(&encode("u1", &Verdict::refuse("no".into()))).unwrap();
        assert_eq!(out["response"]["uid"], "u1");
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        assert_eq!(out["response"]["status"]["message"], "no");
        let ok: serde_json::Value =
            serde_json::from_slice(&encode("u2", &Verdict::allow(vec![]))).unwrap();
        assert_eq!(ok["response"]["allowed"], true);
        assert!(ok["response"].get("status").is_none());
    }

    #[test]
    fn refuses_other_versions_and_garbage() {
        let v1beta1 = br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}"#;
        let e = decode(v1beta1).unwrap_err().to_string();
        assert!(e.contains("v1beta1"), "{e}");
        assert!(decode(b"{not json").is_err());
        assert!(
            decode(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).is_err()
        );
    }
}

//! Where the kubelet-facing DRA service reads a claim's allocation in the daemon: the
//! ResourceClaim on the API server, narrowed to this driver's results on this node's pool.

use std::sync::Arc;

use async_trait::async_trait;

use super::claims::{allocation_for, check_claim_name};
use super::{KubeApi, KubeError};
use crate::claims_api::ClaimRef;
use crate::kubelet::{AllocatedClaim, ClaimSource};

/// The API server as the DRA service's [`ClaimSource`]: fetches the ResourceClaim the kubelet
/// names, refuses it when its UID is not the one asked for (deleted and recreated), when it is
/// not allocated, or when this driver's results are on another pool or its opaque configuration
/// does not parse; other drivers' results and configuration are theirs and skipped. The
/// configuration's env reaches the engine with the results, per request.
pub struct ApiServerClaims {
    api: Arc<dyn KubeApi>,
    driver: String,
    pool: String,
}

impl ApiServerClaims {
    /// Reads claims through `api` for driver `driver` on the node whose DRA pool is `pool`.
    pub fn new(api: Arc<dyn KubeApi>, driver: &str, pool: &str) -> ApiServerClaims {
        ApiServerClaims {
            api,
            driver: driver.to_string(),
            pool: pool.to_string(),
        }
    }
}

#[async_trait]
impl ClaimSource for ApiServerClaims {
    async fn allocation(&self, c: &ClaimRef) -> Result<AllocatedClaim, String> {
        check_claim_name(&c.namespace, &c.name).map_err(|e| e.to_string())?;
        let claim = self
            .api
            .resource_claim(&c.namespace, &c.name)
            .await
            .map_err(|e| match e {
                KubeError::NotFound { .. } => format!(
                    "claim {}/{} does not exist on the API server (deleted before it was prepared?)",
                    c.namespace, c.name
                ),
                e if e.is_transient() => format!(
                    "claim {}/{}: {e}; the kubelet retries the prepare",
                    c.namespace, c.name
                ),
                e => format!("claim {}/{}: {e}", c.namespace, c.name),
            })?;
        let pod_claim_name = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::metadata::POD_CLAIM_NAME_ANNOTATION))
            .cloned();
        allocation_for(&claim, &c.uid, &self.driver, &self.pool)
            .map(|a| AllocatedClaim {
                env: a.env(),
                results: a.results,
                pod_claim_name,
            })
            .map_err(|e| e.to_string())
    }
}

//! The kubelet's DRA calls to a driver.

use std::collections::BTreeMap;

use super::wire::dra as pb;
use super::{GrpcCaller, RegisteredPlugin, SimError};

/// Which DRA service a call goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraApi {
    /// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`.
    V1,
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`.
    V1beta1,
}

impl DraApi {
    /// The API a registered plugin is called with (the version the kubelet picked).
    pub fn of(plugin: &RegisteredPlugin) -> DraApi {
        if plugin.dra_version == "v1beta1.DRAPlugin" {
            DraApi::V1beta1
        } else {
            DraApi::V1
        }
    }
}

/// One claim's answer to NodePrepareResources: its devices, or its error.
pub type PreparedClaim = Result<Vec<pb::Device>, String>;

/// Calls a driver's DRA service as the kubelet does.
#[derive(Clone, Debug)]
pub struct DraClient {
    caller: GrpcCaller,
    api: DraApi,
}

impl DraClient {
    /// Connects to a registered plugin's endpoint with the version the kubelet picked.
    pub async fn for_plugin(plugin: &RegisteredPlugin) -> Result<DraClient, SimError> {
        Ok(DraClient {
            caller: GrpcCaller::connect(&plugin.endpoint).await?,
            api: DraApi::of(plugin),
        })
    }

    /// Connects to `socket` and speaks `api`.
    pub async fn connect(socket: &std::path::Path, api: DraApi) -> Result<DraClient, SimError> {
        Ok(DraClient {
            caller: GrpcCaller::connect(socket).await?,
            api,
        })
    }

    /// NodePrepareResources: claim UID -> devices or error. A claim the driver left out of its
    /// answer is an error here, as the kubelet treats it.
    pub async fn prepare(
        &self,
        claims: &[pb::Claim],
    ) -> Result<BTreeMap<String, PreparedClaim>, SimError> {
        let path = match self.api {
            DraApi::V1 => pb::V1_PREPARE,
            DraApi::V1beta1 => pb::V1BETA1_PREPARE,
        };
        let req = pb::NodePrepareResourcesRequest {
            claims: claims.to_vec(),
        };
        let mut resp: pb::NodePrepareResourcesResponse = self.caller.unary(path, req).await?;
        Ok(claims
            .iter()
            .map(|c| {
                let answer = match resp.claims.remove(&c.uid) {
                    None => Err(format!("driver left claim {} out of its answer", c.uid)),
                    Some(r) if !r.error.is_empty() => Err(r.error),
                    Some(r) => Ok(r.devices),
                };
                (c.uid.clone(), answer)
            })
            .collect())
    }

    /// NodeUnprepareResources: claim UID -> released, or the error.
    pub async fn unprepare(
        &self,
        claims: &[pb::Claim],
    ) -> Result<BTreeMap<String, Result<(), String>>, SimError> {
        let path = match self.api {
            DraApi::V1 => pb::V1_UNPREPARE,
            DraApi::V1beta1 => pb::V1BETA1_UNPREPARE,
        };
        let req = pb::NodeUnprepareResourcesRequest {
            claims: claims.to_vec(),
        };
        let mut resp: pb::NodeUnprepareResourcesResponse = self.caller.unary(path, req).await?;
        Ok(claims
            .iter()
            .map(|c| {
                let answer = match resp.claims.remove(&c.uid) {
                    None => Err(format!("driver left claim {} out of its answer", c.uid)),
                    Some(r) if !r.error.is_empty() => Err(r.error),
                    Some(_) => Ok(()),
                };
                (c.uid.clone(), answer)
            })
            .collect())
    }
}

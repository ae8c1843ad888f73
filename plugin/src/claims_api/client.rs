//! A client of the claims API, for the CLI (`nri-accel prepare/unprepare/status`) and tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixStream;

use super::convert;
use super::error::ClaimsApiError;
use super::proto::{claims as pb, claims_ttrpc};
use super::types::{ClaimInfo, ClaimRef, ClaimSpec, PrepareResults, UnprepareResults};

/// Default per-call timeout: kubelet gives a DRA driver 45 s, a forwarded call must fit inside it.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(40);

/// The answer to Status.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusReport {
    /// The status document (what `nri-accel status --json` prints).
    pub document: serde_json::Value,
    /// Whether the gate is open.
    pub gate_open: bool,
}

/// A connection to the claims API.
#[derive(Clone)]
pub struct ClaimsClient {
    inner: claims_ttrpc::ClaimsClient,
    path: PathBuf,
    timeout: Duration,
}

impl std::fmt::Debug for ClaimsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimsClient")
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ClaimsClient {
    /// Connects to the socket at `path`. Must be called inside a tokio runtime.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, ClaimsApiError> {
        let path = path.as_ref().to_path_buf();
        let stream =
            UnixStream::connect(&path)
                .await
                .map_err(|source| ClaimsApiError::Connect {
                    path: path.clone(),
                    source,
                })?;
        let client = ttrpc::r#async::Client::new(ttrpc::r#async::transport::Socket::new(stream));
        Ok(Self {
            inner: claims_ttrpc::ClaimsClient::new(client),
            path,
            timeout: DEFAULT_CALL_TIMEOUT,
        })
    }

    /// Sets the per-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn ctx(&self) -> ttrpc::context::Context {
        ttrpc::context::with_duration(self.timeout)
    }

    /// Prepares `claims`; the answer has one entry per claim UID.
    ///
    /// A whole-request refusal (gate closed: [`ClaimsApiError::is_unavailable`]) is an `Err`.
    pub async fn prepare(&self, claims: Vec<ClaimSpec>) -> Result<PrepareResults, ClaimsApiError> {
        let req = pb::PrepareRequest {
            claims: claims.iter().map(convert::claim_to_proto).collect(),
            ..Default::default()
        };
        let resp = self.inner.prepare(self.ctx(), &req).await?;
        Ok(convert::prepare_results_from_proto(resp))
    }

    /// Releases `claims`; the answer has one entry per claim UID.
    pub async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> Result<UnprepareResults, ClaimsApiError> {
        let req = pb::UnprepareRequest {
            claims: claims.iter().map(convert::ref_to_proto).collect(),
            ..Default::default()
        };
        let resp = self.inner.unprepare(self.ctx(), &req).await?;
        Ok(convert::unprepare_results_from_proto(resp))
    }

    /// The claims the node holds.
    pub async fn list(&self) -> Result<Vec<ClaimInfo>, ClaimsApiError> {
        let resp = self
            .inner
            .list(self.ctx(), &pb::ListRequest::default())
            .await?;
        resp.claims
            .into_iter()
            .map(convert::claim_info_from_proto)
            .collect()
    }

    /// The daemon's status document and the gate.
    pub async fn status(&self) -> Result<StatusReport, ClaimsApiError> {
        let resp = self
            .inner
            .status(self.ctx(), &pb::StatusRequest::default())
            .await?;
        let document = serde_json::from_str(&resp.json)
            .map_err(|e| ClaimsApiError::InvalidResponse(format!("status document: {e}")))?;
        Ok(StatusReport {
            document,
            gate_open: resp.gate_open,
        })
    }
}

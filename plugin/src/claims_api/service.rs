//! The ttrpc side of the claims API: the gate, the limits and the UID checks in front of the
//! engine's [`ClaimService`], and the conversion of its answers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use ttrpc::r#async::{MethodHandler, Service, TtrpcContext};

use super::convert;
use super::error::ClaimsApiError;
use super::proto::{claims as pb, claims_ttrpc};
use super::types::{ClaimService, PrepareResults, UnprepareResults};
use super::validate::{Limits, check_uid};
use crate::gate::Gate;

/// The generated service trait implemented over a [`ClaimService`].
pub(crate) struct ClaimsHandler<S> {
    engine: Arc<S>,
    gate: Gate,
    limits: Limits,
}

impl<S: ClaimService> ClaimsHandler<S> {
    pub(crate) fn new(engine: Arc<S>, gate: Gate, limits: Limits) -> Self {
        Self {
            engine,
            gate,
            limits,
        }
    }

    /// Refuses the whole request while the gate is closed, and over-long claim lists.
    fn admit(&self, method: &str, claims: usize) -> Result<(), ClaimsApiError> {
        if !self.gate.is_open() {
            tracing::info!(method, claims, "claims API request refused: gate closed");
            return Err(ClaimsApiError::GateClosed);
        }
        if claims > self.limits.max_claims {
            return Err(ClaimsApiError::TooManyClaims {
                count: claims,
                max: self.limits.max_claims,
            });
        }
        Ok(())
    }
}

/// Counts each UID in a request, so a UID sent twice is refused rather than answered ambiguously.
fn uid_counts<'a>(uids: impl Iterator<Item = &'a str>) -> HashMap<&'a str, usize> {
    let mut counts = HashMap::new();
    for uid in uids {
        *counts.entry(uid).or_insert(0) += 1;
    }
    counts
}

/// Checks a UID and its uniqueness in the request: the per-claim error, if any.
fn screen_uid(uid: &str, counts: &HashMap<&str, usize>) -> Result<(), String> {
    check_uid(uid)?;
    match counts.get(uid).copied().unwrap_or(0) {
        0 | 1 => Ok(()),
        n => Err(format!(
            "claim {uid} appears {n} times in one request; send each claim once"
        )),
    }
}

fn missing_answer(uid: &str) -> String {
    format!("nri-accel's claim engine gave no answer for claim {uid}; retry")
}

/// Runs an engine call in its own task, so a panic in the engine becomes an error status.
async fn run_engine<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, ClaimsApiError> {
    tokio::spawn(fut)
        .await
        .map_err(|e| ClaimsApiError::Engine(e.to_string()))
}

/// Splits a request's claims into those that pass the UID checks and convert,
/// and per-claim errors for the others (keyed by the UID as sent).
fn screen<P, T, A>(
    claims: Vec<P>,
    uid_of: impl Fn(&P) -> &str,
    convert: impl Fn(P) -> Result<T, String>,
) -> (Vec<T>, BTreeMap<String, Result<A, String>>) {
    let counts = uid_counts(claims.iter().map(&uid_of));
    let screened: Vec<Result<(), String>> = claims
        .iter()
        .map(|c| screen_uid(uid_of(c), &counts))
        .collect();
    drop(counts);
    let mut answers = BTreeMap::new();
    let mut passed = Vec::new();
    for (claim, check) in claims.into_iter().zip(screened) {
        let uid = uid_of(&claim).to_string();
        match check.and_then(|()| convert(claim)) {
            Ok(t) => passed.push(t),
            Err(e) => {
                answers.insert(uid, Err(e));
            }
        }
    }
    (passed, answers)
}

/// Moves the engine's answer for every claim asked into `answers`; a claim the
/// engine left out gets an error, and answers nobody asked for are dropped.
fn collect_answers<A>(
    asked: Vec<String>,
    mut results: BTreeMap<String, Result<A, String>>,
    answers: &mut BTreeMap<String, Result<A, String>>,
) {
    for uid in asked {
        let answer = results
            .remove(&uid)
            .unwrap_or_else(|| Err(missing_answer(&uid)));
        answers.insert(uid, answer);
    }
    if !results.is_empty() {
        tracing::warn!(
            extra = ?results.keys().collect::<Vec<_>>(),
            "claim engine answered claims nobody asked for; dropped"
        );
    }
}

#[async_trait]
impl<S: ClaimService> claims_ttrpc::Claims for ClaimsHandler<S> {
    async fn prepare(
        &self,
        _ctx: &TtrpcContext,
        req: pb::PrepareRequest,
    ) -> ttrpc::Result<pb::PrepareResponse> {
        self.admit("Prepare", req.claims.len())?;
        let (specs, mut answers): (_, PrepareResults) = screen(
            req.claims,
            |c| c.uid.as_str(),
            |c| convert::claim_from_proto(c, &self.limits),
        );
        if !specs.is_empty() {
            let asked: Vec<String> = specs.iter().map(|s| s.uid.clone()).collect();
            tracing::info!(claims = asked.len(), "claims API Prepare");
            let engine = Arc::clone(&self.engine);
            let results = run_engine(async move { engine.prepare(specs).await }).await?;
            collect_answers(asked, results, &mut answers);
        }
        Ok(convert::prepare_results_to_proto(answers))
    }

    async fn unprepare(
        &self,
        _ctx: &TtrpcContext,
        req: pb::UnprepareRequest,
    ) -> ttrpc::Result<pb::UnprepareResponse> {
        self.admit("Unprepare", req.claims.len())?;
        let (refs, mut answers): (_, UnprepareResults) =
            screen(req.claims, |c| c.uid.as_str(), convert::ref_from_proto);
        if !refs.is_empty() {
            let asked: Vec<String> = refs.iter().map(|r| r.uid.clone()).collect();
            tracing::info!(claims = asked.len(), "claims API Unprepare");
            let engine = Arc::clone(&self.engine);
            let results = run_engine(async move { engine.unprepare(refs).await }).await?;
            collect_answers(asked, results, &mut answers);
        }
        Ok(convert::unprepare_results_to_proto(answers))
    }

    async fn list(
        &self,
        _ctx: &TtrpcContext,
        _req: pb::ListRequest,
    ) -> ttrpc::Result<pb::ListResponse> {
        let engine = Arc::clone(&self.engine);
        let claims = run_engine(async move { engine.list().await }).await?;
        Ok(pb::ListResponse {
            claims: claims
                .into_iter()
                .map(convert::claim_info_to_proto)
                .collect(),
            ..Default::default()
        })
    }

    async fn status(
        &self,
        _ctx: &TtrpcContext,
        _req: pb::StatusRequest,
    ) -> ttrpc::Result<pb::StatusResponse> {
        let engine = Arc::clone(&self.engine);
        let gate_open = self.gate.is_open();
        let json = run_engine(async move { engine.status(gate_open).await }).await?;
        Ok(pb::StatusResponse {
            json,
            gate_open,
            ..Default::default()
        })
    }
}

/// Wraps a generated method handler: refuses payloads over the limit before they are decoded, and
/// answers undecodable payloads with INVALID_ARGUMENT.
struct SizeLimited {
    method: String,
    max: usize,
    inner: Box<dyn MethodHandler + Send + Sync>,
}

#[async_trait]
impl MethodHandler for SizeLimited {
    async fn handler(
        &self,
        ctx: TtrpcContext,
        req: ttrpc::Request,
    ) -> ttrpc::Result<ttrpc::Response> {
        if req.payload.len() > self.max {
            let e = ClaimsApiError::RequestTooLarge {
                method: self.method.clone(),
                size: req.payload.len(),
                max: self.max,
            };
            tracing::warn!("{e}");
            let mut resp = ttrpc::Response::new();
            resp.set_status(e.to_status());
            return Ok(resp);
        }
        // rust-protobuf alone would take a nested message cut short for a shorter one (a count
        // ask without its device selector): the payload is checked strictly first.
        if let Some(descriptor) = request_descriptor(&self.method)
            && let Err(e) = nri_proto::strict::check(&req.payload, &descriptor)
        {
            let e = ClaimsApiError::Undecodable {
                method: self.method.clone(),
                reason: e.to_string(),
            };
            tracing::warn!("{e}");
            let mut resp = ttrpc::Response::new();
            resp.set_status(e.to_status());
            return Ok(resp);
        }
        // Generated handlers turn the service's errors into statuses themselves; an `Err` here
        // means the payload did not decode (or the answer did not encode). Map it here, not to
        // ttrpc's catch-all UNKNOWN.
        match self.inner.handler(ctx, req).await {
            Ok(resp) => Ok(resp),
            Err(e) => {
                let e = ClaimsApiError::Undecodable {
                    method: self.method.clone(),
                    reason: e.to_string(),
                };
                tracing::warn!("{e}");
                let mut resp = ttrpc::Response::new();
                resp.set_status(e.to_status());
                Ok(resp)
            }
        }
    }
}

/// The request message of a method path (`/<service>/<method>`, as the table keys it).
fn request_descriptor(method: &str) -> Option<protobuf::reflect::MessageDescriptor> {
    use protobuf::MessageFull;
    Some(match method.rsplit('/').next()? {
        "Prepare" => pb::PrepareRequest::descriptor(),
        "Unprepare" => pb::UnprepareRequest::descriptor(),
        "List" => pb::ListRequest::descriptor(),
        "Status" => pb::StatusRequest::descriptor(),
        _ => return None,
    })
}

/// The ttrpc service table for `engine`, with every method behind the message size limit.
pub(crate) fn services<S: ClaimService>(
    engine: Arc<S>,
    gate: Gate,
    limits: Limits,
) -> HashMap<String, Service> {
    let max = limits.effective_max_message_bytes();
    let handler = Arc::new(ClaimsHandler::new(engine, gate, limits));
    let mut table = claims_ttrpc::create_claims(handler);
    for service in table.values_mut() {
        let methods = std::mem::take(&mut service.methods);
        service.methods = methods
            .into_iter()
            .map(|(method, inner)| {
                let wrapped: Box<dyn MethodHandler + Send + Sync> = Box::new(SizeLimited {
                    method: method.clone(),
                    max,
                    inner,
                });
                (method, wrapped)
            })
            .collect();
    }
    table
}

#[cfg(test)]
mod tests {
    use protobuf::Message;

    use super::*;

    /// A Prepare of one count ask whose selector names the devices, and the offset in its
    /// encoding where the selector's `device_ids` start.
    fn count_ask_with_selector() -> (Vec<u8>, usize) {
        let selector = pb::Selector {
            vendor: "nvidia".into(),
            device_ids: vec!["gpus-gpu3".into()],
            ..Default::default()
        };
        let mut request = pb::CountRequest {
            request: "gpu".into(),
            count: 1,
            ..Default::default()
        };
        request.selector = protobuf::MessageField::some(selector);
        let mut count = pb::CountRequests::new();
        count.requests.push(request);
        let mut claim = pb::Claim {
            uid: "uid-1".into(),
            ..Default::default()
        };
        claim.set_count(count);
        let mut prepare = pb::PrepareRequest::new();
        prepare.claims.push(claim);
        let bytes = prepare.write_to_bytes().unwrap();
        let at = bytes
            .windows(9)
            .position(|w| w == b"gpus-gpu3")
            .expect("the device id is in the encoding")
            - 2; // its tag and length
        (bytes, at)
    }

    #[test]
    fn a_prepare_cut_inside_the_selector_is_refused_not_read_without_it() {
        let (bytes, at) = count_ask_with_selector();
        let cut = &bytes[..at];
        // What rust-protobuf alone makes of it: the same ask without the device ids.
        let lenient = pb::PrepareRequest::parse_from_bytes(cut).expect("rust-protobuf accepts it");
        let pb::claim::Ask::Count(count) = lenient.claims[0].ask.clone().unwrap() else {
            panic!("a count ask")
        };
        assert!(count.requests[0].selector.device_ids.is_empty());
        // The strict check refuses it, naming where.
        let descriptor = request_descriptor("/nriaccel.claims.v1.Claims/Prepare").unwrap();
        let err = nri_proto::strict::check(cut, &descriptor).unwrap_err();
        assert!(err.to_string().contains("only"), "{err}");
        // Every cut inside the claim is refused; the whole request passes.
        for end in 3..bytes.len() {
            assert!(
                nri_proto::strict::check(&bytes[..end], &descriptor).is_err(),
                "cut at {end} of {}",
                bytes.len()
            );
        }
        nri_proto::strict::check(&bytes, &descriptor).unwrap();
    }

    #[test]
    fn a_field_with_the_wrong_wire_type_is_refused() {
        let descriptor = request_descriptor("Prepare").unwrap();
        // Field 1 (claims, a message) sent as a varint.
        let err = nri_proto::strict::check(&[0x08, 0x01], &descriptor).unwrap_err();
        assert!(err.to_string().contains("claims (1)"), "{err}");
        assert!(pb::PrepareRequest::parse_from_bytes(&[0x08, 0x01]).is_ok());
    }
}

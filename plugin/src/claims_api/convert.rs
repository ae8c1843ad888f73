//! The one place where wire (protobuf) types become domain types and back.
//!
//! Server side: requests `from_proto` (fallible: a malformed claim is a per-claim error), answers
//! `to_proto`. Client side: the reverse, with a malformed answer reported as
//! [`ClaimsApiError::InvalidResponse`].

use protobuf::{EnumOrUnknown, MessageField};

use super::error::ClaimsApiError;
use super::proto::claims as pb;
use super::types::{
    ClaimAsk, ClaimInfo, ClaimRef, ClaimSpec, ClaimState, CountAsk, DraResult, Family,
    PrepareResults, PreparedDevice, Selector, UnprepareResults,
};
use super::validate::{Limits, check_name, echo};

fn non_empty(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

/// A wire claim as a domain claim; the error is one sentence naming the claim.
///
/// The UID is assumed checked already (see `validate::check_uid`).
pub(crate) fn claim_from_proto(claim: pb::Claim, limits: &Limits) -> Result<ClaimSpec, String> {
    let uid = claim.uid;
    check_name("namespace", &uid, &claim.namespace)?;
    check_name("name", &uid, &claim.name)?;
    let ask = match claim.ask {
        None => {
            return Err(format!(
                "claim {uid} asks for nothing: set either the DRA allocation results or the count requests"
            ));
        }
        Some(pb::claim::Ask::Results(results)) => {
            if results.results.is_empty() {
                return Err(format!(
                    "claim {uid} has an empty list of allocation results"
                ));
            }
            if results.results.len() > limits.max_results_per_claim {
                return Err(format!(
                    "claim {uid} has {} allocation results, more than the limit of {}",
                    results.results.len(),
                    limits.max_results_per_claim
                ));
            }
            for (i, r) in results.results.iter().enumerate() {
                let field = |name: &str| format!("results[{i}].{name}");
                check_name(&field("request"), &uid, &r.request)?;
                check_name(&field("driver"), &uid, &r.driver)?;
                check_name(&field("pool"), &uid, &r.pool)?;
                check_name(&field("device"), &uid, &r.device)?;
                check_name(
                    &field("share_id"),
                    &uid,
                    r.share_id.as_deref().unwrap_or(""),
                )?;
            }
            ClaimAsk::Results(
                results
                    .results
                    .into_iter()
                    .map(|r| DraResult {
                        request: r.request,
                        driver: r.driver,
                        pool: r.pool,
                        device: r.device,
                        share_id: r.share_id.and_then(non_empty),
                    })
                    .collect(),
            )
        }
        Some(pb::claim::Ask::Count(count)) => {
            if count.requests.is_empty() {
                return Err(format!("claim {uid} has an empty list of count requests"));
            }
            if count.requests.len() > limits.max_results_per_claim {
                return Err(format!(
                    "claim {uid} has {} count requests, more than the limit of {}",
                    count.requests.len(),
                    limits.max_results_per_claim
                ));
            }
            let mut asks = Vec::with_capacity(count.requests.len());
            for (i, r) in count.requests.into_iter().enumerate() {
                check_count_strings(&uid, i, &r)?;
                asks.push(count_from_proto(&uid, r)?);
            }
            ClaimAsk::Count(asks)
        }
    };
    Ok(ClaimSpec {
        uid,
        namespace: claim.namespace,
        name: claim.name,
        ask,
        env: Default::default(),
    })
}

/// Every string of count request `i` is held like a namespace or a name (the request name and
/// the selector are kept in the claim's record): at most 253 characters, no control characters.
fn check_count_strings(uid: &str, i: usize, r: &pb::CountRequest) -> Result<(), String> {
    let field = |name: &str| format!("requests[{i}].{name}");
    check_name(&field("request"), uid, &r.request)?;
    check_name(&field("profile"), uid, &r.profile)?;
    check_name(&field("policy"), uid, &r.policy)?;
    if let Some(s) = r.selector.as_ref() {
        check_name(&field("selector.vendor"), uid, &s.vendor)?;
        check_name(&field("selector.model"), uid, &s.model)?;
        check_name(&field("selector.pci_id"), uid, &s.pci_id)?;
        for (j, id) in s.device_ids.iter().enumerate() {
            check_name(&field(&format!("selector.device_ids[{j}]")), uid, id)?;
        }
    }
    Ok(())
}

fn count_from_proto(uid: &str, r: pb::CountRequest) -> Result<CountAsk, String> {
    let family = match r.family.enum_value() {
        Ok(pb::Family::FAMILY_EXCLUSIVE) => Family::Exclusive,
        Ok(pb::Family::FAMILY_SHARED) => Family::Shared,
        Ok(pb::Family::FAMILY_SLICED) => Family::Sliced,
        Ok(pb::Family::FAMILY_CUSTOM) if !r.policy.is_empty() => Family::Custom(r.policy.clone()),
        Ok(pb::Family::FAMILY_CUSTOM) => {
            return Err(format!(
                "claim {uid}: request {} asks for a custom family but names no policy: set \
                 policy to the registered policy name",
                echo(&r.request)
            ));
        }
        Ok(pb::Family::FAMILY_UNSPECIFIED) | Err(_) => {
            return Err(format!(
                "claim {uid}: request {} names no known family: use exclusive, shared, sliced \
                 or custom with a policy name",
                echo(&r.request)
            ));
        }
    };
    if r.count == 0 {
        return Err(format!(
            "claim {uid}: request {} asks for 0 units",
            echo(&r.request)
        ));
    }
    let selector = r.selector.into_option().unwrap_or_default();
    Ok(CountAsk {
        request: r.request,
        count: r.count,
        family,
        selector: Selector {
            vendor: non_empty(selector.vendor),
            model: non_empty(selector.model),
            pci_id: non_empty(selector.pci_id),
            device_ids: selector.device_ids,
        },
        profile: non_empty(r.profile),
        shares: if r.shares == 0 { None } else { Some(r.shares) },
    })
}

/// A domain claim on the wire (client side).
pub(crate) fn claim_to_proto(spec: &ClaimSpec) -> pb::Claim {
    let ask = match &spec.ask {
        ClaimAsk::Results(results) => pb::claim::Ask::Results(pb::AllocationResults {
            results: results
                .iter()
                .map(|r| pb::AllocationResult {
                    request: r.request.clone(),
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    share_id: r.share_id.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        ClaimAsk::Count(asks) => pb::claim::Ask::Count(pb::CountRequests {
            requests: asks
                .iter()
                .map(|a| pb::CountRequest {
                    request: a.request.clone(),
                    count: a.count,
                    family: EnumOrUnknown::new(match a.family {
                        Family::Exclusive => pb::Family::FAMILY_EXCLUSIVE,
                        Family::Shared => pb::Family::FAMILY_SHARED,
                        Family::Sliced => pb::Family::FAMILY_SLICED,
                        Family::Custom(_) => pb::Family::FAMILY_CUSTOM,
                    }),
                    policy: match &a.family {
                        Family::Custom(name) => name.clone(),
                        _ => String::new(),
                    },
                    selector: MessageField::some(pb::Selector {
                        vendor: a.selector.vendor.clone().unwrap_or_default(),
                        model: a.selector.model.clone().unwrap_or_default(),
                        pci_id: a.selector.pci_id.clone().unwrap_or_default(),
                        device_ids: a.selector.device_ids.clone(),
                        ..Default::default()
                    }),
                    profile: a.profile.clone().unwrap_or_default(),
                    shares: a.shares.unwrap_or(0),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
    };
    pb::Claim {
        namespace: spec.namespace.clone(),
        uid: spec.uid.clone(),
        name: spec.name.clone(),
        ask: Some(ask),
        ..Default::default()
    }
}

/// A wire claim reference as a domain one (server side; UID checked by the caller).
pub(crate) fn ref_from_proto(claim: pb::ClaimRef) -> Result<ClaimRef, String> {
    check_name("namespace", &claim.uid, &claim.namespace)?;
    check_name("name", &claim.uid, &claim.name)?;
    Ok(ClaimRef {
        uid: claim.uid,
        namespace: claim.namespace,
        name: claim.name,
    })
}

/// A domain claim reference on the wire (client side).
pub(crate) fn ref_to_proto(claim: &ClaimRef) -> pb::ClaimRef {
    pb::ClaimRef {
        namespace: claim.namespace.clone(),
        uid: claim.uid.clone(),
        name: claim.name.clone(),
        ..Default::default()
    }
}

fn device_to_proto(d: PreparedDevice) -> pb::Device {
    pb::Device {
        request_names: d.request_names,
        pool_name: d.pool,
        device_name: d.device,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
        ..Default::default()
    }
}

fn device_from_proto(d: pb::Device) -> PreparedDevice {
    PreparedDevice {
        request_names: d.request_names,
        pool: d.pool_name,
        device: d.device_name,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id.and_then(non_empty),
    }
}

/// Prepare answers on the wire.
pub(crate) fn prepare_results_to_proto(results: PrepareResults) -> pb::PrepareResponse {
    let claims = results
        .into_iter()
        .map(|(uid, result)| {
            let answer = match result {
                Ok(devices) => pb::PrepareResult {
                    devices: devices.into_iter().map(device_to_proto).collect(),
                    ..Default::default()
                },
                Err(error) => pb::PrepareResult {
                    error,
                    ..Default::default()
                },
            };
            (uid, answer)
        })
        .collect();
    pb::PrepareResponse {
        claims,
        ..Default::default()
    }
}

/// Prepare answers from the wire (client side).
pub(crate) fn prepare_results_from_proto(resp: pb::PrepareResponse) -> PrepareResults {
    resp.claims
        .into_iter()
        .map(|(uid, r)| {
            let result = if r.error.is_empty() {
                Ok(r.devices.into_iter().map(device_from_proto).collect())
            } else {
                Err(r.error)
            };
            (uid, result)
        })
        .collect()
}

/// Unprepare answers on the wire.
pub(crate) fn unprepare_results_to_proto(results: UnprepareResults) -> pb::UnprepareResponse {
    let claims = results
        .into_iter()
        .map(|(uid, result)| {
            let error = result.err().unwrap_or_default();
            (
                uid,
                pb::UnprepareResult {
                    error,
                    ..Default::default()
                },
            )
        })
        .collect();
    pb::UnprepareResponse {
        claims,
        ..Default::default()
    }
}

/// Unprepare answers from the wire (client side).
pub(crate) fn unprepare_results_from_proto(resp: pb::UnprepareResponse) -> UnprepareResults {
    resp.claims
        .into_iter()
        .map(|(uid, r)| {
            let result = if r.error.is_empty() {
                Ok(())
            } else {
                Err(r.error)
            };
            (uid, result)
        })
        .collect()
}

/// A held claim on the wire.
pub(crate) fn claim_info_to_proto(info: ClaimInfo) -> pb::ClaimInfo {
    pb::ClaimInfo {
        namespace: info.namespace,
        uid: info.uid,
        name: info.name,
        state: EnumOrUnknown::new(match info.state {
            ClaimState::HalfPrepared => pb::ClaimState::CLAIM_STATE_HALF_PREPARED,
            ClaimState::Prepared => pb::ClaimState::CLAIM_STATE_PREPARED,
            ClaimState::Adopted => pb::ClaimState::CLAIM_STATE_ADOPTED,
        }),
        devices: info.devices.into_iter().map(device_to_proto).collect(),
        ..Default::default()
    }
}

/// A held claim from the wire (client side).
pub(crate) fn claim_info_from_proto(info: pb::ClaimInfo) -> Result<ClaimInfo, ClaimsApiError> {
    let state = match info.state.enum_value() {
        Ok(pb::ClaimState::CLAIM_STATE_HALF_PREPARED) => ClaimState::HalfPrepared,
        Ok(pb::ClaimState::CLAIM_STATE_PREPARED) => ClaimState::Prepared,
        Ok(pb::ClaimState::CLAIM_STATE_ADOPTED) => ClaimState::Adopted,
        Ok(pb::ClaimState::CLAIM_STATE_UNSPECIFIED) | Err(_) => {
            return Err(ClaimsApiError::InvalidResponse(format!(
                "claim {} has no known state ({})",
                echo(&info.uid),
                info.state.value()
            )));
        }
    };
    Ok(ClaimInfo {
        uid: info.uid,
        namespace: info.namespace,
        name: info.name,
        state,
        devices: info.devices.into_iter().map(device_from_proto).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_claim() -> ClaimSpec {
        ClaimSpec {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "gpu".into(),
            ask: ClaimAsk::Count(vec![CountAsk {
                request: "r0".into(),
                count: 2,
                family: Family::Sliced,
                selector: Selector {
                    vendor: Some("nvidia".into()),
                    model: None,
                    pci_id: Some("10de:2330".into()),
                    device_ids: vec!["gpu0".into()],
                },
                profile: Some("1g.10gb".into()),
                shares: None,
            }]),
            env: Default::default(),
        }
    }

    #[test]
    fn claims_round_trip() {
        let limits = Limits::default();
        let spec = count_claim();
        assert_eq!(claim_from_proto(claim_to_proto(&spec), &limits), Ok(spec));
        let spec = ClaimSpec {
            ask: ClaimAsk::Results(vec![DraResult {
                request: "r0".into(),
                driver: "gpu.example.com".into(),
                pool: "node-a".into(),
                device: "gpu-0".into(),
                share_id: Some("s1".into()),
            }]),
            ..count_claim()
        };
        assert_eq!(claim_from_proto(claim_to_proto(&spec), &limits), Ok(spec));
    }

    #[test]
    fn malformed_claims_are_per_claim_errors() {
        let limits = Limits::default();
        let mut claim = claim_to_proto(&count_claim());
        claim.ask = None;
        let err = claim_from_proto(claim, &limits).expect_err("no ask");
        assert!(
            err.contains("u1") && err.contains("asks for nothing"),
            "{err}"
        );

        let mut claim = claim_to_proto(&count_claim());
        if let Some(pb::claim::Ask::Count(c)) = claim.ask.as_mut() {
            c.requests[0].family = EnumOrUnknown::from_i32(42);
        }
        let err = claim_from_proto(claim, &limits).expect_err("bad family");
        assert!(err.contains("family"), "{err}");

        let mut claim = claim_to_proto(&count_claim());
        if let Some(pb::claim::Ask::Count(c)) = claim.ask.as_mut() {
            c.requests[0].count = 0;
        }
        assert!(claim_from_proto(claim, &limits).is_err());
    }

    #[test]
    fn request_names_are_checked_like_names_naming_the_field() {
        let limits = Limits::default();
        for bad in ["gpu\0x".to_string(), "r".repeat(900_000)] {
            let mut claim = claim_to_proto(&count_claim());
            if let Some(pb::claim::Ask::Count(c)) = claim.ask.as_mut() {
                c.requests[0].request = bad.clone();
            }
            let err = claim_from_proto(claim, &limits).expect_err("bad count request name");
            assert!(err.contains("claim u1: requests[0].request"), "{err}");
            assert!(
                err.len() < 400,
                "the value is shortened: {} bytes",
                err.len()
            );

            let mut claim = claim_to_proto(&count_claim());
            claim.ask = Some(pb::claim::Ask::Results(pb::AllocationResults {
                results: vec![pb::AllocationResult {
                    request: bad.clone(),
                    driver: "accel.nri.io".into(),
                    pool: "gpus".into(),
                    device: "gpus-gpu0".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }));
            let err = claim_from_proto(claim, &limits).expect_err("bad result request name");
            assert!(err.contains("claim u1: results[0].request"), "{err}");
        }
        let mut claim = claim_to_proto(&count_claim());
        if let Some(pb::claim::Ask::Count(c)) = claim.ask.as_mut() {
            c.requests[0].selector.mut_or_insert_default().device_ids = vec!["a\nb".into()];
        }
        let err = claim_from_proto(claim, &limits).expect_err("bad selector");
        assert!(err.contains("requests[0].selector.device_ids[0]"), "{err}");
    }

    #[test]
    fn answers_round_trip() {
        let device = PreparedDevice {
            request_names: vec!["r0".into()],
            pool: "node-a".into(),
            device: "gpu-0".into(),
            cdi_device_ids: vec!["example.com/gpu=claim-u1-0".into()],
            share_id: None,
        };
        let prepared: PrepareResults = [
            ("u1".to_string(), Ok(vec![device.clone()])),
            (
                "u2".to_string(),
                Err("gpu-0 is held by claim u1".to_string()),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            prepare_results_from_proto(prepare_results_to_proto(prepared.clone())),
            prepared
        );
        let released: UnprepareResults = [
            ("u1".to_string(), Ok(())),
            ("u2".to_string(), Err("checkpoint unwritable".to_string())),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            unprepare_results_from_proto(unprepare_results_to_proto(released.clone())),
            released
        );
        let info = ClaimInfo {
            uid: "u1".into(),
            namespace: "ns".into(),
            name: "gpu".into(),
            state: ClaimState::Prepared,
            devices: vec![device],
        };
        assert_eq!(
            claim_info_from_proto(claim_info_to_proto(info.clone())).expect("info"),
            info
        );
    }
}

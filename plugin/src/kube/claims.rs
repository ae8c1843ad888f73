//! From a ResourceClaim fetched from the API server to what the engine prepares: the
//! allocation results of this driver on this node's pool, and its opaque configuration.
//!
//! [`allocation_for`] is pure: the kubelet-facing DRA service fetches the claim through
//! [`super::KubeApi::resource_claim`], calls it, and hands the results to the engine's results
//! path (after [`ClaimAllocation::engine_results`] names each device's policy pool). Every
//! refusal is one sentence naming the claim, answered for that claim alone.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use policies::PublishedDevice;
use serde::Serialize;

use super::opaque::{DeviceConfig, OpaqueError};
use crate::claims_api::DraResult;
use crate::engine::RequestEnv;
use crate::names::{is_dns_label, is_dns_subdomain};

/// Most allocation results a claim may hold (the API's limit).
pub const MAX_RESULTS: usize = 32;

/// What one claim asks of this driver on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAllocation {
    /// The claim's results for this driver, in the claim's order; `pool` is the DRA pool (this
    /// node's) and `device` the published device name.
    pub results: Vec<DraResult>,
    /// The opaque configurations for this driver, class ones first, as the claim lists them.
    pub config: Vec<ClaimConfig>,
}

/// One opaque configuration for this driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimConfig {
    /// Whether it came from the DeviceClass (set by the admin) or the claim (set by the user).
    pub source: ConfigSource,
    /// The requests it applies to; empty means all of the claim's requests.
    pub requests: Vec<String>,
    /// The parsed parameters.
    pub config: DeviceConfig,
}

/// Where an opaque configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigSource {
    /// `FromClass`: the DeviceClass.
    Class,
    /// `FromClaim`: the claim itself.
    Claim,
}

/// Why a claim cannot be prepared on this node. Each message names the claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The namespace or name is not a DNS name, so it cannot be a real claim.
    #[error("claim {namespace}/{name}: the {what} is not a DNS {rule}")]
    BadName {
        /// Namespace asked for.
        namespace: String,
        /// Name asked for.
        name: String,
        /// `namespace` or `name`.
        what: &'static str,
        /// `label` or `subdomain`.
        rule: &'static str,
    },
    /// The claim on the API server has another UID: it was deleted and recreated.
    #[error(
        "claim {claim} on the API server has UID {found}, not {wanted}: it was deleted and recreated, so the claim asked for no longer exists"
    )]
    OtherUid {
        /// `namespace/name`.
        claim: String,
        /// The UID asked for.
        wanted: String,
        /// The UID found.
        found: String,
    },
    /// The claim has no allocation yet.
    #[error("claim {claim} is not allocated: the scheduler has not chosen its devices")]
    NotAllocated {
        /// `namespace/name`.
        claim: String,
    },
    /// None of the claim's results belong to this driver.
    #[error("claim {claim} has no allocation results for driver {driver}")]
    NoResults {
        /// `namespace/name`.
        claim: String,
        /// This driver.
        driver: String,
    },
    /// A result of this driver is on another node's pool.
    #[error(
        "claim {claim} was allocated device {device} of pool {pool}, which is not this node's pool {ours}"
    )]
    ForeignPool {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// The pool in the result.
        pool: String,
        /// This node's pool.
        ours: String,
    },
    /// A result names a device this node does not publish.
    #[error("claim {claim} was allocated device {device}, which this node does not publish")]
    UnknownDevice {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
    },
    /// A result asks for something nri-accel does not do (admin access) or is malformed.
    #[error("claim {claim}: {why}")]
    Unsupported {
        /// `namespace/name`.
        claim: String,
        /// What and why.
        why: String,
    },
    /// An opaque configuration for this driver does not parse or is too large.
    #[error("claim {claim}: the opaque configuration for driver {driver} is refused: {error}")]
    Config {
        /// `namespace/name`.
        claim: String,
        /// This driver.
        driver: String,
        /// What is wrong with it.
        error: OpaqueError,
    },
}

/// Checks that `namespace/name` can name a ResourceClaim (before asking the API server).
pub fn check_claim_name(namespace: &str, name: &str) -> Result<(), ClaimError> {
    let bad = |what, rule| ClaimError::BadName {
        namespace: namespace.to_string(),
        name: name.to_string(),
        what,
        rule,
    };
    if !is_dns_label(namespace) {
        return Err(bad("namespace", "label"));
    }
    if !is_dns_subdomain(name) {
        return Err(bad("name", "subdomain"));
    }
    Ok(())
}

/// The allocation of `claim` (fetched from the API server) that driver `driver` prepares on the
/// node whose pool is `pool`, for the kubelet's request naming UID `uid`.
///
/// Refuses a claim of another UID, a claim not allocated, a claim without results for this
/// driver, a result on another pool, admin access, and opaque configuration for this driver that
/// does not parse. Results and configuration of other drivers are theirs and are skipped.
pub fn allocation_for(
    claim: &ResourceClaim,
    uid: &str,
    driver: &str,
    pool: &str,
) -> Result<ClaimAllocation, ClaimError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or("");
    let name = claim.metadata.name.as_deref().unwrap_or("");
    check_claim_name(namespace, name)?;
    let id = format!("{namespace}/{name}");
    let found = claim.metadata.uid.as_deref().unwrap_or("");
    if found != uid {
        return Err(ClaimError::OtherUid {
            claim: id,
            wanted: uid.to_string(),
            found: found.to_string(),
        });
    }
    let Some(devices) = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
    else {
        return Err(ClaimError::NotAllocated { claim: id });
    };
    let all = devices.results.as_deref().unwrap_or_default();
    if all.is_empty() {
        return Err(ClaimError::NotAllocated { claim: id });
    }
    let unsupported = |why: String| ClaimError::Unsupported {
        claim: id.clone(),
        why,
    };
    if all.len() > MAX_RESULTS {
        return Err(unsupported(format!(
            "it holds {} allocation results, more than the {MAX_RESULTS} the API allows",
            all.len()
        )));
    }
    let mut results = Vec::new();
    for r in all.iter().filter(|r| r.driver == driver) {
        if r.pool != pool {
            return Err(ClaimError::ForeignPool {
                claim: id,
                device: r.device.clone(),
                pool: r.pool.clone(),
                ours: pool.to_string(),
            });
        }
        if !is_dns_label(&r.device) {
            return Err(unsupported(format!(
                "allocated device {:?} is not a DNS label, so no driver published it",
                r.device
            )));
        }
        if r.request.is_empty() || r.request.len() > 253 {
            return Err(unsupported(format!(
                "the request name of device {} is empty or longer than 253 characters",
                r.device
            )));
        }
        if r.admin_access == Some(true) {
            return Err(unsupported(format!(
                "request {} asks for admin access to device {}, which nri-accel does not grant",
                r.request, r.device
            )));
        }
        results.push(DraResult {
            request: r.request.clone(),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone().filter(|s| !s.is_empty()),
        });
    }
    if results.is_empty() {
        return Err(ClaimError::NoResults {
            claim: id,
            driver: driver.to_string(),
        });
    }
    let mut config = Vec::new();
    for c in devices.config.as_deref().unwrap_or_default() {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let parsed =
            DeviceConfig::parse(&opaque.parameters.0).map_err(|error| ClaimError::Config {
                claim: id.clone(),
                driver: driver.to_string(),
                error,
            })?;
        config.push(ClaimConfig {
            source: if c.source == "FromClass" {
                ConfigSource::Class
            } else {
                ConfigSource::Claim
            },
            requests: c.requests.clone().unwrap_or_default(),
            config: parsed,
        });
    }
    // Class configuration first, then the claim's: the claim's settings win where both set one.
    config.sort_by_key(|c| c.source == ConfigSource::Claim);
    Ok(ClaimAllocation { results, config })
}

impl ClaimAllocation {
    /// The environment each request's containers get from the configuration: every
    /// configuration naming the request (or no request, or the parent of a subrequest
    /// `parent/sub`) applies, class ones first, so the claim's own values win.
    pub fn env(&self) -> RequestEnv {
        let mut env = RequestEnv::new();
        for r in &self.results {
            let parent = r.request.split_once('/').map(|(p, _)| p);
            let applies = |c: &&ClaimConfig| {
                c.requests.is_empty()
                    || c.requests
                        .iter()
                        .any(|q| *q == r.request || Some(q.as_str()) == parent)
            };
            let vars: BTreeMap<String, String> = self
                .config
                .iter()
                .filter(applies)
                .flat_map(|c| c.config.env.clone())
                .collect();
            if !vars.is_empty() {
                env.insert(r.request.clone(), vars);
            }
        }
        env
    }

    /// The results as the engine's results path takes them: the pool of each is the policy pool
    /// that publishes the device (DRA names one pool per node; the engine has one per family).
    /// A device no pool publishes is refused, naming `claim` (`namespace/name`).
    pub fn engine_results(
        &self,
        claim: &str,
        published: &[PublishedDevice],
    ) -> Result<Vec<DraResult>, ClaimError> {
        self.results
            .iter()
            .map(|r| {
                let p = published
                    .iter()
                    .find(|p| p.name == r.device)
                    .ok_or_else(|| ClaimError::UnknownDevice {
                        claim: claim.to_string(),
                        device: r.device.clone(),
                    })?;
                Ok(DraResult {
                    pool: p.pool.clone(),
                    ..r.clone()
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(results: serde_json::Value, config: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": "c", "uid": "u1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}
        }))
        .unwrap()
    }

    fn result(driver: &str, pool: &str, device: &str) -> serde_json::Value {
        json!({"request": "gpu", "driver": driver, "pool": pool, "device": device})
    }

    #[test]
    fn keeps_our_results_and_skips_other_drivers() {
        let c = claim(
            json!([
                result("accel.nri.io", "n1", "gpus-0"),
                result("nic.example.com", "n1", "eth0")
            ]),
            json!([]),
        );
        let a = allocation_for(&c, "u1", "accel.nri.io", "n1").unwrap();
        assert_eq!(a.results.len(), 1);
        assert_eq!(a.results[0].device, "gpus-0");
    }

    #[test]
    fn refusals_name_the_claim() {
        let c = claim(json!([result("accel.nri.io", "n1", "gpus-0")]), json!([]));
        let e = allocation_for(&c, "u2", "accel.nri.io", "n1").unwrap_err();
        assert!(matches!(e, ClaimError::OtherUid { .. }));
        assert!(e.to_string().contains("ns/c"));
        let e = allocation_for(&c, "u1", "accel.nri.io", "n2").unwrap_err();
        assert!(matches!(e, ClaimError::ForeignPool { .. }), "{e}");
        let e = allocation_for(&c, "u1", "other.io", "n1").unwrap_err();
        assert!(matches!(e, ClaimError::NoResults { .. }));
        let mut unallocated = c.clone();
        unallocated.status = None;
        let e = allocation_for(&unallocated, "u1", "accel.nri.io", "n1").unwrap_err();
        assert!(matches!(e, ClaimError::NotAllocated { .. }));
        let mut admin = result("accel.nri.io", "n1", "gpus-0");
        admin["adminAccess"] = json!(true);
        let e = allocation_for(
            &claim(json!([admin]), json!([])),
            "u1",
            "accel.nri.io",
            "n1",
        );
        assert!(matches!(e, Err(ClaimError::Unsupported { .. })));
    }

    #[test]
    fn names_must_be_dns_names() {
        assert!(check_claim_name("ns", "c.1").is_ok());
        assert!(check_claim_name("Ns", "c").is_err());
        assert!(check_claim_name("ns", "c/../x").is_err());
        assert!(check_claim_name("", "c").is_err());
    }

    #[test]
    fn our_opaque_config_is_parsed_and_others_are_skipped() {
        let cfg = json!([
            {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "accel.nri.io",
              "parameters": {"apiVersion": "accel.nri.io/v1alpha1", "kind": "DeviceConfig", "env": {"A": "1"}}}},
            {"source": "FromClass", "opaque": {"driver": "accel.nri.io",
              "parameters": {"apiVersion": "accel.nri.io/v1alpha1", "kind": "DeviceConfig"}}},
            {"source": "FromClaim", "opaque": {"driver": "other.io", "parameters": {"anything": 1}}}
        ]);
        let c = claim(json!([result("accel.nri.io", "n1", "gpus-0")]), cfg);
        let a = allocation_for(&c, "u1", "accel.nri.io", "n1").unwrap();
        assert_eq!(a.config.len(), 2);
        assert_eq!(a.config[0].source, ConfigSource::Class);
        assert_eq!(a.config[1].requests, vec!["gpu".to_string()]);
        let bad = json!([{"source": "FromClaim", "opaque": {"driver": "accel.nri.io",
              "parameters": {"apiVersion": "accel.nri.io/v1alpha1", "kind": "DeviceConfig", "x": 1}}}]);
        let c = claim(json!([result("accel.nri.io", "n1", "gpus-0")]), bad);
        let e = allocation_for(&c, "u1", "accel.nri.io", "n1").unwrap_err();
        assert!(matches!(e, ClaimError::Config { .. }));
        assert!(e.to_string().starts_with("claim ns/c:"), "{e}");
    }

    #[test]
    fn env_goes_to_the_requests_a_config_names_and_the_claim_wins() {
        let opaque = |env: serde_json::Value| {
            json!({"driver": "accel.nri.io", "parameters":
                {"apiVersion": "accel.nri.io/v1alpha1", "kind": "DeviceConfig", "env": env}})
        };
        let cfg = json!([
            {"source": "FromClaim", "requests": ["gpu"], "opaque": opaque(json!({"MODE": "claim"}))},
            {"source": "FromClass", "opaque": opaque(json!({"MODE": "class", "TIER": "gold"}))},
            {"source": "FromClaim", "requests": ["nic"], "opaque": opaque(json!({"NIC": "1"}))},
            {"source": "FromClaim", "requests": ["mig"], "opaque": opaque(json!({"SUB": "1"}))}
        ]);
        let mut sub = result("accel.nri.io", "n1", "gpus-1");
        sub["request"] = json!("mig/small");
        let c = claim(json!([result("accel.nri.io", "n1", "gpus-0"), sub]), cfg);
        let env = allocation_for(&c, "u1", "accel.nri.io", "n1")
            .unwrap()
            .env();
        let vars = |r: &str| {
            env[r]
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(vars("gpu"), ["MODE=claim", "TIER=gold"]);
        assert_eq!(vars("mig/small"), ["MODE=class", "SUB=1", "TIER=gold"]);
        assert_eq!(
            env.len(),
            2,
            "no entry for a request without results: {env:?}"
        );
        let c = claim(json!([result("accel.nri.io", "n1", "gpus-0")]), json!([]));
        assert!(
            allocation_for(&c, "u1", "accel.nri.io", "n1")
                .unwrap()
                .env()
                .is_empty()
        );
    }

    #[test]
    fn engine_results_name_the_policy_pool() {
        let c = claim(json!([result("accel.nri.io", "n1", "gpus-0")]), json!([]));
        let a = allocation_for(&c, "u1", "accel.nri.io", "n1").unwrap();
        let published = vec![PublishedDevice {
            pool: "gpus".into(),
            name: "gpus-0".into(),
            device_id: "0".into(),
            kind: policies::PublishedKind::Whole,
            unit: None,
        }];
        assert_eq!(
            a.engine_results("ns/c", &published).unwrap()[0].pool,
            "gpus"
        );
        let e = a.engine_results("ns/c", &[]).unwrap_err();
        assert!(matches!(e, ClaimError::UnknownDevice { .. }));
    }
}

//! Admission of what asks through DRA claims (issue 36): pods with `resourceClaims` (a KubeVirt
//! launcher pod among them) and KubeVirt VirtualMachineInstances. The claims and templates are
//! read through the API server ([`ClaimLookup`]), then judged by [`super::dra`]; a VM's devices
//! by device plugin resource name are judged against the pools the nodes publish.
//!
//! What cannot be read in time (the API server slow or down, a claim not created yet) is
//! admitted with a warning: the webhook refuses only what it knows no node could serve.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaimSpec;

use super::dra::{self, ClaimAsk, DraView, Judgement};
use super::fleet::Capacity;
use super::review::{PodClaim, Verdict};
use super::vmi::Vmi;

/// The longest the claims of one review are looked up for; the API server's webhook timeout is
/// 5 s, so the answer always comes in time.
pub const LOOKUP_BUDGET: Duration = Duration::from_secs(3);

/// Where claims and templates are read: the API server in the webhook, a map in tests.
#[async_trait::async_trait]
pub trait ClaimLookup: Send + Sync + 'static {
    /// The spec of ResourceClaim `namespace/name`; `None` when it does not exist.
    async fn claim(&self, namespace: &str, name: &str)
    -> Result<Option<ResourceClaimSpec>, String>;
    /// The claim spec of ResourceClaimTemplate `namespace/name`; `None` when it does not exist.
    async fn template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaimSpec>, String>;
}

#[async_trait::async_trait]
impl ClaimLookup for crate::kube::KubeClient {
    async fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaimSpec>, String> {
        self.claim_spec(namespace, name)
            .await
            .map_err(|e| e.to_string())
    }

    async fn template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaimSpec>, String> {
        self.claim_template_spec(namespace, name)
            .await
            .map_err(|e| e.to_string())
    }
}

/// The asks of `claims` (in `namespace`): every request, or for a VM only the requests its
/// devices name (`wanted`: claim name -> request names, empty for all). Claims that cannot be
/// read are left out with a warning.
pub async fn claim_asks(
    lookup: &dyn ClaimLookup,
    namespace: &str,
    claims: &[PodClaim],
    wanted: Option<&BTreeMap<&str, Vec<&str>>>,
) -> (Vec<ClaimAsk>, Vec<String>) {
    let mut asks = Vec::new();
    let mut warnings = Vec::new();
    for c in claims {
        let names = match wanted {
            Some(w) => match w.get(c.name.as_str()) {
                Some(names) => Some(names),
                None => continue,
            },
            None => None,
        };
        let (label, found) = match (&c.resource_claim_name, &c.resource_claim_template_name) {
            (Some(n), _) => (
                format!("claim {namespace}/{n}"),
                lookup.claim(namespace, n).await,
            ),
            (None, Some(t)) => (
                format!("claim template {namespace}/{t} (pod claim {})", c.name),
                lookup.template(namespace, t).await,
            ),
            (None, None) => continue,
        };
        match found {
            Ok(Some(spec)) => {
                let mut requests = dra::requests_of(&spec);
                if let Some(names) = names.filter(|n| !n.is_empty()) {
                    requests.retain(|r| names.contains(&r.name.as_str()));
                }
                asks.push(ClaimAsk { label, requests });
            }
            Ok(None) => warnings.push(format!(
                "{label} does not exist yet: nri-accel's webhook did not check it"
            )),
            Err(why) => warnings.push(format!(
                "{label} could not be read ({why}): nri-accel's webhook did not check it"
            )),
        }
    }
    (asks, warnings)
}

/// The verdict on a pod's (or VM's) claim asks.
pub fn judge_asks(
    view: &DraView,
    whose: &str,
    asks: &[ClaimAsk],
    mut warnings: Vec<String>,
) -> Verdict {
    if asks.iter().all(|a| a.requests.is_empty()) {
        return Verdict::allow(warnings);
    }
    if view.nodes.is_empty() {
        warnings.push(format!(
            "{whose}: no node publishes ResourceSlices of driver {} that nri-accel's webhook could read, so its claims were not checked",
            view.driver
        ));
        return Verdict::allow(warnings);
    }
    match dra::judge(view, whose, asks) {
        Judgement::Servable { warnings: more } => {
            warnings.extend(more);
            Verdict::allow(warnings)
        }
        Judgement::Refused(why) => Verdict::refuse(why),
    }
}

/// Judges a VM's devices asked by device plugin resource name (`<prefix>/<pool>`): some node
/// must publish, in each pool, at least as many devices as the VM asks there.
pub fn judge_resources(
    vmi: &Vmi,
    whose: &str,
    prefix: &str,
    capacity: &Capacity,
) -> Option<Verdict> {
    let asked: BTreeMap<&str, u32> = vmi
        .by_resource()
        .into_iter()
        .filter_map(|(r, n)| r.strip_prefix(prefix)?.strip_prefix('/').map(|p| (p, n)))
        .collect();
    if asked.is_empty() {
        return None;
    }
    let Capacity::Known(nodes) = capacity else {
        return None;
    };
    let per_node = |pool: &str| -> Vec<(&str, u32)> {
        nodes
            .iter()
            .map(|(n, ds)| {
                (
                    n.as_str(),
                    ds.iter().filter(|d| d.pool == pool).count() as u32,
                )
            })
            .collect()
    };
    for (pool, n) in &asked {
        let counts = per_node(pool);
        let Some((node, most)) = counts.iter().max_by_key(|(_, c)| *c).copied() else {
            continue;
        };
        if most < *n {
            return Some(Verdict::refuse(if most == 0 {
                format!(
                    "{whose} asks for {n} devices of resource {prefix}/{pool}, but no node publishes a device of pool {pool}; no node can ever serve it"
                )
            } else {
                format!(
                    "{whose} asks for {n} devices of resource {prefix}/{pool}, but the most any node has in pool {pool} is {most} (node {node}); ask for at most {most}"
                )
            }));
        }
    }
    let together = nodes.keys().any(|node| {
        asked
            .iter()
            .all(|(pool, n)| nodes[node].iter().filter(|d| d.pool == *pool).count() as u32 >= *n)
    });
    if !together {
        let asks: Vec<String> = asked
            .iter()
            .map(|(p, n)| format!("{n} of {prefix}/{p}"))
            .collect();
        return Some(Verdict::refuse(format!(
            "{whose}: no one node has all its devices ({}); a VM's devices must all sit on its node",
            asks.join(", ")
        )));
    }
    None
}

/// The verdict on one decoded review: a pod's annotations ([`super::check`]) and DRA claims, or
/// a VMI's devices. `claims` is `None` when the webhook has no API server (`--capacity none`).
pub async fn review(
    rules: &super::check::Rules,
    fleet: &super::fleet::Fleet,
    claims: Option<&dyn ClaimLookup>,
    resource_prefix: &str,
    request: &super::review::Request,
) -> Result<Verdict, super::WebhookError> {
    let namespace = request.namespace.clone().unwrap_or_default();
    if request.is_vmi() {
        let Some(object) = &request.object else {
            return Ok(Verdict::allow(Vec::new()));
        };
        let vmi: Vmi = serde::Deserialize::deserialize(object).map_err(|e| {
            super::WebhookError::BadReview {
                why: format!("the object is not a VirtualMachineInstance ({e})"),
            }
        })?;
        let whose = vmi.label(&namespace);
        if let Some(refused) = judge_resources(&vmi, &whose, resource_prefix, &fleet.capacity()) {
            return Ok(refused);
        }
        let wanted = vmi.by_claim();
        if wanted.is_empty() {
            return Ok(Verdict::allow(Vec::new()));
        }
        let Some(lookup) = claims else {
            return Ok(Verdict::allow(Vec::new()));
        };
        let (asks, warnings) = within_budget(claim_asks(
            lookup,
            &namespace,
            &vmi.spec.resource_claims,
            Some(&wanted),
        ))
        .await;
        return Ok(judge_asks(&fleet.dra(), &whose, &asks, warnings));
    }
    let Some(pod) = request.pod()? else {
        return Ok(Verdict::allow(Vec::new()));
    };
    let verdict = super::check::check(rules, &namespace, &pod, &fleet.capacity());
    if !verdict.allowed || pod.spec.resource_claims.is_empty() {
        return Ok(verdict);
    }
    let Some(lookup) = claims else {
        return Ok(verdict);
    };
    let whose = format!(
        "pod {}/{}",
        pod.metadata
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(&namespace),
        pod.metadata
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| pod
                .metadata
                .generate_name
                .clone()
                .map(|g| format!("{g}<generated>")))
            .unwrap_or_else(|| "<unnamed>".to_string())
    );
    let (asks, mut warnings) = within_budget(claim_asks(
        lookup,
        &namespace,
        &pod.spec.resource_claims,
        None,
    ))
    .await;
    let mut all = verdict.warnings;
    all.append(&mut warnings);
    Ok(judge_asks(&fleet.dra(), &whose, &asks, all))
}

/// The lookups of one review, cut at [`LOOKUP_BUDGET`]: then nothing is judged, with a warning.
async fn within_budget(
    lookups: impl std::future::Future<Output = (Vec<ClaimAsk>, Vec<String>)>,
) -> (Vec<ClaimAsk>, Vec<String>) {
    match tokio::time::timeout(LOOKUP_BUDGET, lookups).await {
        Ok(found) => found,
        Err(_) => (
            Vec::new(),
            vec![format!(
                "the claims could not be read within {} s: nri-accel's webhook did not check them",
                LOOKUP_BUDGET.as_secs()
            )],
        ),
    }
}

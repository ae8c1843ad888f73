//! The annotation path: a pod annotation asks for accelerators per container,
//! for clusters without DRA.
//!
//! Key: `<prefix>/container.<container-name>` (prefix `accel.nri.io` by
//! default). Value: comma-separated `key=value` pairs:
//! `count=<n>` (default 1), `family=exclusive|shared|sliced`, `vendor=<name>`,
//! `model=<name>`, `pci-id=<vvvv:dddd>`, `device=<id>` (repeatable),
//! `profile=<name>` (sliced), `shares=<n>` (shared). Unknown keys are errors.
//! Example: `accel.nri.io/container.trainer: "count=2,vendor=nvidia,family=exclusive"`.

use std::collections::BTreeMap;

use policies::{Ask, ClaimRequest, CountRequest, DeviceSelector, FamilyKind};

/// Longest annotation value read; longer ones are refused.
pub const MAX_VALUE_LEN: usize = 1024;

/// A request that cannot be served, as one sentence for the container's creation error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// The value does not parse.
    #[error("annotation {key}: {reason}; expected e.g. \"count=1,family=exclusive,vendor=nvidia\"")]
    Malformed {
        /// The annotation key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The pod asks for accelerators of two vendors; nothing downstream models that.
    #[error(
        "pod {pod} asks for accelerators of two vendors ({first} and {second}); a pod may use one vendor only: split it into two pods"
    )]
    MixedVendors {
        /// The pod (namespace/name).
        pod: String,
        /// One vendor.
        first: String,
        /// The other.
        second: String,
    },
}

/// What one container asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerAsk {
    /// Devices wanted.
    pub count: u32,
    /// Family, if given.
    pub family: Option<FamilyKind>,
    /// Which devices qualify.
    pub selector: DeviceSelector,
    /// Slice profile (sliced family).
    pub profile: Option<String>,
    /// Shares per device (shared family).
    pub shares: Option<u32>,
}

impl ContainerAsk {
    /// The claim the engine prepares for this container.
    pub fn to_claim(&self, uid: String, namespace: &str, name: &str) -> ClaimRequest {
        ClaimRequest {
            uid,
            namespace: namespace.to_string(),
            name: name.to_string(),
            ask: Ask::Count(vec![CountRequest {
                request: "annotation".into(),
                count: self.count,
                family: self.family.clone(),
                selector: self.selector.clone(),
                profile: self.profile.clone(),
                shares: self.shares,
            }]),
        }
    }
}

/// The key that carries `container`'s request.
pub fn key_for(prefix: &str, container: &str) -> String {
    format!("{prefix}/container.{container}")
}

/// The container names a pod's annotations ask devices for, sorted.
pub fn asked_names(prefix: &str, annotations: &BTreeMap<String, String>) -> Vec<String> {
    let sibling_prefix = format!("{prefix}/container.");
    annotations
        .range(sibling_prefix.clone()..)
        .take_while(|(key, _)| key.starts_with(&sibling_prefix))
        .map(|(key, _)| key[sibling_prefix.len()..].to_string())
        .collect()
}

/// The request of `container` in the pod's annotations, if any; refuses pods
/// whose containers ask for two vendors.
pub fn container_ask(
    prefix: &str,
    pod: &str,
    annotations: &BTreeMap<String, String>,
    container: &str,
) -> Result<Option<ContainerAsk>, AnnotationError> {
    let own_key = key_for(prefix, container);
    let sibling_prefix = format!("{prefix}/container.");
    let mut vendors: Vec<String> = Vec::new();
    let mut own = None;
    for (key, value) in annotations.range(sibling_prefix.clone()..) {
        if !key.starts_with(&sibling_prefix) {
            break;
        }
        let ask = parse(key, value)?;
        if let Some(v) = &ask.selector.vendor
            && !vendors.iter().any(|x| x.eq_ignore_ascii_case(v))
        {
            vendors.push(v.to_ascii_lowercase());
        }
        if *key == own_key {
            own = Some(ask);
        }
    }
    if vendors.len() > 1 {
        return Err(AnnotationError::MixedVendors {
            pod: pod.to_string(),
            first: vendors[0].clone(),
            second: vendors[1].clone(),
        });
    }
    Ok(own)
}

/// Parses one annotation value.
pub fn parse(key: &str, value: &str) -> Result<ContainerAsk, AnnotationError> {
    let bad = |reason: String| AnnotationError::Malformed {
        key: key.to_string(),
        reason,
    };
    if value.len() > MAX_VALUE_LEN {
        return Err(bad(format!("value longer than {MAX_VALUE_LEN} bytes")));
    }
    let mut ask = ContainerAsk {
        count: 1,
        family: None,
        selector: DeviceSelector::default(),
        profile: None,
        shares: None,
    };
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("{part:?} is not key=value")))?;
        let (k, v) = (k.trim(), v.trim());
        let number = |v: &str| -> Result<u32, AnnotationError> {
            v.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(format!("{k}={v:?} is not a positive number")))
        };
        match k {
            "count" => ask.count = number(v)?,
            "shares" => ask.shares = Some(number(v)?),
            "family" => {
                ask.family = Some(match v {
                    "exclusive" => FamilyKind::Exclusive,
                    "shared" => FamilyKind::Shared,
                    "sliced" => FamilyKind::Sliced,
                    other => {
                        return Err(bad(format!(
                            "family {other:?} is not one of exclusive, shared, sliced"
                        )));
                    }
                })
            }
            "vendor" => ask.selector.vendor = Some(v.to_string()),
            "model" => ask.selector.model = Some(v.to_string()),
            "pci-id" => ask.selector.pci_id = Some(v.to_string()),
            "device" => ask.selector.ids.push(v.to_string()),
            "profile" => ask.profile = Some(v.to_string()),
            other => return Err(bad(format!("unknown key {other:?}"))),
        }
    }
    Ok(ask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_a_full_request() {
        let a = parse("k", "count=2, family=sliced,vendor=nvidia,profile=1g.10gb").unwrap();
        assert_eq!(a.count, 2);
        assert_eq!(a.family, Some(FamilyKind::Sliced));
        assert_eq!(a.selector.vendor.as_deref(), Some("nvidia"));
        assert_eq!(a.profile.as_deref(), Some("1g.10gb"));
    }

    #[test]
    fn refuses_unknown_keys_bad_numbers_and_families() {
        assert!(
            parse("k", "colour=red")
                .unwrap_err()
                .to_string()
                .contains("unknown key")
        );
        assert!(parse("k", "count=0").is_err());
        assert!(parse("k", "count=-1").is_err());
        assert!(parse("k", "family=fractional").is_err());
        assert!(parse("k", "count").is_err());
        assert!(parse("k", &"x".repeat(2000)).is_err());
    }

    #[test]
    fn finds_the_containers_own_request_and_refuses_two_vendors() {
        let p = pod(&[
            ("accel.nri.io/container.a", "vendor=nvidia"),
            ("accel.nri.io/container.b", "count=1"),
            ("other/annotation", "x"),
        ]);
        let a = container_ask("accel.nri.io", "ns/p", &p, "a")
            .unwrap()
            .unwrap();
        assert_eq!(a.selector.vendor.as_deref(), Some("nvidia"));
        assert!(
            container_ask("accel.nri.io", "ns/p", &p, "c")
                .unwrap()
                .is_none()
        );

        let mixed = pod(&[
            ("accel.nri.io/container.a", "vendor=nvidia"),
            ("accel.nri.io/container.b", "vendor=amd"),
        ]);
        let err = container_ask("accel.nri.io", "ns/p", &mixed, "a").unwrap_err();
        assert!(err.to_string().contains("two vendors"), "{err}");
    }
}

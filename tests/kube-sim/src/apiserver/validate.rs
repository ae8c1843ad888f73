//! Validation of written objects: names, and the ResourceSlice rules and limits of
//! resource.k8s.io/v1 (Kubernetes 1.35+ layout: counter sets in slices of their own).
//!
//! Written from the API reference, independently of nri-accel's own code, so a plugin that
//! breaks a limit is refused here with a 422 as a real server would refuse it.

use std::collections::BTreeSet;

use serde_json::Value;

/// A rule broken: the field path and why.
pub type Violation = (String, String);

/// Largest devices per slice.
pub const MAX_DEVICES: usize = 128;
/// Largest devices per slice when any device consumes counters or has taints.
pub const MAX_DEVICES_WITH_COUNTERS: usize = 64;
/// Largest counter sets per slice.
pub const MAX_COUNTER_SETS: usize = 8;
/// Largest counters per set, and per consumption.
pub const MAX_COUNTERS: usize = 32;
/// Largest counter consumptions per device.
pub const MAX_CONSUMPTIONS: usize = 2;
/// Largest counters consumed by all devices of a slice together.
pub const MAX_CONSUMED_PER_SLICE: usize = 1024;
/// Largest attributes + capacities per device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Longest string or version attribute value.
pub const MAX_ATTRIBUTE_VALUE: usize = 64;
/// Longest driver name.
pub const MAX_DRIVER_NAME: usize = 63;

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS subdomain (RFC 1123, at most 253 characters).
pub fn is_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label)
}

fn is_c_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// A qualified attribute or capacity name: an optional `domain/` and a C identifier.
fn is_qualified(s: &str) -> bool {
    match s.split_once('/') {
        Some((domain, id)) => is_subdomain(domain) && is_c_identifier(id),
        None => is_c_identifier(s),
    }
}

/// A Kubernetes quantity such as `80Gi`, `1`, `500m` or `1e3`.
pub fn is_quantity(v: &Value) -> bool {
    let Some(s) = v.as_str() else {
        return v.is_number();
    };
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(digits);
    let num_ok = !num.is_empty() && num != "." && num.matches('.').count() <= 1;
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix.strip_prefix(['e', 'E']).is_some_and(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|c| c.is_ascii_digit())
    });
    num_ok && suffix_ok
}

fn check(ok: bool, field: impl Into<String>, why: impl Into<String>) -> Result<(), Violation> {
    if ok {
        Ok(())
    } else {
        Err((field.into(), why.into()))
    }
}

fn len(v: &Value) -> usize {
    v.as_array().map_or(0, Vec::len)
}

/// Checks an object name.
pub fn name(name: &str) -> Result<(), Violation> {
    check(
        is_subdomain(name),
        "metadata.name",
        format!(
            "{name:?} is not a DNS subdomain: lower-case alphanumerics, '-' and '.', at most 253 characters"
        ),
    )
}

/// Checks a ResourceSlice's spec.
pub fn resource_slice(spec: &Value) -> Result<(), Violation> {
    let driver = spec["driver"].as_str().unwrap_or("");
    check(
        is_subdomain(driver) && driver.len() <= MAX_DRIVER_NAME,
        "spec.driver",
        format!("{driver:?} must be a DNS subdomain of at most {MAX_DRIVER_NAME} characters"),
    )?;
    let pool = &spec["pool"];
    let pool_name = pool["name"].as_str().unwrap_or("");
    check(
        pool_name.len() <= 253 && pool_name.split('/').all(is_subdomain),
        "spec.pool.name",
        "must be one or more DNS subdomains separated by slashes",
    )?;
    check(
        pool["generation"].as_i64().is_some_and(|g| g >= 0),
        "spec.pool.generation",
        "must be a number >= 0",
    )?;
    check(
        pool["resourceSliceCount"].as_i64().is_some_and(|c| c > 0),
        "spec.pool.resourceSliceCount",
        "must be greater than zero",
    )?;
    let placements = [
        spec["nodeName"].as_str().is_some_and(|s| !s.is_empty()),
        !spec["nodeSelector"].is_null(),
        spec["allNodes"].as_bool() == Some(true),
        spec["perDeviceNodeSelection"].as_bool() == Some(true),
    ];
    check(
        placements.iter().filter(|p| **p).count() == 1,
        "spec",
        "exactly one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection must be set",
    )?;
    if let Some(node) = spec["nodeName"].as_str() {
        check(
            is_subdomain(node),
            "spec.nodeName",
            "must be a DNS subdomain",
        )?;
    }
    let devices = len(&spec["devices"]);
    let sets = len(&spec["sharedCounters"]);
    check(
        devices == 0 || sets == 0,
        "spec",
        "only one of devices and sharedCounters can be set",
    )?;
    check(
        sets <= MAX_COUNTER_SETS,
        "spec.sharedCounters",
        format!("must have at most {MAX_COUNTER_SETS} entries"),
    )?;
    let mut set_names = BTreeSet::new();
    for (i, set) in spec["sharedCounters"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("spec.sharedCounters[{i}]");
        let n = set["name"].as_str().unwrap_or("");
        check(is_label(n), format!("{at}.name"), "must be a DNS label")?;
        check(
            set_names.insert(n),
            format!("{at}.name"),
            "duplicate counter set name",
        )?;
        let counters = set["counters"].as_object();
        check(
            counters.is_some_and(|c| !c.is_empty() && c.len() <= MAX_COUNTERS),
            format!("{at}.counters"),
            format!("must have 1 to {MAX_COUNTERS} counters"),
        )?;
        for (k, v) in counters.into_iter().flatten() {
            check(
                is_label(k),
                format!("{at}.counters[{k}]"),
                "must be a DNS label",
            )?;
            check(
                is_quantity(&v["value"]),
                format!("{at}.counters[{k}].value"),
                "not a quantity",
            )?;
        }
    }
    let gated = spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| len(&d["consumesCounters"]) > 0 || len(&d["taints"]) > 0);
    let limit = if gated {
        MAX_DEVICES_WITH_COUNTERS
    } else {
        MAX_DEVICES
    };
    check(
        devices <= limit,
        "spec.devices",
        format!("must have at most {limit} entries"),
    )?;
    let mut names = BTreeSet::new();
    let mut consumed = 0;
    for (i, d) in spec["devices"].as_array().into_iter().flatten().enumerate() {
        let at = format!("spec.devices[{i}]");
        let n = d["name"].as_str().unwrap_or("");
        check(
            is_label(n),
            format!("{at}.name"),
            format!("{n:?} must be a DNS label"),
        )?;
        check(
            names.insert(n),
            format!("{at}.name"),
            format!("duplicate device name {n:?}"),
        )?;
        let attrs = d["attributes"].as_object();
        let caps = d["capacity"].as_object();
        let total = attrs.map_or(0, |a| a.len()) + caps.map_or(0, |c| c.len());
        check(
            total <= MAX_ATTRIBUTES_AND_CAPACITIES,
            at.clone(),
            format!("at most {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities together"),
        )?;
        for (k, v) in attrs.into_iter().flatten() {
            let fa = format!("{at}.attributes[{k}]");
            check(is_qualified(k), fa.clone(), "not a qualified name")?;
            let kinds = ["int", "bool", "string", "version"]
                .iter()
                .chain(super::gates::LIST_VALUES.iter())
                .filter(|t| !v[**t].is_null())
                .count();
            check(
                kinds == 1,
                fa.clone(),
                "exactly one value must be specified",
            )?;
            for t in super::gates::LIST_VALUES {
                if let Some(list) = v[t].as_array() {
                    check(
                        !list.is_empty(),
                        format!("{fa}.{t}"),
                        "must not be empty if specified",
                    )?;
                }
            }
            for t in ["string", "version"] {
                if let Some(s) = v[t].as_str() {
                    check(
                        s.len() <= MAX_ATTRIBUTE_VALUE,
                        fa.clone(),
                        format!("must be at most {MAX_ATTRIBUTE_VALUE} characters"),
                    )?;
                }
            }
        }
        for (k, v) in caps.into_iter().flatten() {
            let fc = format!("{at}.capacity[{k}]");
            check(is_qualified(k), fc.clone(), "not a qualified name")?;
            check(
                is_quantity(&v["value"]),
                format!("{fc}.value"),
                "not a quantity",
            )?;
        }
        check(
            len(&d["consumesCounters"]) <= MAX_CONSUMPTIONS,
            format!("{at}.consumesCounters"),
            format!("must have at most {MAX_CONSUMPTIONS} entries"),
        )?;
        for (j, c) in d["consumesCounters"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let fc = format!("{at}.consumesCounters[{j}]");
            check(
                is_label(c["counterSet"].as_str().unwrap_or("")),
                format!("{fc}.counterSet"),
                "must be a DNS label",
            )?;
            let counters = c["counters"].as_object();
            check(
                counters.is_some_and(|c| !c.is_empty() && c.len() <= MAX_COUNTERS),
                format!("{fc}.counters"),
                format!("must have 1 to {MAX_COUNTERS} counters"),
            )?;
            consumed += counters.map_or(0, |c| c.len());
        }
        check(
            len(&d["taints"]) <= 4,
            format!("{at}.taints"),
            "at most 4 taints",
        )?;
    }
    check(
        consumed <= MAX_CONSUMED_PER_SLICE,
        "spec.devices",
        format!(
            "the devices consume {consumed} counters together, more than {MAX_CONSUMED_PER_SLICE}"
        ),
    )
}

/// Checks that an update leaves the immutable fields of a ResourceSlice alone.
pub fn resource_slice_update(old: &Value, new: &Value) -> Result<(), Violation> {
    for field in ["driver", "nodeName"] {
        check(
            old["spec"][field] == new["spec"][field],
            format!("spec.{field}"),
            "field is immutable",
        )?;
    }
    check(
        old["spec"]["pool"]["name"] == new["spec"]["pool"]["name"],
        "spec.pool.name",
        "field is immutable",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(devices: Value) -> Value {
        json!({"driver": "accel.nri.io", "nodeName": "n1",
               "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
               "devices": devices})
    }

    #[test]
    fn a_valid_slice_passes() {
        let d = json!([{"name": "gpu-0", "attributes": {"model": {"string": "x"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"}},
            "capacity": {"memory": {"value": "80Gi"}}}]);
        resource_slice(&spec(d)).unwrap();
    }

    #[test]
    fn limits_are_enforced() {
        let many: Vec<Value> = (0..129).map(|i| json!({"name": format!("d{i}")})).collect();
        assert!(resource_slice(&spec(Value::Array(many))).is_err());
        let counted: Vec<Value> = (0..65)
            .map(|i| {
                json!({"name": format!("d{i}"),
                "consumesCounters": [{"counterSet": "c", "counters": {"s0": {"value": "1"}}}]})
            })
            .collect();
        assert!(resource_slice(&spec(Value::Array(counted))).is_err());
        let long = "x".repeat(65);
        let d = json!([{"name": "d", "attributes": {"a": {"string": long}}}]);
        assert!(resource_slice(&spec(d)).is_err());
        let d = json!([{"name": "D_bad"}]);
        assert!(resource_slice(&spec(d)).is_err());
        let mut both = spec(json!([{"name": "d"}]));
        both["sharedCounters"] = json!([{"name": "c", "counters": {"s0": {"value": "1"}}}]);
        assert!(resource_slice(&both).is_err());
    }

    #[test]
    fn quantities() {
        for q in ["1", "80Gi", "500m", "1e3", "0.5", "+2"] {
            assert!(is_quantity(&json!(q)), "{q}");
        }
        for q in ["", "Gi", "1.2.3", "1X", "e3"] {
            assert!(!is_quantity(&json!(q)), "{q}");
        }
    }
}

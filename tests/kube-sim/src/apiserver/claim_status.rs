//! Server-side apply of a ResourceClaim's `status.devices` (the `status` subresource), as far as
//! a DRA driver uses it: the list is keyed by driver, pool, device and share ID, each entry
//! belongs whole to the field manager that applied it, and an apply that leaves out an entry
//! its manager applied before removes it. Entries must name an allocated device of the claim and
//! carry well-formed conditions, as the real server's validation demands.
//!
//! Written from the API reference (resource.k8s.io/v1 AllocatedDeviceStatus, server-side apply),
//! independently of nri-accel's own code.

use std::collections::BTreeSet;

use serde_json::Value;

use super::validate::Violation;

/// The key of one `status.devices` entry: driver, pool, device, share ID.
pub type DeviceKey = (String, String, String, String);

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

/// The key of an entry or of an allocation result.
pub fn key(e: &Value) -> DeviceKey {
    (
        text(&e["driver"]),
        text(&e["pool"]),
        text(&e["device"]),
        text(&e["shareID"]),
    )
}

/// Checks the entries an apply brings against the claim they are applied to.
pub fn validate(claim: &Value, entries: &[Value]) -> Result<(), Violation> {
    let allocated: BTreeSet<DeviceKey> = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(key)
        .collect();
    let mut seen = BTreeSet::new();
    for (i, e) in entries.iter().enumerate() {
        let at = format!("status.devices[{i}]");
        for field in ["driver", "pool", "device"] {
            if text(&e[field]).is_empty() {
                return Err((format!("{at}.{field}"), "Required value".into()));
            }
        }
        let k = key(e);
        if !allocated.contains(&k) {
            return Err((at, "must be an allocated device in the claim".into()));
        }
        if !seen.insert(k) {
            return Err((at, "Duplicate value".into()));
        }
        let conditions = e["conditions"].as_array().map_or(&[][..], Vec::as_slice);
        if conditions.len() > 8 {
            return Err((
                format!("{at}.conditions"),
                "must have at most 8 items".into(),
            ));
        }
        for (j, c) in conditions.iter().enumerate() {
            for field in ["type", "status", "reason", "lastTransitionTime"] {
                if text(&c[field]).is_empty() {
                    return Err((
                        format!("{at}.conditions[{j}].{field}"),
                        "Required value".into(),
                    ));
                }
            }
            if !matches!(c["status"].as_str(), Some("True" | "False" | "Unknown")) {
                return Err((
                    format!("{at}.conditions[{j}].status"),
                    "Unsupported value".into(),
                ));
            }
        }
        if !e["data"].is_null() && !e["data"].is_object() {
            return Err((format!("{at}.data"), "must be a JSON object".into()));
        }
    }
    Ok(())
}

/// The claim's `status.devices` after `manager`'s apply of `entries`, given the keys it owned
/// before (`owned`): its old entries that it left out are gone, its new ones replace any of the
/// same key, and other managers' entries stay.
pub fn merge(current: &[Value], owned: &BTreeSet<DeviceKey>, entries: &[Value]) -> Vec<Value> {
    let applied: BTreeSet<DeviceKey> = entries.iter().map(key).collect();
    let mut out: Vec<Value> = current
        .iter()
        .filter(|e| {
            let k = key(e);
            !applied.contains(&k) && !owned.contains(&k)
        })
        .cloned()
        .collect();
    out.extend(entries.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim() -> Value {
        json!({"status": {"allocation": {"devices": {"results": [
            {"driver": "d", "pool": "p", "device": "a", "request": "r"},
            {"driver": "d", "pool": "p", "device": "b", "request": "r"},
        ]}}}})
    }

    fn entry(device: &str) -> Value {
        json!({"driver": "d", "pool": "p", "device": device, "conditions": [
            {"type": "Ready", "status": "True", "reason": "Prepared",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    }

    #[test]
    fn only_allocated_devices_with_whole_conditions_pass() {
        validate(&claim(), &[entry("a"), entry("b")]).unwrap();
        assert!(validate(&claim(), &[entry("c")]).is_err());
        let mut e = entry("a");
        e["conditions"][0]["reason"] = json!("");
        assert!(validate(&claim(), &[e]).is_err());
        let mut e = entry("a");
        e["data"] = json!([1]);
        assert!(validate(&claim(), &[e]).is_err());
    }

    #[test]
    fn an_apply_replaces_and_removes_only_its_own_entries() {
        let other = json!({"driver": "x", "pool": "p", "device": "z"});
        let current = vec![other.clone(), entry("a")];
        let owned = BTreeSet::from([key(&entry("a"))]);
        assert_eq!(
            merge(&current, &owned, &[entry("b")]),
            vec![other.clone(), entry("b")]
        );
        assert_eq!(merge(&current, &owned, &[]), vec![other]);
    }
}

//! A simulated scheduler: allocates a ResourceClaim's devices from the ResourceSlices a driver
//! published, the way kube-scheduler's DRA plugin does for what nri-accel's tests and demo need.
//!
//! It works on the API server's JSON (resource.k8s.io/v1), independently of nri-accel's types:
//! a device already allocated to another claim is never taken again unless it allows multiple
//! allocations (then each result gets a share ID of its own), and a device that consumes shared
//! counters is taken only while its counter set has enough left after every allocated device's
//! consumption, so two overlapping partitions are never both allocated.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One request of a claim: a name and which devices qualify.
pub struct DeviceRequest<'a> {
    /// The request's name in the claim.
    pub name: &'a str,
    /// Whether a published device (its JSON) satisfies the request.
    pub matches: &'a dyn Fn(&Value) -> bool,
}

/// The string value of a device attribute (`attributes.<name>.string`).
pub fn attribute<'a>(device: &'a Value, name: &str) -> Option<&'a str> {
    device["attributes"][name]["string"].as_str()
}

/// A Kubernetes quantity as a plain number (integers with an optional binary or decimal suffix;
/// enough for counters and capacities published as whole units).
pub fn quantity(v: &Value) -> Option<u128> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let n: u128 = digits.parse().ok()?;
    let scale: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// A device of a pool, with where it was published.
struct Published<'a> {
    pool: &'a str,
    device: &'a Value,
}

/// (pool, counter set, counter) -> amount.
type Counters = BTreeMap<(String, String, String), u128>;

fn consumption(pool: &str, device: &Value) -> Counters {
    let mut out = Counters::new();
    for c in device["consumesCounters"].as_array().into_iter().flatten() {
        let set = c["counterSet"].as_str().unwrap_or_default();
        for (name, v) in c["counters"].as_object().into_iter().flatten() {
            let amount = quantity(&v["value"]).unwrap_or(u128::MAX);
            *out.entry((pool.to_string(), set.to_string(), name.clone()))
                .or_default() += amount;
        }
    }
    out
}

/// Whether a device carries a taint that keeps claims off it (no claim here tolerates one):
/// `NoSchedule` or `NoExecute`, as the real scheduler's DRA allocator judges it.
fn tainted(device: &Value) -> bool {
    device["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")))
}

/// Allocates `requests` (one device each) of driver `driver` on node `node`, given every
/// ResourceSlice and every claim already allocated; answers the claim's `status.allocation`, or
/// why it cannot be allocated (tainted devices never are; a shared device at most its `shares`
/// capacity times). `uid` seeds the share IDs.
pub fn allocate(
    slices: &[Value],
    claims: &[Value],
    driver: &str,
    node: &str,
    uid: &str,
    requests: &[DeviceRequest<'_>],
) -> Result<Value, String> {
    let ours: Vec<&Value> = slices
        .iter()
        .filter(|s| s["spec"]["driver"] == driver && s["spec"]["nodeName"] == node)
        .collect();
    let mut available = Counters::new();
    let mut devices = Vec::new();
    for s in &ours {
        let pool = s["spec"]["pool"]["name"].as_str().unwrap_or_default();
        for set in s["spec"]["sharedCounters"].as_array().into_iter().flatten() {
            let name = set["name"].as_str().unwrap_or_default();
            for (counter, v) in set["counters"].as_object().into_iter().flatten() {
                available.insert(
                    (pool.to_string(), name.to_string(), counter.clone()),
                    quantity(&v["value"]).unwrap_or(0),
                );
            }
        }
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            devices.push(Published { pool, device: d });
        }
    }
    let find = |pool: &str, name: &str| {
        devices
            .iter()
            .find(|p| p.pool == pool && p.device["name"] == name)
    };
    // What the claims already allocated hold.
    let mut taken: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut used = Counters::new();
    let allocated = claims
        .iter()
        .flat_map(|c| {
            c["status"]["allocation"]["devices"]["results"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|r| r["driver"] == driver);
    for r in allocated {
        let (pool, name) = (
            r["pool"].as_str().unwrap_or_default(),
            r["device"].as_str().unwrap_or_default(),
        );
        *taken.entry((pool.into(), name.into())).or_default() += 1;
        if let Some(p) = find(pool, name) {
            for (k, v) in consumption(pool, p.device) {
                *used.entry(k).or_default() += v;
            }
        }
    }
    let mut results = Vec::new();
    for (i, req) in requests.iter().enumerate() {
        let pick = devices.iter().find(|p| {
            let name = p.device["name"].as_str().unwrap_or_default();
            let shared = p.device["allowMultipleAllocations"] == true;
            let claims = taken
                .get(&(p.pool.to_string(), name.to_string()))
                .copied()
                .unwrap_or(0);
            // A shared device takes as many claims as its `shares` capacity (each takes one),
            // any number without one.
            let free = match (shared, quantity(&p.device["capacity"]["shares"]["value"])) {
                (true, Some(shares)) => (claims as u128) < shares,
                (true, None) => true,
                (false, _) => claims == 0,
            };
            let fits = consumption(p.pool, p.device).iter().all(|(k, need)| {
                let have = available.get(k).copied().unwrap_or(0);
                used.get(k).copied().unwrap_or(0).saturating_add(*need) <= have
            });
            free && fits && !tainted(p.device) && (req.matches)(p.device)
        });
        let Some(p) = pick else {
            return Err(format!(
                "no device of driver {driver} on node {node} is free for request {}",
                req.name
            ));
        };
        let name = p.device["name"].as_str().unwrap_or_default();
        *taken
            .entry((p.pool.to_string(), name.to_string()))
            .or_default() += 1;
        for (k, v) in consumption(p.pool, p.device) {
            *used.entry(k).or_default() += v;
        }
        let mut result = json!({
            "request": req.name,
            "driver": driver,
            "pool": p.pool,
            "device": name,
        });
        if p.device["allowMultipleAllocations"] == true {
            result["shareID"] = json!(share_id(uid, i));
        }
        results.push(result);
    }
    Ok(json!({
        "devices": { "results": results },
        "nodeSelector": {
            "nodeSelectorTerms": [{
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]
            }]
        }
    }))
}

/// A share ID in the form the API server expects (a UUID), derived from the claim and result.
fn share_id(uid: &str, i: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes().chain(i.to_le_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let lo = h.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xfff,
        lo & 0xfff,
        lo >> 16
    )
}

/// A ResourceClaim `namespace/name` with UID `uid` asking for one device per request name of
/// DeviceClass `class`, allocated as `allocation` says (as [`allocate`] answers it).
pub fn allocated_claim(
    namespace: &str,
    name: &str,
    uid: &str,
    class: &str,
    requests: &[&str],
    allocation: Value,
) -> Value {
    let requests: Vec<Value> = requests
        .iter()
        .map(|r| json!({"name": r, "exactly": {"deviceClassName": class}}))
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": allocation},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slices() -> Vec<Value> {
        vec![
            json!({"spec": {"driver": "d", "nodeName": "n", "pool": {"name": "n"},
                "sharedCounters": [{"name": "gpu3", "counters": {"slots": {"value": "8"}}}]}}),
            json!({"spec": {"driver": "d", "nodeName": "n", "pool": {"name": "n"}, "devices": [
                {"name": "whole-0", "attributes": {"kind": {"string": "whole"}}},
                {"name": "shared-2", "allowMultipleAllocations": true,
                 "attributes": {"kind": {"string": "shared"}}},
                {"name": "mig-4g-0", "attributes": {"kind": {"string": "slice"}},
                 "consumesCounters": [{"counterSet": "gpu3", "counters": {"slots": {"value": "4"}}}]},
                {"name": "mig-4g-4", "attributes": {"kind": {"string": "slice"}},
                 "consumesCounters": [{"counterSet": "gpu3", "counters": {"slots": {"value": "4"}}}]},
                {"name": "mig-8g-0", "attributes": {"kind": {"string": "slice"}},
                 "consumesCounters": [{"counterSet": "gpu3", "counters": {"slots": {"value": "8"}}}]}
            ]}}),
            json!({"spec": {"driver": "other", "nodeName": "n", "pool": {"name": "n"},
                "devices": [{"name": "whole-0"}]}}),
        ]
    }

    fn kind(k: &'static str) -> impl Fn(&Value) -> bool {
        move |d| attribute(d, "kind") == Some(k)
    }

    fn req(m: &dyn Fn(&Value) -> bool) -> [DeviceRequest<'_>; 1] {
        [DeviceRequest {
            name: "r",
            matches: m,
        }]
    }

    fn claim_of(uid: &str, alloc: Value) -> Value {
        allocated_claim("ns", uid, uid, "c", &["r"], alloc)
    }

    #[test]
    fn whole_devices_once_shared_many_times_partitions_within_their_counters() {
        let s = slices();
        let whole = kind("whole");
        let a = allocate(&s, &[], "d", "n", "a", &req(&whole)).unwrap();
        assert_eq!(a["devices"]["results"][0]["device"], "whole-0");
        assert_eq!(a["devices"]["results"][0]["driver"], "d");
        let claims = vec![claim_of("a", a)];
        let e = allocate(&s, &claims, "d", "n", "b", &req(&whole)).unwrap_err();
        assert!(e.contains("request r"), "{e}");

        let shared = kind("shared");
        let x = allocate(&s, &claims, "d", "n", "x", &req(&shared)).unwrap();
        let y = allocate(
            &s,
            &[claim_of("x", x.clone())],
            "d",
            "n",
            "y",
            &req(&shared),
        )
        .unwrap();
        let (sx, sy) = (
            &x["devices"]["results"][0]["shareID"],
            &y["devices"]["results"][0]["shareID"],
        );
        assert!(sx.as_str().is_some_and(|s| s.len() == 36), "{sx}");
        assert_ne!(sx, sy);

        let slice = kind("slice");
        let p = allocate(&s, &[], "d", "n", "p", &req(&slice)).unwrap();
        assert_eq!(p["devices"]["results"][0]["device"], "mig-4g-0");
        let held = vec![claim_of("p", p)];
        let q = allocate(&s, &held, "d", "n", "q", &req(&slice)).unwrap();
        assert_eq!(
            q["devices"]["results"][0]["device"], "mig-4g-4",
            "the 8-slot partition overlaps the held one"
        );
        let held = vec![held[0].clone(), claim_of("q", q)];
        assert!(allocate(&s, &held, "d", "n", "r", &req(&slice)).is_err());
    }

    #[test]
    fn tainted_devices_are_never_allocated_and_shares_are_counted() {
        let mut s = slices();
        s[1]["spec"]["devices"][0]["taints"] =
            json!([{"key": "accel.nri.io/unhealthy", "effect": "NoSchedule"}]);
        let whole = kind("whole");
        assert!(allocate(&s, &[], "d", "n", "a", &req(&whole)).is_err());
        // Two shares: two claims, not a third.
        s[1]["spec"]["devices"][1]["capacity"] = json!({"shares": {"value": "2"}});
        let shared = kind("shared");
        let mut claims = Vec::new();
        for uid in ["x", "y"] {
            let a = allocate(&s, &claims, "d", "n", uid, &req(&shared)).unwrap();
            claims.push(claim_of(uid, a));
        }
        assert!(allocate(&s, &claims, "d", "n", "z", &req(&shared)).is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity(&json!("8")), Some(8));
        assert_eq!(quantity(&json!(3)), Some(3));
        assert_eq!(quantity(&json!("80Gi")), Some(80 << 30));
        assert_eq!(quantity(&json!("1.5")), None);
    }
}

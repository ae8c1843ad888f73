//! Feature gates of the simulated server and the fields they guard.
//!
//! A real API server with a gate off drops the gated fields of a written object without an
//! error, unless the stored object being updated already used them (so turning a gate off never
//! destroys data on the next unrelated update). This module does the same for ResourceSlices.

use serde_json::Value;

/// Which DRA feature gates are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gates {
    /// `DRAPartitionableDevices`: `spec.sharedCounters` and `devices[].consumesCounters`.
    pub partitionable_devices: bool,
    /// `DRAConsumableCapacity`: `devices[].allowMultipleAllocations` and
    /// `devices[].capacity[*].requestPolicy`.
    pub consumable_capacity: bool,
    /// `DRADeviceTaints`: `devices[].taints`.
    pub device_taints: bool,
    /// `DRAListTypeAttributes` (alpha since 1.36): list attribute values, `devices[].attributes[*]`
    /// `ints`, `bools`, `strings` and `versions`. Off, they are dropped, and the attribute left
    /// without a value is refused (422), as a real server does.
    pub list_type_attributes: bool,
}

impl Gates {
    /// Every DRA gate on (a cluster that enabled them).
    pub const ALL: Gates = Gates {
        partitionable_devices: true,
        consumable_capacity: true,
        device_taints: true,
        list_type_attributes: true,
    };
    /// Every DRA gate off (the defaults of Kubernetes 1.34, where all three are alpha).
    pub const NONE: Gates = Gates {
        partitionable_devices: false,
        consumable_capacity: false,
        device_taints: false,
        list_type_attributes: false,
    };
}

impl Default for Gates {
    fn default() -> Self {
        Gates::ALL
    }
}

fn devices(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["devices"].as_array().into_iter().flatten()
}

/// The devices of a slice's spec, mutable.
fn devices_mut(
    spec: &mut serde_json::Map<String, Value>,
) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    spec.get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn device_uses(spec: &Value, test: impl Fn(&Value) -> bool) -> bool {
    devices(spec).any(test)
}

fn nonempty(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// Drops from `obj` (a ResourceSlice being written) the fields whose gate is off, unless `old`
/// (the stored object an update replaces) already uses them.
pub fn drop_disabled_slice_fields(gates: Gates, obj: &mut Value, old: Option<&Value>) {
    let old_spec = old.map(|o| &o["spec"]);
    let old_uses = |test: &dyn Fn(&Value) -> bool| old_spec.is_some_and(test);
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if !gates.partitionable_devices
        && !old_uses(&|s| {
            nonempty(&s["sharedCounters"]) || device_uses(s, |d| nonempty(&d["consumesCounters"]))
        })
    {
        spec.remove("sharedCounters");
        for d in devices_mut(spec) {
            d.remove("consumesCounters");
        }
    }
    if !gates.consumable_capacity
        && !old_uses(&|s| {
            device_uses(s, |d| {
                !d["allowMultipleAllocations"].is_null()
                    || d["capacity"]
                        .as_object()
                        .is_some_and(|c| c.values().any(|v| !v["requestPolicy"].is_null()))
            })
        })
    {
        for d in devices_mut(spec) {
            d.remove("allowMultipleAllocations");
            for c in d
                .get_mut("capacity")
                .and_then(Value::as_object_mut)
                .into_iter()
                .flat_map(|c| c.values_mut())
            {
                if let Some(c) = c.as_object_mut() {
                    c.remove("requestPolicy");
                }
            }
        }
    }
    if !gates.device_taints && !old_uses(&|s| device_uses(s, |d| nonempty(&d["taints"]))) {
        for d in devices_mut(spec) {
            d.remove("taints");
        }
    }
    let lists = |a: &Value| LIST_VALUES.iter().any(|k| !a[*k].is_null());
    if !gates.list_type_attributes
        && !old_uses(&|s| {
            device_uses(s, |d| {
                d["attributes"]
                    .as_object()
                    .is_some_and(|a| a.values().any(lists))
            })
        })
    {
        for d in devices_mut(spec) {
            for a in d
                .get_mut("attributes")
                .and_then(Value::as_object_mut)
                .into_iter()
                .flat_map(|a| a.values_mut())
                .filter_map(Value::as_object_mut)
            {
                for k in LIST_VALUES {
                    a.remove(k);
                }
            }
        }
    }
}

/// What the real server fills in a written slice: a taint's `timeAdded` when absent (this
/// server's clock is the fixed time of its creation timestamps).
pub fn default_slice_fields(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for d in devices_mut(spec) {
        for t in d
            .get_mut("taints")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            t.entry("timeAdded")
                .or_insert_with(|| Value::String("2026-01-01T00:00:00Z".into()));
        }
    }
}

/// The list values of an attribute (gate `DRAListTypeAttributes`).
pub const LIST_VALUES: [&str; 4] = ["ints", "bools", "strings", "versions"];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice() -> Value {
        json!({"spec": {
            "sharedCounters": [{"name": "c", "counters": {"s0": {"value": "1"}}}],
            "devices": [{
                "name": "d",
                "allowMultipleAllocations": true,
                "consumesCounters": [{"counterSet": "c", "counters": {"s0": {"value": "1"}}}],
                "capacity": {"shares": {"value": "4", "requestPolicy": {"default": "1"}}},
                "taints": [{"key": "k", "effect": "NoSchedule"}],
            }],
        }})
    }

    #[test]
    fn gated_fields_are_dropped_on_create() {
        let mut s = slice();
        drop_disabled_slice_fields(Gates::NONE, &mut s, None);
        assert_eq!(
            s,
            json!({"spec": {"devices": [{"name": "d", "capacity": {"shares": {"value": "4"}}}]}})
        );
        let mut s = slice();
        drop_disabled_slice_fields(Gates::ALL, &mut s, None);
        assert_eq!(s, slice());
    }

    #[test]
    fn a_taint_without_a_time_gets_one_and_a_given_time_is_kept() {
        let mut s = json!({"spec": {"devices": [{"name": "d", "taints": [
            {"key": "k", "effect": "NoSchedule"},
            {"key": "j", "effect": "NoExecute", "timeAdded": "2026-02-03T04:05:06Z"},
        ]}]}});
        default_slice_fields(&mut s);
        let t = &s["spec"]["devices"][0]["taints"];
        assert_eq!(t[0]["timeAdded"], "2026-01-01T00:00:00Z");
        assert_eq!(t[1]["timeAdded"], "2026-02-03T04:05:06Z");
    }

    #[test]
    fn fields_the_stored_object_uses_survive_an_update() {
        let mut s = slice();
        drop_disabled_slice_fields(Gates::NONE, &mut s, Some(&slice()));
        assert_eq!(s, slice());
    }
}

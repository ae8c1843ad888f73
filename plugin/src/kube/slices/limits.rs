//! The resource.k8s.io/v1 limits a published pool stays within (Kubernetes 1.35+ wording).

/// Devices per slice.
pub const MAX_DEVICES: usize = 128;
/// Devices per slice when any device of it consumes counters or has a taint.
pub const MAX_DEVICES_WITH_COUNTERS: usize = 64;
/// Counters consumed by all devices of one slice together.
pub const MAX_CONSUMED_PER_SLICE: usize = 1024;
/// Counter sets per slice.
pub const MAX_COUNTER_SETS: usize = 8;
/// Counters per counter set (and per consumption of one set).
pub const MAX_COUNTERS_PER_SET: usize = 32;
/// Counter sets one device may consume from.
pub const MAX_CONSUMPTIONS: usize = 2;
/// Attributes and capacities of one device together.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Bytes of a string attribute value.
pub const MAX_ATTRIBUTE_STRING: usize = 64;
/// Longest object name (a DNS subdomain).
pub const MAX_OBJECT_NAME: usize = 253;

//! The attributes each published device carries in the node's ResourceSlices, for the KEP-5304
//! device metadata (`crate::metadata`): built by the same pure function the publisher publishes
//! with, with the standard NUMA node in the form the API server keeps (list or scalar).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::publisher::{PublishSource, PublisherStatus};
use super::slices::{self, Capabilities, HeldElsewhere, PoolInput};
use crate::metadata::AttributeSource;

/// The attributes of every device `source` publishes, as JSON typed values (qualified name ->
/// `{"string": ..}` ...), keyed by published name; a list attribute in its wire form
/// (`{"ints": [..]}`) when `numa_list`.
pub fn published_attributes(
    source: &PublishSource,
    driver: &str,
    numa_list: bool,
) -> BTreeMap<String, BTreeMap<String, serde_json::Value>> {
    let none = BTreeMap::new();
    let held = HeldElsewhere::new();
    let content = slices::build(&PoolInput {
        inventory: &source.inventory,
        pools: &source.pools,
        published: &source.published,
        pcie_roots: &source.pcie_roots,
        unhealthy: &none,
        held: &held,
        driver,
        caps: Capabilities {
            numa_list,
            ..Capabilities::ALL
        },
    });
    content
        .devices
        .into_iter()
        .map(|e| {
            let mut device = serde_json::json!({ "spec": { "devices": [e.device] } });
            super::publisher::wire::ints_to_wire(&mut device);
            let attributes = device["spec"]["devices"][0]["attributes"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            (e.device.name.clone(), attributes)
        })
        .collect()
}

/// The publisher's source and status as an [`AttributeSource`]: what is published now.
pub struct SliceAttributes {
    source: watch::Receiver<Arc<PublishSource>>,
    status: watch::Receiver<PublisherStatus>,
    driver: String,
}

impl SliceAttributes {
    /// Follows `source` (what is published) and `status` (how the API server takes lists).
    pub fn new(
        source: watch::Receiver<Arc<PublishSource>>,
        status: watch::Receiver<PublisherStatus>,
        driver: &str,
    ) -> SliceAttributes {
        SliceAttributes {
            source,
            status,
            driver: driver.to_string(),
        }
    }
}

impl AttributeSource for SliceAttributes {
    fn attributes(&self, name: &str) -> Option<BTreeMap<String, serde_json::Value>> {
        let numa_list = self.status.borrow().numa_node_attribute == Some("list");
        let source = self.source.borrow().clone();
        published_attributes(&source, &self.driver, numa_list).remove(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_the_published_ones_with_the_pci_bus_id() {
        let gpu = crate::fixtures::simulated_gpu(0, 1, Default::default(), "0000:18:00.0".into());
        let inventory = policies::Inventory {
            devices: vec![gpu],
            cpus: Default::default(),
        };
        let pools = vec![policies::PoolConfig::of_ids(
            "whole",
            &["gpu0"],
            policies::FamilyConfig::Exclusive,
        )];
        let node = policies::Node::new(
            inventory.clone(),
            &pools,
            &policies::Registry::with_builtins(),
        )
        .unwrap();
        let source = PublishSource {
            inventory,
            pools,
            published: node.published(),
            pcie_roots: BTreeMap::new(),
        };
        let all = published_attributes(&source, "accel.nri.io", true);
        let (name, attrs) = all
            .iter()
            .find(|(_, a)| a.contains_key(slices::PCI_BUS_ID))
            .expect("a device with a PCI address");
        assert_eq!(
            attrs[slices::PCI_BUS_ID],
            attrs["pciAddress"],
            "device {name}"
        );
        assert_eq!(
            attrs[slices::PCI_BUS_ID],
            serde_json::json!({"string": "0000:18:00.0"})
        );
        assert_eq!(attrs[slices::NUMA_NODE], serde_json::json!({"ints": [1]}));
        let scalar = published_attributes(&source, "accel.nri.io", false);
        assert_eq!(
            scalar[name][slices::NUMA_NODE],
            serde_json::json!({"int": 1})
        );
    }
}

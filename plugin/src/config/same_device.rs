//! When two inventory entries are one physical device (issue 39, item 2): they share a device
//! node of their own (the same kind, major and minor) or a PCI address. The id in a config is a
//! name; the node and the address are what a container is given, so two ids sharing either
//! would grant one device twice. Control nodes (`/dev/nvidiactl`, ...) are shared by every
//! device of a vendor by design and do not count. Config validation refuses two static devices
//! that are one; discovery drops a found device that is a static one under another id.

use policies::{Device, DeviceNode, NodeKind};

/// A PCI address as written (`0000:18:00.0`, `18:00.0`, any case) in one spelling: lower case,
/// with the domain.
pub fn pci_key(address: &str) -> String {
    let a = address.trim().to_ascii_lowercase();
    if a.matches(':').count() == 1 {
        format!("0000:{a}")
    } else {
        a
    }
}

/// What makes a device node this device: its kind and numbers.
pub fn node_key(n: &DeviceNode) -> (NodeKind, u32, u32) {
    (n.kind, n.major, n.minor)
}

/// A device node in words: `c 195:0 (/dev/nvidia0)`.
pub fn node_words(n: &DeviceNode) -> String {
    let kind = match n.kind {
        NodeKind::Char => 'c',
        NodeKind::Block => 'b',
    };
    format!(
        "{kind} {}:{} ({})",
        n.major,
        n.minor,
        n.host_path.as_deref().unwrap_or(&n.path)
    )
}

/// What `a` shares with `b` that makes them one device, in `a`'s words (`device node c 195:0
/// (/dev/nvidia0)`, `PCI address 0000:18:00.0`); `None` when they are two devices.
pub fn shared(a: &Device, b: &Device) -> Option<String> {
    if let (Some(x), Some(y)) = (&a.pci_address, &b.pci_address)
        && pci_key(x) == pci_key(y)
    {
        return Some(format!("PCI address {}", pci_key(x)));
    }
    a.nodes
        .iter()
        .find(|n| b.nodes.iter().any(|m| node_key(m) == node_key(n)))
        .map(|n| format!("device node {}", node_words(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str, major: u32, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: None,
            kind: NodeKind::Char,
            major,
            minor,
            permissions: "rw".into(),
        }
    }

    fn device(id: &str, pci: Option<&str>, nodes: Vec<DeviceNode>) -> Device {
        Device {
            id: id.into(),
            vendor: "nvidia".into(),
            model: String::new(),
            pci_address: pci.map(Into::into),
            pci_id: None,
            numa_node: None,
            local_cpus: Default::default(),
            memory_mib: 0,
            compute_units: 0,
            driver: None,
            nodes,
            control_nodes: vec![node("/dev/nvidiactl", 195, 255)],
            uuid: None,
        }
    }

    #[test]
    fn a_shared_node_or_pci_address_is_one_device_and_control_nodes_are_not() {
        let gpu0 = device(
            "gpu0",
            Some("0000:18:00.0"),
            vec![node("/dev/nvidia0", 195, 0)],
        );
        let gpu1 = device(
            "gpu1",
            Some("0000:2a:00.0"),
            vec![node("/dev/nvidia1", 195, 1)],
        );
        assert_eq!(
            shared(&gpu0, &gpu1),
            None,
            "control nodes are shared by design"
        );
        let by_node = device("x", None, vec![node("/dev/gpu-x", 195, 0)]);
        assert_eq!(
            shared(&by_node, &gpu0).as_deref(),
            Some("device node c 195:0 (/dev/gpu-x)")
        );
        let by_pci = device("y", Some("18:00.0"), vec![]);
        assert_eq!(
            shared(&by_pci, &gpu0).as_deref(),
            Some("PCI address 0000:18:00.0")
        );
        let block = DeviceNode {
            kind: NodeKind::Block,
            ..node("/dev/sda", 195, 0)
        };
        assert_eq!(shared(&device("z", None, vec![block]), &gpu0), None);
    }
}

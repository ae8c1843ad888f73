//! Published DRA device names and PCIe proximity.
//!
//! A whole (or shareable) device is published as `<pool>-<id>`, a slice as
//! `<pool>-<id>-<profile>-<start>`, each part lower-cased with every character
//! outside `[a-z0-9]` turned into `-` (DRA device names are DNS labels).

/// Lower-cases `text` and turns every character outside `[a-z0-9]` into `-`.
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The published name of a whole or shareable device.
pub fn device_name(pool: &str, device_id: &str) -> String {
    format!("{}-{}", sanitize(pool), sanitize(device_id))
}

/// The published name of a slice of `profile` starting at slot `start`.
pub fn slice_name(pool: &str, device_id: &str, profile: &str, start: u32) -> String {
    format!(
        "{}-{}-{start}",
        device_name(pool, device_id),
        sanitize(profile)
    )
}

/// The PCI root of an address (`dddd:bb:dd.f` -> `dddd:bb`): devices behind the
/// same root bus are treated as PCIe neighbours.
pub fn pci_root(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(root, _)| root)
}

/// PCIe distance between a root and an address: 0 same root bus, 1 same
/// domain, 2 otherwise (or unknown).
pub fn pci_distance(anchor: Option<&str>, address: Option<&str>) -> u8 {
    match (anchor, address) {
        (Some(a), Some(b)) => {
            let b = pci_root(b);
            if a == b {
                0
            } else if a.split(':').next() == b.split(':').next() {
                1
            } else {
                2
            }
        }
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(device_name("GPUs", "0000:17:00.0"), "gpus-0000-17-00-0");
        assert_eq!(
            slice_name("mig", "0000:17:00.0", "1g.10gb", 3),
            "mig-0000-17-00-0-1g-10gb-3"
        );
    }

    #[test]
    fn proximity_by_root_bus() {
        assert_eq!(pci_root("0000:17:00.0"), "0000:17");
        assert_eq!(pci_distance(Some("0000:17"), Some("0000:17:01.0")), 0);
        assert_eq!(pci_distance(Some("0000:17"), Some("0000:65:00.0")), 1);
        assert_eq!(pci_distance(Some("0000:17"), Some("0001:17:00.0")), 2);
        assert_eq!(pci_distance(None, Some("0000:17:00.0")), 2);
    }
}

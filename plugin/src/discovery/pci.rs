//! PCI devices of accelerator classes, from `/sys/bus/pci/devices`.

use std::path::{Path, PathBuf};

use policies::{CpuSet, Device};

use super::scan::Scan;
use super::warning::short;

/// Host directory of PCI devices.
pub(crate) const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// PCI vendor ids discovery knows by name.
pub(crate) const NVIDIA: u16 = 0x10de;
/// AMD/ATI.
pub(crate) const AMD: u16 = 0x1002;
/// Intel.
pub(crate) const INTEL: u16 = 0x8086;
/// Habana Labs.
pub(crate) const HABANA: u16 = 0x1da3;

/// PCI base classes that are accelerators: display controllers and processing accelerators.
const CLASS_DISPLAY: u32 = 0x03;
const CLASS_ACCELERATOR: u32 = 0x12;

/// The vendor name for a PCI vendor id.
pub(crate) fn vendor_name(vendor: u16) -> String {
    match vendor {
        NVIDIA => "nvidia".to_string(),
        AMD => "amd".to_string(),
        INTEL => "intel".to_string(),
        HABANA => "habana".to_string(),
        other => format!("pci-{other:04x}"),
    }
}

/// What a model table entry says: name, nominal memory in MiB, compute units.
struct ModelInfo {
    name: &'static str,
    memory_mib: u64,
    compute_units: u32,
}

/// Models we know by PCI id; vendor data (NVIDIA's `information`, AMD's sysfs)
/// overrides these when present.
fn model_info(vendor: u16, device: u16) -> Option<ModelInfo> {
    let (name, memory_mib, compute_units) = match (vendor, device) {
        (NVIDIA, 0x2330) => ("H100 SXM5 80GB", 80 * 1024, 132),
        (NVIDIA, 0x2331) => ("H100 PCIe", 80 * 1024, 114),
        (NVIDIA, 0x20b2) => ("A100 SXM4 80GB", 80 * 1024, 108),
        (NVIDIA, 0x2684) => ("GeForce RTX 4090", 24 * 1024, 128),
        (AMD, 0x74a1) => ("Instinct MI300X", 192 * 1024, 304),
        (AMD, 0x740f) => ("Instinct MI210", 64 * 1024, 104),
        (INTEL, 0xa780) => ("UHD Graphics 770", 0, 32),
        (HABANA, 0x1020) => ("Gaudi2", 96 * 1024, 24),
        _ => return None,
    };
    Some(ModelInfo {
        name,
        memory_mib,
        compute_units,
    })
}

/// A PCI accelerator found in sysfs, before its device nodes are known.
pub(crate) struct PciCandidate {
    /// The device model as far as PCI tells.
    pub device: Device,
    /// PCI vendor id.
    pub vendor: u16,
    /// The device's sysfs directory (host path).
    pub dir: PathBuf,
}

/// Whether `name` looks like a PCI address `dddd:bb:dd.f`.
pub(crate) fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

fn parse_hex(text: &str) -> Option<u32> {
    let t = text.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    u32::from_str_radix(t, 16).ok()
}

/// Scans `/sys/bus/pci/devices` for display and processing-accelerator devices.
pub(crate) fn scan_pci(scan: &mut Scan<'_>) -> Vec<PciCandidate> {
    let root = Path::new(PCI_DEVICES);
    let names = match scan.host.read_dir(root) {
        Ok(n) => n,
        Err(e) => {
            scan.warn(None, Some(root), format!("no PCI devices listed: {e}"));
            return Vec::new();
        }
    };
    names
        .into_iter()
        .filter_map(|name| candidate(scan, &root.join(&name), name))
        .collect()
}

fn candidate(scan: &mut Scan<'_>, dir: &Path, bdf: String) -> Option<PciCandidate> {
    if !is_pci_address(&bdf) {
        scan.warn(
            None,
            Some(dir),
            "entry is not a PCI address; ignored".to_string(),
        );
        return None;
    }
    let class_path = dir.join("class");
    let class = match scan.host.read(&class_path) {
        Ok(t) => parse_hex(&t),
        Err(e) => {
            scan.warn(
                Some(&bdf),
                Some(&class_path),
                format!("cannot read the PCI class: {e}; device skipped"),
            );
            return None;
        }
    };
    let Some(class) = class else {
        scan.warn(
            Some(&bdf),
            Some(&class_path),
            "the PCI class is not a hex number; device skipped".to_string(),
        );
        return None;
    };
    if !matches!(class >> 16, CLASS_DISPLAY | CLASS_ACCELERATOR) {
        return None;
    }
    let vendor = scan.read_hex_id(&bdf, &dir.join("vendor"), "vendor id")?;
    let device = scan.read_hex_id(&bdf, &dir.join("device"), "device id")?;

    let numa_path = dir.join("numa_node");
    let numa_node = match scan.host.read(&numa_path) {
        Ok(t) => match t.trim().parse::<i64>() {
            Ok(n) if n < 0 => None,
            Ok(n) => match u32::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    scan.warn(
                        Some(&bdf),
                        Some(&numa_path),
                        format!("NUMA node {n} is out of range; device skipped"),
                    );
                    return None;
                }
            },
            Err(_) => {
                scan.warn(
                    Some(&bdf),
                    Some(&numa_path),
                    format!("NUMA node {:?} is not a number; device skipped", short(&t)),
                );
                return None;
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            scan.warn(
                Some(&bdf),
                Some(&numa_path),
                format!("cannot read the NUMA node: {e}; device skipped"),
            );
            return None;
        }
    };
    let cpus_path = dir.join("local_cpulist");
    let local_cpus = match scan.host.read(&cpus_path) {
        Ok(t) => match t.parse::<CpuSet>() {
            Ok(c) => c,
            Err(e) => {
                scan.warn(Some(&bdf), Some(&cpus_path), format!("{e}; device skipped"));
                return None;
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => CpuSet::new(),
        Err(e) => {
            scan.warn(
                Some(&bdf),
                Some(&cpus_path),
                format!("cannot read the local CPUs: {e}; device skipped"),
            );
            return None;
        }
    };
    let driver = scan
        .host
        .read_link(&dir.join("driver"))
        .ok()
        .and_then(|t| t.file_name().and_then(|n| n.to_str()).map(str::to_string));
    let info = model_info(vendor, device);
    let pci_id = format!("{vendor:04x}:{device:04x}");
    Some(PciCandidate {
        device: Device {
            id: bdf.clone(),
            vendor: vendor_name(vendor),
            model: info
                .as_ref()
                .map_or_else(|| pci_id.clone(), |i| i.name.to_string()),
            pci_address: Some(bdf),
            pci_id: Some(pci_id),
            numa_node,
            local_cpus,
            memory_mib: info.as_ref().map_or(0, |i| i.memory_mib),
            compute_units: info.as_ref().map_or(0, |i| i.compute_units),
            driver,
            nodes: Vec::new(),
            control_nodes: Vec::new(),
            uuid: None,
        },
        vendor,
        dir: dir.to_path_buf(),
    })
}

impl Scan<'_> {
    fn read_hex_id(&mut self, bdf: &str, path: &Path, what: &str) -> Option<u16> {
        match self.host.read(path) {
            Ok(t) => match parse_hex(&t).and_then(|v| u16::try_from(v).ok()) {
                Some(v) => Some(v),
                None => {
                    self.warn(
                        Some(bdf),
                        Some(path),
                        format!(
                            "the PCI {what} {:?} is not a 16-bit hex number; device skipped",
                            short(&t)
                        ),
                    );
                    None
                }
            },
            Err(e) => {
                self.warn(
                    Some(bdf),
                    Some(path),
                    format!("cannot read the PCI {what}: {e}; device skipped"),
                );
                None
            }
        }
    }
}

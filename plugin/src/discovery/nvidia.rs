//! NVIDIA GPUs: minors and model from `/proc/driver/nvidia/gpus/<bdf>/information`,
//! majors from `/proc/devices`, and the control nodes every CUDA container needs.

use std::path::PathBuf;

use super::pci::PciCandidate;
use super::scan::{Scan, char_node};

/// Minor of `/dev/nvidiactl` under the `nvidia` major.
const NVIDIACTL_MINOR: u32 = 255;

/// The GPU UUID as the driver prints it (`GPU-` and 36 characters of hex and dashes), or `None`
/// for anything else (older drivers print `??`).
fn gpu_uuid(v: &str) -> Option<String> {
    let rest = v.strip_prefix("GPU-")?;
    (rest.len() == 36 && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
        .then(|| v.to_string())
}

/// Adds `/dev/nvidiaN` and the control nodes to an NVIDIA GPU; returns false
/// (after a warning) when the driver does not know the GPU.
pub(crate) fn attach(scan: &mut Scan<'_>, c: &mut PciCandidate) -> bool {
    let bdf = c.device.id.clone();
    let info_path = PathBuf::from(format!("/proc/driver/nvidia/gpus/{bdf}/information"));
    let info = match scan.host.read(&info_path) {
        Ok(t) => t,
        Err(e) => {
            let driver = c.device.driver.as_deref().unwrap_or("none");
            scan.warn(Some(&bdf), Some(&info_path), format!("the nvidia driver does not list this GPU (bound driver: {driver}): {e}; device skipped"));
            return false;
        }
    };
    let mut minor = None;
    for line in info.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "Device Minor" => minor = value.trim().parse::<u32>().ok(),
            "Model" if !value.trim().is_empty() => c.device.model = value.trim().to_string(),
            "GPU UUID" => c.device.uuid = gpu_uuid(value.trim()),
            _ => {}
        }
    }
    let Some(minor) = minor.filter(|m| *m < NVIDIACTL_MINOR) else {
        scan.warn(
            Some(&bdf),
            Some(&info_path),
            "no valid \"Device Minor:\" line; device skipped".to_string(),
        );
        return false;
    };
    let Some(major) = scan.char_major("nvidia") else {
        scan.warn(
            Some(&bdf),
            Some(&PathBuf::from("/proc/devices")),
            "no \"nvidia\" character major; device skipped".to_string(),
        );
        return false;
    };
    c.device
        .nodes
        .push(char_node(format!("/dev/nvidia{minor}"), major, minor));
    c.device.control_nodes.push(char_node(
        "/dev/nvidiactl".to_string(),
        major,
        NVIDIACTL_MINOR,
    ));
    match scan.char_major("nvidia-uvm") {
        Some(uvm) => {
            c.device.control_nodes.push(char_node("/dev/nvidia-uvm".to_string(), uvm, 0));
            c.device.control_nodes.push(char_node("/dev/nvidia-uvm-tools".to_string(), uvm, 1));
        }
        None => scan.warn_once("nvidia-uvm", Some(&PathBuf::from("/proc/devices")), "no \"nvidia-uvm\" major: the nvidia-uvm module is not loaded, CUDA will not work in containers".to_string()),
    }
    true
}

//! Device health: whether each device of the inventory is still usable, re-checked periodically.
//!
//! A device is unhealthy when something it had when the daemon started is gone: its PCI function
//! vanished from sysfs, its kernel driver was unbound (or replaced), or one of its device nodes
//! disappeared. Health is judged against that start-time baseline, so a simulated node whose
//! device nodes never existed stays healthy. The DRA health service, the ResourceSlice publisher
//! and the device plugins' ListAndWatch all follow the same [`HealthMonitor`]; it wakes them only
//! when something changed. A device of a shared pool in MPS mode also needs its MPS control
//! daemon's pipe directory: while that is missing the device is unhealthy (whatever it was at
//! start), and it heals when the directory appears.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use policies::{Device, Inventory};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::DiscoveryConfig;
use crate::discovery::{HostFs, RootFs};

/// The health of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// Whether the device can be handed out.
    pub healthy: bool,
    /// Why not, in one sentence naming what is gone; empty when healthy.
    pub reason: String,
}

impl DeviceHealth {
    /// A healthy device.
    pub fn healthy() -> Self {
        DeviceHealth {
            healthy: true,
            reason: String::new(),
        }
    }

    /// Why it is unhealthy as a label value (a taint's value, docs/dra.md "Device health"):
    /// `gone-from-sysfs`, `driver-unbound`, `driver-changed`, `device-node-gone`,
    /// `mps-pipe-missing`, or
    /// `unhealthy` for a reason this module did not word; empty when healthy.
    pub fn cause(&self) -> &'static str {
        let r = self.reason.as_str();
        match () {
            () if self.healthy => "",
            () if r.ends_with("is gone from sysfs") => "gone-from-sysfs",
            () if r.contains(") was unbound from its driver ") => "driver-unbound",
            () if r.contains(") is bound to ") => "driver-changed",
            () if r.starts_with("device node ") && r.ends_with(" is gone") => "device-node-gone",
            () if r.starts_with("the MPS pipe directory ") => "mps-pipe-missing",
            () => "unhealthy",
        }
    }

    fn unhealthy(reason: String) -> Self {
        DeviceHealth {
            healthy: false,
            reason,
        }
    }
}

/// Every device's health at one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// Device id -> health, for every device of the inventory.
    pub devices: BTreeMap<String, DeviceHealth>,
    /// When the devices were last checked.
    pub checked_at: SystemTime,
}

impl HealthReport {
    /// Every device of `inventory` healthy, checked now.
    pub fn all_healthy(inventory: &Inventory) -> Self {
        HealthReport {
            devices: inventory
                .devices
                .iter()
                .map(|d| (d.id.clone(), DeviceHealth::healthy()))
                .collect(),
            checked_at: SystemTime::now(),
        }
    }

    /// The health of `device` (healthy when the report does not know it).
    pub fn of(&self, device: &str) -> DeviceHealth {
        self.devices
            .get(device)
            .cloned()
            .unwrap_or_else(DeviceHealth::healthy)
    }

    /// Ids of the unhealthy devices.
    pub fn unhealthy(&self) -> impl Iterator<Item = &str> {
        self.devices
            .iter()
            .filter(|(_, h)| !h.healthy)
            .map(|(id, _)| id.as_str())
    }
}

/// What a device had when the daemon started.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Baseline {
    driver: Option<String>,
    /// Device nodes (host paths) that existed then.
    nodes: Vec<String>,
    /// The MPS pipe directory (host path) the device's pool names, which must exist.
    mps_pipe: Option<String>,
}

/// What each device had at start, read through `host`; `mps_pipes` maps the devices of shared
/// pools in MPS mode to their pool's pipe directory.
fn baseline(
    inventory: &Inventory,
    host: &dyn HostFs,
    mps_pipes: &BTreeMap<String, String>,
) -> BTreeMap<String, Baseline> {
    inventory
        .devices
        .iter()
        .map(|d| {
            let nodes = d
                .nodes
                .iter()
                .map(|n| n.host_path.clone().unwrap_or_else(|| n.path.clone()))
                .filter(|p| host.exists(Path::new(p)))
                .collect();
            (
                d.id.clone(),
                Baseline {
                    driver: d.driver.clone(),
                    nodes,
                    mps_pipe: mps_pipes.get(&d.id).cloned(),
                },
            )
        })
        .collect()
}

/// Judges each device against its baseline. `rescan` is a fresh sysfs discovery (`None` when the
/// inventory does not come from sysfs); a device with a PCI address missing from it is gone.
fn assess(
    inventory: &Inventory,
    baselines: &BTreeMap<String, Baseline>,
    rescan: Option<&Inventory>,
    host: &dyn HostFs,
) -> BTreeMap<String, DeviceHealth> {
    inventory
        .devices
        .iter()
        .map(|d| {
            let base = baselines.get(&d.id);
            (d.id.clone(), judge(d, base, rescan, host))
        })
        .collect()
}

fn judge(
    d: &Device,
    base: Option<&Baseline>,
    rescan: Option<&Inventory>,
    host: &dyn HostFs,
) -> DeviceHealth {
    if let (Some(addr), Some(now)) = (&d.pci_address, rescan) {
        let Some(found) = now.devices.iter().find(|n| n.id == d.id) else {
            return DeviceHealth::unhealthy(format!(
                "device {} (PCI {addr}) is gone from sysfs",
                d.id
            ));
        };
        if let Some(was) = base.and_then(|b| b.driver.as_ref()) {
            match &found.driver {
                None => {
                    return DeviceHealth::unhealthy(format!(
                        "device {} (PCI {addr}) was unbound from its driver {was}",
                        d.id
                    ));
                }
                Some(is) if is != was => {
                    return DeviceHealth::unhealthy(format!(
                        "device {} (PCI {addr}) is bound to {is} instead of {was}",
                        d.id
                    ));
                }
                Some(_) => {}
            }
        }
    }
    for node in base.map(|b| b.nodes.as_slice()).unwrap_or_default() {
        if !host.exists(Path::new(node)) {
            return DeviceHealth::unhealthy(format!(
                "device node {node} of device {} is gone",
                d.id
            ));
        }
    }
    if let Some(pipe) = base.and_then(|b| b.mps_pipe.as_ref())
        && !host.is_dir(Path::new(pipe))
    {
        return DeviceHealth::unhealthy(mps_pipe_missing(pipe, &d.id));
    }
    DeviceHealth::healthy()
}

/// The sentence for a device whose MPS pipe directory is missing.
pub fn mps_pipe_missing(pipe: &str, device: &str) -> String {
    format!(
        "the MPS pipe directory {pipe} of device {device} is missing: start the pool's MPS control daemon with CUDA_MPS_PIPE_DIRECTORY={pipe} (nvidia-cuda-mps-control -d); until then the device is not handed out"
    )
}

/// Re-checks every device periodically and publishes the report when something changed.
#[derive(Debug, Clone)]
pub struct HealthMonitor {
    rx: watch::Receiver<Arc<HealthReport>>,
}

impl HealthMonitor {
    /// A monitor that never re-checks: every device healthy (checks off, or tests).
    pub fn fixed(report: HealthReport) -> (HealthMonitor, watch::Sender<Arc<HealthReport>>) {
        let (tx, rx) = watch::channel(Arc::new(report));
        (HealthMonitor { rx }, tx)
    }

    /// Starts checking the devices of `inventory` every `every`, reading the host as `cfg` says.
    /// The baseline is taken now; the first report has every device as the check finds it.
    pub fn start(
        cfg: &DiscoveryConfig,
        inventory: Inventory,
        every: Duration,
    ) -> (HealthMonitor, JoinHandle<()>) {
        Self::start_with_mps(cfg, inventory, &BTreeMap::new(), every)
    }

    /// As [`HealthMonitor::start`], and each device in `mps_pipes` (device id -> its shared
    /// pool's MPS pipe directory, a host path under `cfg.root`) is unhealthy while that
    /// directory is missing.
    pub fn start_with_mps(
        cfg: &DiscoveryConfig,
        inventory: Inventory,
        mps_pipes: &BTreeMap<String, String>,
        every: Duration,
    ) -> (HealthMonitor, JoinHandle<()>) {
        let host = RootFs::new(&cfg.root);
        let baselines = baseline(&inventory, &host, mps_pipes);
        let first = HealthReport {
            devices: assess(&inventory, &baselines, None, &host),
            checked_at: SystemTime::now(),
        };
        let (tx, rx) = watch::channel(Arc::new(first));
        let cfg = cfg.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let (cfg, inv, base) = (cfg.clone(), inventory.clone(), baselines.clone());
                let checked = tokio::task::spawn_blocking(move || check(&cfg, &inv, &base)).await;
                let Ok(devices) = checked else {
                    tracing::error!("the device health check panicked; it runs again next time");
                    continue;
                };
                publish(&tx, devices);
            }
        });
        (HealthMonitor { rx }, task)
    }

    /// Follows the reports; wakes only when a device's health changed.
    pub fn subscribe(&self) -> watch::Receiver<Arc<HealthReport>> {
        self.rx.clone()
    }

    /// The latest report.
    pub fn current(&self) -> Arc<HealthReport> {
        self.rx.borrow().clone()
    }
}

/// One check of every device on the real host under `cfg.root`.
fn check(
    cfg: &DiscoveryConfig,
    inventory: &Inventory,
    baselines: &BTreeMap<String, Baseline>,
) -> BTreeMap<String, DeviceHealth> {
    let host = RootFs::new(&cfg.root);
    let rescan = if cfg.sysfs {
        match crate::discovery::discover(&host, cfg) {
            Ok(found) => Some(found.inventory),
            Err(e) => {
                tracing::warn!(error = %e, "device health check could not rescan sysfs; keeping the last verdicts");
                return BTreeMap::new();
            }
        }
    } else {
        None
    };
    assess(inventory, baselines, rescan.as_ref(), &host)
}

/// Publishes `devices` if any device's health changed, logging each change. An empty map (a
/// failed rescan) changes nothing.
fn publish(tx: &watch::Sender<Arc<HealthReport>>, devices: BTreeMap<String, DeviceHealth>) {
    if devices.is_empty() {
        return;
    }
    tx.send_if_modified(|report| {
        if report.devices == devices {
            return false;
        }
        for (id, now) in &devices {
            let was = report.devices.get(id);
            match (was.map(|w| w.healthy), now.healthy) {
                (Some(true) | None, false) => {
                    tracing::warn!(device = %id, reason = %now.reason, "device became unhealthy; it is no longer handed out")
                }
                (Some(false), true) => tracing::info!(device = %id, "device is healthy again"),
                _ => {}
            }
        }
        *report = Arc::new(HealthReport {
            devices,
            checked_at: SystemTime::now(),
        });
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::DeviceNode;

    fn dev(id: &str, pci: Option<&str>, driver: Option<&str>, node: &str) -> Device {
        Device {
            id: id.into(),
            vendor: "nvidia".into(),
            model: String::new(),
            pci_address: pci.map(str::to_string),
            pci_id: None,
            numa_node: None,
            local_cpus: Default::default(),
            memory_mib: 0,
            compute_units: 0,
            driver: driver.map(str::to_string),
            nodes: vec![DeviceNode {
                path: node.into(),
                host_path: None,
                kind: Default::default(),
                major: 195,
                minor: 0,
                permissions: "rw".into(),
            }],
            control_nodes: vec![],
        }
    }

    #[test]
    fn gone_unbound_rebound_and_missing_nodes_are_unhealthy() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        std::fs::write(root.path().join("dev/nvidia0"), b"").unwrap();
        let host = RootFs::new(root.path());
        let a = dev("a", Some("0000:18:00.0"), Some("nvidia"), "/dev/nvidia0");
        let b = dev("b", Some("0000:2a:00.0"), Some("nvidia"), "/dev/nvidia1");
        let inv = Inventory {
            devices: vec![a.clone(), b.clone()],
            cpus: Default::default(),
        };
        let base = baseline(&inv, &host, &BTreeMap::new());
        // Nothing changed: healthy (b's node never existed: nothing to lose).
        let same = assess(&inv, &base, Some(&inv), &host);
        assert!(same.values().all(|h| h.healthy), "{same:?}");

        // b vanished from sysfs, a lost its driver.
        let mut unbound = a.clone();
        unbound.driver = None;
        let now = Inventory {
            devices: vec![unbound],
            cpus: Default::default(),
        };
        let h = assess(&inv, &base, Some(&now), &host);
        assert!(
            h["a"].reason.contains("unbound from its driver nvidia"),
            "{h:?}"
        );
        assert!(h["b"].reason.contains("gone from sysfs"), "{h:?}");
        // The taint's values (docs/dra.md, "Device health").
        assert_eq!(
            (h["a"].cause(), h["b"].cause()),
            ("driver-unbound", "gone-from-sysfs")
        );

        // a bound to vfio-pci instead.
        let mut vfio = a.clone();
        vfio.driver = Some("vfio-pci".into());
        let now = Inventory {
            devices: vec![vfio, b.clone()],
            cpus: Default::default(),
        };
        let h = assess(&inv, &base, Some(&now), &host);
        assert!(
            h["a"]
                .reason
                .contains("bound to vfio-pci instead of nvidia"),
            "{h:?}"
        );
        assert_eq!(h["a"].cause(), "driver-changed");

        // Its device node removed.
        std::fs::remove_file(root.path().join("dev/nvidia0")).unwrap();
        let h = assess(&inv, &base, Some(&inv), &host);
        assert!(h["a"].reason.contains("/dev/nvidia0"), "{h:?}");
        assert_eq!(h["a"].cause(), "device-node-gone");
        assert!(h["b"].healthy);
        assert_eq!(h["b"].cause(), "");
    }

    #[test]
    fn a_missing_mps_pipe_directory_is_unhealthy_until_it_appears() {
        let root = tempfile::tempdir().unwrap();
        let host = RootFs::new(root.path());
        let a = dev("a", None, None, "/dev/nvidia0");
        let b = dev("b", None, None, "/dev/nvidia1");
        let inv = Inventory {
            devices: vec![a, b],
            cpus: Default::default(),
        };
        let pipes = [("a".to_string(), "/run/nvidia/mps".to_string())].into();
        let base = baseline(&inv, &host, &pipes);
        // Missing from the start: unhealthy, with the sentence; b has no MPS pool.
        let h = assess(&inv, &base, None, &host);
        assert_eq!(h["a"].reason, mps_pipe_missing("/run/nvidia/mps", "a"));
        assert_eq!(h["a"].cause(), "mps-pipe-missing");
        assert!(h["b"].healthy, "{h:?}");
        // A file is no directory.
        std::fs::create_dir_all(root.path().join("run/nvidia")).unwrap();
        std::fs::write(root.path().join("run/nvidia/mps"), b"").unwrap();
        assert!(!assess(&inv, &base, None, &host)["a"].healthy);
        // The daemon made its directory: healed.
        std::fs::remove_file(root.path().join("run/nvidia/mps")).unwrap();
        std::fs::create_dir(root.path().join("run/nvidia/mps")).unwrap();
        assert!(assess(&inv, &base, None, &host)["a"].healthy);
        // Gone again (the daemon stopped and its directory was removed).
        std::fs::remove_dir(root.path().join("run/nvidia/mps")).unwrap();
        assert!(!assess(&inv, &base, None, &host)["a"].healthy);
    }

    #[test]
    fn only_changes_are_published() {
        let inv = Inventory {
            devices: vec![dev("a", None, None, "/dev/x")],
            cpus: Default::default(),
        };
        let (monitor, tx) = HealthMonitor::fixed(HealthReport::all_healthy(&inv));
        let mut rx = monitor.subscribe();
        rx.mark_unchanged();
        publish(&tx, [("a".to_string(), DeviceHealth::healthy())].into());
        assert!(!rx.has_changed().unwrap());
        publish(&tx, BTreeMap::new());
        assert!(!rx.has_changed().unwrap());
        publish(
            &tx,
            [("a".to_string(), DeviceHealth::unhealthy("gone".into()))].into(),
        );
        assert!(rx.has_changed().unwrap());
        assert_eq!(monitor.current().unhealthy().collect::<Vec<_>>(), ["a"]);
    }
}

//! Device health: whether each device of the inventory is still usable, re-checked periodically.
//!
//! A device is unhealthy when something it had when the daemon started is gone: its PCI function
//! vanished from sysfs, its kernel driver was unbound (or replaced), or one of its device nodes
//! disappeared. Health is judged against that start-time baseline, so a simulated node whose
//! device nodes never existed stays healthy. The DRA health service, the ResourceSlice publisher
//! and the device plugins' ListAndWatch all follow the same [`HealthMonitor`]; it wakes them only
//! when something changed.

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
    /// `gone-from-sysfs`, `driver-unbound`, `driver-changed`, `device-node-gone`, `vendor-cdi`
    /// (the daemon's vendor CDI check, docs/gpus.md), or `unhealthy` for a reason this module
    /// did not word; empty when healthy.
    pub fn cause(&self) -> &'static str {
        let r = self.reason.as_str();
        match () {
            () if self.healthy => "",
            () if r.ends_with("is gone from sysfs") => "gone-from-sysfs",
            () if r.contains(") was unbound from its driver ") => "driver-unbound",
            () if r.contains(") is bound to ") => "driver-changed",
            () if r.starts_with("device node ") && r.ends_with(" is gone") => "device-node-gone",
            () if r.contains("vendor CDI spec") => "vendor-cdi",
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

/// A check of the daemon's own beyond what this module sees: one sentence when `device` must
/// not be handed out (a `vendor_cdi: required` pool's device no vendor CDI spec describes).
pub type ExtraCheck = Arc<dyn Fn(&Device) -> Option<String> + Send + Sync>;

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
}

/// What each device had at start, read through `host`.
fn baseline(inventory: &Inventory, host: &dyn HostFs) -> BTreeMap<String, Baseline> {
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
    extra: Option<&ExtraCheck>,
) -> BTreeMap<String, DeviceHealth> {
    inventory
        .devices
        .iter()
        .map(|d| {
            let base = baselines.get(&d.id);
            let mut h = judge(d, base, rescan, host);
            if h.healthy
                && let Some(reason) = extra.and_then(|x| x(d))
            {
                h = DeviceHealth::unhealthy(reason);
            }
            (d.id.clone(), h)
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
    DeviceHealth::healthy()
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
        Self::start_with(cfg, inventory, every, None)
    }

    /// [`HealthMonitor::start`] with the daemon's `extra` check run on every device the
    /// monitor finds healthy.
    pub fn start_with(
        cfg: &DiscoveryConfig,
        inventory: Inventory,
        every: Duration,
        extra: Option<ExtraCheck>,
    ) -> (HealthMonitor, JoinHandle<()>) {
        let host = RootFs::new(&cfg.root);
        let baselines = baseline(&inventory, &host);
        let first = HealthReport {
            devices: assess(&inventory, &baselines, None, &host, extra.as_ref()),
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
                let x = extra.clone();
                let checked =
                    tokio::task::spawn_blocking(move || check(&cfg, &inv, &base, x.as_ref())).await;
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
    extra: Option<&ExtraCheck>,
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
    assess(inventory, baselines, rescan.as_ref(), &host, extra)
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
            uuid: None,
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
        let base = baseline(&inv, &host);
        // Nothing changed: healthy (b's node never existed: nothing to lose).
        let same = assess(&inv, &base, Some(&inv), &host, None);
        assert!(same.values().all(|h| h.healthy), "{same:?}");

        // b vanished from sysfs, a lost its driver.
        let mut unbound = a.clone();
        unbound.driver = None;
        let now = Inventory {
            devices: vec![unbound],
            cpus: Default::default(),
        };
        let h = assess(&inv, &base, Some(&now), &host, None);
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
        let h = assess(&inv, &base, Some(&now), &host, None);
        assert!(
            h["a"]
                .reason
                .contains("bound to vfio-pci instead of nvidia"),
            "{h:?}"
        );
        assert_eq!(h["a"].cause(), "driver-changed");

        // Its device node removed.
        std::fs::remove_file(root.path().join("dev/nvidia0")).unwrap();
        let h = assess(&inv, &base, Some(&inv), &host, None);
        assert!(h["a"].reason.contains("/dev/nvidia0"), "{h:?}");
        assert_eq!(h["a"].cause(), "device-node-gone");
        assert!(h["b"].healthy);
        assert_eq!(h["b"].cause(), "");

        // The daemon's extra check (vendor CDI) judges what this module finds healthy only.
        let extra: ExtraCheck = Arc::new(|d: &Device| {
            Some(format!(
                "device {} of pool p is described by no vendor CDI spec in /etc/cdi",
                d.id
            ))
        });
        let h = assess(&inv, &base, Some(&inv), &host, Some(&extra));
        assert_eq!(h["a"].cause(), "device-node-gone");
        assert_eq!(h["b"].cause(), "vendor-cdi");
        assert!(h["b"].reason.contains("/etc/cdi"), "{h:?}");
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

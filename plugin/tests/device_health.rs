//! Device health on a copy of a real machine's sysfs tree: a device unbound from its driver, then
//! removed, turns unhealthy and back, and only changes wake the watchers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nri_accel::config::DiscoveryConfig;
use nri_accel::device_health::HealthMonitor;
use nri_accel::discovery::discover_root;

const WAIT: Duration = Duration::from_secs(30);
const GPU: &str = "0000:18:00.0";
const GPU_DIR: &str = "sys/devices/pci0000:18/0000:18:01.0/0000:18:00.0";

/// Copies a fixture tree, keeping symlinks as links.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if kind.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs/dgx-8xh100")
}

async fn wait_for(
    rx: &mut tokio::sync::watch::Receiver<std::sync::Arc<nri_accel::device_health::HealthReport>>,
    healthy: bool,
) -> String {
    let report = tokio::time::timeout(WAIT, rx.wait_for(|r| r.of(GPU).healthy == healthy))
        .await
        .expect("health change in time")
        .expect("monitor alive")
        .clone();
    report.of(GPU).reason
}

#[tokio::test]
async fn unbound_and_removed_devices_turn_unhealthy_and_back() {
    let root = tempfile::tempdir().unwrap();
    copy_tree(&fixture(), root.path());
    let cfg = DiscoveryConfig {
        root: root.path().to_path_buf(),
        ..DiscoveryConfig::default()
    };
    let inventory = discover_root(&cfg).unwrap().inventory;
    assert_eq!(inventory.devices.len(), 8);
    let (monitor, task) = HealthMonitor::start(&cfg, inventory, Duration::from_millis(20));
    assert_eq!(monitor.current().unhealthy().count(), 0);
    let mut rx = monitor.subscribe();

    // Unbind the driver: unhealthy, naming the driver.
    let driver_link = root.path().join(GPU_DIR).join("driver");
    let target = std::fs::read_link(&driver_link).unwrap();
    std::fs::remove_file(&driver_link).unwrap();
    let reason = wait_for(&mut rx, false).await;
    assert!(
        reason.contains("unbound from its driver nvidia"),
        "{reason}"
    );
    assert_eq!(monitor.current().unhealthy().collect::<Vec<_>>(), [GPU]);

    // Bound again: healthy.
    std::os::unix::fs::symlink(&target, &driver_link).unwrap();
    assert_eq!(wait_for(&mut rx, true).await, "");

    // The PCI function disappears from the bus: unhealthy again.
    std::fs::remove_file(root.path().join("sys/bus/pci/devices").join(GPU)).unwrap();
    let reason = wait_for(&mut rx, false).await;
    assert!(reason.contains("gone from sysfs"), "{reason}");

    // Nothing changes for a while: the watcher is not woken by the periodic checks.
    rx.mark_unchanged();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!rx.has_changed().unwrap());
    task.abort();
}

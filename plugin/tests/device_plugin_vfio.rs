//! A passthrough pool served as a device plugin under a `vendor.com/model` resource name, as
//! KubeVirt's `permittedHostDevices` lists it with `externalResourceProvider: true`: Allocate
//! answers the env KubeVirt's virt-launcher reads the PCI addresses from, and the /dev/vfio
//! nodes of the whole IOMMU groups. Against the simulated kubelet (kube-sim), over real unix
//! sockets, with the inventory discovered from the `vfio-passthrough` fixture tree.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube_sim::kubelet::DevicePluginKubelet;
use nri_accel::checkpoint::Checkpoint;
use nri_accel::config::{DevicePluginConfig, DiscoveryConfig};
use nri_accel::device_health::{HealthMonitor, HealthReport};
use nri_accel::discovery::discover_root;
use nri_accel::engine::Engine;
use nri_accel::gate::Gate;
use nri_accel::kubelet::device_plugin::DevicePlugins;
use policies::{DeviceSelector, FamilyConfig, Node, PoolConfig, Registry};

const WAIT: Duration = Duration::from_secs(30);
const RESOURCE: &str = "nvidia.com/GPU_PASSTHROUGH";
const ENV: &str = "PCI_RESOURCE_NVIDIA_COM_GPU_PASSTHROUGH";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_answers_kubevirts_env_and_the_groups_vfio_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let inv = discover_root(&DiscoveryConfig {
        root: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs/vfio-passthrough"),
        ..DiscoveryConfig::default()
    })
    .unwrap()
    .inventory;
    let mut vm = PoolConfig::of_ids("vm-gpus", &[], FamilyConfig::Exclusive);
    vm.passthrough = true;
    vm.select = DeviceSelector {
        vendor: Some("nvidia".into()),
        ..DeviceSelector::default()
    };
    let pools = vec![vm];
    let node = Node::new(inv.clone(), &pools, &Registry::with_builtins()).unwrap();
    let cdi = tmp.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let specs = cdi::SpecStore::open(cdi::StoreConfig {
        dir: cdi,
        vendor: "accel.nri.io".into(),
        class: "device".into(),
        format: cdi::SpecFormat::Yaml,
    })
    .unwrap();
    let journal = Checkpoint::load(&tmp.path().join("state"), "boot").unwrap();
    let engine = Arc::new(Engine::start(node, journal, specs, None).unwrap().0);
    let dir = tmp.path().join("device-plugins");
    let kubelet = DevicePluginKubelet::start(&dir).unwrap();
    let mut cfg = DevicePluginConfig {
        enabled: true,
        dir: dir.clone(),
        device_nodes: true,
        ..DevicePluginConfig::default()
    };
    cfg.resource_names.insert("vm-gpus".into(), RESOURCE.into());
    let gate = Gate::new();
    gate.open();
    let (monitor, _tx) = HealthMonitor::fixed(HealthReport::all_healthy(&inv));
    let plugins = DevicePlugins::start(&cfg, &pools, engine, gate, monitor);
    kubelet.wait_registered(RESOURCE, WAIT).await.unwrap();
    assert!(dir.join("nri-accel-GPU_PASSTHROUGH.sock").exists());
    let client = kubelet.client(RESOURCE).await.unwrap();

    // One group: the address of the function the VM is given it by, nothing else.
    let one = client.allocate(&["0000:65:00.0".into()]).await.unwrap();
    assert_eq!(
        one.envs.get(ENV).map(String::as_str),
        Some("0000:65:00.0"),
        "{:?}",
        one.envs
    );
    let paths: Vec<&str> = one
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/vfio/34",
            "/dev/vfio/devices/vfio1",
            "/dev/vfio/devices/vfio2",
            "/dev/vfio/vfio",
            "/dev/iommu"
        ]
    );
    assert_eq!(
        one.envs.get("ACCEL_VFIO_GROUP_34").map(String::as_str),
        Some("0000:65:00.0,0000:65:00.1")
    );
    assert_eq!(one.cdi_devices.len(), 1);

    // Another container, the other group.
    let two = client.allocate(&["0000:17:00.0".into()]).await.unwrap();
    assert_eq!(two.envs.get(ENV).map(String::as_str), Some("0000:17:00.0"));
    plugins.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_in_one_allocate_give_one_address_each() {
    let tmp = tempfile::tempdir().unwrap();
    let inv = discover_root(&DiscoveryConfig {
        root: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs/vfio-passthrough"),
        ..DiscoveryConfig::default()
    })
    .unwrap()
    .inventory;
    let mut vm = PoolConfig::of_ids("vm-gpus", &[], FamilyConfig::Exclusive);
    vm.passthrough = true;
    let pools = vec![vm];
    let node = Node::new(inv.clone(), &pools, &Registry::with_builtins()).unwrap();
    let cdi = tmp.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let specs = cdi::SpecStore::open(cdi::StoreConfig {
        dir: cdi,
        vendor: "accel.nri.io".into(),
        class: "device".into(),
        format: cdi::SpecFormat::Yaml,
    })
    .unwrap();
    let journal = Checkpoint::load(&tmp.path().join("state"), "boot").unwrap();
    let engine = Arc::new(Engine::start(node, journal, specs, None).unwrap().0);
    let dir = tmp.path().join("device-plugins");
    let kubelet = DevicePluginKubelet::start(&dir).unwrap();
    let cfg = DevicePluginConfig {
        enabled: true,
        dir: dir.clone(),
        ..DevicePluginConfig::default()
    };
    let gate = Gate::new();
    gate.open();
    let (monitor, _tx) = HealthMonitor::fixed(HealthReport::all_healthy(&inv));
    let plugins = DevicePlugins::start(&cfg, &pools, engine, gate, monitor);
    // Without a name of its own the pool is accel.nri.io/vm-gpus, and the env follows it.
    let resource = "accel.nri.io/vm-gpus";
    kubelet.wait_registered(resource, WAIT).await.unwrap();
    let client = kubelet.client(resource).await.unwrap();
    let both = client
        .allocate(&["0000:65:00.0".into(), "0000:17:00.0".into()])
        .await
        .unwrap();
    // KubeVirt pops one address per host device of the VMI: the groups' primary functions,
    // never a second function of a group, which would take another group's place.
    assert_eq!(
        both.envs
            .get("PCI_RESOURCE_ACCEL_NRI_IO_VM-GPUS")
            .map(String::as_str),
        Some("0000:17:00.0,0000:65:00.0"),
        "{:?}",
        both.envs
    );
    // Without device_nodes the nodes come through the CDI names only.
    assert!(both.devices.is_empty());
    assert_eq!(both.cdi_devices.len(), 2);
    plugins.shutdown().await;
}

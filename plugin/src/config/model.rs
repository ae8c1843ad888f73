//! The config's shape: every section, its fields and their defaults.
//!
//! Every struct refuses unknown fields (a typo is an error, not a silently
//! ignored setting) and every field has a default, so an empty file is a
//! working config. docs/configuration.md explains each field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use policies::{CpuSet, Device, FamilyConfig, PoolConfig};
use serde::{Deserialize, Serialize};

/// The whole nri-accel config (`/etc/nri-accel/config.yaml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory of the checkpoint and the node lock.
    pub state_dir: PathBuf,
    /// How to reach the container runtime.
    pub nri: NriConfig,
    /// The claims API socket DRA drivers and operators call.
    pub claims_api: ClaimsApiConfig,
    /// Where and how CDI specs are written.
    pub cdi: CdiConfig,
    /// Where devices come from.
    pub discovery: DiscoveryConfig,
    /// Pools: which devices are handed out under which family. A device belongs
    /// to the first pool whose selector matches it.
    pub pools: Vec<PoolConfig>,
    /// Seconds between periodic reconciles of records against specs; 0 = only at startup.
    pub reconcile_interval_secs: u64,
    /// Pod annotations of the annotation path (no DRA).
    pub annotations: AnnotationsConfig,
    /// Optional `/metrics` and `/healthz` endpoint.
    pub metrics: MetricsConfig,
    /// Logging.
    pub log: LogConfig,
    /// The Kubernetes DRA driver (off by default: the node runs without it).
    pub dra: DraConfig,
    /// This node in Kubernetes and how to reach the API server (used when `dra.enabled`).
    pub kubernetes: KubernetesConfig,
    /// The kubelet device plugins (clusters without DRA): one resource per pool.
    pub device_plugin: DevicePluginConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from("/var/lib/nri-accel"),
            nri: NriConfig::default(),
            claims_api: ClaimsApiConfig::default(),
            cdi: CdiConfig::default(),
            discovery: DiscoveryConfig::default(),
            pools: vec![PoolConfig {
                name: "default".to_string(),
                select: Default::default(),
                family: FamilyConfig::Exclusive,
                cpus_per_device: 0,
                unhealthy: Default::default(),
                vendor_cdi: Default::default(),
            }],
            reconcile_interval_secs: 300,
            annotations: AnnotationsConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
            dra: DraConfig::default(),
            kubernetes: KubernetesConfig::default(),
            device_plugin: DevicePluginConfig::default(),
        }
    }
}

/// The NRI connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NriConfig {
    /// The runtime's NRI socket (ignored when the runtime launched us with fd 3).
    pub socket: PathBuf,
    /// Plugin name registered with the runtime: `[a-zA-Z0-9_.+-]+`.
    pub plugin_name: String,
    /// Plugin index, exactly two digits; plugins run in ascending index order.
    pub plugin_index: String,
    /// Kept so configs that set it still load: the annotation path always injects device
    /// nodes (see [`CdiInjection`]).
    pub cdi_injection: CdiInjection,
    /// Seconds after which the grant of a container the runtime has not reported as existing
    /// (no PostCreateContainer, StartContainer or Synchronize listing since nri-accel answered
    /// its CreateContainer) is released: its create failed, and CRI-O sends no event for that.
    /// 0: never (such a grant then waits for the pod's retry or removal).
    pub unconfirmed_grant_secs: u64,
}

impl Default for NriConfig {
    fn default() -> Self {
        NriConfig {
            socket: PathBuf::from("/var/run/nri/nri.sock"),
            plugin_name: "accel".to_string(),
            plugin_index: "10".to_string(),
            cdi_injection: CdiInjection::Auto,
            unconfirmed_grant_secs: DEFAULT_UNCONFIRMED_GRANT_SECS,
        }
    }
}

/// The default `nri.unconfirmed_grant_secs`: far above a create's usual second or two, and
/// below the kubelet's CRI deadline (2 minutes), past which CRI-O keeps a slow create for the
/// kubelet's retry, whose StartContainer then confirms the grant, or adopts it again.
pub const DEFAULT_UNCONFIRMED_GRANT_SECS: u64 = 60;

/// How the annotation path injects a grant: kept for configs written for earlier releases.
/// Every value now gives device nodes, device cgroup rules, env and mounts: the annotation
/// claim's CDI spec is written inside CreateContainer, and naming it in the same reply raced the
/// runtime's CDI cache (containerd refreshes it from directory events, asynchronously), which
/// failed 2-5 % of grants on real containerd. `cdi` draws a warning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CdiInjection {
    /// Device nodes (the default).
    #[default]
    Auto,
    /// No longer honoured: device nodes, with a warning.
    Cdi,
    /// Device nodes, cgroup rules, env and mounts.
    DeviceNodes,
}

/// The claims API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimsApiConfig {
    /// Unix socket path; created mode 0600 (0660 when `group` is set).
    pub socket: PathBuf,
    /// Group allowed to connect besides root (the socket's group), if any.
    pub group: Option<String>,
    /// Largest request accepted, in bytes.
    pub max_message_bytes: u32,
    /// Most connections served at once. Past it a new connection takes the place of one with
    /// no call in flight; it is refused (RESOURCE_EXHAUSTED) only when all have a call in flight.
    pub max_connections: u32,
    /// A connection silent this long with no call in flight is closed; 0: never.
    pub idle_timeout_seconds: u32,
    /// A connection that sends no request this long after it was accepted is closed; 0: never.
    pub first_request_timeout_seconds: u32,
}

impl Default for ClaimsApiConfig {
    fn default() -> Self {
        ClaimsApiConfig {
            socket: PathBuf::from("/run/nri-accel/claims.sock"),
            group: None,
            max_message_bytes: 1024 * 1024,
            max_connections: 128,
            idle_timeout_seconds: 300,
            first_request_timeout_seconds: 10,
        }
    }
}

/// CDI spec files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CdiConfig {
    /// Directory the runtime reads transient CDI specs from.
    pub dir: PathBuf,
    /// CDI vendor of our specs (`kind` = `vendor/class`).
    pub vendor: String,
    /// CDI class of our specs.
    pub class: String,
    /// Spec file format.
    pub format: SpecFormat,
    /// Directories of the vendors' own CDI specs, read for pools with `vendor_cdi` on
    /// (docs/gpus.md). nri-accel's own specs (kind `<vendor>/<class>`) are never read as
    /// vendor specs.
    pub vendor_spec_dirs: Vec<PathBuf>,
}

impl Default for CdiConfig {
    fn default() -> Self {
        CdiConfig {
            dir: PathBuf::from("/var/run/cdi"),
            vendor: "accel.nri.io".to_string(),
            class: "device".to_string(),
            format: SpecFormat::Yaml,
            vendor_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
        }
    }
}

/// File format of CDI specs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecFormat {
    /// `.yaml` files.
    #[default]
    Yaml,
    /// `.json` files.
    Json,
}

/// Where the device inventory comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Scan sysfs and procfs under `root` for accelerators.
    pub sysfs: bool,
    /// Root the host's `/sys`, `/proc` are read under (`/` on a real node).
    pub root: PathBuf,
    /// Devices listed by hand; added to what sysfs finds, replacing a found device of the same id.
    pub static_devices: Vec<Device>,
    /// The node's CPUs; when absent, the online CPUs from sysfs.
    pub cpus: Option<CpuSet>,
    /// Seconds between device health checks (a device whose PCI function, driver binding or
    /// device node is gone is unhealthy); 0 turns the checks off and every device stays healthy.
    pub health_check_secs: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            sysfs: true,
            root: PathBuf::from("/"),
            static_devices: Vec::new(),
            cpus: None,
            health_check_secs: 10,
        }
    }
}

/// Annotation path settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnnotationsConfig {
    /// Prefix of the pod annotations we read, e.g. `accel.nri.io/container.<name>`.
    pub prefix: String,
}

impl Default for AnnotationsConfig {
    fn default() -> Self {
        AnnotationsConfig {
            prefix: "accel.nri.io".to_string(),
        }
    }
}

/// Metrics endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Loopback address to serve `/metrics` and `/healthz` on; none = off.
    pub listen: Option<SocketAddr>,
}

/// Logging.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Least severe level logged (`RUST_LOG` overrides).
    pub level: LogLevel,
    /// Line format.
    pub format: LogFormat,
}

/// Log level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Everything.
    Trace,
    /// Decisions and their inputs.
    Debug,
    /// Lifecycle and grants.
    #[default]
    Info,
    /// Something is off but work goes on.
    Warn,
    /// Only failures.
    Error,
}

impl LogLevel {
    /// The level as `tracing`'s filter directives spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (journald adds timestamps).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The default cap on the connections of one kubelet-facing socket (`max_connections`).
pub const DEFAULT_KUBELET_MAX_CONNECTIONS: usize = 64;

/// The default idle timeout of a kubelet connection (`idle_timeout_secs`).
pub const DEFAULT_KUBELET_IDLE_TIMEOUT_SECS: u64 = 300;

/// The Kubernetes DRA driver: the ResourceSlices it publishes (docs/dra.md) and the kubelet
/// plugin (registration, DRA and health services; docs/dra-kubelet.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DraConfig {
    /// Serve the kubelet DRA plugin and publish ResourceSlices.
    pub enabled: bool,
    /// DRA driver name (a DNS subdomain of at most 63 characters). Claims-API and DRA results
    /// naming another driver are refused per claim.
    pub driver_name: String,
    /// The kubelet's plugin registry directory: the registration socket
    /// `<driver_name>-reg.sock` goes here.
    pub plugins_registry_dir: PathBuf,
    /// The kubelet's plugins directory: the DRA socket is `<driver_name>/dra.sock` under it.
    pub plugins_dir: PathBuf,
    /// Connections each of the two kubelet sockets holds at once; more are closed on accept.
    pub max_connections: usize,
    /// Seconds a kubelet connection with no call open is kept; 0 keeps it.
    pub idle_timeout_secs: u64,
    /// Write each prepared device's entry in its ResourceClaim's `status.devices` (KEP-4817)
    /// and remove it at unprepare.
    pub claim_status: bool,
    /// Pools published in the ResourceSlices; empty publishes every pool. Lets one node serve
    /// some pools through DRA and others through the device plugin without the scheduler
    /// counting a device through both.
    pub pools: Vec<String>,
}

impl Default for DraConfig {
    fn default() -> Self {
        DraConfig {
            enabled: false,
            driver_name: "accel.nri.io".to_string(),
            plugins_registry_dir: PathBuf::from("/var/lib/kubelet/plugins_registry"),
            plugins_dir: PathBuf::from("/var/lib/kubelet/plugins"),
            max_connections: DEFAULT_KUBELET_MAX_CONNECTIONS,
            idle_timeout_secs: DEFAULT_KUBELET_IDLE_TIMEOUT_SECS,
            claim_status: true,
            pools: Vec::new(),
        }
    }
}

/// What device plugin device IDs are built from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIds {
    /// The inventory id.
    #[default]
    Id,
    /// The device's UUID where discovery found one (NVIDIA GPUs), else the inventory id.
    Uuid,
}

/// The kubelet's device plugin API: one device plugin per pool, so that the scheduler counts a
/// node's free accelerators without DRA (docs/device-plugin.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DevicePluginConfig {
    /// Serve the device plugins and register them with the kubelet.
    pub enabled: bool,
    /// Resource names are `<resource_prefix>/<pool>` (a DNS subdomain).
    pub resource_prefix: String,
    /// The kubelet's device-plugins directory: its `kubelet.sock` and the plugins' sockets.
    pub dir: PathBuf,
    /// Pools served; empty serves every pool (pools of a custom family excepted).
    pub pools: Vec<String>,
    /// The slices cut on every device of a sliced pool, by pool name. The device plugin API
    /// cannot express overlapping slices, so each layout is a fixed set of non-overlapping
    /// slices. A sliced pool without a layout is advertised whole devices; a layout with
    /// several profiles gives one resource per profile, `<prefix>/<pool>-<profile>`.
    pub slice_layouts: BTreeMap<String, Vec<SliceAt>>,
    /// Also answer Allocate with device nodes, env and mounts, for runtimes without CDI (CDI
    /// device names are always answered).
    pub device_nodes: bool,
    /// What the kubelet device IDs are built from: the inventory id (`gpu0`, `0000:18:00.0`), or
    /// the device's UUID where it has one (`GPU-...`, as NVIDIA's device plugin can), so that a
    /// pod's ID names the physical GPU across nodes and reboots (docs/device-plugin.md).
    pub device_ids: DeviceIds,
    /// Seconds an allocation that no container has used yet keeps its devices when the kubelet
    /// hands them to another container; after that it is released first.
    pub unused_grace_secs: u64,
    /// Connections each plugin socket holds at once; more are closed on accept.
    pub max_connections: usize,
    /// Seconds a kubelet connection with no call open (no ListAndWatch either) is kept; 0
    /// keeps it.
    pub idle_timeout_secs: u64,
}

impl Default for DevicePluginConfig {
    fn default() -> Self {
        DevicePluginConfig {
            enabled: false,
            resource_prefix: "accel.nri.io".to_string(),
            dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            pools: Vec::new(),
            slice_layouts: BTreeMap::new(),
            device_nodes: false,
            device_ids: DeviceIds::Id,
            unused_grace_secs: 60,
            max_connections: DEFAULT_KUBELET_MAX_CONNECTIONS,
            idle_timeout_secs: DEFAULT_KUBELET_IDLE_TIMEOUT_SECS,
        }
    }
}

/// Access to the Kubernetes API server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// This node's name as Kubernetes knows it; empty: `$NODE_NAME`, else the host name.
    pub node_name: String,
    /// Kubeconfig file; none: the in-cluster service account when running in a pod, else
    /// `$KUBECONFIG` or `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
}

impl KubernetesConfig {
    /// The node name: the configured one, else `$NODE_NAME`, else the host name (lower-cased).
    pub fn resolve_node_name(&self) -> Option<String> {
        if !self.node_name.is_empty() {
            return Some(self.node_name.clone());
        }
        if let Some(n) = std::env::var_os("NODE_NAME").and_then(|n| n.into_string().ok())
            && !n.is_empty()
        {
            return Some(n);
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
    }
}

/// One slice of a static layout: a profile of the pool at one of its start slots.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SliceAt {
    /// A profile of the pool.
    pub profile: String,
    /// One of the profile's allowed start slots.
    pub start: u32,
}

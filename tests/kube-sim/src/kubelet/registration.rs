//! The kubelet's plugin watcher: plugins announce themselves by creating a socket in the registry
//! directory; the kubelet asks each for its info and says whether it took it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::wire::registration as pb;
use super::{GrpcCaller, SimError};

/// The DRA service versions a kubelet of 1.34+ understands, newest first.
pub const DRA_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// A plugin the simulated kubelet registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredPlugin {
    /// The registration socket it was found at.
    pub registration_socket: PathBuf,
    /// What GetInfo answered.
    pub kind: String,
    /// The driver name.
    pub name: String,
    /// The plugin's service socket.
    pub endpoint: PathBuf,
    /// Every service the plugin listed.
    pub supported_versions: Vec<String>,
    /// The DRA service version this kubelet picked (`v1.DRAPlugin` or `v1beta1.DRAPlugin`).
    pub dra_version: String,
}

/// Watches a plugins_registry directory the way the kubelet's plugin manager does.
#[derive(Debug)]
pub struct PluginWatcher {
    dir: PathBuf,
    /// DRA versions this kubelet speaks, in order of preference.
    accepts: Vec<String>,
    registered: BTreeMap<PathBuf, RegisteredPlugin>,
    /// Registration sockets that were refused, with the reason sent.
    refused: BTreeMap<PathBuf, String>,
}

impl PluginWatcher {
    /// A kubelet watching `dir` that speaks both DRA versions (Kubernetes 1.34+).
    pub fn new(dir: &Path) -> Self {
        Self::speaking(dir, &DRA_VERSIONS)
    }

    /// A kubelet that speaks only `versions` (e.g. `["v1beta1.DRAPlugin"]` for an older one).
    pub fn speaking(dir: &Path, versions: &[&str]) -> Self {
        PluginWatcher {
            dir: dir.to_path_buf(),
            accepts: versions.iter().map(|s| s.to_string()).collect(),
            registered: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    /// Plugins registered now.
    pub fn registered(&self) -> impl Iterator<Item = &RegisteredPlugin> {
        self.registered.values()
    }

    /// Registration sockets refused, with the reason the kubelet sent the plugin.
    pub fn refused(&self) -> &BTreeMap<PathBuf, String> {
        &self.refused
    }

    /// Forgets every plugin, as a restarted kubelet has; the next [`PluginWatcher::scan`] finds
    /// and registers them again.
    pub fn restart(&mut self) {
        self.registered.clear();
        self.refused.clear();
    }

    /// One pass over the directory: registers new sockets, drops plugins whose socket is gone.
    /// Returns the plugins registered in this pass.
    pub async fn scan(&mut self) -> Vec<RegisteredPlugin> {
        let mut found = Vec::new();
        let mut present = Vec::new();
        // A missing directory holds no plugins (a kubelet that wiped it).
        let entries = std::fs::read_dir(&self.dir).into_iter().flatten();
        for entry in entries.flatten() {
            let path = entry.path();
            let is_socket = std::os::unix::fs::FileTypeExt::is_socket(&match entry.file_type() {
                Ok(t) => t,
                Err(_) => continue,
            });
            if !is_socket {
                continue;
            }
            present.push(path.clone());
            if self.registered.contains_key(&path) || self.refused.contains_key(&path) {
                continue;
            }
            match self.register(&path).await {
                Ok(p) => {
                    self.registered.insert(path, p.clone());
                    found.push(p);
                }
                Err(SimError::Refused { reason, .. }) => {
                    self.refused.insert(path, reason);
                }
                Err(e) => {
                    tracing::debug!(socket = %path.display(), error = %e, "not registered yet")
                }
            }
        }
        self.registered.retain(|p, _| present.contains(p));
        found
    }

    /// Scans until a plugin named `name` is registered.
    pub async fn wait_for(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> Result<RegisteredPlugin, SimError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.scan().await;
            if let Some(p) = self.registered.values().find(|p| p.name == name) {
                return Ok(p.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SimError::Timeout(format!(
                    "plugin {name} to register in {}",
                    self.dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn register(&self, socket: &Path) -> Result<RegisteredPlugin, SimError> {
        let caller = GrpcCaller::connect(socket).await?;
        let info: pb::PluginInfo = caller.unary(pb::GET_INFO, pb::InfoRequest {}).await?;
        let verdict = self.judge(&info);
        let status = pb::RegistrationStatus {
            plugin_registered: verdict.is_ok(),
            error: verdict.as_ref().err().cloned().unwrap_or_default(),
        };
        let _: pb::RegistrationStatusResponse = caller.unary(pb::NOTIFY, status).await?;
        let dra_version = verdict.map_err(|reason| SimError::Refused {
            socket: socket.display().to_string(),
            reason,
        })?;
        Ok(RegisteredPlugin {
            registration_socket: socket.to_path_buf(),
            kind: info.r#type,
            name: info.name,
            endpoint: PathBuf::from(info.endpoint),
            supported_versions: info.supported_versions,
            dra_version,
        })
    }

    /// What the kubelet checks: the type, a name, an endpoint that exists, and a DRA version it
    /// speaks. Answers the version picked, or the reason for refusing.
    fn judge(&self, info: &pb::PluginInfo) -> Result<String, String> {
        if info.r#type != "DRAPlugin" {
            return Err(format!("plugin type {:?} is not handled", info.r#type));
        }
        if info.name.is_empty() {
            return Err("plugin name is empty".into());
        }
        if !Path::new(&info.endpoint).is_absolute() || !Path::new(&info.endpoint).exists() {
            return Err(format!("endpoint {:?} does not exist", info.endpoint));
        }
        self.accepts
            .iter()
            .find(|v| info.supported_versions.contains(v))
            .cloned()
            .ok_or_else(|| {
                format!(
                    "none of the versions {:?} is supported by this kubelet ({:?})",
                    info.supported_versions, self.accepts
                )
            })
    }
}

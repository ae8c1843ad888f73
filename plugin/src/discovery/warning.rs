//! What discovery reports when it skips something, and when it gives up.

use std::fmt;
use std::path::PathBuf;

/// Something discovery could not use; discovery went on without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryWarning {
    /// The device concerned (its PCI address), if the problem is about one.
    pub device: Option<String>,
    /// The host file concerned, if any.
    pub path: Option<PathBuf>,
    /// What is wrong and what was done about it.
    pub message: String,
}

impl fmt::Display for DiscoveryWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(d) = &self.device {
            write!(f, "device {d}: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(p) = &self.path {
            write!(f, " ({})", p.display())?;
        }
        Ok(())
    }
}

/// Discovery could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The configured root has no readable `/sys`.
    #[error(
        "discovery.root {}: {} is not a readable directory; set discovery.root to the host's \
         root, or turn discovery.sysfs off and list devices in discovery.static_devices",
        root.display(),
        root.join(path.strip_prefix("/").unwrap_or(path)).display()
    )]
    Root {
        /// The configured root.
        root: PathBuf,
        /// The host path that was missing.
        path: PathBuf,
    },
}

/// At most 32 characters of a bad value, for a warning.
pub(crate) fn short(text: &str) -> String {
    text.trim().chars().take(32).collect()
}

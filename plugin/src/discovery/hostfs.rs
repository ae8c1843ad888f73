//! Host file access for discovery, behind a trait so tests and the demo can
//! point it at a fixture tree.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest sysfs/procfs file discovery reads; real ones are under 4 KiB.
pub const MAX_HOST_FILE_BYTES: u64 = 64 * 1024;

/// Read-only access to the host's `/sys` and `/proc`. Paths are host paths
/// (`/sys/bus/pci/devices`); the implementation decides where they live.
pub trait HostFs {
    /// The file's text, at most [`MAX_HOST_FILE_BYTES`]; a larger file is an error.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Names of the entries of a directory, sorted.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// The target of a symbolic link, as written in the link.
    fn read_link(&self, path: &Path) -> io::Result<PathBuf>;
    /// Whether `path` is a directory (following symlinks).
    fn is_dir(&self, path: &Path) -> bool;
    /// Whether anything (a file, a device node, a dangling symlink) is at `path`. Never opens it:
    /// the device health check asks this of device nodes.
    fn exists(&self, path: &Path) -> bool;
}

/// The real host, every path read under `root` (`/` on a node, a fixture dir in tests).
#[derive(Debug, Clone)]
pub struct RootFs {
    root: PathBuf,
}

impl RootFs {
    /// Host access under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RootFs { root: root.into() }
    }

    /// The root everything is read under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path of host path `path`.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        let rel = path.strip_prefix("/").unwrap_or(path);
        self.root.join(rel)
    }
}

impl HostFs for RootFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        let file = std::fs::File::open(self.resolve(path))?;
        let mut buf = Vec::new();
        file.take(MAX_HOST_FILE_BYTES + 1).read_to_end(&mut buf)?;
        if buf.len() as u64 > MAX_HOST_FILE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("larger than {MAX_HOST_FILE_BYTES} bytes"),
            ));
        }
        String::from_utf8(buf)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(self.resolve(path))? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(self.resolve(path))
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.resolve(path).is_dir()
    }

    fn exists(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(self.resolve(path)).is_ok()
    }
}

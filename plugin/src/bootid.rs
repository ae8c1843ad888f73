//! The kernel's boot id: a random UUID the kernel draws at every boot.
//!
//! The checkpoint stamps its files with it. A record written under another boot
//! id describes containers that died with that boot, so startup drops it.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Where Linux publishes the boot id.
pub const PROC_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The most bytes read from the boot id file; the real one holds 37.
pub const MAX_BOOT_ID_BYTES: u64 = 128;

/// Source of the current boot id, behind a trait so tests can fix it.
pub trait BootId: Send + Sync {
    /// The boot id of the running kernel, trimmed; an error names the file read.
    fn boot_id(&self) -> io::Result<String>;
}

/// Reads the boot id from procfs (or another path, for fixture trees).
#[derive(Debug, Clone)]
pub struct ProcBootId {
    path: PathBuf,
}

impl ProcBootId {
    /// The real source, `/proc/sys/kernel/random/boot_id`.
    pub fn new() -> Self {
        Self::at(PROC_BOOT_ID)
    }

    /// A source reading another file shaped like the procfs one.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file this source reads.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Default for ProcBootId {
    fn default() -> Self {
        Self::new()
    }
}

impl BootId for ProcBootId {
    fn boot_id(&self) -> io::Result<String> {
        let with_path = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("reading the boot id from {}: {e}", self.path.display()),
            )
        };
        let file = File::open(&self.path).map_err(with_path)?;
        let mut raw = Vec::new();
        file.take(MAX_BOOT_ID_BYTES + 1)
            .read_to_end(&mut raw)
            .map_err(with_path)?;
        let invalid = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("boot id file {} {why}", self.path.display()),
            )
        };
        if raw.len() as u64 > MAX_BOOT_ID_BYTES {
            return Err(invalid("holds more than 128 bytes"));
        }
        let text = std::str::from_utf8(&raw).map_err(|_| invalid("is not UTF-8"))?;
        let id = text.trim();
        if id.is_empty() {
            return Err(invalid("is empty"));
        }
        if !id.chars().all(|c| c.is_ascii_graphic()) {
            return Err(invalid("holds characters other than printable ASCII"));
        }
        Ok(id.to_owned())
    }
}

/// A boot id fixed at construction: tests and the demo's simulated node.
#[derive(Debug, Clone)]
pub struct FixedBootId(pub String);

impl BootId for FixedBootId {
    fn boot_id(&self) -> io::Result<String> {
        Ok(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_trims_a_procfs_shaped_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        std::fs::write(&path, "0f6c1e39-6a43-4d1e-9d0c-5a1b2c3d4e5f\n").unwrap();
        let id = ProcBootId::at(&path).boot_id().unwrap();
        assert_eq!(id, "0f6c1e39-6a43-4d1e-9d0c-5a1b2c3d4e5f");
    }

    #[test]
    fn refuses_oversized_empty_and_missing_files_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; 4096]).unwrap();
        let err = ProcBootId::at(&big).boot_id().unwrap_err();
        assert!(err.to_string().contains("big"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        assert!(ProcBootId::at(&empty).boot_id().is_err());
        let missing = dir.path().join("missing");
        let err = ProcBootId::at(&missing).boot_id().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn the_real_file_when_present() {
        if Path::new(PROC_BOOT_ID).exists() {
            let id = ProcBootId::new().boot_id().unwrap();
            assert_eq!(id.len(), 36, "{id}");
        }
    }
}

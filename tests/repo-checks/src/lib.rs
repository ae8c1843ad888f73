//! Checks on the repository's shape rather than on the product's behaviour: which files import
//! which (the plugin's layers, no import cycles), what the README's tour and the docs link to,
//! what the shipped binary links, and the Rust version the workspace states. The tests in
//! `tests/` run them; this library holds the readers they share (docs/architecture.md,
//! "Layers").

pub mod imports;
pub mod markdown;

use std::path::{Path, PathBuf};

/// The repository root (this crate lives in `tests/repo-checks`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Reads `path`, naming it when it cannot.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

//! Shared helpers for the store's integration tests: fixtures and the official-parser oracle.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cdi::{DeviceEdits, DeviceKind, DeviceNode, Hook, Mount, SpecFormat, SpecStore, StoreConfig};
use container_device_interface as oracle;

/// A store of the default kind in `dir`.
pub fn store(dir: &Path, format: SpecFormat) -> SpecStore {
    SpecStore::open(StoreConfig {
        format,
        ..StoreConfig::new(dir)
    })
    .unwrap()
}

/// A GPU-like result: a char device node, env, a read-only bind mount and a hook.
pub fn gpu(i: usize) -> DeviceEdits {
    DeviceEdits {
        env: vec![("ACCEL_VISIBLE_DEVICES".into(), i.to_string())],
        device_nodes: vec![DeviceNode {
            path: format!("/dev/accel{i}"),
            kind: Some(DeviceKind::Char),
            major: Some(240),
            minor: Some(i as i64),
            file_mode: Some(0o666),
            permissions: Some("rw".into()),
            uid: Some(0),
            gid: Some(44),
            ..Default::default()
        }],
        mounts: vec![Mount {
            host_path: "/usr/lib/accel".into(),
            container_path: "/usr/lib/accel".into(),
            options: vec!["ro".into(), "nosuid".into(), "bind".into()],
            kind: None,
        }],
        hooks: vec![Hook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/accel-hook".into(),
            args: vec!["accel-hook".into(), "update-ldcache".into()],
            env: vec!["LD=1".into()],
            timeout: Some(10),
        }],
    }
}

/// Parses `path` with the official crate (schema and all validation), returning its
/// qualified device names, sorted, and its declared version.
pub fn official_parse(path: &Path) -> Result<(Vec<String>, String), String> {
    let spec = oracle::spec::read_spec(&path.to_path_buf(), 10).map_err(|e| format!("{e:#}"))?;
    let mut names: Vec<String> = spec
        .get_devices()
        .values()
        .map(|d| d.get_qualified_name())
        .collect();
    names.sort();
    let min = oracle::version::minimum_required_version(&spec.cdi_spec)
        .map_err(|e| format!("{e:#}"))?
        .to_string();
    Ok((names, min))
}

/// Every device the official cache resolves from `dir`, and whether it reported errors.
pub fn official_cache_devices(dir: &Path) -> (Vec<String>, usize) {
    let d = dir.to_str().unwrap();
    let cache = oracle::cache::new_cache(vec![
        oracle::spec_dirs::with_spec_dirs(&[d]),
        oracle::cache::with_auto_refresh(false),
    ]);
    let mut c = cache.lock().unwrap();
    let _ = c.refresh();
    let errors: usize = c.get_errors().values().map(Vec::len).sum();
    (c.list_devices(), errors)
}

/// Files in `dir` whose names end in `.yaml` or `.json` (what a CDI scanner reads).
pub fn visible_specs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"))
        .collect();
    v.sort();
    v
}

/// Names of every entry in `dir`, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

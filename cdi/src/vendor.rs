//! Vendor CDI specs: the files a device vendor's tooling writes (the NVIDIA Container Toolkit's
//! `nvidia.com/gpu` spec, AMD's or Intel's), read so that a grant can carry the vendor's user
//! space. Decoding only: the caller reads the bytes (bounded by [`MAX_SPEC_BYTES`]) and this
//! module turns them into a checked [`VendorSpec`] or one sentence naming the file.
//!
//! Unlike nri-accel's own specs, a vendor spec has spec-level `containerEdits` (the common edits
//! every device of the spec brings: control nodes, driver libraries, hooks) and may use every
//! field of CDI 1.1.0. Fields the grant cannot carry on every door (`intelRdt`, `netDevices`,
//! `additionalGids`) are decoded and reported by [`VendorEdits::unmergeable`], so the caller can
//! refuse to merge them instead of dropping them silently.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::edits::{DeviceEdits, DeviceNode, Hook, Mount, validate_edits};
use crate::{CdiError, MAX_SPEC_BYTES};

/// A vendor's CDI spec, decoded and checked.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VendorSpec {
    /// The spec's `cdiVersion`.
    pub cdi_version: String,
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    /// Spec-level annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The devices the spec names.
    pub devices: Vec<VendorDevice>,
    /// Edits every device of the spec brings (control nodes, libraries, hooks).
    #[serde(default)]
    pub container_edits: VendorEdits,
}

/// One device of a vendor spec.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VendorDevice {
    /// Unqualified name (`0`, `GPU-<uuid>`, `0:1`, `MIG-<uuid>`, `all`).
    pub name: String,
    /// Device-level annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The device's own edits.
    pub container_edits: VendorEdits,
}

/// CDI `containerEdits` with every field CDI 1.1.0 defines.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VendorEdits {
    /// `K=V` strings.
    #[serde(default)]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Hooks.
    #[serde(default)]
    pub hooks: Vec<Hook>,
    /// Intel RDT settings (CDI 0.7.0); kept opaque.
    #[serde(default)]
    pub intel_rdt: Option<serde_json::Value>,
    /// Extra groups for the container's process (CDI 0.7.0).
    #[serde(default)]
    pub additional_gids: Vec<u32>,
    /// Network devices to move into the container (CDI 1.1.0); kept opaque.
    #[serde(default)]
    pub net_devices: Vec<serde_json::Value>,
}

impl VendorEdits {
    /// The edits nri-accel can merge itself, with `env` split into `(name, value)`.
    pub fn to_device_edits(&self) -> DeviceEdits {
        DeviceEdits {
            env: self
                .env
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            device_nodes: self.device_nodes.clone(),
            mounts: self.mounts.clone(),
            hooks: self.hooks.clone(),
        }
    }

    /// The CDI fields present that an NRI adjustment made by nri-accel cannot carry.
    pub fn unmergeable(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.intel_rdt.is_some() {
            out.push("intelRdt");
        }
        if !self.additional_gids.is_empty() {
            out.push("additionalGids");
        }
        if !self.net_devices.is_empty() {
            out.push("netDevices");
        }
        out
    }

    fn is_empty(&self) -> bool {
        self.to_device_edits().is_empty() && self.unmergeable().is_empty()
    }
}

impl VendorDevice {
    /// Whether this entry is a MIG device of NVIDIA's spec: named `<gpu>:<mig>` or `MIG-<uuid>`,
    /// or bringing a `/dev/nvidia-caps` node. Such an entry describes a slice of a GPU, never a
    /// whole one.
    pub fn is_mig(&self) -> bool {
        self.name.contains(':')
            || self.name.starts_with("MIG-")
            || self
                .container_edits
                .device_nodes
                .iter()
                .any(|n| n.path.starts_with("/dev/nvidia-caps/"))
    }
}

impl VendorSpec {
    /// Decodes a vendor spec file's bytes: JSON when `path` ends in `.json`, YAML otherwise
    /// (CDI allows both). Refuses files over [`MAX_SPEC_BYTES`], unknown fields, a malformed
    /// kind, a device without a valid name or edits, duplicate device names and edits the
    /// official parser would refuse; every error is one sentence naming `path`.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<VendorSpec, CdiError> {
        let bad = |reason: String| CdiError::Vendor {
            path: path.to_owned(),
            reason,
        };
        if bytes.len() as u64 > MAX_SPEC_BYTES {
            return Err(CdiError::TooLarge {
                path: path.to_owned(),
                size: bytes.len() as u64,
                limit: MAX_SPEC_BYTES,
            });
        }
        let spec: VendorSpec = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_slice(bytes).map_err(|e| bad(first_line(&e.to_string())))?
        } else {
            serde_saphyr::from_slice(bytes).map_err(|e| bad(first_line(&e.to_string())))?
        };
        spec.check().map_err(bad)?;
        Ok(spec)
    }

    /// The vendor part of the kind (`nvidia.com`).
    pub fn vendor(&self) -> &str {
        self.kind.split_once('/').map_or("", |(v, _)| v)
    }

    /// `kind=name`, the name a runtime resolves.
    pub fn qualified(&self, device: &VendorDevice) -> String {
        format!("{}={}", self.kind, device.name)
    }

    fn check(&self) -> Result<(), String> {
        if self.cdi_version.trim().is_empty() {
            return Err("cdiVersion is empty".into());
        }
        let Some((vendor, class)) = self.kind.split_once('/') else {
            return Err(format!("kind {:?} is not vendor/class", self.kind));
        };
        crate::names::validate_kind_part("vendor", vendor).map_err(|e| e.to_string())?;
        kind_class_ok(class).map_err(|r| format!("kind {:?}: class {r}", self.kind))?;
        if self.devices.is_empty() {
            return Err("it names no device".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, d) in self.devices.iter().enumerate() {
            device_name_ok(&d.name).map_err(|r| format!("devices[{i}] name {:?} {r}", d.name))?;
            if !seen.insert(d.name.as_str()) {
                return Err(format!("device name {:?} appears twice", d.name));
            }
            if d.container_edits.is_empty() {
                return Err(format!("device {:?} has no containerEdits", d.name));
            }
            check_edits(&d.container_edits, &d.name, true)?;
        }
        check_edits(&self.container_edits, "containerEdits", false)
    }
}

/// The parser's message without the source snippet it draws below (one sentence per error).
fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    line.strip_prefix("error: ")
        .unwrap_or(line)
        .trim()
        .to_string()
}

fn check_edits(e: &VendorEdits, label: &str, device: bool) -> Result<(), String> {
    for (i, kv) in e.env.iter().enumerate() {
        match kv.split_once('=') {
            Some((k, _)) if !k.is_empty() => {}
            _ => return Err(format!("{label}: env[{i}] {kv:?} is not NAME=VALUE")),
        }
    }
    let edits = e.to_device_edits();
    if edits.is_empty() && (!device || !e.unmergeable().is_empty()) {
        return Ok(());
    }
    validate_edits(label, 0, &edits).map_err(|err| match err {
        CdiError::InvalidEdit { field, reason, .. } => format!("{label}: {field}: {reason}"),
        other => other.to_string(),
    })
}

/// A CDI class: a letter first, a letter or digit last, `[A-Za-z0-9_.-]` between (a vendor's
/// class may contain a dot; nri-accel only avoids one in its own).
fn kind_class_ok(class: &str) -> Result<(), &'static str> {
    let b = class.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) if f.is_ascii_alphabetic() && l.is_ascii_alphanumeric() => {}
        _ => return Err("must start with a letter and end with a letter or digit"),
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
    {
        return Err("contains a character outside [A-Za-z0-9_.-]");
    }
    Ok(())
}

/// A CDI device name: alphanumeric at both ends, `[A-Za-z0-9_.:-]` between.
fn device_name_ok(name: &str) -> Result<(), &'static str> {
    let b = name.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) if f.is_ascii_alphanumeric() && l.is_ascii_alphanumeric() => {}
        _ => return Err("must start and end with a letter or digit"),
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-'))
    {
        return Err("contains a character outside [A-Za-z0-9_.:-]");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVIDIA: &str = r#"---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "0:1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia-caps/nvidia-cap12
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
"#;

    #[test]
    fn decodes_an_nvidia_shaped_spec() {
        let s = VendorSpec::decode(NVIDIA.as_bytes(), Path::new("/etc/cdi/nvidia.yaml")).unwrap();
        assert_eq!(s.kind, "nvidia.com/gpu");
        assert_eq!(s.devices.len(), 4);
        assert!(s.devices[2].is_mig());
        assert!(!s.devices[1].is_mig());
        assert_eq!(
            s.qualified(&s.devices[1]),
            "nvidia.com/gpu=GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
        );
        let common = s.container_edits.to_device_edits();
        assert_eq!(
            common.env,
            [("NVIDIA_VISIBLE_DEVICES".into(), "void".into())]
        );
        assert_eq!(common.hooks[0].args[1], "update-ldcache");
    }

    #[test]
    fn json_and_opaque_fields() {
        let json = r#"{"cdiVersion":"1.1.0","kind":"example.com/nic","devices":[{"name":"n0","containerEdits":{"netDevices":[{"hostInterfaceName":"eth1","name":"net1"}]}}],"containerEdits":{"additionalGids":[44]}}"#;
        let s = VendorSpec::decode(json.as_bytes(), Path::new("/var/run/cdi/n.json")).unwrap();
        assert_eq!(s.devices[0].container_edits.unmergeable(), ["netDevices"]);
        assert_eq!(s.container_edits.unmergeable(), ["additionalGids"]);
    }

    #[test]
    fn refusals_name_the_file() {
        for (bad, why) in [
            (
                "cdiVersion: 0.5.0\nkind: nvidia.com\ndevices: []\n",
                "not vendor/class",
            ),
            (
                "cdiVersion: 0.5.0\nkind: a.io/b\ndevices: []\n",
                "names no device",
            ),
            (
                "cdiVersion: 0.5.0\nkind: a.io/b\ndevices:\n- name: x\n  containerEdits: {}\n",
                "no containerEdits",
            ),
            (
                "cdiVersion: 0.5.0\nkind: a.io/b\ndevices:\n- name: x\n  containerEdits: {env: [A=1]}\n- name: x\n  containerEdits: {env: [A=1]}\n",
                "appears twice",
            ),
            (
                "cdiVersion: 0.5.0\nkind: a.io/b\ndevices:\n- name: -x\n  containerEdits: {env: [A=1]}\n",
                "start and end",
            ),
            (
                "cdiVersion: 0.5.0\nkind: a.io/b\ndevices:\n- name: x\n  containerEdits: {env: [A=1]}\ncontainerEdits:\n  hooks: [{hookName: nope, path: /x}]\n",
                "hookName",
            ),
            (
                "cdiVersion: 0.5.0\nkind: a.io/b\nbogus: 1\ndevices: []\n",
                "bogus",
            ),
            ("{", ""),
        ] {
            let e = VendorSpec::decode(bad.as_bytes(), Path::new("/etc/cdi/v.yaml"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("/etc/cdi/v.yaml") && e.contains(why),
                "{bad:?}: {e}"
            );
        }
        let big = vec![b' '; (MAX_SPEC_BYTES + 1) as usize];
        let e = VendorSpec::decode(&big, Path::new("/etc/cdi/big.yaml")).unwrap_err();
        assert!(matches!(e, CdiError::TooLarge { .. }), "{e}");
    }
}

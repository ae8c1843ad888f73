//! The state of one discovery run: host access and the warnings so far.

use std::collections::BTreeMap;
use std::path::Path;

use policies::{DeviceNode, NodeKind};

use super::{DiscoveryWarning, HostFs};

/// One discovery run.
pub(crate) struct Scan<'a> {
    pub host: &'a dyn HostFs,
    pub warnings: Vec<DiscoveryWarning>,
    char_majors: Option<BTreeMap<String, u32>>,
    once: std::collections::BTreeSet<&'static str>,
}

impl<'a> Scan<'a> {
    pub(crate) fn new(host: &'a dyn HostFs) -> Self {
        Scan {
            host,
            warnings: Vec::new(),
            char_majors: None,
            once: Default::default(),
        }
    }

    /// Records a warning and logs it.
    pub(crate) fn warn(&mut self, device: Option<&str>, path: Option<&Path>, message: String) {
        let w = DiscoveryWarning {
            device: device.map(str::to_string),
            path: path.map(Path::to_path_buf),
            message,
        };
        tracing::warn!(device = w.device.as_deref().unwrap_or(""), "discovery: {w}");
        self.warnings.push(w);
    }

    /// Like [`Scan::warn`], but only the first time for `key` in this run.
    pub(crate) fn warn_once(&mut self, key: &'static str, path: Option<&Path>, message: String) {
        if self.once.insert(key) {
            self.warn(None, path, message);
        }
    }

    /// The major number of character driver `name` from `/proc/devices`.
    pub(crate) fn char_major(&mut self, name: &str) -> Option<u32> {
        if self.char_majors.is_none() {
            let path = Path::new("/proc/devices");
            let map = match self.host.read(path) {
                Ok(text) => parse_proc_devices(&text),
                Err(e) => {
                    self.warn(
                        None,
                        Some(path),
                        format!("cannot read the driver majors: {e}"),
                    );
                    BTreeMap::new()
                }
            };
            self.char_majors = Some(map);
        }
        self.char_majors.as_ref().and_then(|m| m.get(name).copied())
    }

    /// Reads a `dev` file (`major:minor`) into a character device node at `node_path`.
    pub(crate) fn dev_node(
        &mut self,
        device: Option<&str>,
        dev_file: &Path,
        node_path: String,
    ) -> Option<DeviceNode> {
        let text = match self.host.read(dev_file) {
            Ok(t) => t,
            Err(e) => {
                self.warn(
                    device,
                    Some(dev_file),
                    format!("cannot read the device number of {node_path}: {e}"),
                );
                return None;
            }
        };
        match parse_major_minor(&text) {
            Some((major, minor)) => Some(char_node(node_path, major, minor)),
            None => {
                self.warn(
                    device,
                    Some(dev_file),
                    format!(
                        "device number {:?} of {node_path} is not major:minor",
                        super::warning::short(&text)
                    ),
                );
                None
            }
        }
    }
}

/// A character device node with `rw` access.
pub(crate) fn char_node(path: String, major: u32, minor: u32) -> DeviceNode {
    DeviceNode {
        path,
        host_path: None,
        kind: NodeKind::Char,
        major,
        minor,
        permissions: "rw".to_string(),
    }
}

/// Parses `major:minor` as in sysfs `dev` files.
pub(crate) fn parse_major_minor(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The character-device section of `/proc/devices`: name -> major.
fn parse_proc_devices(text: &str) -> BTreeMap<String, u32> {
    let mut map = BTreeMap::new();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with("devices:") {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((major, name)) = line.split_once(char::is_whitespace)
            && let Ok(major) = major.parse::<u32>()
        {
            map.entry(name.trim().to_string()).or_insert(major);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_devices_keeps_only_character_majors() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n195 bogus\n";
        let m = parse_proc_devices(text);
        assert_eq!(m.get("nvidia"), Some(&195));
        assert_eq!(m.get("nvidia-uvm"), Some(&510));
        assert_eq!(m.get("sd"), None);
        assert_eq!(m.get("bogus"), None);
    }

    #[test]
    fn major_minor_parses_and_refuses_garbage() {
        assert_eq!(parse_major_minor("226:128\n"), Some((226, 128)));
        assert_eq!(parse_major_minor("226"), None);
        assert_eq!(parse_major_minor("a:1"), None);
    }
}

//! The on-disk CDI spec: its types, the minimum `cdiVersion` rule, encoding and bounded decoding.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::edits::{DeviceEdits, DeviceNode, Hook, Mount};
use crate::{CdiError, names};

/// Largest spec file the store writes or reads back (1 MiB).
pub const MAX_SPEC_BYTES: u64 = 1 << 20;

/// The encoding of spec files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecFormat {
    /// `.yaml` files (the default, like most CDI producers).
    #[default]
    Yaml,
    /// `.json` files.
    Json,
}

impl SpecFormat {
    /// File extension without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            SpecFormat::Yaml => "yaml",
            SpecFormat::Json => "json",
        }
    }
}

/// A CDI spec as written to disk: one per claim, one device per claim result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The minimum CDI version the content needs.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Spec-level annotations (needs 0.6.0; the store writes none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The claim's devices, `claim-<uid>-<i>` in result order.
    pub devices: Vec<Device>,
}

/// One CDI device of a spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// Unqualified device name.
    pub name: String,
    /// Device-level annotations (needs 0.6.0; the store writes none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What the runtime does to the container for this device.
    pub container_edits: ContainerEdits,
}

/// CDI `containerEdits` as it appears on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// `K=V` strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl From<&DeviceEdits> for ContainerEdits {
    fn from(e: &DeviceEdits) -> Self {
        ContainerEdits {
            env: e.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            device_nodes: e.device_nodes.clone(),
            mounts: e.mounts.clone(),
            hooks: e.hooks.clone(),
        }
    }
}

impl Spec {
    /// Builds the spec of a claim from already-validated results.
    pub(crate) fn for_claim(kind: &str, uid: &str, results: &[DeviceEdits]) -> Spec {
        let mut spec = Spec {
            cdi_version: String::new(),
            kind: kind.to_owned(),
            annotations: BTreeMap::new(),
            devices: results
                .iter()
                .enumerate()
                .map(|(i, e)| Device {
                    name: names::device_name(uid, i),
                    annotations: BTreeMap::new(),
                    container_edits: e.into(),
                })
                .collect(),
        };
        spec.cdi_version = spec.minimum_version().to_owned();
        spec
    }

    /// The lowest CDI version that can express this spec: 0.3.0, or 0.4.0 with a typed mount,
    /// 0.5.0 with a device-node host path, 0.6.0 with annotations. Older runtimes reject
    /// versions they do not know, so the store never writes a higher one than needed.
    pub fn minimum_version(&self) -> &'static str {
        let edits = || self.devices.iter().map(|d| &d.container_edits);
        if !self.annotations.is_empty() || self.devices.iter().any(|d| !d.annotations.is_empty()) {
            "0.6.0"
        } else if edits().any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some())) {
            "0.5.0"
        } else if edits().any(|e| e.mounts.iter().any(|m| m.kind.is_some())) {
            "0.4.0"
        } else {
            "0.3.0"
        }
    }

    /// Encodes the spec; `claim` labels the error.
    pub(crate) fn encode(&self, format: SpecFormat, claim: &str) -> Result<Vec<u8>, CdiError> {
        let enc = |reason: String| CdiError::Encode {
            claim: claim.to_owned(),
            reason,
        };
        match format {
            // No block scalars: a value such as "\t\n" written as a `|` block is a tab where the
            // official parser wants indentation, and it refuses the whole spec. Quoted strings
            // with escapes read back the same in every YAML parser.
            SpecFormat::Yaml => serde_saphyr::to_string_with_options(
                self,
                serde_saphyr::ser_options! { prefer_block_scalars: false },
            )
            .map(String::into_bytes)
            .map_err(|e| enc(e.to_string())),
            SpecFormat::Json => serde_json::to_string_pretty(self)
                .map(|json| yaml_safe_json(&json).into_bytes())
                .map_err(|e| enc(e.to_string())),
        }
    }

    /// Decodes a spec file's bytes (at most [`MAX_SPEC_BYTES`]); JSON is tried for `.json`.
    pub(crate) fn decode(bytes: &[u8], path: &Path) -> Result<Spec, CdiError> {
        let parse = |reason: String| CdiError::Parse {
            path: path.to_owned(),
            reason,
        };
        if path.extension().is_some_and(|e| e == "json") {
            // A stamp is a YAML comment line, which every CDI reader (a YAML parser) skips.
            let body = match bytes.first() {
                Some(b'#') => bytes
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(&bytes[bytes.len()..], |n| &bytes[n + 1..]),
                _ => bytes,
            };
            serde_json::from_slice(body).map_err(|e| parse(e.to_string()))
        } else {
            serde_saphyr::from_slice(bytes).map_err(|e| parse(e.to_string()))
        }
    }
}

/// Escapes the characters serde_json leaves raw but YAML parsers treat specially.
///
/// CDI runtimes parse `.json` specs with a YAML parser (JSON is nearly a subset of YAML). YAML
/// forbids DEL, the C1 controls and U+FFFE/U+FFFF, and reads U+0085, U+2028 and U+2029 as line
/// breaks, folding them away. Escaped as `\uXXXX` they mean the same to both parsers. They can
/// only occur inside JSON strings (the rest of the output is ASCII), so escaping them everywhere
/// is exact.
fn yaml_safe_json(json: &str) -> String {
    let needs = |c: char| {
        matches!(
            c,
            '\u{7f}'..='\u{9f}' | '\u{2028}' | '\u{2029}' | '\u{fffe}' | '\u{ffff}'
        )
    };
    if !json.contains(needs) {
        return json.to_owned();
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if needs(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edits() -> DeviceEdits {
        DeviceEdits {
            env: vec![("A".into(), "1".into())],
            ..Default::default()
        }
    }

    #[test]
    fn json_escapes_what_yaml_parsers_refuse() {
        assert_eq!(
            yaml_safe_json("\"a\u{7f}\u{85}\u{2028}é\""),
            "\"a\\u007f\\u0085\\u2028é\""
        );
        let v: String = serde_json::from_str(&yaml_safe_json("\"\u{9f}x\"")).unwrap();
        assert_eq!(v, "\u{9f}x");
    }

    #[test]
    fn minimum_version_rules() {
        let base = Spec::for_claim("v.io/c", "u", &[edits()]);
        assert_eq!(base.cdi_version, "0.3.0");
        let mut e = edits();
        e.mounts.push(Mount {
            host_path: "/a".into(),
            container_path: "/b".into(),
            options: vec![],
            kind: Some("tmpfs".into()),
        });
        assert_eq!(
            Spec::for_claim("v.io/c", "u", &[e.clone()]).cdi_version,
            "0.4.0"
        );
        e.device_nodes.push(DeviceNode {
            path: "/dev/x".into(),
            host_path: Some("/dev/y".into()),
            ..Default::default()
        });
        assert_eq!(
            Spec::for_claim("v.io/c", "u", &[edits(), e]).cdi_version,
            "0.5.0"
        );
        let mut s = base;
        s.devices[0].annotations.insert("a".into(), "b".into());
        assert_eq!(s.minimum_version(), "0.6.0");
    }

    #[test]
    fn yaml_and_json_round_trip() {
        let s = Spec::for_claim("v.io/c", "u1", &[edits(), edits()]);
        for f in [SpecFormat::Yaml, SpecFormat::Json] {
            let bytes = s.encode(f, "u1").unwrap();
            let p = format!("x.{}", f.extension());
            assert_eq!(Spec::decode(&bytes, Path::new(&p)).unwrap(), s);
        }
    }

    #[test]
    fn decode_refuses_unknown_fields_naming_the_file() {
        let e = Spec::decode(
            b"cdiVersion: 0.3.0\nkind: a/b\ndevices: []\nbogus: 1\n",
            Path::new("/d/f.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/d/f.yaml"), "{e}");
    }
}

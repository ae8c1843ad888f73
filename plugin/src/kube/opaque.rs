//! The opaque device configuration nri-accel accepts in a claim or a DeviceClass:
//! `apiVersion: accel.nri.io/v1alpha1`, `kind: DeviceConfig` (docs/dra.md has the schema).
//!
//! Parsing is strict: unknown fields, another apiVersion or kind, and parameters larger than
//! [`MAX_OPAQUE_CONFIG_BYTES`] are errors, so a typo fails the claim instead of being ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The apiVersion of the schema.
pub const API_VERSION: &str = "accel.nri.io/v1alpha1";
/// The kind of the schema.
pub const KIND: &str = "DeviceConfig";
/// Largest parameters accepted, as JSON text (the API server's own limit is 10 KiB).
pub const MAX_OPAQUE_CONFIG_BYTES: usize = 10 * 1024;
/// Most environment variables one config may set.
pub const MAX_ENV: usize = 64;
/// Longest environment value.
pub const MAX_ENV_VALUE: usize = 4096;

/// Settings for the devices of the requests a configuration applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceConfig {
    /// Must be [`API_VERSION`].
    pub api_version: String,
    /// Must be [`KIND`].
    pub kind: String,
    /// Environment variables for the containers that use the devices (names
    /// `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_ENV`], values at most [`MAX_ENV_VALUE`] bytes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Why an opaque configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpaqueError {
    /// Larger than [`MAX_OPAQUE_CONFIG_BYTES`].
    #[error("its parameters are {size} bytes, more than the {MAX_OPAQUE_CONFIG_BYTES} accepted")]
    TooLarge {
        /// Size of the parameters as JSON text.
        size: usize,
    },
    /// Not the schema: a wrong type, an unknown or missing field.
    #[error("its parameters do not parse as {API_VERSION} {KIND}: {0}")]
    Parse(String),
    /// Another apiVersion or kind.
    #[error("its parameters are {api_version} {kind}, expected {API_VERSION} {KIND}")]
    WrongType {
        /// The apiVersion given.
        api_version: String,
        /// The kind given.
        kind: String,
    },
    /// A bad environment variable.
    #[error("env {name:?}: {why}")]
    Env {
        /// The variable.
        name: String,
        /// What is wrong with it.
        why: String,
    },
}

fn env_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

impl DeviceConfig {
    /// Parses the `parameters` of an opaque configuration for this driver.
    pub fn parse(parameters: &serde_json::Value) -> Result<DeviceConfig, OpaqueError> {
        let size = serde_json::to_vec(parameters).map_or(usize::MAX, |v| v.len());
        if size > MAX_OPAQUE_CONFIG_BYTES {
            return Err(OpaqueError::TooLarge { size });
        }
        let config =
            DeviceConfig::deserialize(parameters).map_err(|e| OpaqueError::Parse(e.to_string()))?;
        if config.api_version != API_VERSION || config.kind != KIND {
            return Err(OpaqueError::WrongType {
                api_version: config.api_version,
                kind: config.kind,
            });
        }
        if config.env.len() > MAX_ENV {
            return Err(OpaqueError::Env {
                name: config.env.keys().nth(MAX_ENV).cloned().unwrap_or_default(),
                why: format!("at most {MAX_ENV} variables may be set"),
            });
        }
        for (name, value) in &config.env {
            if !env_name_ok(name) {
                return Err(OpaqueError::Env {
                    name: name.clone(),
                    why: "names are letters, digits and '_', not starting with a digit".into(),
                });
            }
            if value.len() > MAX_ENV_VALUE || value.contains('\0') {
                return Err(OpaqueError::Env {
                    name: name.clone(),
                    why: format!("values are at most {MAX_ENV_VALUE} bytes, without NUL"),
                });
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_schema_parses_strictly() {
        let ok = json!({"apiVersion": API_VERSION, "kind": KIND, "env": {"MPS_LIMIT": "50"}});
        assert_eq!(DeviceConfig::parse(&ok).unwrap().env["MPS_LIMIT"], "50");
        let typo = json!({"apiVersion": API_VERSION, "kind": KIND, "envs": {}});
        assert!(matches!(
            DeviceConfig::parse(&typo),
            Err(OpaqueError::Parse(_))
        ));
        let other = json!({"apiVersion": "gpu.example.com/v1", "kind": KIND});
        assert!(matches!(
            DeviceConfig::parse(&other),
            Err(OpaqueError::WrongType { .. })
        ));
        let bad = json!({"apiVersion": API_VERSION, "kind": KIND, "env": {"1X": "y"}});
        assert!(matches!(
            DeviceConfig::parse(&bad),
            Err(OpaqueError::Env { .. })
        ));
        assert!(DeviceConfig::parse(&json!("text")).is_err());
    }

    #[test]
    fn large_parameters_are_refused_before_parsing() {
        let big = json!({"apiVersion": API_VERSION, "kind": KIND,
                         "env": {"A": "x".repeat(MAX_OPAQUE_CONFIG_BYTES)}});
        assert!(matches!(
            DeviceConfig::parse(&big),
            Err(OpaqueError::TooLarge { .. })
        ));
    }
}

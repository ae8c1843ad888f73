//! The nri-accel config file: its shape, defaults, loading and validation.
//!
//! YAML parsed with `serde-saphyr` under a tight budget, unknown fields
//! refused everywhere, then checked value by value. Every error names the
//! file, the line and column, and says in one sentence what is wrong, so
//! `nri-accel check-config` can print it as is.

pub mod device_plugin;
mod error;
mod model;
mod problem;
pub mod same_device;
mod spans;
mod validate;
mod validate_device_plugin;

use std::io::Read;
use std::path::Path;

pub use error::{ConfigError, Position};
pub use model::{
    AnnotationsConfig, CdiConfig, CdiInjection, ClaimsApiConfig, Config,
    DEFAULT_KUBELET_IDLE_TIMEOUT_SECS, DEFAULT_KUBELET_MAX_CONNECTIONS, DeviceIds,
    DevicePluginConfig, DiscoveryConfig, DraConfig, KubernetesConfig, LogConfig, LogFormat,
    LogLevel, MetricsConfig, NriConfig, SliceAt, SpecFormat,
};

/// Where the daemon reads its config unless told otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/nri-accel/config.yaml";

/// Largest config accepted, in bytes. Real configs are a few KiB.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// Parser limits: far above any real config, far below what would hurt.
fn parse_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_reader_input_bytes: Some(MAX_CONFIG_BYTES),
            max_events: 200_000,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_depth: 32,
            max_documents: 1,
            max_nodes: 100_000,
            max_total_scalar_bytes: MAX_CONFIG_BYTES,
        },
    }
}

/// Where the config [`Config::load_or_defaults`] answered came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// The file at the path given.
    File,
    /// The built-in defaults: the path was [`DEFAULT_CONFIG_PATH`] and no file is there.
    Defaults,
}

/// What a command says when [`ConfigSource::Defaults`] applies.
pub const DEFAULTS_NOTE: &str = "/etc/nri-accel/config.yaml does not exist: using the built-in \
    defaults (the ones the packaged file states); name another file with --config";

impl Config {
    /// The config every subcommand runs with, by one rule: the file at `path`, which must exist,
    /// except that a missing [`DEFAULT_CONFIG_PATH`] means the built-in defaults (a node without
    /// a config file runs as the packaged file, which states exactly those). The rule looks at
    /// the path, not at how it was given, so the packaged unit's explicit
    /// `--config /etc/nri-accel/config.yaml` behaves as leaving `--config` out, and
    /// `check-config` checks what `run` would run with.
    pub fn load_or_defaults(path: &Path) -> Result<(Config, ConfigSource), ConfigError> {
        Config::load_or_defaults_at(path, Path::new(DEFAULT_CONFIG_PATH))
    }

    /// [`Config::load_or_defaults`] with `default` as the path that may be missing (tests use a
    /// temp path; the binary uses [`DEFAULT_CONFIG_PATH`]).
    pub fn load_or_defaults_at(
        path: &Path,
        default: &Path,
    ) -> Result<(Config, ConfigSource), ConfigError> {
        match Config::load(path) {
            Err(ConfigError::Missing { .. }) if path == default => {
                Ok((Config::default(), ConfigSource::Defaults))
            }
            loaded => loaded.map(|c| (c, ConfigSource::File)),
        }
    }

    /// Reads, parses and validates the config file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let io = |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ConfigError::Missing {
                    path: path.to_path_buf(),
                }
            } else {
                ConfigError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            }
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let mut text = String::new();
        file.take(MAX_CONFIG_BYTES as u64 + 1)
            .read_to_string(&mut text)
            .map_err(io)?;
        Config::from_yaml(&text, &path.display().to_string())
    }

    /// Parses and validates config text; `origin` (usually the file path)
    /// names the source in errors. Empty text (or only comments) gives the defaults.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                origin: origin.to_string(),
                limit: MAX_CONFIG_BYTES,
            });
        }
        let parsed: Option<Config> = serde_saphyr::from_str_with_options(text, parse_options())
            .map_err(|e| syntax_error(&e, text, origin))?;
        let cfg = parsed.unwrap_or_default();
        if let Err(problem) = validate::validate(&cfg) {
            let tree: Option<spans::Tree> =
                serde_saphyr::from_str_with_options(text, parse_options())
                    .ok()
                    .flatten();
            let position = tree.and_then(|t| t.locate(&problem.path));
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                field: spans::render_path(&problem.path),
                position,
                message: problem.message,
            });
        }
        Ok(cfg)
    }

    /// Checks a config built in code (e.g. by the demo) as a loaded one would be.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        validate::validate(self).map_err(|problem| ConfigError::Invalid {
            origin: origin.to_string(),
            field: spans::render_path(&problem.path),
            position: None,
            message: problem.message,
        })
    }
}

/// Turns a parser error into ours: position apart, message without the
/// parser's own " at line L, column C" suffix or source snippet.
fn syntax_error(e: &serde_saphyr::Error, text: &str, origin: &str) -> ConfigError {
    let plain = e.without_snippet();
    let position = plain.location().filter(|l| l.line() > 0).map(|l| Position {
        line: l.line(),
        column: l.column(),
    });
    let mut message = plain.to_string();
    if let Some(p) = position {
        let suffix = format!(" at line {}, column {}", p.line, p.column);
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_string();
        }
    }
    if let Some(detail) = message.strip_prefix("budget breached: ") {
        message = format!(
            "the config breaks a parser limit ({detail}); a config is one small YAML document"
        );
    } else {
        message = plain_type_error(&message);
        // A value of the wrong type: name its field, which the parser's message does not.
        if !message.starts_with("unknown field")
            && let Some(at) = position
            && let Some(tree) =
                serde_saphyr::from_str_with_options::<Option<spans::Tree>>(text, parse_options())
                    .ok()
                    .flatten()
            && let Some(field) = tree.path_at(at)
        {
            // The type's range is wider than some fields accept: say the field's own.
            if message.starts_with("expected a whole number from ")
                && let Some(range) = validate::field_range(&field)
            {
                let found = message.split_once(", found ").map(|(_, f)| f.to_string());
                message = format!("expected a whole number from {range}");
                if let Some(found) = found {
                    message.push_str(&format!(", found {found}"));
                }
            }
            message = format!("{field}: {message}");
        }
    }
    ConfigError::Syntax {
        origin: origin.to_string(),
        position,
        message,
    }
}

/// The parser's words for a value of the wrong type, said as what is expected: `invalid u32`
/// becomes `expected a whole number from 0 to 4294967295`.
fn plain_type_error(message: &str) -> String {
    const NUMBERS: [(&str, &str); 4] = [
        ("u8", "a whole number from 0 to 255"),
        ("u16", "a whole number from 0 to 65535"),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u64", "a whole number from 0 to 18446744073709551615"),
    ];
    for (ty, words) in NUMBERS {
        if message == format!("invalid {ty}") {
            return format!("expected {words}");
        }
        if let Some(found) = message
            .strip_prefix("invalid type: ")
            .and_then(|m| m.strip_suffix(&format!(", expected {ty}")))
        {
            return format!("expected {words}, found {found}");
        }
    }
    if message == "invalid socket address syntax" {
        return "expected an address and port such as 127.0.0.1:9464 or [::1]:9464".to_string();
    }
    if let Some(found) = message
        .strip_prefix("invalid type: ")
        .and_then(|m| m.strip_suffix(", expected internally tagged enum FamilyConfig"))
    {
        return family_form_error(found);
    }
    if message == "missing field `kind`" {
        return format!("the family names no kind; the accepted forms are {FAMILY_FORMS}");
    }
    message.to_string()
}

/// Every form a pool's `family` may take (docs/configuration.md, `pools`).
const FAMILY_FORMS: &str = "{kind: exclusive}, {kind: shared, replicas: <shares per device>}, \
    {kind: sliced, slots: <n>, profiles: [...]} and {kind: custom, policy: <name>}";

/// A `family` that is not a mapping (`family: exclusive`): what was found, the forms accepted,
/// and the one meant when the value is a kind's name.
fn family_form_error(found: &str) -> String {
    let meant = found
        .strip_prefix("string ")
        .map(|s| s.trim_matches('"'))
        .and_then(|kind| match kind {
            "exclusive" => Some("family: {kind: exclusive}".to_string()),
            "shared" => Some("family: {kind: shared, replicas: 4}".to_string()),
            "sliced" => Some("family: {kind: sliced, slots: 8, profiles: [...]}".to_string()),
            "custom" => Some("family: {kind: custom, policy: <name>}".to_string()),
            _ => None,
        });
    let mut text = format!(
        "expected a mapping with the family's kind and its parameters, found {found}; \
         the accepted forms are {FAMILY_FORMS}"
    );
    if let Some(meant) = meant {
        text.push_str(&format!(" (here, for example: {meant})"));
    }
    text
}

//! Errors from reading, parsing and validating the config file.

use std::fmt;
use std::path::PathBuf;

/// Where in the config text a problem is: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Renders `origin:line:column` or just `origin` when the position is unknown.
pub(crate) struct At<'a>(pub &'a str, pub &'a Option<Position>);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(p) => write!(f, "{}:{p}", self.0),
            None => f.write_str(self.0),
        }
    }
}

/// Why a config could not be loaded. Every variant names the file (the
/// `origin`), and parse and validation errors the line and column, so
/// `nri-accel check-config` can print them as `file:line:column: message`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file does not exist, and it is not the default path (which may be missing: see
    /// [`crate::config::Config::load_or_defaults`]).
    #[error(
        "{}: no such config file; name a file that exists (only the default, {}, may be missing: \
         the built-in defaults are then used)",
        path.display(),
        crate::config::DEFAULT_CONFIG_PATH
    )]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// The file could not be opened or read.
    #[error("{}: cannot read the config file: {source}", path.display())]
    Io {
        /// The config file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is larger than [`crate::config::MAX_CONFIG_BYTES`].
    #[error(
        "{origin}: the config is larger than {limit} bytes; a config this size is a mistake, check the file"
    )]
    TooLarge {
        /// The config file (or other origin).
        origin: String,
        /// The limit in bytes.
        limit: usize,
    },
    /// The text is not valid YAML, has an unknown field, a wrong type, or breaks a parser budget.
    #[error("{}: {message}", At(origin, position))]
    Syntax {
        /// The config file (or other origin).
        origin: String,
        /// Where, when the parser knows.
        position: Option<Position>,
        /// One sentence saying what is wrong.
        message: String,
    },
    /// The YAML parsed but a value is not acceptable.
    #[error("{}: {field}: {message}", At(origin, position))]
    Invalid {
        /// The config file (or other origin).
        origin: String,
        /// Path of the offending field, e.g. `pools[1].family.replicas`.
        field: String,
        /// Where the offending value (or its nearest written parent) is.
        position: Option<Position>,
        /// One sentence saying what is wrong and what is accepted.
        message: String,
    },
}

impl ConfigError {
    /// The position of the problem in the file, if known.
    pub fn position(&self) -> Option<Position> {
        match self {
            ConfigError::Syntax { position, .. } | ConfigError::Invalid { position, .. } => {
                *position
            }
            _ => None,
        }
    }
}

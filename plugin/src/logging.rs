//! The binary's one logging set-up: level and format from the config, `RUST_LOG` and `--log`
//! over it, colour only on a terminal, and lines journald takes as they are.
//!
//! - **Filter**: `--log` (or `NRI_ACCEL_LOG`), else `RUST_LOG`, else the config's `log.level`
//!   for `run` and `warn` for the one-shot commands. Unless the filter came from `--log` or
//!   `RUST_LOG`, the ttrpc library is silenced: its own error lines are Rust Debug forms, and every
//!   failure it reports reaches nri-accel as an error that is logged or printed in our words.
//! - **Format**: text, or one JSON object per line (`log.format: json`, `run` only) with
//!   `timestamp`, `level`, `message` and the event's fields at the top level.
//! - **Colour**: ANSI escapes only when stderr is a terminal and `NO_COLOR` is unset.
//! - **journald**: when stderr is the journal (systemd sets `JOURNAL_STREAM` to its device and
//!   inode), each line starts with the syslog priority (`<4>` for a warning), which journald turns
//!   into the entry's PRIORITY and strips from the message, and text lines carry no timestamp of
//!   their own (the journal stamps each entry). A JSON line stays pure JSON in the journal.
//! - **Words, not numbers**: the `(os error N)` that Rust's I/O errors append is taken out of
//!   every line ([`without_os_error_codes`]): each message already names what failed in words.

use std::io::IsTerminal;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, format};
use tracing_subscriber::registry::LookupSpan;

use crate::config::{LogConfig, LogFormat};

/// Added to a filter that the operator did not write: the ttrpc crate's own lines.
const QUIET_LIBRARIES: &str = "ttrpc=off";

/// How the process logs, decided before the subscriber is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// `tracing` env-filter directives.
    pub filter: String,
    /// Text or JSON lines.
    pub format: LogFormat,
    /// Whether ANSI colour escapes are written.
    pub ansi: bool,
    /// Whether stderr is the systemd journal.
    pub journal: bool,
}

impl LogSettings {
    /// The settings for a command: `cli_log` is `--log`, `config` the config's `log` section
    /// (`None` for the one-shot commands, which log warnings and errors as text).
    pub fn decide(cli_log: Option<&str>, config: Option<&LogConfig>) -> LogSettings {
        let rust_log = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
        let filter = match (cli_log, rust_log) {
            (Some(given), _) => given.to_string(),
            (None, Some(env)) => env,
            (None, None) => {
                let level = config.map_or("warn", |c| c.level.as_str());
                format!("{level},{QUIET_LIBRARIES}")
            }
        };
        let journal = stderr_is_journal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        LogSettings {
            filter,
            format: config.map_or(LogFormat::Text, |c| c.format),
            ansi: !journal && !no_color && std::io::stderr().is_terminal(),
            journal,
        }
    }

    /// Installs the subscriber for the whole process (once; later calls do nothing). A filter
    /// that does not parse falls back to `warn` and says so.
    pub fn install(&self) {
        let (filter, bad) = match EnvFilter::try_new(&self.filter) {
            Ok(f) => (f, None),
            Err(e) => (EnvFilter::new("warn"), Some(e)),
        };
        let journal = self.journal;
        let installed = match self.format {
            LogFormat::Json => tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(|| PlainStderr)
                .with_ansi(false)
                .fmt_fields(format::JsonFields::new())
                .event_format(Prefixed {
                    journal,
                    inner: format()
                        .json()
                        .flatten_event(true)
                        .with_current_span(false)
                        .with_span_list(false)
                        .with_target(false),
                })
                .try_init(),
            LogFormat::Text if journal => tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(|| PlainStderr)
                .with_ansi(false)
                .event_format(Prefixed {
                    journal,
                    inner: format().without_time().with_target(false).with_ansi(false),
                })
                .try_init(),
            LogFormat::Text => tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(|| PlainStderr)
                .with_ansi(self.ansi)
                .with_target(false)
                .try_init(),
        };
        if installed.is_ok()
            && let Some(e) = bad
        {
            tracing::warn!(
                "the log filter {:?} does not parse ({e}); logging warnings and errors only. \
                 Write it as tracing's env-filter directives, e.g. info or nri_accel=debug",
                self.filter
            );
        }
    }
}

/// Whether stderr is the journal stream systemd connected (`JOURNAL_STREAM=<dev>:<inode>` naming
/// the same file as fd 2), as systemd's documentation says to detect it.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The syslog priority of a level, as sd-daemon(3) prefixes spell it.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// An event format that puts the syslog priority prefix before each line for the journal.
struct Prefixed<F> {
    journal: bool,
    inner: F,
}

impl<S, N, F> FormatEvent<S, N> for Prefixed<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        if self.journal {
            write!(writer, "<{}>", priority(event.metadata().level()))?;
        }
        self.inner.format_event(ctx, writer, event)
    }
}

/// `text` without the ` (os error N)` suffixes that Rust's I/O errors add to their words
/// (`Permission denied (os error 13)` becomes `Permission denied`): the number means nothing to
/// an operator, and every message of ours says what failed and what to do.
pub fn without_os_error_codes(text: &str) -> String {
    const MARK: &str = " (os error ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && after[digits..].starts_with(')') {
            out.push_str(&rest[..at]);
            rest = &after[digits + 1..];
        } else {
            out.push_str(&rest[..at + MARK.len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Standard error, each formatted log line written with [`without_os_error_codes`] applied
/// (tracing's formatter hands over one whole event per write).
struct PlainStderr;

impl std::io::Write for PlainStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        match std::str::from_utf8(buf) {
            Ok(text) if text.contains(" (os error ") => {
                err.write_all(without_os_error_codes(text).as_bytes())?;
            }
            _ => err.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::without_os_error_codes;

    #[test]
    fn os_error_codes_are_taken_out_and_nothing_else() {
        assert_eq!(
            without_os_error_codes("cannot open /x: Permission denied (os error 13); fix it"),
            "cannot open /x: Permission denied; fix it"
        );
        assert_eq!(
            without_os_error_codes("a (os error 2) and b (os error 110)"),
            "a and b"
        );
        for kept in [
            "no error here",
            "a (os error x)",
            "a (os error 12",
            "(os error 5)",
        ] {
            assert_eq!(without_os_error_codes(kept), kept);
        }
    }
}

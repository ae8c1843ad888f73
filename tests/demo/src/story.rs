//! How the demo tells its story: numbered steps, and the daemon's log kept out of the way.
//!
//! Several steps make the daemon refuse or fail on purpose (an Allocate of a held GPU, an early
//! prepare, an injected crash). On a node those are warnings in the log; in the demo the step
//! itself shows the refusal and says why it is right, so the same sentence as a bare `WARN` line
//! on the terminal would only look like something went wrong. Unless the user asked for a log
//! filter (`--log` or `RUST_LOG`, which then go to stderr as usual), the demo keeps the log in
//! memory: each line a step announced with [`Story::expect_log`] is dropped, and every other
//! line is printed inside the story, under the step during which it came, marked `log:`. A
//! healthy run prints none.

use std::io;
use std::sync::{Arc, Mutex, OnceLock};

/// The log lines written so far and not yet shown.
static CAPTURED: OnceLock<Captured> = OnceLock::new();

/// Warnings and errors of nri-accel; the simulated peers' own complaints (a simulated kubelet
/// that cannot reach a plugin the demo just stopped) are about the simulation, not the product.
const FILTER: &str = "warn,kube_sim=error,fake_runtime=error,ttrpc=off";

/// Log text kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// The complete lines written since the last call.
    fn take_lines(&self) -> Vec<String> {
        let mut buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        let done: Vec<u8> = buf.drain(..=end).collect();
        String::from_utf8_lossy(&done)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl io::Write for Captured {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Installs the process's log subscriber for the demo: warnings and errors as plain text lines
/// kept for the story instead of written to stderr.
pub fn capture_log() {
    let captured = CAPTURED.get_or_init(Captured::default).clone();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(FILTER))
        .with_writer(move || captured.clone())
        .without_time()
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

/// The steps printed so far and the log lines they expect.
pub(crate) struct Story {
    /// The log kept for the story; `None` when the log goes to stderr.
    log: Option<Captured>,
    /// Each entry: words that together mark one expected log line; removed once seen.
    expected: Vec<Vec<String>>,
}

impl Story {
    /// A story showing the log [`capture_log`] keeps, if it was installed.
    pub(crate) fn new() -> Story {
        Story {
            log: CAPTURED.get().cloned(),
            expected: Vec::new(),
        }
    }

    /// Shows the log lines that came since the last step, then starts step `n`.
    pub(crate) fn step(&mut self, n: u32, title: &str) {
        self.show_log();
        println!("\n── {n}. {title}");
    }

    /// Marks one coming log line, the one containing every word of `words`, as part of the
    /// story (the step shows what it says): it is not printed.
    pub(crate) fn expect_log(&mut self, words: &[&str]) {
        self.expected
            .push(words.iter().map(|w| (*w).to_string()).collect());
    }

    /// Prints the log lines that came and were not expected, marked `log:`.
    pub(crate) fn show_log(&mut self) {
        for line in self.unexpected_lines() {
            println!("   log: {line}");
        }
    }

    /// The log lines that came since the last call, less the expected ones.
    fn unexpected_lines(&mut self) -> Vec<String> {
        let Some(log) = &self.log else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for line in log.take_lines() {
            let matched = self
                .expected
                .iter()
                .position(|words| words.iter().all(|w| line.contains(w.as_str())));
            match matched {
                Some(i) => {
                    self.expected.remove(i);
                }
                None => out.push(line.trim_start().to_string()),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn only_complete_lines_are_taken() {
        let mut c = Captured::default();
        c.write_all(b"one\ntw").unwrap();
        assert_eq!(c.take_lines(), ["one"]);
        c.write_all(b"o\n").unwrap();
        assert_eq!(c.take_lines(), ["two"]);
        assert!(c.take_lines().is_empty());
    }

    #[test]
    fn an_expected_line_is_dropped_once_and_every_other_line_is_shown() {
        let mut log = Captured::default();
        let mut story = Story {
            log: Some(log.clone()),
            expected: Vec::new(),
        };
        story.expect_log(&["claim not prepared", "claim=claim-next"]);
        log.write_all(
            b" WARN claim not prepared claim=claim-next error=held
",
        )
        .unwrap();
        log.write_all(
            b" WARN claim not prepared claim=claim-next error=again
",
        )
        .unwrap();
        log.write_all(
            b"ERROR something else
",
        )
        .unwrap();
        assert_eq!(
            story.unexpected_lines(),
            [
                "WARN claim not prepared claim=claim-next error=again",
                "ERROR something else"
            ]
        );
        assert!(story.unexpected_lines().is_empty());
    }
}

//! What the daemon's log looks like where it goes: the config's `log.level` and `log.format`,
//! `RUST_LOG` and `--log` over them, colour only on a terminal (a pty here), JSON lines that parse
//! as they are, journald's priority prefixes, and a clean stop that warns about nothing. Also:
//! the CLI prints nothing but its answer on a successful call.

mod e2e_common;

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::process::Stdio;

use e2e_common::*;
use serde_json::Value;

const ESC: char = '\u{1b}';

/// A node with two GPUs whose config sets `log`.
fn node(log: &str) -> TestNode {
    TestNode::new(
        Shape {
            exclusive: 2,
            shared: 0,
            sliced: 0,
            cpus_per_device: 0,
        },
        log,
    )
}

/// Starts the daemon with the config's own log settings (no `--log`, no `RUST_LOG`) and `env`;
/// stderr goes to a pty when `tty`. Waits for the gate, stops it with SIGTERM and answers
/// everything it wrote to stderr.
async fn run_and_stop(node: &TestNode, env: &[(&str, &str)], tty: bool) -> String {
    let (mut cmd, log) = node.run_command();
    cmd.env_remove("NRI_ACCEL_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let reader = if tty {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        cmd.stderr(Stdio::from(pty.slave));
        let mut master = std::fs::File::from(pty.master);
        Some(std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            // Read until the last writer (the daemon) is gone: EIO on a pty master.
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&out).into_owned()
        }))
    } else {
        None
    };
    let fake = runtime(node).await;
    let mut daemon = DaemonProc::spawn(cmd, log);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    assert!(daemon.terminate().await.success(), "{}", daemon.log_text());
    match reader {
        Some(r) => r.join().expect("pty reader"),
        None => daemon.log_text(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_have_colour_on_a_terminal_only_and_a_clean_stop_warns_about_nothing() {
    let node = node("log:\n  level: info\n  format: text\n");
    let piped = run_and_stop(&node, &[], false).await;
    assert!(!piped.contains(ESC), "escape codes in a pipe:\n{piped}");
    assert!(piped.contains(" INFO "), "{piped}");
    assert!(
        piped.contains("runtime synchronized: the gate is open, claims are served"),
        "{piped}"
    );
    // A clean stop: said once, and nothing about a lost connection or anything else going wrong.
    assert!(piped.contains("INFO stopping"), "{piped}");
    assert!(
        !piped.contains("WARN") && !piped.contains("ERROR"),
        "{piped}"
    );
    assert!(!piped.contains("reconnecting"), "{piped}");
    assert_eq!(
        piped
            .matches("capabilities dropped to the keep-list")
            .count(),
        1,
        "{piped}"
    );

    let on_tty = run_and_stop(&node, &[], true).await;
    assert!(
        on_tty.contains(&format!("{ESC}[")),
        "no colour on a tty:\n{on_tty}"
    );
    assert!(on_tty.contains("claims are served"), "{on_tty}");
    // NO_COLOR wins over the terminal.
    let no_color = run_and_stop(&node, &[("NO_COLOR", "1")], true).await;
    assert!(!no_color.contains(ESC), "{no_color}");
}

/// Every line is one JSON object with a level and a message; no escapes, pipe or terminal.
fn assert_json_lines(text: &str) -> Vec<Value> {
    assert!(!text.contains(ESC), "escape codes in JSON logs:\n{text}");
    let lines: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l.trim_end_matches('\r')).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .collect();
    assert!(!lines.is_empty());
    for v in &lines {
        assert!(v["level"].is_string() && v["message"].is_string(), "{v}");
        assert!(v["timestamp"].is_string(), "{v}");
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_in_a_pipe_and_on_a_terminal() {
    let node = node("log:\n  level: info\n  format: json\n");
    for tty in [false, true] {
        let text = run_and_stop(&node, &[], tty).await;
        let lines = assert_json_lines(&text);
        let ready = lines
            .iter()
            .find(|v| v["message"] == "runtime synchronized: the gate is open, claims are served")
            .unwrap_or_else(|| panic!("no gate line:\n{text}"));
        assert_eq!(ready["level"], "INFO");
        // The event's fields sit beside the message, as a log shipper indexes them.
        let inventory = lines
            .iter()
            .find(|v| v["message"] == "inventory")
            .unwrap_or_else(|| panic!("no inventory line:\n{text}"));
        assert_eq!(inventory["devices"], 2, "{inventory}");
        assert_eq!(inventory["cpus"], "0-15", "{inventory}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_level_holds_unless_rust_log_or_log_say_otherwise() {
    let node = node("log:\n  level: warn\n");
    let quiet = run_and_stop(&node, &[], false).await;
    assert!(!quiet.contains("INFO"), "level warn printed info:\n{quiet}");
    let env = run_and_stop(&node, &[("RUST_LOG", "info")], false).await;
    assert!(env.contains("INFO"), "RUST_LOG=info was ignored:\n{env}");
    // --log (here through NRI_ACCEL_LOG, its environment form) wins over RUST_LOG.
    let flag = run_and_stop(
        &node,
        &[("RUST_LOG", "error"), ("NRI_ACCEL_LOG", "info")],
        false,
    )
    .await;
    assert!(flag.contains("INFO"), "--log was ignored:\n{flag}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_journald_lines_carry_the_syslog_priority_and_no_timestamp_of_their_own() {
    for format in ["text", "json"] {
        let node = node(&format!("log:\n  level: info\n  format: {format}\n"));
        let (mut cmd, log) = node.run_command();
        cmd.env_remove("NRI_ACCEL_LOG");
        // systemd sets JOURNAL_STREAM to the device and inode of the stream it gives as stderr.
        let meta = std::fs::metadata(&log).expect("log file");
        cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        let fake = runtime(&node).await;
        let mut daemon = DaemonProc::spawn(cmd, log);
        fake.wait_synchronized(1, WAIT).await.expect("synchronized");
        node.client_gate_open().await;
        assert!(daemon.terminate().await.success());
        let text = daemon.log_text();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (prio, rest) = line.split_at(3);
            assert!(
                ["<3>", "<4>", "<6>", "<7>"].contains(&prio),
                "{format}: no priority prefix: {line}"
            );
            if format == "json" {
                let v: Value = serde_json::from_str(rest).expect("pure JSON after the prefix");
                assert!(v["message"].is_string(), "{v}");
            } else {
                assert!(
                    rest.starts_with(" INFO ")
                        || rest.starts_with(" WARN ")
                        || rest.starts_with("ERROR "),
                    "{format}: a text line starts with its level, no timestamp: {line}"
                );
            }
        }
        assert!(text.contains("<6>"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successful_cli_calls_print_their_answer_and_nothing_else() {
    let node = node("");
    let fake = runtime(&node).await;
    let _daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;
    // The client's library used to log "Write task err" or "Broken pipe" on about 1 call in 80
    // that succeeded, as the process exited under its connection tasks.
    for i in 0..40 {
        let uid = format!("quiet-{i}");
        for args in [
            vec!["prepare", uid.as_str()],
            vec!["status"],
            vec!["unprepare", uid.as_str()],
        ] {
            let (st, out, err) = node.cli(&args).await;
            assert!(st.success(), "{args:?}: {out}{err}");
            assert!(!out.is_empty(), "{args:?}");
            assert!(err.is_empty(), "{args:?} printed to stderr: {err}");
        }
    }
}

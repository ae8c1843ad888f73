//! Every message the binary prints for the cases operators reported (docs/messages.md), read
//! from its stdout, stderr and log, with two checks: each says what it must (the claim, device,
//! file or field, and what to do), and none carries a Rust Debug form (`Some(`, `Ok(`, `Err(`,
//! `{ `, a protobuf `special_fields`).

mod e2e_common;

use std::io::Write;

use e2e_common::*;

/// Text that only a Rust Debug form puts in a message, and the errno suffix of Rust's I/O errors
/// (`(os error 2)`), which the binary takes out of what it prints (issue 39 item 8).
const DEBUG_FORMS: [&str; 6] = ["Some(", "Ok(", "Err(", "{ ", "special_fields", "(os error "];

/// What the binary printed for each case, by name.
#[derive(Default)]
struct Seen(Vec<(String, String)>);

impl Seen {
    fn add(&mut self, case: &str, text: String) -> String {
        self.0.push((case.to_string(), text.clone()));
        text
    }

    fn assert_no_debug_forms(&self) {
        let mut bad = Vec::new();
        for (case, text) in &self.0 {
            for form in DEBUG_FORMS {
                for line in text.lines().filter(|l| l.contains(form)) {
                    bad.push(format!("{case}: {form:?} in: {line}"));
                }
            }
        }
        assert!(
            bad.is_empty(),
            "Debug forms in operator-facing text:\n{}",
            bad.join("\n")
        );
    }
}

/// Exclusive and shared pools, no sliced one.
fn node() -> TestNode {
    TestNode::new(
        Shape {
            exclusive: 2,
            shared: 1,
            sliced: 0,
            cpus_per_device: 0,
        },
        "",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_say_what_happened_and_carry_no_debug_forms() {
    let mut seen = Seen::default();
    let node = node();

    // No daemon: one hint, naming the socket.
    let (st, out, err) = node.cli(&["status"]).await;
    assert!(!st.success());
    let text = seen.add("status without a daemon", out + &err);
    assert!(
        text.contains(&node.claims_socket.display().to_string()),
        "{text}"
    );
    assert_eq!(text.matches("start nri-accel").count(), 1, "{text}");
    let (_, out, err) = node.cli(&["prepare", "c0"]).await;
    seen.add("prepare without a daemon", out + &err);
    // A count of 0 is refused by the command line itself, before it looks for a daemon
    // (issue 39 item 8): the words are about the count, not the socket.
    let (st, out, err) = node.cli(&["prepare", "c0", "--count", "0"]).await;
    assert_eq!(st.code(), Some(2), "{out}{err}");
    let text = seen.add("prepare --count 0", out + &err);
    assert!(text.contains("--count"), "{text}");
    assert!(text.contains("1..="), "{text}");
    assert!(
        !text.contains(&node.claims_socket.display().to_string()),
        "{text}"
    );

    let (_, out, err) = node.cli(&["check-config", "--strict"]).await;
    seen.add("check-config", out + &err);
    let (_, out, err) = node.cli(&["discover"]).await;
    seen.add("discover", out + &err);

    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    node.client_gate_open().await;

    // The name `status` shows for a held device, and the published name, both work as --device.
    let (st, out, err) = node.cli(&["prepare", "c1", "--device", "whole-gpu1"]).await;
    assert!(st.success(), "{out}{err}");
    assert!(out.starts_with("whole whole-gpu1 "), "{out}");
    seen.add("prepare by published name", out + &err);
    let (_, table, err) = node.cli(&["status"]).await;
    seen.add("status", table.clone() + &err);
    let line = table
        .lines()
        .find(|l| l.starts_with("c1 "))
        .expect("c1 in status");
    assert!(line.contains("whole/gpu1"), "{table}");
    let (_, _, _) = node.cli(&["unprepare", "c1"]).await;
    let (st, out, err) = node.cli(&["prepare", "c1", "--device", "whole/gpu1"]).await;
    assert!(st.success(), "{out}{err}");

    // A sliced request on a node without a sliced pool names the family, not some other pool,
    // and the request by what was asked.
    let (st, out, err) = node
        .cli(&["prepare", "c2", "--family", "sliced", "--profile", "1g"])
        .await;
    assert_eq!(st.code(), Some(1));
    let text = seen.add("sliced without a sliced pool", out + &err);
    assert_eq!(
        text.trim(),
        "claim c2 refused: no pool of family sliced has devices matching request \
         count=1,family=sliced,profile=1g"
    );
    let (_, out, err) = node.cli(&["prepare", "c3", "--count", "9"]).await;
    let text = seen.add("too many", out + &err);
    assert!(text.contains("claim c3 refused"), "{text}");
    assert!(!text.contains("request cli"), "{text}");

    // Releasing a claim the node does not hold says so.
    let (st, out, err) = node.cli(&["unprepare", "nosuch"]).await;
    assert!(st.success());
    let text = seen.add("unprepare unknown", out + &err);
    assert_eq!(
        text.trim(),
        "claim nosuch is not prepared on this node: nothing to release"
    );
    let (_, out, err) = node.cli(&["unprepare", "c1"]).await;
    assert_eq!(out.trim(), "claim c1 released", "{err}");

    let (_, out, err) = node.cli(&["reconcile", "--dry-run"]).await;
    seen.add("reconcile --dry-run", out + &err);
    assert!(daemon.terminate().await.success());
    seen.add("daemon log", daemon.log_text());

    // Garbage appended to the checkpoint log: the file and what is wrong, not "entries follow".
    let wal = node.state_dir.join("checkpoint").join("wal");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&wal)
        .expect("wal")
        .write_all(&[0xa5; 40])
        .expect("append");
    let mut broken = node.spawn(&[]);
    assert!(!broken.wait_exit().await.success());
    let text = seen.add("garbage after the log", broken.log_text());
    assert!(text.contains(&wal.display().to_string()), "{text}");
    assert!(
        text.contains("the 40 bytes from here to the end are not an entry"),
        "{text}"
    );
    assert!(!text.contains("entries follow"), "{text}");

    // A damaged version byte is damage, not "format version 0".
    let mut bytes = std::fs::read(&wal).expect("wal");
    bytes.truncate(bytes.len() - 40);
    bytes[8] = 0;
    std::fs::write(&wal, &bytes).expect("write");
    let mut broken = node.spawn(&[]);
    assert!(!broken.wait_exit().await.success());
    let text = seen.add("damaged version", broken.log_text());
    assert!(text.contains("the header is damaged"), "{text}");
    assert!(!text.contains("format version 0"), "{text}");

    // The shipped binary has no demo and says where it is (the demo build's own words are
    // checked in tests/demo/tests/demo.rs).
    let (st, out, err) = run_bin(&["demo".to_string()]).await;
    assert_eq!(st.code(), Some(2), "{out}{err}");
    seen.add("demo", out + &err);

    seen.assert_no_debug_forms();
}

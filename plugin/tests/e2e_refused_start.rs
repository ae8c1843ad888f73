//! A refused start changes nothing on disk (issue 27, item 8): with the checkpoint removed
//! while specs remain, the daemon refuses to start, and the state, CDI and socket dirs are left
//! byte-identical, modification times included: no empty `checkpoint/` left behind, no
//! preflight probe files.

mod e2e_common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use e2e_common::*;
use nri_accel::claims_api::Family;

/// Every entry under `roots` (the roots included) with its kind, mode, size, modification time
/// (to the nanosecond) and bytes.
fn tree(roots: &[&Path]) -> BTreeMap<PathBuf, (u32, u64, i64, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<PathBuf> = roots.iter().map(|r| r.to_path_buf()).collect();
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let bytes = if m.is_file() {
            std::fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        if m.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        out.insert(p, (m.mode(), m.size(), m.mtime(), m.mtime_nsec(), bytes));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_a_lost_checkpoint_leaves_the_tree_byte_identical() {
    let node = TestNode::new(Shape::default(), "");
    let fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    fake.wait_synchronized(1, WAIT).await.expect("synchronized");
    let client = node.client_gate_open().await;
    for uid in ["kept-1", "kept-2"] {
        prepare_ok(&client, count_claim(uid, Family::Exclusive, None)).await;
    }
    daemon.terminate().await;
    drop(fake);
    std::fs::remove_dir_all(node.state_dir.join("checkpoint")).unwrap();
    let socket_dir = node.claims_socket.parent().unwrap().to_owned();
    let roots = [
        node.state_dir.as_path(),
        node.cdi_dir.as_path(),
        socket_dir.as_path(),
    ];
    let before = tree(&roots);
    // A change within the same clock tick would not show in the times.
    std::thread::sleep(std::time::Duration::from_millis(20));

    let _fake = runtime(&node).await;
    let mut daemon = node.spawn(&[]);
    let st = daemon.wait_exit().await;
    assert!(!st.success());
    let log = daemon.log_text();
    assert!(log.contains("refusing to start"), "{log}");
    assert!(log.contains("kept-1") && log.contains("kept-2"), "{log}");
    let after = tree(&roots);
    assert!(
        !node.state_dir.join("checkpoint").exists(),
        "no empty checkpoint dir is left"
    );
    for (path, entry) in &before {
        assert_eq!(after.get(path), Some(entry), "{} changed", path.display());
    }
    assert_eq!(after.len(), before.len(), "{:?}", after.keys());
}

//! Property: any sequence of commits, compactions and reopens reads back as
//! the model maps say.

mod checkpoint_common;

use std::collections::BTreeMap;

use checkpoint_common::*;
use nri_accel::checkpoint::Change;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Commit(Vec<Ch>),
    Compact,
    Reopen,
}

fn change() -> impl Strategy<Value = Ch> {
    prop_oneof![
        (0u32..8, 0u32..100).prop_map(|(k, v)| Change::PutRecord(format!("claim-{k}"), rec(v))),
        (0u32..8).prop_map(|k| Change::DeleteRecord(format!("claim-{k}"))),
        (0u32..4, 0u32..100).prop_map(|(k, v)| Change::PutPending(format!("ctr-{k}"), upd(v))),
        (0u32..4).prop_map(|k| Change::DeletePending(format!("ctr-{k}"))),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(change(), 1..5).prop_map(Op::Commit),
        1 => Just(Op::Compact),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn commits_compactions_and_reopens_match_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let tmp = tempfile::tempdir().unwrap();
        // A tiny threshold so commits also compact on their own.
        let (mut cp, _) = open_with(tmp.path(), 512);
        let mut records = BTreeMap::new();
        let mut pending = BTreeMap::new();
        for op in ops {
            match op {
                Op::Commit(changes) => {
                    for c in &changes {
                        match c.clone() {
                            Change::PutRecord(k, v) => { records.insert(k, v); }
                            Change::DeleteRecord(k) => { records.remove(&k); }
                            Change::PutPending(k, v) => { pending.insert(k, v); }
                            Change::DeletePending(k) => { pending.remove(&k); }
                        }
                    }
                    cp.commit(changes).unwrap();
                }
                Op::Compact => cp.compact().unwrap(),
                Op::Reopen => {
                    drop(cp);
                    let (again, report) = open_with(tmp.path(), 512);
                    prop_assert_eq!(report.torn_tail, None);
                    prop_assert_eq!(report.records, records.len());
                    cp = again;
                }
            }
            prop_assert_eq!(&cp.records(), &records);
            prop_assert_eq!(&cp.pending(), &pending);
        }
        drop(cp);
        let (cp, _) = open(tmp.path());
        prop_assert_eq!(cp.records(), records);
        prop_assert_eq!(cp.pending(), pending);
    }
}

//! Shared payloads and helpers of the checkpoint tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use nri_accel::checkpoint::{Change, Checkpoint, CheckpointOptions, OpenReport};
use serde::{Deserialize, Serialize};

/// A record shaped like an allocation: devices and units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rec {
    pub devices: Vec<String>,
    pub units: u32,
}

/// A pending container update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upd {
    pub cpuset: String,
}

pub type Cp = Checkpoint<Rec, Upd>;
pub type Ch = Change<Rec, Upd>;

pub const BOOT: &str = "11111111-2222-3333-4444-555555555555";

pub fn rec(i: u32) -> Rec {
    Rec {
        devices: vec![format!("gpu{i}")],
        units: i,
    }
}

pub fn upd(i: u32) -> Upd {
    Upd {
        cpuset: format!("0-{i}"),
    }
}

pub fn open(dir: &Path) -> (Cp, OpenReport) {
    Cp::open(dir, BOOT).expect("open checkpoint")
}

pub fn open_with(dir: &Path, compact_min_bytes: u64) -> (Cp, OpenReport) {
    Cp::open_with(dir, BOOT, CheckpointOptions { compact_min_bytes }).expect("open checkpoint")
}

/// Bytes of every file in `dir`, by name.
pub fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// Puts records `0..n` (one commit each) and pending updates for even `i`.
pub fn fill(cp: &Cp, n: u32) -> (BTreeMap<String, Rec>, BTreeMap<String, Upd>) {
    let mut records = BTreeMap::new();
    let mut pending = BTreeMap::new();
    for i in 0..n {
        let mut changes = vec![Change::PutRecord(format!("claim-{i}"), rec(i))];
        records.insert(format!("claim-{i}"), rec(i));
        if i % 2 == 0 {
            changes.push(Change::PutPending(format!("ctr-{i}"), upd(i)));
            pending.insert(format!("ctr-{i}"), upd(i));
        }
        cp.commit(changes).unwrap();
    }
    (records, pending)
}

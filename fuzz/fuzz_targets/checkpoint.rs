//! The claim journal on disk: the `snapshot` and `wal` files, then `Checkpoint::open` with the
//! engine's record types. Opening must fail cleanly or yield a state that reopens to the same
//! records and pending updates (a torn tail is cut off once, then stays gone).
//!
//! Input: `[mode][boot][split lo][split hi]` then bytes cut at `split` into a snapshot part and a
//! wal part. Mode bit 0: write a snapshot, bit 1: a wal, bit 2: "framed": each part is a list of
//! entries (`[len u16 LE][payload]`) that the harness wraps in a valid header and valid entry
//! checksums (as the daemon writes them), so the fuzzer reaches the JSON entry decoding and the
//! replay instead of stopping at a CRC; bit 3: chop the last 1..8 bytes of the wal (a torn write).
#![no_main]

use nri_accel::checkpoint::{FORMAT_VERSION, SNAPSHOT_FILE, WAL_FILE};
use nri_accel::engine::Journal;

const SNAPSHOT_MAGIC: &[u8; 8] = b"NRIACSNP";
const WAL_MAGIC: &[u8; 8] = b"NRIACWAL";
const BOOT: &str = "fuzz-boot";

/// A file as the checkpoint writes it: header (magic, version, generation, boot id, CRC) and
/// entries (length, CRC of the length, CRC of the payload, payload).
fn framed(magic: &[u8; 8], generation: u64, boot: &str, mut entries: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(magic);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    out.push(boot.len() as u8);
    out.extend_from_slice(boot.as_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    while entries.len() >= 2 {
        let len = (u16::from_le_bytes([entries[0], entries[1]]) as usize).min(entries.len() - 2);
        let payload = &entries[2..2 + len];
        let len_bytes = (len as u32).to_le_bytes();
        out.extend_from_slice(&len_bytes);
        out.extend_from_slice(&crc32fast::hash(&len_bytes).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.extend_from_slice(payload);
        entries = &entries[2 + len..];
    }
    out
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (mode, boot_sel) = (data[0], data[1]);
    let rest = &data[4..];
    let split = (u16::from_le_bytes([data[2], data[3]]) as usize).min(rest.len());
    let (snap, wal) = rest.split_at(split);
    let file_boot = if boot_sel & 1 == 0 {
        BOOT
    } else {
        "earlier-boot"
    };
    let (snap, mut wal) = if mode & 4 != 0 {
        let snap_gen = u64::from(boot_sel >> 4);
        let wal_gen = u64::from((boot_sel >> 1) & 7);
        (
            framed(SNAPSHOT_MAGIC, snap_gen, file_boot, snap),
            framed(WAL_MAGIC, wal_gen, file_boot, wal),
        )
    } else {
        (snap.to_vec(), wal.to_vec())
    };
    if mode & 8 != 0 {
        let chop = usize::from(mode >> 4).min(7) + 1;
        wal.truncate(wal.len().saturating_sub(chop));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    if mode & 1 != 0 {
        std::fs::write(dir.path().join(SNAPSHOT_FILE), &snap).expect("write snapshot");
    }
    if mode & 2 != 0 {
        std::fs::write(dir.path().join(WAL_FILE), &wal).expect("write wal");
    }
    let first = match Journal::open(dir.path(), BOOT) {
        Ok((j, _)) => (j.records(), j.pending()),
        Err(_) => return,
    };
    // What open kept (after repairing a torn tail) must read back the same.
    let (again, _) = Journal::open(dir.path(), BOOT).expect("reopen a checkpoint that opened");
    assert_eq!(first.0, again.records());
    assert_eq!(first.1, again.pending());
});

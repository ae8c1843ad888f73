//! Durable spec writes against the fsync floor, and listing a directory of 10,000 specs.
//!
//! Run: `cargo bench -p nri-accel-cdi --bench spec_store -- --warm-up-time 1 --measurement-time 3`
//! The p50 of each benchmark is the `median` in `target/criterion/<group>/<name>/new/estimates.json`.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::FileExt;

use cdi::{DeviceEdits, DeviceKind, DeviceNode, Mount, SpecFormat, SpecStore, StoreConfig};
use criterion::{Criterion, criterion_group, criterion_main};

const UID: &str = "0b7a1c2e-9f3d-4b1a-8c6e-2d4f6a8b0c1d";

fn gpu() -> DeviceEdits {
    DeviceEdits {
        env: vec![("ACCEL_VISIBLE_DEVICES".into(), "0".into())],
        device_nodes: vec![DeviceNode {
            path: "/dev/accel0".into(),
            kind: Some(DeviceKind::Char),
            major: Some(240),
            minor: Some(0),
            permissions: Some("rw".into()),
            ..Default::default()
        }],
        mounts: vec![Mount {
            host_path: "/usr/lib/accel".into(),
            container_path: "/usr/lib/accel".into(),
            options: vec!["ro".into(), "bind".into()],
            kind: None,
        }],
        hooks: vec![],
    }
}

fn bench_dir() -> tempfile::TempDir {
    // Same file system as the build tree (not tmpfs), so fsync does real work.
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench dir")
}

fn open(dir: &std::path::Path, format: SpecFormat) -> SpecStore {
    SpecStore::open(StoreConfig {
        format,
        ..StoreConfig::new(dir)
    })
    .expect("open store")
}

fn durable(c: &mut Criterion) {
    let dir = bench_dir();
    let store = open(dir.path(), SpecFormat::Yaml);
    let results = [gpu()];
    // The same bytes the store writes, for a like-for-like floor.
    store.write(UID, &results).expect("write");
    let payload = std::fs::read(store.spec_path(UID).expect("path")).expect("read");
    store.remove(UID).expect("remove");

    let mut g = c.benchmark_group("cdi_durable");
    // Floor: rewrite the payload in place, fsync the file, fsync its directory.
    let floor_path = dir.path().join("floor.bin");
    let floor = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&floor_path)
        .expect("floor file");
    g.bench_function("floor_fsync_file_and_dir", |b| {
        b.iter(|| {
            floor.write_all_at(&payload, 0).expect("pwrite");
            floor.sync_all().expect("fsync file");
            File::open(dir.path())
                .and_then(|d| d.sync_all())
                .expect("fsync dir");
        })
    });
    // Floor for a create + remove: new file, write, fsync, dir fsync, unlink, dir fsync.
    g.bench_function("floor_create_unlink_fsync", |b| {
        let p = dir.path().join("floor-new.bin");
        b.iter(|| {
            let mut f = File::create(&p).expect("create");
            f.write_all(&payload).expect("write");
            f.sync_all().expect("fsync file");
            File::open(dir.path())
                .and_then(|d| d.sync_all())
                .expect("fsync dir");
            std::fs::remove_file(&p).expect("unlink");
            File::open(dir.path())
                .and_then(|d| d.sync_all())
                .expect("fsync dir");
        })
    });
    g.bench_function("write", |b| {
        b.iter(|| black_box(store.write(UID, &results).expect("write")))
    });
    g.bench_function("write_remove", |b| {
        b.iter(|| {
            black_box(store.write(UID, &results).expect("write"));
            store.remove(UID).expect("remove");
        })
    });
    g.finish();
    std::fs::remove_file(floor_path).ok();
}

fn listing(c: &mut Criterion) {
    let dir = bench_dir();
    let store = open(dir.path(), SpecFormat::Yaml);
    let results = [gpu()];
    // Fill with 10,000 specs: one durable write for the bytes, then plain copies (the
    // listing cost does not depend on how the files got there).
    store.write(UID, &results).expect("write");
    let bytes = std::fs::read(store.spec_path(UID).expect("path")).expect("read");
    for i in 1..10_000 {
        let uid = format!("{i:08x}-0000-4000-8000-000000000000");
        std::fs::write(store.spec_path(&uid).expect("path"), &bytes).expect("fill");
    }
    // Some foreign files the listing must skip.
    for i in 0..100 {
        std::fs::write(dir.path().join(format!("nvidia.com-gpu_{i}.yaml")), b"x").expect("fill");
    }
    let mut g = c.benchmark_group("cdi_list");
    g.sample_size(20);
    g.bench_function("list_10000", |b| {
        b.iter(|| {
            let uids = store.list().expect("list");
            assert_eq!(uids.len(), 10_000);
            black_box(uids)
        })
    });
    g.finish();
}

criterion_group!(benches, durable, listing);
criterion_main!(benches);

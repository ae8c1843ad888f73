//! CDI specs read back from the CDI directory: arbitrary file content under the store's own file
//! name (YAML and JSON), then `SpecStore::read` and `SpecStore::list`.
#![no_main]

use cdi::{SpecFormat, SpecStore, StoreConfig};

const UID: &str = "0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6";

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, content)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = StoreConfig::new(dir.path());
    // The first byte picks the format the store writes (the other is read as a fallback) and the
    // file's extension.
    cfg.format = if sel & 1 == 0 {
        SpecFormat::Yaml
    } else {
        SpecFormat::Json
    };
    let store = SpecStore::open(cfg).expect("open store");
    let ext = if sel & 2 == 0 { "yaml" } else { "json" };
    let path = dir.path().join(format!("accel.nri.io-device_{UID}.{ext}"));
    std::fs::write(&path, content).expect("write spec");
    if let Ok(Some(spec)) = store.read(UID) {
        assert_eq!(spec.kind, "accel.nri.io/device");
    }
    let _ = store.list();
});

//! The store's contract: naming, mode, idempotence, other vendors' files, refusals before any
//! file-system change, bounded reads and errors on unreadable directories.

mod common;

use std::os::unix::fs::PermissionsExt;

use cdi::{CdiError, DeviceEdits, SpecFormat, SpecStore, StoreConfig};
use common::*;

const UID: &str = "9d2f4b6a-1c3e-4f5a-9b7c-8d6e4f2a0b1c";

#[test]
fn names_kind_and_device_ids() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), SpecFormat::Yaml);
    assert_eq!(s.kind(), "accel.nri.io/device");
    assert_eq!(
        s.device_ids(UID, 2).unwrap(),
        [
            format!("accel.nri.io/device=claim-{UID}-0"),
            format!("accel.nri.io/device=claim-{UID}-1")
        ]
    );
    let ids = s.write(UID, &[gpu(0), gpu(1)]).unwrap();
    assert_eq!(ids, s.device_ids(UID, 2).unwrap());
    assert_eq!(
        entries(dir.path()),
        [format!("accel.nri.io-device_{UID}.yaml")]
    );
    let j = store(dir.path(), SpecFormat::Json);
    assert_eq!(
        j.spec_path(UID).unwrap(),
        dir.path().join(format!("accel.nri.io-device_{UID}.json"))
    );
}

#[test]
fn open_refuses_bad_vendor_or_class_and_creates_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    for (vendor, class) in [
        ("1bad", "device"),
        ("ok.io", "dev.ice"),
        ("ok.io", "a/b"),
        ("", "x"),
    ] {
        let err = SpecStore::open(StoreConfig {
            vendor: vendor.into(),
            class: class.into(),
            ..StoreConfig::new(dir.path())
        })
        .unwrap_err();
        assert!(matches!(err, CdiError::InvalidKind { .. }), "{err}");
    }
    let nested = dir.path().join("var/run/cdi");
    let s = store(&nested, SpecFormat::Yaml);
    assert!(nested.is_dir());
    assert!(s.list().unwrap().is_empty());
}

#[test]
fn specs_are_mode_0644_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), SpecFormat::Yaml);
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let r = s.write(UID, &[gpu(0)]);
    nix::sys::stat::umask(old);
    r.unwrap();
    let mode = std::fs::metadata(s.spec_path(UID).unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o644);
}

#[test]
fn writes_are_idempotent_and_removes_of_missing_specs_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), SpecFormat::Yaml);
    let a = s.write(UID, &[gpu(0)]).unwrap();
    let first = std::fs::read(s.spec_path(UID).unwrap()).unwrap();
    let b = s.write(UID, &[gpu(0)]).unwrap();
    assert_eq!(a, b);
    assert_eq!(std::fs::read(s.spec_path(UID).unwrap()).unwrap(), first);
    assert_eq!(s.list().unwrap(), [UID]);
    assert!(s.exists(UID).unwrap());
    s.remove(UID).unwrap();
    assert!(!s.exists(UID).unwrap());
    s.remove(UID).unwrap();
    s.remove("never-written").unwrap();
    assert!(entries(dir.path()).is_empty());
    assert_eq!(s.read(UID).unwrap(), None);
}

#[test]
fn rewriting_in_the_other_format_leaves_one_spec() {
    let dir = tempfile::tempdir().unwrap();
    store(dir.path(), SpecFormat::Yaml)
        .write(UID, &[gpu(0)])
        .unwrap();
    let j = store(dir.path(), SpecFormat::Json);
    assert!(j.exists(UID).unwrap(), "a spec in the other format counts");
    assert_eq!(j.read(UID).unwrap().unwrap().devices.len(), 1);
    j.write(UID, &[gpu(0), gpu(1)]).unwrap();
    assert_eq!(
        entries(dir.path()),
        [format!("accel.nri.io-device_{UID}.json")]
    );
    assert_eq!(official_cache_devices(dir.path()).0.len(), 2);
    store(dir.path(), SpecFormat::Yaml).remove(UID).unwrap();
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn other_vendors_files_are_never_touched() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = [
        (
            "nvidia.com-gpu_abc.yaml",
            "cdiVersion: 0.3.0\nkind: nvidia.com/gpu\n",
        ),
        ("accel.nri.io-other_abc.yaml", "not even yaml: [\n"),
        (".nvidia.com-gpu_abc.yaml.1-1.tmp", "half"),
        (".accel.nri.io-devicex_abc.yaml.1-1.tmp", "half"),
        ("accel.nri.io-device_..x.yaml", "our prefix, invalid uid"),
        ("accel.nri.io-device_abc.yml", "wrong extension"),
        ("README", "x"),
    ];
    // Entries with our temp prefix that are not regular files are not ours either.
    std::fs::create_dir(dir.path().join(".accel.nri.io-device_d.yaml.1-1.tmp")).unwrap();
    std::os::unix::fs::symlink(
        "/nonexistent",
        dir.path().join(".accel.nri.io-device_l.yaml.1-1.tmp"),
    )
    .unwrap();
    for (n, c) in foreign {
        std::fs::write(dir.path().join(n), c).unwrap();
    }
    let s = store(dir.path(), SpecFormat::Yaml);
    s.write(UID, &[gpu(0)]).unwrap();
    s.write("abc", &[gpu(1)]).unwrap();
    assert_eq!(s.list().unwrap(), [UID, "abc"]);
    s.remove(UID).unwrap();
    s.remove("abc").unwrap();
    assert_eq!(s.list().unwrap(), Vec::<String>::new());
    for (n, c) in foreign {
        assert_eq!(
            std::fs::read_to_string(dir.path().join(n)).unwrap(),
            c,
            "{n}"
        );
    }
    assert_eq!(entries(dir.path()).len(), foreign.len() + 2);
}

#[test]
fn escaping_uids_are_refused_naming_the_value_and_nothing_is_written() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cdi");
    let s = store(&dir, SpecFormat::Yaml);
    for bad in [
        "../escape",
        "..",
        "a/b",
        "/etc/passwd",
        "x..y",
        ".hidden",
        "a\0b",
        "",
    ] {
        let check = |e: CdiError| {
            assert!(matches!(e, CdiError::InvalidClaimUid { .. }), "{e}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        };
        check(s.write(bad, &[gpu(0)]).unwrap_err());
        check(s.remove(bad).unwrap_err());
        check(s.exists(bad).unwrap_err());
        check(s.read(bad).unwrap_err());
        check(s.device_ids(bad, 1).unwrap_err());
        check(cdi::validate_claim_uid(bad).unwrap_err());
    }
    assert!(entries(&dir).is_empty());
    assert_eq!(entries(root.path()), ["cdi"]);
}

#[test]
fn bad_or_empty_edits_are_refused_before_any_file_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), SpecFormat::Yaml);
    let e = s.write(UID, &[]).unwrap_err();
    assert!(matches!(e, CdiError::EmptyEdits { .. }), "{e}");
    let e = s.write(UID, &[gpu(0), DeviceEdits::default()]).unwrap_err();
    assert!(e.to_string().contains("result 1"), "{e}");
    let mut bad = gpu(0);
    bad.hooks[0].hook_name = "onStart".into();
    let e = s.write(UID, &[bad]).unwrap_err();
    assert!(
        e.to_string().contains("hooks[0].hookName") && e.to_string().contains(UID),
        "{e}"
    );
    let mut bad = gpu(0);
    bad.env.push(("".into(), "x".into()));
    assert!(s.write(UID, &[bad]).is_err());
    let mut bad = gpu(0);
    bad.device_nodes[0].permissions = Some("rwx".into());
    assert!(s.write(UID, &[bad]).is_err());
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn read_returns_what_was_written_and_bounds_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), SpecFormat::Yaml);
    s.write(UID, &[gpu(0), gpu(1)]).unwrap();
    let spec = s.read(UID).unwrap().unwrap();
    assert_eq!(spec.kind, "accel.nri.io/device");
    assert_eq!(spec.devices[1].name, format!("claim-{UID}-1"));
    assert_eq!(
        spec.devices[1].container_edits.device_nodes,
        gpu(1).device_nodes
    );
    assert_eq!(
        spec.devices[0].container_edits.env,
        ["ACCEL_VISIBLE_DEVICES=0"]
    );

    let path = s.spec_path(UID).unwrap();
    std::fs::write(&path, vec![b' '; (cdi::MAX_SPEC_BYTES + 1) as usize]).unwrap();
    assert!(matches!(
        s.read(UID).unwrap_err(),
        CdiError::TooLarge { .. }
    ));
    std::fs::write(&path, "cdiVersion: 0.3.0\nkind: other.io/x\ndevices: []\n").unwrap();
    let e = s.read(UID).unwrap_err();
    assert!(e.to_string().contains("other.io/x"), "{e}");
    std::fs::write(&path, "cdiVersion: [").unwrap();
    let e = s.read(UID).unwrap_err();
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}

#[test]
fn oversized_specs_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), SpecFormat::Yaml);
    let big = DeviceEdits {
        env: vec![("BIG".into(), "x".repeat(cdi::MAX_SPEC_BYTES as usize))],
        ..Default::default()
    };
    assert!(matches!(
        s.write(UID, &[big]).unwrap_err(),
        CdiError::TooLarge { .. }
    ));
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn an_unreadable_directory_is_an_error_not_an_empty_list() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cdi");
    let s = store(&dir, SpecFormat::Yaml);
    s.write(UID, &[gpu(0)]).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let e = s.list().unwrap_err();
    assert!(
        matches!(e, CdiError::Io { .. }) && e.to_string().contains("cdi"),
        "{e}"
    );
    // A file where the directory should be.
    std::fs::write(&dir, "x").unwrap();
    assert!(s.list().is_err());
    assert!(s.write(UID, &[gpu(0)]).is_err());
}

#[test]
fn the_step_hook_sees_each_step_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = store(dir.path(), SpecFormat::Yaml);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let rec = seen.clone();
    s.set_step_hook(std::sync::Arc::new(move |step| {
        rec.lock().unwrap().push(step)
    }));
    s.write(UID, &[gpu(0)]).unwrap();
    s.remove(UID).unwrap();
    assert!(s.write("x", &[]).is_err());
    use cdi::WriteStep::*;
    assert_eq!(*seen.lock().unwrap(), [TempWritten, Renamed, Removed]);
}

/// Issue 39: the store says whether its directory is still the one at the configured path, and
/// what is there instead: consumers read specs by that path, the store writes through its handle.
#[test]
fn check_dir_says_what_is_at_the_path_instead_of_the_opened_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("cdi");
    let s = store(&path, SpecFormat::Yaml);
    s.check_dir().unwrap();
    let moved = tmp.path().join("cdi.moved");
    std::fs::rename(&path, &moved).unwrap();
    let said = |s: &SpecStore| s.check_dir().unwrap_err().to_string();
    assert_eq!(
        said(&s),
        format!(
            "{} was moved away or removed (nothing is at that path now)",
            path.display()
        )
    );
    std::fs::write(&path, b"").unwrap();
    assert!(said(&s).ends_with("was replaced by a file that is not a directory"));
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&moved, &path).unwrap();
    assert_eq!(
        said(&s),
        format!(
            "{} was replaced by a symbolic link (to {})",
            path.display(),
            moved.display()
        )
    );
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert!(said(&s).ends_with("was replaced by another directory"));
    std::fs::remove_dir(&path).unwrap();
    std::fs::rename(&moved, &path).unwrap();
    s.check_dir().unwrap();
    assert!(s.dir_still_at_path());
}

//! Atomicity and crash behaviour: readers never see a partial spec, a crash before the rename
//! leaves no visible spec, and the next start removes the dead writer's temp file.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use cdi::{DeviceEdits, SpecFormat, SpecStore, StoreConfig, WriteStep};
use common::*;

const UID: &str = "5f0c6e1a-2b3d-4c5e-8f90-a1b2c3d4e5f6";

/// A result whose size varies with `n`, so consecutive rewrites differ in length.
fn sized(n: usize) -> Vec<DeviceEdits> {
    (0..1 + n % 5).map(|i| gpu(i + n % 3)).collect()
}

#[test]
fn reader_never_sees_a_partial_or_invalid_spec_during_1000_rewrites() {
    for format in [SpecFormat::Yaml, SpecFormat::Json] {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(dir.path(), format);
        s.write(UID, &sized(0)).unwrap();
        // Deterministic part: at each step of every rewrite (temp written but not renamed;
        // renamed) the visible spec parses and has the device count of the old or new content.
        let step_failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let steps = Arc::new(AtomicUsize::new(0));
        {
            let (d, f, steps) = (dir.path().to_owned(), step_failures.clone(), steps.clone());
            s.set_step_hook(Arc::new(move |step| {
                steps.fetch_add(1, Ordering::Relaxed);
                let visible = visible_specs(&d);
                if visible.len() != 1 {
                    f.lock()
                        .unwrap()
                        .push(format!("{step:?}: {} visible specs", visible.len()));
                }
                for p in visible {
                    if let Err(e) = official_parse(&p) {
                        f.lock().unwrap().push(format!("{step:?}: {e}"));
                    }
                }
            }));
        }
        let s = Arc::new(s);
        // Free-running part: a second thread polls and parses while the rewrites go on.
        let done = Arc::new(AtomicBool::new(false));
        let parsed = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (dir, done, parsed) = (dir.path().to_owned(), done.clone(), parsed.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let visible = visible_specs(&dir);
                    if visible.len() != 1 {
                        failures.push(format!("{} visible specs", visible.len()));
                    }
                    for p in visible {
                        match official_parse(&p) {
                            Ok((names, _)) if !names.is_empty() => {
                                parsed.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => failures.push(format!("{}: no devices", p.display())),
                            Err(e) => failures.push(format!("{}: {e}", p.display())),
                        }
                    }
                    if finished {
                        return failures;
                    }
                }
            })
        };
        for n in 1..=1000 {
            s.write(UID, &sized(n)).unwrap();
        }
        done.store(true, Ordering::Release);
        let failures = reader.join().unwrap();
        assert!(failures.is_empty(), "{format:?}: {failures:?}");
        let step_failures = step_failures.lock().unwrap();
        assert!(step_failures.is_empty(), "{format:?}: {step_failures:?}");
        assert_eq!(steps.load(Ordering::Relaxed), 2000, "two steps per rewrite");
        assert!(parsed.load(Ordering::Relaxed) > 0);
        assert_eq!(
            s.read(UID).unwrap().unwrap().devices.len(),
            sized(1000).len()
        );
        assert_eq!(entries(dir.path()).len(), 1, "no temp file may remain");
    }
}

/// Child half of the crash test: with `CDI_CRASH_DIR` set it rewrites a spec and aborts the
/// process right after the temp file is written, as a power cut or SIGKILL would.
#[test]
#[ignore = "the child half of the crash tests, which run it"]
fn crash_child() {
    let Some(dir) = std::env::var_os("CDI_CRASH_DIR") else {
        panic!("run by the crash tests (run_crash_child), which set CDI_CRASH_DIR");
    };
    let mut s = SpecStore::open(StoreConfig::new(dir)).unwrap();
    s.set_step_hook(Arc::new(|step| {
        if step == WriteStep::TempWritten {
            std::process::abort();
        }
    }));
    let _ = s.write(UID, &sized(4));
    let _ = s.write("never-reached", &sized(1));
}

fn run_crash_child(dir: &std::path::Path) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .env("CDI_CRASH_DIR", dir)
        .status()
        .unwrap();
    assert!(!status.success(), "the child must die at TempWritten");
}

#[test]
fn crash_before_rename_leaves_no_new_spec_and_next_start_cleans_the_temp() {
    // First write ever crashes: nothing is visible to a CDI scanner.
    let dir = tempfile::tempdir().unwrap();
    run_crash_child(dir.path());
    let left = entries(dir.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with(".accel.nri.io-device_") && left[0].ends_with(".tmp"));
    assert!(visible_specs(dir.path()).is_empty());
    assert_eq!(official_cache_devices(dir.path()), (vec![], 0));
    let s = store(dir.path(), SpecFormat::Yaml);
    assert!(!s.exists(UID).unwrap());
    assert_eq!(s.list().unwrap(), Vec::<String>::new());
    assert!(
        entries(dir.path()).is_empty(),
        "list() must remove the dead writer's temp"
    );

    // A crash during a rewrite keeps the old spec byte for byte.
    s.write(UID, &sized(0)).unwrap();
    let before = std::fs::read(s.spec_path(UID).unwrap()).unwrap();
    run_crash_child(dir.path());
    assert_eq!(entries(dir.path()).len(), 2);
    let s = store(dir.path(), SpecFormat::Yaml);
    assert_eq!(s.list().unwrap(), vec![UID.to_owned()]);
    assert_eq!(std::fs::read(s.spec_path(UID).unwrap()).unwrap(), before);
    assert_eq!(entries(dir.path()).len(), 1);
    official_parse(&s.spec_path(UID).unwrap()).unwrap();
}

#[test]
fn a_panicking_writer_leaves_its_temp_for_list_to_clean() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = store(dir.path(), SpecFormat::Yaml);
    s.set_step_hook(Arc::new(|step| {
        if step == WriteStep::TempWritten {
            panic!("simulated crash");
        }
    }));
    let s = Arc::new(s);
    let w = {
        let s = s.clone();
        std::thread::spawn(move || s.write(UID, &sized(2)))
    };
    assert!(w.join().is_err());
    assert_eq!(entries(dir.path()).len(), 1);
    assert!(visible_specs(dir.path()).is_empty());
    let fresh = store(dir.path(), SpecFormat::Yaml);
    assert!(fresh.list().unwrap().is_empty());
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn list_between_temp_and_rename_never_removes_a_live_writers_temp() {
    let dir = tempfile::tempdir().unwrap();
    let lister = Arc::new(store(dir.path(), SpecFormat::Yaml));
    let mut s = store(dir.path(), SpecFormat::Yaml);
    let seen = Arc::new(std::sync::Mutex::new(None));
    {
        let (lister, seen, d) = (lister.clone(), seen.clone(), dir.path().to_owned());
        s.set_step_hook(Arc::new(move |step| {
            if step == WriteStep::TempWritten {
                let listed = lister.list().unwrap();
                *seen.lock().unwrap() = Some((listed, entries(&d)));
            }
        }));
    }
    s.write(UID, &sized(1)).unwrap();
    let (listed, during) = seen.lock().unwrap().take().unwrap();
    assert!(
        listed.is_empty(),
        "the spec is not visible before the rename"
    );
    assert_eq!(
        during.len(),
        1,
        "the in-flight temp survived list(): {during:?}"
    );
    assert_eq!(lister.list().unwrap(), vec![UID.to_owned()]);
}

#[test]
fn a_temp_locked_by_another_process_is_left_alone() {
    use nix::fcntl::{Flock, FlockArg};
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir
        .path()
        .join(format!(".accel.nri.io-device_{UID}.yaml.999999-1.tmp"));
    std::fs::write(&tmp, b"partial").unwrap();
    // A separate open file description stands in for another process's live writer.
    let held = Flock::lock(std::fs::File::open(&tmp).unwrap(), FlockArg::LockExclusive).unwrap();
    let s = store(dir.path(), SpecFormat::Yaml);
    assert!(s.list().unwrap().is_empty());
    assert!(tmp.exists(), "a locked temp belongs to a live writer");
    drop(held);
    assert!(s.list().unwrap().is_empty());
    assert!(!tmp.exists(), "an unlocked temp is a dead writer's");
}

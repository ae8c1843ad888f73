//! Preflight on real files in temp dirs: what passes, what is created, and the sentences of each
//! refusal (they must name the path).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nri_accel::preflight::{DirRole, PreflightError, PreflightPaths, check_nri_socket, run};

struct Host {
    root: tempfile::TempDir,
    _listener: UnixListener,
}

impl Host {
    /// A host with a live NRI socket and the three directories present.
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        for d in ["state", "cdi", "run"] {
            std::fs::create_dir(root.path().join(d)).unwrap();
            // Whatever the umask: a group-writable dir is refused.
            std::fs::set_permissions(root.path().join(d), PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        let listener = UnixListener::bind(root.path().join("nri.sock")).unwrap();
        Self {
            root,
            _listener: listener,
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    fn paths(&self) -> PreflightPaths {
        PreflightPaths {
            nri_socket: Some(self.p("nri.sock")),
            state_dir: self.p("state"),
            cdi_dir: self.p("cdi"),
            claims_socket_dir: self.p("run"),
        }
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn healthy_host_passes_and_creates_nothing() {
    let host = Host::new();
    let report = run(&host.paths()).unwrap();
    assert!(report.created.is_empty());
    assert_eq!(std::fs::read_dir(host.p("state")).unwrap().count(), 0);
}

#[test]
fn checks_leave_the_directories_modification_times_alone() {
    let host = Host::new();
    let mtimes = || {
        ["state", "cdi", "run"].map(|d| std::fs::metadata(host.p(d)).unwrap().modified().unwrap())
    };
    let before = mtimes();
    // Long enough for any change to show on a file system with coarse timestamps.
    std::thread::sleep(std::time::Duration::from_millis(20));
    run(&host.paths()).unwrap();
    assert_eq!(mtimes(), before, "no probe file is created and removed");
}

#[test]
fn missing_dirs_are_created_with_their_modes() {
    let host = Host::new();
    for d in ["state", "cdi", "run"] {
        std::fs::remove_dir(host.p(d)).unwrap();
    }
    let report = run(&host.paths()).unwrap();
    assert_eq!(
        report.created,
        vec![host.p("state"), host.p("cdi"), host.p("run")]
    );
    let mode = |rel: &str| std::fs::metadata(host.p(rel)).unwrap().permissions().mode() & 0o777;
    // The umask can only take bits away.
    assert_eq!(mode("state"), 0o700);
    assert_eq!(mode("cdi") & !0o755, 0);
    assert_eq!(mode("run") & !0o750, 0);
    assert_eq!(DirRole::State.create_mode(), 0o700);
}

#[test]
fn launched_by_runtime_skips_the_socket() {
    let host = Host::new();
    std::fs::remove_file(host.p("nri.sock")).unwrap();
    let mut paths = host.paths();
    paths.nri_socket = None;
    run(&paths).unwrap();
}

#[test]
fn missing_socket_is_named() {
    let host = Host::new();
    std::fs::remove_file(host.p("nri.sock")).unwrap();
    let err = run(&host.paths()).unwrap_err();
    assert_eq!(err.problems.len(), 1);
    assert!(matches!(
        err.problems[0],
        PreflightError::NriSocketMissing { .. }
    ));
    let text = err.to_string();
    assert!(
        text.contains(host.p("nri.sock").to_str().unwrap()),
        "{text}"
    );
    assert!(text.contains("enable NRI"), "{text}");
}

#[test]
fn regular_file_is_not_a_socket() {
    let host = Host::new();
    let file = host.p("plain");
    std::fs::write(&file, b"").unwrap();
    let err = check_nri_socket(&file).unwrap_err();
    assert!(
        matches!(err, PreflightError::NriSocketNotSocket { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("plain"), "{err}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let host = Host::new();
    std::fs::remove_file(host.p("nri.sock")).unwrap();
    let mut paths = host.paths();
    paths.state_dir = host.p("no/such/state");
    std::fs::remove_dir(host.p("cdi")).unwrap();
    std::fs::write(host.p("cdi"), b"not a dir").unwrap();
    let err = run(&paths).unwrap_err();
    assert_eq!(err.problems.len(), 3, "{err}");
    assert!(matches!(
        err.problems[0],
        PreflightError::NriSocketMissing { .. }
    ));
    assert!(matches!(
        err.problems[1],
        PreflightError::ParentMissing {
            role: DirRole::State,
            ..
        }
    ));
    assert!(matches!(
        err.problems[2],
        PreflightError::NotADirectory {
            role: DirRole::Cdi,
            ..
        }
    ));
    let text = err.to_string();
    assert!(text.contains("no/such/state"), "{text}");
    assert!(text.contains("CDI spec dir"), "{text}");
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The refusal of a read-only dir, and the claim the unit relies on: root with no capability at
/// all still writes root-owned dirs and reaches a root-owned socket. As root this runs in a child
/// process (this test re-run) that first drops every capability, so the test process keeps its own.
#[test]
fn read_only_dir_is_refused_and_no_capability_is_needed() {
    const CHILD: &str = "NRI_ACCEL_TEST_PREFLIGHT_CHILD";
    if is_root() && std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "read_only_dir_is_refused_and_no_capability_is_needed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("CHILD-OK"),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    if is_root() {
        let report = nri_accel::privileges::drop_to(&Default::default()).unwrap();
        assert!(report.kept.is_empty(), "{report:?}");
    }
    let host = Host::new();
    // No capability: a healthy host (dirs and socket owned by this user) still passes.
    run(&host.paths()).unwrap();
    set_mode(&host.p("cdi"), 0o555);
    let err = run(&host.paths()).unwrap_err();
    set_mode(&host.p("cdi"), 0o755);
    assert_eq!(err.problems.len(), 1, "{err}");
    assert!(matches!(
        err.problems[0],
        PreflightError::NotWritable {
            role: DirRole::Cdi,
            ..
        }
    ));
    assert!(err.to_string().contains("ReadWritePaths"), "{err}");
    println!("CHILD-OK");
}

#[test]
fn a_refused_start_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = PreflightPaths {
        nri_socket: Some(tmp.path().join("missing.sock")),
        state_dir: tmp.path().join("state"),
        cdi_dir: tmp.path().join("cdi"),
        claims_socket_dir: tmp.path().join("run"),
    };
    let failed = run(&paths).unwrap_err();
    assert_eq!(failed.problems.len(), 1, "{failed}");
    assert!(matches!(
        failed.problems[0],
        PreflightError::NriSocketMissing { .. }
    ));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "a refused start created {left:?}");
}

#[test]
fn a_state_or_cdi_dir_that_is_a_symlink_is_refused_and_a_link_above_is_fine() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, tmp.path().join("state")).unwrap();
    std::os::unix::fs::symlink(tmp.path(), tmp.path().join("up")).unwrap();
    let paths = PreflightPaths {
        nri_socket: None,
        state_dir: tmp.path().join("state"),
        cdi_dir: tmp.path().join("up").join("cdi"),
        claims_socket_dir: tmp.path().join("run"),
    };
    let failed = run(&paths).unwrap_err();
    assert_eq!(failed.problems.len(), 1, "{failed}");
    let msg = failed.problems[0].to_string();
    assert!(
        msg.contains("state dir") && msg.contains("symbolic link"),
        "{msg}"
    );
    assert!(msg.contains(&real.display().to_string()), "{msg}");
    assert!(!tmp.path().join("cdi").exists(), "nothing created");
}

#[test]
fn a_dir_others_may_write_in_is_refused_and_left_as_it_is() {
    for (dir, mode, says) in [
        ("state", 0o777, "every user may write in it (mode 777)"),
        ("cdi", 0o1777, "every user may write in it (mode 1777)"),
        ("cdi", 0o775, "its group may write in it (mode 775)"),
        ("run", 0o757, "every user may write in it"),
        ("state/checkpoint", 0o770, "its group may write in it"),
    ] {
        let host = Host::new();
        std::fs::create_dir_all(host.p(dir)).unwrap();
        std::fs::set_permissions(host.p(dir), PermissionsExt::from_mode(mode)).unwrap();
        let err = run(&host.paths()).expect_err(dir);
        let text = err.to_string();
        assert!(text.contains(&host.p(dir).display().to_string()), "{text}");
        assert!(text.contains(says), "{dir}: {text}");
        assert!(text.contains("chmod go-w"), "{text}");
        // The fix is for the user the daemon runs as: root's dir for root, its own for another
        // user, who could not use a dir made root's (issue 39 item 8).
        let euid = nix::unistd::geteuid().as_raw();
        if euid == 0 {
            assert!(text.contains("make it root's"), "{text}");
        } else {
            assert!(text.contains(&format!("chown {euid} ")), "{text}");
            assert!(
                !text.contains("root's") && !text.contains("root:root"),
                "{text}"
            );
        }
        let after = std::fs::metadata(host.p(dir)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(after, mode, "{dir}: not repaired");
    }
}

#[test]
fn a_dir_owned_by_another_user_is_refused() {
    use nri_accel::preflight::unsafe_dir;
    assert_eq!(unsafe_dir(0o40755, 0, 0), None);
    assert_eq!(unsafe_dir(0o40700, 1000, 1000), None);
    let why = unsafe_dir(0o40755, 1000, 0).unwrap();
    assert!(why.contains("owned by uid 1000, not by uid 0"), "{why}");
    let dir = std::path::Path::new("/var/lib/nri-accel");
    let root = nri_accel::preflight::ownership_fix(dir, 0);
    assert!(
        root.contains("chown root:root /var/lib/nri-accel"),
        "{root}"
    );
    let user = nri_accel::preflight::ownership_fix(dir, 1000);
    assert!(user.contains("owned by uid 1000"), "{user}");
    assert!(user.contains("chown 1000 /var/lib/nri-accel"), "{user}");
    assert!(!user.contains("root"), "{user}");
}

/// For real: a dir handed to another uid. Only root may give a file away (`.ci/run` runs the
/// ignored tests of this file as root, after the unprivileged run).
#[test]
#[ignore = "needs root (chown to another uid); .ci/run runs it as root"]
fn a_dir_chowned_to_another_uid_is_refused() {
    assert!(
        is_root(),
        "run as root: it chowns a directory to another uid"
    );
    let host = Host::new();
    nix::unistd::chown(&host.p("cdi"), Some(nix::unistd::Uid::from_raw(4242)), None).unwrap();
    let err = run(&host.paths()).expect_err("owned by 4242");
    assert!(err.to_string().contains("owned by uid 4242"), "{err}");
}

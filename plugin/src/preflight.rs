//! Startup checks of the host paths the daemon needs, before anything else touches them.
//!
//! The daemon refuses to start when the NRI socket is missing or is not a socket, or when the state
//! dir, the CDI spec dir or the claims socket dir cannot be written. Each problem is one sentence
//! that names the path and says what to do; all problems are reported at once so an operator fixes
//! them in one round. The state dir and the CDI spec dir must not be symbolic links (nri-accel
//! writes and removes files only in the real directory it opened; a link higher up the path, like
//! `/var/run -> /run`, is fine). Missing directories are created (one level, with the mode the
//! packaging's tmpfiles.d entry uses) when their parent exists, and only once every check passed:
//! a refused start creates nothing. Writability is asked of the kernel (`eaccess`), never probed
//! with a file, so a start leaves the directories' modification times alone. A missing parent means a wrong path in the config or a broken
//! host, and is refused rather than papered over with `mkdir -p`.
//!
//! A directory that exists with an owner other than the user nri-accel runs as, or writable by
//! its group or by everyone, is refused (never repaired: what another user may already have
//! planted in it would then be trusted): the state dir (and its `checkpoint/`), the CDI dir and
//! the claims socket dir.
//!
//! Every path is a parameter, so tests run the real checks on temp dirs.

use std::fmt;
use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

/// Environment variable the runtime sets when it launches the plugin itself and hands it a
/// connected socket: the NRI socket path is not used then.
pub const NRI_PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";

/// Whether the runtime launched this process with a pre-connected NRI socket.
pub fn launched_by_runtime() -> bool {
    std::env::var_os(NRI_PLUGIN_SOCKET_ENV).is_some()
}

/// Which directory a check is about, for the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirRole {
    /// The checkpoint directory (default `/var/lib/nri-accel`), mode 0700.
    State,
    /// The CDI spec directory the runtime reads (default `/var/run/cdi`), mode 0755.
    Cdi,
    /// The directory of the claims API socket (default `/run/nri-accel`), mode 0750.
    ClaimsSocket,
}

impl DirRole {
    /// Mode used when the directory has to be created (matches `packaging/nri-accel.tmpfiles`).
    pub fn create_mode(self) -> u32 {
        match self {
            DirRole::State => 0o700,
            DirRole::Cdi => 0o755,
            DirRole::ClaimsSocket => 0o750,
        }
    }
}

impl fmt::Display for DirRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DirRole::State => "state dir",
            DirRole::Cdi => "CDI spec dir",
            DirRole::ClaimsSocket => "claims socket dir",
        })
    }
}

/// The host paths to check.
#[derive(Clone, Debug)]
pub struct PreflightPaths {
    /// The runtime's NRI socket; `None` when the runtime launched the plugin (no socket to dial).
    pub nri_socket: Option<PathBuf>,
    /// The checkpoint directory.
    pub state_dir: PathBuf,
    /// The CDI spec directory.
    pub cdi_dir: PathBuf,
    /// The directory that will hold the claims API socket.
    pub claims_socket_dir: PathBuf,
}

/// One problem found; its message is the sentence the daemon logs before exiting.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// The NRI socket does not exist.
    #[error(
        "NRI socket {path} does not exist: enable NRI in the container runtime (see the operator \
         guide's containerd and CRI-O snippets), restart the runtime, or set the NRI socket path in \
         the config"
    )]
    NriSocketMissing {
        /// The socket path.
        path: PathBuf,
    },
    /// Something other than a socket sits at the NRI socket path.
    #[error(
        "NRI socket {path} exists but is not a unix socket: point the config at the runtime's NRI socket"
    )]
    NriSocketNotSocket {
        /// The path.
        path: PathBuf,
    },
    /// The NRI socket exists but this process may not connect to it.
    #[error(
        "NRI socket {path} is not writable by this process ({source}): run the daemon as the \
         socket's owner (root for containerd and CRI-O)"
    )]
    NriSocketNoAccess {
        /// The socket path.
        path: PathBuf,
        /// Why access was refused.
        source: nix::Error,
    },
    /// The NRI socket could not be inspected.
    #[error(
        "cannot inspect NRI socket {path}: {source}; check the path and its parent directories"
    )]
    NriSocketStat {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The directory is missing and so is its parent.
    #[error(
        "{role} {path} does not exist and neither does its parent: create it (the packaged \
         tmpfiles.d entry does) or fix the path in the config"
    )]
    ParentMissing {
        /// Which directory.
        role: DirRole,
        /// The directory.
        path: PathBuf,
    },
    /// Something other than a directory sits at the path.
    #[error(
        "{role} {path} exists but is not a directory: move it away or fix the path in the config"
    )]
    NotADirectory {
        /// Which directory.
        role: DirRole,
        /// The path.
        path: PathBuf,
    },
    /// The directory was missing and creating it failed.
    #[error(
        "{role} {path} is missing and could not be created: {source}; create it by hand (mode {mode:o})"
    )]
    Create {
        /// Which directory.
        role: DirRole,
        /// The directory.
        path: PathBuf,
        /// Mode it would have been created with.
        mode: u32,
        /// The underlying error.
        source: io::Error,
    },
    /// The directory exists but a file cannot be created in it.
    #[error(
        "{role} {path} is not writable: {source}; give root write access to it, and under systemd \
         keep it in the unit's ReadWritePaths"
    )]
    NotWritable {
        /// Which directory.
        role: DirRole,
        /// The directory.
        path: PathBuf,
        /// What the kernel answered to a write access check.
        source: io::Error,
    },
    /// The directory's mode or owner lets another user create or replace files in it.
    #[error(
        "{role} {path} is not safe to use: {why}, so another user could plant {what} in it. nri-accel changes nothing and does not start: check what is in it, then {fix} and start again"
    )]
    Unsafe {
        /// Which directory.
        role: DirRole,
        /// The directory.
        path: PathBuf,
        /// What is wrong with its mode or owner.
        why: String,
        /// What could be planted.
        what: &'static str,
        /// What makes it safe for the user nri-accel runs as ([`ownership_fix`]).
        fix: String,
    },
    /// The directory is a symbolic link.
    #[error(
        "{role} {path} is a symbolic link{target}: nri-accel writes and removes files only in a real directory, so that nothing outside it is ever touched; point the config at the directory itself"
    )]
    Symlink {
        /// Which directory.
        role: DirRole,
        /// The path.
        path: PathBuf,
        /// ` (to <target>)` when the link could be read.
        target: String,
    },
    /// The directory could not be inspected.
    #[error("cannot inspect {role} {path}: {source}; check the path and its parent directories")]
    Stat {
        /// Which directory.
        role: DirRole,
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// Every problem preflight found; the daemon logs each and exits non-zero.
#[derive(Debug)]
pub struct PreflightFailed {
    /// The problems, in the order checked (NRI socket, state dir, CDI dir, claims socket dir).
    pub problems: Vec<PreflightError>,
}

impl fmt::Display for PreflightFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "refusing to start, {} problem(s) found:",
            self.problems.len()
        )?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PreflightFailed {}

/// What preflight did on success.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PreflightReport {
    /// Directories that were missing and were created.
    pub created: Vec<PathBuf>,
}

/// Run every check; `Ok` only when all pass. Nothing is created unless every check passed.
pub fn run(paths: &PreflightPaths) -> Result<PreflightReport, PreflightFailed> {
    let mut problems = Vec::new();
    let mut report = PreflightReport::default();
    if let Some(socket) = &paths.nri_socket
        && let Err(e) = check_nri_socket(socket)
    {
        problems.push(e);
    }
    let dirs = [
        (DirRole::State, &paths.state_dir),
        (DirRole::Cdi, &paths.cdi_dir),
        (DirRole::ClaimsSocket, &paths.claims_socket_dir),
    ];
    // The checkpoint dir inside the state dir, when it exists, is held to the same rule.
    let checkpoint = paths.state_dir.join(crate::checkpoint::CHECKPOINT_DIR);
    if let Ok(meta) = std::fs::symlink_metadata(&checkpoint)
        && meta.is_dir()
        && let Err(e) = check_owner_and_mode(DirRole::State, &checkpoint, &meta)
    {
        problems.push(e);
    }
    let mut missing = Vec::new();
    for (role, dir) in dirs {
        match inspect_dir(role, dir) {
            Ok(true) => {}
            Ok(false) => missing.push((role, dir)),
            Err(e) => problems.push(e),
        }
    }
    if !problems.is_empty() {
        return Err(PreflightFailed { problems });
    }
    for (role, dir) in missing {
        match ensure_writable_dir(role, dir) {
            Ok(true) => report.created.push(dir.clone()),
            Ok(false) => {}
            Err(e) => problems.push(e),
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(PreflightFailed { problems })
    }
}

/// Why a directory of `mode` owned by `owner` lets a user other than `euid` create, rename or
/// remove files in it; `None` when only `euid` can (and root, who can anyway).
pub fn unsafe_dir(mode: u32, owner: u32, euid: u32) -> Option<String> {
    let mode = mode & 0o7777;
    if owner != euid {
        Some(format!(
            "it is owned by uid {owner}, not by uid {euid} that nri-accel runs as"
        ))
    } else if mode & 0o002 != 0 {
        Some(format!("every user may write in it (mode {mode:o})"))
    } else if mode & 0o020 != 0 {
        Some(format!("its group may write in it (mode {mode:o})"))
    } else {
        None
    }
}

/// What makes `path` safe for a daemon running as `euid`: owned by that user and not writable by
/// group or others. Root's own fix names root; another user's names that user's uid (a daemon
/// run as a user other than root cannot use a directory made root's).
pub fn ownership_fix(path: &Path, euid: u32) -> String {
    let path = path.display();
    if euid == 0 {
        format!(
            "make it root's and not writable by group or others (chown root:root {path} && chmod go-w {path})"
        )
    } else {
        format!(
            "make it owned by uid {euid}, the user nri-accel runs as, and not writable by group or others (chown {euid} {path} && chmod go-w {path})"
        )
    }
}

/// Refuses a directory whose owner or mode would let another user plant files (see
/// [`unsafe_dir`]); repairing it would hide what may already have been planted.
fn check_owner_and_mode(
    role: DirRole,
    dir: &Path,
    meta: &std::fs::Metadata,
) -> Result<(), PreflightError> {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid().as_raw();
    match unsafe_dir(meta.mode(), meta.uid(), euid) {
        None => Ok(()),
        Some(why) => Err(PreflightError::Unsafe {
            role,
            path: dir.to_owned(),
            why,
            what: match role {
                DirRole::State => "a checkpoint (records of grants)",
                DirRole::Cdi => "a CDI spec (a device grant the runtime honours)",
                DirRole::ClaimsSocket => "a socket in place of the claims API's",
            },
            fix: ownership_fix(dir, euid),
        }),
    }
}

/// Checks `dir` without creating anything: `Ok(true)` when it is a writable directory,
/// `Ok(false)` when it is missing but can be created (its parent is a writable directory).
fn inspect_dir(role: DirRole, dir: &Path) -> Result<bool, PreflightError> {
    let linked = match std::fs::symlink_metadata(dir) {
        Ok(m) => m.file_type().is_symlink(),
        Err(_) => false,
    };
    if linked && role != DirRole::ClaimsSocket {
        let target = std::fs::read_link(dir)
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        return Err(PreflightError::Symlink {
            role,
            path: dir.to_owned(),
            target,
        });
    }
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            check_owner_and_mode(role, dir, &meta)?;
            ensure_writable_dir(role, dir).map(|_| true)
        }
        Ok(_) => Err(PreflightError::NotADirectory {
            role,
            path: dir.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let Some(parent) = dir.parent().filter(|p| p.is_dir()) else {
                return Err(PreflightError::ParentMissing {
                    role,
                    path: dir.to_owned(),
                });
            };
            nix::unistd::access(
                parent,
                nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
            )
            .map_err(|e| PreflightError::Create {
                role,
                path: dir.to_owned(),
                mode: role.create_mode(),
                source: io::Error::from_raw_os_error(e as i32),
            })?;
            Ok(false)
        }
        Err(source) => Err(PreflightError::Stat {
            role,
            path: dir.to_owned(),
            source,
        }),
    }
}

/// Check that `path` is a unix socket this process may connect to (connect needs write access).
pub fn check_nri_socket(path: &Path) -> Result<(), PreflightError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(PreflightError::NriSocketMissing {
                path: path.to_owned(),
            });
        }
        Err(source) => {
            return Err(PreflightError::NriSocketStat {
                path: path.to_owned(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(PreflightError::NriSocketNotSocket {
            path: path.to_owned(),
        });
    }
    nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).map_err(|source| {
        PreflightError::NriSocketNoAccess {
            path: path.to_owned(),
            source,
        }
    })
}

/// Make sure `dir` is a directory a file can be created in; create it (one level) when missing.
/// Returns whether it was created.
pub fn ensure_writable_dir(role: DirRole, dir: &Path) -> Result<bool, PreflightError> {
    let created = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => false,
        Ok(_) => {
            return Err(PreflightError::NotADirectory {
                role,
                path: dir.to_owned(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent_exists = dir.parent().is_some_and(|p| p.is_dir());
            if !parent_exists {
                return Err(PreflightError::ParentMissing {
                    role,
                    path: dir.to_owned(),
                });
            }
            let mode = role.create_mode();
            match DirBuilder::new().mode(mode).create(dir) {
                Ok(()) => true,
                // Another process created it between our stat and mkdir: fine.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                Err(source) => {
                    return Err(PreflightError::Create {
                        role,
                        path: dir.to_owned(),
                        mode,
                        source,
                    });
                }
            }
        }
        Err(source) => {
            return Err(PreflightError::Stat {
                role,
                path: dir.to_owned(),
                source,
            });
        }
    };
    // Asked of the kernel with the effective ids, creating nothing: a probe file would change
    // the directory's modification time on every start, refused ones too. Permissions and
    // read-only mounts (ProtectSystem) show here (EACCES, EROFS); a full disk shows at the
    // first write, with that file's name.
    nix::unistd::eaccess(
        dir,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .map_err(|e| PreflightError::NotWritable {
        role,
        path: dir.to_owned(),
        source: io::Error::from_raw_os_error(e as i32),
    })?;
    Ok(created)
}

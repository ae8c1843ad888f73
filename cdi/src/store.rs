//! The per-claim CDI spec store: one durable spec file per claim in one directory.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::CdiError;
use crate::dir::{Dir, DirError};
use crate::durable::{self, SyncPoint, WriteStep};
use crate::edits::{DeviceEdits, validate_edits};
use crate::names::{self, validate_claim_uid};
use crate::spec::{MAX_SPEC_BYTES, Spec, SpecFormat};
use crate::stamp::{MAX_STAMP_LINE, Stamp};

/// Called after each step of a write or remove; a crash test's hook aborts the process there.
pub type StepHook = Arc<dyn Fn(WriteStep) + Send + Sync>;

/// Asked before each sync of a write or remove; an error it answers is that sync's failure
/// (failure tests inject I/O errors with it).
pub type FaultHook = Arc<dyn Fn(SyncPoint) -> Option<std::io::Error> + Send + Sync>;

/// Where and how the store writes specs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The CDI directory, e.g. `/var/run/cdi`; created with mode 0755 if missing.
    pub dir: PathBuf,
    /// CDI vendor, e.g. `accel.nri.io`.
    pub vendor: String,
    /// CDI class, e.g. `device` (no `.`).
    pub class: String,
    /// File encoding of new specs.
    pub format: SpecFormat,
}

impl StoreConfig {
    /// The default kind `accel.nri.io/device`, YAML, in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            dir: dir.into(),
            vendor: "accel.nri.io".into(),
            class: "device".into(),
            format: SpecFormat::Yaml,
        }
    }
}

/// One spec file per claim, named `<vendor>-<class>_<uid>.yaml` (or `.json`), written durably.
///
/// The store owns only files with its `<vendor>-<class>_` prefix; other files in the directory
/// are never read, changed or removed. The directory is opened once, at [`SpecStore::open`]; every
/// file operation after that goes through the open handle (see [`Dir`]), so a directory renamed
/// or replaced while the store is open never redirects a write or a removal. It does not
/// serialise callers: the claim engine must not write and remove the same claim concurrently
/// (different claims are independent).
pub struct SpecStore {
    cfg: StoreConfig,
    dir: Dir,
    kind: String,
    prefix: String,
    hook: Option<StepHook>,
    fault: Mutex<Option<FaultHook>>,
    read_only: bool,
}

/// A spec file of the store found by [`SpecStore::list_stamped`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedSpec {
    /// The claim it grants.
    pub uid: String,
    /// Its file name in the directory.
    pub file: String,
    /// The commit it was written under; `None` for a spec without a stamp (written by an
    /// nri-accel before stamps, or not by nri-accel).
    pub stamp: Option<Stamp>,
}

impl std::fmt::Debug for SpecStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecStore")
            .field("cfg", &self.cfg)
            .field("hook", &self.hook.is_some())
            .field("read_only", &self.read_only)
            .finish()
    }
}

fn dir_error(e: DirError) -> CdiError {
    match e {
        DirError::Io { op, path, source } => CdiError::Io { op, path, source },
        other => CdiError::Dir(other.to_string()),
    }
}

impl SpecStore {
    /// Checks the vendor and class names, creates the directory (0755, with missing parents)
    /// if it is missing, and opens it; a symbolic link as the directory is refused.
    pub fn open(cfg: StoreConfig) -> Result<SpecStore, CdiError> {
        names::validate_kind_part("vendor", &cfg.vendor)?;
        names::validate_kind_part("class", &cfg.class)?;
        let (dir, _) = Dir::open_or_create(&cfg.dir, 0o755).map_err(dir_error)?;
        Ok(Self::with_dir(cfg, dir, false))
    }

    /// Opens an existing directory for reading only: nothing is created, and [`SpecStore::list`]
    /// removes no stray temp file; every writing call fails. A missing directory is an
    /// `Io` error of kind `NotFound`.
    pub fn open_read_only(cfg: StoreConfig) -> Result<SpecStore, CdiError> {
        names::validate_kind_part("vendor", &cfg.vendor)?;
        names::validate_kind_part("class", &cfg.class)?;
        let dir = match Dir::open(&cfg.dir) {
            Ok(d) => d,
            Err(DirError::Missing { path }) => {
                return Err(CdiError::io(
                    "open CDI directory",
                    path,
                    std::io::Error::from(ErrorKind::NotFound),
                ));
            }
            Err(e) => return Err(dir_error(e)),
        };
        Ok(Self::with_dir(cfg, dir, true))
    }

    fn with_dir(cfg: StoreConfig, dir: Dir, read_only: bool) -> SpecStore {
        SpecStore {
            kind: format!("{}/{}", cfg.vendor, cfg.class),
            prefix: format!("{}-{}_", cfg.vendor, cfg.class),
            cfg,
            dir,
            hook: None,
            fault: Mutex::new(None),
            read_only,
        }
    }

    /// The CDI kind of every spec this store writes, `vendor/class`.
    pub fn kind(&self) -> String {
        self.kind.clone()
    }

    /// The directory the store writes to.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    /// Whether the configured path still leads to the directory opened (it was not renamed
    /// away or replaced since). The store keeps using the opened one either way.
    pub fn dir_still_at_path(&self) -> bool {
        self.dir.still_at_path()
    }

    /// Checks that the configured path still leads to the directory opened, and says what is
    /// there instead when it does not. Consumers of CDI specs find them by that path, so a
    /// spec written through the handle into a directory moved away is one nobody reads: a
    /// caller that tells others "the spec is in place" checks this after writing it.
    pub fn check_dir(&self) -> Result<(), crate::DirMoved> {
        self.dir.check_at_path()
    }

    /// Qualified CDI device IDs `vendor/class=claim-<uid>-<i>` for `results` results of a claim.
    pub fn device_ids(&self, claim_uid: &str, results: usize) -> Result<Vec<String>, CdiError> {
        validate_claim_uid(claim_uid)?;
        Ok((0..results)
            .map(|i| format!("{}={}", self.kind, names::device_name(claim_uid, i)))
            .collect())
    }

    /// Path of the claim's spec file in the configured format.
    pub fn spec_path(&self, claim_uid: &str) -> Result<PathBuf, CdiError> {
        validate_claim_uid(claim_uid)?;
        Ok(self
            .cfg
            .dir
            .join(self.file_name(claim_uid, self.cfg.format)))
    }

    fn file_name(&self, uid: &str, format: SpecFormat) -> String {
        format!("{}{uid}.{}", self.prefix, format.extension())
    }

    fn other_format(&self) -> SpecFormat {
        match self.cfg.format {
            SpecFormat::Yaml => SpecFormat::Json,
            SpecFormat::Json => SpecFormat::Yaml,
        }
    }

    fn step(&self, s: WriteStep) {
        if let Some(h) = &self.hook {
            h(s);
        }
    }

    fn writable(&self, op: &'static str) -> Result<(), CdiError> {
        if self.read_only {
            return Err(CdiError::io(
                op,
                self.dir.path(),
                std::io::Error::new(
                    ErrorKind::PermissionDenied,
                    "the spec store was opened read-only",
                ),
            ));
        }
        Ok(())
    }

    /// Durably writes the claim's spec, one device per result, without a commit stamp, and
    /// returns the qualified device IDs in result order. See [`SpecStore::write_stamped`].
    pub fn write(&self, claim_uid: &str, results: &[DeviceEdits]) -> Result<Vec<String>, CdiError> {
        self.write_inner(claim_uid, None, results)
    }

    /// Durably writes the claim's spec carrying `stamp` (the commit that created the claim's
    /// record), one device per result, and returns the qualified device IDs in result order.
    /// Everything is checked before the file system is touched. Writing the same claim again
    /// replaces the spec atomically (idempotent).
    pub fn write_stamped(
        &self,
        claim_uid: &str,
        stamp: &Stamp,
        results: &[DeviceEdits],
    ) -> Result<Vec<String>, CdiError> {
        self.write_inner(claim_uid, Some(stamp), results)
    }

    fn write_inner(
        &self,
        claim_uid: &str,
        stamp: Option<&Stamp>,
        results: &[DeviceEdits],
    ) -> Result<Vec<String>, CdiError> {
        validate_claim_uid(claim_uid)?;
        if results.is_empty() {
            return Err(CdiError::EmptyEdits {
                claim: claim_uid.to_owned(),
                reason: "no results".into(),
            });
        }
        for (i, r) in results.iter().enumerate() {
            validate_edits(claim_uid, i, r)?;
        }
        let spec = Spec::for_claim(&self.kind, claim_uid, results);
        let mut bytes = match stamp {
            Some(s) => {
                s.check().map_err(|reason| CdiError::Encode {
                    claim: claim_uid.to_owned(),
                    reason,
                })?;
                s.line().into_bytes()
            }
            None => Vec::new(),
        };
        bytes.extend(spec.encode(self.cfg.format, claim_uid)?);
        let name = self.file_name(claim_uid, self.cfg.format);
        if bytes.len() as u64 > MAX_SPEC_BYTES {
            return Err(CdiError::TooLarge {
                path: self.cfg.dir.join(name),
                size: bytes.len() as u64,
                limit: MAX_SPEC_BYTES,
            });
        }
        self.writable("write spec in")?;
        durable::replace(&self.dir, &name, &bytes, &|s| self.step(s), &|p| {
            self.fault(p)
        })?;
        // A spec of the same claim in the other format would define the same devices twice.
        let other = self.file_name(claim_uid, self.other_format());
        if durable::unlink(&self.dir, &other)? {
            durable::sync_dir(&self.dir, SyncPoint::DirAfterRemove, &|p| self.fault(p))?;
        }
        self.device_ids(claim_uid, results.len())
    }

    /// Durably removes the claim's spec (either format); a missing spec is success.
    pub fn remove(&self, claim_uid: &str) -> Result<(), CdiError> {
        validate_claim_uid(claim_uid)?;
        self.writable("remove spec in")?;
        for f in [self.cfg.format, self.other_format()] {
            durable::unlink(&self.dir, &self.file_name(claim_uid, f))?;
        }
        // Always sync: an earlier remove may have died before its directory fsync.
        durable::sync_dir(&self.dir, SyncPoint::DirAfterRemove, &|p| self.fault(p))?;
        self.step(WriteStep::Removed);
        Ok(())
    }

    /// Whether the claim has a spec (either format).
    pub fn exists(&self, claim_uid: &str) -> Result<bool, CdiError> {
        validate_claim_uid(claim_uid)?;
        for f in [self.cfg.format, self.other_format()] {
            let name = self.file_name(claim_uid, f);
            match self.dir.stat(&name) {
                Ok(Some(_)) => return Ok(true),
                Ok(None) => {}
                Err(e) => return Err(CdiError::io("stat spec", self.dir.display(&name), e)),
            }
        }
        Ok(false)
    }

    /// Claim UIDs that have a spec of our kind, sorted. Unless the store is read-only, removes
    /// our stray temp files (those whose writer has died). An unreadable directory is an error,
    /// never an empty list, so a caller reconciling against it cannot mistake "unreadable" for
    /// "nothing granted".
    pub fn list(&self) -> Result<Vec<String>, CdiError> {
        Ok(self
            .list_files()?
            .into_iter()
            .map(|(uid, _)| uid)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    /// Every spec file of our kind with its stamp, sorted by claim (a claim with a spec in both
    /// formats is listed twice). Reads the first line of each file.
    pub fn list_stamped(&self) -> Result<Vec<ListedSpec>, CdiError> {
        let mut out = Vec::new();
        for (uid, file) in self.list_files()? {
            let stamp = self.stamp_of(&file)?;
            out.push(ListedSpec { uid, file, stamp });
        }
        out.sort_by(|a, b| (&a.uid, &a.file).cmp(&(&b.uid, &b.file)));
        Ok(out)
    }

    /// The stamp of the claim's spec: `Ok(None)` when it has no spec or an unstamped one.
    pub fn stamp(&self, claim_uid: &str) -> Result<Option<Stamp>, CdiError> {
        validate_claim_uid(claim_uid)?;
        for f in [self.cfg.format, self.other_format()] {
            let name = self.file_name(claim_uid, f);
            if self
                .dir
                .stat(&name)
                .map_err(|e| CdiError::io("stat spec", self.dir.display(&name), e))?
                .is_some()
            {
                return self.stamp_of(&name);
            }
        }
        Ok(None)
    }

    fn stamp_of(&self, name: &str) -> Result<Option<Stamp>, CdiError> {
        let path = self.dir.display(name);
        let Some(file) = self
            .dir
            .read_file(name)
            .map_err(|e| CdiError::io("open spec", &path, e))?
        else {
            return Ok(None);
        };
        let mut head = Vec::with_capacity(MAX_STAMP_LINE);
        file.take(MAX_STAMP_LINE as u64)
            .read_to_end(&mut head)
            .map_err(|e| CdiError::io("read spec", &path, e))?;
        Ok(Stamp::parse(&head))
    }

    /// (claim UID, file name) of every spec file of our kind; removes stray temp files unless
    /// read-only.
    fn list_files(&self) -> Result<Vec<(String, String)>, CdiError> {
        let names = self
            .dir
            .names()
            .map_err(|e| CdiError::io("read CDI directory", self.dir.path(), e))?;
        let temp_prefix = format!(".{}", self.prefix);
        let mut out = Vec::new();
        for name in names {
            let Some(name) = name.to_str() else { continue };
            if let Some(rest) = name.strip_prefix(&self.prefix) {
                let uid = rest
                    .strip_suffix(".yaml")
                    .or_else(|| rest.strip_suffix(".json"));
                if let Some(uid) = uid
                    && validate_claim_uid(uid).is_ok()
                {
                    out.push((uid.to_owned(), name.to_owned()));
                }
            } else if !self.read_only && name.starts_with(&temp_prefix) && name.ends_with(".tmp") {
                // Only regular files can be our temp files; leave anything else alone.
                let is_file = self
                    .dir
                    .stat(name)
                    .map_err(|e| {
                        CdiError::io("stat CDI directory entry", self.dir.display(name), e)
                    })?
                    .is_some_and(|st| {
                        nix::sys::stat::SFlag::from_bits_truncate(st.st_mode)
                            & nix::sys::stat::SFlag::S_IFMT
                            == nix::sys::stat::SFlag::S_IFREG
                    });
                if !is_file {
                    continue;
                }
                if durable::remove_if_stray(&self.dir, name)? {
                    tracing::info!(path = %self.dir.display(name).display(), "removed stray CDI temp spec");
                }
            }
        }
        Ok(out)
    }

    /// Reads the claim's spec back (at most 1 MiB), or `None` if it has none. A spec that
    /// does not parse, or is of another kind, is an error naming the file.
    pub fn read(&self, claim_uid: &str) -> Result<Option<Spec>, CdiError> {
        validate_claim_uid(claim_uid)?;
        for f in [self.cfg.format, self.other_format()] {
            let name = self.file_name(claim_uid, f);
            let p = self.dir.display(&name);
            let file = match self.dir.read_file(&name) {
                Ok(Some(file)) => file,
                Ok(None) => continue,
                Err(e) => return Err(CdiError::io("open spec", p, e)),
            };
            let bytes = read_bounded(file, &p)?;
            let spec = Spec::decode(&bytes, &p)?;
            if spec.kind != self.kind {
                return Err(CdiError::Parse {
                    path: p,
                    reason: format!("kind {:?} is not this store's {:?}", spec.kind, self.kind),
                });
            }
            return Ok(Some(spec));
        }
        Ok(None)
    }

    /// Installs a hook called after each write/remove step (crash tests).
    pub fn set_step_hook(&mut self, hook: StepHook) {
        self.hook = Some(hook);
    }

    /// Installs (or removes) a hook asked before each sync (failure tests).
    pub fn set_fault_hook(&self, hook: Option<FaultHook>) {
        *self.fault.lock().unwrap_or_else(PoisonError::into_inner) = hook;
    }

    fn fault(&self, point: SyncPoint) -> Option<std::io::Error> {
        let hook = self
            .fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        hook.and_then(|h| h(point))
    }
}

fn read_bounded(file: File, path: &Path) -> Result<Vec<u8>, CdiError> {
    let meta = file
        .metadata()
        .map_err(|e| CdiError::io("stat spec", path, e))?;
    if !meta.is_file() {
        return Err(CdiError::Parse {
            path: path.to_owned(),
            reason: "not a regular file".into(),
        });
    }
    let mut bytes = Vec::with_capacity(meta.len().min(MAX_SPEC_BYTES) as usize);
    file.take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| CdiError::io("read spec", path, e))?;
    if bytes.len() as u64 > MAX_SPEC_BYTES {
        return Err(CdiError::TooLarge {
            path: path.to_owned(),
            size: meta.len().max(bytes.len() as u64),
            limit: MAX_SPEC_BYTES,
        });
    }
    Ok(bytes)
}

//! The per-claim CDI spec store: one durable spec file per claim in one directory.

use std::collections::BTreeSet;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::CdiError;
use crate::durable::{self, WriteStep};
use crate::edits::{DeviceEdits, validate_edits};
use crate::names::{self, validate_claim_uid};
use crate::spec::{MAX_SPEC_BYTES, Spec, SpecFormat};

/// Called after each step of a write or remove; a crash test's hook aborts the process there.
pub type StepHook = Arc<dyn Fn(WriteStep) + Send + Sync>;

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
/// are never read, changed or removed. It does not serialise callers: the claim engine must not
/// write and remove the same claim concurrently (different claims are independent).
pub struct SpecStore {
    cfg: StoreConfig,
    kind: String,
    prefix: String,
    hook: Option<StepHook>,
}

impl std::fmt::Debug for SpecStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecStore")
            .field("cfg", &self.cfg)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl SpecStore {
    /// Checks the vendor and class names and creates the directory (0755) if it is missing.
    pub fn open(cfg: StoreConfig) -> Result<SpecStore, CdiError> {
        names::validate_kind_part("vendor", &cfg.vendor)?;
        names::validate_kind_part("class", &cfg.class)?;
        DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&cfg.dir)
            .map_err(|e| CdiError::io("create CDI directory", &cfg.dir, e))?;
        Ok(SpecStore {
            kind: format!("{}/{}", cfg.vendor, cfg.class),
            prefix: format!("{}-{}_", cfg.vendor, cfg.class),
            cfg,
            hook: None,
        })
    }

    /// The CDI kind of every spec this store writes, `vendor/class`.
    pub fn kind(&self) -> String {
        self.kind.clone()
    }

    /// The directory the store writes to.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
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

    /// Durably writes the claim's spec, one device per result, and returns the qualified
    /// device IDs in result order. Everything is checked before the file system is touched.
    /// Writing the same claim again replaces the spec atomically (idempotent).
    pub fn write(&self, claim_uid: &str, results: &[DeviceEdits]) -> Result<Vec<String>, CdiError> {
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
        let bytes = spec.encode(self.cfg.format, claim_uid)?;
        let name = self.file_name(claim_uid, self.cfg.format);
        if bytes.len() as u64 > MAX_SPEC_BYTES {
            return Err(CdiError::TooLarge {
                path: self.cfg.dir.join(name),
                size: bytes.len() as u64,
                limit: MAX_SPEC_BYTES,
            });
        }
        durable::replace(&self.cfg.dir, &name, &bytes, &|s| self.step(s))?;
        // A spec of the same claim in the other format would define the same devices twice.
        let other = self
            .cfg
            .dir
            .join(self.file_name(claim_uid, self.other_format()));
        if durable::unlink(&other)? {
            durable::sync_dir(&self.cfg.dir)?;
        }
        self.device_ids(claim_uid, results.len())
    }

    /// Durably removes the claim's spec (either format); a missing spec is success.
    pub fn remove(&self, claim_uid: &str) -> Result<(), CdiError> {
        validate_claim_uid(claim_uid)?;
        for f in [self.cfg.format, self.other_format()] {
            durable::unlink(&self.cfg.dir.join(self.file_name(claim_uid, f)))?;
        }
        // Always sync: an earlier remove may have died before its directory fsync.
        durable::sync_dir(&self.cfg.dir)?;
        self.step(WriteStep::Removed);
        Ok(())
    }

    /// Whether the claim has a spec (either format).
    pub fn exists(&self, claim_uid: &str) -> Result<bool, CdiError> {
        validate_claim_uid(claim_uid)?;
        for f in [self.cfg.format, self.other_format()] {
            let p = self.cfg.dir.join(self.file_name(claim_uid, f));
            match fs::symlink_metadata(&p) {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(CdiError::io("stat spec", p, e)),
            }
        }
        Ok(false)
    }

    /// Claim UIDs that have a spec of our kind, sorted. Removes our stray temp files (those
    /// whose writer has died). An unreadable directory is an error, never an empty list, so a
    /// caller reconciling against it cannot mistake "unreadable" for "nothing granted".
    pub fn list(&self) -> Result<Vec<String>, CdiError> {
        let dir = &self.cfg.dir;
        let entries = fs::read_dir(dir).map_err(|e| CdiError::io("read CDI directory", dir, e))?;
        let temp_prefix = format!(".{}", self.prefix);
        let mut uids = BTreeSet::new();
        for entry in entries {
            let entry = entry.map_err(|e| CdiError::io("read CDI directory", dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(rest) = name.strip_prefix(&self.prefix) {
                let uid = rest
                    .strip_suffix(".yaml")
                    .or_else(|| rest.strip_suffix(".json"));
                if let Some(uid) = uid
                    && validate_claim_uid(uid).is_ok()
                {
                    uids.insert(uid.to_owned());
                }
            } else if name.starts_with(&temp_prefix) && name.ends_with(".tmp") {
                let path = entry.path();
                // Only regular files can be our temp files; leave anything else alone.
                let is_file = entry
                    .file_type()
                    .map_err(|e| CdiError::io("stat CDI directory entry", &path, e))?
                    .is_file();
                if !is_file {
                    continue;
                }
                if durable::remove_if_stray(&path)? {
                    tracing::info!(path = %path.display(), "removed stray CDI temp spec");
                }
            }
        }
        Ok(uids.into_iter().collect())
    }

    /// Reads the claim's spec back (at most 1 MiB), or `None` if it has none. A spec that
    /// does not parse, or is of another kind, is an error naming the file.
    pub fn read(&self, claim_uid: &str) -> Result<Option<Spec>, CdiError> {
        validate_claim_uid(claim_uid)?;
        for f in [self.cfg.format, self.other_format()] {
            let p = self.cfg.dir.join(self.file_name(claim_uid, f));
            let file = match OpenOptions::new()
                .read(true)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
                .open(&p)
            {
                Ok(file) => file,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
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

//! The metadata files on the host: `<dir>/<claim uid>/<resourceclaims|resourceclaimtemplates>/
//! <name>/<request>/<driver>-metadata.json`, the same layout as in the container below the claim
//! UID, so the mounts of a claim follow from its files alone (a spec rewritten after a restart
//! mounts what is there). Each file is replaced atomically and durably (temp file in the same
//! directory, fsync, rename, fsync of the directory), as CDI specs are.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::file::{
    CONTAINER_DIR, ClaimMetadata, FILE_SUFFIX, RESOURCE_CLAIM_TEMPLATES_SUBDIR,
    RESOURCE_CLAIMS_SUBDIR, base_request,
};

/// Why the metadata files of a claim could not be written, listed or removed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// A name that cannot be a path component (a claim UID, claim or request name).
    #[error(
        "claim {claim}: the {what} {value:?} cannot name a device metadata directory (it must be a non-empty name without \"/\" that is not \".\" or \"..\")"
    )]
    BadName {
        /// The claim UID.
        claim: String,
        /// What the name is.
        what: &'static str,
        /// The name.
        value: String,
    },
    /// A file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Serializing a document failed.
    #[error("claim {claim}: cannot encode its device metadata: {reason}")]
    Encode {
        /// The claim UID.
        claim: String,
        /// The serializer's message.
        reason: String,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> MetadataError + 'a {
    move |source| MetadataError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// One metadata file of a claim and where a container sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataMount {
    /// The base request name whose directory the file is in.
    pub request: String,
    /// The file on the host.
    pub host_path: PathBuf,
    /// Where the container reads it.
    pub container_path: String,
}

/// The metadata files of every claim, under one directory.
#[derive(Debug, Clone)]
pub struct MetadataStore {
    dir: PathBuf,
}

fn component(claim: &str, what: &'static str, value: &str) -> Result<(), MetadataError> {
    if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
        return Err(MetadataError::BadName {
            claim: claim.to_string(),
            what,
            value: value.to_string(),
        });
    }
    Ok(())
}

impl MetadataStore {
    /// The store under `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> MetadataStore {
        MetadataStore { dir: dir.into() }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of claim `uid`'s files.
    pub fn claim_dir(&self, uid: &str) -> PathBuf {
        self.dir.join(uid)
    }

    /// Writes one file per request of `claim` (replacing whatever the claim had), each durably,
    /// and answers the mounts, in the claim's request order.
    pub fn write(&self, claim: &ClaimMetadata) -> Result<Vec<MetadataMount>, MetadataError> {
        let uid = claim.uid.as_str();
        component(uid, "claim UID", uid)?;
        component(uid, "driver name", &claim.driver)?;
        let (sub, name, what) = match &claim.pod_claim_name {
            Some(p) => (
                RESOURCE_CLAIM_TEMPLATES_SUBDIR,
                p.as_str(),
                "pod claim name",
            ),
            None => (RESOURCE_CLAIMS_SUBDIR, claim.name.as_str(), "claim name"),
        };
        component(uid, what, name)?;
        for r in &claim.requests {
            component(uid, "request name", base_request(&r.name))?;
        }
        self.remove(uid)?;
        let mut mounts = Vec::with_capacity(claim.requests.len());
        for (i, r) in claim.requests.iter().enumerate() {
            let base = base_request(&r.name);
            let rel = Path::new(sub).join(name).join(base);
            let dir = self.claim_dir(uid).join(&rel);
            std::fs::create_dir_all(&dir)
                .map_err(io("create the device metadata directory", &dir))?;
            let file = format!("{}{FILE_SUFFIX}", claim.driver);
            let doc = claim.document(i).ok_or_else(|| MetadataError::Encode {
                claim: uid.to_string(),
                reason: format!("request {} has no document", r.name),
            })?;
            let mut text = serde_json::to_vec_pretty(&doc).map_err(|e| MetadataError::Encode {
                claim: uid.to_string(),
                reason: e.to_string(),
            })?;
            text.push(b'\n');
            let target = dir.join(&file);
            replace(&dir, &file, &text)?;
            mounts.push(MetadataMount {
                request: base.to_string(),
                host_path: target,
                container_path: format!("{CONTAINER_DIR}/{}/{file}", rel.to_string_lossy()),
            });
        }
        sync_dir(&self.dir)?;
        Ok(mounts)
    }

    /// The files claim `uid` has now and their mounts (none when it has no directory).
    pub fn mounts(&self, uid: &str) -> Result<Vec<MetadataMount>, MetadataError> {
        component(uid, "claim UID", uid)?;
        let root = self.claim_dir(uid);
        let mut out = Vec::new();
        for sub in [RESOURCE_CLAIMS_SUBDIR, RESOURCE_CLAIM_TEMPLATES_SUBDIR] {
            for name in entries(&root.join(sub))? {
                for request in entries(&root.join(sub).join(&name))? {
                    let dir = root.join(sub).join(&name).join(&request);
                    for file in entries(&dir)? {
                        if file.ends_with(FILE_SUFFIX) && !file.starts_with('.') {
                            out.push(MetadataMount {
                                request: request.clone(),
                                host_path: dir.join(&file),
                                container_path: format!(
                                    "{CONTAINER_DIR}/{sub}/{name}/{request}/{file}"
                                ),
                            });
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Removes every file of claim `uid`; nothing to remove is success.
    pub fn remove(&self, uid: &str) -> Result<(), MetadataError> {
        component(uid, "claim UID", uid)?;
        let dir = self.claim_dir(uid);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove the device metadata of a claim at", &dir)(e)),
        }
    }

    /// The UIDs of the claims that have files, sorted.
    pub fn list(&self) -> Result<Vec<String>, MetadataError> {
        let mut uids = entries(&self.dir)?;
        uids.retain(|u| !u.starts_with('.'));
        Ok(uids)
    }
}

/// Names in `dir`, sorted; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<String>, MetadataError> {
    let read = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("list the device metadata directory", dir)(e)),
    };
    let mut names = Vec::new();
    for entry in read {
        let entry = entry.map_err(io("list the device metadata directory", dir))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Replaces `dir/name` with `bytes`: a temp file beside it, fsync, rename, fsync `dir`.
fn replace(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), MetadataError> {
    use std::os::unix::fs::OpenOptionsExt;
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let target = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&temp)
        .map_err(io("create the device metadata temp file", &temp))?;
    f.write_all(bytes)
        .map_err(io("write the device metadata temp file", &temp))?;
    f.sync_all()
        .map_err(io("fsync the device metadata temp file", &temp))?;
    drop(f);
    std::fs::rename(&temp, &target)
        .map_err(io("rename into place the device metadata file", &target))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), MetadataError> {
    match std::fs::File::open(dir) {
        Ok(d) => d
            .sync_all()
            .map_err(io("fsync the device metadata directory", dir)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("open the device metadata directory", dir)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{MetadataDevice, RequestMetadata};

    fn claim(uid: &str, pod_claim_name: Option<&str>) -> ClaimMetadata {
        ClaimMetadata {
            driver: "accel.nri.io".into(),
            namespace: "ns".into(),
            name: "claim-a".into(),
            uid: uid.into(),
            pod_claim_name: pod_claim_name.map(str::to_string),
            requests: ["gpu", "big/large"]
                .iter()
                .map(|r| RequestMetadata {
                    name: r.to_string(),
                    devices: vec![MetadataDevice {
                        driver: "accel.nri.io".into(),
                        pool: "node-a".into(),
                        name: "whole-gpu0".into(),
                        attributes: Default::default(),
                    }],
                })
                .collect(),
        }
    }

    #[test]
    fn files_are_written_listed_mounted_and_removed_per_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let store = MetadataStore::new(tmp.path().join("md"));
        assert_eq!(store.list().unwrap(), Vec::<String>::new());
        let direct = store.write(&claim("u1", None)).unwrap();
        let templ = store.write(&claim("u2", Some("gpus"))).unwrap();
        assert_eq!(
            direct[1].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/claim-a/big/accel.nri.io-metadata.json"
        );
        assert_eq!(
            templ[0].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/accel.nri.io-metadata.json"
        );
        // The mounts follow from the files alone.
        let mut found = store.mounts("u2").unwrap();
        found.sort_by(|a, b| a.request.cmp(&b.request));
        let mut want = templ.clone();
        want.sort_by(|a, b| a.request.cmp(&b.request));
        assert_eq!(found, want);
        let doc: crate::metadata::DeviceMetadata =
            serde_json::from_slice(&std::fs::read(&direct[1].host_path).unwrap()).unwrap();
        assert_eq!(doc.requests[0].name, "big/large");
        assert_eq!(store.list().unwrap(), vec!["u1", "u2"]);
        // Rewriting replaces (no second file per request directory); removing is idempotent.
        store.write(&claim("u1", None)).unwrap();
        assert_eq!(store.mounts("u1").unwrap().len(), 2);
        store.remove("u1").unwrap();
        store.remove("u1").unwrap();
        assert_eq!(store.list().unwrap(), vec!["u2"]);
        assert!(store.mounts("u1").unwrap().is_empty());
    }

    #[test]
    fn names_that_could_escape_the_directory_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = MetadataStore::new(tmp.path());
        let mut c = claim("u1", Some(".."));
        let e = store.write(&c).unwrap_err();
        assert!(e.to_string().contains("pod claim name \"..\""), "{e}");
        c.pod_claim_name = None;
        c.uid = "../x".into();
        assert!(store.write(&c).is_err());
        assert!(store.remove("../x").is_err());
        assert!(store.list().unwrap().is_empty());
    }
}

//! The claim engine's [`ClaimFiles`] for device metadata: what a door staged for a claim is
//! written when the engine grants it, and mounted on the first CDI device of each request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::file::{ClaimMetadata, base_request};
use super::store::{MetadataError, MetadataMount, MetadataStore};
use crate::engine::ClaimFiles;

/// Where a door reads the attributes a device is published with.
pub trait AttributeSource: Send + Sync + 'static {
    /// The attributes of the published device `name` as its ResourceSlice has them (qualified
    /// name -> typed value), or `None` when this node does not publish it.
    fn attributes(&self, name: &str) -> Option<BTreeMap<String, serde_json::Value>>;
}

/// Writes the device metadata of the claims doors stage, through a [`MetadataStore`].
pub struct MetadataWriter {
    store: MetadataStore,
    staged: Mutex<HashMap<String, ClaimMetadata>>,
}

impl MetadataWriter {
    /// A writer over `store`.
    pub fn new(store: MetadataStore) -> MetadataWriter {
        MetadataWriter {
            store,
            staged: Mutex::new(HashMap::new()),
        }
    }

    /// The store written to.
    pub fn store(&self) -> &MetadataStore {
        &self.store
    }

    /// What the files of `claim.uid` are to say when the engine next grants it (a fresh prepare).
    pub fn stage(&self, claim: ClaimMetadata) {
        self.lock().insert(claim.uid.clone(), claim);
    }

    /// Forgets what was staged for `uid` (its prepare answered).
    pub fn unstage(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ClaimMetadata>> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The CDI store's error for a metadata failure of claim `uid` (the engine answers it as it
/// answers a failed spec write): a file-system error as it is, naming the file; anything else
/// naming the claim's directory.
fn to_cdi(store: &MetadataStore, uid: &str, e: MetadataError) -> cdi::CdiError {
    match e {
        MetadataError::Io { op, path, source } => cdi::CdiError::Io { op, path, source },
        other => cdi::CdiError::Io {
            op: "write the device metadata of a claim at",
            path: store.claim_dir(uid),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

/// `mounts` per result: each request's file on the first result of that request.
fn per_result(requests: &[String], mounts: &[MetadataMount]) -> Vec<Vec<cdi::Mount>> {
    let mut seen = Vec::new();
    requests
        .iter()
        .map(|r| {
            let base = base_request(r);
            if seen.contains(&base) {
                return Vec::new();
            }
            seen.push(base);
            mounts
                .iter()
                .filter(|m| m.request == base)
                .map(|m| cdi::Mount {
                    host_path: m.host_path.to_string_lossy().into_owned(),
                    container_path: m.container_path.clone(),
                    options: ["ro", "nosuid", "nodev", "bind"]
                        .map(str::to_string)
                        .to_vec(),
                    kind: None,
                })
                .collect()
        })
        .collect()
}

impl ClaimFiles for MetadataWriter {
    fn write(&self, uid: &str, requests: &[String]) -> Result<Vec<Vec<cdi::Mount>>, cdi::CdiError> {
        let staged = self.lock().get(uid).cloned();
        let mounts = match staged {
            Some(claim) => self.store.write(&claim),
            None => self.store.mounts(uid),
        }
        .map_err(|e| to_cdi(&self.store, uid, e))?;
        Ok(per_result(requests, &mounts))
    }

    fn mounts(
        &self,
        uid: &str,
        requests: &[String],
    ) -> Result<Vec<Vec<cdi::Mount>>, cdi::CdiError> {
        let mounts = self
            .store
            .mounts(uid)
            .map_err(|e| to_cdi(&self.store, uid, e))?;
        Ok(per_result(requests, &mounts))
    }

    fn remove(&self, uid: &str) -> Result<(), cdi::CdiError> {
        self.store
            .remove(uid)
            .map_err(|e| to_cdi(&self.store, uid, e))
    }

    fn list(&self) -> Result<Vec<String>, cdi::CdiError> {
        self.store.list().map_err(|e| to_cdi(&self.store, "", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::RequestMetadata;

    #[test]
    fn each_request_is_mounted_once_on_its_first_result() {
        let tmp = tempfile::tempdir().unwrap();
        let w = MetadataWriter::new(MetadataStore::new(tmp.path()));
        let requests: Vec<String> = ["a", "b/x", "a", "b/x"].map(String::from).to_vec();
        // Nothing staged, no files: no mounts.
        assert!(w.write("u1", &requests).unwrap().iter().all(Vec::is_empty));
        w.stage(ClaimMetadata {
            driver: "d.example.com".into(),
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
            pod_claim_name: None,
            requests: ["a", "b/x"]
                .map(|n| RequestMetadata {
                    name: n.into(),
                    devices: vec![],
                })
                .to_vec(),
        });
        let m = w.write("u1", &requests).unwrap();
        assert_eq!(m.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 0, 0]);
        assert!(
            m[1][0]
                .container_path
                .ends_with("/resourceclaims/c/b/d.example.com-metadata.json")
        );
        assert_eq!(m[0][0].options, ["ro", "nosuid", "nodev", "bind"]);
        // Unstaged: the files on disk answer the same mounts.
        w.unstage("u1");
        assert_eq!(w.mounts("u1", &requests).unwrap(), m);
        assert_eq!(w.write("u1", &requests).unwrap(), m);
        assert_eq!(w.list().unwrap(), ["u1"]);
        w.remove("u1").unwrap();
        assert!(w.list().unwrap().is_empty());
    }
}

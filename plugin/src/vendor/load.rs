//! Reading the vendor spec directories: which files there are (the signature that says when to
//! read again) and their decoded content.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cdi::{CdiError, MAX_SPEC_BYTES, VendorSpec};

use super::catalog::{Catalog, LoadedSpec};

/// What the spec files of the directories look like now: (path, size, mtime ns, inode) of each.
pub type Signature = Vec<(PathBuf, u64, i128, u64)>;

/// The spec files of `dirs` (non-recursive, `*.yaml` and `*.json` as runtimes read them, those
/// named `<own_prefix>*` left out), in directory then name order. A missing directory has none.
fn spec_files(dir: &Path, own_prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let is_spec = name.ends_with(".yaml") || name.ends_with(".json");
            (is_spec && !name.starts_with(own_prefix) && !name.starts_with('.')).then(|| e.path())
        })
        .collect();
    out.sort();
    out
}

/// The signature of the spec files of `dirs` now.
pub fn signature(dirs: &[PathBuf], own_prefix: &str) -> Signature {
    dirs.iter()
        .flat_map(|d| spec_files(d, own_prefix))
        .map(|p| match std::fs::metadata(&p) {
            Ok(m) => {
                let mtime = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
                (p, m.size(), mtime, m.ino())
            }
            Err(_) => (p, 0, -1, 0),
        })
        .collect()
}

/// Reads and decodes every vendor spec of `dirs`; specs of kind `own_kind` are skipped. Any
/// file that cannot be read or decoded fails the whole catalog (one sentence naming it): a
/// grant never carries half of what the vendor meant.
pub fn load_dirs(dirs: &[PathBuf], own_kind: &str, own_prefix: &str) -> Result<Catalog, CdiError> {
    let mut specs = Vec::new();
    for dir in dirs {
        for file in spec_files(dir, own_prefix) {
            let bytes = read_bounded(&file)?;
            let spec = VendorSpec::decode(&bytes, &file)?;
            if spec.kind == own_kind {
                continue;
            }
            specs.push(LoadedSpec {
                file,
                spec: Arc::new(spec),
            });
        }
    }
    Ok(Catalog {
        dirs: dirs.to_vec(),
        specs,
    })
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, CdiError> {
    use std::io::Read;
    let io = |e: std::io::Error| CdiError::Vendor {
        path: path.to_owned(),
        reason: format!("cannot read it: {e}"),
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    f.take(MAX_SPEC_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_SPEC_BYTES {
        return Err(CdiError::TooLarge {
            path: path.to_owned(),
            size: bytes.len() as u64,
            limit: MAX_SPEC_BYTES,
        });
    }
    Ok(bytes)
}

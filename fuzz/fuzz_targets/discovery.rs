//! Device discovery over sysfs and procfs: `discover` through an in-memory `HostFs` whose whole
//! tree comes from the fuzz input, so every parser behind it sees arbitrary text: /proc/devices,
//! `major:minor` dev files, PCI class/vendor/device/numa_node/local_cpulist, NVIDIA information
//! files, DRM and accel directories, KFD topology properties and the online CPU list.
//!
//! Input: records separated by `0x1e`; each record is `path` `0x1f` `content`. A record whose
//! content starts with `->` is a symlink to the rest. Directories are implied by the paths.
#![no_main]

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

use nri_accel::config::DiscoveryConfig;
use nri_accel::discovery::{HostFs, MAX_HOST_FILE_BYTES, discover};

enum Node {
    File(Vec<u8>),
    Link(PathBuf),
}

/// One step of a path lookup.
enum Step {
    Root,
    Up,
    Name(OsString),
}

impl Step {
    fn of(c: Component<'_>) -> Option<Step> {
        match c {
            Component::RootDir => Some(Step::Root),
            Component::ParentDir => Some(Step::Up),
            Component::Normal(n) => Some(Step::Name(n.to_os_string())),
            Component::CurDir | Component::Prefix(_) => None,
        }
    }
}

struct MemFs {
    nodes: BTreeMap<PathBuf, Node>,
}

impl MemFs {
    fn parse(data: &[u8]) -> MemFs {
        let mut nodes = BTreeMap::new();
        for rec in data.split(|b| *b == 0x1e) {
            let mut parts = rec.splitn(2, |b| *b == 0x1f);
            let (Some(path), Some(content)) = (parts.next(), parts.next()) else {
                continue;
            };
            let Ok(path) = std::str::from_utf8(path) else {
                continue;
            };
            if !path.starts_with('/') {
                continue;
            }
            let node = match content.strip_prefix(b"->") {
                Some(target) => match std::str::from_utf8(target) {
                    Ok(t) => Node::Link(PathBuf::from(t)),
                    Err(_) => continue,
                },
                None => Node::File(content.to_vec()),
            };
            nodes.insert(PathBuf::from(path), node);
        }
        MemFs { nodes }
    }

    /// The path with every symlink in it replaced by its target (the last one only when
    /// `follow_last`), like the kernel's lookup; `None` after too many links (a loop).
    fn resolve(&self, path: &Path, follow_last: bool) -> Option<PathBuf> {
        let mut todo: VecDeque<Step> = path.components().filter_map(Step::of).collect();
        let mut cur = PathBuf::from("/");
        let mut hops = 0;
        while let Some(step) = todo.pop_front() {
            match step {
                Step::Root => cur = PathBuf::from("/"),
                Step::Up => {
                    cur.pop();
                }
                Step::Name(name) => {
                    cur.push(name);
                    let Some(Node::Link(target)) = self.nodes.get(&cur) else {
                        continue;
                    };
                    if todo.is_empty() && !follow_last {
                        continue;
                    }
                    hops += 1;
                    if hops > 16 {
                        return None;
                    }
                    cur.pop();
                    // The target's components go before what is left of the path.
                    let steps: Vec<Step> = target.components().filter_map(Step::of).collect();
                    for s in steps.into_iter().rev() {
                        todo.push_front(s);
                    }
                }
            }
        }
        Some(cur)
    }

    fn dir_exists(&self, real: &Path) -> bool {
        !self.nodes.contains_key(real)
            && self.nodes.keys().any(|p| p != real && p.starts_with(real))
    }
}

impl HostFs for MemFs {
    fn read(&self, path: &Path) -> io::Result<String> {
        let real = self
            .resolve(path, true)
            .ok_or_else(|| io::Error::other("too many links"))?;
        match self.nodes.get(&real) {
            Some(Node::File(bytes)) => {
                if bytes.len() as u64 > MAX_HOST_FILE_BYTES {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "too large"));
                }
                String::from_utf8(bytes.clone())
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
            }
            Some(Node::Link(_)) => Err(io::Error::other("dangling link")),
            None if self.dir_exists(&real) => Err(io::Error::other("is a directory")),
            None => Err(io::ErrorKind::NotFound.into()),
        }
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let real = self
            .resolve(path, true)
            .ok_or_else(|| io::Error::other("too many links"))?;
        if !self.dir_exists(&real) {
            return Err(io::ErrorKind::NotFound.into());
        }
        let mut names: Vec<String> = self
            .nodes
            .keys()
            .filter_map(|p| p.strip_prefix(&real).ok())
            .filter_map(|rest| rest.components().next())
            .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        let real = self
            .resolve(path, false)
            .ok_or_else(|| io::Error::other("too many links"))?;
        match self.nodes.get(&real) {
            Some(Node::Link(t)) => Ok(t.clone()),
            Some(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, "not a link")),
            None => Err(io::ErrorKind::NotFound.into()),
        }
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.resolve(path, true)
            .is_some_and(|real| self.dir_exists(&real))
    }

    fn exists(&self, path: &Path) -> bool {
        self.resolve(path, false)
            .is_some_and(|real| self.nodes.contains_key(&real) || self.dir_exists(&real))
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let fs = MemFs::parse(data);
    let cfg = DiscoveryConfig::default();
    if let Ok(found) = discover(&fs, &cfg) {
        let ids: Vec<_> = found.inventory.devices.iter().map(|d| &d.id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            ids, sorted,
            "inventory not sorted by id or has duplicate ids"
        );
    }
});

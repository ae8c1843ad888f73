//! Who may talk to the claims API: a policy over the peer's SO_PEERCRED credentials.
//!
//! The socket's file mode (0600, or 0660 with a configured group) is the first fence; this check is
//! the second, and covers the moment between bind and chmod. The policy is a trait so tests can
//! refuse their own uid.

use std::collections::BTreeSet;
use std::path::PathBuf;

use nix::unistd::{Gid, geteuid};

/// The credentials of a connected peer, as the kernel reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Effective uid of the peer when it connected.
    pub uid: u32,
    /// Effective gid of the peer when it connected.
    pub gid: u32,
    /// Process id of the peer (0 when unknown).
    pub pid: i32,
}

/// Decides whether a peer may use the claims API.
pub trait PeerPolicy: Send + Sync + 'static {
    /// `Ok` admits the peer; `Err` refuses it with a sentence saying why.
    fn admit(&self, peer: &PeerCred) -> Result<(), String>;
}

/// The daemon's policy: allowed uids (root and the daemon's own uid), plus members of one
/// optional group, by primary gid or by supplementary groups read from `<proc_root>/<pid>/status`.
#[derive(Clone, Debug)]
pub struct DefaultPeerPolicy {
    allowed_uids: BTreeSet<u32>,
    allowed_gid: Option<u32>,
    proc_root: PathBuf,
}

impl DefaultPeerPolicy {
    /// Root, this process's effective uid, and members of `group` when one is configured.
    pub fn for_daemon(group: Option<Gid>) -> Self {
        Self::new([0, geteuid().as_raw()], group.map(Gid::as_raw))
    }

    /// Exactly these uids, plus members of `allowed_gid`.
    pub fn new(allowed_uids: impl IntoIterator<Item = u32>, allowed_gid: Option<u32>) -> Self {
        Self {
            allowed_uids: allowed_uids.into_iter().collect(),
            allowed_gid,
            proc_root: PathBuf::from("/proc"),
        }
    }

    /// Reads supplementary groups below `root` instead of `/proc` (for tests).
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.proc_root = root.into();
        self
    }

    /// Whether the process `pid` has `gid` among its supplementary groups.
    ///
    /// Unreadable or malformed status files count as "not a member".
    fn has_supplementary_group(&self, pid: i32, gid: u32) -> bool {
        if pid <= 0 {
            return false;
        }
        let path = self.proc_root.join(pid.to_string()).join("status");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return false;
        };
        text.lines()
            .find_map(|line| line.strip_prefix("Groups:"))
            .is_some_and(|groups| {
                groups
                    .split_whitespace()
                    .any(|g| g.parse::<u32>() == Ok(gid))
            })
    }
}

impl PeerPolicy for DefaultPeerPolicy {
    fn admit(&self, peer: &PeerCred) -> Result<(), String> {
        if self.allowed_uids.contains(&peer.uid) {
            return Ok(());
        }
        if let Some(gid) = self.allowed_gid
            && (peer.gid == gid || self.has_supplementary_group(peer.pid, gid))
        {
            return Ok(());
        }
        let uids: Vec<String> = self.allowed_uids.iter().map(u32::to_string).collect();
        let (group, fix) = match self.allowed_gid {
            Some(gid) => (
                format!(", and members of group {gid}"),
                "run the caller as one of those",
            ),
            None => (
                String::new(),
                "run the caller as one of those, or set claims_api.group and add the caller to it",
            ),
        };
        Err(format!(
            "uid {} (pid {}) may not use the claims API: only uids {}{group} may; {fix}",
            peer.uid,
            peer.pid,
            uids.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, pid: i32) -> PeerCred {
        PeerCred { uid, gid, pid }
    }

    #[test]
    fn allowed_uids_pass_others_are_refused_by_name() {
        let policy = DefaultPeerPolicy::new([0, 1000], None);
        policy.admit(&peer(0, 0, 1)).expect("root");
        policy.admit(&peer(1000, 1000, 2)).expect("own uid");
        let why = policy.admit(&peer(1001, 1001, 77)).expect_err("stranger");
        assert!(why.contains("1001") && why.contains("pid 77"), "{why}");
    }

    #[test]
    fn group_members_pass_by_primary_or_supplementary_gid() {
        let proc = tempfile::tempdir().expect("tempdir");
        let dir = proc.path().join("42");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("status"),
            "Name:\tcli\nUid:\t1001\t1001\t1001\t1001\nGroups:\t27 998 1001 \n",
        )
        .expect("write status");
        let policy = DefaultPeerPolicy::new([0], Some(998)).with_proc_root(proc.path());
        policy.admit(&peer(1001, 998, 9)).expect("primary gid");
        policy
            .admit(&peer(1001, 1001, 42))
            .expect("supplementary gid");
        let why = policy
            .admit(&peer(1001, 1001, 43))
            .expect_err("no status file");
        assert!(why.contains("group 998"), "{why}");
    }
}

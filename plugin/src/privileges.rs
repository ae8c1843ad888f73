//! Capabilities: keep only what the configuration needs, drop the rest at startup.
//!
//! The daemon runs as root so that it owns the root-owned directories it writes (the CDI spec dir,
//! its state dir, its socket dir) and may connect to the runtime's root-owned NRI socket. None of
//! that needs a capability: root's ownership of those paths is enough, so by default the daemon
//! keeps **no** capability at all. Two configuration choices add one each:
//!
//! | need | capability | why |
//! | --- | --- | --- |
//! | a claims API group is configured | `CAP_CHOWN` | giving the socket to a group root is not a member of |
//! | metrics on a port below 1024 | `CAP_NET_BIND_SERVICE` | binding a privileged port |
//!
//! Capabilities are per thread in Linux: [`drop_to`] must run on the main thread before any other
//! thread (the async runtime's workers included) is started, so every later thread inherits the
//! reduced sets.

use std::collections::BTreeSet;

use caps::{CapSet, Capability, CapsHashSet};

/// What the configured daemon will need to do that takes a capability.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrivilegeNeeds {
    /// The claims API socket is to be given to a group (chown to a group root is not in).
    pub claims_socket_group: bool,
    /// The TCP port of the metrics server, when metrics are on.
    pub metrics_port: Option<u16>,
}

/// The capabilities to keep for `needs`; everything else is dropped.
pub fn keep_list(needs: &PrivilegeNeeds) -> CapsHashSet {
    let mut keep = CapsHashSet::new();
    if needs.claims_socket_group {
        keep.insert(Capability::CAP_CHOWN);
    }
    // Port 0 asks the kernel for an ephemeral (unprivileged) port.
    if needs.metrics_port.is_some_and(|p| p != 0 && p < 1024) {
        keep.insert(Capability::CAP_NET_BIND_SERVICE);
    }
    keep
}

/// Why dropping capabilities failed.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// A capability set could not be read or changed.
    #[error(
        "cannot {step}: {source}; the daemon will not run with more privilege than it needs, so \
         start it with the packaged unit or as root"
    )]
    Caps {
        /// What was being done.
        step: &'static str,
        /// The underlying error.
        source: caps::errors::CapsError,
    },
}

/// What [`drop_to`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropReport {
    /// Capabilities left in the permitted (and effective) set.
    pub kept: BTreeSet<String>,
    /// Capabilities removed from the permitted set.
    pub dropped: BTreeSet<String>,
    /// Whether the bounding set was reduced to the keep-list. False when the process lacked
    /// `CAP_SETPCAP` (e.g. systemd already bounded it) or nothing was to be dropped there.
    pub bounding_reduced: bool,
    /// Capabilities still in the bounding set afterwards.
    pub bounding: BTreeSet<String>,
}

fn names(set: &CapsHashSet) -> BTreeSet<String> {
    set.iter().map(|c| c.to_string()).collect()
}

fn caps_err(step: &'static str) -> impl FnOnce(caps::errors::CapsError) -> PrivilegeError {
    move |source| PrivilegeError::Caps { step, source }
}

/// Reduce the calling thread's ambient, bounding, inheritable, effective and permitted sets to
/// `keep` (intersected with what the process has), and log the set kept.
///
/// Without privilege there is nothing to drop and nothing fails: a normal user ends with an empty
/// set and the report says so. Without `CAP_SETPCAP` the bounding set is left as it is (the
/// systemd unit's `CapabilityBoundingSet` bounds it then).
pub fn drop_to(keep: &CapsHashSet) -> Result<DropReport, PrivilegeError> {
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(caps_err("read the permitted set"))?;
    let effective =
        caps::read(None, CapSet::Effective).map_err(caps_err("read the effective set"))?;

    // Ambient first: clearing it needs no privilege and it would otherwise survive an exec.
    if caps::runtime::ambient_set_supported().is_ok() {
        caps::clear(None, CapSet::Ambient).map_err(caps_err("clear the ambient set"))?;
    }

    // Bounding next, while CAP_SETPCAP may still be effective.
    let bounding = caps::read(None, CapSet::Bounding).map_err(caps_err("read the bounding set"))?;
    let bounding_extra: Vec<Capability> = bounding.difference(keep).copied().collect();
    let mut bounding_reduced = false;
    if !bounding_extra.is_empty() && effective.contains(&Capability::CAP_SETPCAP) {
        for cap in bounding_extra {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(caps_err("drop a capability from the bounding set"))?;
        }
        bounding_reduced = true;
    }

    let inheritable =
        caps::read(None, CapSet::Inheritable).map_err(caps_err("read the inheritable set"))?;
    // Sets already at their target are left alone: no capset call at all when nothing is to be
    // dropped (the packaged unit's empty bounding set), so a seccomp filter without capset is fine.
    let new_inheritable: CapsHashSet = inheritable.intersection(keep).copied().collect();
    if new_inheritable != inheritable {
        caps::set(None, CapSet::Inheritable, &new_inheritable)
            .map_err(caps_err("reduce the inheritable set"))?;
    }

    let kept: CapsHashSet = permitted.intersection(keep).copied().collect();
    // Effective before permitted: an effective cap outside permitted is rejected by the kernel.
    if effective != kept {
        caps::set(None, CapSet::Effective, &kept).map_err(caps_err("reduce the effective set"))?;
    }
    if permitted != kept {
        caps::set(None, CapSet::Permitted, &kept).map_err(caps_err("reduce the permitted set"))?;
    }

    let dropped: CapsHashSet = permitted.difference(keep).copied().collect();
    let bounding_after =
        caps::read(None, CapSet::Bounding).map_err(caps_err("read the bounding set"))?;
    let report = DropReport {
        kept: names(&kept),
        dropped: names(&dropped),
        bounding_reduced,
        bounding: names(&bounding_after),
    };
    let wanted_missing: BTreeSet<String> = names(&keep.difference(&permitted).copied().collect());
    tracing::info!(
        kept = %list(&report.kept),
        dropped = report.dropped.len(),
        bounding_reduced = report.bounding_reduced,
        "capabilities dropped to the keep-list"
    );
    if !wanted_missing.is_empty() {
        tracing::warn!(
            missing = %list(&wanted_missing),
            "the config needs capabilities this process does not have; the features that need \
             them will fail (add them to the unit's CapabilityBoundingSet)"
        );
    }
    Ok(report)
}

/// Capability names as one word for a log field: `CAP_CHOWN,CAP_NET_BIND_SERVICE`, or `none`.
fn list(names: &BTreeSet<String>) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.iter().cloned().collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_keeps_nothing() {
        assert!(keep_list(&PrivilegeNeeds::default()).is_empty());
    }

    #[test]
    fn claims_group_keeps_chown_only() {
        let keep = keep_list(&PrivilegeNeeds {
            claims_socket_group: true,
            metrics_port: Some(9464),
        });
        assert_eq!(keep, CapsHashSet::from([Capability::CAP_CHOWN]));
    }

    #[test]
    fn privileged_metrics_port_keeps_net_bind_service() {
        for (port, wanted) in [(80, true), (1023, true), (1024, false), (0, false)] {
            let keep = keep_list(&PrivilegeNeeds {
                claims_socket_group: false,
                metrics_port: Some(port),
            });
            assert_eq!(
                keep.contains(&Capability::CAP_NET_BIND_SERVICE),
                wanted,
                "port {port}"
            );
            assert_eq!(keep.len(), usize::from(wanted), "port {port}");
        }
    }

    /// The drop itself runs in a child process (this test binary re-run on the child half of this
    /// test) so the test process keeps its own capabilities.
    #[test]
    fn drop_to_in_child_process() {
        const CHILD: &str = "NRI_ACCEL_TEST_DROP_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let keep = CapsHashSet::from([Capability::CAP_CHOWN]);
            let before = caps::read(None, CapSet::Permitted).unwrap();
            let report = drop_to(&keep).unwrap();
            let after = caps::read(None, CapSet::Permitted).unwrap();
            let effective = caps::read(None, CapSet::Effective).unwrap();
            let expected: CapsHashSet = before.intersection(&keep).copied().collect();
            assert_eq!(after, expected);
            assert_eq!(effective, expected);
            assert!(caps::read(None, CapSet::Ambient).unwrap().is_empty());
            assert_eq!(report.kept, names(&expected));
            assert_eq!(
                report.dropped,
                names(&before.difference(&keep).copied().collect())
            );
            if report.bounding_reduced {
                let bounding = caps::read(None, CapSet::Bounding).unwrap();
                assert!(bounding.is_subset(&keep), "bounding {bounding:?}");
            }
            // A second drop finds nothing more to drop and still succeeds.
            let again = drop_to(&keep).unwrap();
            assert!(again.dropped.is_empty());
            println!("CHILD-OK kept={:?}", report.kept);
            return;
        }
        let parent_before = caps::read(None, CapSet::Permitted).unwrap();
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "privileges::tests::drop_to_in_child_process",
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
        // The parent still has what it had: the drop happened elsewhere.
        assert_eq!(caps::read(None, CapSet::Permitted).unwrap(), parent_before);
    }
}

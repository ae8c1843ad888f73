//! Reconciliation: what to do with records and specs that do not agree, and when to refuse.
//!
//! Every spec carries the stamp of the commit that created its claim's record (sequence number
//! and boot id, see [`cdi::Stamp`]). With the checkpoint's [`History`] (the last commit it
//! holds, and its boot) that decides each case:
//!
//! | record | spec | decision |
//! | --- | --- | --- |
//! | yes | stamped with the record's commit, or unstamped | **restore** |
//! | yes | none | **roll back** the record (half-prepared: nothing was granted) |
//! | yes | stamped with an older commit, or another boot's | **roll back** and **remove** the spec (the record's prepare never finished; the spec is a released grant's) |
//! | yes | stamped with a newer commit | **unproven**: the record is older than the spec's claim |
//! | no | stamped with a commit the history holds, or another boot's | **remove** (an orphan: released, or void after a reboot) |
//! | no | stamped with a commit of this boot after the history's last | **unproven**: the checkpoint lost the commit |
//! | no | unstamped | **unproven**: nothing proves it was released |
//!
//! Startup refuses to go on while anything is unproven and changes nothing; the periodic
//! reconciliation leaves unproven specs alone and reports them. The plan is pure so
//! `nri-accel reconcile --dry-run`, startup, the periodic pass and the model checker
//! (`plugin/tests/model.rs`) share it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::checkpoint::History;

/// A spec file whose grant nothing on this node can prove was released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unproven {
    /// The claim.
    pub uid: String,
    /// The spec file's name in the CDI dir.
    pub file: String,
    /// Why it is not proven: a sentence fragment naming the commit.
    pub why: String,
}

/// The decisions of one reconciliation pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Claims with a record and a spec: restored into the policy.
    pub restore: Vec<String>,
    /// Claims with a record but no spec of it: their record is dropped (nothing was granted).
    pub roll_back: Vec<String>,
    /// Specs of our kind whose grant was released: removed.
    pub remove_specs: Vec<String>,
    /// Specs that prove grants the checkpoint does not hold: startup refuses.
    pub unproven: Vec<Unproven>,
}

impl Plan {
    /// Whether the pass changes nothing.
    pub fn is_noop(&self) -> bool {
        self.roll_back.is_empty() && self.remove_specs.is_empty()
    }
}

/// One spec file as reconciliation sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecFile {
    /// The claim it grants.
    pub uid: String,
    /// Its file name.
    pub file: String,
    /// Its commit stamp.
    pub stamp: Option<cdi::Stamp>,
}

impl From<cdi::ListedSpec> for SpecFile {
    fn from(l: cdi::ListedSpec) -> Self {
        SpecFile {
            uid: l.uid,
            file: l.file,
            stamp: l.stamp,
        }
    }
}

/// Sorts claims into the cases of the module docs. `records` maps each claim with a record to
/// the sequence number of the commit that put it; `boot_id` is this boot's.
pub fn plan(
    records: &BTreeMap<String, u64>,
    specs: &[SpecFile],
    history: &History,
    boot_id: &str,
) -> Plan {
    let mut by_uid: BTreeMap<&str, Vec<&SpecFile>> = BTreeMap::new();
    for s in specs {
        by_uid.entry(&s.uid).or_default().push(s);
    }
    let mut p = Plan::default();
    for (uid, seq) in records {
        let Some(files) = by_uid.get(uid.as_str()) else {
            p.roll_back.push(uid.clone());
            continue;
        };
        let mut stale = false;
        let mut unproven = Vec::new();
        for f in files {
            match &f.stamp {
                None => {}
                Some(s) if s.boot_id == boot_id && s.seq == *seq => {}
                Some(s) if s.boot_id != boot_id || s.seq < *seq => stale = true,
                Some(s) => unproven.push(Unproven {
                    uid: uid.clone(),
                    file: f.file.clone(),
                    why: format!(
                        "it was written for commit {} but the claim's record comes from the older commit {seq}",
                        s.seq
                    ),
                }),
            }
        }
        if !unproven.is_empty() {
            p.unproven.extend(unproven);
        } else if stale {
            p.roll_back.push(uid.clone());
            p.remove_specs.push(uid.clone());
        } else {
            p.restore.push(uid.clone());
        }
    }
    for (uid, files) in by_uid {
        if records.contains_key(uid) {
            continue;
        }
        let mut unproven = Vec::new();
        for f in files {
            let why = match &f.stamp {
                None => Some(
                    "it carries no commit stamp, so nothing proves its claim was released".into(),
                ),
                Some(s) if s.boot_id != boot_id => None,
                Some(s) if history.covers(&s.boot_id, s.seq) => None,
                Some(s) => Some(match &history.boot_id {
                    Some(b) if b == boot_id => format!(
                        "it was written for commit {} and the checkpoint ends at commit {}",
                        s.seq, history.seq
                    ),
                    Some(_) => format!(
                        "it was written for commit {} of this boot and the checkpoint holds no commit of this boot",
                        s.seq
                    ),
                    None => format!(
                        "it was written for commit {} and the checkpoint is empty",
                        s.seq
                    ),
                }),
            };
            if let Some(why) = why {
                unproven.push(Unproven {
                    uid: uid.to_string(),
                    file: f.file.clone(),
                    why,
                });
            }
        }
        if unproven.is_empty() {
            p.remove_specs.push(uid.to_string());
        } else {
            p.unproven.extend(unproven);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "b1";

    fn spec(uid: &str, stamp: Option<(u64, &str)>) -> SpecFile {
        SpecFile {
            uid: uid.into(),
            file: format!("v-c_{uid}.yaml"),
            stamp: stamp.map(|(seq, b)| cdi::Stamp {
                seq,
                boot_id: b.into(),
            }),
        }
    }

    fn history(seq: u64) -> History {
        History {
            boot_id: Some(BOOT.into()),
            seq,
        }
    }

    #[test]
    fn sorts_claims_into_every_case() {
        let records: BTreeMap<String, u64> = [
            ("ok".to_string(), 3),
            ("half".to_string(), 4),
            ("stale".to_string(), 6),
            ("legacy".to_string(), 2),
            ("newer".to_string(), 5),
        ]
        .into();
        let specs = vec![
            spec("ok", Some((3, BOOT))),
            spec("stale", Some((1, BOOT))),
            spec("legacy", None),
            spec("newer", Some((7, BOOT))),
            spec("orphan", Some((5, BOOT))),
            spec("reboot", Some((90, "b0"))),
            spec("lost", Some((9, BOOT))),
            spec("unstamped", None),
        ];
        let p = plan(&records, &specs, &history(8), BOOT);
        assert_eq!(p.restore, vec!["legacy", "ok"]);
        assert_eq!(p.roll_back, vec!["half", "stale"]);
        assert_eq!(p.remove_specs, vec!["stale", "orphan", "reboot"]);
        let unproven: Vec<&str> = p.unproven.iter().map(|u| u.uid.as_str()).collect();
        assert_eq!(unproven, vec!["newer", "lost", "unstamped"]);
        assert!(
            p.unproven[1].why.contains("commit 9")
                && p.unproven[1].why.contains("ends at commit 8")
        );
    }

    #[test]
    fn a_checkpoint_of_another_boot_or_none_covers_no_spec_of_this_boot() {
        let specs = vec![spec("x", Some((1, BOOT)))];
        let other = History {
            boot_id: Some("b0".into()),
            seq: 50,
        };
        assert_eq!(
            plan(&BTreeMap::new(), &specs, &other, BOOT).unproven.len(),
            1
        );
        let none = History {
            boot_id: None,
            seq: 0,
        };
        assert_eq!(
            plan(&BTreeMap::new(), &specs, &none, BOOT).unproven.len(),
            1
        );
        assert!(
            plan(&BTreeMap::new(), &specs, &history(1), BOOT)
                .unproven
                .is_empty()
        );
    }
}

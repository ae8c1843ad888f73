//! Reconciliation: what to do with records and specs that do not agree.
//!
//! A record with its spec is prepared; a record without a spec is
//! half-prepared and is rolled back; a spec without a record is an orphan and
//! is removed. The plan is pure so `nri-accel reconcile --dry-run` shows the
//! same decisions the daemon takes.

use std::collections::BTreeSet;

use serde::Serialize;

/// The decisions of one reconciliation pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Claims with a record and a spec: restored into the policy.
    pub restore: Vec<String>,
    /// Claims with a record but no spec: their record is dropped (nothing was granted).
    pub roll_back: Vec<String>,
    /// Specs of our kind without a record: removed (the claim was released before a crash).
    pub remove_specs: Vec<String>,
}

impl Plan {
    /// Whether the pass changes nothing.
    pub fn is_noop(&self) -> bool {
        self.roll_back.is_empty() && self.remove_specs.is_empty()
    }
}

/// Compares the claim UIDs that have records with those that have specs.
pub fn plan<'a>(
    records: impl IntoIterator<Item = &'a String>,
    specs: impl IntoIterator<Item = &'a String>,
) -> Plan {
    let records: BTreeSet<&String> = records.into_iter().collect();
    let specs: BTreeSet<&String> = specs.into_iter().collect();
    Plan {
        restore: records.intersection(&specs).map(|s| (*s).clone()).collect(),
        roll_back: records.difference(&specs).map(|s| (*s).clone()).collect(),
        remove_specs: specs.difference(&records).map(|s| (*s).clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_claims_into_the_three_cases() {
        let records = ["a".to_string(), "b".to_string()];
        let specs = ["b".to_string(), "c".to_string()];
        let p = plan(&records, &specs);
        assert_eq!(p.restore, vec!["b"]);
        assert_eq!(p.roll_back, vec!["a"]);
        assert_eq!(p.remove_specs, vec!["c"]);
        assert!(!p.is_noop());
        assert!(plan(&records, &records).is_noop());
    }
}

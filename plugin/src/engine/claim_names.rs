//! A claim UID belongs to one claim: the namespace and name it was prepared under (issue 39,
//! item 5). Without this check a Prepare of a held UID under another namespace/name was
//! answered with the holder's grant, and an Unprepare under another namespace/name released
//! the holder's claim.
//!
//! The rules (docs/claims-api.md, "A UID is one claim"):
//! - A record that names neither a namespace nor a name (adopted claims; records written
//!   before names were kept) does not know whom it belongs to: any caller's names match it.
//! - A Prepare matches when its namespace and name equal the record's: it is answered the
//!   record's grant, so it must be the record's claim.
//! - An Unprepare matches when each part it gives equals the record's; a part it leaves empty
//!   matches any. Naming neither is a release by UID alone, as an operator's
//!   `nri-accel unprepare <uid>` asks; clients that know a claim's namespace but not its name
//!   release by those two. The kubelet always sends both.

use policies::Allocation;

use super::EngineError;

/// A claim's namespace and name as a caller gives them with its UID.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClaimName<'a> {
    /// Namespace of the ResourceClaim (may be empty for claims outside Kubernetes).
    pub namespace: &'a str,
    /// Name of the ResourceClaim.
    pub name: &'a str,
}

impl<'a> ClaimName<'a> {
    /// The names `namespace`/`name`.
    pub fn new(namespace: &'a str, name: &'a str) -> Self {
        ClaimName { namespace, name }
    }

    /// Neither a namespace nor a name.
    pub fn is_empty(&self) -> bool {
        self.namespace.is_empty() && self.name.is_empty()
    }
}

impl std::fmt::Display for ClaimName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // An empty part is shown as "" so that `/n1` and `n1/` cannot be misread.
        let part = |s: &str| {
            if s.is_empty() {
                "\"\"".to_string()
            } else {
                s.to_string()
            }
        };
        write!(f, "{}/{}", part(self.namespace), part(self.name))
    }
}

/// Which call names a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimCall {
    /// A Prepare (any door).
    Prepare,
    /// An Unprepare from a door that passes names (claims API, kubelet DRA).
    Unprepare,
}

impl ClaimCall {
    /// `prepared` or `unprepared`.
    pub fn verb(self) -> &'static str {
        match self {
            ClaimCall::Prepare => "prepared",
            ClaimCall::Unprepare => "unprepared",
        }
    }

    /// What the caller should do when the claim is held as `holder`.
    pub fn todo(self, holder: &str) -> String {
        match self {
            ClaimCall::Prepare => {
                format!("give that claim a UID of its own, or unprepare {holder} first")
            }
            ClaimCall::Unprepare => format!(
                "unprepare it as {holder}, or by its UID alone (an empty namespace and name, as nri-accel unprepare <uid> does)"
            ),
        }
    }
}

impl std::fmt::Display for ClaimCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClaimCall::Prepare => "Prepare",
            ClaimCall::Unprepare => "Unprepare",
        })
    }
}

/// Refuses `asked` when `held` (the claim's committed allocation, if any) belongs to another
/// namespace/name; see the module docs for what matches.
pub(super) fn check(
    uid: &str,
    held: Option<&Allocation>,
    asked: ClaimName<'_>,
    call: ClaimCall,
) -> Result<(), EngineError> {
    let Some(held) = held else { return Ok(()) };
    let holder = ClaimName::new(&held.namespace, &held.name);
    let part = |given: &str, held: &str| {
        given == held || (call == ClaimCall::Unprepare && given.is_empty())
    };
    if holder.is_empty()
        || (part(asked.namespace, holder.namespace) && part(asked.name, holder.name))
    {
        return Ok(());
    }
    Err(EngineError::OtherClaim {
        claim: uid.to_string(),
        call,
        held: holder.to_string(),
        asked: asked.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(namespace: &str, name: &str) -> Allocation {
        Allocation {
            claim_uid: "x".into(),
            namespace: namespace.into(),
            name: name.into(),
            results: Vec::new(),
            cpus: Default::default(),
        }
    }

    #[test]
    fn the_same_names_or_an_unknown_holder_match() {
        let a = held("a", "n1");
        for call in [ClaimCall::Prepare, ClaimCall::Unprepare] {
            assert!(check("x", None, ClaimName::new("b", "n2"), call).is_ok());
            assert!(check("x", Some(&a), ClaimName::new("a", "n1"), call).is_ok());
            let legacy = held("", "");
            assert!(check("x", Some(&legacy), ClaimName::new("b", "n2"), call).is_ok());
        }
    }

    #[test]
    fn other_names_are_refused_and_only_an_unprepare_may_leave_parts_empty() {
        let a = held("a", "n1");
        for asked in [
            ClaimName::new("b", "n2"),
            ClaimName::new("b", "n1"),
            ClaimName::new("a", "n2"),
            ClaimName::new("", "n2"),
            ClaimName::new("b", ""),
        ] {
            for call in [ClaimCall::Prepare, ClaimCall::Unprepare] {
                let e = check("x", Some(&a), asked, call).unwrap_err().to_string();
                assert!(e.contains("held as a/n1"), "{e}");
                assert!(e.contains(&format!("names it {asked}")), "{e}");
            }
        }
        for asked in [
            ClaimName::default(),
            ClaimName::new("a", ""),
            ClaimName::new("", "n1"),
        ] {
            assert!(
                check("x", Some(&a), asked, ClaimCall::Unprepare).is_ok(),
                "{asked}"
            );
            assert!(
                check("x", Some(&a), asked, ClaimCall::Prepare).is_err(),
                "{asked}"
            );
        }
        let e = check("x", Some(&a), ClaimName::default(), ClaimCall::Prepare)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "claim x not prepared: it is held as a/n1 and this Prepare names it \"\"/\"\"; nothing was changed: a claim UID belongs to one namespace/name, so give that claim a UID of its own, or unprepare a/n1 first"
        );
    }
}

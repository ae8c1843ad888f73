//! Naming rules: claim UIDs, vendor and class names, device names and spec file names.
//!
//! Every name that reaches the file system passes through here first, so nothing a caller
//! supplies can escape the spec directory or produce a name the CDI parser rejects.

use crate::CdiError;

/// Longest claim UID accepted (Kubernetes UIDs are 36, container-scoped ids about 68).
pub const MAX_CLAIM_UID_LEN: usize = 128;

/// Checks a claim UID before anything else uses it.
///
/// Accepts Kubernetes UIDs (UUIDs) and the container-scoped ids the plugin makes
/// (e.g. `ctr-<64 hex>`): 1 to 128 characters, `[A-Za-z0-9]` at both ends, `[A-Za-z0-9_.-]` in
/// the middle and no `..`. Such a UID cannot contain `/`, cannot be `.` or `..`, and yields a
/// valid CDI device name `claim-<uid>-<i>`.
pub fn validate_claim_uid(uid: &str) -> Result<(), CdiError> {
    let refuse = |reason| {
        Err(CdiError::InvalidClaimUid {
            uid: uid.to_owned(),
            reason,
        })
    };
    if uid.is_empty() {
        return refuse("empty");
    }
    if uid.len() > MAX_CLAIM_UID_LEN {
        return refuse("longer than 128 characters");
    }
    let bytes = uid.as_bytes();
    let (first, last) = (bytes[0], bytes[bytes.len() - 1]);
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return refuse("must start and end with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return refuse("contains a character outside [A-Za-z0-9_.-]");
    }
    if uid.contains("..") {
        return refuse("contains \"..\"");
    }
    Ok(())
}

/// Checks a CDI vendor or class name: a letter first, a letter or digit last,
/// `[A-Za-z0-9_.-]` between. A class may not contain `.` (older kubelets reject it).
pub(crate) fn validate_kind_part(what: &'static str, name: &str) -> Result<(), CdiError> {
    let refuse = |reason| {
        Err(CdiError::InvalidKind {
            what,
            name: name.to_owned(),
            reason,
        })
    };
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return refuse("empty");
    };
    if !first.is_ascii_alphabetic() {
        return refuse("must start with a letter");
    }
    if !last.is_ascii_alphanumeric() {
        return refuse("must end with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return refuse("contains a character outside [A-Za-z0-9_.-]");
    }
    if what == "class" && name.contains('.') {
        return refuse("a class must not contain '.' (older kubelets reject it)");
    }
    if name.len() > 63 {
        return refuse("longer than 63 characters");
    }
    Ok(())
}

/// The CDI device name of result `index` of a claim: `claim-<uid>-<index>`.
pub(crate) fn device_name(uid: &str, index: usize) -> String {
    format!("claim-{uid}-{index}")
}

/// Checks a device name against the CDI rules (alphanumeric at both ends, `[A-Za-z0-9_.:-]`
/// between). Names built from a valid claim UID always pass; this guards the rule itself.
#[cfg(test)]
pub(crate) fn is_valid_device_name(name: &str) -> bool {
    let b = name.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-'))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_uuids_and_container_ids() {
        validate_claim_uid("0b7a1c2e-9f3d-4b1a-8c6e-2d4f6a8b0c1d").unwrap();
        validate_claim_uid(&format!("ctr-{}", "ab".repeat(32))).unwrap();
        validate_claim_uid("a").unwrap();
        validate_claim_uid("a.b_c-d").unwrap();
    }

    #[test]
    fn refuses_escaping_or_malformed_uids_naming_the_value() {
        for bad in [
            "", "..", ".", "../x", "a/../b", "a/b", "a..b", "-a", "a-", "_a", "a_", ".a", "a.",
            "a b", "a\0b", "ä", "a\nb", "/etc",
        ] {
            let err = validate_claim_uid(bad).unwrap_err();
            assert!(
                err.to_string().contains(&format!("{bad:?}")),
                "error for {bad:?} must name it: {err}"
            );
        }
        assert!(validate_claim_uid(&"a".repeat(129)).is_err());
        validate_claim_uid(&"a".repeat(128)).unwrap();
    }

    #[test]
    fn kind_parts() {
        validate_kind_part("vendor", "accel.nri.io").unwrap();
        validate_kind_part("class", "device").unwrap();
        assert!(validate_kind_part("class", "dev.ice").is_err());
        assert!(validate_kind_part("vendor", "1abc").is_err());
        assert!(validate_kind_part("vendor", "abc-").is_err());
        assert!(validate_kind_part("vendor", "a/b").is_err());
        assert!(validate_kind_part("vendor", "").is_err());
    }

    proptest! {
        #[test]
        fn accepted_uids_are_safe_and_make_valid_device_names(uid in "[A-Za-z0-9._/ -]{0,140}") {
            if validate_claim_uid(&uid).is_ok() {
                prop_assert!(!uid.contains('/'));
                prop_assert!(!uid.contains(".."));
                prop_assert!(uid != "." && !uid.is_empty() && uid.len() <= 128);
                prop_assert!(is_valid_device_name(&device_name(&uid, 7)));
            }
        }

        #[test]
        fn well_formed_uids_are_accepted(uid in "[A-Za-z0-9]([A-Za-z0-9_-]{0,60}[A-Za-z0-9])?") {
            prop_assert!(validate_claim_uid(&uid).is_ok());
        }
    }
}

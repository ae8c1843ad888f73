//! Checks on what callers send, made before anything reaches the engine or a file name.

/// Longest accepted claim UID (Kubernetes UIDs are 36 characters).
pub const MAX_UID_LEN: usize = 128;
/// Longest accepted namespace or claim name (a DNS subdomain is at most 253).
pub const MAX_NAME_LEN: usize = 253;
/// Most characters of a bad value echoed back in an error.
const ECHO_LEN: usize = 64;

/// Size, count and connection limits of the claims API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request payload accepted, in bytes (clamped to ttrpc's 4 MiB frame limit).
    pub max_message_bytes: usize,
    /// Most claims in one Prepare or Unprepare request.
    pub max_claims: usize,
    /// Most allocation results or count requests in one claim.
    pub max_results_per_claim: usize,
    /// Most connections served at once. A new one past it takes the place of one with no call
    /// in flight (see `flood.rs`); it is refused with RESOURCE_EXHAUSTED only when every
    /// connection has a call in flight.
    pub max_connections: usize,
    /// A connection silent this long with no call in flight is closed; `None`: never.
    pub idle_timeout: Option<std::time::Duration>,
    /// A connection that sends no request this long after it was accepted is closed; `None`:
    /// never (the idle timeout still applies).
    pub first_request_timeout: Option<std::time::Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 1 << 20,
            max_claims: 1024,
            max_results_per_claim: 256,
            max_connections: 128,
            idle_timeout: Some(std::time::Duration::from_secs(300)),
            first_request_timeout: Some(std::time::Duration::from_secs(10)),
        }
    }
}

impl Limits {
    /// The message limit actually enforced: ttrpc itself never carries a frame over 4 MiB.
    pub fn effective_max_message_bytes(&self) -> usize {
        self.max_message_bytes.min(ttrpc::proto::MESSAGE_LENGTH_MAX)
    }
}

/// A value shortened and quoted for an error message.
pub(crate) fn echo(value: &str) -> String {
    if value.chars().count() <= ECHO_LEN {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(ECHO_LEN).collect();
        format!("{head:?}... ({} bytes)", value.len())
    }
}

/// Checks a claim UID: 1 to 128 characters, ASCII letters and digits at both ends,
/// `[A-Za-z0-9_.-]` in between, and no `..`. Such a UID is safe in a file name.
///
/// The error is one sentence naming the value.
pub fn check_uid(uid: &str) -> Result<(), String> {
    let bytes = uid.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_UID_LEN
        && edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !uid.contains("..");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "claim uid {} is invalid: a uid is 1 to {MAX_UID_LEN} characters of [A-Za-z0-9_.-], starts and ends with a letter or digit and contains no \"..\"",
            echo(uid)
        ))
    }
}

/// Checks a namespace or claim name: at most 253 characters, no control characters.
pub fn check_name(field: &str, uid: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_NAME_LEN || value.chars().any(char::is_control) {
        return Err(format!(
            "claim {uid}: {field} {} is invalid: at most {MAX_NAME_LEN} characters, no control characters",
            echo(value)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_uids_pass() {
        check_uid("0b6a4f2e-6e2f-4f1e-9d3c-1a2b3c4d5e6f").expect("k8s uid");
        check_uid("a").expect("one char");
        check_uid("claim_1.v2-x").expect("middle punctuation");
        check_uid(&"a".repeat(MAX_UID_LEN)).expect("max length");
    }

    #[test]
    fn unsafe_uids_are_refused_naming_the_value() {
        for bad in [
            "", "../x", "a..b", ".a", "a.", "-a", "a-", "a/b", "a b", "ä", "a\0b", "_a",
        ] {
            let err = check_uid(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        let long = "a".repeat(MAX_UID_LEN + 1);
        let err = check_uid(&long).expect_err("too long");
        assert!(err.contains("bytes)"), "long values are shortened: {err}");
    }

    #[test]
    fn names_with_control_characters_are_refused() {
        check_name("name", "u1", "gpu-claim").expect("plain name");
        check_name("namespace", "u1", "").expect("empty namespace");
        assert!(check_name("name", "u1", "a\nb").is_err());
        assert!(check_name("name", "u1", &"n".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn message_limit_is_clamped_to_ttrpc() {
        let limits = Limits {
            max_message_bytes: 64 << 20,
            ..Limits::default()
        };
        assert_eq!(
            limits.effective_max_message_bytes(),
            ttrpc::proto::MESSAGE_LENGTH_MAX
        );
    }
}

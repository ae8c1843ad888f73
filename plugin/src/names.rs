//! Kubernetes name rules: the config checks its driver and node names with them, and the DRA side
//! (kube/) every name before it sends or trusts one. Beside config and kube rather than in either,
//! so the config needs nothing of the Kubernetes side.

/// Whether `s` is a DNS label (RFC 1123): 1 to 63 of `[a-z0-9-]`, alphanumeric at both ends.
/// Namespaces and DRA device names are labels.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS subdomain (RFC 1123): dot-separated labels, at most 253 characters.
/// Object names, node names and driver names are subdomains.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Longest DRA driver name the API accepts.
pub const MAX_DRIVER_NAME: usize = 63;

/// Whether `s` is a valid DRA driver name: a DNS subdomain of at most 63 characters.
pub fn is_driver_name(s: &str) -> bool {
    s.len() <= MAX_DRIVER_NAME && is_dns_subdomain(s)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A short, stable hash of `s` (FNV-1a, 8 hex digits) to keep long names unique when cut.
pub fn short_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        assert!(is_dns_label("gpu-0"));
        assert!(!is_dns_label("-gpu"));
        assert!(!is_dns_label("GPU"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("accel.nri.io"));
        assert!(!is_dns_subdomain("accel..io"));
        assert!(is_driver_name("accel.nri.io"));
        assert!(!is_driver_name(&format!("{}.io", "a".repeat(61))));
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(short_hash("x").len(), 8);
        assert_ne!(short_hash("a"), short_hash("b"));
    }
}

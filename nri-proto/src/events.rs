//! Event subscription masks and the NRI-version rules for them.

use crate::api::Event;

/// A set of NRI events a plugin subscribes to. Bit `1 << (e - 1)` stands for event `e`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventMask(u32);

/// Events a runtime older than NRI v0.10 knows (events 1..=11).
pub const MASK_PRE_V0_10: EventMask = EventMask(0x7FF);
/// Events a runtime from NRI v0.10 on knows (events 1..=14).
pub const MASK_V0_10: EventMask = EventMask(0x3FFF);

impl EventMask {
    /// The empty set.
    pub const fn empty() -> EventMask {
        EventMask(0)
    }

    /// The mask of the given events.
    pub fn of(events: &[Event]) -> EventMask {
        events.iter().fold(EventMask(0), |m, e| m.with(*e))
    }

    /// Adds `event` (UNKNOWN and LAST are not events and are ignored).
    pub fn with(self, event: Event) -> EventMask {
        let n = event as i32;
        if (1..=14).contains(&n) {
            EventMask(self.0 | 1 << (n - 1))
        } else {
            self
        }
    }

    /// Whether `event` is in the set.
    pub fn contains(self, event: Event) -> bool {
        let n = event as i32;
        (1..=14).contains(&n) && self.0 & (1 << (n - 1)) != 0
    }

    /// The raw bits as sent in `ConfigureResponse.events`.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// A mask from raw bits (as received in `ConfigureResponse.events`).
    pub fn from_bits(bits: u32) -> EventMask {
        EventMask(bits)
    }

    /// The intersection of two masks.
    pub fn intersect(self, other: EventMask) -> EventMask {
        EventMask(self.0 & other.0)
    }

    /// Whether no event is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Parses an NRI version such as `v0.12.1` into `(major, minor, patch)`, a missing patch read as
/// 0 and anything after it (`-rc.1`) ignored; `None` when empty or malformed (runtimes before
/// v0.12 send no version). Every decision the plugin takes on the runtime's NRI version reads it
/// through this one parser.
pub fn parse_nri_version(version: &str) -> Option<(u32, u32, u32)> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        None => 0,
        Some(p) => p.parse().ok()?,
    };
    Some((major, minor, patch))
}

/// The events a runtime with `nri_version` (from `ConfigureRequest.NRI_version`) accepts in a
/// Configure reply. A bit it does not know makes its Configure fail, so subscriptions must be
/// limited to this mask. Empty or unparsable versions are treated as pre-v0.10.
pub fn valid_mask_for(nri_version: &str) -> EventMask {
    match parse_nri_version(nri_version) {
        Some((major, minor, _)) if major > 0 || minor >= 10 => MASK_V0_10,
        _ => MASK_PRE_V0_10,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_follow_the_runtime_version() {
        assert_eq!(valid_mask_for("v0.12.0"), MASK_V0_10);
        assert_eq!(valid_mask_for("v0.10.1"), MASK_V0_10);
        assert_eq!(valid_mask_for("v0.8.0"), MASK_PRE_V0_10);
        assert_eq!(valid_mask_for(""), MASK_PRE_V0_10);
        assert_eq!(valid_mask_for("garbage"), MASK_PRE_V0_10);
        assert_eq!(parse_nri_version("v0.12"), Some((0, 12, 0)));
        assert_eq!(parse_nri_version("v0.13.0-rc.1"), Some((0, 13, 0)));
        assert_eq!(parse_nri_version(" 1.2.3+dirty"), Some((1, 2, 3)));
        assert_eq!(parse_nri_version("v0.12.x"), None);
        let m = EventMask::of(&[Event::CREATE_CONTAINER, Event::UPDATE_POD_SANDBOX]);
        assert_eq!(m.bits(), 1 << 3 | 1 << 11);
        assert!(
            !m.intersect(MASK_PRE_V0_10)
                .contains(Event::UPDATE_POD_SANDBOX)
        );
        assert!(
            m.intersect(MASK_PRE_V0_10)
                .contains(Event::CREATE_CONTAINER)
        );
    }
}

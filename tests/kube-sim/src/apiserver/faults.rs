//! Failures a test injects: answer requests with an error code, for a count or until healed.

/// What to fail and how.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail this many of the next requests.
    remaining: u64,
    /// Fail every request until healed.
    always: bool,
    /// Only writes (POST, PUT, DELETE) fail.
    only_writes: bool,
    /// The status code failed requests get.
    code: u16,
}

impl Faults {
    /// Fails the next `n` requests (only writes when `only_writes`) with `code`.
    pub fn fail_next(&mut self, n: u64, code: u16, only_writes: bool) {
        *self = Faults {
            remaining: n,
            always: false,
            only_writes,
            code,
        };
    }

    /// Fails every request with `code` until [`Faults::heal`].
    pub fn fail_always(&mut self, code: u16) {
        *self = Faults {
            remaining: 0,
            always: true,
            only_writes: false,
            code,
        };
    }

    /// Stops failing.
    pub fn heal(&mut self) {
        *self = Faults::default();
    }

    /// The code to fail this request with, if it is to fail (and counts it).
    pub fn take(&mut self, write: bool) -> Option<u16> {
        if self.only_writes && !write {
            return None;
        }
        if self.always {
            return Some(self.code);
        }
        if self.remaining > 0 {
            self.remaining -= 1;
            return Some(self.code);
        }
        None
    }
}

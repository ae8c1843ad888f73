//! What a check after parsing reports: the field (as a path) and why. Its own file because the
//! general checks (validate.rs) and the device plugin section's (validate_device_plugin.rs) both
//! report it, and neither should reach into the other for it.

use super::spans::Step;

/// One value the config must not have: where (as a path) and why.
#[derive(Debug)]
pub(crate) struct Problem {
    pub path: Vec<Step>,
    pub message: String,
}

/// The answer of one check: fine, or the first problem found.
pub(crate) type Checked = Result<(), Problem>;

/// Fails a check at `path` with `message`.
pub(crate) fn fail(path: Vec<Step>, message: impl Into<String>) -> Checked {
    Err(Problem {
        path,
        message: message.into(),
    })
}

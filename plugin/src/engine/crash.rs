//! Named steps of prepare and unprepare where a crash test can stop the process.
//!
//! The daemon reads `NRI_ACCEL_TEST_CRASH_AT=<step>` once at startup and aborts
//! the process when it reaches that step, so tests can kill the real binary at
//! an exact point and restart it. In-process tests install a hook that asks the
//! engine to stop there instead: the engine then returns at once without any
//! clean-up, as a dead process would.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Environment variable the binary reads to abort at a named step.
pub const CRASH_ENV: &str = "NRI_ACCEL_TEST_CRASH_AT";

/// A step of the claim flows after which a crash can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// Prepare: the policy allocated, nothing is durable yet.
    AfterAllocate,
    /// Prepare or unprepare: the checkpoint change is durable.
    AfterCheckpoint,
    /// Prepare or unprepare: the container updates were pushed (or failed and stayed pending).
    AfterUpdatePush,
    /// Prepare: the spec's temp file is written, not yet renamed.
    AfterSpecTemp,
    /// Prepare: the spec is renamed into place, the directory not yet reported synced to the caller.
    AfterSpecRename,
    /// Unprepare: the policy released the claim in memory.
    AfterRelease,
    /// Unprepare: the spec is removed (its first step: the release comes after).
    AfterSpecRemove,
}

impl CrashPoint {
    /// Every step: prepare's in flow order, then unprepare's release steps and its spec
    /// removal (which comes first in an unprepare).
    pub const ALL: [CrashPoint; 7] = [
        CrashPoint::AfterAllocate,
        CrashPoint::AfterCheckpoint,
        CrashPoint::AfterUpdatePush,
        CrashPoint::AfterSpecTemp,
        CrashPoint::AfterSpecRename,
        CrashPoint::AfterRelease,
        CrashPoint::AfterSpecRemove,
    ];

    /// The step's name as the environment variable spells it.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::AfterAllocate => "after-allocate",
            CrashPoint::AfterCheckpoint => "after-checkpoint",
            CrashPoint::AfterUpdatePush => "after-update-push",
            CrashPoint::AfterSpecTemp => "after-spec-temp",
            CrashPoint::AfterSpecRename => "after-spec-rename",
            CrashPoint::AfterRelease => "after-release",
            CrashPoint::AfterSpecRemove => "after-spec-remove",
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CrashPoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CrashPoint::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = CrashPoint::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown crash step {s:?}; known steps: {}",
                    names.join(", ")
                )
            })
    }
}

/// What a crash hook tells the engine at a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAction {
    /// Carry on.
    Continue,
    /// Stop here as if the process died: no clean-up, no answer.
    Die,
}

/// A hook consulted at every step.
pub type CrashHook = Arc<dyn Fn(CrashPoint) -> HookAction + Send + Sync>;

/// The hook the binary installs: aborts the process at the step named by
/// [`CRASH_ENV`], if set; `None` when the variable is unset.
pub fn hook_from_env() -> Result<Option<CrashHook>, String> {
    let Ok(value) = std::env::var(CRASH_ENV) else {
        return Ok(None);
    };
    let target: CrashPoint = value.parse()?;
    Ok(Some(Arc::new(move |step| {
        if step == target {
            tracing::error!(step = %step, "crash injected by {CRASH_ENV}");
            std::process::abort();
        }
        HookAction::Continue
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for p in CrashPoint::ALL {
            assert_eq!(p.name().parse::<CrashPoint>().unwrap(), p);
        }
        let err = "after-lunch".parse::<CrashPoint>().unwrap_err();
        assert!(err.contains("after-allocate"), "{err}");
    }
}

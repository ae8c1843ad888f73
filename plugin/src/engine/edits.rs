//! From the policy's container edits to the CDI store's, and the spec store's crash steps.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{CrashHook, CrashPoint, HookAction};

/// Panic text a spec step hook uses to stop a blocking write where a crash was injected.
pub(super) const SPEC_CRASH: &str = "nri-accel injected crash at spec step ";

/// The spec store hook that stops a write at the engine's named steps.
pub(super) fn spec_hook(hook: CrashHook) -> cdi::StepHook {
    Arc::new(move |step| {
        let point = match step {
            cdi::WriteStep::TempWritten => CrashPoint::AfterSpecTemp,
            cdi::WriteStep::Renamed => CrashPoint::AfterSpecRename,
            cdi::WriteStep::Removed => CrashPoint::AfterSpecRemove,
        };
        if hook(point) == HookAction::Die {
            // Unwinds out of the blocking task only; the engine turns it into
            // EngineError::Crashed and does no clean-up, as a dead process would not.
            std::panic::panic_any(format!("{SPEC_CRASH}{}", point.name()));
        }
    })
}

/// The step named in a spec crash's panic text.
pub(super) fn spec_crash_point(text: &str) -> CrashPoint {
    text.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CrashPoint::AfterSpecTemp)
}

/// The CDI store's form of one result's container edits, plus the environment the claim's
/// configuration sets for its request. The policy's own variables win over the configuration's:
/// they carry the limits of a share or a slice, which a claim must not lift.
pub(super) fn to_cdi(
    e: &policies::ContainerEdits,
    configured: Option<&BTreeMap<String, String>>,
) -> cdi::DeviceEdits {
    let mut env = e.env.clone();
    for (name, value) in configured.into_iter().flatten() {
        if env.iter().any(|(n, _)| n == name) {
            tracing::warn!(variable = %name, "a claim's configuration sets a variable the policy sets; the policy's value is kept");
        } else {
            env.push((name.clone(), value.clone()));
        }
    }
    cdi::DeviceEdits {
        env,
        device_nodes: e.device_nodes.iter().map(node_to_cdi).collect(),
        mounts: e
            .mounts
            .iter()
            .map(|m| cdi::Mount {
                host_path: m.host_path.clone(),
                container_path: m.container_path.clone(),
                options: m.options.clone(),
                kind: None,
            })
            .collect(),
        hooks: e
            .hooks
            .iter()
            .map(|h| cdi::Hook {
                hook_name: h.hook_name.clone(),
                path: h.path.clone(),
                args: h.args.clone(),
                env: h.env.clone(),
                timeout: None,
            })
            .collect(),
    }
}

/// The CDI form of one device node.
pub fn node_to_cdi(n: &policies::DeviceNode) -> cdi::DeviceNode {
    cdi::DeviceNode {
        path: n.path.clone(),
        host_path: n.host_path.clone(),
        kind: Some(match n.kind {
            policies::NodeKind::Char => cdi::DeviceKind::Char,
            policies::NodeKind::Block => cdi::DeviceKind::Block,
        }),
        major: Some(i64::from(n.major)),
        minor: Some(i64::from(n.minor)),
        file_mode: None,
        permissions: Some(n.permissions.clone()),
        uid: None,
        gid: None,
    }
}

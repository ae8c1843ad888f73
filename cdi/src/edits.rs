//! Container edits for one result of a claim, mirroring CDI's `containerEdits`, and their checks.
//!
//! The checks follow the official parser's rules (env `K=V` with a non-empty name, known hook
//! names, device node types `b|c|u|p`, permissions a subset of `rwm`, non-empty paths) and add
//! two of our own: no NUL byte anywhere (no runtime can pass one on) and a positive hook timeout.

use serde::{Deserialize, Serialize};

use crate::CdiError;

/// The edits that grant one result (one device) of a claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceEdits {
    /// Environment variables as `(name, value)`; written as `name=value`.
    pub env: Vec<(String, String)>,
    /// Device nodes to create in the container.
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts to add to the container.
    pub mounts: Vec<Mount>,
    /// OCI hooks to add to the container.
    pub hooks: Vec<Hook>,
}

impl DeviceEdits {
    /// True when the edits would change nothing (CDI refuses such a device).
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
    }
}

/// The type of a device node, as CDI spells it on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// A character device (`c`).
    #[serde(rename = "c")]
    Char,
    /// A block device (`b`).
    #[serde(rename = "b")]
    Block,
    /// An unbuffered character device (`u`).
    #[serde(rename = "u")]
    Unbuffered,
    /// A FIFO (`p`).
    #[serde(rename = "p")]
    Fifo,
}

/// A device node to create in the container (CDI `deviceNodes[]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path of the node inside the container.
    pub path: String,
    /// Path of the node on the host, when it differs (needs cdiVersion 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// Node type; the runtime reads it from the host node when absent.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<DeviceKind>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup permissions, a subset of `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A mount to add to the container (CDI `mounts[]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// Mount options, e.g. `ro`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// File-system type (needs cdiVersion 0.4.0).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// An OCI hook to add to the container (CDI `hooks[]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// One of `prestart`, `createRuntime`, `createContainer`, `startContainer`, `poststart`,
    /// `poststop`.
    pub hook_name: String,
    /// Executable to run.
    pub path: String,
    /// Arguments, including `argv[0]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment as `K=V` strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds, positive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Hook names CDI accepts.
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Checks one result's edits; `claim` and `result` only label the error.
pub(crate) fn validate_edits(claim: &str, result: usize, e: &DeviceEdits) -> Result<(), CdiError> {
    let bad = |field: String, reason: String| CdiError::InvalidEdit {
        claim: claim.to_owned(),
        result,
        field,
        reason,
    };
    if e.is_empty() {
        return Err(CdiError::EmptyEdits {
            claim: claim.to_owned(),
            reason: format!("result {result} has no env, device nodes, mounts or hooks"),
        });
    }
    for (i, (k, v)) in e.env.iter().enumerate() {
        if k.is_empty() {
            return Err(bad(format!("env[{i}]"), "empty variable name".into()));
        }
        if k.contains('=') {
            return Err(bad(format!("env[{i}]"), format!("name {k:?} contains '='")));
        }
        no_nul(k, || format!("env[{i}] name")).map_err(|r| bad(r.0, r.1))?;
        no_nul(v, || format!("env[{i}] value")).map_err(|r| bad(r.0, r.1))?;
    }
    for (i, d) in e.device_nodes.iter().enumerate() {
        let f = |n: &str| format!("deviceNodes[{i}].{n}");
        non_empty_path(&d.path, || f("path")).map_err(|r| bad(r.0, r.1))?;
        if let Some(h) = &d.host_path {
            non_empty_path(h, || f("hostPath")).map_err(|r| bad(r.0, r.1))?;
        }
        if let Some(p) = &d.permissions {
            let mut seen = [false; 3];
            for c in p.chars() {
                let slot = match c {
                    'r' => 0,
                    'w' => 1,
                    'm' => 2,
                    _ => {
                        return Err(bad(
                            f("permissions"),
                            format!("{p:?} is not a subset of \"rwm\""),
                        ));
                    }
                };
                if std::mem::replace(&mut seen[slot], true) {
                    return Err(bad(f("permissions"), format!("{p:?} repeats {c:?}")));
                }
            }
            if p.is_empty() {
                return Err(bad(f("permissions"), "empty; omit it instead".into()));
            }
        }
        if d.kind == Some(DeviceKind::Fifo) && (d.major.is_some() || d.minor.is_some()) {
            return Err(bad(f("major"), "a FIFO has no major/minor numbers".into()));
        }
        if d.major.is_some() != d.minor.is_some() {
            return Err(bad(
                f("minor"),
                "give both major and minor or neither".into(),
            ));
        }
    }
    for (i, m) in e.mounts.iter().enumerate() {
        let f = |n: &str| format!("mounts[{i}].{n}");
        non_empty_path(&m.host_path, || f("hostPath")).map_err(|r| bad(r.0, r.1))?;
        non_empty_path(&m.container_path, || f("containerPath")).map_err(|r| bad(r.0, r.1))?;
        for (j, o) in m.options.iter().enumerate() {
            no_nul(o, || f(&format!("options[{j}]"))).map_err(|r| bad(r.0, r.1))?;
        }
        if let Some(t) = &m.kind {
            no_nul(t, || f("type")).map_err(|r| bad(r.0, r.1))?;
        }
    }
    for (i, h) in e.hooks.iter().enumerate() {
        let f = |n: &str| format!("hooks[{i}].{n}");
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(bad(
                f("hookName"),
                format!("{:?} is not one of {}", h.hook_name, HOOK_NAMES.join(", ")),
            ));
        }
        non_empty_path(&h.path, || f("path")).map_err(|r| bad(r.0, r.1))?;
        for (j, a) in h.args.iter().enumerate() {
            no_nul(a, || f(&format!("args[{j}]"))).map_err(|r| bad(r.0, r.1))?;
        }
        for (j, kv) in h.env.iter().enumerate() {
            match kv.split_once('=') {
                Some((k, _)) if !k.is_empty() => {}
                _ => {
                    return Err(bad(
                        f(&format!("env[{j}]")),
                        format!("{kv:?} is not NAME=VALUE with a non-empty name"),
                    ));
                }
            }
            no_nul(kv, || f(&format!("env[{j}]"))).map_err(|r| bad(r.0, r.1))?;
        }
        if let Some(t) = h.timeout
            && !(1..=i64::from(u32::MAX)).contains(&t)
        {
            return Err(bad(
                f("timeout"),
                format!("{t} is not a positive number of seconds"),
            ));
        }
    }
    Ok(())
}

fn no_nul(s: &str, field: impl Fn() -> String) -> Result<(), (String, String)> {
    if s.contains('\0') {
        return Err((field(), format!("{s:?} contains a NUL byte")));
    }
    Ok(())
}

fn non_empty_path(s: &str, field: impl Fn() -> String) -> Result<(), (String, String)> {
    if s.is_empty() {
        return Err((field(), "empty path".into()));
    }
    no_nul(s, field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str) -> DeviceEdits {
        DeviceEdits {
            device_nodes: vec![DeviceNode {
                path: path.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn err(e: &DeviceEdits) -> String {
        validate_edits("c1", 0, e).unwrap_err().to_string()
    }

    #[test]
    fn refuses_empty_edits() {
        assert!(err(&DeviceEdits::default()).contains("no env, device nodes"));
    }

    #[test]
    fn env_rules() {
        let mut e = node("/dev/x");
        e.env = vec![("".into(), "v".into())];
        assert!(err(&e).contains("env[0]"));
        e.env = vec![("A=B".into(), "v".into())];
        assert!(err(&e).contains("\"A=B\""));
        e.env = vec![("A".into(), "x\0".into())];
        assert!(err(&e).contains("NUL"));
        e.env = vec![("A".into(), "=b=c".into())];
        validate_edits("c1", 0, &e).unwrap();
    }

    #[test]
    fn device_node_rules() {
        assert!(err(&node("")).contains("deviceNodes[0].path"));
        let mut e = node("/dev/x");
        e.device_nodes[0].permissions = Some("rwx".into());
        assert!(err(&e).contains("permissions"));
        e.device_nodes[0].permissions = Some("rr".into());
        assert!(err(&e).contains("repeats"));
        e.device_nodes[0].permissions = Some("mrw".into());
        validate_edits("c1", 0, &e).unwrap();
        e.device_nodes[0].major = Some(1);
        assert!(err(&e).contains("both major and minor"));
        e.device_nodes[0].minor = Some(3);
        e.device_nodes[0].kind = Some(DeviceKind::Fifo);
        assert!(err(&e).contains("FIFO"));
    }

    #[test]
    fn mount_and_hook_rules() {
        let mut e = node("/dev/x");
        e.mounts = vec![Mount {
            host_path: "/h".into(),
            container_path: "".into(),
            ..Default::default()
        }];
        assert!(err(&e).contains("mounts[0].containerPath"));
        e.mounts.clear();
        e.hooks = vec![Hook {
            hook_name: "preStart".into(),
            path: "/bin/true".into(),
            ..Default::default()
        }];
        assert!(err(&e).contains("\"preStart\""));
        e.hooks[0].hook_name = "createContainer".into();
        e.hooks[0].env = vec!["=x".into()];
        assert!(err(&e).contains("hooks[0].env[0]"));
        e.hooks[0].env = vec!["A=1".into()];
        e.hooks[0].timeout = Some(0);
        assert!(err(&e).contains("timeout"));
        e.hooks[0].timeout = Some(5);
        validate_edits("c1", 0, &e).unwrap();
    }
}

//! Checks on values that parsed but make no sense (run after parsing).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use policies::{Device, DeviceNode, FamilyConfig, PoolConfig};

use super::Config;
use super::problem::{Checked, fail};
use super::same_device;
use super::spans::Step::{self, Index, Key};

/// Largest accepted `claims_api.max_connections`.
const MAX_CONNECTIONS: u32 = 65_536;

/// Largest accepted `claims_api.max_message_bytes`.
const MAX_MESSAGE_LIMIT: u32 = 64 * 1024 * 1024;
/// The smallest `claims_api.max_message_bytes` accepted.
const MIN_MESSAGE_LIMIT: u32 = 4096;

/// Checks the whole config; the first problem found is returned.
pub(crate) fn validate(cfg: &Config) -> Checked {
    absolute(&cfg.state_dir, vec![Key("state_dir")])?;
    absolute(&cfg.nri.socket, vec![Key("nri"), Key("socket")])?;
    let idx = &cfg.nri.plugin_index;
    if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        fail(
            vec![Key("nri"), Key("plugin_index")],
            format!("plugin index {idx:?} must be exactly two digits, e.g. \"10\""),
        )?;
    }
    let name = &cfg.nri.plugin_name;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b))
    {
        fail(
            vec![Key("nri"), Key("plugin_name")],
            format!("plugin name {name:?} must be non-empty and use only [a-zA-Z0-9_.+-]"),
        )?;
    }
    absolute(
        &cfg.claims_api.socket,
        vec![Key("claims_api"), Key("socket")],
    )?;
    if let Some(group) = &cfg.claims_api.group
        && (group.is_empty() || group.contains(['/', ':', '\n']))
    {
        fail(
            vec![Key("claims_api"), Key("group")],
            format!("group {group:?} is not a valid group name; give a group name or null"),
        )?;
    }
    let max = cfg.claims_api.max_message_bytes;
    if !(MIN_MESSAGE_LIMIT..=MAX_MESSAGE_LIMIT).contains(&max) {
        fail(
            vec![Key("claims_api"), Key("max_message_bytes")],
            format!(
                "max_message_bytes {max} must be between {MIN_MESSAGE_LIMIT} and {MAX_MESSAGE_LIMIT}"
            ),
        )?;
    }
    let conns = cfg.claims_api.max_connections;
    if !(1..=MAX_CONNECTIONS).contains(&conns) {
        fail(
            vec![Key("claims_api"), Key("max_connections")],
            format!("max_connections {conns} must be between 1 and {MAX_CONNECTIONS}"),
        )?;
    }
    absolute(&cfg.cdi.dir, vec![Key("cdi"), Key("dir")])?;
    cdi_name(&cfg.cdi.vendor, true, vec![Key("cdi"), Key("vendor")])?;
    cdi_name(&cfg.cdi.class, false, vec![Key("cdi"), Key("class")])?;
    absolute(&cfg.discovery.root, vec![Key("discovery"), Key("root")])?;
    static_devices(&cfg.discovery.static_devices)?;
    pools(&cfg.pools)?;
    let prefix = &cfg.annotations.prefix;
    if prefix.is_empty()
        || prefix.len() > 253
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        fail(
            vec![Key("annotations"), Key("prefix")],
            format!(
                "annotation prefix {prefix:?} must be a DNS subdomain ([a-z0-9.-], at most 253 characters)"
            ),
        )?;
    }
    let driver = &cfg.dra.driver_name;
    if !crate::names::is_driver_name(driver) {
        fail(
            vec![Key("dra"), Key("driver_name")],
            format!(
                "driver name {driver:?} must be a DNS subdomain ([a-z0-9.-]) of at most 63 characters, e.g. accel.nri.io"
            ),
        )?;
    }
    if let Some(path) = &cfg.kubernetes.kubeconfig {
        absolute(path, vec![Key("kubernetes"), Key("kubeconfig")])?;
    }
    dra(cfg)?;
    if let Some(addr) = cfg.metrics.listen
        && !addr.ip().is_loopback()
    {
        fail(
            vec![Key("metrics"), Key("listen")],
            format!("metrics address {addr} is not a loopback address; use 127.0.0.1 or [::1]"),
        )?;
    }
    super::validate_device_plugin::validate(cfg)?;
    Ok(())
}

/// The `dra` section's kubelet directories (absolute) and the node name (a DNS subdomain).
fn dra(cfg: &Config) -> Checked {
    absolute(
        &cfg.dra.plugins_registry_dir,
        vec![Key("dra"), Key("plugins_registry_dir")],
    )?;
    absolute(&cfg.dra.plugins_dir, vec![Key("dra"), Key("plugins_dir")])?;
    if cfg.dra.max_connections == 0 {
        fail(
            vec![Key("dra"), Key("max_connections")],
            "max_connections must be at least 1: the kubelet needs a connection to each socket",
        )?;
    }
    for (i, name) in cfg.dra.pools.iter().enumerate() {
        if !cfg.pools.iter().any(|p| p.name == *name) {
            fail(
                vec![Key("dra"), Key("pools"), Index(i)],
                format!("dra.pools names pool {name:?}, which is not defined in pools"),
            )?;
        }
    }
    let node = &cfg.kubernetes.node_name;
    if !node.is_empty() && !crate::names::is_dns_subdomain(node) {
        fail(
            vec![Key("kubernetes"), Key("node_name")],
            format!(
                "node name {node:?} must be a DNS subdomain ([a-z0-9.-], at most 253 characters) as Kubernetes names nodes"
            ),
        )?;
    }
    Ok(())
}

fn absolute(path: &Path, at: Vec<Step>) -> Checked {
    if path.is_absolute() {
        Ok(())
    } else {
        fail(
            at,
            format!("path {:?} must be absolute", path.display().to_string()),
        )
    }
}

/// CDI vendor/class: start with a letter, end with a letter or digit, middle `[A-Za-z0-9_.-]`
/// (no `.` in a class: old kubelets reject it).
fn cdi_name(name: &str, allow_dot: bool, at: Vec<Step>) -> Checked {
    let b = name.as_bytes();
    let ok = b.first().is_some_and(u8::is_ascii_alphabetic)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|c| {
            c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-' || (allow_dot && *c == b'.')
        });
    if ok {
        Ok(())
    } else {
        let allowed = if allow_dot {
            "[A-Za-z0-9_.-]"
        } else {
            "[A-Za-z0-9_-]"
        };
        fail(
            at,
            format!(
                "CDI name {name:?} must start with a letter, end with a letter or digit and use only {allowed}"
            ),
        )
    }
}

fn pci_id_ok(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() == 9
        && b[4] == b':'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || c.is_ascii_hexdigit())
}

fn static_devices(devices: &[Device]) -> Checked {
    let mut ids = HashSet::new();
    // Which entry first had each device node and PCI address: one device under two ids would
    // be published and granted twice (see `same_device`).
    let mut node_owner = HashMap::new();
    let mut pci_owner = HashMap::new();
    for (i, d) in devices.iter().enumerate() {
        let at = |rest: &[Step]| {
            let mut p = vec![Key("discovery"), Key("static_devices"), Index(i)];
            p.extend_from_slice(rest);
            p
        };
        if d.id.is_empty() || d.id.len() > 128 || d.id.chars().any(char::is_control) {
            fail(
                at(&[Key("id")]),
                "device id must be 1 to 128 printable characters",
            )?;
        }
        if !ids.insert(d.id.as_str()) {
            fail(
                at(&[Key("id")]),
                format!("device id {:?} is listed twice", d.id),
            )?;
        }
        if d.vendor.is_empty() {
            fail(
                at(&[Key("vendor")]),
                format!("device {:?} needs a vendor", d.id),
            )?;
        }
        if let Some(p) = &d.pci_id
            && !pci_id_ok(p)
        {
            fail(
                at(&[Key("pci_id")]),
                format!("PCI id {p:?} must be vvvv:dddd in hex"),
            )?;
        }
        for (j, n) in d.nodes.iter().enumerate() {
            node(n, at(&[Key("nodes"), Index(j)]))?;
        }
        let twice = |what: String, first: usize| {
            format!(
                "device {:?} has {what}, which device {:?} (discovery.static_devices[{first}]) has too: one device under two ids would be granted twice; list each device once",
                d.id, devices[first].id
            )
        };
        if let Some(p) = &d.pci_address {
            let key = same_device::pci_key(p);
            let first = *pci_owner.entry(key.clone()).or_insert(i);
            if first != i {
                fail(
                    at(&[Key("pci_address")]),
                    twice(format!("PCI address {key}"), first),
                )?;
            }
        }
        for (j, n) in d.nodes.iter().enumerate() {
            let first = *node_owner.entry(same_device::node_key(n)).or_insert(i);
            if first != i {
                fail(
                    at(&[Key("nodes"), Index(j)]),
                    twice(format!("device node {}", same_device::node_words(n)), first),
                )?;
            }
        }
        for (j, n) in d.control_nodes.iter().enumerate() {
            node(n, at(&[Key("control_nodes"), Index(j)]))?;
        }
    }
    Ok(())
}

fn node(n: &DeviceNode, at: Vec<Step>) -> Checked {
    let with = |k| {
        let mut p = at.clone();
        p.push(Key(k));
        p
    };
    if !n.path.starts_with("/dev/") {
        fail(
            with("path"),
            format!("device node path {:?} must be under /dev/", n.path),
        )?;
    }
    if let Some(h) = &n.host_path
        && !h.starts_with('/')
    {
        fail(
            with("host_path"),
            format!("host path {h:?} must be absolute"),
        )?;
    }
    let p = &n.permissions;
    if p.is_empty() || !p.chars().all(|c| "rwm".contains(c)) {
        fail(
            with("permissions"),
            format!("permissions {p:?} must be a non-empty subset of \"rwm\""),
        )?;
    }
    Ok(())
}

fn pools(pools: &[PoolConfig]) -> Checked {
    if pools.is_empty() {
        fail(
            vec![Key("pools")],
            "at least one pool is needed, or no device can be handed out",
        )?;
    }
    let mut names = HashSet::new();
    for (i, pool) in pools.iter().enumerate() {
        let at = |rest: &[Step]| {
            let mut p = vec![Key("pools"), Index(i)];
            p.extend_from_slice(rest);
            p
        };
        let n = &pool.name;
        if n.is_empty()
            || n.len() > 63
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            fail(
                at(&[Key("name")]),
                format!("pool name {n:?} must be 1 to 63 characters of [a-zA-Z0-9_.-]"),
            )?;
        }
        if !names.insert(n.as_str()) {
            fail(
                at(&[Key("name")]),
                format!("pool name {n:?} is used twice; pool names must be unique"),
            )?;
        }
        if let Some(p) = &pool.select.pci_id
            && !pci_id_ok(p)
        {
            fail(
                at(&[Key("select"), Key("pci_id")]),
                format!("PCI id {p:?} must be vvvv:dddd in hex"),
            )?;
        }
        match &pool.family {
            FamilyConfig::Exclusive => {}
            FamilyConfig::Shared {
                replicas,
                compute_percent_per_share,
                ..
            } => {
                if *replicas == 0 {
                    fail(
                        at(&[Key("family"), Key("replicas")]),
                        format!("pool {n:?}: replicas must be at least 1"),
                    )?;
                }
                if *compute_percent_per_share > 100 {
                    fail(
                        at(&[Key("family"), Key("compute_percent_per_share")]),
                        format!("pool {n:?}: compute_percent_per_share must be 0 to 100"),
                    )?;
                }
            }
            FamilyConfig::Sliced { slots, profiles } => {
                if *slots == 0 {
                    fail(
                        at(&[Key("family"), Key("slots")]),
                        format!("pool {n:?}: slots must be at least 1"),
                    )?;
                }
                if profiles.is_empty() {
                    fail(
                        at(&[Key("family"), Key("profiles")]),
                        format!("pool {n:?}: a sliced pool needs at least one profile"),
                    )?;
                }
                let mut pnames = HashSet::new();
                for (j, prof) in profiles.iter().enumerate() {
                    let pat = |k| at(&[Key("family"), Key("profiles"), Index(j), Key(k)]);
                    if prof.name.is_empty() || !pnames.insert(prof.name.as_str()) {
                        fail(
                            pat("name"),
                            format!(
                                "pool {n:?}: profile name {:?} is empty or used twice",
                                prof.name
                            ),
                        )?;
                    }
                    if prof.size == 0 {
                        fail(
                            pat("size"),
                            format!(
                                "pool {n:?}: profile {:?} has size 0; a slice covers at least one slot",
                                prof.name
                            ),
                        )?;
                    }
                    if prof.starts.is_empty() {
                        fail(
                            pat("starts"),
                            format!(
                                "pool {n:?}: profile {:?} needs at least one start slot",
                                prof.name
                            ),
                        )?;
                    }
                    for &s in &prof.starts {
                        if u64::from(s) + u64::from(prof.size) > u64::from(*slots) {
                            fail(
                                pat("starts"),
                                format!(
                                    "pool {n:?}: profile {:?} starting at slot {s} with size {} runs past the {slots} slots",
                                    prof.name, prof.size
                                ),
                            )?;
                        }
                    }
                }
            }
            FamilyConfig::Custom { policy, .. } => {
                if policy.is_empty() {
                    fail(
                        at(&[Key("family"), Key("policy")]),
                        format!("pool {n:?}: a custom family needs a policy name"),
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// The range of whole numbers the field at `path` (`claims_api.max_message_bytes`,
/// `pools[0].family.replicas`) accepts, where it is narrower than its type's: a value of the
/// wrong type is then answered with the field's range, not the type's.
pub(super) fn field_range(path: &str) -> Option<String> {
    let last = path.rsplit('.').next().unwrap_or(path);
    let range = match (path, last) {
        ("claims_api.max_message_bytes", _) => {
            format!("{MIN_MESSAGE_LIMIT} to {MAX_MESSAGE_LIMIT}")
        }
        ("claims_api.max_connections", _) => format!("1 to {MAX_CONNECTIONS}"),
        (p, "replicas") if p.starts_with("pools[") => "1 to 4294967295".to_string(),
        (p, "slots") if p.starts_with("pools[") => format!("1 to {}", policies::MAX_SLOTS),
        (p, "compute_percent_per_share") if p.starts_with("pools[") => "0 to 100".to_string(),
        _ => return None,
    };
    Some(range)
}

//! What the `device_plugin` section means, short of the inventory: the pools it serves, the
//! resource names they get and whether a static slice layout fits its pool. Pure functions of the
//! config: the config's checks refuse what they cannot serve, and the kubelet side
//! (kubelet/device_plugin/layout.rs) builds what each plugin advertises from them, so the config
//! needs nothing of the kubelet side.

use policies::{FamilyConfig, PoolConfig};

use super::{DevicePluginConfig, SliceAt};

/// Keeps `[A-Za-z0-9_.-]` and turns everything else into `-`.
pub(crate) fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The distinct profiles of a layout, in first-use order.
pub(crate) fn profiles(slices: &[SliceAt]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for s in slices {
        if !out.contains(&s.profile.as_str()) {
            out.push(&s.profile);
        }
    }
    out
}

/// The resource names a served pool gets: its name in `resource_names`, else
/// `<prefix>/<pool>`, or one per profile of a static layout that mixes profiles.
pub fn resource_names(cfg: &DevicePluginConfig, pool: &PoolConfig) -> Vec<String> {
    if let Some(name) = cfg.resource_names.get(&pool.name) {
        return vec![name.clone()];
    }
    let base = format!("{}/{}", cfg.resource_prefix, pool.name);
    match cfg.slice_layouts.get(&pool.name) {
        Some(slices) if profiles(slices).len() > 1 => profiles(slices)
            .into_iter()
            .map(|p| format!("{base}-{}", sanitize(p)))
            .collect(),
        _ => vec![base],
    }
}

/// Checks a static slice layout against its pool: the pool is sliced, the layout names only its
/// profiles at their allowed start slots, and no two slices overlap. The error says which.
pub fn check(pool: &PoolConfig, slices: &[SliceAt]) -> Result<(), String> {
    let FamilyConfig::Sliced {
        slots,
        profiles: defined,
    } = &pool.family
    else {
        return Err(format!(
            "the pool is of family {}, and only sliced pools have a slice layout",
            pool.family.kind()
        ));
    };
    if slices.is_empty() {
        return Err("the layout names no slice; remove it to advertise whole devices".into());
    }
    let mut taken: Vec<Option<&SliceAt>> = vec![None; *slots as usize];
    for s in slices {
        let Some(p) = defined.iter().find(|p| p.name == s.profile) else {
            let names: Vec<&str> = defined.iter().map(|p| p.name.as_str()).collect();
            return Err(format!(
                "profile {} is not defined in the pool (it defines {})",
                s.profile,
                names.join(", ")
            ));
        };
        if !p.starts.contains(&s.start) {
            return Err(format!(
                "profile {} may not start at slot {} (allowed: {})",
                s.profile,
                s.start,
                p.starts
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let end = u64::from(s.start) + u64::from(p.size);
        if end > u64::from(*slots) {
            return Err(format!(
                "slice {}@{} runs past the device's {slots} slots",
                s.profile, s.start
            ));
        }
        for slot in s.start..s.start + p.size {
            if let Some(other) = taken[slot as usize].replace(s) {
                return Err(format!(
                    "slices {}@{} and {}@{} overlap at slot {slot}; the device plugin API cannot express overlapping slices",
                    other.profile, other.start, s.profile, s.start
                ));
            }
        }
    }
    Ok(())
}

/// The pools served: those listed, else every pool of a built-in family.
pub fn served<'a>(cfg: &'a DevicePluginConfig, pools: &'a [PoolConfig]) -> Vec<&'a PoolConfig> {
    pools
        .iter()
        .filter(|p| {
            if cfg.pools.is_empty() {
                !matches!(p.family, FamilyConfig::Custom { .. })
            } else {
                cfg.pools.contains(&p.name)
            }
        })
        .collect()
}

/// The env variable KubeVirt's virt-launcher reads the PCI addresses of a host device resource
/// from: `PCI_RESOURCE_` and the resource name upper-cased with `.` and `/` turned into `_`
/// (KubeVirt's `ResourceNameToEnvVar` in pkg/util, read by
/// pkg/virt-launcher/virtwrap/device/hostdevice/addresspool.go). Its value is the addresses,
/// comma-separated, one per device allocated.
pub fn kubevirt_pci_env(resource: &str) -> String {
    let name: String = resource
        .chars()
        .map(|c| match c {
            '.' | '/' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    format!("PCI_RESOURCE_{name}")
}

/// Whether `text` is a DNS subdomain: dot-separated labels of `[a-z0-9-]`, each 1 to 63
/// characters not starting or ending with `-`, at most 253 characters in all.
pub(crate) fn is_dns_subdomain(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Whether `name` is a valid extended resource name: `<DNS subdomain>/<name>`, the name 1 to 63
/// characters of `[A-Za-z0-9_.-]` starting and ending with a letter or digit.
pub fn resource_name_ok(name: &str) -> bool {
    let Some((prefix, tail)) = name.split_once('/') else {
        return false;
    };
    let b = tail.as_bytes();
    !prefix.is_empty()
        && !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

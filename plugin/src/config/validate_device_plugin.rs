//! Checks on the `device_plugin` section: the resource names it gives, the pools it serves and
//! the static slice layouts (no overlap, only the pool's own profiles and start slots).

use std::collections::HashSet;

use policies::FamilyConfig;

use super::Config;
use super::device_plugin::{
    check, is_dns_subdomain, profiles, resource_name_ok, resource_names, served,
};
use super::problem::{Checked, fail};
use super::spans::Step::{self, Index, Key};

fn at(rest: &[Step]) -> Vec<Step> {
    let mut p = vec![Key("device_plugin")];
    p.extend_from_slice(rest);
    p
}

/// Checks the section; checked whether or not it is enabled, so a config is never valid only
/// until someone turns the device plugins on.
pub(crate) fn validate(cfg: &Config) -> Checked {
    let dp = &cfg.device_plugin;
    let prefix = &dp.resource_prefix;
    if !is_dns_subdomain(prefix) {
        fail(
            at(&[Key("resource_prefix")]),
            format!(
                "resource prefix {prefix:?} must be a DNS subdomain such as accel.nri.io ([a-z0-9.-], at most 253 characters)"
            ),
        )?;
    }
    if dp.max_connections == 0 {
        fail(
            at(&[Key("max_connections")]),
            "max_connections must be at least 1: the kubelet needs a connection to each plugin socket",
        )?;
    }
    if !dp.dir.is_absolute() {
        fail(
            at(&[Key("dir")]),
            format!("path {:?} must be absolute", dp.dir.display().to_string()),
        )?;
    }
    let mut seen = HashSet::new();
    for (i, name) in dp.pools.iter().enumerate() {
        let Some(pool) = cfg.pools.iter().find(|p| p.name == *name) else {
            fail(
                at(&[Key("pools"), Index(i)]),
                format!("device_plugin.pools names pool {name:?}, which is not defined in pools"),
            )?;
            continue;
        };
        if matches!(pool.family, FamilyConfig::Custom { .. }) {
            fail(
                at(&[Key("pools"), Index(i)]),
                format!(
                    "pool {name:?} is of a custom family, which the device plugin API cannot serve; serve it through DRA or the claims API"
                ),
            )?;
        }
        if !seen.insert(name) {
            fail(
                at(&[Key("pools"), Index(i)]),
                format!("pool {name:?} is listed twice"),
            )?;
        }
    }
    for (pool_name, slices) in &dp.slice_layouts {
        let path = at(&[Key("slice_layouts")]);
        let Some(pool) = cfg.pools.iter().find(|p| p.name == *pool_name) else {
            return fail(
                path,
                format!("slice layout for pool {pool_name:?}, which is not defined in pools"),
            );
        };
        if let Err(why) = check(pool, slices) {
            return fail(path, format!("slice layout of pool {pool_name:?}: {why}"));
        }
    }
    for (pool_name, name) in &dp.resource_names {
        let path = at(&[Key("resource_names")]);
        if !cfg.pools.iter().any(|p| p.name == *pool_name) {
            fail(
                path.clone(),
                format!("resource name for pool {pool_name:?}, which is not defined in pools"),
            )?;
        }
        let domain_ok = name
            .split_once('/')
            .is_some_and(|(d, _)| is_dns_subdomain(d));
        if !domain_ok || !resource_name_ok(name) {
            fail(
                path.clone(),
                format!(
                    "pool {pool_name:?}: {name:?} is not a resource name of the form vendor.com/model (a DNS subdomain, a /, then 1 to 63 characters of [A-Za-z0-9_.-] starting and ending with a letter or digit)"
                ),
            )?;
        }
        if dp
            .slice_layouts
            .get(pool_name)
            .is_some_and(|l| profiles(l).len() > 1)
        {
            fail(
                path,
                format!(
                    "pool {pool_name:?} has a slice layout that mixes profiles, which gives one resource per profile; it cannot take one resource name"
                ),
            )?;
        }
    }
    let mut names = HashSet::new();
    for pool in served(dp, &cfg.pools) {
        for name in resource_names(dp, pool) {
            if !names.insert(name.clone()) {
                fail(
                    at(&[Key("resource_names")]),
                    format!(
                        "two resources would be advertised as {name:?} (pool {:?} is one); give each pool its own name",
                        pool.name
                    ),
                )?;
            }
            if !resource_name_ok(&name) {
                fail(
                    at(&[Key("resource_prefix")]),
                    format!(
                        "pool {:?} would be advertised as {name:?}, which is not a valid resource name (the part after the / must be 1 to 63 characters of [A-Za-z0-9_.-], starting and ending with a letter or digit); rename the pool or profile",
                        pool.name
                    ),
                )?;
            }
        }
    }
    Ok(())
}

//! What each device plugin advertises, as a pure function of the config and the inventory: the
//! resources (one per served pool, or one per profile of a sliced pool whose static layout mixes
//! profiles) and their kubelet device IDs, each standing for one unit of one device.
//!
//! IDs: a whole device is advertised under its inventory id (`gpu0`; its UUID with
//! `device_ids: uuid`), a replica of a shared
//! device as `<id>::<n>`, a slice of a static layout as `<id>::<profile>@<start>`.

use std::collections::BTreeMap;

use policies::{FamilyConfig, Node, PoolConfig, Unit};

use crate::config::device_plugin::{profiles, resource_names, sanitize, served};
use crate::config::{DeviceIds, DevicePluginConfig};

/// One advertised device: a unit of a device of the resource's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertised {
    /// The kubelet's device ID.
    pub id: String,
    /// The inventory device.
    pub device_id: String,
    /// The unit the ID stands for.
    pub unit: Unit,
    /// The device's NUMA node, if known.
    pub numa: Option<u32>,
}

/// One extended resource served by one device plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The resource name, `<prefix>/<pool>` (or `<prefix>/<pool>-<profile>`).
    pub name: String,
    /// The pool its devices belong to.
    pub pool: String,
    /// The plugin's socket file name in the device-plugins directory.
    pub socket: String,
    /// What it advertises, sorted by device then unit.
    pub devices: Vec<Advertised>,
    /// Device ID -> index in `devices`.
    index: BTreeMap<String, usize>,
}

impl Resource {
    /// A resource advertising `devices` (their IDs unique).
    pub fn new(name: String, pool: String, socket: String, devices: Vec<Advertised>) -> Self {
        let index = devices
            .iter()
            .enumerate()
            .map(|(i, a)| (a.id.clone(), i))
            .collect();
        Resource {
            name,
            pool,
            socket,
            devices,
            index,
        }
    }

    /// The advertised device with this kubelet ID.
    pub fn get(&self, id: &str) -> Option<&Advertised> {
        self.index.get(id).map(|&i| &self.devices[i])
    }

    /// The kubelet ID of `unit` of `device_id`, if this resource advertises it.
    pub fn id_of(&self, device_id: &str, unit: &Unit) -> Option<&str> {
        self.devices
            .iter()
            .find(|a| a.device_id == device_id && a.unit == *unit)
            .map(|a| a.id.as_str())
    }
}

/// The resources and the devices each advertises, for the pools of `pools` that `cfg` serves,
/// over the inventory of `node`. Pools with no device still get a resource (advertising none),
/// so the kubelet sees them at zero rather than not at all.
pub fn plan(cfg: &DevicePluginConfig, pools: &[PoolConfig], node: &Node) -> Vec<Resource> {
    let mut out = Vec::new();
    for pool in served(cfg, pools) {
        let devices = node.pool_devices(&pool.name).unwrap_or_default();
        let names = resource_names(cfg, pool);
        let layout = cfg.slice_layouts.get(&pool.name);
        // One group of units per resource: (resource name, units of one device).
        let groups: Vec<(String, Vec<(String, Unit)>)> = match (&pool.family, layout) {
            (FamilyConfig::Shared { replicas, .. }, _) => vec![(
                names[0].clone(),
                (0..*replicas)
                    .map(|n| (format!("::{n}"), Unit::Share { index: n, count: 1 }))
                    .collect(),
            )],
            (
                FamilyConfig::Sliced {
                    profiles: defined, ..
                },
                Some(slices),
            ) => {
                let per_profile = names.len() > 1;
                profiles(slices)
                    .into_iter()
                    .enumerate()
                    .map(|(k, profile)| {
                        let units = slices
                            .iter()
                            .filter(|s| !per_profile || s.profile == profile)
                            .filter_map(|s| {
                                let p = defined.iter().find(|p| p.name == s.profile)?;
                                Some((
                                    format!("::{}@{}", s.profile, s.start),
                                    Unit::Slice {
                                        profile: s.profile.clone(),
                                        start: s.start,
                                        size: p.size,
                                    },
                                ))
                            })
                            .collect();
                        (names[if per_profile { k } else { 0 }].clone(), units)
                    })
                    .take(names.len())
                    .collect()
            }
            _ => vec![(names[0].clone(), vec![(String::new(), Unit::Whole)])],
        };
        for (name, units) in groups {
            let mut advertised = Vec::new();
            for d in devices {
                let base = match (cfg.device_ids, &d.uuid) {
                    (DeviceIds::Uuid, Some(uuid)) => uuid,
                    _ => &d.id,
                };
                for (suffix, unit) in &units {
                    advertised.push(Advertised {
                        id: format!("{base}{suffix}"),
                        device_id: d.id.clone(),
                        unit: unit.clone(),
                        numa: d.numa_node,
                    });
                }
            }
            let tail = name.rsplit('/').next().unwrap_or(&name);
            let socket = format!("nri-accel-{}.sock", sanitize(tail));
            out.push(Resource::new(name, pool.name.clone(), socket, advertised));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SliceAt;
    use crate::config::device_plugin::check;
    use policies::{Device, Inventory, ProfileConfig, Registry};

    fn gpu(id: &str, numa: u32) -> Device {
        Device {
            id: id.into(),
            vendor: "nvidia".into(),
            model: String::new(),
            pci_address: None,
            pci_id: None,
            numa_node: Some(numa),
            local_cpus: Default::default(),
            memory_mib: 0,
            compute_units: 0,
            driver: None,
            nodes: vec![],
            control_nodes: vec![],
            uuid: None,
        }
    }

    fn sliced() -> FamilyConfig {
        let p = |name: &str, size: u32, starts: Vec<u32>| ProfileConfig {
            name: name.into(),
            size,
            memory_mib: 0,
            compute_units: 0,
            starts,
        };
        FamilyConfig::Sliced {
            slots: 8,
            profiles: vec![p("1g", 1, (0..8).collect()), p("4g", 4, vec![0, 4])],
        }
    }

    fn at(profile: &str, start: u32) -> SliceAt {
        SliceAt {
            profile: profile.into(),
            start,
        }
    }

    #[test]
    fn every_family_is_advertised_with_its_ids_and_numa() {
        let pools = vec![
            PoolConfig::of_ids("whole", &["g0", "g1"], FamilyConfig::Exclusive),
            PoolConfig::of_ids(
                "shared",
                &["g2"],
                FamilyConfig::Shared {
                    replicas: 3,
                    memory_mib_per_share: 0,
                    compute_percent_per_share: 0,
                },
            ),
            PoolConfig::of_ids("mig", &["g3"], sliced()),
            PoolConfig::of_ids("mixed", &["g4"], sliced()),
            PoolConfig::of_ids("plain", &["g5"], sliced()),
        ];
        let devices = (0..6).map(|i| gpu(&format!("g{i}"), i % 2)).collect();
        let node = Node::new(
            Inventory {
                devices,
                cpus: "0-3".parse().unwrap(),
            },
            &pools,
            &Registry::with_builtins(),
        )
        .unwrap();
        let mut cfg = DevicePluginConfig::default();
        cfg.slice_layouts
            .insert("mig".into(), (0..8).map(|s| at("1g", s)).collect());
        cfg.slice_layouts
            .insert("mixed".into(), vec![at("4g", 0), at("1g", 4), at("1g", 5)]);
        let r = plan(&cfg, &pools, &node);
        let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "accel.nri.io/whole",
                "accel.nri.io/shared",
                "accel.nri.io/mig",
                "accel.nri.io/mixed-4g",
                "accel.nri.io/mixed-1g",
                "accel.nri.io/plain"
            ]
        );
        let ids = |i: usize| -> Vec<&str> { r[i].devices.iter().map(|d| d.id.as_str()).collect() };
        assert_eq!(ids(0), ["g0", "g1"]);
        assert_eq!(r[0].devices[1].numa, Some(1));
        assert_eq!(ids(1), ["g2::0", "g2::1", "g2::2"]);
        assert_eq!(
            r[1].get("g2::1").unwrap().unit,
            Unit::Share { index: 1, count: 1 }
        );
        assert_eq!(ids(2).len(), 8);
        assert_eq!(ids(3), ["g4::4g@0"]);
        assert_eq!(ids(4), ["g4::1g@4", "g4::1g@5"]);
        assert_eq!(ids(5), ["g5"]);
        assert_eq!(r[5].devices[0].unit, Unit::Whole);
        assert_eq!(r[3].socket, "nri-accel-mixed-4g.sock");
        assert_eq!(
            r[1].id_of("g2", &Unit::Share { index: 2, count: 1 }),
            Some("g2::2")
        );

        // Only the listed pools when a list is given.
        cfg.pools = vec!["shared".into()];
        assert_eq!(plan(&cfg, &pools, &node).len(), 1);
    }

    #[test]
    fn layouts_are_checked_against_the_pool() {
        let p = PoolConfig::of_ids("mig", &[], sliced());
        assert!(check(&p, &[at("4g", 0), at("4g", 4)]).is_ok());
        let e = check(&p, &[at("4g", 0), at("1g", 3)]).unwrap_err();
        assert!(e.contains("4g@0 and 1g@3 overlap at slot 3"), "{e}");
        let e = check(&p, &[at("2g", 0)]).unwrap_err();
        assert!(
            e.contains("profile 2g is not defined") && e.contains("1g, 4g"),
            "{e}"
        );
        let e = check(&p, &[at("4g", 2)]).unwrap_err();
        assert!(e.contains("may not start at slot 2 (allowed: 0, 4)"), "{e}");
        assert!(check(&p, &[]).unwrap_err().contains("names no slice"));
        let whole = PoolConfig::of_ids("w", &[], FamilyConfig::Exclusive);
        assert!(
            check(&whole, &[at("1g", 0)])
                .unwrap_err()
                .contains("exclusive")
        );
    }

    #[test]
    fn uuid_device_ids_name_the_gpu_where_it_has_a_uuid() {
        let pools = vec![
            PoolConfig::of_ids("whole", &["g0", "g1"], FamilyConfig::Exclusive),
            PoolConfig::of_ids(
                "shared",
                &["g2"],
                FamilyConfig::Shared {
                    replicas: 2,
                    memory_mib_per_share: 0,
                    compute_percent_per_share: 0,
                },
            ),
        ];
        let mut devices: Vec<Device> = (0..3).map(|i| gpu(&format!("g{i}"), 0)).collect();
        devices[0].uuid = Some("GPU-aaaaaaaa-5f1c-3b7e-a0d2-0000c0ffee00".into());
        devices[2].uuid = Some("GPU-cccccccc-5f1c-3b7e-a0d2-0000c0ffee00".into());
        let inventory = Inventory {
            devices,
            cpus: "0-3".parse().unwrap(),
        };
        let node = Node::new(inventory, &pools, &Registry::with_builtins()).unwrap();
        let mut cfg = DevicePluginConfig::default();
        let by_id = plan(&cfg, &pools, &node);
        assert_eq!(by_id[0].devices[0].id, "g0");
        cfg.device_ids = DeviceIds::Uuid;
        let r = plan(&cfg, &pools, &node);
        let ids: Vec<&str> = r[0].devices.iter().map(|d| d.id.as_str()).collect();
        // g1 has no UUID: its inventory id stands.
        assert_eq!(ids, ["GPU-aaaaaaaa-5f1c-3b7e-a0d2-0000c0ffee00", "g1"]);
        let shares: Vec<&str> = r[1].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            shares,
            [
                "GPU-cccccccc-5f1c-3b7e-a0d2-0000c0ffee00::0",
                "GPU-cccccccc-5f1c-3b7e-a0d2-0000c0ffee00::1"
            ]
        );
        let a = r[0]
            .get("GPU-aaaaaaaa-5f1c-3b7e-a0d2-0000c0ffee00")
            .unwrap();
        assert_eq!((a.device_id.as_str(), &a.unit), ("g0", &Unit::Whole));
    }
}

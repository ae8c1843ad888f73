//! Containers and their cpusets: NUMA-aligned adjustments for starting
//! containers, and the updates that follow the shared CPU pool as claims take
//! and give back accelerator-local CPUs.

use crate::node::{Container, Node};
use crate::{Adjustment, ClaimUid, ContainerUpdate, CpuSet, Placement};

/// Env keys whose values are merged by taking the smallest (a limit).
const MIN_KEYS: [&str; 2] = [
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "ACCEL_SHARE_COMPUTE_PERCENT",
];
/// Env key whose per-device `0=<limit>` values are re-numbered by device order.
const MPS_MEM: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

impl Node {
    /// Records a starting (or running) container, the claims it uses and where it runs now
    /// (`has`), and answers its adjustment: cpuset = the claims' exclusive CPUs if any, else
    /// the shared pool ∩ the devices' local CPUs if that is non-empty, else the shared pool;
    /// mems = the NUMA nodes of those CPUs (none when the node's NUMA layout is unknown); env =
    /// the share and slice limits of its grants. A container with no claims joins the shared
    /// pool. The adjustment sets the cpuset and mems only where they differ from what the
    /// container has, and only for a container whose CPUs the node manages (one with claims,
    /// or any container once a pool gives accelerator-local CPUs); the node then counts the
    /// container as running where it placed it, and an unmanaged one where it runs.
    pub fn container_started(
        &mut self,
        container_id: &str,
        claims: &[ClaimUid],
        has: &Placement,
    ) -> (Adjustment, Vec<ContainerUpdate>) {
        self.forget_container(container_id);
        for uid in claims {
            self.users
                .entry(uid.clone())
                .or_default()
                .insert(container_id.to_string());
        }
        let mut c = Container {
            claims: claims.to_vec(),
            ..Container::default()
        };
        let has_cpus = has
            .cpus
            .clone()
            .unwrap_or_else(|| self.inventory.cpus.clone());
        let has_mems = has.mems.clone().unwrap_or_else(|| self.numa_nodes());
        let mut adjustment = Adjustment {
            env: self.container_env(claims),
            cpus: None,
            mems: None,
        };
        if self.manages_cpus_of(claims) {
            let (cpus, mems) = self.desired(&c);
            if cpus != has_cpus {
                adjustment.cpus = Some(cpus.clone());
            }
            if !mems.is_empty() && mems != has_mems {
                adjustment.mems = Some(mems.clone());
            }
            c.cpus = cpus;
            c.mems = if mems.is_empty() { has_mems } else { mems };
        } else {
            c.cpus = has_cpus;
            c.mems = has_mems;
        }
        self.containers.insert(container_id.to_string(), c);
        // The shared pool did not move: no other container changes.
        (adjustment, Vec::new())
    }

    /// Whether the node manages the cpuset of a container using `claims`: always when it has
    /// claims (they place it near its devices), and for every container once a pool gives
    /// accelerator-local CPUs (the shared pool then moves as claims take and return them).
    fn manages_cpus_of(&self, claims: &[ClaimUid]) -> bool {
        !claims.is_empty() || self.pools.iter().any(|p| p.config.cpus_per_device > 0)
    }

    /// Every NUMA node the node knows of (what an unpinned container may use).
    fn numa_nodes(&self) -> CpuSet {
        self.numa_cpus.keys().copied().collect()
    }

    /// Forgets a container. Its claims keep their CPUs until released, so
    /// this normally yields no update.
    pub fn container_removed(&mut self, container_id: &str) -> Vec<ContainerUpdate> {
        self.forget_container(container_id);
        Vec::new()
    }

    fn forget_container(&mut self, container_id: &str) {
        let Some(old) = self.containers.remove(container_id) else {
            return;
        };
        for uid in &old.claims {
            if let Some(set) = self.users.get_mut(uid) {
                set.remove(container_id);
                if set.is_empty() {
                    self.users.remove(uid);
                }
            }
        }
    }

    /// Containers known, with their claims and current cpusets, by id.
    pub fn containers(&self) -> impl Iterator<Item = (&str, &[ClaimUid], &CpuSet)> {
        self.containers
            .iter()
            .map(|(id, c)| (id.as_str(), c.claims.as_slice(), &c.cpus))
    }

    /// The cpuset and mems a container should have now.
    fn desired(&self, c: &Container) -> (CpuSet, CpuSet) {
        let mut exclusive = CpuSet::new();
        let mut local = CpuSet::new();
        for uid in &c.claims {
            if let Some(a) = self.claims.get(uid) {
                exclusive = exclusive.union(&a.cpus);
                for g in &a.results {
                    if let Some(d) = self.device(&g.device_id) {
                        local = local.union(&d.local_cpus);
                    }
                }
            }
        }
        let cpus = if !exclusive.is_empty() {
            exclusive
        } else {
            let near = self.shared.intersection(&local);
            if near.is_empty() {
                self.shared.clone()
            } else {
                near
            }
        };
        let mems = self
            .numa_cpus
            .iter()
            .filter(|(_, set)| !set.is_disjoint(&cpus))
            .map(|(numa, _)| *numa)
            .collect();
        (cpus, mems)
    }

    /// Recomputes every container's cpuset (the shared pool moved); answers
    /// the ones that changed, by container id.
    pub(crate) fn refresh_containers(&mut self) -> Vec<ContainerUpdate> {
        let ids: Vec<String> = self.containers.keys().cloned().collect();
        self.refresh(ids)
    }

    /// Recomputes the cpusets of the containers using `uid` (the claim came
    /// or went without moving CPUs).
    pub(crate) fn refresh_users_of(&mut self, uid: &str) -> Vec<ContainerUpdate> {
        let ids: Vec<String> = self
            .users
            .get(uid)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        self.refresh(ids)
    }

    /// Answers an update for each of `ids` whose cpuset or mems (where the node's NUMA layout
    /// is known) differ from what it was last given, and records the new ones. Containers whose
    /// CPUs the node does not manage are left where they run.
    fn refresh(&mut self, ids: Vec<String>) -> Vec<ContainerUpdate> {
        let mut updates = Vec::new();
        for id in ids {
            let Some(c) = self.containers.get(&id) else {
                continue;
            };
            if !self.manages_cpus_of(&c.claims) {
                continue;
            }
            let (cpus, mems) = self.desired(c);
            let mems_move = !mems.is_empty() && mems != c.mems;
            if cpus != c.cpus || mems_move {
                updates.push(ContainerUpdate {
                    container_id: id.clone(),
                    cpus: cpus.clone(),
                    mems: mems.clone(),
                });
                if let Some(c) = self.containers.get_mut(&id) {
                    c.cpus = cpus;
                    if !mems.is_empty() {
                        c.mems = mems;
                    }
                }
            }
        }
        updates
    }

    /// The limit env of the claims' grants, merged: percentages take the
    /// smallest, the MPS memory limit lists every device by its order, other
    /// keys join distinct values with `,`.
    fn container_env(&self, claims: &[ClaimUid]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        let mut mps_index = 0;
        for uid in claims {
            let Some(a) = self.claims.get(uid) else {
                continue;
            };
            for g in &a.results {
                let Some(&p) = self.pool_index.get(&g.pool) else {
                    continue;
                };
                for (k, v) in self.pools[p].policy.env(g) {
                    let v = if k == MPS_MEM {
                        let limit = v.split_once('=').map_or(v.as_str(), |(_, l)| l);
                        let v = format!("{mps_index}={limit}");
                        mps_index += 1;
                        v
                    } else {
                        v
                    };
                    match env.iter_mut().find(|(ek, _)| *ek == k) {
                        None => env.push((k, v)),
                        Some((_, old)) if MIN_KEYS.contains(&k.as_str()) => {
                            let a: u64 = old.parse().unwrap_or(u64::MAX);
                            let b: u64 = v.parse().unwrap_or(u64::MAX);
                            *old = a.min(b).to_string();
                        }
                        Some((_, old)) => {
                            if k == MPS_MEM || !old.split(',').any(|x| x == v) {
                                old.push(',');
                                old.push_str(&v);
                            }
                        }
                    }
                }
            }
        }
        env
    }
}

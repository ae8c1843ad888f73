//! The engine's side of device plugin claims (`Origin::DevicePlugin`, docs/device-plugin.md).
//!
//! The kubelet's Allocate carries no pod or container identity and the kubelet never says an
//! allocation ended, so such a claim is tied to its users as the runtime reports them: the first
//! container created with its CDI names is recorded durably (with its pod), and the claim is
//! released when the last container using it is removed, or, after a restart, when its pod is
//! gone from the runtime. A claim no container used yet stays until the kubelet hands its devices
//! to another container (the device plugin layer decides that).

use std::collections::BTreeSet;

use super::{DevicePluginUser, Engine, EngineError, Origin, State};
use crate::checkpoint::Change;

/// A device plugin claim as the device plugin layer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePluginClaim {
    /// The claim UID.
    pub uid: String,
    /// The extended resource.
    pub resource: String,
    /// The kubelet device IDs, sorted.
    pub device_ids: Vec<String>,
    /// When it was allocated (seconds since the Unix epoch).
    pub allocated_at: u64,
    /// The first container that used it, if any did.
    pub user: Option<DevicePluginUser>,
    /// The containers using it now (created, not stopped and not removed), sorted.
    pub users: Vec<String>,
}

/// Device plugin claims that removed container `container_id` used (`used`, the claims the node
/// knew it with, plus those recording it as their first user: after a restart the runtime does
/// not report exited containers) and that no container uses any more.
pub(super) fn left_unused(st: &State, container_id: &str, used: &[String]) -> Vec<String> {
    st.origins
        .iter()
        .filter(|(uid, origin)| match origin {
            Origin::DevicePlugin(dp) => {
                used.contains(uid)
                    || dp
                        .user
                        .as_ref()
                        .is_some_and(|u| u.container_id == container_id)
            }
            _ => false,
        })
        .map(|(uid, _)| uid)
        .filter(|uid| st.node.users_of(uid).next().is_none())
        .cloned()
        .collect()
}

impl Engine {
    /// Every device plugin claim with its users now.
    pub fn device_plugin_claims(&self) -> Vec<DevicePluginClaim> {
        let st = self.state();
        st.origins
            .iter()
            .filter_map(|(uid, origin)| match origin {
                Origin::DevicePlugin(dp) => Some(DevicePluginClaim {
                    uid: uid.clone(),
                    resource: dp.resource.clone(),
                    device_ids: dp.device_ids.clone(),
                    allocated_at: dp.allocated_at,
                    user: dp.user.clone(),
                    users: st
                        .node
                        .users_of(uid)
                        .filter(|c| !st.stopped.contains(*c))
                        .map(str::to_string)
                        .collect(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Container `container_id` of pod `pod_uid` (`pod` is `namespace/name`) was created or
    /// found with `claims`: each device plugin claim among them that no container used before
    /// records it as its first user, durably, so that a restart can tell a claim whose pod is
    /// gone from one whose container has not started yet.
    pub async fn device_plugin_used(
        &self,
        container_id: &str,
        pod_uid: &str,
        pod: &str,
        claims: &[String],
    ) -> Result<(), EngineError> {
        for uid in claims {
            let unbound = matches!(
                self.state().origins.get(uid),
                Some(Origin::DevicePlugin(dp)) if dp.user.is_none()
            );
            if !unbound {
                continue;
            }
            let _claim = self.claims.lock(uid).await;
            let Some(mut record) = self.journal.record(uid) else {
                continue;
            };
            let Origin::DevicePlugin(dp) = &mut record.origin else {
                continue;
            };
            let user = &mut dp.user;
            if user.is_some() || self.state().node.allocation(uid).is_none() {
                continue;
            }
            *user = Some(DevicePluginUser {
                container_id: container_id.to_string(),
                pod_uid: pod_uid.to_string(),
                pod: pod.to_string(),
            });
            let origin = record.origin.clone();
            self.commit(uid, vec![Change::PutRecord(uid.clone(), record)])
                .await?;
            self.state().set_origin(uid, origin);
            tracing::info!(claim = %uid, container = %container_id, pod = %pod,
                "a container uses a device plugin allocation");
        }
        Ok(())
    }

    /// Releases the device plugin claims whose first user's pod is not among `live_pods` (the
    /// pods the runtime reported in Synchronize) and that no container uses. Answers the claims
    /// released.
    pub async fn release_device_plugin_claims_of_gone_pods(
        &self,
        live_pods: &BTreeSet<String>,
    ) -> Result<Vec<String>, EngineError> {
        let gone: Vec<String> = self
            .device_plugin_claims()
            .into_iter()
            .filter(|c| c.users.is_empty())
            .filter(|c| {
                c.user
                    .as_ref()
                    .is_some_and(|u| !live_pods.contains(&u.pod_uid))
            })
            .map(|c| c.uid)
            .collect();
        let mut released = Vec::with_capacity(gone.len());
        for uid in gone {
            if self.release_if_unused(&uid, || true).await? {
                tracing::info!(claim = %uid, "released a device plugin allocation whose pod is gone");
                released.push(uid);
            }
        }
        Ok(released)
    }

    /// The runtime stopped container `container_id`: it runs nothing any more. It stays a user
    /// of its claims until it is removed (a pod's next container may be created with the same
    /// allocation meanwhile), but a device plugin allocation only stopped containers use is free
    /// for the kubelet to hand out again ([`Engine::device_plugin_claims`] leaves them out).
    pub fn container_stopped(&self, container_id: &str) {
        let mut st = self.state();
        if st.node.claims_of(container_id).is_some() {
            st.stopped.insert(container_id.to_string());
        }
    }

    /// Releases device plugin claim `uid`, which the kubelet hands out again, unless a running
    /// container uses it; answers whether it is gone now. Stopped containers using it are taken
    /// as removed first (their claims handled as at their removal), so that their later removal
    /// finds nothing of theirs: the kubelet's next allocation of the same devices has the same
    /// claim UID and must not go with them. Only while `admitted` (the device plugins' gate)
    /// holds, asked first and again under the claim's lock: with the NRI connection lost, the
    /// users known may miss a container the runtime started meanwhile, so nothing is released
    /// ([`EngineError::NoLongerAdmitted`]).
    pub async fn release_unused_device_plugin_claim(
        &self,
        uid: &str,
        admitted: impl Fn() -> bool,
    ) -> Result<bool, EngineError> {
        super::check_uid(uid)?;
        if !admitted() {
            return Err(EngineError::NoLongerAdmitted {
                claim: uid.to_string(),
                what: "released",
            });
        }
        let stopped: Vec<String> = {
            let st = self.state();
            st.node
                .users_of(uid)
                .filter(|c| st.stopped.contains(*c))
                .map(str::to_string)
                .collect()
        };
        for c in &stopped {
            tracing::info!(claim = %uid, container = %c,
                "the kubelet hands out the devices of a stopped container: it is taken as removed");
            self.container_removed(c).await?;
        }
        self.release_if_unused(uid, admitted).await
    }

    /// Releases device plugin claim `uid` unless a container uses it; answers whether it is
    /// gone now. Both are decided under the claim's lock, where the NRI side maps a new
    /// container to the claim, and only while `admitted` holds there.
    pub(super) async fn release_if_unused(
        &self,
        uid: &str,
        admitted: impl FnOnce() -> bool,
    ) -> Result<bool, EngineError> {
        let _claim = self.claims.lock(uid).await;
        if !admitted() {
            return Err(EngineError::NoLongerAdmitted {
                claim: uid.to_string(),
                what: "released",
            });
        }
        if self.state().node.users_of(uid).next().is_some() {
            return Ok(false);
        }
        self.unprepare_locked(uid).await?;
        Ok(true)
    }
}

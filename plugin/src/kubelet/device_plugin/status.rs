//! The `device_plugins` part of the status document: each resource, what it advertises and
//! which of its devices are held, by which claim and container, which are broken and which are
//! held through another door (two different things the kubelet hears as the same `Unhealthy`),
//! and its kubelet registration.

use serde::Serialize;

use super::listing::Unavailable;
use super::{DevicePlugins, Registration};

/// The `device_plugins` part of `nri-accel status --json`.
#[derive(Debug, Clone, Serialize)]
pub struct DevicePluginsStatus {
    /// The kubelet's registration socket.
    pub kubelet_socket: String,
    /// Whether it exists now.
    pub kubelet_socket_present: bool,
    /// Every resource, in config order.
    pub resources: Vec<ResourceStatus>,
}

/// One resource.
#[derive(Debug, Clone, Serialize)]
pub struct ResourceStatus {
    /// The resource name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// Its socket in the device-plugins directory.
    pub socket: String,
    /// Its registration with the kubelet.
    pub registration: Registration,
    /// Devices advertised.
    pub advertised: usize,
    /// Of those, the ones listed to the kubelet as `Healthy`: it may hand them out (those it
    /// handed out already are among them, under `held`).
    pub available: usize,
    /// Advertised devices the health monitor found broken, and why.
    pub unhealthy: Vec<Unhealthy>,
    /// Advertised devices that work but are held by a claim granted through another door (the
    /// claims API, DRA, a pod annotation, another resource): listed to the kubelet as
    /// `Unhealthy`, the only word its API has for "not yours to hand out".
    pub held_elsewhere: Vec<HeldElsewhere>,
    /// Devices held by this resource's allocations.
    pub held: Vec<Held>,
}

/// An advertised device the health monitor found broken.
#[derive(Debug, Clone, Serialize)]
pub struct Unhealthy {
    /// The kubelet device ID.
    pub id: String,
    /// Why.
    pub reason: String,
}

/// An advertised device held by a claim granted outside this resource.
#[derive(Debug, Clone, Serialize)]
pub struct HeldElsewhere {
    /// The kubelet device ID.
    pub id: String,
    /// The claim holding it.
    pub claim: String,
    /// What is held, by which claim, in one sentence.
    pub reason: String,
}

/// A device held by one of the resource's allocations.
#[derive(Debug, Clone, Serialize)]
pub struct Held {
    /// The kubelet device ID.
    pub id: String,
    /// The claim holding it.
    pub claim: String,
    /// Containers using the claim now.
    pub containers: Vec<String>,
    /// The pod of the first container that used it (`namespace/name`), if one did.
    pub pod: Option<String>,
    /// When the kubelet allocated it (seconds since the Unix epoch).
    pub allocated_at: u64,
}

impl DevicePlugins {
    /// The status of every resource now.
    pub fn status(&self) -> DevicePluginsStatus {
        let claims = self.engine.device_plugin_claims();
        let resources =
            self.resources()
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let listed = self.listed(i);
                    let mut unhealthy = Vec::new();
                    let mut held_elsewhere = Vec::new();
                    for l in &listed {
                        match &l.unavailable {
                            None => {}
                            Some(Unavailable::Unhealthy(reason)) => unhealthy.push(Unhealthy {
                                id: l.id.clone(),
                                reason: reason.clone(),
                            }),
                            Some(Unavailable::HeldElsewhere { claim, reason }) => held_elsewhere
                                .push(HeldElsewhere {
                                    id: l.id.clone(),
                                    claim: claim.clone(),
                                    reason: reason.clone(),
                                }),
                        }
                    }
                    let available = listed.iter().filter(|l| l.unavailable.is_none()).count();
                    let held = claims
                        .iter()
                        .filter(|c| c.resource == r.name)
                        .flat_map(|c| {
                            c.device_ids.iter().map(move |id| Held {
                                id: id.clone(),
                                claim: c.uid.clone(),
                                containers: c.users.clone(),
                                pod: c.user.as_ref().map(|u| u.pod.clone()),
                                allocated_at: c.allocated_at,
                            })
                        })
                        .collect();
                    ResourceStatus {
                        name: r.name.clone(),
                        pool: r.pool.clone(),
                        socket: r.socket.clone(),
                        registration: self.registration(i),
                        advertised: listed.len(),
                        available,
                        unhealthy,
                        held_elsewhere,
                        held,
                    }
                })
                .collect();
        let socket = self.kubelet_socket();
        DevicePluginsStatus {
            kubelet_socket: socket.display().to_string(),
            kubelet_socket_present: socket.exists(),
            resources,
        }
    }
}

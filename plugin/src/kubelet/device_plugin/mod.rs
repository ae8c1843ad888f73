//! The kubelet's device plugin API (v1beta1): one device plugin per served pool, so that the
//! scheduler counts a node's free accelerators in clusters without DRA, while nri-accel's policy
//! still decides which units a container gets and its NRI side ties the grant to the container.
//!
//! - [`layout`]: what each resource advertises (a pure function of the config and inventory);
//! - [`listing`]: ListAndWatch's devices, their NUMA node and health;
//! - [`claims`]: how an Allocate becomes a claim, and what it does with the claims that hold
//!   the devices already;
//! - [`service`]: the `v1beta1.DevicePlugin` server, a thin adapter over the engine;
//! - [`plugins`]: serving every resource's socket, registering with the kubelet, and noticing
//!   the kubelet's restart (it wipes its directory) to serve and register again;
//! - [`status`]: the `device_plugins` part of `nri-accel status`.
//!
//! docs/device-plugin.md explains the choices to an operator.

pub mod claims;
mod error;
pub mod layout;
pub mod listing;
pub mod plugins;
pub mod service;
pub mod status;

pub use error::DevicePluginError;
pub use plugins::{DevicePlugins, Registration};

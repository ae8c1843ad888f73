//! A simulated kubelet: the plugin watcher that registers plugins found in its registry
//! directory, a DRA client that calls a driver's socket the way the kubelet does, and a watch
//! on the driver's device health stream.

mod call;
mod deviceplugin;
pub mod deviceplugin_wire;
mod dra;
mod error;
mod health;
mod registration;
pub mod wire;

pub use call::GrpcCaller;
pub use deviceplugin::{
    DevicePluginClient, DevicePluginKubelet, ListedDevice, RegisteredDevicePlugin,
};
pub use dra::{DraApi, DraClient, PreparedClaim};
pub use error::SimError;
pub use health::{HealthApi, HealthWatch, ReportedHealth};
pub use registration::{PluginWatcher, RegisteredPlugin};

//! A simulated kubelet: the plugin watcher that registers plugins found in its registry
//! directory, and a DRA client that calls a driver's socket the way the kubelet does.

mod call;
mod dra;
mod error;
mod registration;
pub mod wire;

pub use call::GrpcCaller;
pub use dra::{DraApi, DraClient, PreparedClaim};
pub use error::SimError;
pub use registration::{PluginWatcher, RegisteredPlugin};

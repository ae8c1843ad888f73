//! The kubelet-facing gRPC layer: the unix sockets the kubelet connects to (and the one it serves
//! for device plugins), shared by the DRA driver and the device plugins.
//!
//! Each kubelet service (plugin registration, DRA, DRA health, device plugin) is a thin adapter
//! in its own file that turns a kubelet call into the engine calls the claims API already makes;
//! this module holds what they share: serving a tonic router on a socket path that may go stale
//! or be wiped (the kubelet wipes its device-plugins dir when it restarts), and dialling the
//! kubelet's own socket. [`DraDriver`] keeps the DRA driver's two sockets served.

mod channel;
pub mod conn;
pub mod device_plugin;
mod dra;
mod driver;
mod error;
mod health;
mod registration;
mod socket;

pub use channel::dial;
pub use conn::ConnLimits;
pub use dra::{
    AllocatedClaim, ClaimSource, DraCallError, DraService, DraSettings, DraV1, DraV1beta1,
    MAX_CLAIMS, MAX_MESSAGE_BYTES, MAX_RESULTS, PrepareObserver, PreparedClaims, SOURCE_TIMEOUT,
    UnpreparedClaims,
};
pub use driver::{DraDriver, DraDriverConfig, DraDriverStatus, WATCH_EVERY};
pub use error::KubeletError;
pub use health::{DeviceEntry, HealthService, HealthV1, HealthV1alpha1, REFRESH};
pub use registration::{RegistrationService, RegistrationState};
pub use socket::{ServedSocket, prepare_socket_path};

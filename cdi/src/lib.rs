//! Durable per-claim CDI spec store for nri-accel.
//!
//! A CDI spec on disk is how nri-accel grants a device: the container runtime reads it and
//! injects the device nodes, environment, mounts and hooks it lists. This crate writes one spec
//! per claim (`<vendor>-<class>_<uid>.yaml`, devices `claim-<uid>-<i>`), atomically and
//! durably, lists and reads them back, and refuses anything that could escape the directory or
//! that the official CDI parser would reject. It knows nothing of NRI or policies.
//!
//! ```no_run
//! use cdi::{DeviceEdits, DeviceNode, SpecStore, StoreConfig};
//! let store = SpecStore::open(StoreConfig::new("/var/run/cdi"))?;
//! let gpu = DeviceEdits {
//!     device_nodes: vec![DeviceNode { path: "/dev/accel0".into(), ..Default::default() }],
//!     ..Default::default()
//! };
//! let ids = store.write("0b7a1c2e-9f3d-4b1a-8c6e-2d4f6a8b0c1d", &[gpu])?;
//! assert_eq!(ids, ["accel.nri.io/device=claim-0b7a1c2e-9f3d-4b1a-8c6e-2d4f6a8b0c1d-0"]);
//! # Ok::<(), cdi::CdiError>(())
//! ```

mod dir;
mod durable;
mod edits;
mod error;
mod names;
mod spec;
mod stamp;
mod store;
mod vendor;

pub use dir::{Dir, DirError, DirMoved};
pub use durable::{SPEC_MODE, SyncPoint, WriteStep};
pub use edits::{DeviceEdits, DeviceKind, DeviceNode, HOOK_NAMES, Hook, Mount};
pub use error::CdiError;
pub use names::{MAX_CLAIM_UID_LEN, validate_claim_uid};
pub use spec::{ContainerEdits, Device, MAX_SPEC_BYTES, Spec, SpecFormat};
pub use stamp::Stamp;
pub use store::{FaultHook, ListedSpec, SpecStore, StepHook, StoreConfig};
pub use vendor::{VendorDevice, VendorEdits, VendorSpec};

//! The validating admission webhook (`nri-accel webhook`): the annotation path's front door.
//!
//! A pod whose accelerator annotations the node would refuse at container creation (malformed,
//! two vendors, a family no pool has, more devices than any node publishes) is refused when it
//! is created, with the node's own sentence: the annotations go through the node's parser
//! ([`crate::daemon::annotations`]) and pool refusals are the policies' [`policies::Refusal`]s.
//! Everything else, pods without accelerator annotations first, is admitted untouched.
//!
//! Pods with DRA claims and KubeVirt VirtualMachineInstances are judged too ([`admit`],
//! [`dra`], [`vmi`]): what no node could ever allocate is refused at create.
//!
//! [`review`] decodes AdmissionReview v1 and writes the answer, [`check`] decides, [`fleet`]
//! keeps what the nodes publish, `tls` the certificate (reloaded when its files change) and
//! `server` the HTTPS server, both only in a build with the `tls` feature (every shipped one).
//! docs/webhook.md is the operator's side.

pub mod admit;
pub mod cel;
pub mod check;
pub mod dra;
mod error;
pub mod fleet;
pub mod review;
#[cfg(feature = "tls")]
pub mod server;
#[cfg(feature = "tls")]
pub mod tls;
pub mod vmi;

pub use error::WebhookError;
#[cfg(feature = "tls")]
pub use server::{State, WebhookServer, serve};

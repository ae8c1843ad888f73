//! NRI (Node Resource Interface) for Rust: the protocol messages, the wire multiplexer, ttrpc over
//! it and a plugin stub.
//!
//! ```no_run
//! use std::sync::Arc;
//! use nri_proto::{Plugin, Stub, EventMask, api::Event};
//!
//! struct Hello;
//! #[async_trait::async_trait]
//! impl Plugin for Hello {
//!     fn events(&self) -> EventMask { EventMask::of(&[Event::CREATE_CONTAINER]) }
//! }
//!
//! # async fn run() -> Result<(), nri_proto::StubError> {
//! let stub = Stub::builder().name("hello").index("10").socket("/var/run/nri/nri.sock").build()?;
//! stub.run(Arc::new(Hello)).await
//! # }
//! ```

mod error;
mod events;
mod fd;
pub mod lean_sync;
pub mod mux;
mod notify;
mod plugin;
mod server;
mod service;
mod socket;
pub mod strict;
mod stub;

/// Code generated from `proto/nri.proto` at build time (messages and ttrpc services).
#[allow(
    warnings,
    missing_docs,
    clippy::all,
    clippy::pedantic,
    non_snake_case,
    non_camel_case_types,
    non_upper_case_globals
)]
pub mod generated {
    /// NRI messages.
    pub mod nri {
        include!(concat!(env!("OUT_DIR"), "/nri.rs"));
    }
    /// NRI ttrpc clients and service traits.
    pub mod nri_ttrpc {
        include!(concat!(env!("OUT_DIR"), "/nri_ttrpc.rs"));
    }
}

/// The NRI messages (`nri.pkg.api.v1alpha1`).
pub mod api {
    pub use crate::generated::nri::*;
}

pub use error::{PluginError, StubError, describe_ttrpc};
pub use events::{EventMask, MASK_PRE_V0_10, MASK_V0_10, parse_nri_version, valid_mask_for};
pub use lean_sync::{LeanKeep, LeanSynchronize, SyncContainer, SyncDecoding, SyncDevice, SyncPod};
pub use notify::StubEvent;
pub use plugin::Plugin;
pub use protobuf;
pub use stub::{
    DEFAULT_SOCKET, NRI_VERSION, Stub, StubBuilder, Updater, validate_index, validate_name,
};

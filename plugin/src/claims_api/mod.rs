//! The claims API: ttrpc on a unix socket through which DRA drivers (and operators, through the
//! CLI) prepare, unprepare and list accelerator claims on this node.
//!
//! The calls mirror kubelet's DRA plugin API so a driver can forward kubelet's calls one to one:
//! every requested claim gets its own answer in a map keyed by claim UID. The server checks the
//! peer's credentials, the gate (see [`crate::gate`]), size limits and claim UIDs before the engine
//! (a [`ClaimService`]) sees anything. See `docs/claims-api.md`.

mod client;
mod convert;
mod error;
mod flood;
mod frame;
mod peer;
mod server;
mod service;
mod types;
mod validate;

pub use client::{ClaimsClient, DEFAULT_CALL_TIMEOUT, StatusReport};
pub use error::{ClaimsApiError, GATE_CLOSED_MESSAGE};
pub use peer::{DefaultPeerPolicy, PeerCred, PeerPolicy};
pub use server::{ClaimsServer, DEFAULT_SOCKET_PATH, ServerOptions};
pub use types::{
    ClaimAsk, ClaimInfo, ClaimRef, ClaimService, ClaimSpec, ClaimState, CountAsk, DraResult,
    Family, PrepareResults, PreparedDevice, Selector, UnprepareResults,
};
pub use validate::{Limits, MAX_NAME_LEN, MAX_UID_LEN, check_uid};

/// Generated protobuf messages (`claims`) and ttrpc bindings (`claims_ttrpc`) for
/// `proto/claims.proto`. Wire types only: the engine works with the domain types above.
pub mod proto {
    #![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/claims_api/modules.rs"));
}

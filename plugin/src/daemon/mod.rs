//! The daemon: the parts wired together behind the NRI stub and the claims API.

pub mod agent;
pub mod annotations;
pub mod containers;
pub mod dra;

pub mod pods;

pub use agent::{Agent, AgentSettings, ContainerGrant, StatusSection, annotation_claim_uid};
pub use containers::{ContainerView, claim_of_cdi_name};
pub mod nri;
pub mod run;
pub mod service;
pub mod status;

pub use nri::NriPlugin;
pub use run::{Daemon, DaemonError, DaemonOptions};
pub use service::ClaimsFacade;

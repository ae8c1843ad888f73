//! The daemon: the parts wired together behind the NRI stub and the claims API.

pub mod agent;
pub mod annotations;
pub mod containers;

pub use agent::{
    Agent, AgentSettings, ContainerGrant, Injection, StatusSection, annotation_claim_uid,
};
pub use containers::{ContainerView, claim_of_cdi_name};
pub mod nri;
pub mod run;
pub mod service;
pub mod status;

pub use nri::NriPlugin;
pub use run::{Daemon, DaemonError, DaemonOptions};
pub use service::ClaimsFacade;

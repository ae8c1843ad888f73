//! nri-accel library: the parts the binary wires together.
pub mod allocator;
pub mod bootid;
pub mod checkpoint;
pub mod claims_api;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod discovery;
pub mod engine;
pub mod gate;
pub mod kube;
pub mod metrics;
pub mod nodelock;
pub mod notify;
pub mod preflight;
pub mod privileges;

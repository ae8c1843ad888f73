//! nri-accel library: the parts the binary wires together.
pub mod config;
pub mod discovery;
pub mod claims_api;
pub mod gate;

//! nri-accel library: the parts the binary wires together.
pub mod claims_api;
pub mod gate;

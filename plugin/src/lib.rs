//! nri-accel library: the parts the binary wires together.
pub mod config;
pub mod daemon;
pub mod discovery;
pub mod engine;

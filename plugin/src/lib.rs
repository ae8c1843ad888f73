//! nri-accel library: the parts the binary wires together.
pub mod engine;
pub mod daemon;

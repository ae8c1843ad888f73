//! nri-accel library: the parts the binary wires together.
pub mod metrics;
pub mod notify;
pub mod preflight;
pub mod privileges;

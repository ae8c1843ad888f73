//! nri-accel library: the parts the binary wires together.

pub mod bootid;
pub mod checkpoint;
pub mod nodelock;

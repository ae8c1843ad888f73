//! nri-accel binary.
fn main() {}

//! Simulated Kubernetes peers for nri-accel's tests, demo and benchmarks.
//!
//! They speak the real wire (gRPC over unix sockets for the kubelet) but share no code with
//! nri-accel's own protocol crates: the messages here are declared by hand from the kubelet's
//! field numbers, so a wrong field number on either side shows up as a failing test instead of
//! cancelling out.

pub mod kubelet;
pub mod scheduler;

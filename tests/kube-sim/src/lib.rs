//! Simulated Kubernetes peers for nri-accel's tests, demo and benchmarks.
//!
//! They speak the real wire (gRPC over unix sockets for the kubelet, REST/JSON over HTTP on
//! 127.0.0.1 for the API server) but share no code with nri-accel's own protocol code: the
//! kubelet's messages are declared by hand from its field numbers and the API server keeps
//! objects as JSON, so a wrong field on either side shows up as a failing test instead of
//! cancelling out.

pub mod apiserver;
pub mod kubelet;
pub mod scheduler;

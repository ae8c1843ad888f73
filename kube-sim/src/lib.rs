//! Simulated Kubernetes peers for nri-accel's tests, demo and benchmarks.
pub mod apiserver;

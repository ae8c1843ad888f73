//! nri-accel library: the parts the binary wires together.

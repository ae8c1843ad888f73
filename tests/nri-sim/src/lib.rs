//! A fake NRI runtime for tests and benchmarks, written from the protocol facts with its own
//! framing and ttrpc codec (it does not use nri-proto's mux or the ttrpc crate), so it checks the
//! plugin side independently: Go-style 4096-byte buffered reads per conn, Configure before the
//! RegisterPlugin reply, Synchronize paging, the request timeout and the event mask.

pub mod bench;
pub mod fixtures;
pub mod launch;
pub mod runtime;
pub mod wire;

pub use runtime::{
    FakeError, FakeRuntime, PluginInfo, RuntimeConfig, encode_sync_chunks, nri_mask_for,
};

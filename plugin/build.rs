//! Generates the claims API messages and ttrpc service bindings from `proto/claims.proto`.
//!
//! `ttrpc-codegen` parses the proto in pure Rust, so no `protoc` is needed on the build machine.
//! The output lands in `$OUT_DIR/claims_api/`; `modules.rs` there declares the two generated
//! modules so `src/claims_api/mod.rs` can `include!` it inside its `proto` module.

use std::path::Path;

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() -> std::io::Result<()> {
    let out_dir = std::env::var("OUT_DIR").map_err(std::io::Error::other)?;
    let out = Path::new(&out_dir).join("claims_api");
    std::fs::create_dir_all(&out)?;
    println!("cargo:rerun-if-changed=proto/claims.proto");
    Codegen::new()
        .out_dir(&out)
        .input("proto/claims.proto")
        .include("proto")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()?;
    // The generated `mod.rs` variants carry an inner attribute, which `include!` rejects; declare
    // the modules in a file of our own instead (module paths resolve next to this file).
    std::fs::write(
        out.join("modules.rs"),
        "pub mod claims;\npub mod claims_ttrpc;\n",
    )
}

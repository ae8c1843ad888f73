//! Generates the NRI messages and ttrpc services from `proto/nri.proto` with the pure-Rust
//! `ttrpc-codegen` (no system `protoc`).

use ttrpc_codegen::{Codegen, Customize, ProtobufCustomize};

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto/nri.proto");
    Codegen::new()
        .input("proto/nri.proto")
        .include("proto")
        .rust_protobuf()
        .customize(Customize {
            async_all: true,
            ..Default::default()
        })
        .rust_protobuf_customize(ProtobufCustomize::default().gen_mod_rs(false))
        .run()?;
    // The generated files start with inner attributes, which `include!` cannot take; the lint
    // allowances live on the `generated` module instead.
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    for name in ["nri.rs", "nri_ttrpc.rs"] {
        let path = out.join(name);
        let text = std::fs::read_to_string(&path)?;
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("#![") && !l.starts_with("//!"))
            .collect();
        std::fs::write(&path, kept.join("\n"))?;
    }
    Ok(())
}

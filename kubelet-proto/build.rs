//! Generates the kubelet API messages and gRPC services from `proto/` with `protox` (a pure-Rust
//! protobuf compiler) feeding `tonic-prost-build`: no system `protoc` is needed.

const PROTOS: [&str; 6] = [
    "proto/pluginregistration/v1/registration.proto",
    "proto/dra/v1/dra.proto",
    "proto/dra/v1beta1/dra.proto",
    "proto/drahealth/v1/health.proto",
    "proto/drahealth/v1alpha1/health.proto",
    "proto/deviceplugin/v1beta1/deviceplugin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

//! Compiles `proto/deviceplugin/v1beta1/api.proto` with protox (a pure-Rust
//! protobuf compiler, so no system `protoc` is needed) and generates the tonic
//! client and server bindings into `OUT_DIR`. Nothing generated is committed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // BTreeMap keeps `envs` ordered, so responses print and compare deterministically.
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}

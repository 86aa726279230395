//! Compiles `proto/deviceplugin/v1beta1/api.proto`, `proto/podresources/v1/api.proto`, the
//! kubelet's plugin registration API (`proto/pluginregistration/v1/api.proto`) and its DRA
//! plugin API (`proto/dra/v1/api.proto`, `proto/dra/v1beta1/api.proto`) and its DRA resource
//! health API (`proto/drahealth/v1/api.proto`, `proto/drahealth/v1alpha1/api.proto`) with protox
//! (a pure-Rust protobuf compiler, so no system `protoc` is needed) and generates the tonic
//! client and server bindings into `OUT_DIR`. Nothing generated is committed.
//!
//! The health API's package `v1` is also the pod-resources API's: its bindings go into
//! `OUT_DIR/drahealth/` so that the two `v1.rs` files do not overwrite each other.
//!
//! It also packs the binary's relative relocations where the linker is LLD (see
//! [`pack_relocations`]).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    pack_relocations();
    let protos = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/drahealth/v1/api.proto",
        "proto/drahealth/v1alpha1/api.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    // The same descriptors for the interop tests' grpc-go and grpcio clients, which build
    // their messages from them at run time (tests/clients/).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptors.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let is_health = |name: &str| name.starts_with("drahealth/");
    let mut health = fds.clone();
    health.file.retain(|f| is_health(f.name()));
    let mut rest: tonic_prost_build::FileDescriptorSet = fds;
    rest.file.retain(|f| !is_health(f.name()));
    let health_dir = out.join("drahealth");
    std::fs::create_dir_all(&health_dir)?;
    for (set, dir) in [(rest, &out), (health, &health_dir)] {
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            // BTreeMap keeps `envs` ordered, so responses print and compare deterministically.
            .btree_map(".")
            .out_dir(dir)
            .compile_fds(set)?;
    }
    Ok(())
}

/// Packs the `slicelet` binary's relative relocations (DT_RELR) instead of 24 bytes each: the
/// dynamic loader reads every one at start, so the 443 KiB table was resident; packed it is a
/// few KiB. Only where rustc links with LLD (Rust 1.90 or newer on x86_64 Linux). Needs glibc
/// 2.36 or newer at run time (Debian 12, the distroless/cc image; older ones refuse the binary
/// with a "GLIBC_ABI_DT_RELR not found" error).
fn pack_relocations() {
    let target = std::env::var("TARGET").unwrap_or_default();
    if target != "x86_64-unknown-linux-gnu" || !rustc_links_with_lld() {
        return;
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}

/// Whether rustc links with its own LLD: Rust 1.90 or newer (its default on
/// x86_64-unknown-linux-gnu), with no other linker configured for the target.
fn rustc_links_with_lld() -> bool {
    if std::env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some() {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let Ok(out) = std::process::Command::new(rustc).arg("--version").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = text
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}

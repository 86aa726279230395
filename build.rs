//! Compiles `proto/deviceplugin/v1beta1/api.proto`, `proto/podresources/v1/api.proto`, the
//! kubelet's plugin registration API (`proto/pluginregistration/v1/api.proto`) and its DRA
//! plugin API (`proto/dra/v1/api.proto`, `proto/dra/v1beta1/api.proto`) with protox (a pure-Rust
//! protobuf compiler, so no system `protoc` is needed) and generates the tonic
//! client and server bindings into `OUT_DIR`. Nothing generated is committed.
//!
//! It also lays out the `slicelet` binary's code for a small resident set: the linker places
//! the functions an idle daemon executes (listed in `link/symbol-order.txt`, recorded by
//! `scripts/symbol-order.sh`) first and together, so the pages the kernel maps around them
//! (it maps 64 KiB around each page fault of a file mapping) hold hot code, not the Kubernetes
//! client, TLS or kubeconfig parsing that sit unused beside them. Only where the linker is
//! LLD, which Rust uses by default on x86_64 Linux since 1.90 (GNU ld has no such option); a
//! symbol the list names but the build lacks is skipped silently. With LLD the relative
//! relocations are packed too (see [`symbol_order`]).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    symbol_order();
    let protos = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
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
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // BTreeMap keeps `envs` ordered, so responses print and compare deterministically.
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}

/// Passes `link/symbol-order.txt` to LLD for the `slicelet` binary (see the module docs).
fn symbol_order() {
    let order = "link/symbol-order.txt";
    println!("cargo:rerun-if-changed={order}");
    let target = std::env::var("TARGET").unwrap_or_default();
    if target != "x86_64-unknown-linux-gnu" || !rustc_links_with_lld() {
        return;
    }
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={dir}/{order}");
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    // Relative relocations packed (DT_RELR) instead of 24 bytes each: the dynamic loader reads
    // every one at start, so the 443 KiB table was resident; packed it is a few KiB. Needs
    // glibc 2.36 or newer at run time (Debian 12, the distroless/cc image; older ones refuse
    // the binary with a "GLIBC_ABI_DT_RELR not found" error).
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

# syntax=docker/dockerfile:1
# slicelet container image: build with the Rust toolchain, run on distroless/cc (glibc, which
# NVML needs: libnvidia-ml.so.1 is loaded with dlopen and injected by the NVIDIA runtime).
# No protoc: the protobuf API is compiled by protox inside build.rs.

# Rust 1.90 or newer links with LLD, which packs the relative relocations (build.rs); an
# older toolchain builds the same binary without that.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The same command CI runs.
RUN cargo build --release --locked \
 && strip target/release/slicelet

# distroless publishes no version tags, only latest/nonroot/debug: pin a digest
# (gcr.io/distroless/cc-debian12@sha256:…) for reproducible production images.
FROM gcr.io/distroless/cc-debian12:latest
COPY --from=build /src/target/release/slicelet /usr/bin/slicelet
ENTRYPOINT ["/usr/bin/slicelet"]
CMD ["run", "--config", "/etc/slicelet/config.yaml"]

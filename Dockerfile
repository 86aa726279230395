# syntax=docker/dockerfile:1
# slicelet container image: build with the Rust toolchain, then a scratch image holding only
# what the binary needs: itself, the glibc libraries ldd resolves for it and their loader,
# Debian's CA bundle, /etc/passwd and /etc/group with a nonroot user (uid 65532).
# deployments/image/assemble lays that tree out and checks it against
# deployments/image/layout.txt; .ci/image builds the same image without an engine (umoci) from
# this file's last stage and fails on any difference. NVML (libnvidia-ml.so.1) is not in the
# image: slicelet loads it with dlopen and the NVIDIA container runtime injects it.
# No protoc: the protobuf API is compiled by protox inside build.rs. See docs/container-image.md.

# Rust 1.90 or newer links with LLD, which packs the relative relocations (build.rs); an
# older toolchain builds the same binary without that.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The same command CI runs; assemble strips the image's copy of the binary.
RUN cargo build --release --locked \
 && deployments/image/assemble target/release/slicelet /rootfs

FROM scratch
COPY --from=build /rootfs/ /
LABEL org.opencontainers.image.title="slicelet" \
      org.opencontainers.image.description="A Kubernetes device plugin that shares NVIDIA GPUs: time-slicing, MPS and MIG" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# distroless's PATH: the MPS control daemon (nvidia-cuda-mps-control, injected by the NVIDIA
# runtime) is looked up on it.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# No USER: the default user is root, which `run` needs for the kubelet's root-owned
# device-plugin directory (the manifests say runAsUser: 0 too). The nonroot user (65532:65532)
# is there for the commands that read files only: plan, validate, --version.
ENTRYPOINT ["/usr/bin/slicelet"]
CMD ["run", "--config", "/etc/slicelet/config.yaml"]

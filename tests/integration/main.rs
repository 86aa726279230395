//! One integration-test binary: the daemon against the kubelet emulator over real unix sockets,
//! the real `slicelet` binary (CLI, signals, fake NVML), and the fixtures in fixtures/.

mod binary;
mod cdi;
mod commands_doc;
mod common;
mod daemon;
mod dra;
mod dra_mig;
mod dra_sockets;
mod drain;
mod fixtures;
mod function_length;
mod hook;
mod hostile;
mod interop;
mod labels;
pub mod layers;
mod live;
mod manifests;
mod mig_cli;
mod mig_layouts;
pub mod mps;
mod mps_gpu;
mod node_label;
mod restarts;
mod status_truth;
mod usage;
mod usage_manifests;

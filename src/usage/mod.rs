//! GPU use, sampled on the hardware actor and attributed to the containers on each GPU.
//!
//! The flow: the hardware actor samples every GPU (utilisation, memory, per-process SM use and
//! memory) every `--sample-seconds`, maps each process's host PID to its pod through
//! `<proc root>/proc/<pid>/cgroup` ([`cgroup`]) and reads the kubelet's device checkpoint
//! ([`checkpoint`]: pod UID → container → device IDs); the supervisor's shell joins that with
//! what pod-resources says is held ([`crate::podres::InUse`]) into per-container figures
//! ([`attribute`]) for `/metrics` and `/status`.
//!
//! Everything here but the sampler ([`sampler`], on the hardware actor's thread) and the two
//! small readers ([`cgroup::read`], [`checkpoint::read`]) is pure.

pub mod attribute;
pub mod cgroup;
pub mod checkpoint;
pub mod metrics;
pub mod report;
pub mod sampler;
pub mod view;

pub use crate::inventory::sample::{GpuSample, MigSample, ProcessSample};

/// One sample of the node: every GPU, taken at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples {
    /// When the sample was taken, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// One entry per GPU (whole or MIG-enabled), by index.
    pub gpus: Vec<GpuSample>,
    /// The kubelet's device checkpoint as read with this sample; `None` when it could not be
    /// read or parsed (then only GPU-level figures exist; the reason is in
    /// [`Samples::checkpoint_error`]).
    pub checkpoint: Option<Vec<CheckpointEntry>>,
    /// Why the checkpoint could not be used (missing, unreadable, not a format this parser
    /// knows).
    pub checkpoint_error: Option<String>,
    /// Removed cgroups whose GPU memory limit the driver still reported, found with this
    /// sample ([`sampler::read_limits`]).
    pub limits_not_cleared: u32,
}

/// One entry of the kubelet's device checkpoint: a container's devices of one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointEntry {
    /// The pod's UID (dashes, as in `metadata.uid`).
    pub pod_uid: String,
    /// The container's name.
    pub container: String,
    /// The extended resource (`nvidia.com/gpu`).
    pub resource: String,
    /// The device IDs it was given.
    pub device_ids: Vec<String>,
}

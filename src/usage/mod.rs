//! GPU use, sampled on the hardware actor and attributed to the containers on each GPU.
//!
//! The flow: the hardware actor samples every GPU (utilisation, memory, per-process SM use and
//! memory) every `--sample-seconds`, maps each process's host PID to its pod through
//! `<proc root>/proc/<pid>/cgroup` ([`cgroup`]) and reads the kubelet's device checkpoint
//! ([`checkpoint`]: pod UID → container → device IDs) and, with `--dra`, the claims slicelet
//! prepared ([`ClaimEntry`]: the pods each is reserved for and its devices); the supervisor's
//! shell joins that with what pod-resources says is held ([`crate::in_use::InUse`]) into
//! per-container figures ([`attribute`]) for `/metrics` and `/status`.
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

use crate::inventory::sample::GpuSample;

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
    /// The DRA claims slicelet prepared (its DRA checkpoint, `--dra`) as read with this
    /// sample; `None` without `--dra` or when that checkpoint could not be read: then no DRA
    /// holder of a whole GPU or replica gets an entry (see [`attribute`]).
    pub claims: Option<Vec<ClaimEntry>>,
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

/// A DRA claim slicelet prepared, as attribution needs it: the pods it is reserved for (by
/// name and UID, from its `status.reservedFor` when it was prepared) and its devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimEntry {
    /// The claim's namespace, which is its pods' (a pod references claims of its own
    /// namespace only).
    pub namespace: String,
    /// The pods it is reserved for; empty when its preparer did not record them.
    pub pods: Vec<ClaimPod>,
    /// Its devices of this driver.
    pub devices: Vec<ClaimDevice>,
}

/// A pod a claim is reserved for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimPod {
    /// The pod's name.
    pub name: String,
    /// The pod's UID (dashes, as in `metadata.uid`), as its cgroup names it.
    pub uid: String,
}

/// One device of a prepared claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimDevice {
    /// Its name in the ResourceSlice (pod-resources' `ClaimResource.device_name`).
    pub name: String,
    /// The device-plugin resource it mirrors (`nvidia.com/gpu`).
    pub resource: String,
    /// Its device ID in that resource (`<uuid>` or `<uuid>::<n>`).
    pub id: String,
}

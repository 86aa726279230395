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
pub mod report;
pub mod sampler;
pub mod view;

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
}

/// One GPU's figures. A figure NVML does not give (not supported, an error) is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    /// The GPU's UUID (`GPU-…`).
    pub uuid: String,
    /// NVML index.
    pub index: u32,
    /// Product name (`NVIDIA H100 80GB HBM3`).
    pub model: String,
    /// Percent of the last sample period one or more kernels ran
    /// (`nvmlDeviceGetUtilizationRates().gpu`), 0–100.
    pub utilization_percent: Option<u32>,
    /// Framebuffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory in all, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Processes running on it (not on its MIG devices: see [`GpuSample::mig`]).
    pub processes: Vec<ProcessSample>,
    /// Its MIG devices, when MIG mode is on (NVML has no per-process utilisation on MIG).
    pub mig: Vec<MigSample>,
}

/// One MIG device's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigSample {
    /// The MIG device's UUID (`MIG-…`).
    pub uuid: String,
    /// SM use from GPM samples, percent, where the GPU supports GPM; else `None`.
    pub utilization_percent: Option<u32>,
    /// Memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Memory in all, bytes.
    pub memory_total_bytes: Option<u64>,
}

/// One process on a GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessSample {
    /// Host PID (NVML reports PIDs in the host's namespace).
    pub pid: u32,
    /// SM utilisation over the last sample period, percent (`nvmlDeviceGetProcessUtilization`;
    /// `Some(0)` for a process without a sample since the last query, as NVML keeps samples only
    /// of processes that used the GPU; `None`: unknown, the query failed or is not supported).
    pub sm_util_percent: Option<u32>,
    /// GPU memory it uses, bytes (`nvmlDeviceGetComputeRunningProcesses_v3`, MPS clients
    /// through the MPS variant); `None` when NVML does not say.
    pub memory_used_bytes: Option<u64>,
    /// The pod UID its cgroup names; `None`: not a pod's process (or /proc unreadable).
    pub pod_uid: Option<String>,
    /// The container ID its cgroup names (containerd/CRI-O), when found.
    pub container_id: Option<String>,
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

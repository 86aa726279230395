//! One GPU's use at one moment, as a [`crate::inventory::GpuSource`] reads it (NVML or the
//! simulated node): plain data, attributed to containers by [`crate::usage`].

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

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
    /// Whether the GPU takes per-cgroup memory limits (`nvmlDeviceGetMemoryLimits_v1` answers
    /// for the cgroup root: driver R615 and later, cgroup v2); `None` when the source does not
    /// say (a source without the call, or a sample taken without asking).
    pub memory_limits_supported: Option<bool>,
    /// The limits read back for the cgroups of its pod processes that have one (a hard limit
    /// below [`NO_HARD_LIMIT`]), one entry per cgroup, in cgroup order. Filled by the sampler
    /// ([`crate::usage::sampler`]), empty where limits are not supported.
    pub cgroup_limits: Vec<CgroupLimits>,
}

/// "No hard limit" as NVML reads it back: `NVML_DEVICE_MEMORY_LIMIT_MAX` (`ULLONG_MAX`).
pub const NO_HARD_LIMIT: u64 = u64::MAX;

/// One cgroup's GPU memory limits on one GPU as NVML reads them back
/// (`nvmlGetMemoryLimits_v1_t`), bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitReading {
    /// Soft limit (the share guaranteed under memory pressure), bytes; 0: none.
    pub soft: u64,
    /// Hard limit (allocations beyond it fail), bytes; [`NO_HARD_LIMIT`]: none.
    pub hard: u64,
    /// Bytes the cgroup's processes have allocated on the GPU now.
    pub used: u64,
}

impl LimitReading {
    /// Whether a limit is set (a hard limit below [`NO_HARD_LIMIT`], or a soft limit).
    pub fn is_limited(&self) -> bool {
        self.hard != NO_HARD_LIMIT || self.soft != 0
    }
}

/// The limits of one container's cgroup on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLimits {
    /// The cgroup v2 path as `/proc/<pid>/cgroup` names it (`/kubepods.slice/…scope`),
    /// relative to the unified hierarchy's mount.
    pub cgroup: String,
    /// What NVML reads back.
    pub reading: LimitReading,
}

/// What a [`crate::inventory::GpuSource`] answers when asked for one cgroup's memory limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitsRead {
    /// The source, driver or GPU has no per-cgroup memory limits (`NVML_ERROR_NOT_SUPPORTED`,
    /// no `nvmlDeviceGetMemoryLimits_v1` in the driver, a simulated node before R615).
    Unsupported,
    /// The cgroup exists; its limits (no limit reads as soft 0, hard [`NO_HARD_LIMIT`]).
    Read(LimitReading),
    /// The cgroup's directory is gone; `still` is a limit NVML still reports for it (the
    /// driver should clear a removed cgroup's limits: `Some` means it did not).
    Gone {
        /// The limit still reported for the removed cgroup, if any.
        still: Option<LimitReading>,
    },
    /// The query failed (an NVML error other than not supported), one line.
    Failed(String),
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
    /// Its cgroup v2 path (the `0::` line of `/proc/<pid>/cgroup`), when it is in a pod and
    /// the line is there: the name NVML keys per-cgroup memory limits by (below the unified
    /// hierarchy's mount).
    pub cgroup: Option<String>,
}

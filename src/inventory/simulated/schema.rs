//! The simulated node file's schema: the serde structs a node file deserialises into (the YAML
//! itself is documented in the parent module), unknown keys refused.

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeFile {
    pub(super) gpus: Vec<GpuEntry>,
    #[serde(default)]
    pub(super) links: Vec<LinkEntry>,
    #[serde(default)]
    pub(super) nvswitch: bool,
    #[serde(default, rename = "driverVersion")]
    pub(super) driver_version: Option<String>,
    /// `cgroupVersion`: 1 or 2 (default 2).
    #[serde(default, rename = "cgroupVersion")]
    pub(super) cgroup_version: Option<u8>,
}

/// `links[i]`: how two GPUs are connected.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LinkEntry {
    pub(super) gpus: [u32; 2],
    pub(super) nvlinks: Option<u32>,
    pub(super) pcie: Option<PcieValue>,
}

/// `links[i].pcie`: the PCIe level two GPUs share.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum PcieValue {
    /// One PCIe switch.
    Single,
    /// Several PCIe switches below one host bridge.
    Multiple,
    /// One host bridge.
    Hostbridge,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct GpuEntry {
    pub(super) model: String,
    #[serde(rename = "memoryMiB")]
    pub(super) memory_mib: u64,
    pub(super) count: Option<u32>,
    pub(super) uuid: Option<String>,
    pub(super) compute_capability: Option<String>,
    pub(super) numa_node: Option<i64>,
    /// `pcieRoot`: the PCIe root complex, `pci<domain>:<bus>`.
    pub(super) pcie_root: Option<String>,
    /// `pciDeviceId`: the PCI device ID as NVML reports it, hex (`0x233010DE`).
    pub(super) pci_device_id: Option<String>,
    pub(super) health: Option<HealthValue>,
    pub(super) xid: Option<u64>,
    pub(super) mig: Option<MigEntry>,
    pub(super) utilization: Option<u32>,
    #[serde(rename = "memoryUsedMiB")]
    pub(super) memory_used_mib: Option<u64>,
    pub(super) processes: Option<Vec<ProcessEntry>>,
    /// `memoryLimits`: the per-cgroup GPU memory limits NVML would read back.
    pub(super) memory_limits: Option<Vec<LimitEntry>>,
}

/// `gpus[i].memoryLimits[k]`: one cgroup's GPU memory limits on the GPU, as the driver holds
/// them after a hook set them (`nvmlDeviceGetMemoryLimits_v1`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitEntry {
    /// The cgroup v2 path as `/proc/<pid>/cgroup` names it.
    pub(super) cgroup: String,
    #[serde(rename = "hardMiB")]
    pub(super) hard_mib: u64,
    #[serde(rename = "softMiB", default)]
    pub(super) soft_mib: u64,
}

/// `gpus[i].processes[k]`: one process on the GPU.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ProcessEntry {
    pub(super) pid: u32,
    #[serde(default)]
    pub(super) sm_util: u32,
    #[serde(rename = "memoryMiB", default)]
    pub(super) memory_mib: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub(super) enum HealthValue {
    Healthy,
    Unhealthy,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MigEntry {
    #[serde(default)]
    pub(super) devices: Vec<MigDeviceEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MigDeviceEntry {
    pub(super) profile: String,
    pub(super) count: Option<u32>,
    #[serde(rename = "memoryUsedMiB")]
    pub(super) memory_used_mib: Option<u64>,
    /// `placementStart`: the first memory slice of the device's GPU instance (only with
    /// `count` 1); default the first free placement of its profile.
    #[serde(rename = "placementStart")]
    pub(super) placement_start: Option<u32>,
}

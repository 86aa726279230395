//! The `/status` JSON: one node, per GPU its figures and under it each advertised device with
//! its holder and that container's use. Built by [`crate::usage::report::Usage::view`] (pure),
//! served by [`crate::status::serve`], read by `slicelet top` ([`crate::top`]).
//!
//! The shape (every field always present; `null` where unknown):
//!
//! ```text
//! {
//!   "generation": 3,                     // applied policy generation (0: none)
//!   "ready": true, "ready_reason": null, // as /readyz
//!   "sampled_at_unix_ms": 1700000000000, // the latest GPU use sample (null: none yet)
//!   "checkpoint_error": null,            // why processes could not be attributed
//!   "unattributed_processes": 0,
//!   "gpus": [{
//!     "index": 0, "uuid": "GPU-…", "model": "NVIDIA H100 80GB HBM3",
//!     "utilization_percent": 40, "memory_used_bytes": 1073741824, "memory_total_bytes": …,
//!     "unattributed_processes": 0,
//!     "devices": [{
//!       "resource": "nvidia.com/gpu-shared", "id": "GPU-…::0", "unit_uuid": "GPU-…",
//!       "replica": 0, "mig_profile": null, "health": "Healthy",
//!       "draining": null, "retained": false,
//!       "holder": {"namespace": "ml", "pod": "a", "container": "main"},
//!       "sm_util_percent": 30, "memory_used_bytes": 1073741824, "idle_seconds": 0.0,
//!       "memory_limit_bytes": 21474836480, // the holder's GPU memory limit (policy `memory`)
//!       "memory_limit_enforced": true      // read back through NVML (null: not yet known)
//!     }],
//!     "memory_limits_supported": true      // the GPU takes per-cgroup limits (null: unknown)
//!   }],
//!   "free": {"nvidia.com/gpu-shared": 6}  // Healthy and not held, per resource
//! }
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The whole `/status` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// Generation of the applied policy (0: none applied yet); filled per request from the
    /// supervisor's status.
    pub generation: u64,
    /// Whether `/readyz` says ready.
    pub ready: bool,
    /// Why not ready (`/readyz`'s first line), when not.
    pub ready_reason: Option<String>,
    /// When the latest GPU use sample was taken, milliseconds since the Unix epoch; `None`
    /// until the first (or with sampling off).
    pub sampled_at_unix_ms: Option<u64>,
    /// Why the kubelet's checkpoint could not be used with the latest sample (then no process
    /// is attributed to a container).
    pub checkpoint_error: Option<String>,
    /// Processes counted at GPU level only, over every GPU.
    pub unattributed_processes: u64,
    /// One entry per GPU (advertised or sampled), by index.
    pub gpus: Vec<GpuView>,
    /// Per resource, devices that are Healthy and not held.
    pub free: BTreeMap<String, usize>,
}

/// One physical GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// NVML index.
    pub index: u32,
    /// The GPU's UUID (`GPU-…`).
    pub uuid: String,
    /// Product name; `None` until sampled.
    pub model: Option<String>,
    /// Utilisation, percent (0–100).
    pub utilization_percent: Option<u32>,
    /// Framebuffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory in all, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Processes on it that could not be given to a container.
    pub unattributed_processes: u32,
    /// Every advertised device on it (its MIG devices' included), by resource, then plan
    /// order.
    pub devices: Vec<DeviceView>,
    /// Whether it takes per-cgroup memory limits (driver R615 and later, cgroup v2); `None`
    /// until sampled, or when the source cannot tell.
    #[serde(default)]
    pub memory_limits_supported: Option<bool>,
}

/// One advertised device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceView {
    /// The extended resource (`nvidia.com/gpu-shared`).
    pub resource: String,
    /// The device ID the kubelet sees (`GPU-…::0`, `MIG-…`, `GPU-…`).
    pub id: String,
    /// The unit behind it: the GPU's UUID, or the MIG device's.
    pub unit_uuid: String,
    /// Replica number, for time-sliced and MPS devices.
    pub replica: Option<u32>,
    /// MIG profile (`1g.10gb`), for MIG devices.
    pub mig_profile: Option<String>,
    /// `Healthy` or `Unhealthy`, as advertised.
    pub health: String,
    /// Why it is advertised Unhealthy while a re-purposed GPU drains (`draining: held by
    /// ns/pod`).
    pub draining: Option<String>,
    /// Advertised only because a container still holds it (the policy no longer has it).
    pub retained: bool,
    /// The container holding it (the first, in (namespace, pod, container) order, when
    /// pod-resources lists several, e.g. an init container and the app container).
    pub holder: Option<HolderView>,
    /// The holder's SM use on this unit, percent; `None` when free or not sampled.
    pub sm_util_percent: Option<u32>,
    /// The holder's GPU memory on this unit, bytes; `None` when free or not sampled.
    pub memory_used_bytes: Option<u64>,
    /// Seconds from the holder's last sample with SM use > 0 (or from when it was first seen)
    /// to the latest sample; `None` when free or not sampled.
    pub idle_seconds: Option<f64>,
    /// The holder's hard GPU memory limit on this unit, bytes (the policy's `memory.hard`
    /// times the replicas it holds there); `None` without limits, when free or not sampled.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Whether that limit is read back for the holder's cgroup through NVML; `None` while not
    /// known (no process of the holder on the GPU yet).
    #[serde(default)]
    pub memory_limit_enforced: Option<bool>,
}

/// A container, as pod-resources names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
}

impl std::fmt::Display for HolderView {
    /// `namespace/pod/container`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.pod, self.container)
    }
}

impl From<&crate::in_use::Holder> for HolderView {
    fn from(h: &crate::in_use::Holder) -> Self {
        HolderView {
            namespace: h.namespace.clone(),
            pod: h.pod.clone(),
            container: h.container.clone(),
        }
    }
}

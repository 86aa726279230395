//! What GPUs a node has: [`Gpu`], [`MigDevice`], [`Inventory`], and the [`GpuSource`] trait
//! with its two implementations, NVML ([`nvml::NvmlSource`], the only user of nvml-wrapper) and
//! a simulated node file ([`simulated::SimulatedSource`]). Nothing here decides sharing.
//! [`mig`] holds the MIG facts both sources share (profile names, nvidia-caps minors).

pub mod compute;
pub mod mig;
pub mod nvml;
pub mod sample;
pub mod simulated;
pub mod topology;

/// The first driver branch with per-cgroup GPU memory limits (R615, CUDA 13.4).
pub const MEMORY_LIMITS_MIN_DRIVER: u32 = 615;

use crate::device_health::Health;
use std::path::PathBuf;

/// One MIG device (a GPU instance with one compute instance) of a MIG-enabled GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// NVML's MIG device index on the parent GPU (the `m` of `"<gpu>:<m>"`). NVML's slots can
    /// be sparse (a destroyed instance leaves a gap), so indices need not be dense.
    pub index: u32,
    /// `MIG-…` UUID: what `NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` carry.
    pub uuid: String,
    /// Profile name as NVIDIA spells it, e.g. `1g.10gb` or `1g.24gb+me` (see [`mig`]).
    pub profile: String,
    /// Memory of the slice, MiB.
    pub memory_mib: u64,
    /// GPU-instance id on the parent GPU.
    pub gi_id: u32,
    /// Compute-instance id inside the GPU instance.
    pub ci_id: u32,
    /// GPU slices of the GPU instance (the `3` of `3g.40gb`).
    pub gpu_slices: u32,
    /// Compute slices of the compute instance (equal to `gpu_slices` unless the profile is
    /// `<c>c.<g>g…`).
    pub compute_slices: u32,
    /// The nvidia-caps minors granting access to its GPU and compute instance, when the
    /// driver's `mig-minors` file was read (see [`mig::resolve_caps`]).
    pub caps: Option<MigCaps>,
    /// Where its GPU instance sits on the parent GPU (NVML's `nvmlGpuInstanceGetInfo`
    /// placement), when the source can tell: needed to know which placements of a dynamic MIG
    /// GPU are still free.
    pub placement: Option<MigPlacement>,
    /// Unhealthy when this MIG device is known to be unusable. Discovery reports what it sees;
    /// the effective health (Xids, watch failures, MPS readiness folded in) comes from
    /// [`crate::health_tracker::Tracker::effective`]. A MIG device is advertised healthy only
    /// when it and its parent GPU ([`Gpu::health`]) both are.
    pub health: Health,
}

impl MigDevice {
    /// A MIG device laid out as simulated nodes (and tests) lay them out: the `index`-th slot,
    /// GPU-instance id `index + 1`, compute-instance id 0, memory and slice counts from the
    /// profile, Healthy, cap minors unknown.
    pub fn laid_out(index: u32, uuid: String, profile_name: &str, profile: &mig::Profile) -> Self {
        MigDevice {
            index,
            uuid,
            profile: profile_name.to_string(),
            memory_mib: profile.memory_gb * 1024,
            gi_id: index + 1,
            ci_id: 0,
            gpu_slices: profile.gpu_slices,
            compute_slices: profile.compute_slices,
            caps: None,
            placement: None,
            health: Health::Healthy,
        }
    }
}

/// Where a GPU instance sits on its GPU: NVML's `nvmlGpuInstancePlacement_t`. Both numbers
/// count **memory slices** (8 on an A100, H100 or H200, 4 on an A30): the instance covers
/// slices `start .. start + size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MigPlacement {
    /// The first memory slice.
    pub start: u32,
    /// How many memory slices.
    pub size: u32,
}

impl MigPlacement {
    /// Whether the two placements share a memory slice (the driver refuses a GPU instance
    /// whose placement overlaps an existing one's with `NVML_ERROR_INSUFFICIENT_RESOURCES`).
    pub fn overlaps(&self, other: &MigPlacement) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }
}

/// One GPU instance profile a MIG-enabled GPU offers (NVML's
/// `nvmlDeviceGetGpuInstanceProfileInfo`), with every placement the driver allows it
/// (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`), free or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigProfileInfo {
    /// The profile as NVIDIA names it: `1g.10gb`, `1g.10gb+me`.
    pub profile: String,
    /// NVML's profile index (`NVML_GPU_INSTANCE_PROFILE_*`, the argument of the profile
    /// query).
    pub nvml_profile: u32,
    /// NVML's profile id (`nvmlGpuInstanceProfileInfo_t.id`, what the create call takes).
    pub id: u32,
    /// Compute slices of an instance of it (the `g` of the name).
    pub gpu_slices: u32,
    /// Memory of an instance of it, MiB.
    pub memory_mib: u64,
    /// At most this many instances of it at once on the GPU.
    pub instance_count: u32,
    /// Every placement the driver allows it, `start` ascending.
    pub placements: Vec<MigPlacement>,
}

/// A MIG-enabled GPU's geometry: its slices and the profiles it can place. Discovered for
/// every GPU in MIG mode; what dynamic MIG publishes and creates from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigGeometry {
    /// Memory slices of the whole GPU (the end of the widest placement: 8, or 4 on an A30).
    pub memory_slices: u32,
    /// Compute slices of the whole GPU (the largest profile's slice count: 7, or 4 on an A30).
    pub compute_slices: u32,
    /// Its GPU instance profiles, NVML profile index ascending.
    pub profiles: Vec<MigProfileInfo>,
}

impl MigGeometry {
    /// The geometry of a product from NVIDIA's table ([`mig::table`]), as a simulated node
    /// and the fake NVML lay it out; `None` for a product without one.
    pub fn from_table(product: &str, memory_mib: u64) -> Option<MigGeometry> {
        let t = mig::table::for_product(product, memory_mib)?;
        Some(MigGeometry {
            memory_slices: t.memory_slices,
            compute_slices: t.compute_slices,
            profiles: t
                .profiles
                .iter()
                .map(|r| MigProfileInfo {
                    profile: r.name.to_string(),
                    nvml_profile: r.nvml_profile,
                    id: r.id,
                    gpu_slices: r.gpu_slices,
                    memory_mib: r.memory_mib,
                    instance_count: r.instance_count,
                    placements: r
                        .starts
                        .iter()
                        .map(|&start| MigPlacement {
                            start,
                            size: r.size,
                        })
                        .collect(),
                })
                .collect(),
        })
    }

    /// The profile with this name.
    pub fn profile(&self, name: &str) -> Option<&MigProfileInfo> {
        self.profiles.iter().find(|p| p.profile == name)
    }
}

/// What a GPU source created for a dynamic MIG request: the new MIG device (its UUID is what
/// the container is given) and where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedMig {
    /// The parent GPU's UUID.
    pub parent_uuid: String,
    /// The new MIG device, as discovery will report it from now on.
    pub device: MigDevice,
}

/// The `N`s of `/dev/nvidia-caps/nvidia-cap<N>` for one MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigCaps {
    /// Access to the GPU instance (`gpu<minor>/gi<gi>/access`).
    pub gi_access: u32,
    /// Access to the compute instance (`gpu<minor>/gi<gi>/ci<ci>/access`).
    pub ci_access: u32,
}

/// One physical GPU as discovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index (0-based, dense).
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Product name as NVML reports it, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// Total framebuffer memory, MiB.
    pub memory_mib: u64,
    /// Minor number: the `N` of `/dev/nvidiaN`, when known.
    pub minor: Option<u32>,
    /// CUDA compute capability `(major, minor)`, when known.
    pub compute_capability: Option<(u32, u32)>,
    /// NUMA node the GPU is attached to, when known.
    pub numa_node: Option<i64>,
    /// The PCIe root complex the GPU hangs off, as sysfs names it (`pci<domain>:<bus>`,
    /// `pci0000:00`; see [`is_pcie_root`]), when known: NVML gives the GPU's PCI bus ID, and
    /// `<sysfs>/bus/pci/devices/<bus id>` links to `…/devices/pci0000:00/…/<bus id>`; a
    /// simulated node's `pcieRoot`. Published to DRA as `resource.kubernetes.io/pcieRoot`.
    pub pcie_root: Option<String>,
    /// The PCI device ID (`nvmlPciInfo_t.pciDeviceId`: device ID in the high 16 bits, vendor
    /// `0x10DE` in the low ones; `0x233010DE` for an H100 SXM5), when known: what NVIDIA's
    /// mig-parted `device-filter` matches.
    pub pci_device_id: Option<u32>,
    /// MIG mode is enabled (current mode).
    pub mig_enabled: bool,
    /// MIG devices, when MIG mode is enabled, sorted by [`MigDevice::index`]. A MIG-enabled
    /// GPU may have none (no instances created yet).
    pub mig_devices: Vec<MigDevice>,
    /// The profiles and placements the GPU offers, when MIG mode is enabled and the source
    /// can tell (NVML's profile and placement queries; a simulated node's table); `None`
    /// otherwise.
    pub mig_geometry: Option<MigGeometry>,
    /// Unhealthy when the GPU is known to be unusable (a simulated failure, a lost GPU), as
    /// discovery reports it; see [`MigDevice::health`] for the effective health.
    pub health: Health,
}

/// Whether `s` names a PCIe root complex as sysfs does (the Linux kernel's `pci%04x:%02x` of
/// the host bridge's PCI domain and root bus, and the value form of the standard DRA
/// attribute `resource.kubernetes.io/pcieRoot`): `pci`, 4 to 8 lowercase hex digits (domains
/// above `ffff` print wider), `:`, 2 lowercase hex digits.
pub fn is_pcie_root(s: &str) -> bool {
    let hex = |t: &str| {
        t.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    s.strip_prefix("pci")
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(domain, bus)| {
            (4..=8).contains(&domain.len()) && hex(domain) && bus.len() == 2 && hex(bus)
        })
}

/// Every GPU of the node, sorted by index, and how they are connected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The GPUs, sorted by [`Gpu::index`].
    pub gpus: Vec<Gpu>,
    /// The links discovery recorded between GPU pairs (read once per discovery; see
    /// [`topology`]). Empty: every pair is derived from the NUMA nodes.
    pub links: topology::Topology,
    /// The NVIDIA driver's version as NVML reports it (`nvmlSystemGetDriverVersion`,
    /// `550.54.15`); `None` on a simulated node without `driverVersion`, or when NVML does not
    /// say.
    pub driver_version: Option<String>,
    /// Whether the node runs the unified cgroup hierarchy (cgroup v2: `/sys/fs/cgroup` has
    /// `cgroup.controllers`), which the driver's per-cgroup GPU memory limits need. True
    /// from [`Inventory::new`]; NVML discovery reads it, a simulated node's `cgroupVersion`
    /// sets it.
    pub cgroup_v2: bool,
}

impl Inventory {
    /// Builds an inventory, sorting the GPUs by index, with no recorded links.
    pub fn new(mut gpus: Vec<Gpu>) -> Self {
        gpus.sort_by_key(|g| g.index);
        Inventory {
            gpus,
            links: topology::Topology::default(),
            driver_version: None,
            cgroup_v2: true,
        }
    }

    /// Why this node cannot take per-cgroup GPU memory limits, or `None` when it can: the
    /// driver is older than R[`MEMORY_LIMITS_MIN_DRIVER`] or of unknown version, or the node
    /// runs cgroup v1 (NVML `nvmlDeviceSetMemoryLimits_v1` needs both).
    pub fn memory_limits_unsupported(&self) -> Option<String> {
        let Some(v) = self.driver_version.as_deref() else {
            return Some(
                "the driver version is unknown (memory limits need R615 or later)".to_string(),
            );
        };
        let major = v.split('.').next().and_then(|m| m.parse::<u32>().ok());
        if major.is_none_or(|m| m < MEMORY_LIMITS_MIN_DRIVER) {
            return Some(format!(
                "driver {v} is older than R{MEMORY_LIMITS_MIN_DRIVER}, the first with per-cgroup memory limits"
            ));
        }
        if !self.cgroup_v2 {
            return Some("the node runs cgroup v1 (memory limits need cgroup v2)".to_string());
        }
        None
    }

    /// The same inventory with these recorded links.
    pub fn with_links(mut self, links: topology::Topology) -> Self {
        self.links = links;
        self
    }

    /// How GPUs `a` and `b` (indices) are connected: the recorded link, or, when none was
    /// recorded, [`topology::PathLevel::from_numa`] of their NUMA nodes (unknown GPUs count as
    /// on no NUMA node).
    pub fn link(&self, a: u32, b: u32) -> topology::Link {
        if let Some(l) = self.links.get(a, b) {
            return *l;
        }
        let numa = |i: u32| self.by_index(i).and_then(|g| g.numa_node);
        topology::Link::pcie(topology::PathLevel::from_numa(numa(a), numa(b)))
    }

    /// Every GPU pair (lower index first) with its [`Inventory::link`], for `slicelet plan`.
    pub fn link_views(&self) -> Vec<topology::LinkView> {
        let mut out = Vec::new();
        for (i, a) in self.gpus.iter().enumerate() {
            for b in &self.gpus[i + 1..] {
                let l = self.link(a.index, b.index);
                out.push(topology::LinkView {
                    gpus: [a.index, b.index],
                    nvlinks: l.nvlinks,
                    nvswitch: l.nvswitch,
                    pcie: l.pcie,
                    score: l.score(),
                });
            }
        }
        out
    }

    /// The GPU with this index.
    pub fn by_index(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The GPU with this UUID.
    pub fn by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

/// Test helpers: MIG devices of `profile` with readable UUIDs
/// (`MIG-<gpu>-<index>…`), GI ids from 1, CI id 0, memory from the profile name.
#[cfg(test)]
pub(crate) fn test_mig(gpu: u32, layout: &[(&str, u32)]) -> Vec<MigDevice> {
    let mut out = Vec::new();
    for (profile, count) in layout {
        let p = mig::Profile::parse(profile).expect("test profile");
        for _ in 0..*count {
            let m = out.len() as u32;
            let uuid = format!("MIG-{gpu:04}{m:04}-0000-0000-0000-000000000000");
            out.push(MigDevice::laid_out(m, uuid, profile, &p));
        }
    }
    out
}

/// Discovering GPUs failed.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// NVML could not be loaded or initialised.
    #[error("initialising NVML from {library}: {reason}")]
    NvmlInit {
        /// The library path that was loaded.
        library: String,
        /// NVML's error.
        reason: String,
    },
    /// An NVML query failed.
    #[error("NVML query {query} for GPU {index}: {reason}")]
    NvmlQuery {
        /// The query, e.g. `nvmlDeviceGetUUID`.
        query: &'static str,
        /// The GPU index.
        index: u32,
        /// NVML's error.
        reason: String,
    },
    /// An NVML query or setting for the device with this UUID failed.
    #[error("NVML {query} for {uuid}: {reason}")]
    NvmlDevice {
        /// The call, e.g. `nvmlDeviceSetComputeMode`.
        query: &'static str,
        /// The GPU UUID.
        uuid: String,
        /// NVML's error.
        reason: String,
    },
    /// An NVML query about one MIG device (or MIG slot) of a GPU failed.
    #[error("NVML query {query} for MIG device {gpu}:{slot}: {reason}")]
    NvmlMigQuery {
        /// The query, e.g. `nvmlDeviceGetGpuInstanceId`.
        query: &'static str,
        /// The parent GPU's index.
        gpu: u32,
        /// The MIG device index (NVML slot) on that GPU.
        slot: u32,
        /// NVML's error.
        reason: String,
    },
    /// NVML could not count the GPUs.
    #[error("NVML device count: {0}")]
    NvmlCount(String),
    /// The simulated node file could not be read.
    #[error("reading simulated node {path}")]
    SimulatedRead {
        /// The node file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Creating a GPU instance and its compute instance at a placement failed (NVML's reason:
    /// `Insufficient Resources` when the placement overlaps an instance, `In use by another
    /// client` when the GPU is busy).
    #[error("creating MIG {profile} at placement {start} on {uuid}: {reason}")]
    MigCreate {
        /// The parent GPU's UUID.
        uuid: String,
        /// The profile, e.g. `3g.40gb`.
        profile: String,
        /// The placement's first memory slice.
        start: u32,
        /// The driver's (or the simulated node's) reason.
        reason: String,
    },
    /// Destroying a compute instance and its GPU instance failed.
    #[error("destroying MIG GPU instance {gi_id} (compute instance {ci_id}) on {uuid}: {reason}")]
    MigDestroy {
        /// The parent GPU's UUID.
        uuid: String,
        /// The GPU instance id.
        gi_id: u32,
        /// The compute instance id.
        ci_id: u32,
        /// The driver's (or the simulated node's) reason.
        reason: String,
    },
    /// The simulated node file is invalid.
    #[error("invalid simulated node {path}: {path_in_file}: {message}{}", location.map(|(l, c)| format!(" (line {l}, column {c})")).unwrap_or_default())]
    SimulatedInvalid {
        /// The node file.
        path: PathBuf,
        /// Field path inside the file, e.g. `gpus[0].memoryMiB`.
        path_in_file: String,
        /// Line and column, when known.
        location: Option<(usize, usize)>,
        /// What is wrong.
        message: String,
    },
}

/// A GPU's compute mode (NVML's `nvmlComputeMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// Any number of processes may use the GPU.
    Default,
    /// Deprecated by NVIDIA; reported only.
    ExclusiveThread,
    /// No process may create a context.
    Prohibited,
    /// One process at a time holds a context (with MPS: the MPS server).
    ExclusiveProcess,
}

/// An Xid (GPU error) reported for a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the device it concerns (a GPU, or a MIG device).
    pub uuid: String,
    /// The Xid number.
    pub xid: u64,
}

/// Where a source's background event watcher delivers health events (the hardware actor
/// forwards them to the supervisor's bounded channel; see [`crate::daemon::hardware`]).
pub type EventSink = std::sync::Arc<dyn Fn(crate::device_health::HealthEvent) + Send + Sync>;

/// A source of GPUs: NVML on a real node, a file for a simulated one. Every method may block
/// (NVML calls can take hundreds of milliseconds): they are called only on the hardware actor's
/// thread ([`crate::daemon::hardware::Hardware`]), never on the async runtime.
pub trait GpuSource: Send {
    /// Discovers every GPU now.
    ///
    /// # Errors
    /// [`InventoryError`] naming the query or file that failed.
    fn discover(&mut self) -> Result<Inventory, InventoryError>;

    /// Whether the device still answers (NVML: its handle and memory queries succeed). Used
    /// before a device held Unhealthy by an Xid may recover.
    fn probe(&mut self, _uuid: &str) -> bool {
        true
    }

    /// Xid events found since the last call (a simulated node's `xid:` entries).
    fn take_events(&mut self) -> Vec<XidEvent> {
        Vec::new()
    }

    /// Sets the compute mode of the GPU `uuid` and returns the mode it had, or `None` when the
    /// source has no compute modes (the default: a simulated node). Used for MPS with
    /// `sharing.mps.exclusiveProcess`.
    ///
    /// # Errors
    /// [`InventoryError`] naming the query that failed.
    fn set_compute_mode(
        &mut self,
        _uuid: &str,
        _mode: ComputeMode,
    ) -> Result<Option<ComputeMode>, InventoryError> {
        Ok(None)
    }
    /// (Re)starts watching the GPUs of the last discovery for events (NVML: Xid critical
    /// errors on a dedicated thread, and whether each GPU could be registered for them),
    /// delivering them to `sink`. The default watches nothing.
    fn watch_events(&mut self, _sink: EventSink) {}

    /// Samples every GPU now: utilisation, memory used/total, and per process SM utilisation
    /// and memory (host PIDs; `pod_uid`/`container_id` are left `None`: the sampler in
    /// [`crate::usage::sampler`] fills them in). A figure the source cannot give is `None`; a
    /// GPU that is lost is left out. The default samples nothing (an empty list).
    ///
    /// # Errors
    /// [`InventoryError`] when the source as a whole cannot be sampled (NVML cannot count its
    /// GPUs, a simulated node file that became invalid); the caller keeps the last figures.
    fn sample(&mut self) -> Result<Vec<crate::inventory::sample::GpuSample>, InventoryError> {
        Ok(Vec::new())
    }

    /// Whether GPU `uuid` takes per-cgroup memory limits (NVML: `nvmlDeviceGetMemoryLimits_v1`
    /// answers for the cgroup root; driver R615 and later, cgroup v2). `None`: the source
    /// cannot tell (the default).
    fn memory_limits_supported(&mut self, _uuid: &str) -> Option<bool> {
        None
    }

    /// The memory limits of `cgroup` (a cgroup v2 path as `/proc/<pid>/cgroup` names it,
    /// below the unified hierarchy's mount) on GPU `uuid`
    /// (`nvmlDeviceGetMemoryLimits_v1`). The default: [`sample::LimitsRead::Unsupported`].
    fn memory_limits(&mut self, _uuid: &str, _cgroup: &str) -> sample::LimitsRead {
        sample::LimitsRead::Unsupported
    }

    /// Creates a GPU instance of `profile` at the placement starting at memory slice `start` on
    /// the MIG-enabled GPU `parent_uuid`, and one compute instance spanning it
    /// (`nvmlDeviceCreateGpuInstanceWithPlacement`, `nvmlGpuInstanceCreateComputeInstance`),
    /// and returns the new MIG device with its UUID. Never toggles MIG mode. The default
    /// refuses: the source cannot create MIG devices.
    ///
    /// # Errors
    /// [`InventoryError::MigCreate`] with the driver's reason (an overlapping or unknown
    /// placement, an unknown profile, a GPU not in MIG mode); a GPU instance created before
    /// its compute instance failed is destroyed again before the error returns.
    fn create_mig(
        &mut self,
        parent_uuid: &str,
        profile: &str,
        start: u32,
    ) -> Result<CreatedMig, InventoryError> {
        Err(InventoryError::MigCreate {
            uuid: parent_uuid.to_string(),
            profile: profile.to_string(),
            start,
            reason: format!("{} cannot create MIG devices", self.describe()),
        })
    }

    /// Destroys compute instance `ci_id` of GPU instance `gi_id` on GPU `parent_uuid`, then the
    /// GPU instance (`nvmlComputeInstanceDestroy`, `nvmlGpuInstanceDestroy`). A GPU instance
    /// that no longer exists is success (destroying is idempotent, so a restart may repeat it).
    ///
    /// # Errors
    /// [`InventoryError::MigDestroy`] with the driver's reason (`In use by another client`
    /// while a process still runs on it).
    fn destroy_mig(
        &mut self,
        parent_uuid: &str,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), InventoryError> {
        Err(InventoryError::MigDestroy {
            uuid: parent_uuid.to_string(),
            gi_id,
            ci_id,
            reason: format!("{} cannot destroy MIG devices", self.describe()),
        })
    }

    /// A short description for logs, e.g. `NVML (libnvidia-ml.so.1)`.
    fn describe(&self) -> String;
}

/// Test helpers: a node of `n` identical GPUs with readable UUIDs (`GPU-<index>…`), NUMA node
/// `index / 4`.
#[cfg(test)]
pub(crate) fn test_node(n: u32) -> Inventory {
    Inventory::new(
        (0..n)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{i:08}-0000-0000-0000-000000000000"),
                model: "NVIDIA H100 80GB HBM3".to_string(),
                memory_mib: 81559,
                minor: Some(i),
                compute_capability: Some((9, 0)),
                numa_node: Some(i64::from(i / 4)),
                pcie_root: None,
                pci_device_id: Some(0x2330_10DE),
                mig_enabled: false,
                mig_devices: Vec::new(),
                mig_geometry: None,
                health: Health::Healthy,
            })
            .collect(),
    )
}

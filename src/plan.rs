//! The pure core that turns a [`Policy`] and an [`Inventory`] into a [`Plan`]: which resources
//! are advertised, with which virtual device IDs, and which physical unit (a whole GPU or a MIG
//! device) backs each one.
//!
//! Rules (from the policy reference in docs/policy.md):
//! - `flags.migStrategy` decides the node's resources before any sharing:
//!   - `none`: every GPU whole as `nvidia.com/gpu`, MIG-enabled or not (a warning names each
//!     MIG-enabled GPU).
//!   - `single`: every MIG device as `nvidia.com/gpu`; a node without MIG-enabled GPUs falls
//!     back to whole GPUs. Errors naming the GPUs: MIG-enabled and MIG-disabled GPUs mixed, a
//!     MIG-enabled GPU without MIG devices, MIG devices of more than one profile.
//!   - `mixed`: MIG-disabled GPUs whole as `nvidia.com/gpu`, each MIG profile as
//!     `nvidia.com/mig-<profile>` (`+` → `.`). A MIG-enabled GPU without MIG devices is a
//!     warning; everything else is still advertised.
//! - A device that no sharing entry claims is advertised whole under its resource.
//! - A time-sliced device gets `replicas` devices `<uuid>::<n>`, n = 0..replicas-1 (the form
//!   NVIDIA's plugin and dcgm-exporter use; a MIG device's UUID is its `MIG-…` UUID); with
//!   `replicas: 1` the ID is the plain UUID.
//! - An entry naming a resource this node does not have, whose `devices` name devices this node
//!   lacks, or that matches nothing, is a warning (one ConfigMap serves a mixed fleet). A device
//!   claimed by two entries, or a shared resource advertised under a name that unshared devices
//!   still use, is an error naming both.
//! - A resource whose ListAndWatch message would exceed the kubelet's 4 MiB receive limit is an
//!   error: over the limit the kubelet drops the stream silently and reads the resource as 0.
//!
//! No I/O, no async.
//!
//! This file holds the plan's types; `assemble` builds a plan, `select` picks the node's units
//! for each entry, `size` sizes the ListAndWatch message, `index` holds the lookup tables a
//! resource precomputes, `mps`, `drain` and `dra_names` the MPS, drain and DRA naming rules.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use crate::device_health::Health;
use crate::inventory::topology::{Link, PathLevel};
use crate::inventory::{Gpu, Inventory, MigCaps, MigDevice};
use crate::policy::{Delivery, ResourceName, SharedAllocation};

mod assemble;
mod dynamic_mig;
mod index;
pub mod memory;
pub mod mig_layout;
mod select;
mod size;

pub use assemble::{build, build_with};
use index::IdIndex;
pub use index::UnitLinks;
use select::{claim_units, Unit, Units};
pub use size::device_encoded_len;
use size::{framed, id_len};

/// The resource whole GPUs are advertised under (and MIG devices under `migStrategy: single`).
pub const WHOLE_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The kubelet's gRPC receive limit for one ListAndWatch message, bytes (4 MiB).
pub const MAX_LIST_BYTES: usize = 4 * 1024 * 1024;

/// How a resource's devices share their GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Strategy {
    /// Whole devices, no sharing.
    #[serde(rename = "none")]
    None,
    /// Time-sliced replicas: no memory or fault isolation.
    #[serde(rename = "time-slicing")]
    TimeSlicing,
    /// CUDA MPS clients of a supervised control daemon, with enforced per-client limits.
    #[serde(rename = "mps")]
    Mps,
}

/// What a device backed by a MIG device knows about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInfo {
    /// NVML's MIG device index on the parent GPU (the `m` of `"<gpu>:<m>"`).
    pub index: u32,
    /// UUID of the parent GPU.
    pub parent_uuid: String,
    /// Profile, e.g. `1g.10gb`.
    pub profile: String,
    /// GPU-instance id.
    pub gi_id: u32,
    /// Compute-instance id.
    pub ci_id: u32,
    /// nvidia-caps minors for its device specs, when known.
    pub caps: Option<MigCaps>,
}

impl MigInfo {
    /// What a device backed by MIG device `m` of GPU `gpu` knows about it.
    pub fn of(gpu: &Gpu, m: &MigDevice) -> Self {
        MigInfo {
            index: m.index,
            parent_uuid: gpu.uuid.clone(),
            profile: m.profile.clone(),
            gi_id: m.gi_id,
            ci_id: m.ci_id,
            caps: m.caps,
        }
    }
}

/// One device the kubelet sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualDevice {
    /// The ID in ListAndWatch and Allocate: a GPU or MIG UUID, or `<uuid>::<n>`.
    pub id: String,
    /// Index of the physical GPU behind it (the parent GPU of a MIG device).
    pub gpu_index: u32,
    /// The UUID that goes into `NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`: the GPU's
    /// UUID, or the MIG device's `MIG-…` UUID. One per physical unit.
    pub gpu_uuid: String,
    /// Minor number of the physical GPU (`/dev/nvidia<minor>`; the parent's for a MIG
    /// device), when known.
    pub gpu_minor: Option<u32>,
    /// Replica number, for time-sliced devices.
    pub replica: Option<u32>,
    /// Healthy or not (every replica shares its unit's health; a MIG device is healthy when it
    /// and its parent GPU are).
    pub health: Health,
    /// NUMA node of the physical GPU, when known.
    pub numa_node: Option<i64>,
    /// The MIG device behind it; `None` for a whole GPU.
    pub mig: Option<MigInfo>,
}

impl VirtualDevice {
    /// The physical unit behind it as `(GPU index, MIG index)`: the order devices are listed and
    /// environment variables are joined in (a whole GPU sorts before MIG devices; a GPU is
    /// never both).
    pub fn unit_order(&self) -> (u32, Option<u32>) {
        (self.gpu_index, self.mig.as_ref().map(|m| m.index))
    }
}

/// A consumable-capacity DRA resource's sharing (KEP-5075): each unit is published once with
/// `allowMultipleAllocations`, `memory` (the unit's MiB) and `cores` (100, percent of its
/// SMs); a claim that asks for neither consumes the default share, `1/shares` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityPlan {
    /// The default number of shares per unit (the entry's `replicas`).
    pub shares: u32,
}

/// One advertised extended resource and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePlan {
    /// The extended resource name, e.g. `nvidia.com/gpu-shared`.
    pub name: ResourceName,
    /// Whole or time-sliced.
    pub strategy: Strategy,
    /// Replicas per device (1 for whole devices).
    pub replicas: u32,
    /// Served through DRA only (the policy's `dra.resources` or the entry's `dra: true`): the
    /// device plugin does not serve it, and DRA publishes only such resources. False from
    /// [`ResourcePlan::new`].
    pub dra: bool,
    /// Allocate refuses container requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Allocate returns `/dev/nvidia*` device specs (`flags.plugin.passDeviceSpecs`).
    pub pass_device_specs: bool,
    /// Devices ordered by GPU index, then MIG index, then replica.
    pub devices: Vec<VirtualDevice>,
    /// MPS resources: the control daemons behind the devices and their limits.
    pub mps: Option<MpsResource>,
    /// Per-replica GPU memory limits (the entry's `memory`), and where they are not enforced.
    pub memory: Option<memory::PlannedMemory>,
    /// `dra: capacity`: each device is a whole unit (GPU or MIG device) DRA publishes once,
    /// shared by the claims that consume its `memory` and `cores` capacity. `None` for every
    /// other resource.
    pub capacity: Option<CapacityPlan>,
    /// How GetPreferredAllocation places replicas (`flags.plugin.sharedDevicesAllocationPolicy`;
    /// only time-sliced resources with more than one replica use it).
    pub shared_allocation: SharedAllocation,
    /// How Allocate hands the devices to the container runtime
    /// (`flags.plugin.deviceListStrategy`, `deviceIDStrategy`, `cdiAnnotationPrefix`, and the
    /// CDI kind).
    pub delivery: Delivery,
    by_id: IdIndex,
    /// Per device position: the position of the first device of its physical unit (GPU or
    /// MIG device), and how many devices that unit has. Precomputed for
    /// GetPreferredAllocation.
    units: Vec<(usize, usize)>,
    /// The physical units' link scores, precomputed for GetPreferredAllocation.
    links: UnitLinks,
}

impl ResourcePlan {
    /// Builds a resource plan; `devices` must be ordered by GPU index, then MIG index, then
    /// replica.
    pub fn new(
        name: ResourceName,
        strategy: Strategy,
        replicas: u32,
        fail_requests_greater_than_one: bool,
        pass_device_specs: bool,
        devices: Vec<VirtualDevice>,
    ) -> Self {
        let by_id = IdIndex::new(&devices);
        let links = UnitLinks::new(&devices, |_, a, _, b| {
            Link::pcie(PathLevel::from_numa(a, b))
        });
        // Each device's unit as (position of the unit's first device, the unit's device
        // count), from the units the links already grouped (no second pass hashing UUIDs).
        let mut count = vec![0usize; links.len()];
        for &u in &links.unit_of {
            count[u as usize] += 1;
        }
        let units = links
            .unit_of
            .iter()
            .map(|&u| (links.first[u as usize], count[u as usize]))
            .collect();
        ResourcePlan {
            name,
            strategy,
            replicas,
            dra: false,
            fail_requests_greater_than_one,
            pass_device_specs,
            shared_allocation: SharedAllocation::default(),
            delivery: Delivery::default(),
            devices,
            mps: None,
            memory: None,
            capacity: None,
            by_id,
            units,
            links,
        }
    }

    /// The same resource with its units' link scores taken from `inventory`
    /// ([`Inventory::link`]) instead of derived from the devices' NUMA nodes (what
    /// [`ResourcePlan::new`] does).
    pub fn with_links_from(mut self, inventory: &Inventory) -> Self {
        self.set_links_from(inventory);
        self
    }

    /// [`ResourcePlan::with_links_from`] in place.
    pub fn set_links_from(&mut self, inventory: &Inventory) {
        // The units are the same; only the scores change.
        self.links.compute_scores(|a, _, b, _| inventory.link(a, b));
    }

    /// The same resource with `flags.plugin.sharedDevicesAllocationPolicy` set to `policy`.
    pub fn with_shared_allocation(mut self, policy: SharedAllocation) -> Self {
        self.shared_allocation = policy;
        self
    }

    /// The same resource served through DRA only (`dra`) or by the device plugin.
    pub fn with_dra(mut self, dra: bool) -> Self {
        self.dra = dra;
        self
    }

    /// The same resource handing its devices to containers as `delivery` says.
    pub fn with_delivery(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// The physical units and their precomputed link scores.
    pub fn links(&self) -> &UnitLinks {
        &self.links
    }

    /// The physical unit (GPU or MIG device) of the device at `position`: the position of the
    /// unit's first device, and the unit's device count.
    pub fn unit_at(&self, position: usize) -> (usize, usize) {
        self.units[position]
    }

    /// The device with this ID, in O(1).
    pub fn device(&self, id: &str) -> Option<&VirtualDevice> {
        self.by_id.get(&self.devices, id).map(|i| &self.devices[i])
    }

    /// Position of the device with this ID in [`ResourcePlan::devices`], in O(1).
    pub fn position(&self, id: &str) -> Option<usize> {
        self.by_id.get(&self.devices, id)
    }
}

/// Everything the node advertises: one entry per resource name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Resources by name. `Arc` so that an unchanged resource keeps its identity across
    /// rebuilds (see [`Plan::reuse_unchanged`]).
    pub resources: BTreeMap<String, Arc<ResourcePlan>>,
    /// What the drain rules changed (see [`Drain`]); empty when nothing is held or nothing
    /// was withdrawn or re-purposed.
    pub drain: Drain,
    /// The GPUs DRA partitions on demand (`dra.dynamicMig`), index ascending: MIG mode on,
    /// geometry known. Their free placements are published as DRA devices
    /// ([`crate::dra::slices`]); their static MIG devices stay in `resources` as before.
    pub dynamic_mig: Vec<DynamicMigGpu>,
}

/// A GPU whose free MIG space DRA publishes as one device per placement of each profile
/// (docs/mig.md, "Dynamic MIG").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicMigGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// The placements its existing MIG devices occupy (memory slices): no device is published
    /// for a placement overlapping one of them.
    pub occupied: Vec<crate::inventory::MigPlacement>,
    /// The GPU's health in the inventory the plan was built from (the daemon's: Xids, lost
    /// GPUs and the other causes folded in): an Unhealthy GPU publishes no dynamic device.
    pub health: crate::device_health::Health,
}

/// What the drain rules added to a plan, so that a policy or inventory change never pulls a
/// device from under a running container (the kubelet rejects a restarted pod whose devices
/// were dropped or turned Unhealthy: "previously allocated devices are no longer healthy").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drain {
    /// resource → device IDs advertised only because a running container holds them (the
    /// policy no longer has them); withdrawn once released.
    pub retained: BTreeMap<String, BTreeSet<String>>,
    /// resource → device ID → reason (`draining: held by ns/pod`): devices of a GPU that was
    /// re-purposed (another resource, another replica count or strategy) while containers
    /// hold its old devices, advertised Unhealthy until those holders are gone.
    pub draining: BTreeMap<String, BTreeMap<String, String>>,
    /// resource → held device ID → the shape its holder was given (strategy, replicas, DRA),
    /// for held IDs the new plan still has in another shape: remembered while held, so the
    /// drain lasts across replans (the previous plan already has the new shape).
    pub given: BTreeMap<String, BTreeMap<String, (Strategy, u32, bool)>>,
}

impl Drain {
    /// Whether the drain rules changed nothing.
    pub fn is_empty(&self) -> bool {
        self.retained.is_empty() && self.draining.is_empty() && self.given.is_empty()
    }
}

impl Plan {
    /// Replaces every resource that equals the one in `old` with `old`'s `Arc`, so consumers
    /// can tell "unchanged" with a pointer comparison.
    pub fn reuse_unchanged(&mut self, old: &Plan) {
        for (name, res) in self.resources.iter_mut() {
            if let Some(prev) = old.resources.get(name) {
                if **prev == **res {
                    *res = Arc::clone(prev);
                }
            }
        }
    }

    /// The JSON/table view printed by `slicelet plan`.
    pub fn view(&self) -> PlanView {
        PlanView {
            links: Vec::new(),
            warnings: Vec::new(),
            resources: self
                .resources
                .values()
                .map(|r| ResourceView {
                    name: r.name.to_string(),
                    strategy: r.strategy,
                    replicas: r.replicas,
                    dra: r.dra,
                    capacity: r.capacity,
                    mps: r.mps.as_ref().map(MpsResource::view),
                    devices: r
                        .devices
                        .iter()
                        .map(|d| DeviceView {
                            id: d.id.clone(),
                            gpu: d.gpu_uuid.clone(),
                            health: d.health.as_str(),
                            parent: d.mig.as_ref().map(|m| m.parent_uuid.clone()),
                            profile: d.mig.as_ref().map(|m| m.profile.clone()),
                            memory_hard_mib: r.memory.as_ref().map(|m| m.limits.hard_mib),
                            memory_soft_mib: r.memory.as_ref().and_then(|m| m.limits.soft_mib),
                            memory_enforced: r.memory.as_ref().map(|m| m.enforced(d)),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// Serialisable view of a plan:
/// `{"resources":[{"name","strategy","replicas","devices":[…]}],"warnings":[…]}`.
#[derive(Debug, Serialize)]
pub struct PlanView {
    /// Resources sorted by name.
    pub resources: Vec<ResourceView>,
    /// The node-dependent warnings of [`Built::warnings`] (`slicelet plan` fills them; always
    /// present, `[]` when there are none, so a script can test its length).
    pub warnings: Vec<String>,
    /// Every GPU pair and how it is connected (`slicelet plan` fills it from the inventory;
    /// absent with fewer than two GPUs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<crate::inventory::topology::LinkView>,
}

/// One resource in [`PlanView`].
#[derive(Debug, Serialize)]
pub struct ResourceView {
    /// Extended resource name.
    pub name: String,
    /// `none` or `time-slicing`.
    pub strategy: Strategy,
    /// Replicas per device.
    pub replicas: u32,
    /// Served through DRA only (`"dra": true`; absent when the device plugin serves it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dra: bool,
    /// `dra: capacity`: the default share count per unit (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityPlan>,
    /// MPS resources: each control daemon and its per-client limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps: Option<Vec<MpsDaemonView>>,
    /// Devices in ListAndWatch order.
    pub devices: Vec<DeviceView>,
}

/// One device in [`ResourceView`].
#[derive(Debug, Serialize)]
pub struct DeviceView {
    /// Device ID.
    pub id: String,
    /// The UUID the container gets: the GPU's, or the MIG device's.
    pub gpu: String,
    /// `Healthy` or `Unhealthy`.
    pub health: &'static str,
    /// The parent GPU's UUID, for a MIG device (absent for a whole GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The MIG profile, for a MIG device (absent for a whole GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The replica's hard GPU memory limit, MiB (absent without `memory`).
    #[serde(rename = "memoryHardMiB", skip_serializing_if = "Option::is_none")]
    pub memory_hard_mib: Option<u64>,
    /// The replica's soft GPU memory limit, MiB (absent when not set).
    #[serde(rename = "memorySoftMiB", skip_serializing_if = "Option::is_none")]
    pub memory_soft_mib: Option<u64>,
    /// Whether the node enforces the limit on this device's unit (absent without `memory`;
    /// false only under `enforce: best-effort`).
    #[serde(rename = "memoryEnforced", skip_serializing_if = "Option::is_none")]
    pub memory_enforced: Option<bool>,
}

/// A plan that cannot be built for this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// `migStrategy: single` on a node where some GPUs have MIG enabled and others do not.
    #[error("flags.migStrategy: single needs every GPU in the same MIG mode, but MIG is enabled on {} and disabled on {}; use mixed, or change the GPUs' MIG mode", gpus_phrase(.enabled), gpus_phrase(.disabled))]
    MigSingleModesDiffer {
        /// Indices of the MIG-enabled GPUs, comma-separated.
        enabled: String,
        /// Indices of the MIG-disabled GPUs, comma-separated.
        disabled: String,
    },
    /// `migStrategy: single` and a MIG-enabled GPU without MIG devices.
    #[error("flags.migStrategy: single, but GPU {gpu} ({uuid}) has MIG enabled and no MIG devices; create its MIG devices, or use mixed")]
    MigSingleNoDevices {
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
    },
    /// `migStrategy: single` and MIG devices of more than one profile.
    #[error("flags.migStrategy: single needs MIG devices of one profile, but this node has {profiles}; use mixed")]
    MigSingleProfiles {
        /// Each profile and the GPUs that have it, e.g. `1g.10gb on GPUs 0,1; 2g.20gb on GPU 2`.
        profiles: String,
    },
    /// Two sharing entries claim one GPU.
    #[error("{second}: GPU {gpu} ({uuid}) is already claimed by {first}; a GPU can be shared by one entry only, or by several time-slicing entries that each set memory.hard")]
    GpuClaimedTwice {
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// The entry that claimed it first.
        first: String,
        /// The entry that claimed it again.
        second: String,
    },
    /// Two sharing entries claim one MIG device.
    #[error("{second}: MIG device {gpu}:{mig} ({uuid}) is already claimed by {first}; a MIG device can be shared by one entry only")]
    MigClaimedTwice {
        /// Parent GPU index.
        gpu: u32,
        /// MIG device index on that GPU.
        mig: u32,
        /// MIG UUID.
        uuid: String,
        /// The entry that claimed it first.
        first: String,
        /// The entry that claimed it again.
        second: String,
    },
    /// A memory limit under `enforce: required` that this node cannot enforce on a unit.
    #[error("{entry}.memory: cannot be enforced on {unit} ({uuid}): {reason}; fix that, or set memory.enforce: best-effort to serve it unenforced")]
    MemoryNotEnforceable {
        /// The sharing entry.
        entry: String,
        /// `GPU 3` or `MIG device 0:2`.
        unit: String,
        /// The unit's UUID.
        uuid: String,
        /// Why ([`memory::unenforceable`]).
        reason: String,
    },
    /// The hard memory limits on one unit sum to more than its memory.
    #[error("{unit} ({uuid}): the hard memory limits of its replicas sum to {total} MiB ({parts}), but it has {memory} MiB; lower memory.hard or replicas")]
    MemoryOversubscribed {
        /// `GPU 0` or `MIG device 4:1`.
        unit: String,
        /// The unit's UUID.
        uuid: String,
        /// The sum, MiB, with thousands separators.
        total: String,
        /// The unit's memory, MiB, with thousands separators.
        memory: String,
        /// Each entry's share: `sharing.timeSlicing.resources[0]: 3 × 30,720 MiB`.
        parts: String,
    },
    /// A shared resource is advertised under a name that unshared devices still use.
    #[error("{entry}: advertises {name}, but devices {unclaimed} are not shared and are advertised whole as {name}; rename the entry or share every device")]
    NameCollision {
        /// The colliding name.
        name: String,
        /// The entry.
        entry: String,
        /// The unshared devices: GPU indices (`1,2`) or MIG indices (`0:1,0:2`).
        unclaimed: String,
    },
    /// The resource's ListAndWatch message would exceed the kubelet's 4 MiB limit.
    #[error("resource {resource}: {devices} devices make a {bytes}-byte ListAndWatch message, over the kubelet's {limit}-byte limit (the kubelet would drop the stream and read 0); lower replicas")]
    MessageTooLarge {
        /// The resource name.
        resource: String,
        /// How many devices it would have.
        devices: u64,
        /// Encoded message size, bytes.
        bytes: u64,
        /// The limit, bytes.
        limit: usize,
    },
    /// One physical GPU would be served by both DRA and the device plugin.
    #[error("GPU {gpu} ({uuid}) would be in {dra}, which DRA serves, and in {plugin}, which the device plugin serves; a GPU is served by one of the two: list both in dra.resources (or set dra on both entries), or neither")]
    DraOverlap {
        /// GPU index.
        gpu: u32,
        /// GPU UUID (the parent's, for MIG devices).
        uuid: String,
        /// A DRA resource with devices of it.
        dra: String,
        /// A device-plugin resource with devices of it.
        plugin: String,
    },
    /// A GPU `dra.dynamicMig.devices` names has MIG mode off.
    #[error("dra.dynamicMig.devices: GPU {gpu} ({uuid}) has MIG mode off; slicelet never enables MIG mode or resets a GPU: enable it with `nvidia-smi -i {gpu} -mig 1` (then reset the GPU or reboot the node, as nvidia-smi says), or leave the GPU out of dra.dynamicMig.devices")]
    DynamicMigModeOff {
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
    },
    /// A resource shares a dynamic MIG GPU or one of its MIG devices.
    #[error("{resource}: shares GPU {gpu} ({uuid}) or a MIG device of it by {how}, but dra.dynamicMig.devices partitions that GPU on demand; time-slicing, MPS and consumable capacity on a dynamic MIG GPU are not supported: leave it out of one of the two")]
    DynamicMigShared {
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// The resource sharing it.
        resource: String,
        /// `time-slicing`, `MPS` or `consumable capacity`.
        how: String,
    },
    /// A resource advertises a dynamic MIG GPU whole (`migStrategy: none`).
    #[error("{resource}: advertises GPU {gpu} ({uuid}) whole, but dra.dynamicMig.devices partitions it on demand; use flags.migStrategy: mixed")]
    DynamicMigWhole {
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// The resource.
        resource: String,
    },
    /// An MPS entry's clients do not fit a GPU's memory.
    #[error("{entry}.pinnedDeviceMemoryLimit: {replicas} replicas × {limit_mib} MiB = {total_mib} MiB do not fit GPU {gpu} ({uuid}), which has {memory_mib} MiB; lower pinnedDeviceMemoryLimit or replicas")]
    MpsMemory {
        /// The entry.
        entry: String,
        /// Its replicas.
        replicas: u32,
        /// The per-client limit, MiB.
        limit_mib: u64,
        /// replicas × limit, MiB.
        total_mib: u64,
        /// GPU index.
        gpu: u32,
        /// GPU or MIG UUID.
        uuid: String,
        /// The device's memory, MiB.
        memory_mib: u64,
    },
    /// An MPS entry has more replicas than a control daemon serves clients on a GPU.
    #[error("{entry}.replicas: {replicas} replicas exceed the {limit} clients an MPS control daemon serves on GPU {gpu} ({uuid}); use at most {limit}")]
    MpsClientLimit {
        /// The entry.
        entry: String,
        /// Its replicas.
        replicas: u32,
        /// Clients per daemon on this GPU (16 before compute capability 7.0, else 48).
        limit: u32,
        /// GPU index.
        gpu: u32,
        /// GPU or MIG UUID.
        uuid: String,
    },
    /// An MPS entry claims a GPU older than compute capability 7.0 without
    /// `sharing.mps.allowPreVolta` (NVIDIA: per-client limits and isolated address spaces need
    /// Volta or newer).
    #[error("{entry}: GPU {gpu} ({uuid}) has compute capability {capability}; MPS before Volta (7.0) enforces no per-client limits and gives clients no isolated address spaces; use time-slicing for it, leave it out of devices, or set sharing.mps.allowPreVolta: true")]
    MpsPreVolta {
        /// The entry.
        entry: String,
        /// GPU index.
        gpu: u32,
        /// GPU or MIG UUID.
        uuid: String,
        /// Its compute capability, `6.1`.
        capability: String,
    },
}

/// A plan and the node-dependent warnings found while building it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The plan.
    pub plan: Plan,
    /// Entries that match nothing here, devices this node lacks, empty MIG GPUs, …
    pub warnings: Vec<String>,
    /// The MPS control daemons the policy wants, with the limits it plans (what the MPS
    /// supervisor must enforce; the plan itself may advertise older limits while a change is
    /// pending, see [`build_with`]).
    pub mps_wanted: MpsWanted,
    /// Where the policy was read as NVIDIA's plugin reads it rather than as written, each with
    /// the fix (a time-sliced entry whose `devices` without `rename` would split a resource
    /// name): warnings, and errors under `slicelet validate --strict`.
    pub fallbacks: Vec<String>,
}

/// `GPU 3` or `GPUs 0,1,2` for a comma-separated list of indices.
fn gpus_phrase(list: &str) -> String {
    if list.contains(',') {
        format!("GPUs {list}")
    } else {
        format!("GPU {list}")
    }
}

/// Replica ID `<uuid>::<n>` (NVIDIA's annotated-ID form).
pub fn replica_id(uuid: &str, n: u32) -> String {
    format!("{uuid}::{n}")
}

/// The physical UUID of a device ID: the part before `::`, or the whole ID.
pub fn physical_uuid(id: &str) -> &str {
    id.split_once("::").map_or(id, |(u, _)| u)
}

pub mod dra_names;
pub mod drain;
mod mps;
pub use mps::{
    container_pipe_dir, mps_dirs, mps_resource, MpsDaemon, MpsDaemonView, MpsDirs, MpsLimits,
    MpsResource, MpsTarget, MpsWanted,
};

// What the unit tests (`use super::*`) reach through this module.
#[cfg(test)]
use crate::policy::Policy;
#[cfg(test)]
use size::{encoded_size, varint_len};

#[cfg(test)]
mod dynamic_mig_tests;
#[cfg(test)]
mod tests;

//! The pure core that turns a [`Policy`] and an [`Inventory`] into a [`Plan`]: which resources
//! are advertised, with which virtual device IDs, and which physical unit (a whole GPU or a MIG
//! device) backs each one.
//!
//! Rules (from the policy reference in README.md):
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher as _;
use std::sync::Arc;

use serde::Serialize;

use crate::health::Health;
use crate::inventory::topology::{Link, PathLevel, SAME_GPU_SCORE};
use crate::inventory::{mig, Gpu, Inventory, MigCaps, MigDevice};
use crate::policy::{
    Delivery, DeviceRef, DeviceSelector, MigStrategy, Policy, ResourceName, SharedAllocation,
    SharedResource,
};

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

/// Device positions by ID without a second copy of the IDs: a hash table of positions into
/// the resource's `devices`, hashed and compared through them (2,688 devices used to mean
/// 2,688 cloned ID strings, 16 % of a plan build's allocations). Derived from `devices`, so
/// two indexes over equal device lists are equal.
#[derive(Clone, Default)]
struct IdIndex {
    table: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl IdIndex {
    fn new(devices: &[VirtualDevice]) -> Self {
        let hasher = hashbrown::DefaultHashBuilder::default();
        let mut table = hashbrown::HashTable::with_capacity(devices.len());
        let rehash = |&j: &u32| hasher.hash_one(devices[j as usize].id.as_str());
        for (i, d) in devices.iter().enumerate() {
            let h = hasher.hash_one(d.id.as_str());
            // A repeated ID (never built, but possible in a hand-made plan) points at its
            // last device, as a map collected from the list would.
            match table.entry(h, |&j| devices[j as usize].id == d.id, rehash) {
                hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = i as u32,
                hashbrown::hash_table::Entry::Vacant(e) => {
                    e.insert(i as u32);
                }
            }
        }
        IdIndex { table, hasher }
    }

    fn get(&self, devices: &[VirtualDevice], id: &str) -> Option<usize> {
        let h = self.hasher.hash_one(id);
        self.table
            .find(h, |&j| devices.get(j as usize).is_some_and(|d| d.id == id))
            .map(|&j| j as usize)
    }
}

impl PartialEq for IdIndex {
    /// Always equal: the index is a function of the device list, which `ResourcePlan`
    /// compares itself.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for IdIndex {}

impl std::fmt::Debug for IdIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdIndex({} IDs)", self.table.len())
    }
}

/// The physical units (GPUs or MIG devices) of one resource and their pairwise link scores
/// ([`Link::score`]; two MIG devices of one GPU score [`SAME_GPU_SCORE`]), computed once with
/// the plan so GetPreferredAllocation does no NVML and no rebuild per call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitLinks {
    /// Per device position: its unit's number (units numbered 0.. in device order).
    unit_of: Vec<u32>,
    /// Per unit: the position of its first device.
    first: Vec<usize>,
    /// Per unit: the GPU index behind it.
    gpu: Vec<u32>,
    /// Per unit: the NUMA node of its GPU.
    numa: Vec<Option<i64>>,
    /// `n × n` scores, row-major; the diagonal is 0.
    scores: Vec<u32>,
}

impl UnitLinks {
    /// `link(gpu a, numa a, gpu b, numa b)` is the link between two GPUs.
    fn new(
        devices: &[VirtualDevice],
        link: impl Fn(u32, Option<i64>, u32, Option<i64>) -> Link,
    ) -> Self {
        let mut links = Self::units(devices);
        links.compute_scores(link);
        links
    }

    /// The units of `devices`, with no scores yet.
    fn units(devices: &[VirtualDevice]) -> Self {
        let mut unit_of = Vec::with_capacity(devices.len());
        let mut first: Vec<usize> = Vec::new();
        let mut gpu = Vec::new();
        let mut numa = Vec::new();
        // Devices come grouped by unit (GPU, MIG, replica order): compare with the last unit
        // instead of hashing every device's UUID (that hashing was 15 % of a 2,688-device plan
        // build); a unit seen before out of order is still found.
        let mut last: Option<(&str, u32)> = None;
        for (p, d) in devices.iter().enumerate() {
            let u = match last {
                Some((uuid, u)) if uuid == d.gpu_uuid => u,
                _ => {
                    let u = match first
                        .iter()
                        .position(|&f| devices[f].gpu_uuid == d.gpu_uuid)
                    {
                        Some(i) => i as u32,
                        None => {
                            first.push(p);
                            gpu.push(d.gpu_index);
                            numa.push(d.numa_node);
                            (first.len() - 1) as u32
                        }
                    };
                    last = Some((d.gpu_uuid.as_str(), u));
                    u
                }
            };
            unit_of.push(u);
        }
        UnitLinks {
            unit_of,
            first,
            gpu,
            numa,
            scores: Vec::new(),
        }
    }

    /// (Re)computes the scores between the units.
    fn compute_scores(&mut self, link: impl Fn(u32, Option<i64>, u32, Option<i64>) -> Link) {
        let (gpu, numa) = (&self.gpu, &self.numa);
        let n = self.first.len();
        // One link lookup per GPU pair, not per unit pair (7 MIG devices per GPU make 49 unit
        // pairs per GPU pair).
        let mut gpus: Vec<(u32, Option<i64>)> =
            gpu.iter().copied().zip(numa.iter().copied()).collect();
        gpus.sort_unstable();
        gpus.dedup_by_key(|g| g.0);
        let g = gpus.len();
        let slot = |index: u32| gpus.binary_search_by_key(&index, |x| x.0).unwrap_or(0);
        let mut by_gpu = vec![SAME_GPU_SCORE; g * g];
        for i in 0..g {
            for j in i + 1..g {
                let s = link(gpus[i].0, gpus[i].1, gpus[j].0, gpus[j].1).score();
                by_gpu[i * g + j] = s;
                by_gpu[j * g + i] = s;
            }
        }
        let slots: Vec<usize> = gpu.iter().map(|&i| slot(i)).collect();
        let mut scores = vec![0; n * n];
        for a in 0..n {
            for b in a + 1..n {
                let s = by_gpu[slots[a] * g + slots[b]];
                scores[a * n + b] = s;
                scores[b * n + a] = s;
            }
        }
        self.scores = scores;
    }

    /// How many units.
    pub fn len(&self) -> usize {
        self.first.len()
    }

    /// Whether the resource has no units.
    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    /// The unit of the device at `position`.
    pub fn unit_of(&self, position: usize) -> usize {
        self.unit_of[position] as usize
    }

    /// The position of unit `u`'s first device.
    pub fn first(&self, u: usize) -> usize {
        self.first[u]
    }

    /// The GPU index behind unit `u`.
    pub fn gpu(&self, u: usize) -> u32 {
        self.gpu[u]
    }

    /// The NUMA node of unit `u`'s GPU.
    pub fn numa(&self, u: usize) -> Option<i64> {
        self.numa[u]
    }

    /// The link score between units `a` and `b` (0 when `a == b`).
    pub fn score(&self, a: usize, b: usize) -> u32 {
        self.scores[a * self.first.len() + b]
    }
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
    #[error("{second}: GPU {gpu} ({uuid}) is already claimed by {first}; a GPU can be shared by one entry only")]
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

/// One physical unit that can be advertised: a whole GPU or one MIG device of it.
#[derive(Debug, Clone, Copy)]
struct Unit<'a> {
    gpu: &'a Gpu,
    mig: Option<&'a MigDevice>,
}

impl<'a> Unit<'a> {
    fn uuid(&self) -> &'a str {
        self.mig.map_or(&self.gpu.uuid, |m| &m.uuid)
    }

    fn health(&self) -> Health {
        self.gpu
            .health
            .and(self.mig.map_or(Health::Healthy, |m| m.health))
    }

    fn order(&self) -> (u32, Option<u32>) {
        (self.gpu.index, self.mig.map(|m| m.index))
    }

    /// `3` for GPU 3, `0:2` for MIG device 2 of GPU 0.
    fn label(&self) -> String {
        match self.mig {
            None => self.gpu.index.to_string(),
            Some(m) => format!("{}:{}", self.gpu.index, m.index),
        }
    }
}

/// The node's resources before sharing, by name; each list in (GPU index, MIG index) order.
type Units<'a> = BTreeMap<String, Vec<Unit<'a>>>;

/// The devices of the node resource `entry` names that its `devices` selects, each recorded in
/// `claimed` (one device claimed by two entries is an error naming both); `None`, with a
/// warning, when the entry matches nothing on this node.
fn claim_units<'a>(
    entry: &'a SharedResource,
    mig_strategy: MigStrategy,
    base: &Units<'a>,
    claimed: &mut HashMap<&'a str, &'a str>,
    warnings: &mut Vec<String>,
) -> Result<Option<Vec<Unit<'a>>>, PlanError> {
    let Some(units) = base.get(entry.source.as_str()) else {
        let have = if base.is_empty() {
            "none".to_string()
        } else {
            base.keys().cloned().collect::<Vec<_>>().join(", ")
        };
        let hint = if entry.source.as_str().starts_with("nvidia.com/mig-")
            && mig_strategy != MigStrategy::Mixed
        {
            format!(
                "; MIG profiles are resources only under migStrategy mixed (this policy: {})",
                mig_strategy.as_str()
            )
        } else {
            String::new()
        };
        warnings.push(format!(
            "{}.name: {} is not a resource of this node (here: {have}){hint}; entry ignored here",
            entry.path, entry.source
        ));
        return Ok(None);
    };
    let picked = select(entry, units, warnings);
    if picked.is_empty() {
        warnings.push(format!(
            "{}: matches no device on this node; nothing advertised as {}",
            entry.path, entry.advertised
        ));
        return Ok(None);
    }
    for u in &picked {
        if let Some(first) = claimed.insert(u.uuid(), &entry.path) {
            return Err(match u.mig {
                None => PlanError::GpuClaimedTwice {
                    gpu: u.gpu.index,
                    uuid: u.gpu.uuid.clone(),
                    first: first.to_string(),
                    second: entry.path.clone(),
                },
                Some(m) => PlanError::MigClaimedTwice {
                    gpu: u.gpu.index,
                    mig: m.index,
                    uuid: m.uuid.clone(),
                    first: first.to_string(),
                    second: entry.path.clone(),
                },
            });
        }
    }
    Ok(Some(picked))
}

/// Builds the plan for `policy` on `inventory`.
///
/// # Errors
/// [`PlanError`] naming the GPUs, entries or resource at fault.
pub fn build(policy: &Policy, inventory: &Inventory) -> Result<Built, PlanError> {
    build_with(policy, inventory, &BTreeMap::new())
}

/// [`build`], with the per-client limits each MPS control daemon enforces now (by GPU or MIG
/// UUID): a daemon whose limits differ from the planned ones
/// has a change pending until its clients are gone, and the plan advertises what it enforces.
///
/// # Errors
/// As [`build`].
pub fn build_with(
    policy: &Policy,
    inventory: &Inventory,
    mps_applied: &BTreeMap<String, MpsLimits>,
) -> Result<Built, PlanError> {
    let mut built = build_unobserved(policy, inventory)?;
    built.mps_wanted = built.plan.mps_wanted();
    built.plan.apply_mps_limits(mps_applied);
    Ok(built)
}

/// [`build_once`], falling back to NVIDIA's reading where the policy as written would leave
/// one resource name meaning two things: a time-sliced entry with `devices` and no `rename`
/// (advertised under the very resource it shares) while other devices of that resource stay
/// whole under the same name. NVIDIA's plugin ignores `devices` and shares every device of
/// the entry's resource; so does slicelet then, with a warning naming the fix (a rename). When
/// that fails too, the collision is the error.
fn build_unobserved(policy: &Policy, inventory: &Inventory) -> Result<Built, PlanError> {
    let collision = match build_once(policy, inventory) {
        Err(e @ PlanError::NameCollision { .. }) => e,
        other => return other,
    };
    let PlanError::NameCollision {
        name,
        entry,
        unclaimed,
    } = &collision
    else {
        unreachable!("matched above")
    };
    let Some(i) = policy.time_slicing.resources.iter().position(|e| {
        e.path == *entry && e.advertised == e.source && e.devices != DeviceSelector::All
    }) else {
        return Err(collision);
    };
    let mut nvidia = policy.clone();
    nvidia.time_slicing.resources[i].devices = DeviceSelector::All;
    let Ok(mut built) = build_unobserved(&nvidia, inventory) else {
        return Err(collision);
    };
    let noun = if unclaimed.contains(':') {
        "MIG devices"
    } else {
        "GPUs"
    };
    let fix = match ResourceName::parse(&format!("{name}-shared")) {
        Ok(n) => format!("add rename: {n} to share only these {noun}"),
        Err(_) => format!("add a rename to share only these {noun}"),
    };
    built.fallbacks.insert(
        0,
        format!(
            "{entry}.devices: sharing only the listed {noun} as {name} would leave {noun} {unclaimed} whole under the same name; like NVIDIA's plugin (which ignores devices), slicelet shares every device of {name}; {fix}"
        ),
    );
    Ok(built)
}

fn build_once(policy: &Policy, inventory: &Inventory) -> Result<Built, PlanError> {
    let mut warnings = Vec::new();
    let base = node_resources(policy.mig_strategy, inventory, &mut warnings)?;

    // unit uuid -> entry path that claimed it
    let mut claimed: HashMap<&str, &str> = HashMap::new();
    let mut shared: Vec<(&SharedResource, Vec<Unit<'_>>)> = Vec::new();
    for entry in &policy.time_slicing.resources {
        if let Some(picked) = claim_units(
            entry,
            policy.mig_strategy,
            &base,
            &mut claimed,
            &mut warnings,
        )? {
            shared.push((entry, picked));
        }
    }
    let mps_claimed = mps::claim(policy, &base, &mut claimed, &mut warnings)?;

    // What each node resource still advertises whole.
    let whole: BTreeMap<&str, Vec<Unit<'_>>> = base
        .iter()
        .map(|(name, units)| {
            let rest: Vec<Unit<'_>> = units
                .iter()
                .filter(|u| !claimed.contains_key(u.uuid()))
                .copied()
                .collect();
            (name.as_str(), rest)
        })
        .filter(|(_, rest)| !rest.is_empty())
        .collect();
    let mut resources = BTreeMap::new();
    let fail_gt_one = policy.time_slicing.fail_requests_greater_than_one;
    for (entry, units) in &shared {
        if let Some(rest) = whole.get(entry.advertised.as_str()) {
            return Err(PlanError::NameCollision {
                name: entry.advertised.to_string(),
                entry: entry.path.clone(),
                unclaimed: rest.iter().map(Unit::label).collect::<Vec<_>>().join(","),
            });
        }
        let res = resource(
            &entry.advertised,
            Strategy::TimeSlicing,
            entry.replicas,
            fail_gt_one,
            policy.pass_device_specs,
            units,
        )?;
        resources.insert(entry.advertised.to_string(), Arc::new(res));
    }
    mps::insert_resources(policy, mps_claimed, &whole, &mut resources)?;
    for (name, units) in &whole {
        let name = ResourceName::parse(name).expect("validated in node_resources");
        let res = resource(
            &name,
            Strategy::None,
            1,
            false,
            policy.pass_device_specs,
            units,
        )?;
        resources.insert(name.to_string(), Arc::new(res));
    }
    if policy.pass_device_specs {
        let missing: Vec<String> = resources
            .values()
            .flat_map(|r| r.devices.iter())
            .filter_map(|d| match &d.mig {
                Some(m) if m.caps.is_none() => Some(format!("{}:{}", d.gpu_index, m.index)),
                _ => None,
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !missing.is_empty() {
            warnings.push(format!(
                "flags.plugin.passDeviceSpecs: the nvidia-caps minors of MIG devices {} are unknown ({} is missing or lacks them); Allocate returns no /dev/nvidia-caps nodes for them",
                missing.join(","),
                mig::MIG_MINORS_PATH
            ));
        }
    }
    // Link scores between the physical units, once per plan (GetPreferredAllocation reads
    // them and never asks NVML).
    for res in resources.values_mut() {
        let fresh = Arc::get_mut(res).expect("built above, not shared yet");
        fresh.set_links_from(inventory);
        fresh.shared_allocation = policy.shared_allocation;
        fresh.delivery.clone_from(&policy.delivery);
        fresh.dra = policy.dra.contains(&fresh.name);
    }
    check_dra_overlap(&resources)?;
    Ok(Built {
        plan: Plan {
            resources,
            drain: Drain::default(),
        },
        warnings,
        mps_wanted: MpsWanted::default(),
        fallbacks: Vec::new(),
    })
}

/// One physical GPU in both a DRA resource and a device-plugin resource (a whole GPU, or MIG
/// devices of one GPU split between the two) is [`PlanError::DraOverlap`]: each GPU is served
/// by exactly one of the two paths, so neither can hand out what the other holds, and a GPU's
/// health, drain and MPS daemon belong to one of them.
fn check_dra_overlap(resources: &BTreeMap<String, Arc<ResourcePlan>>) -> Result<(), PlanError> {
    // (GPU index, parent GPU uuid) -> (the first DRA resource, the first device-plugin
    // resource); by index so the lowest GPU is named.
    type Paths<'a> = (Option<&'a str>, Option<&'a str>);
    let mut by_gpu: BTreeMap<(u32, &str), Paths<'_>> = BTreeMap::new();
    for r in resources.values() {
        for d in &r.devices {
            let gpu = d
                .mig
                .as_ref()
                .map_or(d.gpu_uuid.as_str(), |m| m.parent_uuid.as_str());
            let e = by_gpu.entry((d.gpu_index, gpu)).or_insert((None, None));
            let slot = if r.dra { &mut e.0 } else { &mut e.1 };
            slot.get_or_insert(r.name.as_str());
        }
    }
    for ((gpu, uuid), (dra, plugin)) in by_gpu {
        if let (Some(dra), Some(plugin)) = (dra, plugin) {
            return Err(PlanError::DraOverlap {
                gpu,
                uuid: uuid.to_string(),
                dra: dra.to_string(),
                plugin: plugin.to_string(),
            });
        }
    }
    Ok(())
}

/// `GPU 3` or `GPUs 0,1,2` for a comma-separated list of indices.
fn gpus_phrase(list: &str) -> String {
    if list.contains(',') {
        format!("GPUs {list}")
    } else {
        format!("GPU {list}")
    }
}

fn join_indices<'a>(gpus: impl IntoIterator<Item = &'a Gpu>) -> String {
    gpus.into_iter()
        .map(|g| g.index.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The node's resources under `strategy`, before any sharing.
fn node_resources<'a>(
    strategy: MigStrategy,
    inv: &'a Inventory,
    warnings: &mut Vec<String>,
) -> Result<Units<'a>, PlanError> {
    let whole = |g: &'a Gpu| Unit { gpu: g, mig: None };
    let mut out: Units<'a> = BTreeMap::new();
    let mut add = |name: String, u: Unit<'a>| out.entry(name).or_default().push(u);
    let any_mig = inv.gpus.iter().any(|g| g.mig_enabled);
    match strategy {
        MigStrategy::Single if any_mig => {
            let (enabled, disabled): (Vec<&Gpu>, Vec<&Gpu>) =
                inv.gpus.iter().partition(|g| g.mig_enabled);
            if !disabled.is_empty() {
                return Err(PlanError::MigSingleModesDiffer {
                    enabled: join_indices(enabled),
                    disabled: join_indices(disabled),
                });
            }
            if let Some(g) = inv.gpus.iter().find(|g| g.mig_devices.is_empty()) {
                return Err(PlanError::MigSingleNoDevices {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                });
            }
            let mut profiles: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
            for g in &inv.gpus {
                for m in &g.mig_devices {
                    profiles.entry(&m.profile).or_default().insert(g.index);
                }
            }
            if profiles.len() > 1 {
                let profiles = profiles
                    .iter()
                    .map(|(p, gpus)| {
                        let list = gpus.iter().map(u32::to_string).collect::<Vec<_>>();
                        let noun = if list.len() == 1 { "GPU" } else { "GPUs" };
                        format!("{p} on {noun} {}", list.join(","))
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(PlanError::MigSingleProfiles { profiles });
            }
            for g in &inv.gpus {
                for m in &g.mig_devices {
                    add(
                        WHOLE_GPU_RESOURCE.to_string(),
                        Unit {
                            gpu: g,
                            mig: Some(m),
                        },
                    );
                }
            }
        }
        MigStrategy::Mixed if any_mig => {
            for g in &inv.gpus {
                if !g.mig_enabled {
                    add(WHOLE_GPU_RESOURCE.to_string(), whole(g));
                    continue;
                }
                if g.mig_devices.is_empty() {
                    warnings.push(format!(
                        "flags.migStrategy: GPU {} ({}) has MIG enabled and no MIG devices; nothing is advertised for it",
                        g.index, g.uuid
                    ));
                }
                for m in &g.mig_devices {
                    let name = mig::resource_name(&m.profile);
                    if ResourceName::parse(&name).is_err() {
                        warnings.push(format!(
                            "flags.migStrategy: MIG device {}:{} ({}) has profile `{}`, which makes no valid resource name; not advertised",
                            g.index, m.index, m.uuid, m.profile
                        ));
                        continue;
                    }
                    add(
                        name,
                        Unit {
                            gpu: g,
                            mig: Some(m),
                        },
                    );
                }
            }
        }
        // none, or single/mixed on a node without MIG-enabled GPUs (NVIDIA's fallback).
        _ => {
            for g in &inv.gpus {
                if g.mig_enabled {
                    warnings.push(format!(
                        "flags.migStrategy: GPU {} ({}) has MIG enabled, but migStrategy is none: it is advertised as a whole GPU (under {WHOLE_GPU_RESOURCE} or the entry sharing it) and containers get none of its MIG devices; use single or mixed",
                        g.index, g.uuid
                    ));
                }
                add(WHOLE_GPU_RESOURCE.to_string(), whole(g));
            }
        }
    }
    for units in out.values_mut() {
        units.sort_by_key(Unit::order);
    }
    Ok(out)
}

/// The devices of one node resource an entry's `devices` selects, in (GPU index, MIG index)
/// order, warning about names this node lacks.
///
/// On a resource of MIG devices, a GPU index or GPU UUID selects every MIG device of that GPU
/// in the resource; `"<gpu>:<mig>"` and a MIG UUID select one.
fn select<'a>(
    entry: &SharedResource,
    units: &[Unit<'a>],
    warnings: &mut Vec<String>,
) -> Vec<Unit<'a>> {
    let path = format!("{}.devices", entry.path);
    let gpus_only = units.iter().all(|u| u.mig.is_none());
    let noun = if gpus_only { "GPUs" } else { "MIG devices" };
    match &entry.devices {
        DeviceSelector::All => units.to_vec(),
        DeviceSelector::Count(n) => {
            if *n as usize > units.len() {
                warnings.push(format!(
                    "{path}: asks for the first {n} {noun} of {}, this node has {}",
                    entry.source,
                    units.len()
                ));
            }
            units.iter().take(*n as usize).copied().collect()
        }
        DeviceSelector::List(refs) => {
            let mut out: Vec<Unit<'a>> = Vec::new();
            for r in refs {
                let matches: Vec<Unit<'a>> = units
                    .iter()
                    .filter(|u| match r {
                        DeviceRef::Index(i) => u.gpu.index == *i,
                        DeviceRef::Uuid(id) => u.uuid() == id || u.gpu.uuid == *id,
                        DeviceRef::MigIndex(g, m) => {
                            u.gpu.index == *g && u.mig.is_some_and(|d| d.index == *m)
                        }
                        DeviceRef::LegacyMig { gpu, gi, ci } => {
                            u.gpu.uuid == *gpu
                                && u.mig.is_some_and(|d| d.gi_id == *gi && d.ci_id == *ci)
                        }
                        DeviceRef::Unmatchable(_) => false,
                    })
                    .copied()
                    .collect();
                if matches.is_empty() {
                    let msg = if gpus_only
                        && !matches!(r, DeviceRef::MigIndex(..) | DeviceRef::LegacyMig { .. })
                    {
                        format!("{path}: this node has no GPU {r}")
                    } else {
                        format!(
                            "{path}: {r} matches no device of {} on this node",
                            entry.source
                        )
                    };
                    warnings.push(msg);
                    continue;
                }
                let before = out.len();
                for u in matches {
                    if !out.iter().any(|o| o.uuid() == u.uuid()) {
                        out.push(u);
                    }
                }
                if out.len() == before {
                    let what = if gpus_only { "a GPU" } else { "devices" };
                    warnings.push(format!("{path}: {r} names {what} listed already"));
                }
            }
            out.sort_by_key(Unit::order);
            out
        }
    }
}

fn resource(
    name: &ResourceName,
    strategy: Strategy,
    replicas: u32,
    fail_requests_greater_than_one: bool,
    pass_device_specs: bool,
    units: &[Unit<'_>],
) -> Result<ResourcePlan, PlanError> {
    // Size the ListAndWatch message before allocating anything, in closed form (no loop over
    // replicas): a typo like `replicas: 4000000000` must be an immediate error, not an
    // out-of-memory kill or minutes of arithmetic.
    let bytes = encoded_size(units, replicas);
    if bytes > MAX_LIST_BYTES as u64 {
        return Err(PlanError::MessageTooLarge {
            resource: name.to_string(),
            devices: units.len() as u64 * u64::from(replicas),
            bytes,
            limit: MAX_LIST_BYTES,
        });
    }
    let mut devices = Vec::with_capacity(units.len() * replicas as usize);
    for u in units {
        let mig = u.mig.map(|m| MigInfo::of(u.gpu, m));
        for n in 0..replicas {
            let (id, replica) = if strategy == Strategy::TimeSlicing && replicas > 1 {
                (replica_id(u.uuid(), n), Some(n))
            } else {
                (u.uuid().to_string(), None)
            };
            devices.push(VirtualDevice {
                id,
                gpu_index: u.gpu.index,
                gpu_uuid: u.uuid().to_string(),
                gpu_minor: u.gpu.minor,
                replica,
                health: u.health(),
                numa_node: u.gpu.numa_node,
                mig: mig.clone(),
            });
        }
    }
    Ok(ResourcePlan::new(
        name.clone(),
        strategy,
        replicas,
        fail_requests_greater_than_one,
        pass_device_specs,
        devices,
    ))
}

/// Replica ID `<uuid>::<n>` (NVIDIA's annotated-ID form).
pub fn replica_id(uuid: &str, n: u32) -> String {
    format!("{uuid}::{n}")
}

/// The physical UUID of a device ID: the part before `::`, or the whole ID.
pub fn physical_uuid(id: &str) -> &str {
    id.split_once("::").map_or(id, |(u, _)| u)
}

fn id_len(uuid: &str, replicas: u32, n: u32) -> usize {
    if replicas > 1 {
        uuid.len() + 2 + decimal_len(u64::from(n))
    } else {
        uuid.len()
    }
}

/// Encoded size of the ListAndWatch message for `replicas` devices per unit, bytes, in
/// O(units × digits): replica IDs `<uuid>::<n>` only differ in the digit count of `n`.
fn encoded_size(units: &[Unit<'_>], replicas: u32) -> u64 {
    let mut total = 0u64;
    for u in units {
        let device =
            |id_len: usize| framed(device_encoded_len(id_len, u.health(), u.gpu.numa_node));
        if replicas <= 1 {
            total = total.saturating_add(u64::from(replicas) * device(u.uuid().len()));
            continue;
        }
        let mut lo = 0u64;
        let mut hi = 10u64;
        for digits in 1..=10usize {
            let count = u64::from(replicas).min(hi).saturating_sub(lo);
            total = total.saturating_add(count.saturating_mul(device(u.uuid().len() + 2 + digits)));
            lo = hi;
            hi = hi.saturating_mul(10);
        }
    }
    total
}

fn decimal_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// Bytes of a protobuf varint.
fn varint_len(v: u64) -> u64 {
    u64::from((64 - (v | 1).leading_zeros()).div_ceil(7))
}

/// A length-delimited field: tag byte + length varint + payload.
fn framed(payload: u64) -> u64 {
    1 + varint_len(payload) + payload
}

/// Encoded size of one `Device` message (without its own framing), bytes. Mirrors protobuf's
/// encoding of `{ID, health, topology{nodes[{ID}]}}`; a test in `plugin` checks it against prost.
pub fn device_encoded_len(id_len: usize, health: Health, numa: Option<i64>) -> u64 {
    let health = health.as_str().len() as u64;
    let mut len = framed(id_len as u64) + framed(health);
    if let Some(n) = numa {
        // NUMANode{ID}: proto3 omits a zero ID; negative int64 takes 10 bytes.
        let numa_len = if n == 0 { 0 } else { 1 + varint_len(n as u64) };
        let topo_len = framed(numa_len);
        len += framed(topo_len);
    }
    len
}

pub mod dra_names;
pub mod drain;
mod mps;
pub use mps::{
    container_pipe_dir, mps_dirs, mps_resource, MpsDaemon, MpsDaemonView, MpsDirs, MpsLimits,
    MpsResource, MpsTarget, MpsWanted,
};

#[cfg(test)]
mod tests;

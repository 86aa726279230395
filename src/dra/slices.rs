//! The pure core of DRA publishing: a plan's DRA resources and the node's [`Inventory`] →
//! the node's `resource.k8s.io/v1` ResourceSlices. No I/O, no async.
//!
//! Rules (Kubernetes `resource.k8s.io/v1` validation, the kubelet's DRA plugin helper, and
//! NVIDIA's DRA driver for the attribute vocabulary):
//! - One pool per node, named after the node; `pool.generation` comes from the caller, who
//!   bumps it on every plan change (the scheduler uses only the slices of a pool's highest
//!   generation, so a stale slice is ignored the moment a newer one exists).
//! - At most [`MAX_DEVICES_PER_SLICE`] (128, the API server's limit) devices per slice, or
//!   [`MAX_DEVICES_PER_SLICE_WITH_TAINTS`] (64) whenever Unhealthy devices are published with
//!   taints (the API server's limit for slices whose devices have taints; kept whether or not
//!   a device has one now, so a taint never moves devices between slices); every
//!   slice of the pool carries `pool.resourceSliceCount` = how many there are, so the
//!   scheduler knows when it has seen the whole pool. A pool without devices is one empty
//!   slice (the pool still exists, with nothing to allocate).
//! - One device per advertised unit: a whole GPU, a MIG device, and each time-sliced or MPS
//!   replica. Unhealthy devices (and devices the drain rules hold Unhealthy) are published
//!   with one device taint each (KEP-5055, GA in Kubernetes 1.37; [`taint`]): key
//!   [`TAINT_KEY`], the cause as value (`xid-79`, `lost`, `mps-not-ready`, `draining`, …),
//!   effect `NoSchedule` (`NoExecute` for an Xid when the policy's `dra.xidTaintEffect` says
//!   so), `timeAdded` when the device turned Unhealthy; so the scheduler allocates them to no
//!   claim that does not tolerate the taint. Where the API server has no device taints they
//!   are withdrawn instead ([`Unhealthy::Withdraw`]): left out of the slices.
//! - Device names are DNS labels derived from the device ID alone ([`device_name`]), so the
//!   same ID always gives the same name whatever else changes (GPU indices may move across
//!   reboots; UUIDs do not). A name already used in the pool (only possible while the drain
//!   rules keep a unit in two resources) keeps its first device; the later one is skipped and
//!   reported in [`Slices::skipped`].
//! - Attributes (unqualified, so in the driver's domain: CEL reads them as
//!   `device.attributes["<driver>"].<name>`): `type` (`gpu` for a whole GPU or a replica of
//!   one, `mig` for a MIG device or a replica of one, as NVIDIA's DRA driver), `uuid`, `parentUUID` (MIG), `index` (the GPU's
//!   NVML index), `productName`, `architecture`, `cudaComputeCapability` (a semantic version,
//!   `9.0.0`), `driverVersion` (a semantic version, when known), `sharing` (`none`,
//!   `time-slicing` or `mps`), `replica` (int, replicas only), `resource` (the device-plugin
//!   resource name this device mirrors), `profile` (MIG). Capacity `memory`: the unit's memory
//!   as a quantity in MiB (`81559Mi`); for an MPS replica the client's pinned-memory limit,
//!   which the daemon enforces. A time-sliced replica shows its unit's whole memory: replicas
//!   share it with no isolation.
//! - A consumable-capacity resource (`dra: capacity`, KEP-5075 `DRAConsumableCapacity`, beta
//!   and on by default since Kubernetes 1.36): one device per unit with
//!   `allowMultipleAllocations: true` and two capacities claims consume ([`capacities`]):
//!   `memory`, the unit's memory (`81559Mi`), and `cores`, percent of its SMs (`100`); each with
//!   a `requestPolicy` whose default is the share `1/replicas` of the entry (rounded down) and
//!   whose `validRange` is 1Mi up for memory, 1 to 100 in steps of 1 for cores. The scheduler
//!   records what each allocation consumed and a `shareID`; [`super::prepare`] turns those
//!   into the share's limits.
//! - Standard attributes (fully qualified in the `resource.kubernetes.io` domain, so CEL reads
//!   `device.attributes["resource.kubernetes.io"].numaNode`, and `matchAttribute` constraints
//!   align devices of different drivers): [`NUMA_NODE_ATTRIBUTE`] (int, KEP-6072) where the
//!   GPU's NUMA node is known, and [`PCIE_ROOT_ATTRIBUTE`] (string, `pci0000:00`) where its
//!   PCIe root complex is; a MIG device or replica carries its GPU's.
//! - At most [`MAX_ATTRIBUTES_AND_CAPACITIES`] (32) attributes and capacities together per
//!   device, and qualified names (a C identifier of at most 32 characters, optionally after a
//!   DNS subdomain of at most 63 and `/`), as the API server validates.
//! - MIG as partitionable devices (KEP-4815 `DRAPartitionableDevices`, beta and on by default
//!   since Kubernetes 1.36), static geometry only: each MIG-enabled GPU with a MIG device
//!   published whole gets a counter set named like its whole-GPU device (`gpu-<uuid>`) with
//!   [`COUNTER_MEMORY_SLICES`] and [`COUNTER_COMPUTE_SLICES`] ([`gpu_slices`]); each such MIG
//!   device consumes its profile's memory slices ([`memory_slices`]) and GPU-instance slices
//!   from it, so the sums never exceed the GPU's. The sets go in slices of their own without devices
//!   (Kubernetes 1.35 and later), [`COUNTER_SETS_PER_SLICE`] per slice, first in the pool;
//!   with counters a slice holds at most [`MAX_DEVICES_PER_SLICE_WITH_TAINTS`] devices.
//!   Replicas of a MIG device consume nothing of their own (they share one device).
//! - String attributes are at most [`MAX_STRING_ATTRIBUTE`] (64) characters and versions must
//!   be semantic versions, as the API server validates; a driver version such as `535.104.05`
//!   is written `535.104.5` (semver forbids leading zeros), one it cannot read is left out.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::health_map::{DeviceHealth, HealthMap};
use super::pool;
use crate::device_health::{Cause, Health};
use crate::inventory::Inventory;
use crate::plan::dra_names::device_name;
use crate::plan::dra_names::hex_digest;
use crate::plan::{DynamicMigGpu, Plan, ResourcePlan, Strategy, VirtualDevice};
use crate::policy::TaintEffect;

/// The most devices one ResourceSlice may hold (`resource.k8s.io/v1` ResourceSliceMaxDevices).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The most devices one ResourceSlice may hold when any of them has taints or consumes
/// counters (`resource.k8s.io/v1` ResourceSliceMaxDevicesWithTaintsOrConsumesCounters).
pub const MAX_DEVICES_PER_SLICE_WITH_TAINTS: usize = 64;
/// The most taints one device may have (`resource.k8s.io/v1` DeviceTaintsMaxLength).
pub const MAX_TAINTS_PER_DEVICE: usize = 16;
/// The key of the taint on an Unhealthy device (a qualified label name in slicelet's domain).
pub const TAINT_KEY: &str = "gpu.slicelet.io/unhealthy";
/// Counter sets per counter slice: 8 sets of [`COUNTERS_PER_SET`] stay under the API's 32
/// counters in all sets of one slice.
pub const COUNTER_SETS_PER_SLICE: usize = 8;
/// Counters per GPU's set: [`COUNTER_MEMORY_SLICES`] and [`COUNTER_COMPUTE_SLICES`].
pub const COUNTERS_PER_SET: usize = 2;
/// The most counters in all counter sets of one slice (`resource.k8s.io/v1` in Kubernetes
/// 1.34: "The maximum number of counters in all sets is 32"; later releases allow 32 per set,
/// so keeping to the older limit fits both); a dynamic MIG GPU's set has 10 on an H100 (8
/// memory slices, the compute slices and the `1g-10gb-me-instances`), so 3 fit one slice.
pub const MAX_COUNTERS_PER_SLICE: usize = 32;
/// A MIG-enabled GPU's memory slices counter: 8, or 4 on an A30 (NVIDIA's MIG user guide);
/// each MIG device consumes its profile's share of them ([`memory_slices`]).
pub const COUNTER_MEMORY_SLICES: &str = "memory-slices";
/// The longest string attribute value the API server accepts, characters.
pub const MAX_STRING_ATTRIBUTE: usize = 64;
/// The longest object name (a DNS subdomain: a slice's name), characters.
pub const MAX_OBJECT_NAME: usize = 253;
/// The most attributes and capacities one device may have together (`resource.k8s.io/v1`
/// ResourceSliceMaxAttributesAndCapacitiesPerDevice).
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// The standard attribute of the NUMA node a device is attached to (int; KEP-6072, Kubernetes
/// 1.37: one name for every driver, so a claim can `matchAttribute` a GPU with a NIC or CPUs).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
/// The standard attribute of the PCIe root complex a device hangs off (string, `pci<domain>:
/// <bus>`, e.g. `pci0000:00`; `k8s.io/dynamic-resource-allocation/deviceattribute`).
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";

/// What the slices are for: which node, which driver, which pool generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceParams {
    /// The node (`spec.nodeName`, and the pool's name).
    pub node: String,
    /// The DRA driver name (`spec.driver`), e.g. `gpu.slicelet.io`.
    pub driver: String,
    /// `pool.generation`: bumped by the caller on every plan change.
    pub generation: i64,
    /// The NVIDIA driver version (`550.54.15`), when known: the `driverVersion` attribute.
    pub driver_version: Option<String>,
    /// How Unhealthy devices are published.
    pub unhealthy: Unhealthy,
}

/// How the pool's Unhealthy devices are published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Unhealthy {
    /// Left out of the slices: for API servers without device taints (the field is dropped
    /// or refused). Slices hold up to [`MAX_DEVICES_PER_SLICE`] devices.
    #[default]
    Withdraw,
    /// Published with a taint each ([`taint`]); slices hold up to
    /// [`MAX_DEVICES_PER_SLICE_WITH_TAINTS`] devices.
    Taint {
        /// The effect for a device with a critical Xid (`dra.xidTaintEffect`); every other
        /// cause is `NoSchedule`.
        xid_effect: TaintEffect,
    },
}

impl Unhealthy {
    /// The most devices a slice holds this way.
    pub fn max_devices_per_slice(self) -> usize {
        match self {
            Unhealthy::Withdraw => MAX_DEVICES_PER_SLICE,
            Unhealthy::Taint { .. } => MAX_DEVICES_PER_SLICE_WITH_TAINTS,
        }
    }
}

/// The taint of an Unhealthy device: key [`TAINT_KEY`], value the cause's label
/// ([`Cause::label`]: `xid-79`, `lost`, …), effect `xid_effect` for a critical Xid and
/// `NoSchedule` for anything else, `timeAdded` the time it turned Unhealthy (whole seconds,
/// the same on every publish while it stays Unhealthy for the same cause).
pub fn taint(h: &DeviceHealth, xid_effect: TaintEffect) -> DeviceTaint {
    let cause = h.cause.unwrap_or(Cause::Other);
    let effect = match cause {
        Cause::Xid(_) => xid_effect,
        _ => TaintEffect::NoSchedule,
    };
    DeviceTaint {
        key: TAINT_KEY.to_string(),
        value: Some(cause.label()),
        effect: effect.as_str().to_string(),
        time_added: Some(Time(timestamp(h.since))),
    }
}

/// `t` as the timestamp `metav1.Time` holds (whole seconds).
fn timestamp(t: std::time::SystemTime) -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::from_second(super::health_map::unix_seconds(t))
        .unwrap_or_default()
}

/// The node's slices, and the devices left out because their name was taken.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slices {
    /// The slices, named `<node>-<driver>-<n>` (see [`slice_name`]), n = 0.. in order.
    pub slices: Vec<ResourceSlice>,
    /// Device IDs skipped because another device of the pool has the same name
    /// (`resource/id`).
    pub skipped: Vec<String>,
}

/// The name of slice `n` of the pool: `<node>-<driver>-<n>`, the driver's dots turned into
/// `-` (`node-1-gpu-slicelet-io-0`); over 253 characters, `<first 200 of that>-<16 hex digits
/// of SHA-256 of node and driver>-<n>`. Deterministic, so a reconcile replaces slices by name.
pub fn slice_name(node: &str, driver: &str, n: usize) -> String {
    let stem = format!("{node}-{}", driver.replace(['.', '/'], "-")).to_ascii_lowercase();
    let name = format!("{stem}-{n}");
    if name.len() <= MAX_OBJECT_NAME {
        return name;
    }
    let cut: String = stem.chars().take(200).collect();
    format!(
        "{}-{}-{n}",
        cut.trim_end_matches(['-', '.']),
        hex_digest(&format!("{node}\0{driver}"), 8)
    )
}

/// The GPU architecture of a CUDA compute capability, as NVIDIA names it (CUDA programming
/// guide, "Compute capabilities"); `None` for one not listed.
pub fn architecture(cc: (u32, u32)) -> Option<&'static str> {
    Some(match cc {
        (3, _) => "Kepler",
        (5, _) => "Maxwell",
        (6, _) => "Pascal",
        (7, 0 | 2) => "Volta",
        (7, 5) => "Turing",
        (8, 0 | 6 | 7) => "Ampere",
        (8, 9) => "Ada Lovelace",
        (9, 0) => "Hopper",
        (10..=12, _) => "Blackwell",
        _ => return None,
    })
}

/// A version string as a semantic version `major.minor.patch`: each of up to three
/// dot-separated numbers read as an integer (dropping leading zeros), missing ones 0;
/// `None` when a part is not a number or there are more than three.
pub fn semver(text: &str) -> Option<String> {
    let parts: Vec<&str> = text.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut nums = [0u64; 3];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nums[i] = p.parse().ok()?;
    }
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

fn string(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.chars().take(MAX_STRING_ATTRIBUTE).collect()),
        ..DeviceAttribute::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..DeviceAttribute::default()
    }
}

fn version(v: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v),
        ..DeviceAttribute::default()
    }
}

/// The `sharing` attribute of a strategy: `none`, `time-slicing` or `mps`.
pub fn sharing(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::None => "none",
        Strategy::TimeSlicing => "time-slicing",
        Strategy::Mps => "mps",
    }
}

/// The unit's memory, MiB: the MIG device's, or the GPU's; for an MPS replica the client's
/// pinned-memory limit.
fn memory_mib(res: &ResourcePlan, d: &VirtualDevice, inventory: &Inventory) -> Option<u64> {
    if let Some(daemon) = res.mps.as_ref().and_then(|m| m.daemons.get(&d.gpu_uuid)) {
        return Some(daemon.limits.pinned_memory_mib);
    }
    unit_memory_mib(d, inventory)
}

/// The memory of `d`'s unit, MiB: the MIG device's, or the GPU's (`None` when the inventory
/// lacks it).
pub fn unit_memory_mib(d: &VirtualDevice, inventory: &Inventory) -> Option<u64> {
    let gpu = inventory.by_index(d.gpu_index)?;
    match &d.mig {
        None => Some(gpu.memory_mib),
        // A MIG device's unit UUID is its own (`MIG-…`).
        Some(_) => gpu
            .mig_devices
            .iter()
            .find(|x| x.uuid == d.gpu_uuid)
            .map(|x| x.memory_mib),
    }
}

/// A MIG-enabled GPU's compute (GPU-instance) slices counter: 7, or 4 on an A30
/// ([`gpu_slices`]); each MIG device consumes its profile's `g`.
pub const COUNTER_COMPUTE_SLICES: &str = "compute-slices";

/// GPU-instance (compute) and memory slices of a MIG-capable GPU: 4 and 4 on an A30, 7 and 8
/// on every other (NVIDIA's MIG user guide, "Supported GPUs").
pub fn gpu_slices(model: &str) -> (u32, u32) {
    if model.contains("A30") {
        (4, 4)
    } else {
        (7, 8)
    }
}

/// The memory slices a profile of `memory_gb` (the `40` of `3g.40gb`) takes on a GPU of
/// `gpu_memory_mib` with `total` memory slices: its share of the GPU's memory in GB, rounded
/// to the nearest slice (at least 1). NVIDIA's profile names round each size, so `3g.40gb` on
/// an H100 80GB (81,559 MiB) is 4 of 8, `1g.18gb` on an H200 (143,771 MiB) 1 of 8, `1g.6gb` on
/// an A30 (24,576 MiB) 1 of 4.
pub fn memory_slices(memory_gb: u64, gpu_memory_mib: u64, total: u32) -> u64 {
    let gpu_gb = ((gpu_memory_mib + 512) / 1024).max(1);
    ((memory_gb * u64::from(total) * 2 + gpu_gb) / (2 * gpu_gb)).max(1)
}

/// The name of a MIG-enabled GPU's counter set: its whole-GPU device name (`gpu-<uuid>`), a
/// DNS label unique in the pool.
pub fn counter_set_name(gpu_uuid: &str) -> String {
    device_name(gpu_uuid)
}

/// What a MIG device consumes of its GPU's counter set (KEP-4815 partitionable devices): its
/// memory and its profile's GPU-instance slices. `None` for anything but a MIG device
/// allocated whole (replicas of a MIG device share it and consume nothing of their own).
fn consumes(
    res: &ResourcePlan,
    d: &VirtualDevice,
    inventory: &Inventory,
) -> Option<DeviceCounterConsumption> {
    let m = d.mig.as_ref()?;
    if d.replica.is_some() || res.strategy != Strategy::None || res.capacity.is_some() {
        return None;
    }
    let gpu = inventory.by_index(d.gpu_index)?;
    let profile = crate::inventory::mig::Profile::parse(&m.profile)?;
    let slices = profile.gpu_slices;
    let (_, total_memory) = gpu_slices(&gpu.model);
    let memory = memory_slices(profile.memory_gb, gpu.memory_mib, total_memory);
    Some(DeviceCounterConsumption {
        counter_set: counter_set_name(&m.parent_uuid),
        counters: slice_counters(memory, u64::from(slices)),
    })
}

/// The two counters of a GPU's set, or of what a MIG device consumes from it.
fn slice_counters(memory: u64, compute: u64) -> BTreeMap<String, Counter> {
    let counter = |n: u64| Counter {
        value: Quantity(n.to_string()),
    };
    BTreeMap::from([
        (COUNTER_MEMORY_SLICES.to_string(), counter(memory)),
        (COUNTER_COMPUTE_SLICES.to_string(), counter(compute)),
    ])
}

/// The counter set of the MIG-enabled GPU `uuid`: its memory and GPU-instance slices.
fn counter_set(uuid: &str, inventory: &Inventory) -> Option<CounterSet> {
    let gpu = inventory.by_uuid(uuid)?;
    let (compute, memory) = gpu_slices(&gpu.model);
    Some(CounterSet {
        name: counter_set_name(uuid),
        counters: slice_counters(u64::from(memory), u64::from(compute)),
    })
}

/// The capacity name of a unit's memory, MiB quantities.
pub const MEMORY: &str = "memory";
/// The capacity name of a unit's SMs, percent (`100` for the whole unit).
pub const CORES: &str = "cores";

/// The least `memory` a share may consume, MiB: the `validRange.min` published (`1Mi`; no
/// step: a claim's size is rounded up to whole MiB where it is prepared).
pub const MEMORY_MIN_MIB: u64 = 1;
/// The least `cores` a share may consume, percent: `validRange.min`.
pub const CORES_MIN: u32 = 1;
/// The most `cores` a share may consume, percent: `validRange.max` (the whole unit).
pub const CORES_MAX: u32 = 100;
/// The step of `cores`, percent: `validRange.step` (whole percents only).
pub const CORES_STEP: u32 = 1;

/// The `memory` and `cores` capacities of a consumable-capacity unit of `memory_mib` MiB
/// shared by default `shares` ways (see the module docs): memory `<MiB>Mi`, default
/// `<MiB / shares>Mi`, valid from `1Mi`; cores `100`, default `100 / shares` (at least 1),
/// valid 1–100 in steps of 1.
pub fn capacities(memory_mib: u64, shares: u32) -> BTreeMap<String, DeviceCapacity> {
    let shares = shares.max(1);
    let memory = DeviceCapacity {
        value: Quantity(format!("{memory_mib}Mi")),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity(format!(
                "{}Mi",
                (memory_mib / u64::from(shares)).max(1)
            ))),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(format!("{MEMORY_MIN_MIB}Mi")),
                max: None,
                step: None,
            }),
            valid_values: None,
        }),
    };
    let cores = DeviceCapacity {
        value: Quantity(CORES_MAX.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity((CORES_MAX / shares).max(CORES_MIN).to_string())),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(CORES_MIN.to_string()),
                max: Some(Quantity(CORES_MAX.to_string())),
                step: Some(Quantity(CORES_STEP.to_string())),
            }),
            valid_values: None,
        }),
    };
    BTreeMap::from([(MEMORY.to_string(), memory), (CORES.to_string(), cores)])
}

fn device(
    res: &ResourcePlan,
    d: &VirtualDevice,
    inventory: &Inventory,
    driver_version: Option<&str>,
    name: String,
) -> Device {
    let mut attrs = unit_attributes(res, d);
    if let Some(g) = inventory.by_index(d.gpu_index) {
        gpu_attributes(&mut attrs, g);
    }
    if let Some(v) = driver_version.and_then(semver) {
        attrs.insert("driverVersion".to_string(), version(v));
    }
    let mib = memory_mib(res, d, inventory);
    let capacity = match (res.capacity, mib) {
        (Some(c), Some(mib)) => Some(capacities(mib, c.shares)),
        (_, mib) => mib.map(|mib| {
            BTreeMap::from([(
                MEMORY.to_string(),
                DeviceCapacity {
                    value: Quantity(format!("{mib}Mi")),
                    ..DeviceCapacity::default()
                },
            )])
        }),
    };
    Device {
        name,
        attributes: Some(attrs),
        capacity,
        allow_multiple_allocations: res.capacity.map(|_| true),
        ..Device::default()
    }
}

/// The attributes of device `d` of `res` that its plan decides: type, UUID, index, sharing,
/// resource, its MIG parent and profile, its memory isolation (consumable capacity) and its
/// replica.
fn unit_attributes(res: &ResourcePlan, d: &VirtualDevice) -> BTreeMap<String, DeviceAttribute> {
    let mut attrs = BTreeMap::new();
    attrs.insert(
        "type".to_string(),
        string(if d.mig.is_some() { "mig" } else { "gpu" }),
    );
    attrs.insert("uuid".to_string(), string(&d.gpu_uuid));
    attrs.insert("index".to_string(), int(i64::from(d.gpu_index)));
    attrs.insert("sharing".to_string(), string(sharing(res.strategy)));
    attrs.insert("resource".to_string(), string(res.name.as_str()));
    if let Some(m) = &d.mig {
        attrs.insert("parentUUID".to_string(), string(&m.parent_uuid));
        attrs.insert("profile".to_string(), string(&m.profile));
    }
    let replica = d.replica.or(match res.strategy {
        // An MPS or time-sliced unit with one replica is replica 0 of its unit; a
        // consumable-capacity unit is no replica at all.
        _ if res.capacity.is_some() => None,
        Strategy::None => None,
        _ => Some(0),
    });
    if res.capacity.is_some() {
        // What keeps one share's memory from another's: MPS clients' pinned-memory limits;
        // time-slicing only accounts for it.
        let isolation = if res.strategy == Strategy::Mps {
            "mps"
        } else {
            "none"
        };
        attrs.insert("memoryIsolation".to_string(), string(isolation));
    }
    if let Some(n) = replica {
        attrs.insert("replica".to_string(), int(i64::from(n)));
    }
    attrs
}

/// Adds the attributes the device's GPU `g` decides: NUMA node, PCIe root, product name,
/// CUDA compute capability and architecture.
fn gpu_attributes(attrs: &mut BTreeMap<String, DeviceAttribute>, g: &crate::inventory::Gpu) {
    if let Some(n) = g.numa_node {
        attrs.insert(NUMA_NODE_ATTRIBUTE.to_string(), int(n));
    }
    if let Some(root) = &g.pcie_root {
        attrs.insert(PCIE_ROOT_ATTRIBUTE.to_string(), string(root));
    }
    attrs.insert("productName".to_string(), string(&g.model));
    if let Some(cc) = g.compute_capability {
        attrs.insert(
            "cudaComputeCapability".to_string(),
            version(format!("{}.{}.0", cc.0, cc.1)),
        );
        if let Some(a) = architecture(cc) {
            attrs.insert("architecture".to_string(), string(a));
        }
    }
}

/// The resources of `plan` DRA serves (`dra: true`), in plan order: what [`build`] publishes.
pub fn dra_resources(plan: &Plan) -> impl Iterator<Item = &ResourcePlan> {
    plan.resources.values().map(|r| &**r).filter(|r| r.dra)
}

/// Builds the node's slices for `resources` (the plan's DRA resources, in plan order).
/// Unhealthy devices are withdrawn or tainted as `params.unhealthy` says; a taint's value and
/// time come from `health` (by device name), and an Unhealthy device `health` does not know
/// is withdrawn.
pub fn build<'a>(
    resources: impl IntoIterator<Item = &'a ResourcePlan>,
    inventory: &Inventory,
    params: &SliceParams,
    health: &HealthMap,
) -> Slices {
    build_pool(resources, &[], inventory, params, health)
}

/// [`build`], with the devices and counter sets of the dynamic MIG GPUs `dynamic` (the plan's
/// [`Plan::dynamic_mig`]; [`dynamic_mig`]) after the resources' own: their sets after the
/// static MIG sets, their devices after the resources' devices.
pub fn build_pool<'a>(
    resources: impl IntoIterator<Item = &'a ResourcePlan>,
    dynamic: &[DynamicMigGpu],
    inventory: &Inventory,
    params: &SliceParams,
    health: &HealthMap,
) -> Slices {
    let (devices, skipped) = pool::named(resources);
    let mut sets: BTreeMap<String, CounterSet> = BTreeMap::new();
    let devices: Vec<Device> = devices
        .into_iter()
        .filter_map(|(p, res, d)| {
            let taints = match (d.health, params.unhealthy) {
                (Health::Healthy, _) => None,
                (Health::Unhealthy, Unhealthy::Withdraw) => return None,
                (Health::Unhealthy, Unhealthy::Taint { xid_effect }) => {
                    Some(vec![taint(health.get(&p.name)?, xid_effect)])
                }
            };
            let mut dev = device(res, d, inventory, params.driver_version.as_deref(), p.name);
            dev.taints = taints;
            dev.consumes_counters = counters_consumed(res, d, inventory, &mut sets);
            Some(dev)
        })
        .collect();
    let mut sets: Vec<CounterSet> = sets.into_values().collect();
    let mut devices = devices;
    for g in dynamic {
        if let Some((set, mut devs)) = dynamic_with_health(g, inventory, params, health) {
            sets.push(set);
            devices.append(&mut devs);
        }
    }
    Slices {
        slices: into_slices(params, &sets, &devices),
        skipped,
    }
}

/// The counter set and devices of dynamic MIG GPU `g` ([`dynamic_mig`]), each device
/// Unhealthy in `health` withdrawn or tainted as `params.unhealthy` says (the static devices'
/// rule), and, while its GPU is Unhealthy (`g.health` or in `inventory`), each device
/// `health` does not know withdrawn. `None` when no device is left (the set goes with them).
fn dynamic_with_health(
    g: &DynamicMigGpu,
    inventory: &Inventory,
    params: &SliceParams,
    health: &HealthMap,
) -> Option<(CounterSet, Vec<Device>)> {
    let (set, devs) = dynamic_mig(g, inventory, params.driver_version.as_deref())?;
    let gpu_healthy = g.health.is_healthy()
        && inventory
            .by_index(g.index)
            .is_some_and(|x| x.health.is_healthy());
    let devs: Vec<Device> = devs
        .into_iter()
        .filter_map(|mut d| {
            match (health.get(&d.name), params.unhealthy) {
                (None, _) if !gpu_healthy => return None,
                (Some(h), Unhealthy::Withdraw) if !h.health.is_healthy() => return None,
                (Some(h), Unhealthy::Taint { xid_effect }) if !h.health.is_healthy() => {
                    d.taints = Some(vec![taint(h, xid_effect)]);
                }
                _ => {}
            }
            Some(d)
        })
        .collect();
    (!devs.is_empty()).then_some((set, devs))
}

/// The counters device `d` of `res` consumes, once its GPU's counter set is in `sets` (added
/// there at its first device); `None` when it consumes none or the set cannot be built.
fn counters_consumed(
    res: &ResourcePlan,
    d: &VirtualDevice,
    inventory: &Inventory,
    sets: &mut BTreeMap<String, CounterSet>,
) -> Option<Vec<DeviceCounterConsumption>> {
    let c = consumes(res, d, inventory)?;
    let parent = d
        .mig
        .as_ref()
        .map(|m| m.parent_uuid.as_str())
        .unwrap_or_default();
    if !sets.contains_key(&c.counter_set) {
        if let Some(set) = counter_set(parent, inventory) {
            sets.insert(c.counter_set.clone(), set);
        }
    }
    sets.contains_key(&c.counter_set).then(|| vec![c])
}

/// `sets` in order, cut into the sets of one slice each: at most [`COUNTER_SETS_PER_SLICE`]
/// sets and [`MAX_COUNTERS_PER_SLICE`] counters in all (a set is never split).
fn counter_chunks(sets: &[CounterSet]) -> Vec<Vec<CounterSet>> {
    let mut out: Vec<Vec<CounterSet>> = Vec::new();
    let mut counters = 0;
    for set in sets {
        let n = set.counters.len();
        match out.last_mut() {
            Some(last)
                if last.len() < COUNTER_SETS_PER_SLICE
                    && counters + n <= MAX_COUNTERS_PER_SLICE =>
            {
                last.push(set.clone());
                counters += n;
            }
            _ => {
                out.push(vec![set.clone()]);
                counters = n;
            }
        }
    }
    out
}

/// The slices of `sets` and `devices`. Counters live in slices of their own, without devices
/// (Kubernetes 1.35 and later require it), before the device slices; at least one slice.
fn into_slices(
    params: &SliceParams,
    sets: &[CounterSet],
    devices: &[Device],
) -> Vec<ResourceSlice> {
    let per_slice = if sets.is_empty() {
        params.unhealthy.max_devices_per_slice()
    } else {
        MAX_DEVICES_PER_SLICE_WITH_TAINTS
    };
    let mut chunks: Vec<(Vec<CounterSet>, Vec<Device>)> = counter_chunks(sets)
        .into_iter()
        .map(|c| (c, Vec::new()))
        .collect();
    if devices.is_empty() && chunks.is_empty() {
        chunks.push((Vec::new(), Vec::new()));
    }
    chunks.extend(devices.chunks(per_slice).map(|d| (Vec::new(), d.to_vec())));
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(n, (sets, devices))| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(&params.node, &params.driver, n)),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: params.driver.clone(),
                node_name: Some(params.node.clone()),
                pool: ResourcePool {
                    name: params.node.clone(),
                    generation: params.generation,
                    resource_slice_count: count,
                },
                devices: if devices.is_empty() {
                    None
                } else {
                    Some(devices)
                },
                shared_counters: if sets.is_empty() { None } else { Some(sets) },
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

mod dynamic;
pub use dynamic::{
    dynamic_mig, dynamic_mig_devices, instances_counter, COUNTER_INSTANCES_SUFFIX,
    COUNTER_MEMORY_SLICE_PREFIX, MAX_DEVICE_COUNTERS_PER_SLICE,
};

#[cfg(test)]
mod attribute_tests;
#[cfg(test)]
mod dynamic_tests;
#[cfg(test)]
mod tests;

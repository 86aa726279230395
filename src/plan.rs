//! The pure core that turns a [`Policy`] and an [`Inventory`] into a [`Plan`]: which resources
//! are advertised, with which virtual device IDs, and which physical GPU backs each one.
//!
//! Rules (from the policy reference in README.md):
//! - A GPU that no sharing entry claims is advertised whole under `nvidia.com/gpu`.
//! - A time-sliced GPU gets `replicas` devices `<gpu-uuid>::<n>`, n = 0..replicas-1 (the form
//!   NVIDIA's plugin and dcgm-exporter use); with `replicas: 1` the ID is the plain UUID.
//! - An entry whose `devices` name GPUs this node lacks, or that matches nothing, is a warning
//!   (one ConfigMap serves a mixed fleet). A GPU claimed by two entries, or a shared resource
//!   advertised under the name whole GPUs still use, is an error naming both.
//! - A resource whose ListAndWatch message would exceed the kubelet's 4 MiB receive limit is an
//!   error: over the limit the kubelet drops the stream silently and reads the resource as 0.
//!
//! No I/O, no async.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::inventory::{Gpu, Inventory};
use crate::policy::{DeviceRef, DeviceSelector, MigStrategy, Policy, ResourceName, SharedResource};

/// The resource whole GPUs are advertised under.
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

/// One device the kubelet sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualDevice {
    /// The ID in ListAndWatch and Allocate: a GPU UUID or `<uuid>::<n>`.
    pub id: String,
    /// Index of the physical GPU behind it.
    pub gpu_index: u32,
    /// UUID of the physical GPU behind it.
    pub gpu_uuid: String,
    /// Minor number of the physical GPU (`/dev/nvidia<minor>`), when known.
    pub gpu_minor: Option<u32>,
    /// Replica number, for time-sliced devices.
    pub replica: Option<u32>,
    /// Healthy or not (every replica of a GPU shares its GPU's health).
    pub healthy: bool,
    /// NUMA node of the physical GPU, when known.
    pub numa_node: Option<i64>,
}

/// One advertised extended resource and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePlan {
    /// The extended resource name, e.g. `nvidia.com/gpu-shared`.
    pub name: ResourceName,
    /// Whole or time-sliced.
    pub strategy: Strategy,
    /// Replicas per GPU (1 for whole GPUs).
    pub replicas: u32,
    /// Allocate refuses container requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Allocate returns `/dev/nvidia*` device specs (`flags.plugin.passDeviceSpecs`).
    pub pass_device_specs: bool,
    /// Devices ordered by GPU index, then replica.
    pub devices: Vec<VirtualDevice>,
    /// MPS resources: the control daemons behind the devices and their limits.
    pub mps: Option<MpsResource>,
    by_id: HashMap<String, usize>,
}

impl ResourcePlan {
    /// Builds a resource plan; `devices` must be ordered by GPU index, then replica.
    pub fn new(
        name: ResourceName,
        strategy: Strategy,
        replicas: u32,
        fail_requests_greater_than_one: bool,
        pass_device_specs: bool,
        devices: Vec<VirtualDevice>,
    ) -> Self {
        let by_id = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.clone(), i))
            .collect();
        ResourcePlan {
            name,
            strategy,
            replicas,
            fail_requests_greater_than_one,
            pass_device_specs,
            devices,
            mps: None,
            by_id,
        }
    }

    /// The device with this ID, in O(1).
    pub fn device(&self, id: &str) -> Option<&VirtualDevice> {
        self.by_id.get(id).map(|&i| &self.devices[i])
    }

    /// Position of the device with this ID in [`ResourcePlan::devices`], in O(1).
    pub fn position(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }
}

/// Everything the node advertises: one entry per resource name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Resources by name. `Arc` so that an unchanged resource keeps its identity across
    /// rebuilds (see [`Plan::reuse_unchanged`]).
    pub resources: BTreeMap<String, Arc<ResourcePlan>>,
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
            resources: self
                .resources
                .values()
                .map(|r| ResourceView {
                    name: r.name.to_string(),
                    strategy: r.strategy,
                    replicas: r.replicas,
                    mps: r.mps.as_ref().map(MpsResource::view),
                    devices: r
                        .devices
                        .iter()
                        .map(|d| DeviceView {
                            id: d.id.clone(),
                            gpu: d.gpu_uuid.clone(),
                            health: if d.healthy { "Healthy" } else { "Unhealthy" },
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// Serialisable view of a plan: `{"resources":[{"name","strategy","replicas","devices":[…]}]}`.
#[derive(Debug, Serialize)]
pub struct PlanView {
    /// Resources sorted by name.
    pub resources: Vec<ResourceView>,
}

/// One resource in [`PlanView`].
#[derive(Debug, Serialize)]
pub struct ResourceView {
    /// Extended resource name.
    pub name: String,
    /// `none` or `time-slicing`.
    pub strategy: Strategy,
    /// Replicas per GPU.
    pub replicas: u32,
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
    /// Physical GPU UUID.
    pub gpu: String,
    /// `Healthy` or `Unhealthy`.
    pub health: &'static str,
}

/// A plan that cannot be built for this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A MIG strategy other than `none` on a node with MIG-enabled GPUs (MIG slices are not
    /// advertised yet).
    #[error("flags.migStrategy: `{strategy}` is not supported yet, and GPU {gpu} ({uuid}) has MIG enabled; use `none` to advertise MIG GPUs whole")]
    MigUnsupported {
        /// The strategy asked for.
        strategy: String,
        /// Index of a MIG-enabled GPU.
        gpu: u32,
        /// Its UUID.
        uuid: String,
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
    /// A shared resource is advertised under a name that whole GPUs still use.
    #[error("{entry}: advertises {name}, but GPUs {unclaimed} are not shared and are advertised whole as {name}; rename the entry or share every GPU")]
    NameCollision {
        /// The colliding name.
        name: String,
        /// The entry.
        entry: String,
        /// Indices of the GPUs advertised whole.
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
}

/// A plan and the node-dependent warnings found while building it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The plan.
    pub plan: Plan,
    /// Entries that match nothing here, devices this node lacks, …
    pub warnings: Vec<String>,
}

/// Builds the plan for `policy` on `inventory`.
///
/// # Errors
/// [`PlanError`] naming the entries or resource at fault.
pub fn build(policy: &Policy, inventory: &Inventory) -> Result<Built, PlanError> {
    if policy.mig_strategy != MigStrategy::None {
        if let Some(g) = inventory.gpus.iter().find(|g| g.mig_enabled) {
            return Err(PlanError::MigUnsupported {
                strategy: policy.mig_strategy.as_str().to_string(),
                gpu: g.index,
                uuid: g.uuid.clone(),
            });
        }
    }
    let mut warnings = Vec::new();
    // gpu index -> entry path that claimed it
    let mut claimed: BTreeMap<u32, &str> = BTreeMap::new();
    let mut shared: Vec<(&SharedResource, Vec<&Gpu>)> = Vec::new();
    for entry in &policy.time_slicing.resources {
        if entry.source.as_str() != WHOLE_GPU_RESOURCE {
            warnings.push(format!(
                "{}.name: {} is not a resource of this node (only {WHOLE_GPU_RESOURCE}); entry ignored here",
                entry.path, entry.source
            ));
            continue;
        }
        let gpus = select(entry, inventory, &mut warnings);
        if gpus.is_empty() {
            warnings.push(format!(
                "{}: matches no GPU on this node; nothing advertised as {}",
                entry.path, entry.advertised
            ));
            continue;
        }
        for g in &gpus {
            if let Some(first) = claimed.insert(g.index, &entry.path) {
                return Err(PlanError::GpuClaimedTwice {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    first: first.to_string(),
                    second: entry.path.clone(),
                });
            }
        }
        shared.push((entry, gpus));
    }
    let mps_claimed = mps::claim(policy, inventory, &mut claimed, &mut warnings)?;

    let whole: Vec<&Gpu> = inventory
        .gpus
        .iter()
        .filter(|g| !claimed.contains_key(&g.index))
        .collect();
    let mut resources = BTreeMap::new();
    let fail_gt_one = policy.time_slicing.fail_requests_greater_than_one;
    for (entry, gpus) in shared {
        if !whole.is_empty() && entry.advertised.as_str() == WHOLE_GPU_RESOURCE {
            return Err(PlanError::NameCollision {
                name: WHOLE_GPU_RESOURCE.to_string(),
                entry: entry.path.clone(),
                unclaimed: whole
                    .iter()
                    .map(|g| g.index.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            });
        }
        let res = resource(
            &entry.advertised,
            Strategy::TimeSlicing,
            entry.replicas,
            fail_gt_one,
            policy.pass_device_specs,
            &gpus,
        )?;
        resources.insert(entry.advertised.to_string(), Arc::new(res));
    }
    mps::insert_resources(policy, mps_claimed, &whole, &mut resources)?;
    if !whole.is_empty() {
        let name = ResourceName::parse(WHOLE_GPU_RESOURCE).expect("valid constant");
        let res = resource(
            &name,
            Strategy::None,
            1,
            false,
            policy.pass_device_specs,
            &whole,
        )?;
        resources.insert(name.to_string(), Arc::new(res));
    }
    Ok(Built {
        plan: Plan { resources },
        warnings,
    })
}

/// The GPUs an entry's `devices` selects on this node, by index, warning about names this node
/// lacks.
fn select<'a>(
    entry: &SharedResource,
    inv: &'a Inventory,
    warnings: &mut Vec<String>,
) -> Vec<&'a Gpu> {
    let path = format!("{}.devices", entry.path);
    match &entry.devices {
        DeviceSelector::All => inv.gpus.iter().collect(),
        DeviceSelector::Count(n) => {
            if *n as usize > inv.gpus.len() {
                warnings.push(format!(
                    "{path}: asks for the first {n} GPUs, this node has {}",
                    inv.gpus.len()
                ));
            }
            inv.gpus.iter().take(*n as usize).collect()
        }
        DeviceSelector::List(refs) => {
            let mut out: Vec<&Gpu> = Vec::new();
            for r in refs {
                let found = match r {
                    DeviceRef::Index(i) => inv.by_index(*i),
                    DeviceRef::Uuid(u) => inv.by_uuid(u),
                    DeviceRef::MigIndex(..) => None,
                };
                match found {
                    Some(g) if !out.iter().any(|o| o.index == g.index) => out.push(g),
                    Some(_) => warnings.push(format!("{path}: {r} names a GPU listed already")),
                    None => warnings.push(format!("{path}: this node has no GPU {r}")),
                }
            }
            out.sort_by_key(|g| g.index);
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
    gpus: &[&Gpu],
) -> Result<ResourcePlan, PlanError> {
    // Size the ListAndWatch message before allocating anything: a typo like
    // `replicas: 40000000` must be an error, not an out-of-memory kill.
    let mut bytes: u64 = 0;
    for g in gpus {
        for n in 0..replicas {
            let id_len = id_len(&g.uuid, replicas, n);
            bytes += framed(device_encoded_len(id_len, g.healthy, g.numa_node));
            if bytes > MAX_LIST_BYTES as u64 {
                return Err(PlanError::MessageTooLarge {
                    resource: name.to_string(),
                    devices: gpus.len() as u64 * u64::from(replicas),
                    bytes: estimate_total(gpus, replicas),
                    limit: MAX_LIST_BYTES,
                });
            }
        }
    }
    let mut devices = Vec::with_capacity(gpus.len() * replicas as usize);
    for g in gpus {
        for n in 0..replicas {
            let (id, replica) = if strategy == Strategy::TimeSlicing && replicas > 1 {
                (replica_id(&g.uuid, n), Some(n))
            } else {
                (g.uuid.clone(), None)
            };
            devices.push(VirtualDevice {
                id,
                gpu_index: g.index,
                gpu_uuid: g.uuid.clone(),
                gpu_minor: g.minor,
                replica,
                healthy: g.healthy,
                numa_node: g.numa_node,
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

fn estimate_total(gpus: &[&Gpu], replicas: u32) -> u64 {
    gpus.iter()
        .flat_map(|g| {
            (0..replicas).map(move |n| {
                framed(device_encoded_len(
                    id_len(&g.uuid, replicas, n),
                    g.healthy,
                    g.numa_node,
                ))
            })
        })
        .sum()
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
pub fn device_encoded_len(id_len: usize, healthy: bool, numa: Option<i64>) -> u64 {
    let health = if healthy {
        "Healthy".len()
    } else {
        "Unhealthy".len()
    } as u64;
    let mut len = framed(id_len as u64) + framed(health);
    if let Some(n) = numa {
        // NUMANode{ID}: proto3 omits a zero ID; negative int64 takes 10 bytes.
        let numa_len = if n == 0 { 0 } else { 1 + varint_len(n as u64) };
        let topo_len = framed(numa_len);
        len += framed(topo_len);
    }
    len
}

mod mps;
pub use mps::{
    container_pipe_dir, mps_dirs, mps_resource, MpsDaemon, MpsDaemonView, MpsDirs, MpsLimits,
    MpsObserved, MpsResource, MpsTarget, MpsWanted,
};

#[cfg(test)]
mod tests;

//! The pure core of Allocate and GetPreferredAllocation: a [`ResourcePlan`] and the device IDs
//! the kubelet chose → what the container gets. Knows nothing about tonic or sockets.
//!
//! Allocate rules (kubelet v1beta1 and NVIDIA's plugin):
//! - Every requested ID must be a device of this resource, else [`AllocateError::UnknownDevice`]
//!   naming the ID (the kubelet turns it into a failed pod start).
//! - The container gets the distinct physical units behind the IDs — GPUs, or MIG devices —
//!   ordered by GPU index and then MIG index: the kubelet passes IDs in random order, and three
//!   replicas of one GPU are still one GPU (a replica ID `<uuid>::<n>` never reaches the
//!   container). (CUDA uses only one MIG device per process: a container given two MIG devices
//!   sees both, but one process can use only the first.)
//! - How the runtime is told, per `flags.plugin.deviceListStrategy` (several may be combined;
//!   see [`crate::policy::Delivery`]), each unit named per `deviceIDStrategy` (its UUID, or
//!   `3` / `3:1`):
//!   - `envvar`: `NVIDIA_VISIBLE_DEVICES=<id>,<id>`;
//!   - `volume-mounts`: `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` and a
//!     read-only bind mount of host `/dev/null` at `/var/run/nvidia-container-devices/<id>`
//!     per unit (wins over `envvar` for the variable, as in NVIDIA's plugin);
//!   - `cdi-annotations`: the annotation [`annotation_key`] = the comma-joined CDI names;
//!   - `cdi-cri`: the CDI names (`<kind>=<id>`) in `cdi_devices`.
//!
//!   A resource with enforced memory limits adds, per unit, slicelet's own CDI device for the
//!   replicas asked there ([`crate::cdi::memory`]): its hook sets the container's limit.
//!
//!   When every selected strategy is `cdi-*`, there is no `NVIDIA_VISIBLE_DEVICES` and no
//!   device specs (NVIDIA's rule). `CUDA_VISIBLE_DEVICES` always lists the UUIDs (except for
//!   MPS clients, see [`mps`]); MPS clients get their environment and mounts whatever the
//!   strategy.
//! - With `flags.plugin.passDeviceSpecs` (and a strategy other than `cdi-*` alone): `/dev/nvidia<minor>` of every GPU involved (a MIG
//!   device's parent), `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, and for
//!   each MIG device the GPU-instance and compute-instance access nodes
//!   `/dev/nvidia-caps/nvidia-cap<N>`, whose minors discovery resolved (so this stays pure).
//! - Stateless: the kubelet may call Allocate twice with overlapping IDs for one pod (init
//!   container, then app container); the kubelet is the book of record for allocations.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use std::cmp::Reverse;

use crate::cdi;
use crate::plan::{ResourcePlan, Strategy, UnitLinks, VirtualDevice};
use crate::policy::SharedAllocation;

/// Env var the NVIDIA container runtime reads to expose GPUs.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Env var CUDA reads to select GPUs inside the container.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// Where `deviceListStrategy: volume-mounts` mounts one `/dev/null` per device (NVIDIA's
/// `deviceListAsVolumeMountsContainerPathRoot`, what the NVIDIA Container Toolkit reads when
/// `NVIDIA_VISIBLE_DEVICES` names this directory).
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// The name part of the `cdi-annotations` annotation key starts with this; a hex digest
/// follows.
pub const ANNOTATION_NAME_PREFIX: &str = "slicelet_";
/// The most characters a Kubernetes annotation key may have after its prefix.
pub const MAX_ANNOTATION_NAME: usize = 63;

/// The `cdi-annotations` key for one container's devices of `resource`:
/// `<prefix>slicelet_<id>`, where `<id>` is 32 hex digits of SHA-256 over the resource name and
/// the CDI names. Unique per resource (two resources in one container get two keys, so neither
/// overwrites the other) and deterministic (Allocate stays stateless); the part after the
/// prefix is 41 characters of `[a-z0-9_]`, within Kubernetes' 63 and the CDI annotation grammar
/// (alphanumeric ends; `-`, `_`, `.` inside).
pub fn annotation_key(prefix: &str, resource: &str, names: &[String]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(resource.as_bytes());
    for n in names {
        h.update([0u8]);
        h.update(n.as_bytes());
    }
    let digest = h.finalize();
    let mut key = String::with_capacity(prefix.len() + ANNOTATION_NAME_PREFIX.len() + 32);
    key.push_str(prefix);
    key.push_str(ANNOTATION_NAME_PREFIX);
    for b in &digest[..16] {
        use std::fmt::Write as _;
        let _ = write!(key, "{b:02x}");
    }
    key
}

/// A host path bind-mounted into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// Path inside the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A device node exposed to the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub container_path: String,
    /// Path on the host (under the configured `/dev` root).
    pub host_path: String,
    /// cgroup permissions, `rw`.
    pub permissions: String,
}

/// What one container gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerAllocation {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Bind mounts.
    pub mounts: Vec<MountSpec>,
    /// Device nodes (only with `flags.plugin.passDeviceSpecs`).
    pub device_nodes: Vec<DeviceNode>,
    /// Container annotations.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

/// A container request the user or kubelet got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// An ID that is not a device of this resource. The message carries at most 256 bytes of
    /// the ID and its length ([`crate::uuid::truncate_id`]), so an oversize ID cannot overflow
    /// the gRPC status header or a log line.
    #[error(
        "resource {resource}: unknown device ID {:?}",
        crate::uuid::truncate_id(id)
    )]
    UnknownDevice {
        /// The resource.
        resource: String,
        /// The ID.
        id: String,
    },
    /// More than one replica in one container with `failRequestsGreaterThanOne`.
    #[error("resource {resource}: the container asks for {count} replicas, but failRequestsGreaterThanOne allows 1")]
    TooManyReplicas {
        /// The resource.
        resource: String,
        /// How many were asked for.
        count: usize,
    },
    /// A container request without IDs.
    #[error("resource {resource}: a container request names no device IDs")]
    Empty {
        /// The resource.
        resource: String,
    },
    /// MPS replicas of two GPUs in one container request.
    #[error("resource {resource}: the container asks for MPS replicas of {uuids}; an MPS client uses one GPU's control daemon (one pipe directory), so request replicas of one GPU")]
    MpsSpansDevices {
        /// The resource.
        resource: String,
        /// The GPU (or MIG) UUIDs, comma-separated.
        uuids: String,
    },
}

/// The allocation for one container request.
///
/// `dev_root` is where the host's `/dev` is (default `/`), used for device-node host paths.
///
/// # Errors
/// [`AllocateError`] for unknown IDs, an empty request, or more than one replica under
/// `failRequestsGreaterThanOne`.
pub fn allocate(
    res: &ResourcePlan,
    ids: &[String],
    dev_root: &str,
) -> Result<ContainerAllocation, AllocateError> {
    if ids.is_empty() {
        return Err(AllocateError::Empty {
            resource: res.name.to_string(),
        });
    }
    let Request {
        units,
        per_unit,
        replica_ids,
    } = requested_units(res, ids)?;
    if res.strategy == Strategy::Mps {
        mps::check_request(res, ids)?;
    }
    if res.fail_requests_greater_than_one
        && res.strategy == Strategy::TimeSlicing
        && replica_ids > 1
    {
        return Err(AllocateError::TooManyReplicas {
            resource: res.name.to_string(),
            count: replica_ids,
        });
    }
    let delivery = &res.delivery;
    let strategies = delivery.strategies;
    let mut out = ContainerAllocation::default();
    // CUDA selects by UUID whatever names the runtime gets (deviceIDStrategy is for the
    // runtime only).
    let uuids = units
        .values()
        .map(|d| d.gpu_uuid.as_str())
        .collect::<Vec<_>>()
        .join(",");
    out.envs.insert(CUDA_VISIBLE_DEVICES.to_string(), uuids);
    let runtime_ids: Vec<String> = units
        .values()
        .map(|d| cdi::device_id(d, delivery.id))
        .collect();
    if strategies.envvar {
        out.envs
            .insert(NVIDIA_VISIBLE_DEVICES.to_string(), runtime_ids.join(","));
    }
    if strategies.volume_mounts {
        // NVIDIA's order: volume-mounts after envvar, so its value wins when both are set.
        out.envs.insert(
            NVIDIA_VISIBLE_DEVICES.to_string(),
            VOLUME_MOUNTS_ROOT.to_string(),
        );
        for id in &runtime_ids {
            out.mounts.push(MountSpec {
                container_path: format!("{VOLUME_MOUNTS_ROOT}/{id}"),
                host_path: "/dev/null".to_string(),
                read_only: true,
            });
        }
    }
    if strategies.uses_cdi() {
        add_cdi_names(&mut out, res, &units, &per_unit);
    }
    if res.pass_device_specs && !strategies.only_cdi() {
        add_device_nodes(&mut out, &units, dev_root);
    }
    if let Some(m) = &res.mps {
        mps::add_client(&mut out, res, m, ids);
    }
    Ok(out)
}

/// Physical unit (GPU index, MIG index) → a requested device on it.
type ByUnit<'a> = BTreeMap<(u32, Option<u32>), &'a VirtualDevice>;

/// What one container request asks for, unit by unit.
struct Request<'a> {
    /// One entry per physical unit (GPU or MIG device), in (GPU index, MIG index) order.
    units: ByUnit<'a>,
    /// Replicas asked per unit (memory limits scale with them).
    per_unit: BTreeMap<(u32, Option<u32>), u32>,
    /// How many distinct replica IDs (`<uuid>::<n>`) it names.
    replica_ids: usize,
}

/// The units `ids` name in `res`; an ID `res` lacks is [`AllocateError::UnknownDevice`].
fn requested_units<'a>(
    res: &'a ResourcePlan,
    ids: &[String],
) -> Result<Request<'a>, AllocateError> {
    let mut units: ByUnit<'a> = BTreeMap::new();
    let mut distinct_ids = BTreeSet::new();
    let mut per_unit: BTreeMap<(u32, Option<u32>), u32> = BTreeMap::new();
    for id in ids {
        let dev = res.device(id).ok_or_else(|| AllocateError::UnknownDevice {
            resource: res.name.to_string(),
            id: id.clone(),
        })?;
        // failRequestsGreaterThanOne counts replicas (`<uuid>::<n>`) only, as NVIDIA's
        // plugin: two whole GPUs under a renamed `replicas: 1` resource are fine.
        if dev.replica.is_some() {
            distinct_ids.insert(id.as_str());
        }
        units.entry(dev.unit_order()).or_insert(dev);
        *per_unit.entry(dev.unit_order()).or_default() += 1;
    }
    Ok(Request {
        units,
        per_unit,
        replica_ids: distinct_ids.len(),
    })
}

/// The CDI names of the request's units (and of slicelet's memory-limit device per unit), as
/// an annotation and/or CRI CDI devices as `res`'s deviceListStrategy says.
fn add_cdi_names(
    out: &mut ContainerAllocation,
    res: &ResourcePlan,
    units: &ByUnit<'_>,
    per_unit: &BTreeMap<(u32, Option<u32>), u32>,
) {
    let delivery = &res.delivery;
    let strategies = delivery.strategies;
    let mut names: Vec<String> = units
        .values()
        .map(|d| cdi::qualified_name(&delivery.cdi_kind, d, delivery.id))
        .collect();
    // slicelet's own device per unit: the hook that sets the container's memory limit.
    names.extend(
        units
            .iter()
            .filter_map(|(k, d)| cdi::memory::qualified_name(res, d, per_unit[k])),
    );
    if strategies.cdi_annotations {
        out.annotations.insert(
            annotation_key(&delivery.annotation_prefix, res.name.as_str(), &names),
            names.join(","),
        );
    }
    if strategies.cdi_cri {
        out.cdi_devices = names;
    }
}

/// passDeviceSpecs: the device nodes of the request's GPUs (under `dev_root` on the host), the
/// control nodes, and the nvidia-caps nodes of its MIG devices.
fn add_device_nodes(out: &mut ContainerAllocation, units: &ByUnit<'_>, dev_root: &str) {
    let root = dev_root.trim_end_matches('/');
    let node = |name: &str| DeviceNode {
        container_path: format!("/dev/{name}"),
        host_path: format!("{root}/dev/{name}"),
        permissions: "rw".to_string(),
    };
    let mut minors = BTreeSet::new();
    for d in units.values() {
        if let Some(minor) = d.gpu_minor {
            if minors.insert(minor) {
                out.device_nodes.push(node(&format!("nvidia{minor}")));
            }
        }
    }
    for name in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        out.device_nodes.push(node(name));
    }
    let mut caps = BTreeSet::new();
    for c in units.values().filter_map(|d| d.mig.as_ref()?.caps) {
        for n in [c.gi_access, c.ci_access] {
            if caps.insert(n) {
                out.device_nodes
                    .push(node(&format!("nvidia-caps/nvidia-cap{n}")));
            }
        }
    }
}

/// GetPreferredAllocation for one container: exactly `size` IDs from `available` (fewer only
/// when `available` has fewer devices of this resource), deterministic, never an error.
///
/// - Every ID of `must_include` (devices an init container already got) that is also in
///   `available` comes first; one that is not in `available` is left out, since the kubelet
///   takes only IDs from `available` (the answer is always a subset of `available`).
/// - IDs this resource does not know are skipped: another device being absent or unhealthy
///   never fails the pod (any error here is an UnexpectedAdmissionError at the kubelet).
/// - Then, one at a time: a physical unit this container has the fewest devices of (distinct
///   units first), then the least-loaded unit (load = devices of that unit not in `available`,
///   i.e. in use), then one on the NUMA node of the devices chosen so far, then the unit listed
///   first (lowest GPU index, then MIG index), then the lowest replica.
///
/// A unit is what `gpu_uuid` names: a whole GPU, or one MIG device (replicas of two MIG devices
/// on one GPU are two units).
///
/// The answer is ordered as the resource lists its devices.
///
/// Whole devices (one device per GPU or MIG device: `replicas: 1` or unshared) are chosen by
/// topology instead, see [`topology`]. Replicas follow
/// `flags.plugin.sharedDevicesAllocationPolicy`: `distributed` as above (and among equals, the
/// unit with the most link score to the units chosen so far), `packed` the unit with the most
/// devices in use or chosen first (then the same NUMA node, the most linked, the lowest).
pub fn preferred(
    res: &ResourcePlan,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    preferred_scored(res, available, must_include, size).ids
}

/// A GetPreferredAllocation answer and how good it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preferred {
    /// The chosen IDs, ordered as the resource lists its devices.
    pub ids: Vec<String>,
    /// The total link score of the distinct physical units behind them (the sum over their
    /// pairs of [`crate::inventory::topology::Link::score`]), for the log.
    pub score: u64,
}

/// [`preferred`], with the chosen set's link score.
pub fn preferred_scored(
    res: &ResourcePlan,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Preferred {
    // The answer lies within `available`: a `must_include` ID outside it is ignored (the
    // kubelet's own contract says it is a subset; a caller that breaks it gets no foreign ID).
    // must_include is short (at most the request's size) and usually empty: a scan per ID
    // costs nothing, where a set of every available ID cost 400 µs per call at 2,688 IDs.
    let must_include: Vec<String> = must_include
        .iter()
        .filter(|id| available.contains(id))
        .cloned()
        .collect();
    let must_include = must_include.as_slice();
    let ids = if res.strategy == Strategy::Mps {
        mps::preferred(res, available, must_include, size)
    } else if res.replicas <= 1 {
        whole(res, available, must_include, size)
    } else {
        replicas(res, available, must_include, size)
    };
    let links = res.links();
    let mut units: Vec<usize> = ids
        .iter()
        .filter_map(|id| res.position(id))
        .map(|p| links.unit_of(p))
        .collect();
    units.sort_unstable();
    units.dedup();
    let mut score = 0u64;
    for (i, &a) in units.iter().enumerate() {
        for &b in &units[i + 1..] {
            score += u64::from(links.score(a, b));
        }
    }
    Preferred { ids, score }
}

/// GetPreferredAllocation for whole devices (one device per unit), by topology.
///
/// `must_include` IDs that are not in `available` (or not of this resource) are ignored, so
/// the answer always lies within `available`; unhealthy devices are taken only when the
/// healthy ones do not make up `size`.
fn whole(
    res: &ResourcePlan,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let links = res.links();
    let mut avail: Vec<usize> = available.iter().filter_map(|id| res.position(id)).collect();
    avail.sort_unstable();
    avail.dedup();
    let mut must: Vec<usize> = Vec::new();
    for p in must_include.iter().filter_map(|id| res.position(id)) {
        if must.len() < size && avail.binary_search(&p).is_ok() && !must.contains(&p) {
            must.push(p);
        }
    }
    let k = size - must.len();
    let (healthy, sick): (Vec<usize>, Vec<usize>) = avail
        .iter()
        .copied()
        .filter(|p| !must.contains(p))
        .partition(|&p| res.devices[p].health.is_healthy());
    let must_units: Vec<usize> = must.iter().map(|&p| links.unit_of(p)).collect();
    let cand_units: Vec<usize> = healthy.iter().map(|&p| links.unit_of(p)).collect();
    let (chosen, _) = topology::choose(links, &must_units, &cand_units, k);
    let mut out: Vec<usize> = must;
    out.extend(chosen.iter().map(|&u| links.first(u)));
    out.extend(sick.into_iter().take(size.saturating_sub(out.len())));
    out.sort_unstable();
    out.into_iter().map(|p| res.devices[p].id.clone()).collect()
}

/// GetPreferredAllocation for replicas (see [`preferred`]).
fn replicas(
    res: &ResourcePlan,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    // Position of each chosen device in res.devices.
    let mut chosen = must_first(res, must_include, size);
    let links = res.links();
    let mut candidates = candidates(res, available, &chosen);
    let numa_of = |p: usize| res.devices[p].numa_node;
    let mut pick = Pick {
        home_numa: chosen.iter().next().and_then(|&p| numa_of(p)),
        linked: Vec::new(),
        links,
        packed: res.shared_allocation == SharedAllocation::Packed,
    };
    for &p in &chosen {
        if !pick.linked.contains(&links.unit_of(p)) {
            pick.linked.push(links.unit_of(p));
        }
    }
    while chosen.len() < size {
        let Some(i) = pick.best(&candidates) else {
            break;
        };
        let c = &mut candidates[i];
        let p = c.list[c.next];
        c.next += 1;
        c.mine += 1;
        chosen.insert(p);
        if !pick.linked.contains(&c.link_unit) {
            pick.linked.push(c.link_unit);
        }
        if pick.home_numa.is_none() {
            pick.home_numa = numa_of(p);
        }
    }
    chosen
        .into_iter()
        .map(|p| res.devices[p].id.clone())
        .collect()
}

/// The positions (in `res.devices`) of the devices of `must_include` that `res` has, at most
/// `size` of them.
fn must_first(res: &ResourcePlan, must_include: &[String], size: usize) -> BTreeSet<usize> {
    let mut chosen: BTreeSet<usize> = BTreeSet::new();
    for id in must_include {
        if chosen.len() >= size {
            break;
        }
        if let Some(p) = res.position(id) {
            chosen.insert(p);
        }
    }
    chosen
}

/// One unit with available replicas, as [`replicas`] weighs it.
struct Candidate {
    /// The unit's key (position of its first device).
    unit: usize,
    /// Its available devices, ascending.
    list: Vec<usize>,
    /// How many of `list` are taken.
    next: usize,
    /// Devices of the unit in use (not available), not counting this container's own.
    load: usize,
    /// Devices of the unit chosen for this container so far.
    mine: usize,
    /// The unit in link numbering.
    link_unit: usize,
    numa: Option<i64>,
}

/// One candidate per unit with an available device not yet `chosen`, in unit order: a flat
/// scan per pick (the choice is made `size` times over every unit).
fn candidates(
    res: &ResourcePlan,
    available: &[String],
    chosen: &BTreeSet<usize>,
) -> Vec<Candidate> {
    // Units are keyed by the position of their first device in res.devices, which orders them
    // by (GPU index, MIG index).
    let unit = |p: usize| res.unit_at(p).0;
    // Candidates grouped by unit, each list ascending by position (= replica order).
    let mut per_unit: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for id in available {
        if let Some(p) = res.position(id) {
            if !chosen.contains(&p) {
                per_unit.entry(unit(p)).or_default().push(p);
            }
        }
    }
    for list in per_unit.values_mut() {
        list.sort_unstable();
        list.dedup();
    }
    let mut picked: HashMap<usize, usize> = HashMap::new();
    for &p in chosen {
        *picked.entry(unit(p)).or_default() += 1;
    }
    let links = res.links();
    per_unit
        .into_iter()
        .map(|(u, list)| {
            let mine = picked.get(&u).copied().unwrap_or(0);
            Candidate {
                unit: u,
                load: res.unit_at(u).1.saturating_sub(list.len() + mine),
                mine,
                link_unit: links.unit_of(u),
                numa: res.devices[list[0]].numa_node,
                list,
                next: 0,
            }
        })
        .collect()
}

/// What [`replicas`]' next pick weighs besides each candidate.
struct Pick<'a> {
    /// The NUMA node of the first device chosen.
    home_numa: Option<i64>,
    /// Units (link numbering) of the devices chosen so far, once each.
    linked: Vec<usize>,
    links: &'a UnitLinks,
    /// sharedDevicesAllocationPolicy packed (else spread).
    packed: bool,
}

impl Pick<'_> {
    /// The index of the candidate to take a replica of next; `None` when none has one left.
    fn best(&self, candidates: &[Candidate]) -> Option<usize> {
        let (home_numa, linked, links, packed) =
            (self.home_numa, &self.linked, self.links, self.packed);
        candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.next < c.list.len())
            .min_by_key(|(_, c)| {
                let numa_far = match home_numa {
                    Some(h) => c.numa != Some(h),
                    None => false,
                };
                let link: u64 = linked
                    .iter()
                    .filter(|&&v| v != c.link_unit)
                    .map(|&v| u64::from(links.score(c.link_unit, v)))
                    .sum();
                if packed {
                    // The most used replicas (in use, or chosen for this container) first.
                    (
                        usize::MAX - (c.load + c.mine),
                        0,
                        numa_far,
                        Reverse(link),
                        c.unit,
                    )
                } else {
                    (c.mine, c.load, numa_far, Reverse(link), c.unit)
                }
            })
            .map(|(i, _)| i)
    }
}

mod mps;
pub mod topology;
pub use mps::{
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_PIPE_DIRECTORY,
};

#[cfg(test)]
mod delivery_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod topology_tests;

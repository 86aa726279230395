//! The pure core of Allocate and GetPreferredAllocation: a [`ResourcePlan`] and the device IDs
//! the kubelet chose → what the container gets. Knows nothing about tonic or sockets.
//!
//! Allocate rules (kubelet v1beta1 and NVIDIA's plugin):
//! - Every requested ID must be a device of this resource, else [`AllocateError::UnknownDevice`]
//!   naming the ID (the kubelet turns it into a failed pod start).
//! - `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` are the distinct physical GPU UUIDs
//!   behind the IDs, comma-joined, ordered by GPU index: the kubelet passes IDs in random order,
//!   and three replicas of one GPU are still one GPU.
//! - Stateless: the kubelet may call Allocate twice with overlapping IDs for one pod (init
//!   container, then app container); the kubelet is the book of record for allocations.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::plan::{ResourcePlan, Strategy, VirtualDevice};

/// Env var the NVIDIA container runtime reads to expose GPUs.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Env var CUDA reads to select GPUs inside the container.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

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
    /// An ID that is not a device of this resource.
    #[error("resource {resource}: unknown device ID {id:?}")]
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
    let mut gpus: BTreeMap<u32, &VirtualDevice> = BTreeMap::new();
    let mut distinct_ids = BTreeSet::new();
    for id in ids {
        let dev = res.device(id).ok_or_else(|| AllocateError::UnknownDevice {
            resource: res.name.to_string(),
            id: id.clone(),
        })?;
        distinct_ids.insert(id.as_str());
        gpus.entry(dev.gpu_index).or_insert(dev);
    }
    if res.fail_requests_greater_than_one
        && res.strategy == Strategy::TimeSlicing
        && distinct_ids.len() > 1
    {
        return Err(AllocateError::TooManyReplicas {
            resource: res.name.to_string(),
            count: distinct_ids.len(),
        });
    }
    let uuids = gpus
        .values()
        .map(|d| d.gpu_uuid.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let mut out = ContainerAllocation::default();
    out.envs
        .insert(NVIDIA_VISIBLE_DEVICES.to_string(), uuids.clone());
    out.envs.insert(CUDA_VISIBLE_DEVICES.to_string(), uuids);
    if res.pass_device_specs {
        let root = dev_root.trim_end_matches('/');
        let node = |name: &str| DeviceNode {
            container_path: format!("/dev/{name}"),
            host_path: format!("{root}/dev/{name}"),
            permissions: "rw".to_string(),
        };
        for d in gpus.values() {
            if let Some(minor) = d.gpu_minor {
                out.device_nodes.push(node(&format!("nvidia{minor}")));
            }
        }
        for name in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
            out.device_nodes.push(node(name));
        }
    }
    Ok(out)
}

/// GetPreferredAllocation for one container: exactly `size` IDs from `available` (fewer only
/// when `available` has fewer devices of this resource), deterministic, never an error.
///
/// - Every ID of `must_include` (devices an init container already got) comes first.
/// - IDs this resource does not know are skipped: another device being absent or unhealthy
///   never fails the pod (any error here is an UnexpectedAdmissionError at the kubelet).
/// - Then, one at a time: a GPU this container has the fewest devices of (distinct GPUs first),
///   then the least-loaded GPU (load = devices of that GPU not in `available`, i.e. in use),
///   then one on the NUMA node of the devices chosen so far, then the lowest GPU index, then
///   the lowest replica.
///
/// The answer is ordered as the resource lists its devices.
pub fn preferred(
    res: &ResourcePlan,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    // Position of each chosen device in res.devices.
    let mut chosen: BTreeSet<usize> = BTreeSet::new();
    let position = |id: &str| res.position(id);
    for id in must_include {
        if chosen.len() >= size {
            break;
        }
        if let Some(p) = position(id) {
            chosen.insert(p);
        }
    }
    // Candidates grouped by physical GPU, each list ascending by position (= replica order).
    let mut per_gpu: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for id in available {
        if let Some(p) = position(id) {
            if !chosen.contains(&p) {
                per_gpu.entry(res.devices[p].gpu_index).or_default().push(p);
            }
        }
    }
    for list in per_gpu.values_mut() {
        list.sort_unstable();
        list.dedup();
    }
    let mut total: HashMap<u32, usize> = HashMap::new();
    for d in &res.devices {
        *total.entry(d.gpu_index).or_default() += 1;
    }
    let mut picked: HashMap<u32, usize> = HashMap::new();
    for &p in &chosen {
        *picked.entry(res.devices[p].gpu_index).or_default() += 1;
    }
    // Load counts must_include devices as free: they are this container's own.
    let load: HashMap<u32, usize> = per_gpu
        .iter()
        .map(|(&g, list)| {
            let mine = picked.get(&g).copied().unwrap_or(0);
            (g, total[&g].saturating_sub(list.len() + mine))
        })
        .collect();
    let numa_of = |p: usize| res.devices[p].numa_node;
    let mut home_numa = chosen.iter().next().and_then(|&p| numa_of(p));
    let mut next: BTreeMap<u32, usize> = per_gpu.keys().map(|&g| (g, 0)).collect();
    while chosen.len() < size {
        let best = per_gpu
            .iter()
            .filter(|(g, list)| next[g] < list.len())
            .min_by_key(|(g, list)| {
                let numa_far = match home_numa {
                    Some(h) => numa_of(list[0]) != Some(h),
                    None => false,
                };
                (picked.get(g).copied().unwrap_or(0), load[g], numa_far, **g)
            })
            .map(|(g, _)| *g);
        let Some(g) = best else { break };
        let i = next.get_mut(&g).expect("key from per_gpu");
        let p = per_gpu[&g][*i];
        *i += 1;
        chosen.insert(p);
        *picked.entry(g).or_default() += 1;
        if home_numa.is_none() {
            home_numa = numa_of(p);
        }
    }
    chosen
        .into_iter()
        .map(|p| res.devices[p].id.clone())
        .collect()
}

#[cfg(test)]
mod tests;

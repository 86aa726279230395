//! Allocate and GetPreferredAllocation for MPS resources.
//!
//! Per container: the GPU (or MIG device) handed to the runtime as the `deviceListStrategy`
//! says (with `envvar`, `NVIDIA_VISIBLE_DEVICES` = its UUID or index) and no
//! `CUDA_VISIBLE_DEVICES` (an MPS client must not select devices itself: its daemon serves
//! exactly one); whatever the strategy:
//! `CUDA_MPS_PIPE_DIRECTORY=/mps/<uuid>/pipe`, bind-mounted from the host pipe directory of that
//! GPU's daemon; the shared `<mpsRoot>/shm` (the daemons' `/dev/shm`) mounted at `/dev/shm`; and the per-replica share in
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`. Those two
//! are informative: a client can only lower what the daemon enforces.
//!
//! One process uses one pipe directory, so IDs of two GPUs in one container request are
//! [`AllocateError::MpsSpansDevices`]; GetPreferredAllocation packs a multi-replica request onto
//! one GPU.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{AllocateError, ContainerAllocation, MountSpec, CUDA_VISIBLE_DEVICES};
use crate::plan::{container_pipe_dir, mps_dirs, physical_uuid, MpsResource, ResourcePlan};

/// The MPS pipe directory a client connects through.
pub const CUDA_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// A client's share of the GPU's threads (can only lower the daemon's default).
pub const CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// A client's pinned device memory, `<device>=<size>` (can only lower the daemon's default).
pub const CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";

/// The GPUs (or MIG devices) behind `ids`, ordered as the resource lists them.
fn targets<'a>(res: &ResourcePlan, ids: &'a [String]) -> Vec<&'a str> {
    let mut by_pos: BTreeMap<usize, &str> = BTreeMap::new();
    for id in ids {
        let uuid = physical_uuid(id);
        if !by_pos.values().any(|u| *u == uuid) {
            by_pos.insert(res.position(id).unwrap_or(usize::MAX), uuid);
        }
    }
    by_pos.into_values().collect()
}

/// Checks an MPS request whose IDs are all known: one GPU only, and one replica under
/// `failRequestsGreaterThanOne`.
pub(super) fn check_request(res: &ResourcePlan, ids: &[String]) -> Result<(), AllocateError> {
    let t = targets(res, ids);
    if t.len() > 1 {
        return Err(AllocateError::MpsSpansDevices {
            resource: res.name.to_string(),
            uuids: t.join(", "),
        });
    }
    let distinct: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    if res.fail_requests_greater_than_one && distinct.len() > 1 {
        return Err(AllocateError::TooManyReplicas {
            resource: res.name.to_string(),
            count: distinct.len(),
        });
    }
    Ok(())
}

/// Turns the generic allocation of a checked MPS request into an MPS client's.
pub(super) fn add_client(
    out: &mut ContainerAllocation,
    res: &ResourcePlan,
    mps: &MpsResource,
    ids: &[String],
) {
    let Some(uuid) = targets(res, ids).first().copied() else {
        return;
    };
    // The runtime's view (NVIDIA_VISIBLE_DEVICES, mounts, CDI names) follows the
    // deviceListStrategy like any container's: a checked request has one GPU.
    out.envs.remove(CUDA_VISIBLE_DEVICES);
    let pipe = container_pipe_dir(uuid);
    out.envs
        .insert(CUDA_MPS_PIPE_DIRECTORY.to_string(), pipe.clone());
    let dirs = mps_dirs(&mps.root, uuid);
    out.mounts.push(MountSpec {
        container_path: pipe,
        host_path: dirs.pipe.to_string_lossy().into_owned(),
        read_only: false,
    });
    out.mounts.push(MountSpec {
        container_path: "/dev/shm".to_string(),
        host_path: dirs.shm.to_string_lossy().into_owned(),
        read_only: false,
    });
    if let Some(d) = mps.daemons.get(uuid) {
        out.envs.insert(
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.to_string(),
            d.limits.active_thread_percentage.to_string(),
        );
        out.envs.insert(
            CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.to_string(),
            format!("0={}M", d.limits.pinned_memory_mib),
        );
    }
}

/// GetPreferredAllocation for an MPS resource: exactly `size` IDs from `available` (fewer only
/// when there are fewer), deterministic, never an error.
///
/// - `must_include` comes first, and its GPU is the one the rest is taken from.
/// - Otherwise one GPU that can hold the whole request: for one replica the least-loaded GPU
///   (load = its replicas not in `available`), spreading clients as time-slicing does; for
///   several, the GPU with the fewest free replicas that still holds them all (best fit, so
///   GPUs with room stay free for larger requests). Ties: lowest GPU index.
/// - When no single GPU can hold the request, the fullest-fitting GPU first and then the
///   others, so the kubelet still gets `size` IDs (Allocate then refuses the spanning request
///   by name instead of the pod failing admission opaquely).
pub(super) fn preferred(
    res: &ResourcePlan,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut chosen: BTreeSet<usize> = BTreeSet::new();
    for id in must_include {
        if chosen.len() >= size {
            break;
        }
        if let Some(p) = res.position(id) {
            chosen.insert(p);
        }
    }
    // Free positions per target, the target keyed by its first position in the resource.
    let mut firsts: HashMap<&str, usize> = HashMap::new();
    for (p, d) in res.devices.iter().enumerate() {
        firsts.entry(physical_uuid(&d.id)).or_insert(p);
    }
    let first_of = |uuid: &str| firsts.get(uuid).copied().unwrap_or(usize::MAX);
    let mut free: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for id in available {
        if let Some(p) = res.position(id) {
            if !chosen.contains(&p) {
                free.entry(first_of(physical_uuid(id))).or_default().push(p);
            }
        }
    }
    for list in free.values_mut() {
        list.sort_unstable();
        list.dedup();
    }
    let mut total: BTreeMap<usize, usize> = BTreeMap::new();
    for d in &res.devices {
        *total.entry(first_of(physical_uuid(&d.id))).or_default() += 1;
    }
    let need = size.saturating_sub(chosen.len());
    let home = chosen
        .iter()
        .next()
        .map(|&p| first_of(physical_uuid(&res.devices[p].id)));
    let load = |k: &usize, n: usize| total.get(k).copied().unwrap_or(0).saturating_sub(n);
    let mut order: Vec<usize> = free.keys().copied().collect();
    // Sort key per target: (is not home, cannot hold the request, tie-break score, index).
    order.sort_by_key(|k| {
        let n = free[k].len();
        let fits = n >= need;
        let score = if need <= 1 {
            load(k, n) as i64
        } else if fits {
            n as i64
        } else {
            -(n as i64)
        };
        (home != Some(*k), !fits, score, *k)
    });
    for k in order {
        for &p in &free[&k] {
            if chosen.len() >= size {
                break;
            }
            chosen.insert(p);
        }
    }
    chosen
        .into_iter()
        .map(|p| res.devices[p].id.clone())
        .collect()
}

#[cfg(test)]
mod tests;

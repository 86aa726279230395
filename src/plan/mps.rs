//! MPS resources in the plan: which GPUs (or MIG devices) get a control daemon, the limits
//! each of their clients gets, and how daemon health folds into device health.
//!
//! Rules (docs/mps.md):
//! - An MPS entry claims GPUs like a time-slicing entry; one GPU claimed by both, or by two MPS
//!   entries, is [`PlanError::GpuClaimedTwice`] naming both entries.
//! - Each GPU under MPS gets `replicas` devices `<uuid>::<n>` (the plain UUID for 1 replica), and
//!   one control daemon whose defaults are one replica's share: `activeThreadPercentage` and
//!   `pinnedDeviceMemoryLimit` (default the GPU's memory / replicas, rounded down to MiB).
//! - `replicas × pinnedDeviceMemoryLimit` above the GPU's memory is [`PlanError::MpsMemory`]
//!   with the numbers; replicas above the clients a daemon serves on that GPU (48, or 16 before
//!   compute capability 7.0) is [`PlanError::MpsClientLimit`].
//! - A daemon's devices are Healthy only while it is ready: readiness is device health, held by
//!   [`crate::health_tracker::Tracker`] and folded into the inventory before the plan is built;
//!   the limits a daemon still enforces while a change is pending are an input of
//!   [`super::build_with`]. Devices of other GPUs are never touched.
//!
//! MIG: an MPS entry may name a MIG resource (`nvidia.com/mig-1g.10gb` under `migStrategy:
//! mixed`, or `nvidia.com/gpu` under `single`): each selected MIG device gets its own daemon
//! ([`MpsTarget::mig`]), its memory the slice's.

use crate::device_health::Health;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::{
    claim_units, device_encoded_len, framed, id_len, replica_id, MigInfo, Plan, PlanError,
    ResourcePlan, Strategy, Unit, Units, VirtualDevice, MAX_LIST_BYTES,
};
use crate::inventory::{Gpu, MigDevice};
use crate::policy::{MpsEntry, Policy, ResourceName};
use crate::policy::{MAX_CLIENTS, MAX_CLIENTS_PRE_VOLTA};

/// The limits one MPS client gets, enforced by its GPU's control daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsLimits {
    /// `set_default_active_thread_percentage` / `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
    pub active_thread_percentage: u32,
    /// `set_default_device_pinned_mem_limit 0 <MiB>M` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`.
    #[serde(rename = "pinnedDeviceMemoryLimitMiB")]
    pub pinned_memory_mib: u64,
}

/// One control daemon: a GPU or MIG device under MPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDaemon {
    /// The GPU or MIG UUID: the daemon's `CUDA_VISIBLE_DEVICES` and its directory name.
    pub uuid: String,
    /// Index of the physical GPU.
    pub gpu_index: u32,
    /// UUID of the physical GPU (compute mode is set on it).
    pub gpu_uuid: String,
    /// The target is a MIG device.
    pub mig: bool,
    /// Clients (replicas) of this daemon.
    pub replicas: u32,
    /// Each client's limits.
    pub limits: MpsLimits,
    /// The policy entry, for logs (`sharing.mps.resources[0]`).
    pub entry: String,
}

/// The MPS facts of one resource: where its daemons' directories are and their limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsResource {
    /// `flags.mpsRoot`.
    pub root: PathBuf,
    /// `sharing.mps.exclusiveProcess`.
    pub exclusive_process: bool,
    /// Daemons by GPU/MIG UUID.
    pub daemons: BTreeMap<String, MpsDaemon>,
}

/// Every daemon the plan wants, for the MPS supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MpsWanted {
    /// `flags.mpsRoot`.
    pub root: PathBuf,
    /// `sharing.mps.exclusiveProcess`.
    pub exclusive_process: bool,
    /// Daemons by GPU/MIG UUID.
    pub daemons: BTreeMap<String, MpsDaemon>,
}

impl MpsWanted {
    /// The physical GPUs to set to EXCLUSIVE_PROCESS (`sharing.mps.exclusiveProcess`): those
    /// under MPS as whole GPUs (compute mode belongs to the whole GPU, so MIG devices are left
    /// alone).
    pub fn exclusive_gpus(&self) -> std::collections::BTreeSet<String> {
        if !self.exclusive_process {
            return Default::default();
        }
        self.daemons
            .values()
            .filter(|d| !d.mig)
            .map(|d| d.gpu_uuid.clone())
            .collect()
    }
}

/// The directories of one daemon under the MPS root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDirs {
    /// `<root>/<uuid>`: removed when the daemon stops.
    pub base: PathBuf,
    /// `<root>/<uuid>/pipe`: `CUDA_MPS_PIPE_DIRECTORY` (mode 0755), mounted into clients at
    /// `/mps/<uuid>/pipe`.
    pub pipe: PathBuf,
    /// `<root>/<uuid>/log`: `CUDA_MPS_LOG_DIRECTORY`.
    pub log: PathBuf,
    /// `<root>/shm`, shared by every daemon and client: the MPS server and its clients exchange
    /// memory through `/dev/shm`, so the daemons' container and every client mount this one
    /// host directory at `/dev/shm` (as NVIDIA's MPS daemon does). A per-GPU directory cannot
    /// work: all daemons run in one container with one `/dev/shm`.
    pub shm: PathBuf,
}

/// The directories of the daemon for `uuid` under `root`.
pub fn mps_dirs(root: &Path, uuid: &str) -> MpsDirs {
    let base = root.join(uuid);
    MpsDirs {
        pipe: base.join("pipe"),
        log: base.join("log"),
        shm: root.join("shm"),
        base,
    }
}

/// Where a client container sees a daemon's pipe directory.
pub fn container_pipe_dir(uuid: &str) -> String {
    format!("/mps/{uuid}/pipe")
}

/// A GPU or MIG device that can get an MPS control daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsTarget {
    /// GPU or MIG UUID.
    pub uuid: String,
    /// Index of the physical GPU.
    pub gpu_index: u32,
    /// UUID of the physical GPU.
    pub gpu_uuid: String,
    /// Minor number of the physical GPU.
    pub minor: Option<u32>,
    /// NUMA node of the physical GPU.
    pub numa_node: Option<i64>,
    /// Memory of the target (the whole GPU's, or the MIG slice's), MiB.
    pub memory_mib: u64,
    /// Compute capability of the physical GPU.
    pub compute_capability: Option<(u32, u32)>,
    /// Its health in the effective inventory.
    pub health: Health,
    /// The MIG device, for a MIG target.
    pub mig: Option<MigInfo>,
}

impl MpsTarget {
    /// A whole GPU.
    pub fn gpu(g: &Gpu) -> Self {
        MpsTarget {
            uuid: g.uuid.clone(),
            gpu_index: g.index,
            gpu_uuid: g.uuid.clone(),
            minor: g.minor,
            numa_node: g.numa_node,
            memory_mib: g.memory_mib,
            compute_capability: g.compute_capability,
            health: g.health,
            mig: None,
        }
    }

    /// A MIG device of `g`: one control daemon per MIG device.
    pub fn mig(g: &Gpu, m: &MigDevice) -> Self {
        MpsTarget {
            uuid: m.uuid.clone(),
            memory_mib: m.memory_mib,
            health: g.health.and(m.health),
            mig: Some(MigInfo::of(g, m)),
            ..MpsTarget::gpu(g)
        }
    }

    fn of(u: &Unit<'_>) -> Self {
        match u.mig {
            None => MpsTarget::gpu(u.gpu),
            Some(m) => MpsTarget::mig(u.gpu, m),
        }
    }

    /// Clients one control daemon serves on this target.
    pub fn max_clients(&self) -> u32 {
        match self.compute_capability {
            Some((major, _)) if major < 7 => MAX_CLIENTS_PRE_VOLTA,
            _ => MAX_CLIENTS,
        }
    }
}

/// The devices (GPUs or MIG devices) each MPS entry claims among the node's resources `base`,
/// recording claims in `claimed` (shared with time-slicing, so one device claimed by both is an
/// error naming both entries).
pub(super) fn claim<'a>(
    policy: &'a Policy,
    base: &Units<'a>,
    claimed: &mut HashMap<&'a str, &'a str>,
    warnings: &mut Vec<String>,
) -> Result<Vec<(&'a MpsEntry, Vec<MpsTarget>)>, PlanError> {
    let mut out = Vec::new();
    for entry in &policy.mps.resources {
        if let Some(picked) = claim_units(
            &entry.shared,
            policy.mig_strategy,
            base,
            claimed,
            None,
            warnings,
        )? {
            out.push((entry, picked.iter().map(MpsTarget::of).collect()));
        }
    }
    Ok(out)
}

/// Adds one resource per MPS entry to `resources`. `whole` are the devices each node resource
/// still advertises whole.
pub(super) fn insert_resources(
    policy: &Policy,
    claimed: Vec<(&MpsEntry, Vec<MpsTarget>)>,
    whole: &BTreeMap<&str, Vec<Unit<'_>>>,
    resources: &mut BTreeMap<String, Arc<ResourcePlan>>,
) -> Result<(), PlanError> {
    for (entry, targets) in claimed {
        let shared = &entry.shared;
        if let Some(rest) = whole.get(shared.advertised.as_str()) {
            return Err(PlanError::NameCollision {
                name: shared.advertised.to_string(),
                entry: shared.path.clone(),
                unclaimed: rest.iter().map(Unit::label).collect::<Vec<_>>().join(","),
            });
        }
        let res = mps_resource(&shared.advertised, entry, &targets, policy)?;
        resources.insert(shared.advertised.to_string(), Arc::new(res));
    }
    Ok(())
}

/// The resource for one MPS entry over `targets` (GPUs or MIG devices, ordered by index).
///
/// # Errors
/// [`PlanError::MpsPreVolta`], [`PlanError::MpsClientLimit`], [`PlanError::MpsMemory`],
/// [`PlanError::MessageTooLarge`].
pub fn mps_resource(
    name: &ResourceName,
    entry: &MpsEntry,
    targets: &[MpsTarget],
    policy: &Policy,
) -> Result<ResourcePlan, PlanError> {
    let shared = &entry.shared;
    let replicas = shared.replicas;
    let mut daemons = BTreeMap::new();
    let mut bytes: u64 = 0;
    for t in targets {
        let memory = check_target(t, entry, policy.mps.allow_pre_volta)?;
        for n in 0..replicas {
            bytes += framed(device_encoded_len(
                id_len(&t.uuid, replicas, n),
                t.health,
                t.numa_node,
            ));
        }
        if bytes > MAX_LIST_BYTES as u64 {
            return Err(PlanError::MessageTooLarge {
                resource: name.to_string(),
                devices: targets.len() as u64 * u64::from(replicas),
                bytes,
                limit: MAX_LIST_BYTES,
            });
        }
        daemons.insert(t.uuid.clone(), daemon(t, entry, memory));
    }
    let devices = devices(targets, replicas);
    Ok(ResourcePlan::new(
        name.clone(),
        Strategy::Mps,
        replicas,
        policy.mps.fail_requests_greater_than_one,
        policy.pass_device_specs,
        devices,
    )
    .with_mps(MpsResource {
        root: policy.mps_root.clone(),
        exclusive_process: policy.mps.exclusive_process,
        daemons,
    }))
}

/// Whether one MPS target can take `entry`'s clients: Volta or later (unless
/// `allow_pre_volta`), within its client limit, and with memory for every client; the pinned
/// memory limit per client (MiB) when it can.
fn check_target(t: &MpsTarget, entry: &MpsEntry, allow_pre_volta: bool) -> Result<u64, PlanError> {
    let shared = &entry.shared;
    let replicas = shared.replicas;
    if let Some((major, minor)) = t.compute_capability {
        if major < 7 && !allow_pre_volta {
            return Err(PlanError::MpsPreVolta {
                entry: shared.path.clone(),
                gpu: t.gpu_index,
                uuid: t.uuid.clone(),
                capability: format!("{major}.{minor}"),
            });
        }
    }
    if replicas > t.max_clients() {
        return Err(PlanError::MpsClientLimit {
            entry: shared.path.clone(),
            replicas,
            limit: t.max_clients(),
            gpu: t.gpu_index,
            uuid: t.uuid.clone(),
        });
    }
    let memory = match entry.pinned_device_memory_limit_mib {
        Some(m) => m,
        None => t.memory_mib / u64::from(replicas),
    };
    if memory == 0 || u64::from(replicas) * memory > t.memory_mib {
        return Err(PlanError::MpsMemory {
            entry: shared.path.clone(),
            replicas,
            limit_mib: memory,
            total_mib: u64::from(replicas) * memory,
            gpu: t.gpu_index,
            uuid: t.uuid.clone(),
            memory_mib: t.memory_mib,
        });
    }
    Ok(memory)
}

/// The control daemon of one MPS target, enforcing `memory` MiB per client.
fn daemon(t: &MpsTarget, entry: &MpsEntry, memory: u64) -> MpsDaemon {
    let shared = &entry.shared;
    let replicas = shared.replicas;
    MpsDaemon {
        uuid: t.uuid.clone(),
        gpu_index: t.gpu_index,
        gpu_uuid: t.gpu_uuid.clone(),
        mig: t.mig.is_some(),
        replicas,
        limits: MpsLimits {
            active_thread_percentage: entry.active_thread_percentage,
            pinned_memory_mib: memory,
        },
        entry: shared.path.clone(),
    }
}

/// The devices of an MPS resource: `replicas` per target (`<uuid>::<n>`, or the bare UUID with
/// one replica), in target order.
fn devices(targets: &[MpsTarget], replicas: u32) -> Vec<VirtualDevice> {
    let mut devices = Vec::with_capacity(targets.len() * replicas as usize);
    for t in targets {
        for n in 0..replicas {
            let (id, replica) = if replicas > 1 {
                (replica_id(&t.uuid, n), Some(n))
            } else {
                (t.uuid.clone(), None)
            };
            devices.push(VirtualDevice {
                id,
                gpu_index: t.gpu_index,
                gpu_uuid: t.uuid.clone(),
                gpu_minor: t.minor,
                replica,
                health: t.health,
                numa_node: t.numa_node,
                mig: t.mig.clone(),
            });
        }
    }
    devices
}

impl ResourcePlan {
    /// Attaches the MPS facts of an MPS resource.
    pub fn with_mps(mut self, mps: MpsResource) -> Self {
        self.mps = Some(mps);
        self
    }

    /// The MPS daemon behind a device ID of this resource, for MPS resources.
    pub fn mps_daemon(&self, id: &str) -> Option<&MpsDaemon> {
        self.mps.as_ref()?.daemons.get(super::physical_uuid(id))
    }
}

impl Plan {
    /// Every control daemon this plan wants, across its MPS resources.
    pub fn mps_wanted(&self) -> MpsWanted {
        let mut out = MpsWanted::default();
        for mps in self.resources.values().filter_map(|r| r.mps.as_ref()) {
            out.root.clone_from(&mps.root);
            out.exclusive_process = mps.exclusive_process;
            out.daemons
                .extend(mps.daemons.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        out
    }

    /// Folds what the MPS daemons enforce now into the plan being built (a step of
    /// [`super::build_with`], before the plan is published): while a limit change is pending a
    /// daemon still enforces its old limits, and those are the ones advertised; only as many
    /// replicas as fit the memory the policy planned for at the old per-client memory limit
    /// stay allocatable, the rest are Unhealthy until the GPU drains (else, e.g., ×4 → ×8
    /// would hand out 8 × a quarter of the GPU). Daemon readiness is device health, owned by
    /// [`crate::health_tracker::Tracker`] and folded into the inventory before the build.
    /// Devices of other GPUs and of other strategies are untouched.
    pub(super) fn apply_mps_limits(&mut self, applied: &BTreeMap<String, MpsLimits>) {
        for res in self.resources.values_mut() {
            let Some(mps) = &res.mps else { continue };
            let stale: Vec<(String, MpsLimits)> = mps
                .daemons
                .iter()
                .filter_map(|(u, d)| {
                    let applied = *applied.get(u)?;
                    (applied != d.limits).then(|| (u.clone(), applied))
                })
                .collect();
            if stale.is_empty() {
                continue;
            }
            let allowed: BTreeMap<&str, u32> = stale
                .iter()
                .filter_map(|(u, applied)| {
                    let d = mps.daemons.get(u)?;
                    let budget = u64::from(d.replicas) * d.limits.pinned_memory_mib;
                    let fit = budget
                        .checked_div(applied.pinned_memory_mib)
                        .map_or(d.replicas, |n| u32::try_from(n).unwrap_or(u32::MAX));
                    Some((u.as_str(), fit.min(d.replicas)))
                })
                .collect();
            let over: Vec<usize> = res
                .devices
                .iter()
                .enumerate()
                .filter(|(_, d)| {
                    allowed
                        .get(super::physical_uuid(&d.id))
                        .is_some_and(|&n| d.replica.unwrap_or(0) >= n)
                })
                .map(|(i, _)| i)
                .collect();
            let r = Arc::make_mut(res);
            for i in over {
                r.devices[i].health = Health::Unhealthy;
            }
            if let Some(mps) = r.mps.as_mut() {
                for (u, applied) in stale {
                    if let Some(d) = mps.daemons.get_mut(&u) {
                        d.limits = applied;
                    }
                }
            }
        }
    }
}

/// One daemon in `slicelet plan`'s view.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemonView {
    /// GPU or MIG UUID.
    pub uuid: String,
    /// Clients.
    pub replicas: u32,
    /// Per-client limits.
    #[serde(flatten)]
    pub limits: MpsLimits,
}

impl MpsResource {
    /// The view of this resource's daemons.
    pub fn view(&self) -> Vec<MpsDaemonView> {
        let mut daemons: Vec<&MpsDaemon> = self.daemons.values().collect();
        daemons.sort_by(|a, b| (a.gpu_index, &a.uuid).cmp(&(b.gpu_index, &b.uuid)));
        daemons
            .into_iter()
            .map(|d| MpsDaemonView {
                uuid: d.uuid.clone(),
                replicas: d.replicas,
                limits: d.limits,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod pre_volta_tests {
    use crate::inventory::test_node;
    use crate::plan::{build, PlanError};
    use crate::policy::parse;

    #[test]
    fn mps_on_a_pre_volta_gpu_is_an_error_naming_it_unless_allowed() {
        let mut node = test_node(2);
        node.gpus[1].compute_capability = Some((6, 1));
        let policy = |extra: &str| {
            parse(&format!(
                "sharing:\n  mps:\n{extra}    resources:\n      - name: gpu\n        replicas: 2\n"
            ))
            .unwrap()
        };
        let e = build(&policy(""), &node).unwrap_err();
        assert!(
            matches!(&e, PlanError::MpsPreVolta { gpu: 1, capability, .. } if capability == "6.1"),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("sharing.mps.resources[0]: GPU 1 (")
                && msg.contains(&node.gpus[1].uuid)
                && msg.contains("compute capability 6.1"),
            "{msg}"
        );
        assert!(build(&policy("    allowPreVolta: true\n"), &node).is_ok());
        // Volta and newer, and unknown capabilities, are fine.
        node.gpus[1].compute_capability = Some((7, 0));
        assert!(build(&policy(""), &node).is_ok());
    }
}

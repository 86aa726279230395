//! Per-container GPU figures: one sample of the node ([`Samples`]) joined with the plan (which
//! device ID is on which GPU) and what pod-resources says is held ([`InUse`]). Pure.
//!
//! The join, per GPU:
//!
//! 1. Every container holding a device of this GPU (per [`InUse`], through the plan's device
//!    of that ID in that resource: its `gpu_uuid`, or for a MIG device its parent's UUID) gets
//!    an entry, SM 0 % and 0 bytes, even with no process at the moment: dashboards must show
//!    idle containers (that is the scale-to-zero signal).
//! 2. Each process's pod UID (from its cgroup) → the pod's entries whose device IDs are on
//!    this GPU → (container name, resource, device IDs) → the holder of one of those IDs in
//!    [`InUse`] with that container name (and, for a DRA entry, that namespace and pod) gives
//!    the namespace and pod. Its SM % and memory are added to that container's entry. A pod's
//!    entries are the kubelet's device checkpoint's ([`Samples::checkpoint`]) and, for DRA
//!    claims, those [`claim_entries`] derives (below).
//! 3. A process whose pod is unknown (no pod UID, no entry on this GPU, or pod-resources does
//!    not list the container yet) counts at GPU level only, in
//!    [`GpuFigures::unattributed_processes`].
//! 4. Without a usable checkpoint ([`Samples::checkpoint_error`]) no device-plugin container of
//!    a whole GPU or replica gets an entry at all: its use is unknown, and unknown is not idle
//!    (a 0 % entry would read as idle and scale a busy Deployment to zero). Its series
//!    disappear; MIG holders keep theirs (they need no checkpoint).
//! 5. The same for DRA: a container holding devices of a DRA resource gets an entry only when
//!    a prepared claim names its pod ([`claim_entries`]); otherwise its use is unknown and
//!    withheld, and its pod's processes count at GPU level.
//!
//! Two containers of one pod with devices on one GPU: a process's cgroup names its container
//! ID, which only the Pod API maps to a container name, so the process goes to the container
//! whose entry is first in container-name order.
//!
//! DRA: the kubelet's device checkpoint lists only device-plugin allocations, never DRA
//! claims, so a DRA pod's UID is mapped to its devices through the claims slicelet prepared
//! ([`Samples::claims`], from its own DRA checkpoint): each prepared claim records the pods it
//! is reserved for (`status.reservedFor`: name and UID) as the prepare step fetched it, and
//! pod-resources (Kubernetes 1.34+, `dynamic_resources` per container) says which containers of
//! which pod hold which claim's devices. So pod UID → (claim's namespace, pod name) →
//! containers listing the claim's devices → device IDs ([`claim_entries`]). Chosen because it
//! needs nothing new: the claim is fetched anyway, the scheduler reserves it for the pod
//! before the kubelet prepares it (the kubelet refuses otherwise), and the record is
//! slicelet's own, versioned file. The other sources were worse: pod-resources carries no pod
//! UID; the kubelet's DRA state file (`dra_manager_state`) has pod UIDs but is the kubelet's
//! internal, changing format behind another host mount; asking the Pod API needs pods
//! get/list/watch for the node and one more watch to keep. The cost: the kubelet prepares a
//! claim once per node, so a pod that shares an already prepared claim (a ResourceClaim, not a
//! template, reserved for several pods) is not recorded until the claim is prepared again;
//! its containers' use is withheld meanwhile (rule 5), as is that of claims prepared by a
//! slicelet that did not record pods.
//!
//! GPU memory limits: a container holding devices of a resource with `memory` limits gets
//! [`ContainerFigures::memory_limit`]: the policy's limits times the replicas it holds on the
//! unit, and whether they hold, read back (by the sampler, through NVML) for the cgroups of
//! its processes on the GPU. Not assumed: with no process on the GPU yet, its cgroup is not
//! known and `enforced` is `None`; where the plan serves the unit unenforced, or the GPU takes
//! no limits, it is `Some(false)`.
//!
//! MIG: NVIDIA gives no per-process utilisation on MIG devices, so a MIG device's own figures
//! (memory, and GPM SM use where the GPU supports it) go to the container holding that MIG
//! device per [`InUse`] (no checkpoint needed). Under MIG with replicas (one MIG device shared
//! by several containers) the figures go to the first holder in (namespace, pod, container)
//! order.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::plan::{Plan, VirtualDevice};
use crate::podres::{Holder, InUse};
use crate::usage::{ClaimEntry, GpuSample, Samples};

/// Everything one sample says, attributed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    /// When the sample was taken, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// One entry per sampled GPU, in the sample's order (by index).
    pub gpus: Vec<GpuFigures>,
    /// Why the checkpoint could not be used ([`Samples::checkpoint_error`]): then no process
    /// is attributed.
    pub checkpoint_error: Option<String>,
    /// Removed cgroups whose GPU memory limit was still reported ([`Samples::limits_not_cleared`]).
    pub limits_not_cleared: u32,
}

impl Figures {
    /// Processes counted at GPU level only, over every GPU.
    pub fn unattributed_processes(&self) -> u64 {
        self.gpus
            .iter()
            .map(|g| u64::from(g.unattributed_processes))
            .sum()
    }
}

/// One GPU's figures and the containers on it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuFigures {
    /// The GPU's UUID (`GPU-…`).
    pub uuid: String,
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub model: String,
    /// Utilisation, percent (0–100); `None` when NVML does not say.
    pub utilization_percent: Option<u32>,
    /// Framebuffer memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Framebuffer memory in all, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Processes on this GPU that could not be given to a container (see the module doc).
    pub unattributed_processes: u32,
    /// Whether the GPU takes per-cgroup memory limits ([`GpuSample::memory_limits_supported`]).
    pub memory_limits_supported: Option<bool>,
    /// Its MIG devices' figures, in the sample's order.
    pub mig: Vec<MigFigures>,
    /// The containers holding devices on this GPU (or its MIG devices), ordered by
    /// (unit UUID, resource, namespace, pod, container).
    pub containers: Vec<ContainerFigures>,
}

/// One MIG device's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigFigures {
    /// The MIG device's UUID (`MIG-…`).
    pub uuid: String,
    /// Its profile (`1g.10gb`) from the plan; `None` when no advertised device is on it.
    pub profile: Option<String>,
    /// GPM SM use, percent, where the GPU supports GPM.
    pub utilization_percent: Option<u32>,
    /// Memory in use, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Memory in all, bytes.
    pub memory_total_bytes: Option<u64>,
}

/// One container's use of one unit (a whole GPU or a MIG device) through one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerFigures {
    /// Who, as pod-resources names it.
    pub holder: Holder,
    /// The extended resource its devices are of.
    pub resource: String,
    /// The unit's UUID: the GPU's (`GPU-…`), or the MIG device's (`MIG-…`).
    pub unit_uuid: String,
    /// The device IDs it holds on this unit, in order.
    pub device_ids: Vec<String>,
    /// SM use, percent, summed over its processes on the unit (can exceed 100 only when NVML's
    /// per-process samples overlap); for a MIG device its GPM SM use (0 when not supported).
    pub sm_util_percent: u32,
    /// GPU memory, bytes, summed over its processes; for a MIG device the device's memory in
    /// use.
    pub memory_used_bytes: u64,
    /// Processes counted for it (0 for MIG devices: NVML has no per-process data there).
    pub processes: u32,
    /// Its GPU memory limit on the unit, when its resource has `memory` limits.
    pub memory_limit: Option<ContainerLimit>,
}

/// A container's GPU memory limit on one unit: what the policy gives it, and whether NVML
/// reads it back for the container's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerLimit {
    /// Hard limit, bytes: the entry's `memory.hard` times the replicas held on the unit.
    pub hard_bytes: u64,
    /// Soft limit, bytes, the same way; `None` when the entry sets none.
    pub soft_bytes: Option<u64>,
    /// `Some(true)`: NVML reads back exactly these limits for the cgroup of every process of
    /// the container on the GPU. `Some(false)`: the plan serves the unit unenforced
    /// (`enforce: best-effort`), the GPU takes no limits, or a process's cgroup reads back
    /// other limits or none. `None`: no process on the GPU yet (its cgroup is unknown).
    pub enforced: Option<bool>,
}

const MIB: u64 = 1024 * 1024;

/// The limit of a container holding `ids` of `resource` on `gpu` (a [`GpuSample`]), its
/// processes' cgroups being `cgroups`; `None` when the resource has no memory limits.
fn limit_of(
    plan: &Plan,
    resource: &str,
    ids: &[String],
    gpu: &GpuSample,
    cgroups: Option<&BTreeSet<String>>,
) -> Option<ContainerLimit> {
    let res = plan.resources.get(resource)?;
    let m = res.memory.as_ref()?;
    let device = res.device(ids.first()?)?;
    let n = ids.len() as u64;
    let hard_bytes = m.limits.hard_mib.saturating_mul(MIB).saturating_mul(n);
    let soft_bytes = m
        .limits
        .soft_mib
        .map(|s| s.saturating_mul(MIB).saturating_mul(n));
    let enforced = if !m.enforced(device) || gpu.memory_limits_supported == Some(false) {
        Some(false)
    } else {
        cgroups.filter(|c| !c.is_empty()).map(|cgroups| {
            cgroups.iter().all(|cgroup| {
                gpu.cgroup_limits.iter().any(|l| {
                    l.cgroup == *cgroup
                        && l.reading.hard == hard_bytes
                        && l.reading.soft == soft_bytes.unwrap_or(0)
                })
            })
        })
    };
    Some(ContainerLimit {
        hard_bytes,
        soft_bytes,
        enforced,
    })
}

/// The container's key inside one GPU: (unit UUID, resource, holder).
type Key = (String, String, Holder);

/// Attributes one sample; see the module doc for the rules.
pub fn attribute(samples: &Samples, plan: &Plan, in_use: &InUse) -> Figures {
    // Physical GPU UUID → its containers, from what is held.
    let mut held: HashMap<&str, BTreeMap<Key, Vec<String>>> = HashMap::new();
    for (resource, id, holders) in in_use.iter() {
        let Some(device) = device_of(plan, resource, id) else {
            continue;
        };
        let containers = held.entry(physical(device)).or_default();
        for h in holders {
            containers
                .entry((device.gpu_uuid.clone(), resource.to_string(), h.clone()))
                .or_default()
                .push(id.to_string());
        }
    }
    // Pod UID → its entries, in container-name order (the tie rule).
    let mut by_pod: HashMap<&str, Vec<PodEntry<'_>>> = HashMap::new();
    for e in samples.checkpoint.iter().flatten() {
        by_pod
            .entry(e.pod_uid.as_str())
            .or_default()
            .push(PodEntry {
                container: &e.container,
                resource: &e.resource,
                device_ids: e.device_ids.iter().map(String::as_str).collect(),
                pod: None,
            });
    }
    let (dra_entries, dra_known) = claim_entries(samples.claims.as_deref().unwrap_or(&[]), in_use);
    for (uid, e) in dra_entries {
        by_pod.entry(uid).or_default().push(e);
    }
    for entries in by_pod.values_mut() {
        entries.sort_by(|a, b| a.container.cmp(b.container));
    }

    let known = |key: &Key| {
        if key.0.starts_with("MIG-") {
            true
        } else if plan.resources.get(&key.1).is_some_and(|r| r.dra) {
            dra_known.contains(&(key.1.as_str(), &key.2))
        } else {
            samples.checkpoint.is_some()
        }
    };
    let gpus = samples
        .gpus
        .iter()
        .map(|g| {
            let mut containers: BTreeMap<Key, ContainerFigures> = held
                .get(g.uuid.as_str())
                .into_iter()
                .flatten()
                .filter(|(key, _)| known(key))
                .map(|(key, ids)| {
                    let figures = ContainerFigures {
                        holder: key.2.clone(),
                        resource: key.1.clone(),
                        unit_uuid: key.0.clone(),
                        device_ids: ids.clone(),
                        sm_util_percent: 0,
                        memory_used_bytes: 0,
                        processes: 0,
                        memory_limit: None,
                    };
                    (key.clone(), figures)
                })
                .collect();
            let mut unattributed = 0u32;
            // Each container's processes' cgroups on this GPU (for its memory limit).
            let mut cgroups: HashMap<Key, BTreeSet<String>> = HashMap::new();
            for p in &g.processes {
                let key = p
                    .pod_uid
                    .as_deref()
                    .and_then(|uid| by_pod.get(uid))
                    .and_then(|entries| container_of(entries, &g.uuid, plan, in_use));
                match key.and_then(|k| containers.get_mut(&k).map(|c| (k, c))) {
                    Some((k, c)) => {
                        if let Some(cgroup) = &p.cgroup {
                            cgroups.entry(k).or_default().insert(cgroup.clone());
                        }
                        c.sm_util_percent = c
                            .sm_util_percent
                            .saturating_add(p.sm_util_percent.unwrap_or(0));
                        c.memory_used_bytes = c
                            .memory_used_bytes
                            .saturating_add(p.memory_used_bytes.unwrap_or(0));
                        c.processes += 1;
                    }
                    None => unattributed += 1,
                }
            }
            let mut mig = Vec::with_capacity(g.mig.len());
            for m in &g.mig {
                // The first holder of a device on this MIG device (BTreeMap order).
                if let Some(c) = containers.values_mut().find(|c| c.unit_uuid == m.uuid) {
                    c.sm_util_percent = m.utilization_percent.unwrap_or(0);
                    c.memory_used_bytes = m.memory_used_bytes.unwrap_or(0);
                }
                mig.push(MigFigures {
                    uuid: m.uuid.clone(),
                    profile: mig_profile(plan, &m.uuid),
                    utilization_percent: m.utilization_percent,
                    memory_used_bytes: m.memory_used_bytes,
                    memory_total_bytes: m.memory_total_bytes,
                });
            }
            for (key, c) in &mut containers {
                c.memory_limit = limit_of(plan, &c.resource, &c.device_ids, g, cgroups.get(key));
            }
            GpuFigures {
                uuid: g.uuid.clone(),
                index: g.index,
                model: g.model.clone(),
                utilization_percent: g.utilization_percent,
                memory_used_bytes: g.memory_used_bytes,
                memory_total_bytes: g.memory_total_bytes,
                unattributed_processes: unattributed,
                memory_limits_supported: g.memory_limits_supported,
                mig,
                containers: containers.into_values().collect(),
            }
        })
        .collect();
    Figures {
        at_unix_ms: samples.at_unix_ms,
        gpus,
        checkpoint_error: samples.checkpoint_error.clone(),
        limits_not_cleared: samples.limits_not_cleared,
    }
}

/// The plan's device `id` of `resource`.
fn device_of<'a>(plan: &'a Plan, resource: &str, id: &str) -> Option<&'a VirtualDevice> {
    plan.resources.get(resource)?.device(id)
}

/// The physical GPU a device is on: its own UUID, or its MIG device's parent.
pub(crate) fn physical(device: &VirtualDevice) -> &str {
    device
        .mig
        .as_ref()
        .map_or(device.gpu_uuid.as_str(), |m| m.parent_uuid.as_str())
}

/// The profile of the advertised device(s) on MIG device `uuid`.
fn mig_profile(plan: &Plan, uuid: &str) -> Option<String> {
    plan.resources
        .values()
        .flat_map(|r| r.devices.iter())
        .find(|d| d.gpu_uuid == uuid)
        .and_then(|d| d.mig.as_ref())
        .map(|m| m.profile.clone())
}

/// One of a pod's entries: a container's device IDs of one resource, from the kubelet's
/// checkpoint (`pod` is `None`: the device IDs alone name the holder) or from a prepared DRA
/// claim (`pod` is its namespace and name: a claim's devices can be held by several pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry<'a> {
    /// The container's name.
    pub container: &'a str,
    /// The resource of its devices.
    pub resource: &'a str,
    /// Its device IDs of that resource.
    pub device_ids: Vec<&'a str>,
    /// (namespace, pod name), for an entry from a claim.
    pub pod: Option<(&'a str, &'a str)>,
}

/// The entries DRA claims give, by pod UID, and the (resource, holder) pairs they cover.
pub type ClaimJoin<'a> = (Vec<(&'a str, PodEntry<'a>)>, HashSet<(&'a str, &'a Holder)>);

/// The entries the prepared `claims` give (see the module doc): for each claim, each pod it is
/// reserved for, and each container of that pod (same namespace and pod name) that
/// pod-resources lists holding one of the claim's devices (`in_use.claimed`, by device name):
/// (pod UID, that container's device IDs of each resource). Also every (resource, holder)
/// such an entry covers: the DRA holders whose use is known. A claim whose pods are not
/// recorded, or a pod-resources holder no claim names, gives nothing.
pub fn claim_entries<'a>(claims: &'a [ClaimEntry], in_use: &'a InUse) -> ClaimJoin<'a> {
    let mut grouped: BTreeMap<(&str, &str, &str, &str, &str), Vec<&str>> = BTreeMap::new();
    let mut known = HashSet::new();
    for c in claims {
        for d in &c.devices {
            let holders = in_use.claimed.get(&d.name).map_or(&[][..], Vec::as_slice);
            for h in holders.iter().filter(|h| h.namespace == c.namespace) {
                for p in c.pods.iter().filter(|p| p.name == h.pod) {
                    let ids = grouped
                        .entry((&p.uid, &h.container, &d.resource, &h.namespace, &h.pod))
                        .or_default();
                    if !ids.contains(&d.id.as_str()) {
                        ids.push(&d.id);
                    }
                    known.insert((d.resource.as_str(), h));
                }
            }
        }
    }
    let entries = grouped
        .into_iter()
        .map(|((uid, container, resource, namespace, pod), device_ids)| {
            (
                uid,
                PodEntry {
                    container,
                    resource,
                    device_ids,
                    pod: Some((namespace, pod)),
                },
            )
        })
        .collect();
    (entries, known)
}

/// The container a process of a pod with these `entries` (container-name order) is given on
/// GPU `gpu`: the first entry with a device ID on it whose holder pod-resources lists (with
/// that container name, and for a claim's entry that namespace and pod).
fn container_of(entries: &[PodEntry<'_>], gpu: &str, plan: &Plan, in_use: &InUse) -> Option<Key> {
    entries.iter().find_map(|e| {
        e.device_ids.iter().find_map(|id| {
            let device = device_of(plan, e.resource, id)?;
            if physical(device) != gpu {
                return None;
            }
            let holder = in_use.holders(e.resource, id).iter().find(|h| {
                h.container == e.container
                    && e.pod
                        .is_none_or(|(ns, pod)| h.namespace == ns && h.pod == pod)
            })?;
            Some((
                device.gpu_uuid.clone(),
                e.resource.to_string(),
                holder.clone(),
            ))
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::health::Health;
    use crate::inventory::sample::{CgroupLimits, LimitReading};
    use crate::plan::{MigInfo, ResourcePlan, Strategy};
    use crate::policy::ResourceName;
    use crate::usage::{CheckpointEntry, GpuSample, MigSample, ProcessSample};
    use std::sync::Arc;

    pub(crate) const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
    pub(crate) const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
    pub(crate) const MIG0: &str = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
    pub(crate) const MIB: u64 = 1024 * 1024;

    pub(crate) fn replica(gpu: &str, index: u32, n: u32) -> VirtualDevice {
        VirtualDevice {
            id: crate::plan::replica_id(gpu, n),
            gpu_index: index,
            gpu_uuid: gpu.to_string(),
            gpu_minor: None,
            replica: Some(n),
            health: Health::Healthy,
            numa_node: None,
            mig: None,
        }
    }

    pub(crate) fn mig_device(parent: &str, index: u32, uuid: &str) -> VirtualDevice {
        VirtualDevice {
            id: uuid.to_string(),
            gpu_index: index,
            gpu_uuid: uuid.to_string(),
            gpu_minor: None,
            replica: None,
            health: Health::Healthy,
            numa_node: None,
            mig: Some(MigInfo {
                index: 0,
                parent_uuid: parent.to_string(),
                profile: "1g.10gb".to_string(),
                gi_id: 7,
                ci_id: 0,
                caps: None,
            }),
        }
    }

    pub(crate) fn resource(
        name: &str,
        strategy: Strategy,
        devices: Vec<VirtualDevice>,
    ) -> Arc<ResourcePlan> {
        Arc::new(ResourcePlan::new(
            ResourceName::parse(name).unwrap(),
            strategy,
            1,
            false,
            false,
            devices,
        ))
    }

    /// `nvidia.com/gpu-shared`: GPU0 (index 0) and GPU1 (index 1), ×4 each; `nvidia.com/mig-1g.10gb`:
    /// MIG0 on GPU1.
    pub(crate) fn plan() -> Plan {
        let mut devices: Vec<VirtualDevice> = (0..4).map(|n| replica(GPU0, 0, n)).collect();
        devices.extend((0..4).map(|n| replica(GPU1, 1, n)));
        let mut plan = Plan::default();
        plan.resources.insert(
            "nvidia.com/gpu-shared".into(),
            resource("nvidia.com/gpu-shared", Strategy::TimeSlicing, devices),
        );
        plan.resources.insert(
            "nvidia.com/mig-1g.10gb".into(),
            resource(
                "nvidia.com/mig-1g.10gb",
                Strategy::None,
                vec![mig_device(GPU1, 1, MIG0)],
            ),
        );
        plan
    }

    pub(crate) fn holder(ns: &str, pod: &str, container: &str) -> Holder {
        Holder {
            namespace: ns.into(),
            pod: pod.into(),
            container: container.into(),
        }
    }

    pub(crate) fn process(pid: u32, pod: Option<&str>, sm: u32, mib: u64) -> ProcessSample {
        ProcessSample {
            pid,
            sm_util_percent: Some(sm),
            memory_used_bytes: Some(mib * MIB),
            pod_uid: pod.map(str::to_string),
            container_id: None,
            cgroup: None,
        }
    }

    pub(crate) fn entry(
        pod: &str,
        container: &str,
        resource: &str,
        ids: &[&str],
    ) -> CheckpointEntry {
        CheckpointEntry {
            pod_uid: pod.into(),
            container: container.into(),
            resource: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// A prepared claim of `namespace` reserved for `pods` (name, UID), holding `ids` of
    /// `nvidia.com/gpu-shared` under their published names.
    pub(crate) fn claim(namespace: &str, pods: &[(&str, &str)], ids: &[&str]) -> ClaimEntry {
        ClaimEntry {
            namespace: namespace.into(),
            pods: pods
                .iter()
                .map(|(name, uid)| crate::usage::ClaimPod {
                    name: (*name).into(),
                    uid: (*uid).into(),
                })
                .collect(),
            devices: ids
                .iter()
                .map(|id| crate::usage::ClaimDevice {
                    name: crate::plan::dra_names::device_name(id),
                    resource: SHARED.into(),
                    id: (*id).into(),
                })
                .collect(),
        }
    }

    pub(crate) fn gpu(uuid: &str, index: u32, processes: Vec<ProcessSample>) -> GpuSample {
        GpuSample {
            uuid: uuid.into(),
            index,
            model: "NVIDIA H100 80GB HBM3".into(),
            utilization_percent: Some(40),
            memory_used_bytes: Some(3 * 1024 * MIB),
            memory_total_bytes: Some(80 * 1024 * MIB),
            processes,
            mig: Vec::new(),
            ..GpuSample::default()
        }
    }

    const SHARED: &str = "nvidia.com/gpu-shared";
    const MIG: &str = "nvidia.com/mig-1g.10gb";

    /// Two pods on `GPU0::0` and `GPU0::1`, a pod UID → checkpoint; the case the issue's "done
    /// when" names.
    pub(crate) fn two_pods() -> (Samples, InUse) {
        let r0 = crate::plan::replica_id(GPU0, 0);
        let r1 = crate::plan::replica_id(GPU0, 1);
        let mut in_use = InUse::default();
        in_use.insert(SHARED, &r0, holder("ml", "a", "main"));
        in_use.insert(SHARED, &r1, holder("ml", "b", "main"));
        let samples = Samples {
            at_unix_ms: 1_000_000,
            gpus: vec![
                gpu(
                    GPU0,
                    0,
                    vec![
                        process(100, Some("uid-a"), 30, 1024),
                        process(200, Some("uid-b"), 10, 512),
                    ],
                ),
                gpu(GPU1, 1, vec![]),
            ],
            checkpoint: Some(vec![
                entry("uid-a", "main", SHARED, &[&r0]),
                entry("uid-b", "main", SHARED, &[&r1]),
            ]),
            checkpoint_error: None,
            claims: None,
            limits_not_cleared: 0,
        };
        (samples, in_use)
    }

    /// (namespace/pod/container, unit, SM %, MiB, processes) of each container on GPU `g`.
    fn summary(f: &Figures, g: usize) -> Vec<(String, String, u32, u64, u32)> {
        f.gpus[g]
            .containers
            .iter()
            .map(|c| {
                (
                    format!(
                        "{}/{}/{}",
                        c.holder.namespace, c.holder.pod, c.holder.container
                    ),
                    c.unit_uuid.clone(),
                    c.sm_util_percent,
                    c.memory_used_bytes / MIB,
                    c.processes,
                )
            })
            .collect()
    }

    #[test]
    fn cases() {
        let plan = plan();
        let r0 = crate::plan::replica_id(GPU0, 0);
        let r1 = crate::plan::replica_id(GPU0, 1);
        let r2 = crate::plan::replica_id(GPU0, 2);
        struct Case {
            name: &'static str,
            samples: Samples,
            in_use: InUse,
            /// Per container on GPU0.
            gpu0: Vec<(&'static str, &'static str, u32, u64, u32)>,
            unattributed: u32,
            /// `nvidia.com/gpu-shared` is served through DRA.
            dra: bool,
        }
        let (two, two_in_use) = two_pods();
        let mut stranger = two.clone();
        // A process of no pod (a host process) and one of a pod the checkpoint does not know.
        stranger.gpus[0].processes.push(process(300, None, 50, 100));
        stranger.gpus[0]
            .processes
            .push(process(301, Some("uid-z"), 5, 100));
        let mut no_checkpoint = two.clone();
        no_checkpoint.checkpoint = None;
        no_checkpoint.checkpoint_error = Some("missing".into());
        // One pod, two containers on GPU0 (`sidecar` on ::2, `main` on ::0): the process goes
        // to `main`, first in name order.
        let mut one_pod = Samples {
            gpus: vec![gpu(GPU0, 0, vec![process(100, Some("uid-a"), 20, 256)])],
            checkpoint: Some(vec![
                entry("uid-a", "sidecar", SHARED, &[&r2]),
                entry("uid-a", "main", SHARED, &[&r0]),
            ]),
            ..Samples::default()
        };
        one_pod.at_unix_ms = 5;
        let mut one_pod_in_use = InUse::default();
        one_pod_in_use.insert(SHARED, &r0, holder("ml", "a", "main"));
        one_pod_in_use.insert(SHARED, &r2, holder("ml", "a", "sidecar"));
        // The checkpoint names a container pod-resources does not list yet: GPU level only.
        let mut unlisted = two.clone();
        let mut unlisted_in_use = InUse::default();
        unlisted_in_use.insert(SHARED, &r1, holder("ml", "b", "main"));
        unlisted.gpus[0].processes.truncate(1);
        // The checkpoint's device of that pod is on GPU1, the process on GPU0: GPU level.
        let mut elsewhere = two.clone();
        elsewhere.checkpoint = Some(vec![entry(
            "uid-a",
            "main",
            SHARED,
            &[&crate::plan::replica_id(GPU1, 0)],
        )]);
        elsewhere.gpus[0].processes.truncate(1);
        // One container with replicas on two GPUs (its checkpoint entry lists GPU1's first):
        // the process on GPU0 counts for its GPU0 entry.
        let g1r0 = crate::plan::replica_id(GPU1, 0);
        let mut two_gpus = two.clone();
        two_gpus.checkpoint = Some(vec![entry("uid-a", "main", SHARED, &[&g1r0, &r0])]);
        two_gpus.gpus[0].processes.truncate(1);
        let mut two_gpus_in_use = InUse::default();
        two_gpus_in_use.insert(SHARED, &g1r0, holder("ml", "a", "main"));
        two_gpus_in_use.insert(SHARED, &r0, holder("ml", "a", "main"));
        // DRA: the same two pods holding ::0 and ::1 through claims (pod-resources'
        // `dynamic_resources`, by published device name), no kubelet checkpoint at all (it
        // lists no claim); each claim records the pod it is reserved for.
        let name = crate::plan::dra_names::device_name;
        let mut dra_in_use = InUse::default();
        dra_in_use.insert_claimed(&name(&r0), holder("ml", "a", "main"));
        dra_in_use.insert_claimed(&name(&r1), holder("ml", "b", "main"));
        let mut dra = two.clone();
        dra.checkpoint = None;
        dra.checkpoint_error = Some("missing".into());
        dra.claims = Some(vec![
            claim("ml", &[("a", "uid-a")], &[&r0]),
            claim("ml", &[("b", "uid-b")], &[&r1]),
        ]);
        // The claim of b does not name its pod (prepared by a slicelet that did not record
        // pods, or b shares a claim prepared for another pod): b's use is unknown.
        let mut dra_unknown = dra.clone();
        dra_unknown.claims = Some(vec![
            claim("ml", &[("a", "uid-a")], &[&r0]),
            claim("ml", &[], &[&r1]),
        ]);
        // One claim on ::0 shared by pods a and b, both containers named `main`: b's process
        // goes to b's container, not to the first `main` holding the device.
        let mut shared_in_use = InUse::default();
        shared_in_use.insert_claimed(&name(&r0), holder("ml", "a", "main"));
        shared_in_use.insert_claimed(&name(&r0), holder("ml", "b", "main"));
        let mut shared = dra.clone();
        shared.gpus[0].processes.remove(0);
        shared.claims = Some(vec![claim("ml", &[("a", "uid-a"), ("b", "uid-b")], &[&r0])]);
        // A claim of another namespace naming a pod of the same name: not b's.
        let mut other_ns = dra.clone();
        other_ns.claims = Some(vec![
            claim("ml", &[("a", "uid-a")], &[&r0]),
            claim("web", &[("b", "uid-b")], &[&r1]),
        ]);
        let cases = vec![
            Case {
                name: "DRA: each pod's process to its container, through its claim",
                samples: dra,
                in_use: dra_in_use.clone(),
                gpu0: vec![
                    ("ml/a/main", GPU0, 30, 1024, 1),
                    ("ml/b/main", GPU0, 10, 512, 1),
                ],
                unattributed: 0,
                dra: true,
            },
            Case {
                name: "DRA: a claim that does not name the pod: unattributed, and withheld",
                samples: dra_unknown,
                in_use: dra_in_use.clone(),
                gpu0: vec![("ml/a/main", GPU0, 30, 1024, 1)],
                unattributed: 1,
                dra: true,
            },
            Case {
                name: "DRA: one claim shared by two pods",
                samples: shared,
                in_use: shared_in_use,
                gpu0: vec![
                    ("ml/a/main", GPU0, 0, 0, 0),
                    ("ml/b/main", GPU0, 10, 512, 1),
                ],
                unattributed: 0,
                dra: true,
            },
            Case {
                name: "DRA: a claim of another namespace names the pod",
                samples: other_ns,
                in_use: dra_in_use,
                gpu0: vec![("ml/a/main", GPU0, 30, 1024, 1)],
                unattributed: 1,
                dra: true,
            },
            Case {
                name: "one container on two GPUs",
                samples: two_gpus,
                in_use: two_gpus_in_use,
                gpu0: vec![("ml/a/main", GPU0, 30, 1024, 1)],
                unattributed: 0,
                dra: false,
            },
            Case {
                name: "two pods on two replicas",
                samples: two.clone(),
                in_use: two_in_use.clone(),
                gpu0: vec![
                    ("ml/a/main", GPU0, 30, 1024, 1),
                    ("ml/b/main", GPU0, 10, 512, 1),
                ],
                unattributed: 0,
                dra: false,
            },
            Case {
                name: "a process of no pod and one of an unknown pod",
                samples: stranger,
                in_use: two_in_use.clone(),
                gpu0: vec![
                    ("ml/a/main", GPU0, 30, 1024, 1),
                    ("ml/b/main", GPU0, 10, 512, 1),
                ],
                unattributed: 2,
                dra: false,
            },
            Case {
                name: "no checkpoint: unknown, so no container entries (not idle ones)",
                samples: no_checkpoint,
                in_use: two_in_use.clone(),
                gpu0: vec![],
                unattributed: 2,
                dra: false,
            },
            Case {
                name: "one pod, two containers: first in name order",
                samples: one_pod,
                in_use: one_pod_in_use,
                gpu0: vec![
                    ("ml/a/main", GPU0, 20, 256, 1),
                    ("ml/a/sidecar", GPU0, 0, 0, 0),
                ],
                unattributed: 0,
                dra: false,
            },
            Case {
                name: "pod-resources does not list the container",
                samples: unlisted,
                in_use: unlisted_in_use,
                gpu0: vec![("ml/b/main", GPU0, 0, 0, 0)],
                unattributed: 1,
                dra: false,
            },
            Case {
                name: "the pod's device is on another GPU",
                samples: elsewhere,
                in_use: two_in_use.clone(),
                gpu0: vec![("ml/a/main", GPU0, 0, 0, 0), ("ml/b/main", GPU0, 0, 0, 0)],
                unattributed: 1,
                dra: false,
            },
            Case {
                name: "nothing held, nothing sampled on it",
                samples: Samples {
                    gpus: vec![gpu(GPU0, 0, vec![])],
                    ..Samples::default()
                },
                in_use: InUse::default(),
                gpu0: vec![],
                unattributed: 0,
                dra: false,
            },
        ];
        let mut dra_plan = plan.clone();
        Arc::make_mut(dra_plan.resources.get_mut(SHARED).unwrap()).dra = true;
        for c in cases {
            let plan = if c.dra { &dra_plan } else { &plan };
            // As the report does: claims recorded under the device IDs they name.
            let in_use = crate::plan::dra_names::with_claims(plan, &c.in_use);
            let f = attribute(&c.samples, plan, &in_use);
            let want: Vec<_> = c
                .gpu0
                .iter()
                .map(|(h, u, sm, mib, n)| (h.to_string(), u.to_string(), *sm, *mib, *n))
                .collect();
            assert_eq!(summary(&f, 0), want, "{}", c.name);
            assert_eq!(
                f.gpus[0].unattributed_processes, c.unattributed,
                "{}",
                c.name
            );
            assert_eq!(
                f.unattributed_processes(),
                u64::from(c.unattributed),
                "{}: the node's total",
                c.name
            );
            assert_eq!(f.at_unix_ms, c.samples.at_unix_ms, "{}", c.name);
            assert_eq!(f.gpus[0].model, "NVIDIA H100 80GB HBM3", "{}", c.name);
            assert_eq!(f.gpus[0].utilization_percent, Some(40), "{}", c.name);
        }
        // Device IDs and resource come from pod-resources.
        let f = attribute(&two, &plan, &two_in_use);
        assert_eq!(f.gpus[0].containers[0].device_ids, vec![r0.clone()]);
        assert_eq!(f.gpus[0].containers[1].device_ids, vec![r1.clone()]);
        assert_eq!(f.gpus[0].containers[0].resource, SHARED);
        assert!(f.gpus[1].containers.is_empty());
    }

    #[test]
    fn mig_devices_go_to_their_holder() {
        let plan = plan();
        let mut in_use = InUse::default();
        in_use.insert(MIG, MIG0, holder("ml", "m", "main"));
        let mut g1 = gpu(GPU1, 1, vec![]);
        g1.mig = vec![MigSample {
            uuid: MIG0.into(),
            utilization_percent: Some(55),
            memory_used_bytes: Some(2048 * MIB),
            memory_total_bytes: Some(10 * 1024 * MIB),
        }];
        let samples = Samples {
            at_unix_ms: 7,
            gpus: vec![gpu(GPU0, 0, vec![]), g1.clone()],
            // No checkpoint: MIG needs none.
            checkpoint: None,
            checkpoint_error: Some("missing".into()),
            claims: None,
            limits_not_cleared: 0,
        };
        let f = attribute(&samples, &plan, &in_use);
        assert!(f.gpus[0].containers.is_empty());
        assert_eq!(
            summary(&f, 1),
            vec![("ml/m/main".to_string(), MIG0.to_string(), 55, 2048, 0)]
        );
        assert_eq!(f.gpus[1].mig[0].profile.as_deref(), Some("1g.10gb"));
        assert_eq!(f.gpus[1].containers[0].resource, MIG);
        // Without GPM: memory only.
        let mut no_gpm = samples.clone();
        no_gpm.gpus[1].mig[0].utilization_percent = None;
        let f = attribute(&no_gpm, &plan, &in_use);
        assert_eq!(
            summary(&f, 1),
            vec![("ml/m/main".to_string(), MIG0.to_string(), 0, 2048, 0)]
        );
        // Not held: the MIG device's figures stay at GPU level.
        let f = attribute(&samples, &plan, &InUse::default());
        assert!(f.gpus[1].containers.is_empty());
        assert_eq!(f.gpus[1].mig[0].memory_used_bytes, Some(2048 * MIB));
    }

    /// `nvidia.com/gpu-shared` with `memory: {hard: 10 GiB, soft: 4 GiB}` per replica.
    pub(crate) fn limited_plan(unenforced: bool) -> Plan {
        let mut plan = plan();
        let res = Arc::make_mut(plan.resources.get_mut(SHARED).unwrap());
        let mut planned = crate::plan::memory::PlannedMemory {
            entry: "sharing.timeSlicing.resources[0]".into(),
            limits: crate::policy::MemoryLimits {
                hard_mib: 10 * 1024,
                soft_mib: Some(4 * 1024),
                enforce: crate::policy::Enforce::BestEffort,
            },
            unenforced: Default::default(),
        };
        if unenforced {
            planned.unenforced.insert(GPU0.into(), "cgroup v1".into());
        }
        res.memory = Some(planned);
        plan
    }

    fn limits(f: &Figures) -> Vec<Option<ContainerLimit>> {
        f.gpus[0]
            .containers
            .iter()
            .map(|c| c.memory_limit)
            .collect()
    }

    #[test]
    fn memory_limits_are_the_policys_and_enforced_only_when_read_back() {
        let (mut samples, mut in_use) = two_pods();
        let r2 = crate::plan::replica_id(GPU0, 2);
        // Pod a holds two replicas: twice the limit.
        in_use.insert(SHARED, &r2, holder("ml", "a", "main"));
        if let Some(cp) = samples.checkpoint.as_mut() {
            cp[0].device_ids.push(r2.clone());
        }
        let g = &mut samples.gpus[0];
        g.memory_limits_supported = Some(true);
        g.processes[0].cgroup = Some("/kubepods/pod-a/ctr".into());
        g.processes[1].cgroup = Some("/kubepods/pod-b/ctr".into());
        let reading = |hard_gib: u64, soft_gib: u64| LimitReading {
            hard: hard_gib * 1024 * MIB,
            soft: soft_gib * 1024 * MIB,
            used: 0,
        };
        g.cgroup_limits = vec![
            CgroupLimits {
                cgroup: "/kubepods/pod-a/ctr".into(),
                reading: reading(20, 8),
            },
            // b's cgroup reads back another hard limit (a stale or foreign one).
            CgroupLimits {
                cgroup: "/kubepods/pod-b/ctr".into(),
                reading: reading(5, 4),
            },
        ];
        let held = |hard_gib: u64, soft_gib: u64, enforced| {
            Some(ContainerLimit {
                hard_bytes: hard_gib * 1024 * MIB,
                soft_bytes: Some(soft_gib * 1024 * MIB),
                enforced,
            })
        };
        let plan = limited_plan(false);
        let f = attribute(&samples, &plan, &in_use);
        assert_eq!(
            limits(&f),
            [held(20, 8, Some(true)), held(10, 4, Some(false))]
        );
        // No limit read back for b's cgroup at all: not enforced.
        let mut none = samples.clone();
        none.gpus[0].cgroup_limits.truncate(1);
        let f = attribute(&none, &plan, &in_use);
        assert_eq!(limits(&f)[1], held(10, 4, Some(false)));
        // No process on the GPU: not known yet.
        let mut idle = samples.clone();
        idle.gpus[0].processes.clear();
        let f = attribute(&idle, &plan, &in_use);
        assert_eq!(limits(&f), [held(20, 8, None), held(10, 4, None)]);
        // A process whose cgroup is unknown: not known either.
        let mut unknown = samples.clone();
        unknown.gpus[0].processes[1].cgroup = None;
        let f = attribute(&unknown, &plan, &in_use);
        assert_eq!(limits(&f)[1], held(10, 4, None));
        // The GPU takes no limits, or the plan serves it unenforced: not enforced, whatever
        // reads back.
        let mut unsupported = samples.clone();
        unsupported.gpus[0].memory_limits_supported = Some(false);
        let f = attribute(&unsupported, &plan, &in_use);
        assert_eq!(
            limits(&f),
            [held(20, 8, Some(false)), held(10, 4, Some(false))]
        );
        let f = attribute(&samples, &limited_plan(true), &in_use);
        assert_eq!(
            limits(&f),
            [held(20, 8, Some(false)), held(10, 4, Some(false))]
        );
        // Without memory limits in the plan: none.
        let f = attribute(&samples, &super::tests::plan(), &in_use);
        assert_eq!(limits(&f), [None, None]);
        assert_eq!(f.gpus[0].memory_limits_supported, Some(true));
    }
}

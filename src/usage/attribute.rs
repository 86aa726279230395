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
//! its processes on the GPU: the sum of its limits there over all its enforced resources (one
//! hook each, which add up: NVML keeps one limit per GPU and cgroup). Not assumed: with no process on the GPU yet, its cgroup is not
//! known and `enforced` is `None`; where the plan serves the unit unenforced, or the GPU takes
//! no limits, it is `Some(false)`.
//!
//! MIG: NVIDIA gives no per-process utilisation on MIG devices, so a MIG device's own figures
//! (memory, and GPM SM use where the GPU supports it) go to the container holding that MIG
//! device per [`InUse`] (no checkpoint needed). Under MIG with replicas (one MIG device shared
//! by several containers) the figures go to the first holder in (namespace, pod, container)
//! order.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::in_use::{Holder, InUse};
use crate::inventory::sample::GpuSample;
use crate::plan::{Plan, VirtualDevice};
use crate::usage::{ClaimEntry, Samples};

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

/// The limits the policy gives a container holding `ids` of `resource` (its entry's sizes
/// times the replicas), before NVML is asked: `(hard bytes, soft bytes, whether the plan
/// enforces them on the unit)`; `None` when the resource has no memory limits.
fn own_limit(plan: &Plan, resource: &str, ids: &[String]) -> Option<(u64, Option<u64>, bool)> {
    let res = plan.resources.get(resource)?;
    let m = res.memory.as_ref()?;
    let device = res.device(ids.first()?)?;
    let n = ids.len() as u64;
    let hard_bytes = m.limits.hard_mib.saturating_mul(MIB).saturating_mul(n);
    let soft_bytes = m
        .limits
        .soft_mib
        .map(|s| s.saturating_mul(MIB).saturating_mul(n));
    Some((hard_bytes, soft_bytes, m.enforced(device)))
}

/// The limit of a container with `own` limits ([`own_limit`]) on `gpu` (a [`GpuSample`]), its
/// processes' cgroups being `cgroups`. NVML keeps one limit per GPU and cgroup, which the
/// hooks of all of the container's enforced resources on the unit add up to: `total` (hard,
/// soft bytes) is what must read back.
fn limit_of(
    own: (u64, Option<u64>, bool),
    total: (u64, u64),
    gpu: &GpuSample,
    cgroups: Option<&BTreeSet<String>>,
) -> ContainerLimit {
    let (hard_bytes, soft_bytes, plan_enforced) = own;
    let enforced = if !plan_enforced || gpu.memory_limits_supported == Some(false) {
        Some(false)
    } else {
        cgroups.filter(|c| !c.is_empty()).map(|cgroups| {
            cgroups.iter().all(|cgroup| {
                gpu.cgroup_limits.iter().any(|l| {
                    l.cgroup == *cgroup && l.reading.hard == total.0 && l.reading.soft == total.1
                })
            })
        })
    };
    ContainerLimit {
        hard_bytes,
        soft_bytes,
        enforced,
    }
}

/// Pod UID → its entries.
type PodEntries<'a> = HashMap<&'a str, Vec<PodEntry<'a>>>;

/// The container's key inside one GPU: (unit UUID, resource, holder).
type Key = (String, String, Holder);

/// Attributes one sample; see the module doc for the rules.
pub fn attribute(samples: &Samples, plan: &Plan, in_use: &InUse) -> Figures {
    let held = held_by_gpu(plan, in_use);
    let (by_pod, dra_known) = entries_by_pod(samples, in_use);
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
            let mut containers = known_containers(held.get(g.uuid.as_str()), &known);
            let charged = charge_processes(g, &mut containers, &by_pod, plan, in_use);
            let mig = mig_figures(g, &mut containers, plan);
            set_memory_limits(g, &mut containers, &charged.cgroups, plan);
            GpuFigures {
                uuid: g.uuid.clone(),
                index: g.index,
                model: g.model.clone(),
                utilization_percent: g.utilization_percent,
                memory_used_bytes: g.memory_used_bytes,
                memory_total_bytes: g.memory_total_bytes,
                unattributed_processes: charged.unattributed,
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

/// The containers holding devices, by physical GPU UUID: each container's key and its device
/// IDs of the key's resource, from what is held.
fn held_by_gpu<'p>(plan: &'p Plan, in_use: &InUse) -> HashMap<&'p str, BTreeMap<Key, Vec<String>>> {
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
    held
}

/// Pod UID → its entries (the device-plugin checkpoint's and the DRA claims'), in
/// container-name order (the tie rule); and the (resource, holder) pairs the claims cover.
fn entries_by_pod<'a>(
    samples: &'a Samples,
    in_use: &'a InUse,
) -> (PodEntries<'a>, HashSet<(&'a str, &'a Holder)>) {
    let mut by_pod = PodEntries::new();
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
    (by_pod, dra_known)
}

/// The figures of a GPU's held containers whose use can be known (`known`), all zero yet.
fn known_containers(
    held: Option<&BTreeMap<Key, Vec<String>>>,
    known: &impl Fn(&Key) -> bool,
) -> BTreeMap<Key, ContainerFigures> {
    held.into_iter()
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
        .collect()
}

/// What charging a GPU's processes to its containers found.
struct Charged {
    /// Processes no container is known for.
    unattributed: u32,
    /// Each container's processes' cgroups on the GPU (for its memory limit).
    cgroups: HashMap<Key, BTreeSet<String>>,
}

/// Charges each of `g`'s processes to the container its pod's entries name on the GPU
/// (adding its SM use and memory), or counts it unattributed.
fn charge_processes(
    g: &GpuSample,
    containers: &mut BTreeMap<Key, ContainerFigures>,
    by_pod: &HashMap<&str, Vec<PodEntry<'_>>>,
    plan: &Plan,
    in_use: &InUse,
) -> Charged {
    let mut unattributed = 0u32;
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
    Charged {
        unattributed,
        cgroups,
    }
}

/// The figures of `g`'s MIG devices; each one's use goes to the first holder of a device on
/// it (BTreeMap order).
fn mig_figures(
    g: &GpuSample,
    containers: &mut BTreeMap<Key, ContainerFigures>,
    plan: &Plan,
) -> Vec<MigFigures> {
    let mut mig = Vec::with_capacity(g.mig.len());
    for m in &g.mig {
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
    mig
}

/// Sets each container's memory limit on `g`: its own limits, and whether NVML reads back the
/// sum over the enforced ones of its (unit, holder) for every cgroup of its processes (a
/// process counts for the first of its container's resources on the GPU; its cgroup is the
/// container's for every one of them).
fn set_memory_limits(
    g: &GpuSample,
    containers: &mut BTreeMap<Key, ContainerFigures>,
    cgroups: &HashMap<Key, BTreeSet<String>>,
    plan: &Plan,
) {
    let own: HashMap<Key, (u64, Option<u64>, bool)> = containers
        .iter()
        .filter_map(|(key, c)| Some((key.clone(), own_limit(plan, &c.resource, &c.device_ids)?)))
        .collect();
    let mut totals: HashMap<(&str, &Holder), (u64, u64)> = HashMap::new();
    for ((unit, _, holder), (hard, soft, enforced)) in &own {
        if *enforced {
            let t = totals.entry((unit.as_str(), holder)).or_default();
            t.0 = t.0.saturating_add(*hard);
            t.1 = t.1.saturating_add(soft.unwrap_or(0));
        }
    }
    let mut cgroups_of: HashMap<(&str, &Holder), BTreeSet<String>> = HashMap::new();
    for ((unit, _, holder), set) in cgroups {
        cgroups_of
            .entry((unit.as_str(), holder))
            .or_default()
            .extend(set.iter().cloned());
    }
    for (key, c) in containers.iter_mut() {
        let at = (key.0.as_str(), &key.2);
        c.memory_limit = own.get(key).map(|&o| {
            let total = totals.get(&at).copied().unwrap_or((o.0, o.1.unwrap_or(0)));
            limit_of(o, total, g, cgroups_of.get(&at))
        });
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
#[path = "attribute_tests.rs"]
pub(crate) mod tests;

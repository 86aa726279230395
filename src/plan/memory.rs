//! GPU memory limits per replica (a sharing entry's `memory`): whether the node can enforce
//! them on each physical unit, and whether the units' limits fit their memory.
//!
//! The driver partitions device memory per container cgroup (NVML
//! `nvmlDeviceSetMemoryLimits_v1`, driver R615 and later, cgroup v2). It takes no MIG handle
//! (a MIG device is isolated by the hardware already), and slicelet sets the limit from a CDI
//! hook the container runtime runs, so a resource whose containers are not given slicelet's
//! CDI device cannot have it either: a device-plugin resource without a `cdi-*`
//! `deviceListStrategy`, a DRA one without `cdi-cri`. Under `enforce: required`
//! (the default) a unit that cannot enforce its limit is a plan error naming the reason;
//! under `best-effort` it is served and marked unenforced.
//!
//! Pure: no I/O.

use std::collections::BTreeMap;

use super::{PlanError, ResourcePlan, VirtualDevice};
use crate::inventory::Inventory;
use crate::policy::{Enforce, MemoryLimits};

/// A resource's memory limits as planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMemory {
    /// The sharing entry they come from (`sharing.timeSlicing.resources[1]`), for messages.
    pub entry: String,
    /// Per replica, MiB.
    pub limits: MemoryLimits,
    /// Physical unit (GPU or MIG UUID) → why its limit cannot be enforced (under `best-effort`;
    /// under `required` such a unit is a plan error, or in the daemon its devices are held
    /// Unhealthy: [`build_serving`]).
    pub unenforced: BTreeMap<String, String>,
    /// What the resource's memory devices carry in their CDI names beside the unit, size and
    /// count ([`name_tag`] of its name), when another memory-limited resource of one of its
    /// units has the same `hard` size (their devices would share names: a spec with a name
    /// twice is refused whole, and the kubelet gives a container each name once); `None`
    /// otherwise, so names stay as they were.
    pub name_tag: Option<String>,
}

impl PlannedMemory {
    /// Whether device `d`'s limit is enforced (its unit has no reason against it).
    pub fn enforced(&self, d: &VirtualDevice) -> bool {
        !self.unenforced.contains_key(&d.gpu_uuid)
    }
}

/// Why the node cannot enforce a memory limit on `d`'s unit, or `None` when it can: a MIG
/// device; a driver older than R615 or of unknown version; cgroup v1; a container not given the
/// limit's CDI hook (`cdi` false). `cdi`: whether it is, which depends on how the resource is
/// served (`dra`): by the device plugin, under a `cdi-*` list strategy (Allocate returns
/// slicelet's memory device beside the GPU's); through DRA, for a replica or whole unit under
/// `cdi-cri` only (`NodePrepareResources` returns Allocate's CDI names as extra CDI device IDs,
/// and drops annotations), for a consumable-capacity share always (the claim's own spec carries
/// the hook).
pub fn unenforceable(
    inventory: &Inventory,
    d: &VirtualDevice,
    dra: bool,
    cdi: bool,
) -> Option<String> {
    if d.mig.is_some() {
        return Some(
            "it is a MIG device (isolated by the hardware already; NVML sets no memory limits on MIG handles)"
                .to_string(),
        );
    }
    if let Some(reason) = inventory.memory_limits_unsupported() {
        return Some(reason);
    }
    if !cdi {
        return Some(if dra {
            "flags.plugin.deviceListStrategy has no cdi-cri (the limit is set by a CDI hook, which a DRA claim of a replica gets only as a cdi-cri CDI device)"
        } else {
            "flags.plugin.deviceListStrategy has no cdi-annotations or cdi-cri (the limit is set by a CDI hook)"
        }
        .to_string());
    }
    None
}

/// The resource name `name` as a part of a CDI device name: `/` and anything else a CDI name
/// does not take written `_` (`nvidia.com/gpu-10gb` → `nvidia.com_gpu-10gb`).
pub fn name_tag(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Gives a [`PlannedMemory::name_tag`] to every memory-limited resource that has the same
/// `hard` size as another on one of its units.
fn tag_shared_sizes(resources: &mut BTreeMap<String, std::sync::Arc<ResourcePlan>>) {
    let mut sizes: BTreeMap<(&str, u64), std::collections::BTreeSet<&str>> = BTreeMap::new();
    for (name, res) in resources.iter() {
        let Some(m) = &res.memory else { continue };
        for d in &res.devices {
            sizes
                .entry((d.gpu_uuid.as_str(), m.limits.hard_mib))
                .or_default()
                .insert(name.as_str());
        }
    }
    let shared: std::collections::BTreeSet<String> = sizes
        .into_values()
        .filter(|names| names.len() > 1)
        .flatten()
        .map(str::to_string)
        .collect();
    for name in shared {
        if let Some(res) = resources.get_mut(&name) {
            if let Some(m) = &mut std::sync::Arc::make_mut(res).memory {
                m.name_tag = Some(name_tag(&name));
            }
        }
    }
}

/// Marks each resource of `limits` (advertised name → entry path and limits) with its
/// memory limits and the units that cannot enforce them; then checks that on every physical
/// unit the hard limits of all its devices sum to at most the unit's memory.
///
/// # Errors
/// [`PlanError::MemoryNotEnforceable`] for a unit under `enforce: required` that cannot
/// enforce its limit; [`PlanError::MemoryOversubscribed`] for a unit whose limits exceed its
/// memory.
pub(super) fn apply(
    resources: &mut BTreeMap<String, std::sync::Arc<ResourcePlan>>,
    limits: &BTreeMap<String, (String, MemoryLimits)>,
    inventory: &Inventory,
    warnings: &mut Vec<String>,
) -> Result<(), PlanError> {
    for (name, (entry, l)) in limits {
        let Some(res) = resources.get_mut(name) else {
            continue;
        };
        let res = std::sync::Arc::make_mut(res);
        let mut planned = PlannedMemory {
            entry: entry.clone(),
            limits: *l,
            unenforced: BTreeMap::new(),
            name_tag: None,
        };
        // Through DRA, annotations are dropped: only cdi-cri's CDI names reach the runtime.
        let strategies = res.delivery.strategies;
        let cdi = if res.dra {
            strategies.cdi_cri
        } else {
            strategies.uses_cdi()
        };
        for d in &res.devices {
            if planned.unenforced.contains_key(&d.gpu_uuid) {
                continue;
            }
            let Some(reason) = unenforceable(inventory, d, res.dra, cdi) else {
                continue;
            };
            let unit = unit_label(d);
            if l.enforce == Enforce::Required {
                return Err(PlanError::MemoryNotEnforceable {
                    entry: entry.clone(),
                    unit,
                    uuid: d.gpu_uuid.clone(),
                    reason,
                });
            }
            warnings.push(format!(
                "{entry}.memory: not enforced on {unit} ({}): {reason}; served under enforce: best-effort",
                d.gpu_uuid
            ));
            planned.unenforced.insert(d.gpu_uuid.clone(), reason);
        }
        res.memory = Some(planned);
    }
    tag_shared_sizes(resources);
    check_fits(resources, inventory)
}

/// [`super::build_with`] as the daemon serves it: a memory limit under `enforce: required` that
/// a unit cannot enforce fails closed on that unit only. The entry is planned as under
/// `best-effort`, then every device of a unit that cannot enforce it is advertised Unhealthy
/// and its [`PlannedMemory::limits`] say `required` again (so [`required_refusal`] gives the
/// reason: `/readyz` and the log name it); the other GPUs and resources are served. `slicelet
/// plan` and `validate` keep refusing such a policy ([`super::build`]).
///
/// # Errors
/// As [`super::build_with`], but for [`PlanError::MemoryNotEnforceable`].
pub fn build_serving(
    policy: &crate::policy::Policy,
    inventory: &Inventory,
    mps_applied: &BTreeMap<String, super::MpsLimits>,
) -> Result<super::Built, PlanError> {
    let mut relaxed = std::borrow::Cow::Borrowed(policy);
    let mut required: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut built = loop {
        match super::build_with(&relaxed, inventory, mps_applied) {
            Err(PlanError::MemoryNotEnforceable { entry, .. }) if !required.contains(&entry) => {
                let p = relaxed.to_mut();
                let found = p
                    .time_slicing
                    .resources
                    .iter_mut()
                    .chain(p.mps.resources.iter_mut().map(|m| &mut m.shared))
                    .find(|e| e.path == entry)
                    .and_then(|e| e.memory.as_mut());
                let Some(m) = found else {
                    return super::build_with(policy, inventory, mps_applied);
                };
                m.enforce = Enforce::BestEffort;
                required.insert(entry);
            }
            other => break other?,
        }
    };
    if required.is_empty() {
        return Ok(built);
    }
    built.warnings.retain(|w| {
        !required
            .iter()
            .any(|e| w.starts_with(&format!("{e}.memory: not enforced on ")))
    });
    for res in built.plan.resources.values_mut() {
        let Some(m) = res.memory.as_ref().filter(|m| required.contains(&m.entry)) else {
            continue;
        };
        let unenforced = m.unenforced.clone();
        let entry = m.entry.clone();
        let r = std::sync::Arc::make_mut(res);
        if let Some(m) = r.memory.as_mut() {
            m.limits.enforce = Enforce::Required;
        }
        let mut said = std::collections::BTreeSet::new();
        for d in &mut r.devices {
            let Some(reason) = unenforced.get(&d.gpu_uuid) else {
                continue;
            };
            d.health = crate::device_health::Health::Unhealthy;
            if said.insert(d.gpu_uuid.clone()) {
                built.warnings.push(format!(
                    "{entry}.memory: cannot be enforced on {} ({}): {reason}; its replicas of {} are advertised Unhealthy (enforce: required); the rest of the policy is served",
                    unit_label(d),
                    d.gpu_uuid,
                    r.name
                ));
            }
        }
    }
    Ok(built)
}

/// Why device `d` of a resource with memory limits `m` is held Unhealthy by
/// [`build_serving`]: its unit cannot enforce a `required` limit.
pub fn required_refusal(m: &PlannedMemory, d: &VirtualDevice) -> Option<String> {
    if m.limits.enforce != Enforce::Required {
        return None;
    }
    m.unenforced.get(&d.gpu_uuid).map(|reason| {
        format!(
            "{}.memory cannot be enforced (enforce: required): {reason}",
            m.entry
        )
    })
}

/// `3` for GPU 3, `MIG device 0:2` for MIG device 2 of GPU 0.
fn unit_label(d: &VirtualDevice) -> String {
    match &d.mig {
        None => format!("GPU {}", d.gpu_index),
        Some(m) => format!("MIG device {}:{}", d.gpu_index, m.index),
    }
}

/// A physical unit as (GPU index, MIG index, UUID), ordered as the plan lists them.
type UnitKey<'a> = (u32, Option<u32>, &'a str);

/// Every unit's hard limits (each device of a resource with memory limits counts its
/// resource's `hard`) at most the unit's memory.
fn check_fits(
    resources: &BTreeMap<String, std::sync::Arc<ResourcePlan>>,
    inventory: &Inventory,
) -> Result<(), PlanError> {
    // (GPU index, MIG index, unit UUID) → (total MiB, each entry's "n × MiB").
    let mut units: BTreeMap<UnitKey<'_>, (u64, Vec<String>)> = BTreeMap::new();
    for res in resources.values() {
        let Some(m) = &res.memory else { continue };
        let mut per_unit: BTreeMap<UnitKey<'_>, u64> = BTreeMap::new();
        for d in &res.devices {
            let (g, mig) = d.unit_order();
            *per_unit.entry((g, mig, d.gpu_uuid.as_str())).or_default() += 1;
        }
        for (key, n) in per_unit {
            let e = units.entry(key).or_default();
            e.0 += n * m.limits.hard_mib;
            e.1.push(format!(
                "{}: {n} × {} MiB",
                m.entry,
                thousands(m.limits.hard_mib)
            ));
        }
    }
    for ((gpu, mig, uuid), (total, parts)) in units {
        let Some(g) = inventory.by_index(gpu) else {
            continue;
        };
        let (memory, unit) = match mig {
            None => (g.memory_mib, format!("GPU {gpu}")),
            Some(i) => (
                g.mig_devices
                    .iter()
                    .find(|m| m.uuid == uuid)
                    .map_or(0, |m| m.memory_mib),
                format!("MIG device {gpu}:{i}"),
            ),
        };
        if total > memory {
            return Err(PlanError::MemoryOversubscribed {
                unit,
                uuid: uuid.to_string(),
                total: thousands(total),
                memory: thousands(memory),
                parts: parts.join("; "),
            });
        }
    }
    Ok(())
}

/// `81559` as `81,559`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests;

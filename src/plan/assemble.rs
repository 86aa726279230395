//! Building a plan: the policy's entries claim the node's units, and the claimed and the
//! unclaimed units become resources ([`build`], [`build_with`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::select::{claim_units, node_resources, Unit, Units};
use super::size::encoded_size;
use super::{
    dynamic_mig, memory, mps, replica_id, Built, Drain, MigInfo, MpsLimits, MpsWanted, Plan,
    PlanError, ResourcePlan, Strategy, VirtualDevice, MAX_LIST_BYTES,
};
use crate::inventory::{mig, Inventory};
use crate::policy::{DeviceSelector, Policy, ResourceName, SharedResource};

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
    // Units time-slicing entries with memory limits share.
    let mut by_size: HashSet<&str> = HashSet::new();
    let mut shared: Vec<(&SharedResource, Vec<Unit<'_>>)> = Vec::new();
    for entry in &policy.time_slicing.resources {
        if let Some(picked) = claim_units(
            entry,
            policy.mig_strategy,
            &base,
            &mut claimed,
            Some(&mut by_size),
            &mut warnings,
        )? {
            shared.push((entry, picked));
        }
    }
    let mps_claimed = mps::claim(policy, &base, &mut claimed, &mut warnings)?;

    // What each node resource still advertises whole.
    let whole = whole_units(&base, &claimed);
    let mut resources = BTreeMap::new();
    insert_time_sliced(policy, &shared, &whole, &mut resources)?;
    mps::insert_resources(policy, mps_claimed, &whole, &mut resources)?;
    insert_whole(policy, &whole, &mut resources)?;
    if policy.pass_device_specs {
        warn_unknown_caps(&resources, &mut warnings);
    }
    // Link scores between the physical units, once per plan (GetPreferredAllocation reads
    // them and never asks NVML).
    finish_resources(policy, inventory, &mut resources);
    let limits = memory_limits(policy);
    memory::apply(&mut resources, &limits, inventory, &mut warnings)?;
    check_dra_overlap(&resources)?;
    let dynamic_mig = match &policy.dynamic_mig {
        Some(selector) => dynamic_mig::resolve(selector, inventory, &mut warnings)?,
        None => Vec::new(),
    };
    dynamic_mig::check(&dynamic_mig, resources.values().map(|r| &**r))?;
    dynamic_mig::drop_empty_warnings(&dynamic_mig, inventory, &mut warnings);
    Ok(Built {
        plan: Plan {
            resources,
            drain: Drain::default(),
            dynamic_mig,
        },
        warnings,
        mps_wanted: MpsWanted::default(),
        fallbacks: Vec::new(),
    })
}

/// What each node resource of `base` still advertises whole: its units no entry `claimed`.
fn whole_units<'a>(
    base: &'a Units<'a>,
    claimed: &HashMap<&str, &str>,
) -> BTreeMap<&'a str, Vec<Unit<'a>>> {
    base.iter()
        .map(|(name, units)| {
            let rest: Vec<Unit<'_>> = units
                .iter()
                .filter(|u| !claimed.contains_key(u.uuid()))
                .copied()
                .collect();
            (name.as_str(), rest)
        })
        .filter(|(_, rest)| !rest.is_empty())
        .collect()
}

/// The time-slicing resources of the `shared` entries (each with the units it claimed), into
/// `resources`; a name some units still advertise whole is [`PlanError::NameCollision`].
fn insert_time_sliced(
    policy: &Policy,
    shared: &[(&SharedResource, Vec<Unit<'_>>)],
    whole: &BTreeMap<&str, Vec<Unit<'_>>>,
    resources: &mut BTreeMap<String, Arc<ResourcePlan>>,
) -> Result<(), PlanError> {
    let fail_gt_one = policy.time_slicing.fail_requests_greater_than_one;
    // Units shared by more than one entry number their replicas across the entries
    // (`<uuid>::0`, `::1` for the first entry's, `::2` for the next one's), so every device
    // ID on the node stays unique; `next` is the first free replica number per unit.
    let mut entries_of: HashMap<&str, u32> = HashMap::new();
    for (_, units) in shared {
        for u in units {
            *entries_of.entry(u.uuid()).or_default() += 1;
        }
    }
    let mut next: HashMap<&str, u32> = HashMap::new();
    for (entry, units) in shared {
        if let Some(rest) = whole.get(entry.advertised.as_str()) {
            return Err(PlanError::NameCollision {
                name: entry.advertised.to_string(),
                entry: entry.path.clone(),
                unclaimed: rest.iter().map(Unit::label).collect::<Vec<_>>().join(","),
            });
        }
        let mut res = resource(
            &entry.advertised,
            Strategy::TimeSlicing,
            entry.replicas,
            fail_gt_one,
            policy.pass_device_specs,
            units,
        )?;
        renumber_shared(&mut res, units, &entries_of, &mut next);
        resources.insert(entry.advertised.to_string(), Arc::new(res));
    }
    Ok(())
}

/// The resources of the units left whole, one device per unit, into `resources`.
fn insert_whole(
    policy: &Policy,
    whole: &BTreeMap<&str, Vec<Unit<'_>>>,
    resources: &mut BTreeMap<String, Arc<ResourcePlan>>,
) -> Result<(), PlanError> {
    for (name, units) in whole {
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
    Ok(())
}

/// With passDeviceSpecs, a warning naming the MIG devices whose nvidia-caps minors are unknown.
fn warn_unknown_caps(resources: &BTreeMap<String, Arc<ResourcePlan>>, warnings: &mut Vec<String>) {
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

/// Sets what every freshly built resource takes from `policy` and `inventory`: link scores,
/// the shared-allocation policy, delivery, DRA and capacity shares.
fn finish_resources(
    policy: &Policy,
    inventory: &Inventory,
    resources: &mut BTreeMap<String, Arc<ResourcePlan>>,
) {
    for res in resources.values_mut() {
        let fresh = Arc::get_mut(res).expect("built above, not shared yet");
        fresh.set_links_from(inventory);
        fresh.shared_allocation = policy.shared_allocation;
        fresh.delivery.clone_from(&policy.delivery);
        fresh.dra = policy.dra.contains(&fresh.name);
        fresh.capacity = policy
            .time_slicing
            .resources
            .iter()
            .chain(policy.mps.resources.iter().map(|m| &m.shared))
            .find(|e| e.advertised == fresh.name)
            .and_then(|e| e.capacity_shares)
            .map(|shares| crate::plan::CapacityPlan { shares });
    }
}

/// Advertised name → (entry path, memory limits) of every entry with memory limits.
fn memory_limits(policy: &Policy) -> BTreeMap<String, (String, crate::policy::MemoryLimits)> {
    policy
        .time_slicing
        .resources
        .iter()
        .chain(policy.mps.resources.iter().map(|m| &m.shared))
        .filter_map(|e| Some((e.advertised.to_string(), (e.path.clone(), e.memory?))))
        .collect()
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

/// Gives the devices of `res` on units several entries share (`entries_of` > 1) the replica
/// numbers `next` says are free on their unit, in `<uuid>::<n>` form even for one replica, and
/// moves `next` past them. Other units keep what [`resource`] gave them.
fn renumber_shared<'a>(
    res: &mut ResourcePlan,
    units: &[Unit<'a>],
    entries_of: &HashMap<&str, u32>,
    next: &mut HashMap<&'a str, u32>,
) {
    if !units.iter().any(|u| entries_of.get(u.uuid()) > Some(&1)) {
        return;
    }
    let mut devices = std::mem::take(&mut res.devices);
    for d in &mut devices {
        let Some(u) = units.iter().find(|u| u.uuid() == d.gpu_uuid) else {
            continue;
        };
        if entries_of.get(u.uuid()) <= Some(&1) {
            continue;
        }
        let n = next.entry(u.uuid()).or_default();
        d.id = replica_id(u.uuid(), *n);
        d.replica = Some(*n);
        *n += 1;
    }
    let rebuilt = ResourcePlan::new(
        res.name.clone(),
        res.strategy,
        res.replicas,
        res.fail_requests_greater_than_one,
        res.pass_device_specs,
        devices,
    );
    *res = rebuilt;
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

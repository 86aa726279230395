//! Dynamic MIG in the plan: which GPUs `dra.dynamicMig.devices` partitions on demand on this
//! node ([`resolve`]), and the per-GPU checks only the node can make: MIG mode on (slicelet
//! never enables it), no sharing and no whole-GPU advertisement of such a GPU ([`check`]).

use std::collections::BTreeMap;

use super::select::empty_mig_warning;
use super::{DynamicMigGpu, PlanError, ResourcePlan, Strategy};
use crate::inventory::{Gpu, Inventory};
use crate::policy::{DeviceRef, DeviceSelector};

/// The field path every message of this module names.
const PATH: &str = "dra.dynamicMig.devices";

/// The GPUs of `inventory` that `selector` (the policy's `dra.dynamicMig.devices`) names,
/// index ascending, each with the placements its existing (static) MIG devices occupy.
/// A GPU with MIG mode off is an error ([`PlanError::DynamicMigModeOff`]); a name this node
/// lacks, a GPU whose geometry the source cannot tell, or one with a MIG device whose
/// placement is unknown is left out with a warning.
///
/// # Errors
/// [`PlanError::DynamicMigModeOff`] for the first such GPU.
pub(super) fn resolve(
    selector: &DeviceSelector,
    inventory: &Inventory,
    warnings: &mut Vec<String>,
) -> Result<Vec<DynamicMigGpu>, PlanError> {
    let mut out = Vec::new();
    for gpu in named_gpus(selector, inventory, warnings) {
        if !gpu.mig_enabled {
            return Err(PlanError::DynamicMigModeOff {
                gpu: gpu.index,
                uuid: gpu.uuid.clone(),
            });
        }
        if gpu.mig_geometry.is_none() {
            warnings.push(format!(
                "{PATH}: GPU {} ({}): its MIG profiles and placements are unknown here; nothing is published for it on demand",
                gpu.index, gpu.uuid
            ));
            continue;
        }
        let mut occupied = Vec::new();
        for m in &gpu.mig_devices {
            let Some(p) = m.placement else {
                warnings.push(format!(
                    "{PATH}: GPU {} ({}): where MIG device {}:{} ({}) sits is unknown; nothing is published for the GPU on demand",
                    gpu.index, gpu.uuid, gpu.index, m.index, m.uuid
                ));
                occupied.clear();
                break;
            };
            occupied.push(p);
        }
        if occupied.len() != gpu.mig_devices.len() {
            continue;
        }
        out.push(DynamicMigGpu {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            occupied,
            health: gpu.health,
        });
    }
    Ok(out)
}

/// The GPUs `selector` names on this node, index ascending, each once; a warning for each
/// name this node lacks.
/// The indices of the GPUs of `inventory` that `selector` names (warnings dropped: the plan
/// gives them).
pub(super) fn named_indices(
    selector: &DeviceSelector,
    inventory: &Inventory,
) -> std::collections::BTreeSet<u32> {
    named_gpus(selector, inventory, &mut Vec::new())
        .into_iter()
        .map(|g| g.index)
        .collect()
}

fn named_gpus<'a>(
    selector: &DeviceSelector,
    inventory: &'a Inventory,
    warnings: &mut Vec<String>,
) -> Vec<&'a Gpu> {
    let mut by_index: BTreeMap<u32, &'a Gpu> = BTreeMap::new();
    match selector {
        DeviceSelector::All => by_index.extend(inventory.gpus.iter().map(|g| (g.index, g))),
        DeviceSelector::Count(n) => {
            if *n as usize > inventory.gpus.len() {
                warnings.push(format!(
                    "{PATH}: asks for the first {n} GPUs, this node has {}",
                    inventory.gpus.len()
                ));
            }
            by_index.extend(
                inventory
                    .gpus
                    .iter()
                    .take(*n as usize)
                    .map(|g| (g.index, g)),
            );
        }
        DeviceSelector::List(refs) => {
            for r in refs {
                let found = match r {
                    DeviceRef::Index(i) => inventory.by_index(*i),
                    DeviceRef::Uuid(u) => inventory.by_uuid(u),
                    // The policy refuses MIG forms; an unmatchable UUID already has its warning.
                    _ => continue,
                };
                match found {
                    Some(g) => {
                        by_index.insert(g.index, g);
                    }
                    None => warnings.push(format!("{PATH}: this node has no GPU {r}")),
                }
            }
        }
    }
    by_index.into_values().collect()
}

/// Drops the "MIG enabled and no MIG devices; nothing is advertised" warning of each dynamic
/// MIG GPU: its free space is what DRA publishes, so the warning would be wrong.
pub(super) fn drop_empty_warnings(
    dynamic: &[DynamicMigGpu],
    inventory: &Inventory,
    warnings: &mut Vec<String>,
) {
    let wrong: Vec<String> = dynamic
        .iter()
        .filter_map(|g| inventory.by_index(g.index))
        .map(empty_mig_warning)
        .collect();
    warnings.retain(|w| !wrong.contains(w));
}

/// Refuses a resource that shares a dynamic MIG GPU or one of its MIG devices (time-slicing,
/// MPS, consumable capacity) or advertises it whole (`migStrategy: none`).
///
/// # Errors
/// [`PlanError::DynamicMigShared`] or [`PlanError::DynamicMigWhole`] for the first such device.
pub(super) fn check<'a>(
    dynamic: &[DynamicMigGpu],
    resources: impl IntoIterator<Item = &'a ResourcePlan>,
) -> Result<(), PlanError> {
    for res in resources {
        let how = match (res.strategy, res.capacity.is_some()) {
            (_, true) => Some("consumable capacity"),
            (Strategy::TimeSlicing, _) => Some("time-slicing"),
            (Strategy::Mps, _) => Some("MPS"),
            (Strategy::None, false) => None,
        };
        for d in &res.devices {
            let Some(g) = dynamic.iter().find(|g| g.index == d.gpu_index) else {
                continue;
            };
            if let Some(how) = how {
                return Err(PlanError::DynamicMigShared {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    resource: res.name.to_string(),
                    how: how.to_string(),
                });
            }
            if d.mig.is_none() {
                return Err(PlanError::DynamicMigWhole {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    resource: res.name.to_string(),
                });
            }
        }
    }
    Ok(())
}

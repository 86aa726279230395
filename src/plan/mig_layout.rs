//! What a mig-parted layout ([`crate::policy::MigPartedFile`], chosen by the node label
//! `nvidia.com/mig.config`) asks of this node's GPUs: per GPU, the MIG instances to destroy and
//! the ones to create at which placements. Pure: the daemon applies the changes through the
//! hardware actor, one GPU at a time and only once nothing holds it.
//!
//! Rules (mig-parted's, where it has one):
//! - A layout's entries apply in order; for each GPU the last entry whose `devices` name its
//!   index and whose `device-filter` (when set) names its PCI device ID decides. A GPU no
//!   entry names is left alone, and so is every GPU in `skip` (the GPUs DRA partitions on
//!   demand: their instances belong to claims).
//! - slicelet never toggles MIG mode (a mode change needs a GPU reset, which would take the
//!   GPU from under whatever runs): an entry whose `mig-enabled` differs from the GPU's
//!   current mode fails the layout with the `nvidia-smi` step.
//! - A GPU whose instances already make up the entry's `mig-devices` (same profiles, same
//!   counts, wherever they sit) is unchanged. Otherwise every instance is destroyed and the
//!   wanted ones are created, at placements found by trying the largest profiles first, each
//!   at its lowest free start, backtracking when the rest do not fit (NVIDIA's placement
//!   rules: the GPU's geometry, [`crate::inventory::MigGeometry`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::inventory::{Gpu, Inventory, MigDevice, MigGeometry, MigPlacement, MigProfileInfo};
use crate::policy::{MigConfigEntry, MigPartedFile};

/// What one GPU needs to match the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuChange {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// The instances to destroy first: (GPU instance id, compute instance id, MIG UUID).
    pub destroy: Vec<(u32, u32, String)>,
    /// Then the instances to create: (profile as the geometry names it, placement).
    pub create: Vec<(String, MigPlacement)>,
}

/// Why a layout cannot be applied on this node; the node label's state is `failed` with
/// this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The label names a layout the file does not have.
    #[error(
        "nvidia.com/mig.config: the MIG layouts file has no layout `{name}`; it has {known:?}"
    )]
    NoSuchLayout {
        /// The label's value.
        name: String,
        /// The file's layout names.
        known: Vec<String>,
    },
    /// An entry wants the other MIG mode.
    #[error("mig-configs.{layout}[{entry}]: GPU {gpu} ({uuid}) has MIG mode {}, the layout wants it {}; slicelet never toggles MIG mode (it needs a GPU reset): run `nvidia-smi -i {gpu} -mig {}` (then reset the GPU or reboot the node, as nvidia-smi says), or change the layout", on_off(*current), on_off(!*current), u8::from(!*current))]
    ModeChange {
        /// The layout.
        layout: String,
        /// The entry's position in it.
        entry: usize,
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// Its current MIG mode.
        current: bool,
    },
    /// An entry has a `device-filter` and the GPU's PCI device ID is unknown.
    #[error("mig-configs.{layout}[{entry}].device-filter: the PCI device ID of GPU {gpu} ({uuid}) is unknown here")]
    UnknownPciId {
        /// The layout.
        layout: String,
        /// The entry's position in it.
        entry: usize,
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
    },
    /// The GPU's MIG profiles and placements are unknown.
    #[error(
        "mig-configs.{layout}[{entry}]: the MIG profiles of GPU {gpu} ({uuid}) are unknown here"
    )]
    UnknownGeometry {
        /// The layout.
        layout: String,
        /// The entry's position in it.
        entry: usize,
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
    },
    /// A profile the GPU does not offer (or a compute-instance profile, `1c.3g.40gb`).
    #[error("mig-configs.{layout}[{entry}].mig-devices.{profile}: GPU {gpu} ({uuid}) offers no such GPU instance profile; it offers {known:?}")]
    UnknownProfile {
        /// The layout.
        layout: String,
        /// The entry's position in it.
        entry: usize,
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// The profile asked for.
        profile: String,
        /// The profiles the GPU offers.
        known: Vec<String>,
    },
    /// The instances do not fit the GPU together.
    #[error("mig-configs.{layout}[{entry}].mig-devices: {wanted} do not fit GPU {gpu} ({uuid}) together (NVIDIA's placement rules)")]
    DoesNotFit {
        /// The layout.
        layout: String,
        /// The entry's position in it.
        entry: usize,
        /// GPU index.
        gpu: u32,
        /// GPU UUID.
        uuid: String,
        /// The wanted instances, `3g.40gb ×2, 1g.10gb ×1`.
        wanted: String,
    },
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// The GPUs a layout leaves alone on `inventory`: those `policy`'s `dra.dynamicMig.devices`
/// names (whatever their mode, geometry or instances: their instances belong to claims), by
/// NVML index.
pub fn dynamic_gpus(policy: &crate::policy::Policy, inventory: &Inventory) -> BTreeSet<u32> {
    match &policy.dynamic_mig {
        Some(selector) => super::dynamic_mig::named_indices(selector, inventory),
        None => BTreeSet::new(),
    }
}

/// The changes layout `name` of `file` asks of `inventory`'s GPUs, GPU index ascending,
/// leaving out GPUs in `skip` and GPUs already as the layout wants them (empty: nothing to
/// do).
///
/// # Errors
/// [`LayoutError`] for the first GPU the layout cannot be applied to; nothing is applied
/// then (a layout is applied whole or not at all).
pub fn layout(
    file: &MigPartedFile,
    name: &str,
    inventory: &Inventory,
    skip: &BTreeSet<u32>,
) -> Result<Vec<GpuChange>, LayoutError> {
    let entries = file
        .mig_configs
        .get(name)
        .ok_or_else(|| LayoutError::NoSuchLayout {
            name: name.to_string(),
            known: file.mig_configs.keys().cloned().collect(),
        })?;
    let mut out = Vec::new();
    for gpu in inventory.gpus.iter().filter(|g| !skip.contains(&g.index)) {
        let at = |entry| At {
            layout: name,
            entry,
            gpu,
        };
        let Some((i, entry)) = deciding_entry(entries, gpu, name)? else {
            continue;
        };
        if entry.mig_enabled != gpu.mig_enabled {
            return Err(LayoutError::ModeChange {
                layout: name.to_string(),
                entry: i,
                gpu: gpu.index,
                uuid: gpu.uuid.clone(),
                current: gpu.mig_enabled,
            });
        }
        if !entry.mig_enabled {
            continue;
        }
        if let Some(change) = gpu_change(at(i), &entry.mig_devices)? {
            out.push(change);
        }
    }
    Ok(out)
}

/// Where a message points: the layout, the entry and the GPU.
#[derive(Clone, Copy)]
struct At<'a> {
    layout: &'a str,
    entry: usize,
    gpu: &'a Gpu,
}

/// The last entry of `entries` that names `gpu` (its position and itself); `None` when none
/// does.
///
/// # Errors
/// [`LayoutError::UnknownPciId`] when an entry naming the GPU's index has a `device-filter`
/// and the GPU's PCI device ID is unknown.
fn deciding_entry<'e>(
    entries: &'e [MigConfigEntry],
    gpu: &Gpu,
    layout: &str,
) -> Result<Option<(usize, &'e MigConfigEntry)>, LayoutError> {
    let mut found = None;
    for (i, e) in entries.iter().enumerate() {
        if !e.devices.contains(gpu.index) {
            continue;
        }
        if let Some(filter) = &e.device_filter {
            let id = gpu.pci_device_id.ok_or_else(|| LayoutError::UnknownPciId {
                layout: layout.to_string(),
                entry: i,
                gpu: gpu.index,
                uuid: gpu.uuid.clone(),
            })?;
            if !filter.matches(id) {
                continue;
            }
        }
        found = Some((i, e));
    }
    Ok(found)
}

/// What `at.gpu` needs to hold exactly `wanted` (profile → count); `None` when its instances
/// already do.
///
/// # Errors
/// [`LayoutError::UnknownGeometry`], [`LayoutError::UnknownProfile`] or
/// [`LayoutError::DoesNotFit`].
fn gpu_change(
    at: At<'_>,
    wanted: &BTreeMap<String, u32>,
) -> Result<Option<GpuChange>, LayoutError> {
    let gpu = at.gpu;
    let geometry = gpu
        .mig_geometry
        .as_ref()
        .ok_or_else(|| LayoutError::UnknownGeometry {
            layout: at.layout.to_string(),
            entry: at.entry,
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
        })?;
    let mut instances = wanted_instances(at, geometry, wanted)?;
    if holds_exactly(&gpu.mig_devices, wanted) {
        return Ok(None);
    }
    largest_first(&mut instances);
    let mut chosen = Vec::new();
    let counts_fit = wanted.iter().all(|(p, &n)| {
        geometry
            .profile(p)
            .is_some_and(|info| n <= info.instance_count)
    });
    if !counts_fit || !place(&instances, geometry.compute_slices, 0, &mut chosen) {
        return Err(LayoutError::DoesNotFit {
            layout: at.layout.to_string(),
            entry: at.entry,
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
            wanted: wanted
                .iter()
                .map(|(p, n)| format!("{p} ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(Some(GpuChange {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        destroy: gpu
            .mig_devices
            .iter()
            .map(|m| (m.gi_id, m.ci_id, m.uuid.clone()))
            .collect(),
        create: instances
            .iter()
            .zip(chosen)
            .map(|(info, p)| (info.profile.clone(), p))
            .collect(),
    }))
}

/// One [`MigProfileInfo`] per wanted instance (a profile wanted twice appears twice).
///
/// # Errors
/// [`LayoutError::UnknownProfile`] for a profile `geometry` does not offer.
fn wanted_instances<'g>(
    at: At<'_>,
    geometry: &'g MigGeometry,
    wanted: &BTreeMap<String, u32>,
) -> Result<Vec<&'g MigProfileInfo>, LayoutError> {
    let mut instances = Vec::new();
    for (profile, &n) in wanted {
        let info = geometry
            .profile(profile)
            .ok_or_else(|| LayoutError::UnknownProfile {
                layout: at.layout.to_string(),
                entry: at.entry,
                gpu: at.gpu.index,
                uuid: at.gpu.uuid.clone(),
                profile: profile.clone(),
                known: geometry
                    .profiles
                    .iter()
                    .map(|p| p.profile.clone())
                    .collect(),
            })?;
        instances.extend(std::iter::repeat_n(info, n as usize));
    }
    Ok(instances)
}

/// Orders `instances` largest placement first (then most slices, then by name): the large
/// ones have the fewest placements, so placing them first backtracks least.
fn largest_first(instances: &mut [&MigProfileInfo]) {
    instances.sort_by(|a, b| {
        (
            b.placements.first().map_or(0, |p| p.size),
            b.gpu_slices,
            &b.profile,
        )
            .cmp(&(
                a.placements.first().map_or(0, |p| p.size),
                a.gpu_slices,
                &a.profile,
            ))
    });
}

/// Whether `devices` are exactly `wanted`: the same profiles, the same counts.
fn holds_exactly(devices: &[MigDevice], wanted: &BTreeMap<String, u32>) -> bool {
    let mut have: BTreeMap<&str, u32> = BTreeMap::new();
    for d in devices {
        *have.entry(d.profile.as_str()).or_default() += 1;
    }
    have.len() == wanted.len()
        && wanted
            .iter()
            .all(|(p, n)| have.get(p.as_str()).copied() == Some(*n))
}

/// Chooses a placement for each of `instances` (in order), pairwise disjoint and their
/// compute slices within `compute_slices` with `used` already taken; each at its lowest start
/// that lets the rest fit. False (and `chosen` as it was) when there is none.
fn place(
    instances: &[&MigProfileInfo],
    compute_slices: u32,
    used: u32,
    chosen: &mut Vec<MigPlacement>,
) -> bool {
    let Some((first, rest)) = instances.split_first() else {
        return true;
    };
    if used + first.gpu_slices > compute_slices {
        return false;
    }
    for p in &first.placements {
        if chosen.iter().any(|c| c.overlaps(p)) {
            continue;
        }
        chosen.push(*p);
        if place(rest, compute_slices, used + first.gpu_slices, chosen) {
            return true;
        }
        chosen.pop();
    }
    false
}

#[cfg(test)]
mod tests;

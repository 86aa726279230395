//! `slicelet mig create` and `slicelet mig destroy`: one MIG device made or removed by hand,
//! through the GPU source the daemon uses (NVML, or `--simulate`'s node file) and its
//! [`GpuSource::create_mig`] / [`GpuSource::destroy_mig`], the calls the hardware thread makes
//! for dynamic MIG. For checks on a real GPU (`scripts/gpu-check.sh`) and for operators. An
//! instance made this way is a static MIG device to slicelet: a running daemon advertises it
//! (under `migStrategy: mixed`) and never destroys it.

use std::fmt;

use crate::inventory::{Gpu, GpuSource, Inventory, InventoryError, MigPlacement};
use crate::settings::Settings;

/// `slicelet mig` failed; the message is what the user sees.
#[derive(Debug, thiserror::Error)]
pub enum MigCommandError {
    /// The GPU source could not be opened or discovered, or the driver refused the create or
    /// destroy (its reason in the message).
    #[error(transparent)]
    Node(#[from] InventoryError),
    /// `--gpu` names no GPU of this node.
    #[error("this node has no GPU {0} (give an index or a GPU-… UUID)")]
    NoGpu(String),
    /// The GPU's MIG mode is off (slicelet never turns it on).
    #[error("GPU {index} ({uuid}) has MIG mode off; slicelet never enables it: `nvidia-smi -i {index} -mig 1`, then reset the GPU as nvidia-smi says")]
    MigOff {
        /// NVML index.
        index: u32,
        /// `GPU-…` UUID.
        uuid: String,
    },
    /// The profile is not one of the GPU's (or its placements are unknown here).
    #[error("GPU {index} has no MIG profile {profile}; its profiles: {known}")]
    UnknownProfile {
        /// NVML index.
        index: u32,
        /// The profile asked for.
        profile: String,
        /// The GPU's profiles, comma-separated (empty when the source cannot tell).
        known: String,
    },
    /// `--placement` is not a placement of the profile.
    #[error("{profile} has no placement starting at memory slice {start}; its placements start at {known}")]
    NoPlacement {
        /// The profile.
        profile: String,
        /// The start asked for.
        start: u32,
        /// The profile's placement starts, comma-separated.
        known: String,
    },
    /// Every placement of the profile overlaps an existing MIG device.
    #[error("GPU {index}: every placement of {profile} overlaps an existing MIG device")]
    NoFreePlacement {
        /// NVML index.
        index: u32,
        /// The profile.
        profile: String,
    },
    /// `--uuid` names no MIG device of this node.
    #[error("this node has no MIG device {0}")]
    NoMigDevice(String),
}

/// A MIG device `slicelet mig create` made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// Its `MIG-…` UUID.
    pub uuid: String,
    /// The parent GPU's NVML index.
    pub gpu: u32,
    /// Its profile (`1g.10gb`).
    pub profile: String,
    /// Where it sits (memory slices).
    pub placement: MigPlacement,
    /// GPU-instance id.
    pub gi_id: u32,
    /// Compute-instance id.
    pub ci_id: u32,
}

impl fmt::Display for Created {
    /// One line, the UUID first: `MIG-… gpu=0 profile=1g.10gb placement=0+1 gi=1 ci=0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} gpu={} profile={} placement={}+{} gi={} ci={}",
            self.uuid,
            self.gpu,
            self.profile,
            self.placement.start,
            self.placement.size,
            self.gi_id,
            self.ci_id
        )
    }
}

/// The GPU `name` (an NVML index or a `GPU-…` UUID) names in `inv`.
fn gpu_named<'a>(inv: &'a Inventory, name: &str) -> Option<&'a Gpu> {
    match name.parse::<u32>() {
        Ok(i) => inv.by_index(i),
        Err(_) => inv.by_uuid(name),
    }
}

/// The placement to create `profile` at on `gpu`: `start` when it is one of the profile's,
/// else the first that overlaps none of the GPU's MIG devices.
///
/// # Errors
/// [`MigCommandError::UnknownProfile`], [`MigCommandError::NoPlacement`] or
/// [`MigCommandError::NoFreePlacement`].
fn placement_for(
    gpu: &Gpu,
    profile: &str,
    start: Option<u32>,
) -> Result<MigPlacement, MigCommandError> {
    let profiles = gpu
        .mig_geometry
        .as_ref()
        .map(|g| &g.profiles[..])
        .unwrap_or_default();
    let Some(info) = profiles.iter().find(|p| p.profile == profile) else {
        return Err(MigCommandError::UnknownProfile {
            index: gpu.index,
            profile: profile.to_string(),
            known: join(profiles.iter().map(|p| p.profile.clone())),
        });
    };
    if let Some(start) = start {
        return info
            .placements
            .iter()
            .find(|p| p.start == start)
            .copied()
            .ok_or_else(|| MigCommandError::NoPlacement {
                profile: profile.to_string(),
                start,
                known: join(info.placements.iter().map(|p| p.start.to_string())),
            });
    }
    let taken: Vec<MigPlacement> = gpu.mig_devices.iter().filter_map(|m| m.placement).collect();
    info.placements
        .iter()
        .find(|p| !taken.iter().any(|t| t.overlaps(p)))
        .copied()
        .ok_or_else(|| MigCommandError::NoFreePlacement {
            index: gpu.index,
            profile: profile.to_string(),
        })
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// `slicelet mig create`: creates a GPU instance of `profile` on GPU `gpu` (index or UUID) at
/// the placement starting at memory slice `start` (default: the first free one) with one
/// compute instance spanning it, through the source `settings` names
/// ([`crate::daemon::open_source`]). Never enables MIG mode.
///
/// # Errors
/// [`MigCommandError`]: the source, the GPU, its MIG mode, the profile or placement, or the
/// driver's refusal.
pub fn create(
    settings: &Settings,
    gpu: &str,
    profile: &str,
    start: Option<u32>,
) -> Result<Created, MigCommandError> {
    let mut source = crate::daemon::open_source(settings)?;
    let inv = source.discover()?;
    let g = gpu_named(&inv, gpu).ok_or_else(|| MigCommandError::NoGpu(gpu.to_string()))?;
    if !g.mig_enabled {
        return Err(MigCommandError::MigOff {
            index: g.index,
            uuid: g.uuid.clone(),
        });
    }
    let placement = placement_for(g, profile, start)?;
    let made = source.create_mig(&g.uuid, profile, placement.start)?;
    Ok(Created {
        uuid: made.device.uuid,
        gpu: g.index,
        profile: profile.to_string(),
        placement: made.device.placement.unwrap_or(placement),
        gi_id: made.device.gi_id,
        ci_id: made.device.ci_id,
    })
}

/// `slicelet mig destroy`: destroys MIG device `uuid` (its compute instance, then its GPU
/// instance) through the source `settings` names; the line to print.
///
/// # Errors
/// [`MigCommandError::NoMigDevice`] when no GPU has it, or the source's or driver's error
/// (`In use by another client` while a process runs on it).
pub fn destroy(settings: &Settings, uuid: &str) -> Result<String, MigCommandError> {
    let mut source = crate::daemon::open_source(settings)?;
    destroy_on(&mut *source, uuid)
}

/// [`destroy`] on an open source.
///
/// # Errors
/// As [`destroy`].
fn destroy_on(source: &mut dyn GpuSource, uuid: &str) -> Result<String, MigCommandError> {
    let inv = source.discover()?;
    let (gpu, m) = inv
        .gpus
        .iter()
        .find_map(|g| {
            g.mig_devices
                .iter()
                .find(|m| m.uuid == uuid)
                .map(|m| (g, m))
        })
        .ok_or_else(|| MigCommandError::NoMigDevice(uuid.to_string()))?;
    source.destroy_mig(&gpu.uuid, m.gi_id, m.ci_id)?;
    Ok(format!(
        "destroyed {uuid} gpu={} gi={} ci={}",
        gpu.index, m.gi_id, m.ci_id
    ))
}

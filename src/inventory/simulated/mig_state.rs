//! The MIG instances created and destroyed on a simulated node since its file was written, kept
//! in a state file beside it (`<node file>.mig-state.json`) as a GPU keeps its instances when
//! slicelet restarts. Read at every discovery and sample, written (atomically, by
//! [`crate::files::write_atomic`]) at every creation and destruction; deleting it resets the
//! GPUs to the node file's layout.
//!
//! Creation follows NVIDIA's driver (`nvmlDeviceCreateGpuInstanceWithPlacement`): the
//! placements and instance counts of the model's table, the driver's error strings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::placement::gpu_instance_profile;
use super::{derive_uuid, read};
use crate::inventory::{Gpu, InventoryError, MigDevice, MigGeometry, MigPlacement, MigProfileInfo};

/// The state file of the node file `node`: `<node file>.mig-state.json`.
pub(super) fn state_path(node: &Path) -> PathBuf {
    let mut name = node.as_os_str().to_owned();
    name.push(".mig-state.json");
    PathBuf::from(name)
}

/// What the state file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MigState {
    /// GPU instances created so far on the node (the seed of the next one's UUID, so a
    /// re-created instance gets a new UUID, as with a driver).
    #[serde(default)]
    creations: u64,
    /// Per GPU UUID, what changed on it.
    #[serde(default)]
    gpus: BTreeMap<String, GpuState>,
    /// Where it is read from and written to.
    #[serde(skip)]
    file: PathBuf,
}

/// What changed on one GPU.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuState {
    /// The UUIDs of the node file's MIG devices destroyed since.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    destroyed: Vec<String>,
    /// The instances created since, in creation order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    created: Vec<Created>,
}

/// One created GPU instance (with its one compute instance, id 0).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Created {
    uuid: String,
    /// Its MIG device index (NVML slot).
    index: u32,
    gi_id: u32,
    /// The GPU instance profile, as the model's table names it.
    profile: String,
    /// The first memory slice of its placement.
    placement_start: u32,
}

/// Why the simulated driver refused: NVML's error, and what was wrong.
#[derive(Debug)]
pub(super) struct Refusal {
    /// NVML's error string (`nvmlErrorString`): what a driver would answer.
    pub(super) nvml: &'static str,
    /// What was wrong, for the state file's errors.
    detail: String,
}

impl Refusal {
    fn new(nvml: &'static str, detail: impl Into<String>) -> Self {
        Refusal {
            nvml,
            detail: detail.into(),
        }
    }
    fn invalid(detail: impl Into<String>) -> Self {
        Refusal::new("Invalid Argument", detail)
    }
    fn insufficient(detail: impl Into<String>) -> Self {
        Refusal::new("Insufficient Resources", detail)
    }
    /// A GPU not in MIG mode, or without a profile table.
    pub(super) fn not_supported(detail: impl Into<String>) -> Self {
        Refusal::new("Not Supported", detail)
    }
    /// A GPU or compute instance that does not exist.
    pub(super) fn not_found(detail: impl Into<String>) -> Self {
        Refusal::new("Not Found", detail)
    }
}

/// The profile row of `profile` with a placement at `start`, when an instance of it fits among
/// `devices` on a GPU of `geometry`, as the driver checks it.
fn check_fits<'g>(
    geometry: &'g MigGeometry,
    devices: &[MigDevice],
    profile: &str,
    start: u32,
) -> Result<(&'g MigProfileInfo, MigPlacement), Refusal> {
    let row = geometry
        .profile(profile)
        .ok_or_else(|| Refusal::invalid(format!("no profile {profile}")))?;
    let placement = *row
        .placements
        .iter()
        .find(|p| p.start == start)
        .ok_or_else(|| Refusal::invalid(format!("{start} is not a placement of {profile}")))?;
    let same = devices
        .iter()
        .filter(|d| gpu_instance_profile(&d.profile) == profile)
        .count();
    if same >= row.instance_count as usize {
        return Err(Refusal::insufficient(format!(
            "{same} instances of {profile} exist, the most the GPU has"
        )));
    }
    if let Some(d) = devices
        .iter()
        .find(|d| d.placement.is_some_and(|q| q.overlaps(&placement)))
    {
        return Err(Refusal::insufficient(format!(
            "the placement at {start} overlaps MIG device {} ({})",
            d.index, d.profile
        )));
    }
    Ok((row, placement))
}

impl Created {
    /// The MIG device it is, with its profile row's memory and slices.
    fn device(&self, row: &MigProfileInfo, placement: MigPlacement) -> MigDevice {
        MigDevice {
            index: self.index,
            uuid: self.uuid.clone(),
            profile: self.profile.clone(),
            memory_mib: row.memory_mib,
            gi_id: self.gi_id,
            ci_id: 0,
            gpu_slices: row.gpu_slices,
            compute_slices: row.gpu_slices,
            caps: None,
            placement: Some(placement),
            health: crate::device_health::Health::Healthy,
        }
    }
}

/// The smallest number from `first` that none of `used` is.
fn first_free(first: u32, used: impl Iterator<Item = u32> + Clone) -> u32 {
    (first..)
        .find(|n| !used.clone().any(|u| u == *n))
        .expect("fewer than u32::MAX devices")
}

impl MigState {
    /// The state of the node file `node`: empty when its state file does not exist.
    ///
    /// # Errors
    /// [`InventoryError::SimulatedRead`] when the state file cannot be read (bounded as the node
    /// file is), [`InventoryError::SimulatedInvalid`] naming it when it is not a state file.
    pub(super) fn read(node: &Path) -> Result<MigState, InventoryError> {
        let file = state_path(node);
        let text = match read(&file) {
            Ok(t) => t,
            Err(InventoryError::SimulatedRead { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(MigState {
                    file,
                    ..MigState::default()
                })
            }
            Err(e) => return Err(e),
        };
        let mut state: MigState =
            serde_json::from_str(&text).map_err(|e| InventoryError::SimulatedInvalid {
                path: file.clone(),
                path_in_file: ".".to_string(),
                location: Some((e.line(), e.column())),
                message: e.to_string(),
            })?;
        state.file = file;
        Ok(state)
    }

    /// Writes the state file atomically.
    ///
    /// # Errors
    /// The I/O error of [`crate::files::write_atomic`].
    pub(super) fn write(&self) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("plain data serialises");
        bytes.push(b'\n');
        crate::files::write_atomic(&self.file, &bytes)
    }

    /// The state file's path.
    pub(super) fn file(&self) -> &Path {
        &self.file
    }

    /// Applies what changed on GPU `uuid` to the node file's `devices` (each with its memory
    /// in use, MiB; created ones use none): the destroyed ones leave, the created ones join.
    /// Sorted by index.
    ///
    /// # Errors
    /// [`InventoryError::SimulatedInvalid`] naming the state file's entry when a created
    /// instance no longer fits the node file (its GPU left MIG mode or changed model, or the
    /// file's devices now overlap it).
    pub(super) fn apply(
        &self,
        uuid: &str,
        geometry: Option<&MigGeometry>,
        devices: &mut Vec<(MigDevice, u64)>,
    ) -> Result<(), InventoryError> {
        let Some(gpu) = self.gpus.get(uuid) else {
            return Ok(());
        };
        devices.retain(|(d, _)| !gpu.destroyed.contains(&d.uuid));
        for (k, c) in gpu.created.iter().enumerate() {
            let stale = |detail: String| InventoryError::SimulatedInvalid {
                path: self.file.clone(),
                path_in_file: format!("gpus.{uuid}.created[{k}]"),
                location: None,
                message: format!(
                    "{detail}; delete this file to reset the GPUs to the node file's layout"
                ),
            };
            let geometry = geometry.ok_or_else(|| {
                stale("the GPU is not a MIG-enabled GPU with a profile table".to_string())
            })?;
            let present: Vec<MigDevice> = devices.iter().map(|(d, _)| d.clone()).collect();
            let (row, placement) = check_fits(geometry, &present, &c.profile, c.placement_start)
                .map_err(|r| stale(r.detail))?;
            if let Some(d) = present
                .iter()
                .find(|d| d.index == c.index || d.gi_id == c.gi_id)
            {
                return Err(stale(format!(
                    "MIG device {} (GPU instance {}) exists already",
                    d.index, d.gi_id
                )));
            }
            devices.push((c.device(row, placement), 0));
        }
        devices.sort_by_key(|(d, _)| d.index);
        Ok(())
    }

    /// Creates an instance of `profile` at the placement starting at `start` on `gpu` (as
    /// discovered, this state applied): the next free MIG device index and GPU-instance id,
    /// compute-instance id 0, a UUID from the GPU's, the GPU-instance id and the creation count.
    ///
    /// # Errors
    /// A [`Refusal`] as the driver's: `Not Supported` (MIG off, no table), `Invalid Argument`
    /// (unknown profile or placement), `Insufficient Resources` (an overlap, or the profile's
    /// instance count reached).
    pub(super) fn create(
        &mut self,
        gpu: &Gpu,
        profile: &str,
        start: u32,
    ) -> Result<MigDevice, Refusal> {
        let geometry = match (&gpu.mig_geometry, gpu.mig_enabled) {
            (Some(g), true) => g,
            _ => return Err(Refusal::not_supported("MIG mode is off")),
        };
        let (row, placement) = check_fits(geometry, &gpu.mig_devices, profile, start)?;
        let index = first_free(0, gpu.mig_devices.iter().map(|d| d.index));
        let gi_id = first_free(1, gpu.mig_devices.iter().map(|d| d.gi_id));
        self.creations += 1;
        let created = Created {
            uuid: derive_uuid(
                "MIG",
                &format!("{}/gi{gi_id}/creation{}", gpu.uuid, self.creations),
            ),
            index,
            gi_id,
            profile: profile.to_string(),
            placement_start: start,
        };
        let device = created.device(row, placement);
        let entry = self.gpus.entry(gpu.uuid.clone()).or_default();
        entry.created.push(created);
        Ok(device)
    }

    /// Destroys compute instance `ci_id` of GPU instance `gi_id` on `gpu` (as discovered, this
    /// state applied), a created one or one the node file lists. Returns whether anything was
    /// destroyed: a GPU instance that does not exist is not an error.
    ///
    /// # Errors
    /// `Not Supported` for a GPU not in MIG mode, `Not Found` for a compute instance the GPU
    /// instance does not have.
    pub(super) fn destroy(&mut self, gpu: &Gpu, gi_id: u32, ci_id: u32) -> Result<bool, Refusal> {
        if !gpu.mig_enabled {
            return Err(Refusal::not_supported("MIG mode is off"));
        }
        let Some(d) = gpu.mig_devices.iter().find(|d| d.gi_id == gi_id) else {
            return Ok(false);
        };
        if d.ci_id != ci_id {
            return Err(Refusal::not_found(format!(
                "GPU instance {gi_id} has no compute instance {ci_id}"
            )));
        }
        let entry = self.gpus.entry(gpu.uuid.clone()).or_default();
        let before = entry.created.len();
        entry.created.retain(|c| c.uuid != d.uuid);
        if entry.created.len() == before {
            entry.destroyed.push(d.uuid.clone());
        }
        Ok(true)
    }
}

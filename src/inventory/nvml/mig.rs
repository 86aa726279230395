//! MIG through NVML: the MIG devices of a MIG-enabled GPU (with their GPU instance's
//! placement), the GPU's MIG geometry (its GPU instance profiles and their possible
//! placements), and creating and destroying a MIG device (a GPU instance at a placement and
//! one compute instance spanning it) for dynamic MIG.
//!
//! # Geometry
//!
//! For every NVML profile index below `NVML_GPU_INSTANCE_PROFILE_COUNT` (17):
//! `nvmlDeviceGetGpuInstanceProfileInfo` (nvml-wrapper's `Device::profile_info`); a profile
//! that answers `NVML_ERROR_NOT_SUPPORTED` (or `NVML_ERROR_INVALID_ARGUMENT`, a driver older
//! than the header) is not offered. Its placements come from
//! `nvmlDeviceGetGpuInstancePossiblePlacements_v2` called directly: nvml-wrapper 0.13's
//! `possible_placements` fills a `Vec` it never sets the length of, so it always answers none.
//! The v1 profile info has no name: it is rebuilt as `<slices>g.<GB>gb` (GB by NVIDIA's rule,
//! [`profiles::memory_gb`]) with the suffix of its profile index (`+me` for the `_REV1`
//! indices 7 and 8, `+gfx` for 10–12, `-me` for 13–14, `+me.all` for 15–16), which is
//! `nvidia-smi mig -lgip`'s name. Any other failure leaves the GPU without a geometry (logged);
//! discovery goes on.
//!
//! # Creating and destroying
//!
//! See [`GpuSource::create_mig`](crate::inventory::GpuSource::create_mig): the GPU instance
//! through `nvmlDeviceCreateGpuInstanceWithPlacement`, the compute instance of the full-size
//! compute profile ([`table::full_compute_profile`]'s index, its id from
//! `nvmlGpuInstanceGetComputeInstanceProfileInfo`) through
//! `nvmlGpuInstanceCreateComputeInstance`; the new MIG device is found by enumerating the MIG
//! devices for the two instance ids. nvml-wrapper 0.13 has none of the instance calls, so they
//! go through its loaded symbol table ([`Raw`]). Errors carry `nvmlErrorString`'s text (e.g.
//! `Insufficient Resources`).

use std::ffi::{c_uint, CStr};

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::struct_wrappers::device::DeviceAttributes;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t, nvmlComputeInstance_t,
    nvmlDevice_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstance_t, NvmlLib,
};

use super::NvmlSource;
use crate::device_health::Health;
use crate::inventory::mig::{self as profiles, table, Profile};
use crate::inventory::{
    CreatedMig, InventoryError, MigDevice, MigGeometry, MigPlacement, MigProfileInfo,
};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: GPU instance profile indices are below it.
const GPU_INSTANCE_PROFILE_COUNT: u32 = 17;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const ENGINE_PROFILE_SHARED: c_uint = 0;
/// `NVML_ERROR_NOT_FOUND`.
const NOT_FOUND: c_uint = 6;

/// A failed raw NVML call: its name, return code and `nvmlErrorString` text.
#[derive(Debug)]
struct Failure {
    call: &'static str,
    rc: c_uint,
    text: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.call, self.text)
    }
}

/// The NVML calls nvml-wrapper 0.13 lacks (or gets wrong), through its loaded symbol table.
struct Raw<'a> {
    lib: &'a NvmlLib,
}

/// A symbol of the table, or the failure of a library without it.
macro_rules! sym {
    ($raw:expr, $name:ident) => {
        $raw.lib.$name.as_ref().map_err(|e| Failure {
            call: stringify!($name),
            rc: u32::MAX,
            text: format!("not in the NVML library: {e}"),
        })?
    };
}

// NVML FFI sites: each `unsafe` block is one call with NVML's signature, on handles that come
// from nvml-wrapper or from NVML itself and live as long as the `Nvml` they came from, and
// out-pointers to locals.
#[allow(unsafe_code)]
impl<'a> Raw<'a> {
    fn new(nvml: &'a Nvml) -> Self {
        Raw { lib: nvml.lib() }
    }

    /// `Ok` for `NVML_SUCCESS`, else the failure with `nvmlErrorString`'s text.
    fn check(&self, call: &'static str, rc: c_uint) -> Result<(), Failure> {
        if rc == 0 {
            return Ok(());
        }
        let text = match self.lib.nvmlErrorString.as_ref() {
            // SAFETY: `nvmlErrorString` returns a static NUL-terminated string (or null).
            Ok(f) => match unsafe { f(rc) } {
                p if p.is_null() => format!("NVML error {rc}"),
                // SAFETY: non-null, NUL-terminated and static per NVML's documentation.
                p => unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(),
            },
            Err(_) => format!("NVML error {rc}"),
        };
        Err(Failure { call, rc, text })
    }

    /// The raw handle of a device.
    fn handle(dev: &Device<'_>) -> nvmlDevice_t {
        // SAFETY: only passed to NVML calls while `dev` lives.
        unsafe { dev.handle() }
    }

    /// Every placement of GPU instance profile id `profile_id`, free or not.
    fn placements(&self, dev: &Device<'_>, profile_id: u32) -> Result<Vec<MigPlacement>, Failure> {
        let f = sym!(self, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
        let call = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
        let mut count: c_uint = 0;
        // SAFETY: the count query: null array, `count` a local.
        let rc = unsafe {
            f(
                Self::handle(dev),
                profile_id,
                std::ptr::null_mut(),
                &mut count,
            )
        };
        self.check(call, rc)?;
        let empty = nvmlGpuInstancePlacement_t { start: 0, size: 0 };
        let mut list = vec![empty; count as usize];
        // SAFETY: `list` holds `count` entries.
        let rc = unsafe { f(Self::handle(dev), profile_id, list.as_mut_ptr(), &mut count) };
        self.check(call, rc)?;
        list.truncate(count as usize);
        Ok(list
            .into_iter()
            .map(|p| MigPlacement {
                start: p.start,
                size: p.size,
            })
            .collect())
    }

    /// GPU instance `id` of the GPU.
    fn gpu_instance(&self, dev: &Device<'_>, id: u32) -> Result<nvmlGpuInstance_t, Failure> {
        let f = sym!(self, nvmlDeviceGetGpuInstanceById);
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { f(Self::handle(dev), id, &mut gi) };
        self.check("nvmlDeviceGetGpuInstanceById", rc)?;
        Ok(gi)
    }

    /// A GPU instance's id and placement.
    fn gpu_instance_info(&self, gi: nvmlGpuInstance_t) -> Result<(u32, MigPlacement), Failure> {
        let f = sym!(self, nvmlGpuInstanceGetInfo);
        let mut info = nvmlGpuInstanceInfo_t {
            device: std::ptr::null_mut(),
            id: 0,
            profileId: 0,
            placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
        };
        // SAFETY: see the impl.
        let rc = unsafe { f(gi, &mut info) };
        self.check("nvmlGpuInstanceGetInfo", rc)?;
        let p = info.placement;
        Ok((
            info.id,
            MigPlacement {
                start: p.start,
                size: p.size,
            },
        ))
    }

    /// Creates a GPU instance of profile id `profile_id` at `placement`.
    fn create_gpu_instance(
        &self,
        dev: &Device<'_>,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<nvmlGpuInstance_t, Failure> {
        let f = sym!(self, nvmlDeviceCreateGpuInstanceWithPlacement);
        let p = nvmlGpuInstancePlacement_t {
            start: placement.start,
            size: placement.size,
        };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { f(Self::handle(dev), profile_id, &p, &mut gi) };
        self.check("nvmlDeviceCreateGpuInstanceWithPlacement", rc)?;
        Ok(gi)
    }

    fn destroy_gpu_instance(&self, gi: nvmlGpuInstance_t) -> Result<(), Failure> {
        let f = sym!(self, nvmlGpuInstanceDestroy);
        // SAFETY: see the impl.
        let rc = unsafe { f(gi) };
        self.check("nvmlGpuInstanceDestroy", rc)
    }

    /// The id of compute instance profile `index` (`NVML_COMPUTE_INSTANCE_PROFILE_*`) in a GPU
    /// instance.
    fn compute_profile_id(&self, gi: nvmlGpuInstance_t, index: u32) -> Result<u32, Failure> {
        let f = sym!(self, nvmlGpuInstanceGetComputeInstanceProfileInfo);
        let mut info = nvmlComputeInstanceProfileInfo_t {
            id: 0,
            sliceCount: 0,
            instanceCount: 0,
            multiprocessorCount: 0,
            sharedCopyEngineCount: 0,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
        };
        // SAFETY: see the impl.
        let rc = unsafe { f(gi, index, ENGINE_PROFILE_SHARED, &mut info) };
        self.check("nvmlGpuInstanceGetComputeInstanceProfileInfo", rc)?;
        Ok(info.id)
    }

    fn create_compute_instance(
        &self,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
    ) -> Result<nvmlComputeInstance_t, Failure> {
        let f = sym!(self, nvmlGpuInstanceCreateComputeInstance);
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { f(gi, profile_id, &mut ci) };
        self.check("nvmlGpuInstanceCreateComputeInstance", rc)?;
        Ok(ci)
    }

    /// A compute instance's id.
    fn compute_instance_id(&self, ci: nvmlComputeInstance_t) -> Result<u32, Failure> {
        let f = sym!(self, nvmlComputeInstanceGetInfo_v2);
        let mut info = nvmlComputeInstanceInfo_t {
            device: std::ptr::null_mut(),
            gpuInstance: std::ptr::null_mut(),
            id: 0,
            profileId: 0,
            placement: nvml_wrapper_sys::bindings::nvmlComputeInstancePlacement_t {
                start: 0,
                size: 0,
            },
        };
        // SAFETY: see the impl.
        let rc = unsafe { f(ci, &mut info) };
        self.check("nvmlComputeInstanceGetInfo_v2", rc)?;
        Ok(info.id)
    }

    fn compute_instance(
        &self,
        gi: nvmlGpuInstance_t,
        id: u32,
    ) -> Result<nvmlComputeInstance_t, Failure> {
        let f = sym!(self, nvmlGpuInstanceGetComputeInstanceById);
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: see the impl.
        let rc = unsafe { f(gi, id, &mut ci) };
        self.check("nvmlGpuInstanceGetComputeInstanceById", rc)?;
        Ok(ci)
    }

    fn destroy_compute_instance(&self, ci: nvmlComputeInstance_t) -> Result<(), Failure> {
        let f = sym!(self, nvmlComputeInstanceDestroy);
        // SAFETY: see the impl.
        let rc = unsafe { f(ci) };
        self.check("nvmlComputeInstanceDestroy", rc)
    }
}

#[derive(Clone, Copy)]
enum InstanceId {
    Gpu,
    Compute,
}

/// The suffix NVIDIA's profile names carry for an NVML GPU instance profile index.
fn profile_suffix(index: u32) -> &'static str {
    match index {
        7 | 8 => "+me",
        10..=12 => "+gfx",
        13 | 14 => "-me",
        15 | 16 => "+me.all",
        _ => "",
    }
}

/// The MIG geometry of a MIG-enabled GPU of `parent_mib` MiB (see the module documentation).
fn geometry(nvml: &Nvml, dev: &Device<'_>, parent_mib: u64) -> Result<MigGeometry, String> {
    let raw = Raw::new(nvml);
    let mut out = MigGeometry::default();
    for index in 0..GPU_INSTANCE_PROFILE_COUNT {
        let info = match dev.profile_info(index) {
            Ok(info) => info,
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(format!("nvmlDeviceGetGpuInstanceProfileInfo({index}): {e}")),
        };
        let placements = raw.placements(dev, info.id).map_err(|e| e.to_string())?;
        let gb = profiles::memory_gb(parent_mib, info.memory_size_mb);
        let profile = format!("{}g.{gb}gb{}", info.slice_count, profile_suffix(index));
        out.memory_slices = placements
            .iter()
            .map(|p| p.start + p.size)
            .fold(out.memory_slices, u32::max);
        out.compute_slices = out.compute_slices.max(info.slice_count);
        out.profiles.push(MigProfileInfo {
            profile,
            nvml_profile: index,
            id: info.id,
            gpu_slices: info.slice_count,
            memory_mib: info.memory_size_mb,
            instance_count: info.instance_count,
            placements,
        });
    }
    Ok(out)
}

/// The geometry of a MIG-enabled GPU for discovery: `None` (logged) when a query fails.
pub(super) fn geometry_or_warn(
    nvml: &Nvml,
    dev: &Device<'_>,
    index: u32,
    parent_mib: u64,
) -> Option<MigGeometry> {
    match geometry(nvml, dev, parent_mib) {
        Ok(g) => Some(g),
        Err(error) => {
            tracing::warn!(gpu = index, %error, "MIG geometry query failed; no dynamic MIG on this GPU");
            None
        }
    }
}

/// A MIG device's profile and slice counts.
struct Shape {
    profile: String,
    gpu_slices: u32,
    compute_slices: u32,
}

/// The profile of a MIG device: the word after ` MIG ` in its name, else rebuilt from its
/// attributes' slice counts and memory; the slice counts from the attributes, else from the
/// profile. `None` when neither the name nor the attributes tell.
fn shape(
    name: &str,
    attrs: Option<&DeviceAttributes>,
    parent_mib: u64,
    memory_mib: u64,
) -> Option<Shape> {
    let counted = attrs.filter(|a| a.gpu_instance_slice_count > 0).map(|a| {
        let g = a.gpu_instance_slice_count;
        (g, a.compute_instance_slice_count.clamp(1, g))
    });
    let profile = match (profiles::profile_from_device_name(name), counted) {
        (Some(p), _) => p,
        (None, Some((g, c))) => {
            Profile::name_for(g, c, profiles::memory_gb(parent_mib, memory_mib))
        }
        (None, None) => return None,
    };
    let (gpu_slices, compute_slices) = match (counted, Profile::parse(&profile)) {
        (Some(counts), _) => counts,
        (None, Some(p)) => (p.gpu_slices, p.compute_slices),
        (None, None) => (0, 0),
    };
    Some(Shape {
        profile,
        gpu_slices,
        compute_slices,
    })
}

impl NvmlSource {
    /// Every MIG device of the MIG-enabled GPU `index`, skipping empty slots.
    pub(super) fn mig_devices(
        &self,
        dev: &Device<'_>,
        index: u32,
        parent_mib: u64,
    ) -> Result<Vec<MigDevice>, InventoryError> {
        let capacity = super::query(
            index,
            "nvmlDeviceGetMaxMigDeviceCount",
            dev.mig_device_count(),
        )?;
        let mut out = Vec::new();
        for slot in 0..capacity {
            out.extend(self.mig_device(dev, index, slot, parent_mib)?);
        }
        Ok(out)
    }

    /// The MIG device in `slot` of GPU `index`, `None` for an empty slot.
    fn mig_device(
        &self,
        dev: &Device<'_>,
        index: u32,
        slot: u32,
        parent_mib: u64,
    ) -> Result<Option<MigDevice>, InventoryError> {
        let q = |query: &'static str, reason: String| InventoryError::NvmlMigQuery {
            query,
            gpu: index,
            slot,
            reason,
        };
        let m = match dev.mig_device_by_index(slot) {
            Ok(m) => m,
            Err(NvmlError::NotFound) => return Ok(None),
            Err(e) => return Err(q("nvmlDeviceGetMigDeviceHandleByIndex", e.to_string())),
        };
        let uuid = m
            .uuid()
            .map_err(|e| q("nvmlDeviceGetUUID", e.to_string()))?;
        // A driver answering garbage must not reach paths or the container's environment.
        let uuid = crate::uuid::Uuid::parse(&uuid)
            .map_err(|e| q("nvmlDeviceGetUUID", e.to_string()))?
            .to_string();
        let name = m
            .name()
            .map_err(|e| q("nvmlDeviceGetName", e.to_string()))?;
        let gi_id = self
            .instance_id(&m, InstanceId::Gpu)
            .map_err(|e| q("nvmlDeviceGetGpuInstanceId", e.to_string()))?;
        let ci_id = self
            .instance_id(&m, InstanceId::Compute)
            .map_err(|e| q("nvmlDeviceGetComputeInstanceId", e.to_string()))?;
        let attrs = m.attributes().ok();
        let memory_mib = match &attrs {
            Some(a) if a.memory_size_mb > 0 => a.memory_size_mb,
            _ => {
                m.memory_info()
                    .map_err(|e| q("nvmlDeviceGetMemoryInfo_v2", e.to_string()))?
                    .total
                    / (1024 * 1024)
            }
        };
        let Some(shape) = shape(&name, attrs.as_ref(), parent_mib, memory_mib) else {
            let reason =
                format!("no profile in the name {name:?} and no slice counts to derive one");
            return Err(q("nvmlDeviceGetAttributes_v2", reason));
        };
        Ok(Some(MigDevice {
            index: slot,
            uuid,
            profile: shape.profile,
            memory_mib,
            gi_id,
            ci_id,
            gpu_slices: shape.gpu_slices,
            compute_slices: shape.compute_slices,
            caps: None,
            placement: placement(&Raw::new(&self.nvml), dev, index, gi_id),
            health: Health::Healthy,
        }))
    }

    /// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a MIG device handle,
    /// called through nvml-wrapper's loaded symbol table (it has no safe wrapper for them).
    // An NVML FFI site: one `unsafe` call, its SAFETY comment at the block.
    #[allow(unsafe_code)]
    fn instance_id(&self, mig: &Device<'_>, which: InstanceId) -> Result<u32, NvmlError> {
        let lib = self.nvml.lib();
        let sym = match which {
            InstanceId::Gpu => lib.nvmlDeviceGetGpuInstanceId.as_ref(),
            InstanceId::Compute => lib.nvmlDeviceGetComputeInstanceId.as_ref(),
        }
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
        let mut id: c_uint = 0;
        // SAFETY: the symbol has NVML's signature `(nvmlDevice_t, unsigned int *)`; the handle
        // comes from nvml-wrapper and lives as long as `self.nvml`, and `id` is a valid
        // `unsigned int` to write to.
        let rc = unsafe { sym(mig.handle(), &mut id) };
        nvml_try(rc)?;
        Ok(id)
    }
}

/// The placement of GPU instance `gi_id` (`nvmlDeviceGetGpuInstanceById`,
/// `nvmlGpuInstanceGetInfo`); `None` when NVML does not tell (an unprivileged caller, an old
/// driver), logged at debug level.
fn placement(raw: &Raw<'_>, dev: &Device<'_>, index: u32, gi_id: u32) -> Option<MigPlacement> {
    let info = raw
        .gpu_instance(dev, gi_id)
        .and_then(|gi| raw.gpu_instance_info(gi));
    match info {
        Ok((_, p)) => Some(p),
        Err(error) => {
            tracing::debug!(gpu = index, gi = gi_id, %error, "no placement for a GPU instance");
            None
        }
    }
}

/// What [`NvmlSource::create_mig`] is asked for.
pub(super) struct MigRequest<'a> {
    pub parent_uuid: &'a str,
    pub profile: &'a str,
    pub start: u32,
}

impl MigRequest<'_> {
    fn error(&self, reason: impl std::fmt::Display) -> InventoryError {
        InventoryError::MigCreate {
            uuid: self.parent_uuid.to_string(),
            profile: self.profile.to_string(),
            start: self.start,
            reason: reason.to_string(),
        }
    }
}

/// The GPU instance and compute instance a create made.
struct Instances {
    gi: nvmlGpuInstance_t,
    ci: nvmlComputeInstance_t,
}

impl NvmlSource {
    /// [`GpuSource::create_mig`](crate::inventory::GpuSource::create_mig) (see the module
    /// documentation).
    pub(super) fn create_mig_device(
        &self,
        req: &MigRequest<'_>,
    ) -> Result<CreatedMig, InventoryError> {
        let dev = self
            .nvml
            .device_by_uuid(req.parent_uuid)
            .map_err(|e| req.error(format!("nvmlDeviceGetHandleByUUID: {e}")))?;
        let index = dev
            .index()
            .map_err(|e| req.error(format!("nvmlDeviceGetIndex: {e}")))?;
        let parent_mib = dev
            .memory_info()
            .map_err(|e| req.error(format!("nvmlDeviceGetMemoryInfo_v2: {e}")))?
            .total
            / (1024 * 1024);
        let geometry = geometry(&self.nvml, &dev, parent_mib).map_err(|e| req.error(e))?;
        let Some(info) = geometry.profile(req.profile) else {
            return Err(req.error("the GPU offers no such MIG profile"));
        };
        let raw = Raw::new(&self.nvml);
        let made = create_instances(&raw, &dev, info, req.start).map_err(|e| req.error(e))?;
        let found = self.find_created(&raw, &dev, index, parent_mib, &made);
        if found.is_err() {
            let _ = destroy_instances(&raw, made.gi, Some(made.ci));
        }
        Ok(CreatedMig {
            parent_uuid: req.parent_uuid.to_string(),
            device: found.map_err(|e| req.error(e))?,
        })
    }

    /// The MIG device of the instances just made, from a fresh enumeration.
    fn find_created(
        &self,
        raw: &Raw<'_>,
        dev: &Device<'_>,
        index: u32,
        parent_mib: u64,
        made: &Instances,
    ) -> Result<MigDevice, String> {
        let (gi_id, _) = raw.gpu_instance_info(made.gi).map_err(|e| e.to_string())?;
        let ci_id = raw
            .compute_instance_id(made.ci)
            .map_err(|e| e.to_string())?;
        let devices = self
            .mig_devices(dev, index, parent_mib)
            .map_err(|e| crate::errors::chain(&e).to_string())?;
        devices
            .into_iter()
            .find(|m| m.gi_id == gi_id && m.ci_id == ci_id)
            .ok_or_else(|| {
                format!("no MIG device lists GPU instance {gi_id} compute instance {ci_id}")
            })
    }

    /// [`GpuSource::destroy_mig`](crate::inventory::GpuSource::destroy_mig): the compute
    /// instance (when still there), then the GPU instance; a GPU instance that is gone already
    /// is success.
    pub(super) fn destroy_mig_device(
        &self,
        parent_uuid: &str,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), InventoryError> {
        let error = |reason: String| InventoryError::MigDestroy {
            uuid: parent_uuid.to_string(),
            gi_id,
            ci_id,
            reason,
        };
        let dev = self
            .nvml
            .device_by_uuid(parent_uuid)
            .map_err(|e| error(format!("nvmlDeviceGetHandleByUUID: {e}")))?;
        let raw = Raw::new(&self.nvml);
        let gi = match raw.gpu_instance(&dev, gi_id) {
            Ok(gi) => gi,
            Err(f) if f.rc == NOT_FOUND => return Ok(()),
            Err(f) => return Err(error(f.to_string())),
        };
        let ci = match raw.compute_instance(gi, ci_id) {
            Ok(ci) => Some(ci),
            Err(f) if f.rc == NOT_FOUND => None,
            Err(f) => return Err(error(f.to_string())),
        };
        destroy_instances(&raw, gi, ci).map_err(|f| error(f.to_string()))
    }
}

/// Creates the GPU instance of `info` at `start` and the full-size compute instance in it; a
/// GPU instance whose compute instance fails is destroyed again.
fn create_instances(
    raw: &Raw<'_>,
    dev: &Device<'_>,
    info: &MigProfileInfo,
    start: u32,
) -> Result<Instances, String> {
    // A start the profile does not offer goes to the driver as is: its refusal is the reason.
    let size = info.placements.first().map_or(0, |p| p.size);
    let gi = raw
        .create_gpu_instance(dev, info.id, MigPlacement { start, size })
        .map_err(|e| e.to_string())?;
    let ci = table::full_compute_profile(info.gpu_slices)
        .ok_or_else(|| {
            format!(
                "no compute instance profile spans {} slices",
                info.gpu_slices
            )
        })
        .and_then(|index| {
            let id = raw
                .compute_profile_id(gi, index)
                .map_err(|e| e.to_string())?;
            raw.create_compute_instance(gi, id)
                .map_err(|e| e.to_string())
        });
    match ci {
        Ok(ci) => Ok(Instances { gi, ci }),
        Err(reason) => match raw.destroy_gpu_instance(gi) {
            Ok(()) => Err(reason),
            Err(e) => Err(format!("{reason}; destroying its GPU instance again: {e}")),
        },
    }
}

/// Destroys compute instance `ci` (when given), then GPU instance `gi`.
fn destroy_instances(
    raw: &Raw<'_>,
    gi: nvmlGpuInstance_t,
    ci: Option<nvmlComputeInstance_t>,
) -> Result<(), Failure> {
    if let Some(ci) = ci {
        raw.destroy_compute_instance(ci)?;
    }
    raw.destroy_gpu_instance(gi)
}

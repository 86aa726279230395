//! GPUs from NVML through nvml-wrapper (the only file that imports it).
//!
//! NVML is loaded with `dlopen` (`libnvidia-ml.so.1` by default, or `--nvml-library PATH` for
//! custom driver roots and the fake library used in tests). The NUMA node comes from sysfs
//! (`<sysfs>/bus/pci/devices/<bus id>/numa_node`), best effort.
//!
//! # MIG
//!
//! For each GPU, `nvmlDeviceGetMigMode` (current mode): `NotSupported` is a GPU without MIG.
//! On a MIG-enabled GPU, `nvmlDeviceGetMaxMigDeviceCount` is a capacity (7 on an A100/H100),
//! not a count: every slot below it is asked with `nvmlDeviceGetMigDeviceHandleByIndex`, and a
//! slot answering `NotFound` is empty and skipped. For each MIG device: UUID, name, attributes
//! (`nvmlDeviceGetAttributes_v2`: slice counts, memory), and the GPU-instance and
//! compute-instance ids through the raw `nvmlDeviceGetGpuInstanceId` /
//! `nvmlDeviceGetComputeInstanceId` (nvml-wrapper has no wrapper for them). The profile is the
//! word after ` MIG ` in the device's name (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`), or, when the
//! name lacks it, rebuilt from the attributes (see [`super::mig`]).
//!
//! # Topology
//!
//! Once per discovery (see [`super::topology`]): for every GPU pair
//! `nvmlDeviceGetTopologyCommonAncestor`, and for every GPU and link number below
//! `NVML_NVLINK_MAX_LINKS` (18) `nvmlDeviceGetNvLinkState` and, for an active link,
//! `nvmlDeviceGetNvLinkRemotePciInfo_v2`: a link whose remote bus id is another GPU's counts
//! one NVLink for that pair; one whose remote is not a GPU of this node is an NVSwitch port, and
//! two GPUs that both have such ports are all-to-all over NVSwitch. A GPU without NVLink
//! answers `NotSupported` at link 0, and a link number past its last `InvalidArgument`; both
//! end its scan. Any other failure makes that pair's level (or that GPU's NVLinks) unknown,
//! logged once per GPU pair and call: discovery never fails because of topology.
//!
//! # Sampling
//!
//! [`GpuSource::sample`], per GPU: `nvmlDeviceGetUtilizationRates` (`.gpu`, percent) and
//! `nvmlDeviceGetMemoryInfo_v2` (used/total bytes). Per process, on a GPU without MIG:
//! `nvmlDeviceGetComputeRunningProcesses_v3` and `nvmlDeviceGetMPSComputeRunningProcesses_v3`
//! (MPS clients; nvml-wrapper 0.13 calls exactly these `_v3` symbols) give the PIDs and their
//! memory, and `nvmlDeviceGetProcessUtilization` their SM utilisation. NVML buffers
//! utilisation samples and returns those newer than the `lastSeenTimeStamp` passed in; the
//! newest timestamp received is kept per GPU UUID and passed next time, so no sample is lost
//! or counted twice (several samples of one PID in one answer: the newest counts). The lists
//! are joined by PID, each PID once (`join_processes`). NVML keeps samples only of processes
//! that used the GPU, so a listed process without a sample — and every process when NVML
//! answers `NVML_ERROR_NOT_FOUND`, "no samples since `lastSeenTimeStamp`" — was idle:
//! `sm_util_percent: Some(0)` (an idle process must count as idle for the scale-to-zero
//! signal). Only when the utilisation query fails otherwise (not supported, …) is it `None`,
//! unknown.
//!
//! On a MIG-enabled GPU NVIDIA documents no per-process utilisation (the query is not
//! supported with MIG on); its MIG devices are sampled instead, memory used/total from each
//! MIG device handle. Their utilisation stays `None`: GPM (`nvmlGpmMigSampleGet`) needs two
//! samples a period apart kept between calls, which nvml-wrapper 0.13 ties to the `Nvml`
//! borrow (`GpmSample<'nvml>`), and the fake NVML has no GPM to test it against.
//!
//! A figure NVML refuses is `None`, never an error of the whole sample; a GPU that answers
//! `NVML_ERROR_GPU_IS_LOST` (or gives no valid UUID) is left out of the sample. Only failing
//! to count the GPUs fails it.

use crate::device_health::Health;
use std::ffi::OsStr;
use std::os::raw::c_uint;
use std::path::{Path, PathBuf};

use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};

use super::mig::{self, Profile};
use super::topology::{Link, PathLevel, Topology, MAX_NVLINKS};
use super::{ComputeMode, EventSink, Gpu, GpuSource, Inventory, InventoryError, MigDevice};
use crate::device_health::HealthEvent;
use crate::inventory::sample::{GpuSample, MigSample, ProcessSample};

/// Library loaded when no path is given (the soname the NVIDIA driver installs).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// GPUs discovered through NVML. Holds NVML initialised for its lifetime
/// (`nvmlShutdown` runs on drop).
pub struct NvmlSource {
    nvml: std::sync::Arc<Nvml>,
    /// The Xid event thread, stopped and joined on drop or restart.
    events: Option<EventWatch>,
    library: String,
    sysfs_root: PathBuf,
    /// GPUs of the last successful discovery, by index: a GPU that stops answering is reported
    /// from here as Unhealthy (fail closed) instead of failing the whole node.
    last: std::collections::BTreeMap<u32, Gpu>,
    proc_root: PathBuf,
    /// Topology failures already logged (call and GPU UUIDs), so each is logged once.
    topology_logged: std::collections::BTreeSet<String>,
    /// Per GPU UUID, the newest process-utilisation sample timestamp received (µs): the
    /// `lastSeenTimeStamp` of the next query.
    last_seen: std::collections::BTreeMap<String, u64>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("library", &self.library)
            .finish()
    }
}

impl NvmlSource {
    /// Loads and initialises NVML from `library` (default [`DEFAULT_LIBRARY`]). `sysfs_root` is
    /// where `/sys` is mounted (default `/sys`).
    ///
    /// # Errors
    /// [`InventoryError::NvmlInit`] when the library is missing or `nvmlInit` fails (no driver,
    /// driver/library mismatch, …).
    pub fn new(library: Option<&Path>, sysfs_root: Option<&Path>) -> Result<Self, InventoryError> {
        let lib: &OsStr = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
        let library = lib.to_string_lossy().into_owned();
        let nvml = Nvml::builder()
            .lib_path(lib)
            .init()
            .map_err(|e| InventoryError::NvmlInit {
                library: library.clone(),
                reason: e.to_string(),
            })?;
        Ok(NvmlSource {
            nvml: std::sync::Arc::new(nvml),
            events: None,
            library,
            sysfs_root: sysfs_root.map_or_else(|| PathBuf::from("/sys"), Path::to_path_buf),
            last: Default::default(),
            proc_root: PathBuf::from("/"),
            topology_logged: Default::default(),
            last_seen: Default::default(),
        })
    }
    /// Reads the nvidia-caps MIG minors under `root` instead of `/`
    /// (`<root>/proc/driver/nvidia-caps/mig-minors`; see [`mig::resolve_caps`]).
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.proc_root = root.into();
        self
    }

    /// Every MIG device of the MIG-enabled GPU `index`, skipping empty slots.
    fn mig_devices(
        &self,
        dev: &Device<'_>,
        index: u32,
        parent_mib: u64,
    ) -> Result<Vec<MigDevice>, InventoryError> {
        let capacity = query(
            index,
            "nvmlDeviceGetMaxMigDeviceCount",
            dev.mig_device_count(),
        )?;
        let mut out = Vec::new();
        for slot in 0..capacity {
            let q = |query: &'static str, e: NvmlError| InventoryError::NvmlMigQuery {
                query,
                gpu: index,
                slot,
                reason: e.to_string(),
            };
            let m = match dev.mig_device_by_index(slot) {
                Ok(m) => m,
                Err(NvmlError::NotFound) => continue,
                Err(e) => return Err(q("nvmlDeviceGetMigDeviceHandleByIndex", e)),
            };
            let uuid = m.uuid().map_err(|e| q("nvmlDeviceGetUUID", e))?;
            // A driver answering garbage must not reach paths or the container's environment.
            let uuid = crate::uuid::Uuid::parse(&uuid)
                .map_err(|e| InventoryError::NvmlMigQuery {
                    query: "nvmlDeviceGetUUID",
                    gpu: index,
                    slot,
                    reason: e.to_string(),
                })?
                .to_string();
            let name = m.name().map_err(|e| q("nvmlDeviceGetName", e))?;
            let gi_id = self
                .instance_id(&m, InstanceId::Gpu)
                .map_err(|e| q("nvmlDeviceGetGpuInstanceId", e))?;
            let ci_id = self
                .instance_id(&m, InstanceId::Compute)
                .map_err(|e| q("nvmlDeviceGetComputeInstanceId", e))?;
            let attrs = m.attributes().ok();
            let memory_mib = match &attrs {
                Some(a) if a.memory_size_mb > 0 => a.memory_size_mb,
                _ => {
                    m.memory_info()
                        .map_err(|e| q("nvmlDeviceGetMemoryInfo_v2", e))?
                        .total
                        / (1024 * 1024)
                }
            };
            let profile = match (mig::profile_from_device_name(&name), &attrs) {
                (Some(p), _) => p,
                (None, Some(a)) if a.gpu_instance_slice_count > 0 => Profile::name_for(
                    a.gpu_instance_slice_count,
                    a.compute_instance_slice_count
                        .clamp(1, a.gpu_instance_slice_count),
                    mig::memory_gb(parent_mib, memory_mib),
                ),
                (None, _) => {
                    return Err(InventoryError::NvmlMigQuery {
                        query: "nvmlDeviceGetAttributes_v2",
                        gpu: index,
                        slot,
                        reason: format!(
                            "no profile in the name {name:?} and no slice counts to derive one"
                        ),
                    })
                }
            };
            let parsed = Profile::parse(&profile);
            let (gpu_slices, compute_slices) = match (&attrs, &parsed) {
                (Some(a), _) if a.gpu_instance_slice_count > 0 => (
                    a.gpu_instance_slice_count,
                    a.compute_instance_slice_count
                        .clamp(1, a.gpu_instance_slice_count),
                ),
                (_, Some(p)) => (p.gpu_slices, p.compute_slices),
                _ => (0, 0),
            };
            out.push(MigDevice {
                index: slot,
                uuid,
                profile,
                memory_mib,
                gi_id,
                ci_id,
                gpu_slices,
                compute_slices,
                caps: None,
                health: Health::Healthy,
            });
        }
        Ok(out)
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

impl NvmlSource {
    /// Logs a failed topology call once per (call, GPUs).
    fn topology_failed(&mut self, call: &'static str, uuids: &[&str], error: &NvmlError) {
        let key = format!("{call} {}", uuids.join(" "));
        if self.topology_logged.insert(key) {
            tracing::warn!(call, gpus = %uuids.join(", "), error = %error, "NVML topology query failed; the link is unknown (scored like system)");
        }
    }

    /// Every GPU pair's PCIe level and NVLinks (see the module documentation).
    fn topology(&mut self, gpus: &[Gpu]) -> Topology {
        let nvml = std::sync::Arc::clone(&self.nvml);
        let mut out = Topology::default();
        // (GPU index, handle) of every GPU that still gives one.
        let mut devices: Vec<(u32, &str, Device<'_>)> = Vec::new();
        for g in gpus {
            match nvml.device_by_index(g.index) {
                Ok(d) => devices.push((g.index, &g.uuid, d)),
                Err(e) => self.topology_failed("nvmlDeviceGetHandleByIndex", &[&g.uuid], &e),
            }
        }
        let mut by_bus: std::collections::BTreeMap<String, u32> = Default::default();
        for (i, uuid, d) in &devices {
            match d.pci_info() {
                Ok(p) => {
                    by_bus.insert(sysfs_bus_id(&p.bus_id), *i);
                }
                Err(e) => self.topology_failed("nvmlDeviceGetPciInfo_v3", &[uuid], &e),
            }
        }
        // Per GPU: NVLinks to each other GPU, and ports to something else (NVSwitch).
        let mut nvlinks: std::collections::BTreeMap<(u32, u32), u32> = Default::default();
        let mut switch_ports: std::collections::BTreeMap<u32, u32> = Default::default();
        for (i, uuid, d) in &devices {
            for link in 0..MAX_NVLINKS {
                let l = d.link_wrapper_for(link);
                match l.is_active() {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(NvmlError::NotSupported | NvmlError::InvalidArg) => break,
                    Err(e) => {
                        self.topology_failed("nvmlDeviceGetNvLinkState", &[uuid], &e);
                        break;
                    }
                }
                match l.remote_pci_info() {
                    Ok(p) => match by_bus.get(&sysfs_bus_id(&p.bus_id)) {
                        Some(&j) if j != *i => *nvlinks.entry((*i, j)).or_default() += 1,
                        Some(_) => {}
                        None => *switch_ports.entry(*i).or_default() += 1,
                    },
                    Err(e) => {
                        self.topology_failed("nvmlDeviceGetNvLinkRemotePciInfo_v2", &[uuid], &e)
                    }
                }
            }
        }
        for (n, (i, ui, a)) in devices.iter().enumerate() {
            for (j, uj, _) in &devices[n + 1..] {
                let Ok(other) = nvml.device_by_index(*j) else {
                    continue;
                };
                let pcie = match a.topology_common_ancestor(other) {
                    Ok(level) => path_level(level),
                    Err(e) => {
                        self.topology_failed("nvmlDeviceGetTopologyCommonAncestor", &[ui, uj], &e);
                        PathLevel::Unknown
                    }
                };
                // Each side counts the links it sees; one side's failed scan must not hide them.
                let count = nvlinks
                    .get(&(*i, *j))
                    .copied()
                    .unwrap_or(0)
                    .max(nvlinks.get(&(*j, *i)).copied().unwrap_or(0));
                let nvswitch = switch_ports.contains_key(i) && switch_ports.contains_key(j);
                out.set(
                    *i,
                    *j,
                    Link {
                        nvlinks: count,
                        nvswitch,
                        pcie,
                    },
                );
            }
        }
        out
    }
}

/// One process-utilisation sample: (PID, timestamp µs, SM percent).
type UtilSample = (u32, u64, u32);

/// Joins the process lists (PID, memory bytes; `None`: NVML does not say) with the
/// utilisation samples since the last query (`None`: the query failed, utilisation unknown),
/// each PID once, sorted by PID (see the module documentation): memory from the first list
/// entry that gives it, SM % from the PID's newest sample, `Some(0)` for a listed PID without
/// one; a PID only in the samples has no memory figure. Percentages are capped at 100.
fn join_processes(
    listed: &[(u32, Option<u64>)],
    samples: Option<&[UtilSample]>,
) -> Vec<ProcessSample> {
    use std::collections::BTreeMap;
    let mut by_pid: BTreeMap<u32, ProcessSample> = BTreeMap::new();
    for &(pid, memory) in listed {
        let p = by_pid.entry(pid).or_insert_with(|| ProcessSample {
            pid,
            sm_util_percent: samples.map(|_| 0),
            ..Default::default()
        });
        p.memory_used_bytes = p.memory_used_bytes.or(memory);
    }
    let mut newest: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    for &(pid, at, sm) in samples.unwrap_or_default() {
        let e = newest.entry(pid).or_insert((at, sm));
        if at > e.0 {
            *e = (at, sm);
        }
    }
    for (pid, (_, sm)) in newest {
        by_pid
            .entry(pid)
            .or_insert_with(|| ProcessSample {
                pid,
                ..Default::default()
            })
            .sm_util_percent = Some(sm.min(100));
    }
    by_pid.into_values().collect()
}

impl NvmlSource {
    /// One GPU's figures, `None` when it is lost (see the module documentation).
    fn sample_one(&mut self, dev: &Device<'_>, index: u32) -> Option<GpuSample> {
        let uuid = dev.uuid().ok()?;
        let uuid = crate::uuid::Uuid::parse(&uuid).ok()?.to_string();
        let memory = match dev.memory_info() {
            Ok(m) => Some(m),
            Err(NvmlError::GpuLost) => return None,
            Err(_) => None,
        };
        let model = dev
            .name()
            .ok()
            .or_else(|| self.last.get(&index).map(|g| g.model.clone()))
            .unwrap_or_default();
        let utilization_percent = dev.utilization_rates().ok().map(|u| u.gpu.min(100));
        let mig_on = matches!(dev.mig_mode(), Ok(m) if m.current == 1);
        let (processes, mig) = if mig_on {
            (Vec::new(), mig_samples(dev))
        } else {
            (self.processes(dev, &uuid), Vec::new())
        };
        Some(GpuSample {
            uuid,
            index,
            model,
            utilization_percent,
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            processes,
            mig,
        })
    }

    /// The processes of a GPU without MIG, and its last-seen sample time moved on.
    fn processes(&mut self, dev: &Device<'_>, uuid: &str) -> Vec<ProcessSample> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let mut listed = Vec::new();
        for list in [
            dev.running_compute_processes(),
            dev.mps_running_compute_processes(),
        ] {
            // A list NVML refuses contributes no PIDs (those with samples still appear).
            for p in list.unwrap_or_default() {
                let memory = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                listed.push((p.pid, memory));
            }
        }
        let samples: Option<Vec<UtilSample>> =
            match dev.process_utilization_stats(self.last_seen.get(uuid).copied()) {
                Ok(s) => Some(
                    s.into_iter()
                        .map(|s| (s.pid, s.timestamp, s.sm_util))
                        .collect(),
                ),
                Err(NvmlError::NotFound) => Some(Vec::new()),
                Err(_) => None,
            };
        if let Some(newest) = samples.iter().flatten().map(|s| s.1).max() {
            let seen = self.last_seen.entry(uuid.to_string()).or_insert(0);
            *seen = (*seen).max(newest);
        }
        join_processes(&listed, samples.as_deref())
    }
}

/// The MIG devices of a MIG-enabled GPU, memory only (empty and failing slots left out).
fn mig_samples(dev: &Device<'_>) -> Vec<MigSample> {
    let mut out = Vec::new();
    for slot in 0..dev.mig_device_count().unwrap_or(0) {
        let Ok(m) = dev.mig_device_by_index(slot) else {
            continue;
        };
        let Some(uuid) = m
            .uuid()
            .ok()
            .and_then(|u| crate::uuid::Uuid::parse(&u).ok())
        else {
            continue;
        };
        let memory = m.memory_info().ok();
        out.push(MigSample {
            uuid: uuid.to_string(),
            utilization_percent: None,
            memory_used_bytes: memory.as_ref().map(|x| x.used),
            memory_total_bytes: memory.as_ref().map(|x| x.total),
        });
    }
    out
}

/// NVML's topology level as slicelet's.
fn path_level(level: TopologyLevel) -> PathLevel {
    match level {
        TopologyLevel::Internal => PathLevel::Internal,
        TopologyLevel::Single => PathLevel::Single,
        TopologyLevel::Multiple => PathLevel::Multiple,
        TopologyLevel::HostBridge => PathLevel::HostBridge,
        TopologyLevel::Node => PathLevel::Node,
        TopologyLevel::System => PathLevel::System,
    }
}

#[derive(Clone, Copy)]
enum InstanceId {
    Gpu,
    Compute,
}

fn query<T>(index: u32, query: &'static str, r: Result<T, NvmlError>) -> Result<T, InventoryError> {
    r.map_err(|e| InventoryError::NvmlQuery {
        query,
        index,
        reason: e.to_string(),
    })
}

/// NVML's bus id `00000000:17:00.0` as sysfs names it: `0000:17:00.0` (4-digit domain,
/// lowercase).
fn sysfs_bus_id(nvml_bus_id: &str) -> String {
    let lower = nvml_bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

fn numa_node(sysfs_root: &Path, bus_id: &str) -> Option<i64> {
    let path = sysfs_root
        .join("bus/pci/devices")
        .join(sysfs_bus_id(bus_id))
        .join("numa_node");
    let n: i64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    (n >= 0).then_some(n)
}

impl GpuSource for NvmlSource {
    fn discover(&mut self) -> Result<Inventory, InventoryError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| InventoryError::NvmlCount(e.to_string()))?;
        let mut gpus = Vec::with_capacity(count as usize);
        for i in 0..count {
            match self.discover_one(i) {
                Ok(g) => gpus.push(g),
                Err(e) => match self.last.get(&i) {
                    // Known before: keep it, Unhealthy, so one GPU's failure neither hides
                    // nor fails the others.
                    Some(prev) => {
                        tracing::error!(gpu = i, uuid = %prev.uuid, error = %crate::errors::chain(&e), "GPU stopped answering NVML; marking it Unhealthy");
                        gpus.push(Gpu {
                            health: Health::Unhealthy,
                            ..prev.clone()
                        });
                    }
                    // Never seen answering: advertise it Unhealthy when its UUID is known, so
                    // the node is not dark because of one GPU (and the kubelet sees the
                    // capacity it cannot use); without a UUID it cannot be named at all.
                    None => match self.nvml.device_by_index(i).and_then(|d| d.uuid()) {
                        Ok(uuid) if crate::uuid::Uuid::parse(&uuid).is_ok() => {
                            tracing::error!(gpu = i, uuid = %uuid, error = %crate::errors::chain(&e), "GPU does not answer NVML; advertising it Unhealthy");
                            gpus.push(Gpu {
                                index: i,
                                uuid,
                                model: String::new(),
                                memory_mib: 0,
                                minor: None,
                                compute_capability: None,
                                numa_node: None,
                                mig_enabled: false,
                                mig_devices: Vec::new(),
                                health: Health::Unhealthy,
                            });
                        }
                        Ok(bad) => {
                            tracing::error!(gpu = i, error = %crate::errors::chain(&e), uuid = %crate::uuid::truncate_id(&bad), "GPU does not answer NVML and its UUID is not in NVML's form; it is left out");
                        }
                        Err(uuid_err) => {
                            tracing::error!(gpu = i, error = %crate::errors::chain(&e), uuid_error = %uuid_err, "GPU does not answer NVML, not even its UUID; it is left out");
                        }
                    },
                },
            }
        }
        for g in gpus.iter().filter(|g| g.health.is_healthy()) {
            self.last.insert(g.index, g.clone());
        }
        let links = self.topology(&gpus);
        let mut inv = Inventory::new(gpus).with_links(links);
        inv.driver_version = self.nvml.sys_driver_version().ok();
        mig::resolve_caps(&mut inv, &self.proc_root);
        Ok(inv)
    }

    fn probe(&mut self, uuid: &str) -> bool {
        self.nvml
            .device_by_uuid(uuid)
            .and_then(|d| d.memory_info())
            .is_ok()
    }

    fn set_compute_mode(
        &mut self,
        uuid: &str,
        mode: ComputeMode,
    ) -> Result<Option<ComputeMode>, InventoryError> {
        use nvml_wrapper::enum_wrappers::device::ComputeMode as Nvml;
        let err = |query: &'static str, e: NvmlError| InventoryError::NvmlDevice {
            query,
            uuid: uuid.to_string(),
            reason: e.to_string(),
        };
        let mut dev = self
            .nvml
            .device_by_uuid(uuid)
            .map_err(|e| err("nvmlDeviceGetHandleByUUID", e))?;
        let previous = dev
            .compute_mode()
            .map_err(|e| err("nvmlDeviceGetComputeMode", e))?;
        let target = match mode {
            ComputeMode::Default => Nvml::Default,
            ComputeMode::ExclusiveThread => Nvml::ExclusiveThread,
            ComputeMode::Prohibited => Nvml::Prohibited,
            ComputeMode::ExclusiveProcess => Nvml::ExclusiveProcess,
        };
        dev.set_compute_mode(target)
            .map_err(|e| err("nvmlDeviceSetComputeMode", e))?;
        Ok(Some(match previous {
            Nvml::Default => ComputeMode::Default,
            Nvml::ExclusiveThread => ComputeMode::ExclusiveThread,
            Nvml::Prohibited => ComputeMode::Prohibited,
            Nvml::ExclusiveProcess => ComputeMode::ExclusiveProcess,
        }))
    }

    fn describe(&self) -> String {
        format!("NVML ({})", self.library)
    }

    fn sample(&mut self) -> Result<Vec<GpuSample>, InventoryError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| InventoryError::NvmlCount(e.to_string()))?;
        let nvml = std::sync::Arc::clone(&self.nvml);
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..count {
            // A GPU that gives no handle is lost: left out.
            let Ok(dev) = nvml.device_by_index(i) else {
                continue;
            };
            out.extend(self.sample_one(&dev, i));
        }
        Ok(out)
    }

    fn watch_events(&mut self, sink: EventSink) {
        self.events = None; // stops and joins the previous thread
        let targets = self
            .last
            .values()
            .map(|g| EventTarget {
                index: g.index,
                uuid: g.uuid.clone(),
                migs: g
                    .mig_devices
                    .iter()
                    .map(|m| (m.gi_id, m.ci_id, m.uuid.clone()))
                    .collect(),
            })
            .collect();
        self.events = Some(EventWatch::start(
            std::sync::Arc::clone(&self.nvml),
            targets,
            sink,
        ));
    }
}

/// `nvmlEventTypeXidCriticalError`.
const XID_CRITICAL_ERROR: u64 = 8;
/// GPU-/compute-instance id of an event that concerns the whole GPU.
const WHOLE_GPU: u32 = 0xFFFF_FFFF;
/// How long one `nvmlEventSetWait_v2` blocks, so the thread notices a stop request, ms.
const EVENT_WAIT_MS: c_uint = 500;

/// A GPU the event thread watches, with its MIG devices as (GI id, CI id, UUID).
struct EventTarget {
    index: u32,
    uuid: String,
    migs: Vec<(u32, u32, String)>,
}

impl EventTarget {
    /// The devices an event with these instance ids concerns: the GPU (GI id 0xFFFFFFFF, or
    /// ids that match no MIG device), or every MIG device of that GPU instance (CI id
    /// 0xFFFFFFFF), or the one MIG device.
    fn uuids_for(&self, gi: u32, ci: u32) -> Vec<&str> {
        if gi == WHOLE_GPU {
            return vec![&self.uuid];
        }
        let migs: Vec<&str> = self
            .migs
            .iter()
            .filter(|(g, c, _)| *g == gi && (ci == WHOLE_GPU || *c == ci))
            .map(|(_, _, u)| u.as_str())
            .collect();
        if migs.is_empty() {
            vec![&self.uuid]
        } else {
            migs
        }
    }
}

/// The one thread per process that reads NVML Xid events (blocking waits with a timeout, so it
/// can stop). nvml-wrapper's safe event API drops the GPU-/compute-instance ids, so the raw
/// `nvmlEventSetWait_v2` is called through its symbol table.
struct EventWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EventWatch {
    fn start(nvml: std::sync::Arc<Nvml>, targets: Vec<EventTarget>, sink: EventSink) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("nvml-events".into())
            .spawn(move || event_loop(&nvml, &targets, &sink, &flag))
            .ok();
        EventWatch { stop, thread }
    }
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Delays between attempts to create the event set: 100 ms doubling to 30 s.
fn event_set_backoff() -> backon::ExponentialBackoff {
    backon::BackoffBuilder::build(
        backon::ExponentialBuilder::default()
            .with_min_delay(std::time::Duration::from_millis(100))
            .with_max_delay(std::time::Duration::from_secs(30))
            .without_max_times(),
    )
}

// NVML FFI sites (the event-set calls nvml-wrapper has no safe wrapper for): each `unsafe`
// block below carries its SAFETY comment.
#[allow(unsafe_code)]
fn event_loop(
    nvml: &Nvml,
    targets: &[EventTarget],
    sink: &EventSink,
    stop: &std::sync::atomic::AtomicBool,
) {
    // Whether a GPU is watched is a health condition (fail closed while it is not), owned by
    // the supervisor's health tracker: report it, keep nothing here.
    let mark = |uuid: &str, failure: Option<String>| {
        sink(HealthEvent::Watched {
            uuid: uuid.to_string(),
            failure,
        });
    };
    use nvml_wrapper_sys::bindings::{nvmlEventData_t, nvmlEventSet_t};
    use std::sync::atomic::Ordering;
    let lib = nvml.lib();
    let (Ok(create), Ok(register), Ok(wait), Ok(free)) = (
        lib.nvmlEventSetCreate.as_ref(),
        lib.nvmlDeviceRegisterEvents.as_ref(),
        lib.nvmlEventSetWait_v2.as_ref(),
        lib.nvmlEventSetFree.as_ref(),
    ) else {
        tracing::warn!(
            "this NVML has no event API; GPUs are watched by periodic NVML queries only"
        );
        return;
    };
    let supported = lib.nvmlDeviceGetSupportedEventTypes.as_ref().ok();
    let fail_all = |reason: &str| {
        for t in targets {
            mark(&t.uuid, Some(reason.to_string()));
        }
    };
    let mut delays = event_set_backoff();
    while !stop.load(Ordering::Relaxed) {
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: NVML's `nvmlEventSetCreate(nvmlEventSet_t *)`; `set` is a valid out pointer.
        if let Err(e) = nvml_try(unsafe { create(&mut set) }) {
            fail_all(&format!("nvmlEventSetCreate: {e}"));
            let pause = delays.next().unwrap_or(std::time::Duration::from_secs(30));
            // Sleep in slices so a stop request is honoured within EVENT_WAIT_MS.
            let until = std::time::Instant::now() + pause;
            while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                std::thread::sleep(
                    std::time::Duration::from_millis(u64::from(EVENT_WAIT_MS)).min(pause),
                );
            }
            continue;
        }
        // Register every GPU (again, after a failed wait: re-check all before marking any).
        let mut handles = Vec::new();
        for t in targets {
            let device = match nvml.device_by_index(t.index) {
                Ok(d) => d,
                Err(e) => {
                    mark(&t.uuid, Some(format!("nvmlDeviceGetHandleByIndex: {e}")));
                    continue;
                }
            };
            // SAFETY: the handle is valid while `nvml` lives.
            let handle = unsafe { device.handle() };
            let mut types: u64 = XID_CRITICAL_ERROR;
            if let Some(f) = supported {
                // SAFETY: `(nvmlDevice_t, unsigned long long *)`; `types` is a valid out pointer.
                if nvml_try(unsafe { f(handle, &mut types) }).is_err() {
                    types = 0;
                }
            }
            // SAFETY: `(nvmlDevice_t, unsigned long long, nvmlEventSet_t)` with a live set.
            let rc = if types & XID_CRITICAL_ERROR == 0 {
                Err(NvmlError::NotSupported)
            } else {
                nvml_try(unsafe { register(handle, XID_CRITICAL_ERROR, set) })
            };
            match rc {
                Ok(()) => {
                    mark(&t.uuid, None);
                    handles.push((handle as usize, t));
                }
                Err(NvmlError::NotSupported) => {
                    mark(&t.uuid, None);
                    tracing::info!(gpu = %t.uuid, "GPU does not report Xid events; watched by periodic NVML queries");
                }
                Err(e) => {
                    mark(&t.uuid, Some(format!("Xid event registration failed: {e}")));
                }
            }
        }
        delays = event_set_backoff();
        loop {
            if stop.load(Ordering::Relaxed) {
                // SAFETY: the set was created above and is freed once.
                unsafe { free(set) };
                return;
            }
            // SAFETY: all-zero is a valid `nvmlEventData_t` (a null handle and integers).
            let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
            // SAFETY: `(nvmlEventSet_t, nvmlEventData_t *, unsigned int)` with a live set.
            match nvml_try(unsafe { wait(set, &mut data, EVENT_WAIT_MS) }) {
                Ok(()) if data.eventType & XID_CRITICAL_ERROR != 0 => {
                    let Some((_, t)) = handles.iter().find(|(h, _)| *h == data.device as usize)
                    else {
                        continue;
                    };
                    for uuid in t.uuids_for(data.gpuInstanceId, data.computeInstanceId) {
                        sink(HealthEvent::Xid {
                            uuid: uuid.to_string(),
                            xid: data.eventData,
                        });
                    }
                }
                Ok(()) | Err(NvmlError::Timeout) => {}
                Err(e) => {
                    tracing::error!(error = %crate::errors::chain(&e), "NVML event wait failed; re-creating the event set and re-checking every GPU");
                    // SAFETY: the set was created above and is freed once.
                    unsafe { free(set) };
                    break;
                }
            }
        }
    }
}

impl NvmlSource {
    fn discover_one(&self, i: u32) -> Result<Gpu, InventoryError> {
        let dev = query(
            i,
            "nvmlDeviceGetHandleByIndex",
            self.nvml.device_by_index(i),
        )?;
        let uuid = query(i, "nvmlDeviceGetUUID", dev.uuid())?;
        // A driver answering garbage must not reach paths or the container's environment.
        let uuid = crate::uuid::Uuid::parse(&uuid)
            .map_err(|e| InventoryError::NvmlQuery {
                query: "nvmlDeviceGetUUID",
                index: i,
                reason: e.to_string(),
            })?
            .to_string();
        let model = query(i, "nvmlDeviceGetName", dev.name())?;
        let memory = query(i, "nvmlDeviceGetMemoryInfo_v2", dev.memory_info())?;
        let minor = dev.minor_number().ok();
        let cc = dev
            .cuda_compute_capability()
            .ok()
            .and_then(|c| Some((u32::try_from(c.major).ok()?, u32::try_from(c.minor).ok()?)));
        let numa = dev
            .pci_info()
            .ok()
            .and_then(|p| numa_node(&self.sysfs_root, &p.bus_id));
        // NotSupported: a GPU without MIG. Any other error: report MIG as off, so the GPU is
        // advertised whole.
        let mig_enabled = match dev.mig_mode() {
            Ok(m) => m.current == 1,
            Err(NvmlError::NotSupported) => false,
            Err(e) => {
                tracing::warn!(gpu = i, error = %crate::errors::chain(&e), "nvmlDeviceGetMigMode failed; treating MIG as disabled");
                false
            }
        };
        let memory_mib = memory.total / (1024 * 1024);
        // A MIG device that fails a query fails its GPU (reported Unhealthy when it was known
        // before, see discover).
        let mig_devices = if mig_enabled {
            self.mig_devices(&dev, i, memory_mib)?
        } else {
            Vec::new()
        };
        Ok(Gpu {
            index: i,
            uuid,
            model,
            memory_mib,
            minor,
            compute_capability: cc,
            numa_node: numa,
            mig_enabled,
            mig_devices,
            health: Health::Healthy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_instance_ids_select_devices() {
        let t = EventTarget {
            index: 0,
            uuid: "GPU-0".into(),
            migs: vec![
                (2, 0, "MIG-a".into()),
                (2, 1, "MIG-b".into()),
                (3, 0, "MIG-c".into()),
            ],
        };
        assert_eq!(t.uuids_for(WHOLE_GPU, WHOLE_GPU), ["GPU-0"]);
        assert_eq!(t.uuids_for(2, 1), ["MIG-b"]);
        // Regression: a GPU-instance-scoped Xid marked only the first compute instance.
        assert_eq!(t.uuids_for(2, WHOLE_GPU), ["MIG-a", "MIG-b"]);
        assert_eq!(t.uuids_for(9, 0), ["GPU-0"]);
    }

    #[test]
    fn bus_id_to_sysfs_form() {
        assert_eq!(sysfs_bus_id("00000000:17:00.0"), "0000:17:00.0");
        assert_eq!(sysfs_bus_id("00000000:AF:1F.7"), "0000:af:1f.7");
        assert_eq!(sysfs_bus_id("0000:17:00.0"), "0000:17:00.0");
    }

    /// On a node with an NVIDIA driver: `cargo test --lib real_gpu -- --ignored --nocapture`.
    #[test]
    #[ignore = "needs an NVIDIA driver"]
    fn real_gpu_enumeration_is_consistent() {
        let mut source = NvmlSource::new(None, None).expect("NVML");
        let inv = source.discover().expect("discovery");
        assert!(!inv.gpus.is_empty());
        for g in &inv.gpus {
            eprintln!(
                "GPU {} {} {} MiB mig={} ({} MIG devices)",
                g.index,
                g.model,
                g.memory_mib,
                g.mig_enabled,
                g.mig_devices.len()
            );
            assert!(g.uuid.starts_with("GPU-"), "{}", g.uuid);
            if !g.mig_enabled {
                assert!(g.mig_devices.is_empty());
            }
            for m in &g.mig_devices {
                eprintln!(
                    "  MIG {}:{} {} {} GI {} CI {} {} MiB caps {:?}",
                    g.index, m.index, m.uuid, m.profile, m.gi_id, m.ci_id, m.memory_mib, m.caps
                );
                assert!(m.uuid.starts_with("MIG-"), "{}", m.uuid);
                assert!(Profile::parse(&m.profile).is_some(), "{}", m.profile);
                assert!(m.memory_mib > 0 && m.memory_mib <= g.memory_mib);
                assert!(m.gpu_slices >= 1 && m.compute_slices <= m.gpu_slices);
            }
        }
    }

    #[test]
    fn process_lists_and_samples_join_by_pid() {
        let p = |pid: u32, sm: Option<u32>, mem: Option<u64>| ProcessSample {
            pid,
            sm_util_percent: sm,
            memory_used_bytes: mem,
            ..Default::default()
        };
        type Case<'a> = (
            &'a [(u32, Option<u64>)],
            Option<&'a [UtilSample]>,
            Vec<ProcessSample>,
        );
        let cases: Vec<Case> = vec![
            // Two processes with their own SM %.
            (
                &[(20, Some(2)), (10, Some(1))],
                Some(&[(10, 5, 30), (20, 5, 10)]),
                vec![p(10, Some(30), Some(1)), p(20, Some(10), Some(2))],
            ),
            // Several samples of one PID: the newest counts, whatever the order.
            (
                &[(10, Some(1))],
                Some(&[(10, 9, 70), (10, 12, 40), (10, 11, 90)]),
                vec![p(10, Some(40), Some(1))],
            ),
            // Listed without a sample (or NOT_FOUND: no samples): idle.
            (
                &[(10, Some(1)), (20, None)],
                Some(&[]),
                vec![p(10, Some(0), Some(1)), p(20, Some(0), None)],
            ),
            // The utilisation query failed: unknown.
            (&[(10, Some(1))], None, vec![p(10, None, Some(1))]),
            // In both lists (compute and MPS): once, memory from the first that gives it.
            (
                &[(10, None), (10, Some(3)), (10, Some(4))],
                Some(&[(10, 1, 5)]),
                vec![p(10, Some(5), Some(3))],
            ),
            // Only in the samples: no memory figure. Over 100: capped.
            (&[], Some(&[(30, 1, 250)]), vec![p(30, Some(100), None)]),
            (&[], None, vec![]),
        ];
        for (listed, samples, want) in cases {
            assert_eq!(
                join_processes(listed, samples),
                want,
                "{listed:?} {samples:?}"
            );
        }
    }

    const FAKE_LIB: &str = "SLICELET_TEST_FAKE_NVML";

    /// Runs [`fake_nvml_child`] in a child process (the fake NVML reads its inventory from the
    /// environment at init, and its state is process-wide).
    #[test]
    fn sample_against_the_fake_nvml() {
        let exe = std::env::current_exe().unwrap();
        let lib = exe.parent().unwrap().join("libfake_nvml.so");
        assert!(
            lib.exists(),
            "{} missing: fake-nvml is a dev-dependency",
            lib.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let inv = dir.path().join("inventory.json");
        std::fs::write(
            &inv,
            r#"{"gpus": [
              {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
               "memoryMiB": 81559, "minor": 0, "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0",
               "utilization": {"gpu": 40, "memory": 12},
               "processes": [{"pid": 4343, "smUtil": 10, "usedMemoryMiB": 2048, "mps": true},
                             {"pid": 4242, "smUtil": 30, "usedMemoryMiB": 10240},
                             {"pid": 4444, "usedMemoryMiB": 100}]},
              {"uuid": "GPU-22222222-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
               "memoryMiB": 81559, "minor": 1, "computeCapability": [9, 0], "pciBusId": "00000000:18:00.0",
               "migMode": 1,
               "migDevices": [{"uuid": "MIG-22222222-2222-3333-4444-000000000000", "profile": "3g.40gb",
                               "memoryMiB": 40320, "giId": 1, "ciId": 0},
                              null,
                              {"uuid": "MIG-22222222-2222-3333-4444-000000000002", "profile": "1g.10gb",
                               "memoryMiB": 9856, "giId": 9, "ciId": 0}]},
              {"uuid": "GPU-33333333-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
               "memoryMiB": 81559, "minor": 2, "computeCapability": [9, 0], "pciBusId": "00000000:19:00.0",
               "lost": true}
            ]}"#,
        )
        .unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "inventory::nvml::tests::fake_nvml_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FAKE_NVML_INVENTORY", &inv)
            .env(FAKE_LIB, &lib)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
    }

    /// The body of [`sample_against_the_fake_nvml`]; does nothing outside it.
    #[test]
    #[ignore = "run by sample_against_the_fake_nvml in a child process"]
    fn fake_nvml_child() {
        let Some(lib) = std::env::var_os(FAKE_LIB) else {
            return;
        };
        const MIB: u64 = 1024 * 1024;
        let mut src = NvmlSource::new(Some(Path::new(&lib)), None).expect("fake NVML");
        let first = src.sample().unwrap();
        // The lost GPU is left out; the MIG GPU has MIG figures and no processes.
        assert_eq!(first.len(), 2, "{first:#?}");
        let g = &first[0];
        assert_eq!(g.uuid, "GPU-11111111-2222-3333-4444-555555555555");
        assert_eq!((g.index, g.model.as_str()), (0, "NVIDIA H100 80GB HBM3"));
        assert_eq!(g.utilization_percent, Some(40));
        assert_eq!(g.memory_used_bytes, Some((10240 + 2048 + 100) * MIB));
        assert_eq!(g.memory_total_bytes, Some(81559 * MIB));
        let procs = |s: &GpuSample| -> Vec<(u32, Option<u32>, Option<u64>)> {
            s.processes
                .iter()
                .map(|p| (p.pid, p.sm_util_percent, p.memory_used_bytes))
                .collect()
        };
        assert_eq!(
            procs(g),
            [
                (4242, Some(30), Some(10240 * MIB)),
                (4343, Some(10), Some(2048 * MIB)), // an MPS client
                (4444, Some(0), Some(100 * MIB)),   // listed, no samples: idle
            ]
        );
        assert_eq!(
            src.last_seen.get(&g.uuid),
            Some(&1_000_000),
            "the newest sample's time is kept"
        );
        let m = &first[1];
        assert_eq!(
            m.utilization_percent, None,
            "not in the inventory: NotSupported"
        );
        assert!(m.processes.is_empty());
        let mig: Vec<(&str, Option<u64>, Option<u64>)> = m
            .mig
            .iter()
            .map(|x| (x.uuid.as_str(), x.memory_used_bytes, x.memory_total_bytes))
            .collect();
        assert_eq!(
            mig,
            [
                (
                    "MIG-22222222-2222-3333-4444-000000000000",
                    Some(0),
                    Some(40320 * MIB)
                ),
                (
                    "MIG-22222222-2222-3333-4444-000000000002",
                    Some(0),
                    Some(9856 * MIB)
                ),
            ]
        );
        // Asked with the newest time seen: NOT_FOUND, nothing new, every process idle.
        let second = src.sample().unwrap();
        assert_eq!(
            procs(&second[0]),
            [
                (4242, Some(0), Some(10240 * MIB)),
                (4343, Some(0), Some(2048 * MIB)),
                (4444, Some(0), Some(100 * MIB)),
            ]
        );
        assert_eq!(src.last_seen.get(&g.uuid), Some(&1_000_000));
        // The fake's clock moved on: new samples since the kept time.
        let third = src.sample().unwrap();
        assert_eq!(procs(&third[0]), procs(g));
        assert_eq!(src.last_seen.get(&g.uuid), Some(&2_000_000));
    }

    /// On a node with an NVIDIA driver: `cargo test --lib real_gpu -- --ignored --nocapture`.
    #[test]
    #[ignore = "needs an NVIDIA driver"]
    fn real_gpu_sample_is_consistent() {
        let mut source = NvmlSource::new(None, None).expect("NVML");
        let inv = source.discover().expect("discovery");
        for round in 0..2 {
            let samples = source.sample().expect("sample");
            assert_eq!(samples.len(), inv.gpus.len(), "no GPU is lost");
            for g in &samples {
                eprintln!(
                    "round {round} GPU {} {} util {:?}% mem {:?}/{:?} bytes, {} processes, {} MIG devices, last seen {:?}",
                    g.index,
                    g.uuid,
                    g.utilization_percent,
                    g.memory_used_bytes,
                    g.memory_total_bytes,
                    g.processes.len(),
                    g.mig.len(),
                    source.last_seen.get(&g.uuid)
                );
                assert_eq!(
                    Some(g.uuid.as_str()),
                    inv.by_index(g.index).map(|x| x.uuid.as_str())
                );
                assert!(g.utilization_percent.is_none_or(|u| u <= 100));
                assert!(g.memory_total_bytes.is_some());
                assert!(g.memory_used_bytes <= g.memory_total_bytes);
                for p in &g.processes {
                    eprintln!(
                        "  PID {} SM {:?}% mem {:?}",
                        p.pid, p.sm_util_percent, p.memory_used_bytes
                    );
                    assert!(p.sm_util_percent.is_none_or(|u| u <= 100));
                }
                for m in &g.mig {
                    eprintln!(
                        "  MIG {} mem {:?}/{:?}",
                        m.uuid, m.memory_used_bytes, m.memory_total_bytes
                    );
                    assert!(m.memory_used_bytes <= m.memory_total_bytes);
                }
            }
        }
    }

    #[test]
    fn numa_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("bus/pci/devices/0000:17:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        assert_eq!(numa_node(dir.path(), "00000000:17:00.0"), Some(1));
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        assert_eq!(numa_node(dir.path(), "00000000:17:00.0"), None);
        assert_eq!(numa_node(dir.path(), "00000000:18:00.0"), None);
    }
}

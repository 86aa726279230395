//! GPUs from NVML through nvml-wrapper (this module and its submodules are the only code that
//! imports it).
//!
//! NVML is loaded with `dlopen` (`libnvidia-ml.so.1` by default, or `--nvml-library PATH` for
//! custom driver roots and the fake library used in tests). The NUMA node comes from sysfs
//! (`<sysfs>/bus/pci/devices/<bus id>/numa_node`), best effort, and so does the PCIe root
//! complex (the `pci<domain>:<bus>` directory that symlink points into, [`pcie_root`]).
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
//! Each MIG device's placement comes from its GPU instance (`nvmlDeviceGetGpuInstanceById`,
//! `nvmlGpuInstanceGetInfo`; unknown when NVML does not tell), and the GPU's geometry (its GPU
//! instance profiles and their possible placements) from the profile and placement queries;
//! dynamic MIG creates and destroys MIG devices at a placement. All of this is in the `mig`
//! submodule.
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
//!
//! This file discovers the GPUs (and their topology); `mig` their MIG devices and geometry and
//! creates and destroys MIG devices, `sample` samples them (utilisation, memory, processes) and
//! `events` runs the Xid event-watch thread.

use crate::device_health::Health;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::topology::{Link, PathLevel, Topology, MAX_NVLINKS};
use super::{ComputeMode, EventSink, Gpu, GpuSource, Inventory, InventoryError};
use crate::inventory::sample::{GpuSample, LimitsRead};

mod events;
pub mod limits;
mod mig;
mod sample;

use events::{EventTarget, EventWatch};

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
    /// The per-cgroup memory-limit calls, resolved at their first use (`Err`: the driver has
    /// none, said once).
    limit_calls: Option<Result<limits::LimitCalls, limits::LimitsError>>,
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
            limit_calls: None,
        })
    }

    /// The memory-limit calls, resolved at the first use; `None` when the driver has none
    /// (logged once).
    fn limit_calls(&mut self) -> Option<&limits::LimitCalls> {
        let library = &self.library;
        let calls = self.limit_calls.get_or_insert_with(|| {
            let loaded = limits::LimitCalls::load(OsStr::new(library));
            if let Err(e) = &loaded {
                tracing::info!(reason = %e, "per-cgroup GPU memory limits are not available");
            }
            loaded
        });
        calls.as_ref().ok()
    }

    /// Where the unified cgroup hierarchy is mounted: `<sysfs root>/fs/cgroup`.
    fn cgroup_root(&self) -> PathBuf {
        self.sysfs_root.join("fs/cgroup")
    }
    /// Reads the nvidia-caps MIG minors under `root` instead of `/`
    /// (`<root>/proc/driver/nvidia-caps/mig-minors`; see [`mig::resolve_caps`]).
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.proc_root = root.into();
        self
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

/// The PCIe root complex of the PCI device `bus_id` (NVML's form), from sysfs:
/// `<sysfs_root>/bus/pci/devices/<bus id>` is a symlink to
/// `../../../devices/pci0000:00/0000:00:01.0/…/<bus id>`, and the first directory of that path
/// that [`super::is_pcie_root`] accepts is the root (`pci0000:00`), as the kubelet's DRA
/// helpers (`k8s.io/dynamic-resource-allocation/deviceattribute`) find it. `None` when the
/// link is missing or names no root (best effort, like the NUMA node).
pub fn pcie_root(sysfs_root: &Path, bus_id: &str) -> Option<String> {
    let link = sysfs_root
        .join("bus/pci/devices")
        .join(sysfs_bus_id(bus_id));
    let target = std::fs::read_link(link).ok()?;
    target.components().find_map(|c| match c {
        std::path::Component::Normal(name) => name
            .to_str()
            .filter(|n| super::is_pcie_root(n))
            .map(str::to_string),
        _ => None,
    })
}

impl GpuSource for NvmlSource {
    fn memory_limits_supported(&mut self, uuid: &str) -> Option<bool> {
        let root = self.cgroup_root();
        let nvml = std::sync::Arc::clone(&self.nvml);
        let device = nvml.device_by_uuid(uuid).ok()?;
        let Some(calls) = self.limit_calls() else {
            return Some(false);
        };
        match calls.get(&device, &root) {
            Ok(_) => Some(true),
            Err(limits::NOT_SUPPORTED) => Some(false),
            Err(_) => None,
        }
    }

    fn memory_limits(&mut self, uuid: &str, cgroup: &str) -> LimitsRead {
        let dir = self.cgroup_root().join(cgroup.trim_start_matches('/'));
        let nvml = std::sync::Arc::clone(&self.nvml);
        let device = match nvml.device_by_uuid(uuid) {
            Ok(d) => d,
            Err(e) => return LimitsRead::Failed(e.to_string()),
        };
        let Some(calls) = self.limit_calls() else {
            return LimitsRead::Unsupported;
        };
        let answer = calls.get(&device, &dir);
        if !dir.is_dir() {
            // The cgroup is gone: NVML should have cleared its limits.
            let still = answer.ok().filter(|r| r.is_limited());
            return LimitsRead::Gone { still };
        }
        match answer {
            Ok(r) => LimitsRead::Read(r),
            Err(limits::NOT_SUPPORTED) => LimitsRead::Unsupported,
            Err(limits::NOT_FOUND) => LimitsRead::Gone { still: None },
            Err(rc) => LimitsRead::Failed(limits::describe(rc)),
        }
    }

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
                                pcie_root: None,
                                pci_device_id: None,
                                mig_enabled: false,
                                mig_geometry: None,
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
        inv.cgroup_v2 = self
            .sysfs_root
            .join("fs/cgroup/cgroup.controllers")
            .is_file();
        super::mig::resolve_caps(&mut inv, &self.proc_root);
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

    fn create_mig(
        &mut self,
        parent_uuid: &str,
        profile: &str,
        start: u32,
    ) -> Result<super::CreatedMig, InventoryError> {
        self.create_mig_device(&mig::MigRequest {
            parent_uuid,
            profile,
            start,
        })
    }

    fn destroy_mig(
        &mut self,
        parent_uuid: &str,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), InventoryError> {
        self.destroy_mig_device(parent_uuid, gi_id, ci_id)
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
        let pci = dev.pci_info().ok();
        let pci_device_id = pci.as_ref().map(|p| p.pci_device_id);
        let bus_id = pci.map(|p| p.bus_id);
        let numa = bus_id
            .as_deref()
            .and_then(|b| numa_node(&self.sysfs_root, b));
        let pcie_root = bus_id
            .as_deref()
            .and_then(|b| pcie_root(&self.sysfs_root, b));
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
        let (mig_devices, mig_geometry) = if mig_enabled {
            let devices = self.mig_devices(&dev, i, memory_mib)?;
            (
                devices,
                mig::geometry_or_warn(&self.nvml, &dev, i, memory_mib),
            )
        } else {
            (Vec::new(), None)
        };
        Ok(Gpu {
            index: i,
            uuid,
            model,
            memory_mib,
            minor,
            compute_capability: cc,
            numa_node: numa,
            pcie_root,
            pci_device_id,
            mig_enabled,
            mig_devices,
            mig_geometry,
            health: Health::Healthy,
        })
    }
}

#[cfg(test)]
mod tests;

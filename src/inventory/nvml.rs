//! GPUs from NVML through nvml-wrapper (the only file that imports it).
//!
//! NVML is loaded with `dlopen` (`libnvidia-ml.so.1` by default, or `--nvml-library PATH` for
//! custom driver roots and the fake library used in tests). The NUMA node comes from sysfs
//! (`<sysfs>/bus/pci/devices/<bus id>/numa_node`), best effort.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::{ComputeMode, Gpu, GpuSource, Inventory, InventoryError};

/// Library loaded when no path is given (the soname the NVIDIA driver installs).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// GPUs discovered through NVML. Holds NVML initialised for its lifetime
/// (`nvmlShutdown` runs on drop).
pub struct NvmlSource {
    nvml: Nvml,
    library: String,
    sysfs_root: PathBuf,
    /// GPUs of the last successful discovery, by index: a GPU that stops answering is reported
    /// from here as Unhealthy (fail closed) instead of failing the whole node.
    last: std::collections::BTreeMap<u32, Gpu>,
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
            nvml,
            library,
            sysfs_root: sysfs_root.map_or_else(|| PathBuf::from("/sys"), Path::to_path_buf),
            last: Default::default(),
        })
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
                        tracing::error!(gpu = i, uuid = %prev.uuid, error = %e, "GPU stopped answering NVML; marking it Unhealthy");
                        gpus.push(Gpu {
                            healthy: false,
                            ..prev.clone()
                        });
                    }
                    None => return Err(e),
                },
            }
        }
        for g in gpus.iter().filter(|g| g.healthy) {
            self.last.insert(g.index, g.clone());
        }
        Ok(Inventory::new(gpus))
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
}

impl NvmlSource {
    fn discover_one(&self, i: u32) -> Result<Gpu, InventoryError> {
        let dev = query(
            i,
            "nvmlDeviceGetHandleByIndex",
            self.nvml.device_by_index(i),
        )?;
        let uuid = query(i, "nvmlDeviceGetUUID", dev.uuid())?;
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
        // NotSupported: a GPU without MIG. Any other error: report MIG as off; the
        // MIG strategies decide what that means.
        let mig_enabled = dev.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        Ok(Gpu {
            index: i,
            uuid,
            model,
            memory_mib: memory.total / (1024 * 1024),
            minor,
            compute_capability: cc,
            numa_node: numa,
            mig_enabled,
            mig_devices: Vec::new(),
            healthy: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_to_sysfs_form() {
        assert_eq!(sysfs_bus_id("00000000:17:00.0"), "0000:17:00.0");
        assert_eq!(sysfs_bus_id("00000000:AF:1F.7"), "0000:af:1f.7");
        assert_eq!(sysfs_bus_id("0000:17:00.0"), "0000:17:00.0");
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

//! NVML's per-cgroup memory limits, called through the driver's library directly: the calls
//! (driver R615 and later) are newer than `nvml-wrapper`, which still opens the library,
//! initialises NVML and finds the GPU by UUID.

use std::ffi::{c_char, c_uint, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::nvmlDevice_t;

use crate::inventory::nvml::DEFAULT_LIBRARY;

/// "No limit" as NVML writes it: soft 0 and hard `NVML_DEVICE_MEMORY_LIMIT_MAX`
/// (`ULLONG_MAX`).
pub const NVML_DEVICE_MEMORY_LIMIT_MAX: u64 = u64::MAX;

/// Limits of one cgroup on one GPU, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Soft limit (the guaranteed share), bytes; 0: none.
    pub soft: u64,
    /// Hard limit, bytes; [`NVML_DEVICE_MEMORY_LIMIT_MAX`]: none.
    pub hard: u64,
    /// Memory the cgroup's processes use on the GPU now, bytes (read back only).
    pub used: u64,
}

/// `nvmlSetMemoryLimits_v1_t` (NVML API reference).
#[repr(C)]
struct SetLimits {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t` (NVML API reference).
#[repr(C)]
struct GetLimits {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type SetFn = unsafe extern "C" fn(nvmlDevice_t, *mut SetLimits) -> c_uint;
type GetFn = unsafe extern "C" fn(nvmlDevice_t, *mut GetLimits) -> c_uint;

/// NVML's return codes this path names (`nvmlReturn_t`).
fn describe(code: c_uint) -> String {
    match code {
        2 => "NVML_ERROR_INVALID_ARGUMENT (a limit above the GPU's memory, soft above hard, or a bad cgroup path)".to_string(),
        3 => "NVML_ERROR_NOT_SUPPORTED (a MIG device, a driver before R615, or no cgroup v2 memory partitioning on this host)".to_string(),
        4 => "NVML_ERROR_NO_PERMISSION (setting limits needs root)".to_string(),
        6 => "NVML_ERROR_NOT_FOUND (the cgroup does not exist)".to_string(),
        15 => "NVML_ERROR_GPU_IS_LOST".to_string(),
        other => format!("NVML error {other}"),
    }
}

// The one unsafe block: calls of two NVML symbols nvml-wrapper does not bind.
#[allow(unsafe_code)]
/// Sets `want`'s soft and hard limits for the cgroup directory `cgroup` on GPU `uuid`, then
/// reads them back. Errors are one line for the runtime's log.
pub(super) fn set_and_read_back(
    library: Option<&Path>,
    uuid: &str,
    cgroup: &Path,
    want: Limits,
) -> Result<Limits, String> {
    let lib: &OsStr = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
    let nvml = Nvml::builder()
        .lib_path(lib)
        .init()
        .map_err(|e| format!("NVML ({}) does not start: {e}", lib.to_string_lossy()))?;
    let device = nvml
        .device_by_uuid(uuid)
        .map_err(|e| format!("NVML does not know it: {e}"))?;
    // SAFETY: the library stays loaded while `nvml` lives (dlopen counts references); the
    // symbols have the signatures of the NVML API reference, and both structs outlive the
    // calls, with `name_space` pointing into `ns`.
    unsafe {
        let handle = device.handle();
        let dl = libloading::Library::new(lib)
            .map_err(|e| format!("opening {}: {e}", lib.to_string_lossy()))?;
        let set: libloading::Symbol<SetFn> =
            dl.get(b"nvmlDeviceSetMemoryLimits_v1\0").map_err(|_| {
                "the driver has no nvmlDeviceSetMemoryLimits_v1 (R615 or later needed)".to_string()
            })?;
        let get: libloading::Symbol<GetFn> =
            dl.get(b"nvmlDeviceGetMemoryLimits_v1\0").map_err(|_| {
                "the driver has no nvmlDeviceGetMemoryLimits_v1 (R615 or later needed)".to_string()
            })?;
        let ns = CString::new(cgroup.as_os_str().as_bytes())
            .map_err(|_| "the cgroup path has a NUL byte".to_string())?;
        let mut s = SetLimits {
            name_space: ns.as_ptr(),
            soft_limit: want.soft,
            hard_limit: want.hard,
        };
        let rc = set(handle, &mut s);
        if rc != 0 {
            return Err(format!(
                "setting {} MiB hard for {}: {}",
                want.hard / (1024 * 1024),
                cgroup.display(),
                describe(rc)
            ));
        }
        let mut g = GetLimits {
            name_space: ns.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        let rc = get(handle, &mut g);
        if rc != 0 {
            return Err(format!(
                "reading the limits of {} back: {}",
                cgroup.display(),
                describe(rc)
            ));
        }
        Ok(Limits {
            soft: g.soft_limit,
            hard: g.hard_limit,
            used: g.current_used,
        })
    }
}

//! NVML's per-cgroup GPU memory limits (`nvmlDeviceSetMemoryLimits_v1`,
//! `nvmlDeviceGetMemoryLimits_v1`, driver R615 and later), called through the driver's library
//! directly: the calls are newer than `nvml-wrapper`, which still opens the library,
//! initialises NVML and finds the GPU by UUID.
//!
//! Both calls take the full sysfs path of a cgroup v2 directory (`nameSpace`) and limits in
//! bytes; "no limit" is soft 0 and hard `NVML_DEVICE_MEMORY_LIMIT_MAX` (`ULLONG_MAX`,
//! [`NO_HARD_LIMIT`]). Used by the hook that sets a container's limits ([`crate::hook`]) and by
//! the NVML source's sampling, which reads them back.

use std::ffi::{c_char, c_uint, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlDevice_t;

use super::DEFAULT_LIBRARY;
use crate::inventory::sample::{LimitReading, NO_HARD_LIMIT};

/// `NVML_ERROR_NOT_SUPPORTED`: a MIG device, a driver without the feature, no cgroup v2
/// memory partitioning on the host.
pub const NOT_SUPPORTED: c_uint = 3;
/// `NVML_ERROR_NOT_FOUND`: no cgroup at the path.
pub const NOT_FOUND: c_uint = 6;

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

/// Why the memory-limit calls could not be loaded or used. Each message is one line for a
/// log or the container runtime's log; NVML's or the loader's answer is part of it (there is
/// no separate source).
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// The NVML library does not open.
    #[error("opening {library}: {error}")]
    Open {
        /// The library's path or name, as given.
        library: String,
        /// The loader's answer.
        error: libloading::Error,
    },
    /// The driver lacks one of the two calls (a driver before R615).
    #[error("the driver has no {symbol} (R615 or later needed)")]
    NoSymbol {
        /// The missing symbol.
        symbol: &'static str,
    },
    /// NVML does not start.
    #[error("NVML ({library}) does not start: {error}")]
    Init {
        /// The library's path or name.
        library: String,
        /// NVML's answer.
        error: NvmlError,
    },
    /// NVML does not know the GPU.
    #[error("NVML does not know it: {error}")]
    NoDevice {
        /// The GPU's UUID.
        uuid: String,
        /// NVML's answer.
        error: NvmlError,
    },
    /// Reading the cgroup's limits failed (`when`: "before setting" or "back").
    #[error("reading the limits of {} {when}: {}", cgroup.display(), describe(*rc))]
    Read {
        /// The cgroup directory.
        cgroup: std::path::PathBuf,
        /// Which read.
        when: &'static str,
        /// NVML's return code.
        rc: c_uint,
    },
    /// Setting the cgroup's limits failed.
    #[error("setting {} MiB hard for {}: {}", hard_bytes / (1024 * 1024), cgroup.display(), describe(*rc))]
    Set {
        /// The cgroup directory.
        cgroup: std::path::PathBuf,
        /// The hard limit set, bytes.
        hard_bytes: u64,
        /// NVML's return code.
        rc: c_uint,
    },
}

/// NVML's return codes this path names (`nvmlReturn_t`), for one log or error line.
pub fn describe(code: c_uint) -> String {
    match code {
        2 => "NVML_ERROR_INVALID_ARGUMENT (a limit above the GPU's memory, soft above hard, or a bad cgroup path)".to_string(),
        NOT_SUPPORTED => "NVML_ERROR_NOT_SUPPORTED (a MIG device, a driver before R615, or no cgroup v2 memory partitioning on this host)".to_string(),
        4 => "NVML_ERROR_NO_PERMISSION (setting limits needs root)".to_string(),
        NOT_FOUND => "NVML_ERROR_NOT_FOUND (the cgroup does not exist)".to_string(),
        15 => "NVML_ERROR_GPU_IS_LOST".to_string(),
        other => format!("NVML error {other}"),
    }
}

/// The two calls, resolved once from the NVML library (which stays loaded while this lives).
pub struct LimitCalls {
    set: SetFn,
    get: GetFn,
    _library: libloading::Library,
}

impl std::fmt::Debug for LimitCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LimitCalls")
    }
}

// The only unsafe code of the limits: resolving and calling two NVML symbols nvml-wrapper does
// not bind.
#[allow(unsafe_code)]
impl LimitCalls {
    /// Resolves both symbols in `library` (a path or a name the loader finds).
    ///
    /// # Errors
    /// [`LimitsError::Open`] or [`LimitsError::NoSymbol`] (a driver before R615).
    pub fn load(library: &OsStr) -> Result<LimitCalls, LimitsError> {
        // SAFETY: loading the NVML library runs no initialiser beyond the driver's own (it is
        // loaded already by nvml-wrapper, so this only counts a reference); the symbols have
        // the signatures of the NVML API reference, and the pointers are used only while
        // `_library` keeps the library loaded.
        unsafe {
            let lib = libloading::Library::new(library).map_err(|error| LimitsError::Open {
                library: library.to_string_lossy().into_owned(),
                error,
            })?;
            let set: SetFn = *lib
                .get::<SetFn>(b"nvmlDeviceSetMemoryLimits_v1\0")
                .map_err(|_| LimitsError::NoSymbol {
                    symbol: "nvmlDeviceSetMemoryLimits_v1",
                })?;
            let get: GetFn = *lib
                .get::<GetFn>(b"nvmlDeviceGetMemoryLimits_v1\0")
                .map_err(|_| LimitsError::NoSymbol {
                    symbol: "nvmlDeviceGetMemoryLimits_v1",
                })?;
            Ok(LimitCalls {
                set,
                get,
                _library: lib,
            })
        }
    }

    /// Sets `soft`/`hard` (bytes) for the cgroup directory `cgroup` on `device`.
    ///
    /// # Errors
    /// NVML's return code (see [`describe`]); `2` for a path with a NUL byte.
    pub fn set(&self, device: &Device, cgroup: &Path, soft: u64, hard: u64) -> Result<(), c_uint> {
        let ns = CString::new(cgroup.as_os_str().as_bytes()).map_err(|_| 2u32)?;
        let mut s = SetLimits {
            name_space: ns.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: `device`'s handle is valid while its `Nvml` lives (the borrow); `s` and `ns`
        // outlive the call.
        let rc = unsafe { (self.set)(device.handle(), &mut s) };
        if rc == 0 {
            Ok(())
        } else {
            Err(rc)
        }
    }

    /// The limits of the cgroup directory `cgroup` on `device`.
    ///
    /// # Errors
    /// NVML's return code (see [`describe`]); `2` for a path with a NUL byte.
    pub fn get(&self, device: &Device, cgroup: &Path) -> Result<LimitReading, c_uint> {
        let ns = CString::new(cgroup.as_os_str().as_bytes()).map_err(|_| 2u32)?;
        let mut g = GetLimits {
            name_space: ns.as_ptr(),
            soft_limit: 0,
            hard_limit: NO_HARD_LIMIT,
            current_used: 0,
        };
        // SAFETY: as in `set`.
        let rc = unsafe { (self.get)(device.handle(), &mut g) };
        if rc == 0 {
            Ok(LimitReading {
                soft: g.soft_limit,
                hard: g.hard_limit,
                used: g.current_used,
            })
        } else {
            Err(rc)
        }
    }
}

/// What [`add_and_read_back`] found, set and read back, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    /// The limits the cgroup had on the GPU before (another hook of the same container's
    /// creation set them), `None` when it had none.
    pub before: Option<LimitReading>,
    /// What was set: the hook's own limits added to `before`.
    pub want: LimitReading,
    /// What reads back afterwards.
    pub read: LimitReading,
}

/// Opens NVML from `library` (default [`DEFAULT_LIBRARY`]), reads the limits the cgroup
/// directory `cgroup` has on GPU `uuid` already, sets `own`'s soft and hard limits added to
/// them, then reads them back (the hook's whole NVML part).
///
/// Adding, not replacing: NVML keeps one limit per GPU and cgroup, and the runtime runs every
/// hook of a container's creation, one after the other, against its new cgroup, so a limit
/// found there is another hook's of the same container (another resource of the container on
/// this GPU, through another Allocate; another DRA claim's share of it). Replacing it would
/// leave the container the last one's limit instead of the sum.
///
/// # Errors
/// [`LimitsError`], one line for the container runtime's log: NVML does not start, does not
/// know the GPU, has no such calls, or refuses the read, the set or the read back.
pub fn add_and_read_back(
    library: Option<&Path>,
    uuid: &str,
    cgroup: &Path,
    own: LimitReading,
) -> Result<Added, LimitsError> {
    let lib: &OsStr = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
    let nvml = Nvml::builder()
        .lib_path(lib)
        .init()
        .map_err(|error| LimitsError::Init {
            library: lib.to_string_lossy().into_owned(),
            error,
        })?;
    let device = nvml
        .device_by_uuid(uuid)
        .map_err(|error| LimitsError::NoDevice {
            uuid: uuid.to_string(),
            error,
        })?;
    let calls = LimitCalls::load(lib)?;
    let reading = |when: &'static str| {
        calls.get(&device, cgroup).map_err(|rc| LimitsError::Read {
            cgroup: cgroup.to_path_buf(),
            when,
            rc,
        })
    };
    let before = Some(reading("before setting")?).filter(LimitReading::is_limited);
    let want = match before {
        None => own,
        Some(b) => LimitReading {
            soft: own.soft.saturating_add(b.soft),
            hard: if b.hard == NO_HARD_LIMIT {
                own.hard
            } else {
                own.hard.saturating_add(b.hard)
            },
            used: 0,
        },
    };
    calls
        .set(&device, cgroup, want.soft, want.hard)
        .map_err(|rc| LimitsError::Set {
            cgroup: cgroup.to_path_buf(),
            hard_bytes: want.hard,
            rc,
        })?;
    let read = reading("back")?;
    Ok(Added { before, want, read })
}

//! `slicelet hook set-memory-limits`: the OCI `createContainer` hook that sets a container's
//! GPU memory limits before its first instruction.
//!
//! The container runtime (containerd ≥ 1.7, CRI-O, podman) runs it from the CDI spec's
//! `hooks` for a device with memory limits, with the container's OCI state on stdin (OCI
//! runtime spec, "State": `{"ociVersion", "id", "status", "pid", "bundle", "annotations"}`).
//! At `createContainer` the container's cgroup exists and its process has not started. The
//! hook reads the cgroup from the bundle's `config.json` (`linux.cgroupsPath`, either a path
//! or systemd's `slice:prefix:name`), and asks NVML to limit the GPU's memory for that cgroup
//! (`nvmlDeviceSetMemoryLimits_v1`: the cgroup's full sysfs path, soft and hard limits in
//! bytes; driver R615 and later, cgroup v2, no MIG handles), then reads the limits back
//! (`nvmlDeviceGetMemoryLimits_v1`) and checks they hold. NVML keeps one limit per GPU and
//! cgroup: the hook adds its limits to those another hook of the same container set on the
//! GPU (the runtime runs them one after the other on the new cgroup), so a container given
//! two memory-limited resources, or two claims' shares, of one GPU is limited to their sum.
//!
//! Under `--enforce required` any failure exits non-zero, which fails container creation
//! (the runtime reports the hook's stderr); under `best-effort` the hook says why on stderr
//! and exits 0. The driver clears the limits when the cgroup is removed.
//!
//! The hook never hangs container creation: a watchdog thread ([`start_watchdog`]) ends the
//! process once [`Request::deadline`] (default [`DEFAULT_DEADLINE`], 25 s) has passed without
//! an answer (NVML's init on a GPU that fell off the bus, a FIFO in place of `config.json`):
//! exit 0 with a line on stderr saying the limit was not set under `best-effort`, non-zero
//! with the reason under `required`. The spec's hook entry also carries a `timeout`
//! ([`crate::cdi::memory::HOOK_TIMEOUT_SECONDS`], 30 s, after the deadline) so that the
//! runtime kills a hook that cannot even run its watchdog.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::policy::Enforce;

use crate::inventory::nvml::limits;
use crate::inventory::sample::LimitReading;

/// The largest OCI state read from stdin, bytes (a state is well under 64 KiB).
pub const MAX_STATE_BYTES: u64 = 1024 * 1024;
/// The largest bundle `config.json` read, bytes.
pub const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;
/// Where the unified cgroup hierarchy is mounted.
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// How long the hook may take before its watchdog ends it (25 s: NVML's init on a node of
/// eight GPUs without persistence mode takes a few seconds; under the spec's `timeout`, 30 s,
/// so that the watchdog, not the runtime, decides under `best-effort`).
pub const DEFAULT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(25);
/// The exit status of a hook that failed under `required` (the watchdog's too).
pub const EXIT_FAILED: i32 = 1;
const MIB: u64 = 1024 * 1024;

/// What `set-memory-limits` is asked to do.
#[derive(Debug, Clone)]
pub struct Request {
    /// The GPU's UUID (`GPU-…`); a `MIG-…` UUID is refused by NVML (not supported).
    pub gpu: String,
    /// Hard limit, MiB.
    pub hard_mib: u64,
    /// Soft limit, MiB (0: none).
    pub soft_mib: u64,
    /// Whether a failure fails container creation.
    pub enforce: Enforce,
    /// The NVML library (default `libnvidia-ml.so.1` from the loader path).
    pub nvml_library: Option<PathBuf>,
    /// Where the cgroup v2 hierarchy is mounted (default [`DEFAULT_CGROUP_ROOT`]).
    pub cgroup_root: PathBuf,
    /// How long the hook may take before [`start_watchdog`]'s thread ends it (default
    /// [`DEFAULT_DEADLINE`]).
    pub deadline: std::time::Duration,
}

/// Why the limit was not set.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The OCI state on stdin or the bundle's `config.json` could not be read or parsed.
    #[error("reading {what}: {message}")]
    Input {
        /// `the OCI state on stdin` or the config file's path.
        what: String,
        /// What is wrong.
        message: String,
    },
    /// `linux.cgroupsPath` is missing or not a form the hook knows.
    #[error("the container's cgroup: {0}")]
    Cgroup(String),
    /// NVML refused or failed.
    #[error("GPU {gpu}: {message}")]
    Nvml {
        /// The GPU's UUID.
        gpu: String,
        /// NVML's answer.
        message: String,
    },
    /// No answer within the deadline: NVML or a read blocked ([`start_watchdog`]).
    #[error("GPU {gpu}: no answer within {seconds} s (NVML or the bundle's config.json blocked); the limit was not set")]
    Deadline {
        /// The GPU's UUID.
        gpu: String,
        /// The deadline, seconds.
        seconds: f64,
    },
    /// NVML accepted the limit but reads back something else.
    #[error("GPU {gpu}: the limit reads back as hard {read_hard} bytes, soft {read_soft}, not the {want_hard} bytes set for {cgroup}")]
    Readback {
        /// The GPU's UUID.
        gpu: String,
        /// The cgroup directory.
        cgroup: String,
        /// What was set, bytes.
        want_hard: u64,
        /// What reads back, bytes.
        read_hard: u64,
        /// The soft limit read back, bytes.
        read_soft: u64,
    },
}

#[derive(Deserialize)]
struct State {
    bundle: PathBuf,
}

#[derive(Deserialize)]
struct Config {
    linux: Option<Linux>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Linux {
    cgroups_path: Option<String>,
}

/// What the hook set: the container's cgroup directory, the limits another of its hooks had
/// set on the GPU before (bytes; `None`: none), and the limits read back (bytes: this hook's
/// added to those).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The cgroup directory.
    pub cgroup: PathBuf,
    /// The limits found on the GPU for the cgroup before, bytes.
    pub before: Option<LimitReading>,
    /// The limits read back, bytes.
    pub read: LimitReading,
}

/// Runs the hook: `state` is the runtime's stdin. The request's limits are added to any the
/// container's cgroup has on the GPU already ([`limits::add_and_read_back`]: a container given
/// two memory-limited resources or two claims' shares of one GPU gets one hook for each, and
/// its limit there is their sum).
///
/// # Errors
/// [`HookError`]; the caller decides from [`Request::enforce`] whether it fails the container.
pub fn set_memory_limits(req: &Request, state: impl Read) -> Result<Outcome, HookError> {
    let mut text = String::new();
    state
        .take(MAX_STATE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| input("the OCI state on stdin", e))?;
    if text.len() as u64 > MAX_STATE_BYTES {
        return Err(input("the OCI state on stdin", "larger than 1 MiB"));
    }
    let state: State =
        serde_json::from_str(&text).map_err(|e| input("the OCI state on stdin", e))?;
    let config_path = state.bundle.join("config.json");
    let what = config_path.display().to_string();
    let file = std::fs::File::open(&config_path).map_err(|e| input(&what, e))?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| input(&what, e))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(input(&what, "larger than 16 MiB"));
    }
    let config: Config = serde_json::from_str(&text).map_err(|e| input(&what, e))?;
    let path = config
        .linux
        .and_then(|l| l.cgroups_path)
        .ok_or_else(|| HookError::Cgroup(format!("{what} has no linux.cgroupsPath")))?;
    let dir = cgroup_dir(&path, &req.cgroup_root)?;
    let own = LimitReading {
        soft: req.soft_mib.saturating_mul(MIB),
        hard: req.hard_mib.saturating_mul(MIB),
        used: 0,
    };
    let added = limits::add_and_read_back(req.nvml_library.as_deref(), &req.gpu, &dir, own)
        .map_err(|e| HookError::Nvml {
            gpu: req.gpu.clone(),
            message: e.to_string(),
        })?;
    let (want, read) = (added.want, added.read);
    if read.hard != want.hard || read.soft != want.soft {
        return Err(HookError::Readback {
            gpu: req.gpu.clone(),
            cgroup: dir.display().to_string(),
            want_hard: want.hard,
            read_hard: read.hard,
            read_soft: read.soft,
        });
    }
    Ok(Outcome {
        cgroup: dir,
        before: added.before,
        read,
    })
}

/// Starts the watchdog: a thread that, once `req.deadline` has passed, writes why on stderr
/// ([`HookError::Deadline`]) and ends the process at once, whatever the main thread is blocked
/// in: exit 0 under `best-effort` (the container starts without the limit), [`EXIT_FAILED`]
/// under `required` (container creation fails with the reason). A hook that finishes first
/// exits normally and the thread goes with it.
pub fn start_watchdog(req: &Request) {
    let (deadline, enforce) = (req.deadline, req.enforce);
    let e = HookError::Deadline {
        gpu: req.gpu.clone(),
        seconds: deadline.as_secs_f64(),
    };
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        match enforce {
            Enforce::BestEffort => {
                eprintln!("slicelet hook: not enforced (best-effort): {e}");
                exit_now(0)
            }
            Enforce::Required => {
                eprintln!("slicelet hook: GPU memory limit not set under enforce: required: {e}");
                exit_now(EXIT_FAILED)
            }
        }
    });
}

/// Ends the process with `code` without running exit handlers.
#[allow(unsafe_code)]
fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` has no preconditions: it takes no locks and runs no `atexit` handlers or
    // library destructors. That is the point: the main thread may be blocked inside NVML
    // (holding its locks), and a handler of the library waiting for them would hang the very
    // exit that is meant to end the hang. stderr is unbuffered, so the line above is written.
    unsafe { libc::_exit(code) }
}

fn input(what: &str, e: impl std::fmt::Display) -> HookError {
    HookError::Input {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// The cgroup directory of `linux.cgroupsPath` under `root`: an absolute or relative path
/// (cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`), or systemd's `slice:prefix:name`
/// (`kubepods-burstable-pod<uid>.slice:cri-containerd:<id>` →
/// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`,
/// each `-` in a slice name a level, as systemd.slice(5) says). `..` components are refused.
///
/// # Errors
/// [`HookError::Cgroup`] for an empty path, `..`, or a systemd form with an empty part.
pub fn cgroup_dir(cgroups_path: &str, root: &Path) -> Result<PathBuf, HookError> {
    let bad = |why: &str| HookError::Cgroup(format!("linux.cgroupsPath {cgroups_path:?} {why}"));
    let rel: PathBuf = if cgroups_path.starts_with('/') || !cgroups_path.contains(':') {
        PathBuf::from(cgroups_path.trim_start_matches('/'))
    } else {
        let mut parts = cgroups_path.splitn(3, ':');
        let (Some(slice), Some(prefix), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("is not slice:prefix:name"));
        };
        if prefix.is_empty() || name.is_empty() {
            return Err(bad("has an empty prefix or name"));
        }
        let mut out = PathBuf::new();
        if !slice.is_empty() && slice != "-.slice" {
            let stem = slice
                .strip_suffix(".slice")
                .ok_or_else(|| bad("names a slice not ending in .slice"))?;
            let mut level = String::new();
            for part in stem.split('-') {
                if part.is_empty() {
                    return Err(bad("has an empty slice level"));
                }
                if !level.is_empty() {
                    level.push('-');
                }
                level.push_str(part);
                out.push(format!("{level}.slice"));
            }
        }
        out.push(format!("{prefix}-{name}.scope"));
        out
    };
    if rel.as_os_str().is_empty() {
        return Err(bad("is empty"));
    }
    if rel
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(bad("leaves the cgroup hierarchy"));
    }
    Ok(root.join(rel))
}

#[cfg(test)]
mod tests;

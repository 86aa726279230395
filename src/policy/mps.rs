//! `sharing.mps` after validation: CUDA MPS (Multi-Process Service) sharing.
//!
//! Entries have the keys of time-slicing entries (validated by the same code, so names,
//! renames, `devices` and notices behave alike) plus two per-entry extensions, the limits each
//! client (replica) gets from its GPU's control daemon: `activeThreadPercentage` (1–100,
//! default `100 / replicas` rounded down) and `pinnedDeviceMemoryLimit` (a Kubernetes quantity;
//! default the GPU's memory / replicas, rounded down to MiB, resolved by [`crate::plan`] because
//! it depends on the GPU). Node-independent rules are checked here:
//! - `replicas` above the 48 clients one control daemon serves is an error with the number
//!   (GPUs older than compute capability 7.0 serve 16: checked per GPU by the plan);
//! - one name advertised by a time-slicing and an MPS entry is an error naming both;
//! - `failRequestsGreaterThanOne` defaults to **true**, as in NVIDIA's plugin: several replicas
//!   in one container cannot raise a limit the daemon enforces per client.

use std::path::PathBuf;

use super::{err, schema, validate_replicated, PolicyError, SharedResource, TimeSlicing};

/// Clients one MPS control daemon serves on GPUs of compute capability 7.0 and newer.
pub const MAX_CLIENTS: u32 = 48;
/// Clients one MPS control daemon serves on GPUs older than compute capability 7.0.
pub const MAX_CLIENTS_PRE_VOLTA: u32 = 16;
/// NVIDIA's default `flags.mpsRoot`.
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";

/// One `sharing.mps.resources[i]` entry after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsEntry {
    /// Name, rename, devices and replicas, validated as for time-slicing.
    pub shared: SharedResource,
    /// Each client's share of the GPU's threads (explicit, or `100 / replicas`).
    pub active_thread_percentage: u32,
    /// Each client's pinned device memory in MiB, when the entry sets it (otherwise the GPU's
    /// memory / replicas, resolved per GPU by the plan).
    pub pinned_device_memory_limit_mib: Option<u64>,
}

/// `sharing.mps` after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mps {
    /// Refuse container requests for more than one replica (default true).
    pub fail_requests_greater_than_one: bool,
    /// Set compute mode EXCLUSIVE_PROCESS on GPUs under MPS while their daemons run.
    pub exclusive_process: bool,
    /// `allowPreVolta` (slicelet extension, default false): MPS on GPUs of compute capability
    /// below 7.0 (Tesla P4, P100), which NVIDIA's MPS documentation says cannot enforce
    /// per-client limits or give clients isolated address spaces. Without it such a GPU under
    /// MPS is a plan error naming it.
    pub allow_pre_volta: bool,
    /// The entries, in file order.
    pub resources: Vec<MpsEntry>,
}

impl Default for Mps {
    fn default() -> Self {
        Mps {
            fail_requests_greater_than_one: true,
            exclusive_process: false,
            allow_pre_volta: false,
            resources: Vec::new(),
        }
    }
}

/// Validates `sharing.mps` against the already validated `sharing.timeSlicing`.
pub(super) fn validate_mps(
    mps: schema::MpsSharing,
    time_slicing: &TimeSlicing,
    notices: &mut Vec<String>,
    lenient: &mut Vec<String>,
    slicelet_only: &mut Vec<String>,
) -> Result<Mps, PolicyError> {
    let base = "sharing.mps";
    let entries = mps.resources.unwrap_or_default();
    let mut extensions = Vec::with_capacity(entries.len());
    let mut plain = Vec::with_capacity(entries.len());
    for e in entries {
        extensions.push((e.active_thread_percentage, e.pinned_device_memory_limit));
        plain.push(schema::ReplicatedResource {
            name: e.name,
            rename: e.rename,
            devices: e.devices,
            replicas: e.replicas,
            dra: e.dra,
            memory: e.memory,
        });
    }
    let shared = validate_replicated(
        schema::ReplicatedResources {
            rename_by_default: mps.rename_by_default,
            fail_requests_greater_than_one: None,
            resources: Some(plain),
        },
        base,
        notices,
        lenient,
        slicelet_only,
    )?;
    let mut out = Mps {
        fail_requests_greater_than_one: mps.fail_requests_greater_than_one.unwrap_or(true),
        exclusive_process: mps.exclusive_process.unwrap_or(false),
        allow_pre_volta: mps.allow_pre_volta.unwrap_or(false),
        resources: Vec::new(),
    };
    for (entry, (pct, mem)) in shared.resources.into_iter().zip(extensions) {
        out.resources
            .push(mps_entry(entry, pct, mem, time_slicing)?);
    }
    if !out.resources.is_empty() && !time_slicing.resources.is_empty() {
        notices.push(format!(
            "{base}: NVIDIA's plugin silently ignores sharing.timeSlicing when sharing.mps is set; slicelet applies both, each to the GPUs its entries claim"
        ));
    }
    Ok(out)
}

/// One MPS entry, read as a replicated one (`entry`) plus its MPS keys (`pct`, `mem`): capacity
/// shares take neither key, at most [`MAX_CLIENTS`] clients, and no name time-slicing
/// advertises too.
fn mps_entry(
    entry: SharedResource,
    pct: Option<schema::Percentage>,
    mem: Option<schema::MemoryQuantity>,
    time_slicing: &TimeSlicing,
) -> Result<MpsEntry, PolicyError> {
    if entry.capacity_shares.is_some() && (pct.is_some() || mem.is_some()) {
        let key = if pct.is_some() {
            "activeThreadPercentage"
        } else {
            "pinnedDeviceMemoryLimit"
        };
        return Err(err(
            format!("{}.{key}", entry.path),
            "dra: capacity shares take their threads and memory from each claim's capacity request (cores, memory); drop it or use dra: true".to_string(),
        ));
    }
    let clients = entry.capacity_shares.unwrap_or(entry.replicas);
    if clients > MAX_CLIENTS {
        return Err(err(
            format!("{}.replicas", entry.path),
            format!(
                "{clients} replicas exceed the {MAX_CLIENTS} clients one MPS control daemon serves; use at most {MAX_CLIENTS}"
            ),
        ));
    }
    if let Some(ts) = time_slicing
        .resources
        .iter()
        .find(|t| t.advertised == entry.advertised)
    {
        return Err(err(
            entry.path.clone(),
            format!(
                "advertises {}, which {} already advertises; give one of them another rename",
                entry.advertised, ts.path
            ),
        ));
    }
    Ok(MpsEntry {
        active_thread_percentage: pct.map_or(100 / entry.replicas, |p| p.0),
        // `memory.hard` is the daemon-enforced floor where the driver cannot partition.
        pinned_device_memory_limit_mib: mem.map(|m| m.mib).or(entry.memory.map(|m| m.hard_mib)),
        shared: entry,
    })
}

/// Trees `flags.mpsRoot` may not be in (or be): slicelet creates, chmods (1777 for `shm`)
/// and removes directories there.
pub const FORBIDDEN_MPS_ROOTS: [&str; 4] = ["/proc", "/sys", "/etc", "/dev"];

/// Validates `flags.mpsRoot` (default [`DEFAULT_MPS_ROOT`]): an absolute, normalised path
/// (`/` then plain components joined by single `/`: no `.` or `..`, no `//`, no trailing `/`,
/// no NUL), not `/` itself and not in [`FORBIDDEN_MPS_ROOTS`].
pub(super) fn validate_root(root: Option<&str>) -> Result<PathBuf, PolicyError> {
    let root = root.unwrap_or(DEFAULT_MPS_ROOT);
    let shown = crate::uuid::truncate_id(root);
    let fail = |why: &str| err("flags.mpsRoot", format!("`{}` {why}", shown.escape_debug()));
    if !root.starts_with('/') {
        return Err(fail("is not an absolute path"));
    }
    if root.contains('\0') {
        return Err(fail("contains a NUL byte"));
    }
    let parts: Vec<&str> = root[1..].split('/').collect();
    if root == "/" {
        return Err(fail(
            "is the file-system root; use a directory of its own such as /run/nvidia/mps",
        ));
    }
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(fail(
            "is not normalised (no `.` or `..` segments, `//` or trailing `/`)",
        ));
    }
    if let Some(f) = FORBIDDEN_MPS_ROOTS
        .iter()
        .find(|f| root == **f || root.starts_with(&format!("{f}/")))
    {
        return Err(fail(&format!(
            "is under {f}, where slicelet must not create or remove directories"
        )));
    }
    Ok(PathBuf::from(root))
}

#[cfg(test)]
mod tests;

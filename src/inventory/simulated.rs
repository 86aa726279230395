//! A simulated node: GPUs described in a YAML file (`--simulate node.yaml`). A real feature
//! (demos, clusters without GPUs) and the basis of the integration tests.
//!
//! ```yaml
//! gpus:
//!   - model: NVIDIA H100 80GB HBM3   # product name as NVML reports it
//!     memoryMiB: 81559
//!     count: 8                       # optional, default 1: identical GPUs, consecutive indices
//!     uuid: GPU-...                  # optional, only when count is 1
//!     computeCapability: "9.0"       # optional
//!     numaNode: 0                    # optional
//!     pcieRoot: pci0000:00           # optional: the PCIe root complex, as sysfs names it
//!     health: Healthy                # optional: Healthy (default) or Unhealthy
//!     xid: 79                        # optional: an Xid reported when this line appears
//!     utilization: 40                # optional: GPU utilisation, percent (0-100)
//!     memoryUsedMiB: 20480           # optional: memory in use; default the processes' sum
//!     processes:                     # optional, only when count is 1 and MIG is off
//!       - pid: 4242                  # host PID (> 0, once per GPU)
//!         smUtil: 30                 # optional, default 0: SM utilisation, percent
//!         memoryMiB: 10240           # optional, default 0: at most the GPU's memoryMiB
//!     memoryLimits:                  # optional: per-cgroup GPU memory limits NVML reads back
//!       - cgroup: /kubepods/pod<uid>/<id>  # the cgroup v2 path of /proc/<pid>/cgroup
//!         hardMiB: 20480             # at most the GPU's memoryMiB
//!         softMiB: 16384             # optional, default 0 (none): at most hardMiB
//!     mig:                           # optional: present means MIG mode is on
//!       devices:
//!         - profile: 1g.10gb
//!           count: 7
//!           memoryUsedMiB: 512       # optional, default 0: in use on each of these devices
//! links:                             # optional; pairs not listed are derived from numaNode
//!   - gpus: [0, 1]                   # GPU indices
//!     nvlinks: 4                     # NVLinks between them (at most 18)
//!   - gpus: [0, 2]
//!     pcie: single                   # single | multiple | hostbridge
//! nvswitch: true                     # optional: every pair all-to-all over NVSwitch
//! driverVersion: "550.54.15"         # optional: the NVIDIA driver version NVML would report
//! cgroupVersion: 2                   # optional: 1 or 2 (default); GPU memory limits need 2
//! ```
//!
//! Without `links`, GPUs on the same `numaNode` are `node` (NVML's `NVML_TOPOLOGY_NODE`),
//! others `system`; a listed pair without `pcie` is derived the same way. A pair listed twice,
//! a GPU index the file does not have, or an entry with neither `nvlinks` nor `pcie` is an
//! error naming `links[i]`.
//!
//! `pcieRoot` is what NVML discovery reads from sysfs (the `pci<domain>:<bus>` directory
//! `/sys/bus/pci/devices/<bus id>` links into; see [`super::is_pcie_root`]): `pci`, 4 to 8
//! lowercase hex digits, `:`, 2 lowercase hex digits; anything else is an error naming
//! `gpus[i].pcieRoot`. Without it the root is unknown, as on a node whose sysfs does not say.
//! DRA publishes both as the standard attributes `resource.kubernetes.io/numaNode` and
//! `resource.kubernetes.io/pcieRoot`.
//!
//! UUIDs not given are derived deterministically from the model and the GPU index (same file,
//! same UUIDs). Unknown keys are errors with their path.
//!
//! MIG devices are numbered 0, 1, … in file order on their GPU and get GPU-instance ids 1, 2, …
//! in that order with compute-instance id 0 (one full-size compute instance each); their memory
//! is the profile's nominal GB × 1024 MiB. A profile must be spelled as NVIDIA spells it
//! (`1g.10gb`, `1g.24gb+me`, `1c.3g.40gb`), and a GPU's MIG devices may use at most 7 GPU
//! slices, as on every MIG-capable GPU. Use the profiles the model really offers (the tests check
//! the shipped nodes against `fixtures/models/gpu-models.yaml`). `mig:` without devices is a
//! MIG-enabled GPU on which no instance was created yet.
//!
//! # Use samples
//!
//! `utilization`, `memoryUsedMiB`, `processes` and a MIG device's `memoryUsedMiB` are what
//! [`GpuSource::sample`] reports; the file is re-read at every sample, so editing it changes
//! the next one (a file that became invalid makes the sample fail, and the supervisor keeps
//! the last figures). As with NVML, a MIG-enabled GPU has no per-process figures (`processes`
//! is refused there: NVIDIA's `nvmlDeviceGetProcessUtilization` is not supported with MIG on),
//! only memory per MIG device; a GPU's memory in use is `memoryUsedMiB`, else the sum of its
//! processes' (or of its MIG devices') memory. `processes` is refused with `count` above 1 (a
//! PID runs on one GPU), as are a repeated PID, a percent above 100, memory above the GPU's,
//! and more than [`MAX_PROCESSES`] processes, each error naming its path
//! (`gpus[0].processes[2].smUtil`).
//!
//! `memoryLimits` are what [`GpuSource::memory_limits`] reads back for a cgroup, on a node
//! whose `driverVersion` is R615 or later and whose `cgroupVersion` is 2 (elsewhere the GPU
//! does not take limits, as with NVML); a cgroup not listed has none. A path that is not
//! absolute or has `..`, a hard limit above the GPU's memory, a soft limit above the hard one
//! and more than [`MAX_PROCESSES`] entries are refused with their path.

use crate::device_health::Health;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::mig::{self, Profile};
use super::topology::{Link, PathLevel, Topology, MAX_NVLINKS};
use super::{
    CreatedMig, Gpu, GpuSource, Inventory, InventoryError, MigDevice, MigGeometry, XidEvent,
};
use crate::inventory::sample::{
    GpuSample, LimitReading, LimitsRead, MigSample, ProcessSample, NO_HARD_LIMIT,
};
use crate::policy::Limits;

/// Most GPU slices one GPU has for MIG devices (A100, H100, H200: 7).
pub const MAX_GPU_SLICES: u32 = 7;
/// Most GPUs a simulated node may have, and so the largest `count` of one entry: 64 (the
/// largest real nodes have 8 or 16; the shipped nodes and the benchmarks use 8). Checked
/// before anything is expanded, so `count: 4294967295` costs nothing.
pub const MAX_GPUS: u32 = 64;
/// Most MIG devices one GPU has (NVIDIA: 7 on A100, A30 has 4, H100 and H200 7), and so the
/// largest `count` of one MIG entry.
pub const MAX_MIG_DEVICES: u32 = 7;
/// Most `processes` one simulated GPU may list: 1024 (a real GPU runs a few dozen at most;
/// MPS allows 48 clients per device on Volta and later).
pub const MAX_PROCESSES: usize = 1024;
/// Bytes in a MiB.
const MIB: u64 = 1024 * 1024;

mod mig_state;
mod placement;
mod schema;

use mig_state::{MigState, Refusal};
use placement::Listed;
use schema::{GpuEntry, HealthValue, LimitEntry, MigEntry, NodeFile, PcieValue};

/// A GPU's MIG devices, each with its memory in use, MiB.
type MigDevices = Vec<(MigDevice, u64)>;

/// Per (GPU UUID, cgroup path): the limits a simulated node's `memoryLimits` list.
type LimitTable = std::collections::BTreeMap<(String, String), LimitReading>;

/// Reads GPUs from a simulated node file.
#[derive(Debug, Clone)]
pub struct SimulatedSource {
    path: PathBuf,
    /// Xid last seen per GPU UUID, so an `xid:` line reports once until it changes.
    seen_xids: std::collections::BTreeMap<String, u64>,
    events: Vec<XidEvent>,
    proc_root: PathBuf,
    /// The `memoryLimits` of the last sample's read of the file; `None` where the node takes no
    /// limits (driver before R615, cgroup v1).
    limits: Option<LimitTable>,
}

impl SimulatedSource {
    /// A source reading `path` at every [`GpuSource::discover`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SimulatedSource {
            path: path.into(),
            seen_xids: Default::default(),
            events: Vec::new(),
            proc_root: PathBuf::from("/"),
            limits: None,
        }
    }

    /// Reads the nvidia-caps MIG minors under `root` instead of `/`
    /// (`<root>/proc/driver/nvidia-caps/mig-minors`; see [`mig::resolve_caps`]).
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.proc_root = root.into();
        self
    }

    /// The node as it is now: the node file read and parsed with its MIG state file applied,
    /// and that state.
    fn read_node(&self) -> Result<(Parsed, MigState), InventoryError> {
        let text = read(&self.path)?;
        let state = MigState::read(&self.path)?;
        let parsed = parse_all(&self.path, &text, &state)?;
        Ok((parsed, state))
    }

    /// The node's inventory now, the nvidia-caps minors resolved, and its `xid:` lines.
    fn inventory_now(&self) -> Result<(Inventory, Vec<(String, u64)>), InventoryError> {
        let (parsed, _) = self.read_node()?;
        let mut inv = parsed.inventory;
        mig::resolve_caps(&mut inv, &self.proc_root);
        Ok((inv, parsed.xids))
    }
}

impl GpuSource for SimulatedSource {
    fn discover(&mut self) -> Result<Inventory, InventoryError> {
        let (inv, xids) = self.inventory_now()?;
        let mut seen = std::collections::BTreeMap::new();
        for (uuid, xid) in xids {
            if self.seen_xids.get(&uuid) != Some(&xid) {
                self.events.push(XidEvent {
                    uuid: uuid.clone(),
                    xid,
                });
            }
            seen.insert(uuid, xid);
        }
        self.seen_xids = seen;
        Ok(inv)
    }

    fn take_events(&mut self) -> Vec<XidEvent> {
        std::mem::take(&mut self.events)
    }

    /// Re-reads the node file (bounded, as [`GpuSource::discover`] does) and reports its use
    /// figures (see the module documentation).
    fn sample(&mut self) -> Result<Vec<GpuSample>, InventoryError> {
        let (parsed, _) = self.read_node()?;
        self.limits = parsed
            .inventory
            .memory_limits_unsupported()
            .is_none()
            .then_some(parsed.limits);
        Ok(parsed.samples)
    }

    /// Whether the last sample's read found a node that takes limits (driver R615 or later,
    /// cgroup v2).
    fn memory_limits_supported(&mut self, _uuid: &str) -> Option<bool> {
        Some(self.limits.is_some())
    }

    /// The `memoryLimits` entry of (`uuid`, `cgroup`) from the last sample's read; no limit
    /// for a cgroup not listed.
    fn memory_limits(&mut self, uuid: &str, cgroup: &str) -> LimitsRead {
        let Some(table) = &self.limits else {
            return LimitsRead::Unsupported;
        };
        let none = LimitReading {
            soft: 0,
            hard: NO_HARD_LIMIT,
            used: 0,
        };
        let key = (uuid.to_string(), cgroup.to_string());
        LimitsRead::Read(table.get(&key).copied().unwrap_or(none))
    }

    /// Creates the instance as NVIDIA's driver would (see the module documentation) and
    /// records it in the node's MIG state file.
    fn create_mig(
        &mut self,
        parent_uuid: &str,
        profile: &str,
        start: u32,
    ) -> Result<CreatedMig, InventoryError> {
        let failed = |reason: String| InventoryError::MigCreate {
            uuid: parent_uuid.to_string(),
            profile: profile.to_string(),
            start,
            reason,
        };
        let (parsed, mut state) = self.read_node()?;
        let created = parsed
            .inventory
            .by_uuid(parent_uuid)
            .ok_or_else(|| Refusal::not_found("no such GPU"))
            .and_then(|gpu| state.create(gpu, profile, start))
            .map_err(|r| failed(r.nvml.to_string()))?;
        state
            .write()
            .map_err(|e| failed(format!("writing {}: {e}", state.file().display())))?;
        let (inv, _) = self.inventory_now()?;
        let device = inv
            .by_uuid(parent_uuid)
            .and_then(|g| g.mig_devices.iter().find(|d| d.uuid == created.uuid))
            .cloned()
            .unwrap_or(created);
        Ok(CreatedMig {
            parent_uuid: parent_uuid.to_string(),
            device,
        })
    }

    /// Destroys the instance as NVIDIA's driver would (a created one or one the node file
    /// lists; one that does not exist is success) and records it in the node's MIG state file.
    fn destroy_mig(
        &mut self,
        parent_uuid: &str,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), InventoryError> {
        let failed = |reason: String| InventoryError::MigDestroy {
            uuid: parent_uuid.to_string(),
            gi_id,
            ci_id,
            reason,
        };
        let (parsed, mut state) = self.read_node()?;
        let destroyed = parsed
            .inventory
            .by_uuid(parent_uuid)
            .ok_or_else(|| Refusal::not_found("no such GPU"))
            .and_then(|gpu| state.destroy(gpu, gi_id, ci_id))
            .map_err(|r| failed(r.nvml.to_string()))?;
        if destroyed {
            state
                .write()
                .map_err(|e| failed(format!("writing {}: {e}", state.file().display())))?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("simulated node {}", self.path.display())
    }
}

fn invalid(path: &Path, at: &str, message: impl Into<String>) -> InventoryError {
    InventoryError::SimulatedInvalid {
        path: path.to_path_buf(),
        path_in_file: at.to_string(),
        location: None,
        message: message.into(),
    }
}

/// Reads a simulated node file within the policy's [`Limits`] (regular file, 1 MiB, nesting;
/// see [`crate::policy::read_bounded`]).
///
/// # Errors
/// [`InventoryError::SimulatedRead`] whose source is the [`crate::policy::ReadError`] (wrapped
/// in an [`std::io::Error`] of kind `InvalidData` when the file was refused, so it can be
/// downcast).
pub fn read(path: &Path) -> Result<String, InventoryError> {
    crate::policy::read_bounded(path, &Limits::default()).map_err(|e| {
        let source = match e {
            crate::policy::ReadError::Io { source, .. } => source,
            refused => std::io::Error::new(std::io::ErrorKind::InvalidData, refused),
        };
        InventoryError::SimulatedRead {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Parses a simulated node file's text. `path` is only used in error messages. The text is
/// checked against the default [`Limits`] nesting (as [`read`] does) before parsing, and a
/// leading UTF-8 byte-order mark is ignored.
///
/// # Errors
/// [`InventoryError::SimulatedInvalid`] with the field path (`gpus[1].uuid`) and, for syntax and
/// type errors, line and column.
pub fn parse(path: &Path, text: &str) -> Result<Inventory, InventoryError> {
    parse_all(path, text, &MigState::default()).map(|p| p.inventory)
}

/// Everything a node file says.
struct Parsed {
    inventory: Inventory,
    /// The `xid:` lines as (GPU UUID, Xid).
    xids: Vec<(String, u64)>,
    /// The use figures, one per GPU in index order.
    samples: Vec<GpuSample>,
    /// Every GPU's `memoryLimits`.
    limits: LimitTable,
}

/// The `memoryLimits` of the GPU entry `at`, checked (see the module documentation), as
/// (cgroup path, limits in bytes).
fn limits_of(
    path: &Path,
    at: &str,
    entry: &GpuEntry,
) -> Result<Vec<(String, LimitReading)>, InventoryError> {
    let entries: &[LimitEntry] = entry.memory_limits.as_deref().unwrap_or_default();
    if entries.len() > MAX_PROCESSES {
        return Err(invalid(
            path,
            &format!("{at}.memoryLimits"),
            format!("more than {MAX_PROCESSES} entries"),
        ));
    }
    let mut out = Vec::with_capacity(entries.len());
    for (k, l) in entries.iter().enumerate() {
        let lk = format!("{at}.memoryLimits[{k}]");
        if !l.cgroup.starts_with('/') || l.cgroup.split('/').any(|c| c == "..") {
            return Err(invalid(
                path,
                &format!("{lk}.cgroup"),
                format!(
                    "{:.200} is not an absolute cgroup path without ..",
                    l.cgroup
                ),
            ));
        }
        if l.hard_mib > entry.memory_mib {
            return Err(invalid(
                path,
                &format!("{lk}.hardMiB"),
                format!(
                    "{} MiB is more than the GPU's {} MiB",
                    l.hard_mib, entry.memory_mib
                ),
            ));
        }
        if l.soft_mib > l.hard_mib {
            return Err(invalid(
                path,
                &format!("{lk}.softMiB"),
                format!("{} MiB is more than hardMiB {}", l.soft_mib, l.hard_mib),
            ));
        }
        out.push((
            l.cgroup.clone(),
            LimitReading {
                soft: l.soft_mib * MIB,
                hard: l.hard_mib * MIB,
                used: 0,
            },
        ));
    }
    Ok(out)
}

/// The `utilization`, `memoryUsedMiB` and `processes` of the GPU entry `at`, checked (see the
/// module documentation), as the entry's GPUs' processes and memory in use (MiB; `None`:
/// from the MIG devices).
fn usage_of(
    path: &Path,
    at: &str,
    entry: &GpuEntry,
    count: u32,
) -> Result<(Vec<ProcessSample>, Option<u64>), InventoryError> {
    check_gpu_figures(path, at, entry)?;
    let Some(list) = &entry.processes else {
        return Ok((
            Vec::new(),
            entry.memory_used_mib.or(entry.mig.is_none().then_some(0)),
        ));
    };
    let pat = format!("{at}.processes");
    check_process_list(path, &pat, entry, list.len(), count)?;
    let mut seen = std::collections::BTreeMap::new();
    let mut total = 0u64;
    let mut out = Vec::with_capacity(list.len());
    for (k, p) in list.iter().enumerate() {
        out.push(process_sample(path, &pat, k, p, entry, &mut seen)?);
        total = total.saturating_add(p.memory_mib);
    }
    if entry.memory_used_mib.is_none() && total > entry.memory_mib {
        return Err(invalid(
            path,
            &pat,
            format!(
                "the processes use {total} MiB, more than the GPU's {} MiB",
                entry.memory_mib
            ),
        ));
    }
    Ok((out, Some(entry.memory_used_mib.unwrap_or(total))))
}

/// Checks the GPU entry `at`'s own `utilization` (a percent) and `memoryUsedMiB` (at most its
/// memory).
fn check_gpu_figures(path: &Path, at: &str, entry: &GpuEntry) -> Result<(), InventoryError> {
    if let Some(u) = entry.utilization {
        if u > 100 {
            return Err(invalid(
                path,
                &format!("{at}.utilization"),
                format!("{u} is more than 100 (percent)"),
            ));
        }
    }
    if let Some(m) = entry.memory_used_mib {
        if m > entry.memory_mib {
            return Err(invalid(
                path,
                &format!("{at}.memoryUsedMiB"),
                format!("{m} MiB is more than the GPU's {} MiB", entry.memory_mib),
            ));
        }
    }
    Ok(())
}

/// Checks that the GPU entry may list `len` processes at `pat` (`gpus[i].processes`): one
/// GPU (`count` 1), MIG off, at most [`MAX_PROCESSES`].
fn check_process_list(
    path: &Path,
    pat: &str,
    entry: &GpuEntry,
    len: usize,
    count: u32,
) -> Result<(), InventoryError> {
    if count > 1 {
        return Err(invalid(
            path,
            pat,
            "only allowed when count is 1 (a PID runs on one GPU)",
        ));
    }
    if entry.mig.is_some() {
        return Err(invalid(
            path,
            pat,
            "not allowed on a MIG-enabled GPU (NVML has no per-process figures with MIG on); give mig.devices[].memoryUsedMiB instead",
        ));
    }
    if len > MAX_PROCESSES {
        return Err(invalid(
            path,
            pat,
            format!("{len} processes, more than the {MAX_PROCESSES} a simulated GPU may list"),
        ));
    }
    Ok(())
}

/// The `k`-th process of the list at `pat`, checked (a positive PID not in `seen` yet, which
/// records it; percent and memory within bounds).
fn process_sample(
    path: &Path,
    pat: &str,
    k: usize,
    p: &schema::ProcessEntry,
    entry: &GpuEntry,
    seen: &mut std::collections::BTreeMap<u32, usize>,
) -> Result<ProcessSample, InventoryError> {
    let pk = format!("{pat}[{k}]");
    if p.pid == 0 {
        return Err(invalid(path, &format!("{pk}.pid"), "must be positive"));
    }
    if let Some(first) = seen.insert(p.pid, k) {
        return Err(invalid(
            path,
            &format!("{pk}.pid"),
            format!("PID {} is listed already at processes[{first}]", p.pid),
        ));
    }
    if p.sm_util > 100 {
        return Err(invalid(
            path,
            &format!("{pk}.smUtil"),
            format!("{} is more than 100 (percent)", p.sm_util),
        ));
    }
    if p.memory_mib > entry.memory_mib {
        return Err(invalid(
            path,
            &format!("{pk}.memoryMiB"),
            format!(
                "{} MiB is more than the GPU's {} MiB",
                p.memory_mib, entry.memory_mib
            ),
        ));
    }
    Ok(ProcessSample {
        pid: p.pid,
        sm_util_percent: Some(p.sm_util),
        memory_used_bytes: Some(p.memory_mib * MIB),
        pod_uid: None,
        container_id: None,
        cgroup: None,
    })
}

/// The GPUs of a node file and what they report, as its entries are expanded.
#[derive(Default)]
struct Expanded {
    gpus: Vec<Gpu>,
    xids: Vec<(String, u64)>,
    samples: Vec<GpuSample>,
    limits: LimitTable,
}

/// Parses a node file into its inventory, Xids and use figures, with the MIG instances
/// `state` records created and destroyed.
fn parse_all(path: &Path, text: &str, state: &MigState) -> Result<Parsed, InventoryError> {
    let file = deserialize(path, text)?;
    let mut node = Expanded::default();
    for (i, entry) in file.gpus.iter().enumerate() {
        expand_entry(path, i, entry, state, &mut node)?;
    }
    let mut seen = std::collections::BTreeSet::new();
    for g in &node.gpus {
        if !seen.insert(g.uuid.clone()) {
            return Err(invalid(
                path,
                "gpus",
                format!("UUID {} appears twice", g.uuid),
            ));
        }
    }
    let links = links(path, &file, &node.gpus)?;
    let inventory = node_inventory(path, &file, node.gpus, links)?;
    Ok(Parsed {
        inventory,
        xids: node.xids,
        samples: node.samples,
        limits: node.limits,
    })
}

/// The node file's text (a leading byte-order mark ignored) as its schema, its nesting
/// checked first; errors name the field path and, where known, line and column.
fn deserialize(path: &Path, text: &str) -> Result<NodeFile, InventoryError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    crate::policy::check_nesting(text, &Limits::default()).map_err(|e| {
        let line = match e {
            crate::policy::NestingError::Flow { line, .. }
            | crate::policy::NestingError::Indent { line, .. } => line,
        };
        InventoryError::SimulatedInvalid {
            path: path.to_path_buf(),
            path_in_file: ".".to_string(),
            location: Some((line, 1)),
            message: e.to_string(),
        }
    })?;
    let de = yaml_serde::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let location = e.inner().location().map(|l| (l.line(), l.column()));
        let mut message = e.inner().to_string();
        if let Some((l, c)) = location {
            if let Some(s) = message.strip_suffix(&format!(" at line {l} column {c}")) {
                message = s.to_string();
            }
        }
        let at = e.path().to_string();
        let message = crate::policy::strip_yaml_path(&message, &at).to_string();
        InventoryError::SimulatedInvalid {
            path: path.to_path_buf(),
            path_in_file: at,
            location,
            message,
        }
    })
}

/// The node-wide settings: the checked `driverVersion` and `cgroupVersion` on an inventory of
/// `gpus` and `links`.
fn node_inventory(
    path: &Path,
    file: &NodeFile,
    gpus: Vec<Gpu>,
    links: Topology,
) -> Result<Inventory, InventoryError> {
    if let Some(v) = &file.driver_version {
        if v.len() > 64 || !v.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Err(invalid(
                path,
                "driverVersion",
                format!("{v:.64} is not a driver version (digits and dots, e.g. 550.54.15)"),
            ));
        }
    }
    let mut inventory = Inventory::new(gpus).with_links(links);
    inventory.driver_version.clone_from(&file.driver_version);
    inventory.cgroup_v2 = match file.cgroup_version {
        None | Some(2) => true,
        Some(1) => false,
        Some(v) => {
            return Err(invalid(
                path,
                "cgroupVersion",
                format!("{v} is not a cgroup version (1 or 2)"),
            ))
        }
    };
    Ok(inventory)
}

/// Checks the GPU entry `at` that would add `count` GPUs after the node's first `index`:
/// at least one, within [`MAX_GPUS`], `uuid` only for one.
fn check_count(path: &Path, at: &str, entry: &GpuEntry, index: u32) -> Result<u32, InventoryError> {
    let count = entry.count.unwrap_or(1);
    if count == 0 {
        return Err(invalid(path, &format!("{at}.count"), "must be at least 1"));
    }
    if count > MAX_GPUS {
        return Err(invalid(
            path,
            &format!("{at}.count"),
            format!("{count} is more than the {MAX_GPUS} GPUs a simulated node may have"),
        ));
    }
    if index.saturating_add(count) > MAX_GPUS {
        return Err(invalid(
            path,
            &format!("{at}.count"),
            format!("the node would have more than {MAX_GPUS} GPUs"),
        ));
    }
    if entry.uuid.is_some() && count != 1 {
        return Err(invalid(
            path,
            &format!("{at}.uuid"),
            "only allowed when count is 1",
        ));
    }
    Ok(count)
}

/// Checks the GPU entry `at`'s model, memory and `pcieRoot`, and returns its compute
/// capability.
fn check_identity(
    path: &Path,
    at: &str,
    entry: &GpuEntry,
) -> Result<Option<(u32, u32)>, InventoryError> {
    if entry.model.trim().is_empty() {
        return Err(invalid(path, &format!("{at}.model"), "must not be empty"));
    }
    if entry.memory_mib == 0 {
        return Err(invalid(
            path,
            &format!("{at}.memoryMiB"),
            "must be positive",
        ));
    }
    let cc = match &entry.compute_capability {
        None => None,
        Some(s) => Some(
            s.split_once('.')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .ok_or_else(|| {
                    invalid(
                        path,
                        &format!("{at}.computeCapability"),
                        format!("`{s}` is not like \"9.0\""),
                    )
                })?,
        ),
    };
    if let Some(r) = entry.pcie_root.as_deref() {
        if !super::is_pcie_root(r) {
            return Err(invalid(
                path,
                &format!("{at}.pcieRoot"),
                format!(
                    "`{}` is not a PCIe root complex like pci0000:00",
                    crate::uuid::truncate_id(r)
                ),
            ));
        }
    }
    Ok(cc)
}

/// The entry's `pciDeviceId` (hex, with or without `0x`), when given.
fn pci_device_id(path: &Path, at: &str, entry: &GpuEntry) -> Result<Option<u32>, InventoryError> {
    let Some(s) = entry.pci_device_id.as_deref() else {
        return Ok(None);
    };
    let hex = s.trim_start_matches("0x").trim_start_matches("0X");
    u32::from_str_radix(hex, 16).map(Some).map_err(|_| {
        invalid(
            path,
            &format!("{at}.pciDeviceId"),
            format!(
                "`{}` is not a PCI device ID like \"0x233010DE\"",
                crate::uuid::truncate_id(s)
            ),
        )
    })
}

/// The UUID of the GPU with `index` of the entry `at`: its checked `uuid`, else derived from
/// the model and the index.
fn gpu_uuid(path: &Path, at: &str, entry: &GpuEntry, index: u32) -> Result<String, InventoryError> {
    Ok(match &entry.uuid {
        Some(u) => match crate::uuid::Uuid::parse(u) {
            Ok(v) if v.kind() == crate::uuid::UuidKind::Gpu => v.into_string(),
            Ok(_) => {
                return Err(invalid(
                    path,
                    &format!("{at}.uuid"),
                    format!("`{u}` does not start with GPU-"),
                ))
            }
            Err(e) => return Err(invalid(path, &format!("{at}.uuid"), e.to_string())),
        },
        None => derive_uuid("GPU", &format!("{}/{index}", entry.model)),
    })
}

/// Expands the `i`-th GPU entry into `node`: its `count` GPUs with their samples, limits and
/// Xids.
fn expand_entry(
    path: &Path,
    i: usize,
    entry: &GpuEntry,
    state: &MigState,
    node: &mut Expanded,
) -> Result<(), InventoryError> {
    let at = format!("gpus[{i}]");
    let count = check_count(path, &at, entry, node.gpus.len() as u32)?;
    let cc = check_identity(path, &at, entry)?;
    let (processes, memory_used_mib) = usage_of(path, &at, entry, count)?;
    let cgroup_limits = limits_of(path, &at, entry)?;
    for _ in 0..count {
        let index = node.gpus.len() as u32;
        let uuid = gpu_uuid(path, &at, entry, index)?;
        let (mig_devices, mig_geometry) = gpu_mig(path, &at, entry, &uuid, state)?;
        let mig: Vec<MigSample> = mig_devices
            .iter()
            .map(|(d, used)| MigSample {
                uuid: d.uuid.clone(),
                utilization_percent: None,
                memory_used_bytes: Some(used * MIB),
                memory_total_bytes: Some(d.memory_mib * MIB),
            })
            .collect();
        let used_mib =
            memory_used_mib.unwrap_or_else(|| mig_devices.iter().map(|(_, used)| used).sum());
        for (cgroup, reading) in &cgroup_limits {
            node.limits.insert((uuid.clone(), cgroup.clone()), *reading);
        }
        node.samples.push(GpuSample {
            uuid: uuid.clone(),
            index,
            model: entry.model.clone(),
            utilization_percent: entry.utilization,
            memory_used_bytes: Some(used_mib.saturating_mul(MIB)),
            memory_total_bytes: Some(entry.memory_mib.saturating_mul(MIB)),
            processes: processes.clone(),
            mig,
            ..GpuSample::default()
        });
        if let Some(x) = entry.xid {
            node.xids.push((uuid.clone(), x));
        }
        node.gpus.push(Gpu {
            index,
            uuid,
            model: entry.model.clone(),
            memory_mib: entry.memory_mib,
            minor: Some(index),
            compute_capability: cc,
            numa_node: entry.numa_node,
            pcie_root: entry.pcie_root.clone(),
            pci_device_id: pci_device_id(path, &at, entry)?,
            mig_enabled: entry.mig.is_some(),
            mig_devices: mig_devices.into_iter().map(|(d, _)| d).collect(),
            mig_geometry,
            health: Health::from_bool(entry.health != Some(HealthValue::Unhealthy)),
        });
    }
    Ok(())
}

/// The `links:` and `nvswitch:` of a node file as a [`Topology`]: a pair not listed is
/// derived from `numaNode` (`node` on the same node, `system` otherwise), a listed pair
/// without `pcie` too; `nvswitch: true` makes every pair all-to-all over NVSwitch.
fn links(path: &Path, file: &NodeFile, gpus: &[Gpu]) -> Result<Topology, InventoryError> {
    let mut out = Topology::default();
    if file.links.is_empty() && !file.nvswitch {
        return Ok(out);
    }
    let numa = |i: u32| gpus.get(i as usize).and_then(|g| g.numa_node);
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            let mut l = Link::pcie(PathLevel::from_numa(a.numa_node, b.numa_node));
            l.nvswitch = file.nvswitch;
            out.set(a.index, b.index, l);
        }
    }
    let mut listed = std::collections::BTreeMap::new();
    for (i, entry) in file.links.iter().enumerate() {
        let at = format!("links[{i}]");
        let [a, b] = entry.gpus;
        for g in [a, b] {
            if g as usize >= gpus.len() {
                return Err(invalid(
                    path,
                    &format!("{at}.gpus"),
                    format!(
                        "GPU {g} does not exist (this node has GPUs 0-{})",
                        gpus.len().saturating_sub(1)
                    ),
                ));
            }
        }
        if a == b {
            return Err(invalid(
                path,
                &format!("{at}.gpus"),
                format!("names GPU {a} twice; a link joins two GPUs"),
            ));
        }
        if let Some(first) = listed.insert((a.min(b), a.max(b)), i) {
            return Err(invalid(
                path,
                &format!("{at}.gpus"),
                format!("GPUs {a} and {b} are listed already in links[{first}]"),
            ));
        }
        if entry.nvlinks.is_none() && entry.pcie.is_none() {
            return Err(invalid(path, &at, "needs nvlinks or pcie"));
        }
        let nvlinks = entry.nvlinks.unwrap_or(0);
        if nvlinks > MAX_NVLINKS {
            return Err(invalid(
                path,
                &format!("{at}.nvlinks"),
                format!("{nvlinks} is more than the {MAX_NVLINKS} NVLinks a GPU has"),
            ));
        }
        let pcie = match entry.pcie {
            Some(PcieValue::Single) => PathLevel::Single,
            Some(PcieValue::Multiple) => PathLevel::Multiple,
            Some(PcieValue::Hostbridge) => PathLevel::HostBridge,
            None => PathLevel::from_numa(numa(a), numa(b)),
        };
        out.set(
            a,
            b,
            Link {
                nvlinks,
                nvswitch: file.nvswitch,
                pcie,
            },
        );
    }
    Ok(out)
}

/// A UUID-shaped identifier (`<kind>-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) derived from `seed`.
fn derive_uuid(kind: &str, seed: &str) -> String {
    let h = Sha256::digest(seed.as_bytes());
    let hex: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{kind}-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The MIG devices of one GPU of the entry `at` (with UUID `uuid`), each with its memory in
/// use (MiB), and its geometry: the file's devices laid out and placed, then what `state`
/// records created and destroyed. No devices and no geometry when MIG is off.
fn gpu_mig(
    path: &Path,
    at: &str,
    entry: &GpuEntry,
    uuid: &str,
    state: &MigState,
) -> Result<(MigDevices, Option<MigGeometry>), InventoryError> {
    let Some(m) = &entry.mig else {
        return Ok((Vec::new(), None));
    };
    let mut listed = mig_layout(path, at, m, uuid)?;
    let geometry = MigGeometry::from_table(&entry.model, entry.memory_mib);
    match &geometry {
        Some(g) => placement::place(path, at, &entry.model, g, &mut listed)?,
        None => {
            if let Some(l) = listed.iter().find(|l| l.start.is_some()) {
                return Err(invalid(
                    path,
                    &format!("{at}.mig.devices[{}].placementStart", l.entry),
                    format!("{} has no MIG profile table to place it by", entry.model),
                ));
            }
        }
    }
    let mut devices: Vec<(MigDevice, u64)> =
        listed.into_iter().map(|l| (l.device, l.used_mib)).collect();
    state.apply(uuid, geometry.as_ref(), &mut devices)?;
    Ok((devices, geometry))
}

/// The MIG devices of one GPU entry (see the module documentation for the numbering), each
/// with its memory in use, MiB, not placed yet.
fn mig_layout(
    path: &Path,
    at: &str,
    entry: &MigEntry,
    gpu_uuid: &str,
) -> Result<Vec<Listed>, InventoryError> {
    let mut out: Vec<Listed> = Vec::new();
    let mut slices = 0u32;
    for (j, d) in entry.devices.iter().enumerate() {
        let p = Profile::parse(&d.profile).ok_or_else(|| {
            invalid(
                path,
                &format!("{at}.mig.devices[{j}].profile"),
                format!(
                    "`{}` is not a MIG profile like 1g.10gb, 1g.24gb+me or 1c.3g.40gb",
                    d.profile
                ),
            )
        })?;
        let count = d.count.unwrap_or(1);
        if count == 0 {
            return Err(invalid(
                path,
                &format!("{at}.mig.devices[{j}].count"),
                "must be at least 1",
            ));
        }
        if d.placement_start.is_some() && count != 1 {
            return Err(invalid(
                path,
                &format!("{at}.mig.devices[{j}].placementStart"),
                "only allowed when count is 1",
            ));
        }
        let used = d.memory_used_mib.unwrap_or(0);
        if used > p.memory_gb * 1024 {
            return Err(invalid(
                path,
                &format!("{at}.mig.devices[{j}].memoryUsedMiB"),
                format!(
                    "{used} MiB is more than the {} MiB of a {}",
                    p.memory_gb * 1024,
                    d.profile
                ),
            ));
        }
        // Every profile uses at least one of the GPU's 7 slices, so the slice check below
        // stops the expansion by the 8th device whatever `count` says (MAX_MIG_DEVICES).
        for _ in 0..count {
            slices = slices.saturating_add(p.gpu_slices);
            if slices > MAX_GPU_SLICES {
                return Err(invalid(
                    path,
                    &format!("{at}.mig.devices"),
                    format!("the MIG devices use more than the GPU's {MAX_GPU_SLICES} GPU slices"),
                ));
            }
            let m = out.len() as u32;
            let uuid = derive_uuid("MIG", &format!("{gpu_uuid}/{m}"));
            out.push(Listed {
                device: MigDevice::laid_out(m, uuid, &d.profile, &p),
                used_mib: used,
                entry: j,
                start: d.placement_start,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod usage_tests;

#[cfg(test)]
mod hostile_tests;

#[cfg(test)]
mod link_tests;

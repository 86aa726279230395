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
//!     health: Healthy                # optional: Healthy (default) or Unhealthy
//!     xid: 79                        # optional: an Xid reported when this line appears
//!     mig:                           # optional: present means MIG mode is on
//!       devices:
//!         - profile: 1g.10gb
//!           count: 7
//! ```
//!
//! UUIDs not given are derived deterministically from the model and the GPU index (same file,
//! same UUIDs). Unknown keys are errors with their path.
//!
//! MIG devices are numbered 0, 1, … in file order on their GPU and get GPU-instance ids 1, 2, …
//! in that order with compute-instance id 0 (one full-size compute instance each); their memory
//! is the profile's nominal GB × 1024 MiB. A profile must be spelled as NVIDIA spells it
//! (`1g.10gb`, `1g.24gb+me`, `1c.3g.40gb`), and a GPU's MIG devices may use at most 7 GPU
//! slices, as on every MIG-capable GPU. Use the profiles the model really offers (the tests check
//! the shipped nodes against `../shared/fixtures/gpu-models.yaml`). `mig:` without devices is a
//! MIG-enabled GPU on which no instance was created yet.

use crate::health::Health;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::mig::{self, Profile};
use super::{Gpu, GpuSource, Inventory, InventoryError, MigDevice, XidEvent};
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    gpus: Vec<GpuEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GpuEntry {
    model: String,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    count: Option<u32>,
    uuid: Option<String>,
    compute_capability: Option<String>,
    numa_node: Option<i64>,
    health: Option<HealthValue>,
    xid: Option<u64>,
    mig: Option<MigEntry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum HealthValue {
    Healthy,
    Unhealthy,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigEntry {
    #[serde(default)]
    devices: Vec<MigDeviceEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigDeviceEntry {
    profile: String,
    count: Option<u32>,
}

/// Reads GPUs from a simulated node file.
#[derive(Debug, Clone)]
pub struct SimulatedSource {
    path: PathBuf,
    /// Xid last seen per GPU UUID, so an `xid:` line reports once until it changes.
    seen_xids: std::collections::BTreeMap<String, u64>,
    events: Vec<XidEvent>,
    proc_root: PathBuf,
}

impl SimulatedSource {
    /// A source reading `path` at every [`GpuSource::discover`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SimulatedSource {
            path: path.into(),
            seen_xids: Default::default(),
            events: Vec::new(),
            proc_root: PathBuf::from("/"),
        }
    }

    /// Reads the nvidia-caps MIG minors under `root` instead of `/`
    /// (`<root>/proc/driver/nvidia-caps/mig-minors`; see [`mig::resolve_caps`]).
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.proc_root = root.into();
        self
    }
}

impl GpuSource for SimulatedSource {
    fn discover(&mut self) -> Result<Inventory, InventoryError> {
        let text = read(&self.path)?;
        let (mut inv, xids) = parse_with_xids(&self.path, &text)?;
        mig::resolve_caps(&mut inv, &self.proc_root);
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
    parse_with_xids(path, text).map(|(inv, _)| inv)
}

/// [`parse`], plus the `xid:` lines as (GPU UUID, Xid).
fn parse_with_xids(
    path: &Path,
    text: &str,
) -> Result<(Inventory, Vec<(String, u64)>), InventoryError> {
    let mut xids = Vec::new();
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    crate::policy::read::check_nesting(text, &Limits::default()).map_err(|e| {
        let line = match e {
            crate::policy::read::NestingError::Flow { line, .. }
            | crate::policy::read::NestingError::Indent { line, .. } => line,
        };
        InventoryError::SimulatedInvalid {
            path: path.to_path_buf(),
            path_in_file: ".".to_string(),
            location: Some((line, 1)),
            message: e.to_string(),
        }
    })?;
    let de = yaml_serde::Deserializer::from_str(text);
    let file: NodeFile = serde_path_to_error::deserialize(de).map_err(|e| {
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
    })?;
    let mut gpus = Vec::new();
    let mut index = 0u32;
    for (i, entry) in file.gpus.iter().enumerate() {
        let at = format!("gpus[{i}]");
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
        for _ in 0..count {
            let uuid = match &entry.uuid {
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
            };
            let mut mig_devices = Vec::new();
            if let Some(m) = &entry.mig {
                mig_devices = mig_layout(path, &at, m, &uuid)?;
            }
            gpus.push(Gpu {
                index,
                uuid,
                model: entry.model.clone(),
                memory_mib: entry.memory_mib,
                minor: Some(index),
                compute_capability: cc,
                numa_node: entry.numa_node,
                mig_enabled: entry.mig.is_some(),
                mig_devices,
                health: Health::from_bool(entry.health != Some(HealthValue::Unhealthy)),
            });
            if let Some(x) = entry.xid {
                xids.push((gpus.last().expect("pushed").uuid.clone(), x));
            }
            index += 1;
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for g in &gpus {
        if !seen.insert(g.uuid.clone()) {
            return Err(invalid(
                path,
                "gpus",
                format!("UUID {} appears twice", g.uuid),
            ));
        }
    }
    Ok((Inventory::new(gpus), xids))
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

/// The MIG devices of one GPU entry (see the module documentation for the numbering).
fn mig_layout(
    path: &Path,
    at: &str,
    entry: &MigEntry,
    gpu_uuid: &str,
) -> Result<Vec<MigDevice>, InventoryError> {
    let mut out: Vec<MigDevice> = Vec::new();
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
            out.push(MigDevice::laid_out(m, uuid, &d.profile, &p));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_counts_and_derives_stable_uuids() {
        let text = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 2\n    numaNode: 1\n";
        let a = parse(Path::new("n.yaml"), text).unwrap();
        let b = parse(Path::new("n.yaml"), text).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.gpus.len(), 2);
        assert_eq!(a.gpus[1].index, 1);
        assert_eq!(a.gpus[1].numa_node, Some(1));
        assert_ne!(a.gpus[0].uuid, a.gpus[1].uuid);
        assert!(a.gpus[0].uuid.starts_with("GPU-") && a.gpus[0].uuid.len() == 40);
    }

    #[test]
    fn unknown_key_names_its_path() {
        let text = "gpus:\n  - model: X\n    memoryMiB: 1\n    memory: 2\n";
        let e = parse(Path::new("n.yaml"), text).unwrap_err().to_string();
        assert!(e.contains("gpus[0].memory:"), "{e}");
        assert!(e.contains("line 4"), "{e}");
    }

    #[test]
    fn xid_lines_report_once_until_they_change() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("n.yaml");
        let mut src = SimulatedSource::new(&p);
        std::fs::write(
            &p,
            "gpus:\n  - model: X\n    memoryMiB: 1\n  - model: X\n    memoryMiB: 1\n    xid: 79\n",
        )
        .unwrap();
        let inv = src.discover().unwrap();
        let ev = src.take_events();
        assert_eq!(
            ev,
            [XidEvent {
                uuid: inv.gpus[1].uuid.clone(),
                xid: 79
            }]
        );
        src.discover().unwrap();
        assert!(src.take_events().is_empty(), "same line, no new event");
        std::fs::write(
            &p,
            "gpus:\n  - model: X\n    memoryMiB: 1\n  - model: X\n    memoryMiB: 1\n    xid: 48\n",
        )
        .unwrap();
        src.discover().unwrap();
        assert_eq!(src.take_events()[0].xid, 48);
    }

    #[test]
    fn uuid_only_with_count_one() {
        let text = "gpus:\n  - model: X\n    memoryMiB: 1\n    count: 2\n    uuid: GPU-1\n";
        let e = parse(Path::new("n.yaml"), text).unwrap_err().to_string();
        assert!(e.contains("gpus[0].uuid"), "{e}");
    }

    #[test]
    fn mig_devices_are_expanded() {
        let text = "gpus:\n  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n    mig:\n      devices:\n        - profile: 1g.5gb\n          count: 7\n";
        let inv = parse(Path::new("n.yaml"), text).unwrap();
        assert!(inv.gpus[0].mig_enabled);
        assert_eq!(inv.gpus[0].mig_devices.len(), 7);
        let last = &inv.gpus[0].mig_devices[6];
        assert_eq!(last.memory_mib, 5 * 1024);
        assert_eq!((last.index, last.gi_id, last.ci_id), (6, 7, 0));
        assert_eq!((last.gpu_slices, last.compute_slices), (1, 1));
        assert!(last.uuid.starts_with("MIG-") && last.uuid.len() == 40);
        assert!(last.health.is_healthy() && last.caps.is_none());
        let uuids: std::collections::BTreeSet<&str> = inv.gpus[0]
            .mig_devices
            .iter()
            .map(|m| m.uuid.as_str())
            .collect();
        assert_eq!(uuids.len(), 7);
    }

    #[test]
    fn mig_layouts_are_checked() {
        let node = |devices: &str| {
            format!("gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig:\n      devices:\n{devices}")
        };
        let cases: &[(&str, Result<Vec<&str>, &str>)] = &[
            (
                "        - profile: 3g.40gb\n          count: 2\n",
                Ok(vec!["3g.40gb", "3g.40gb"]),
            ),
            (
                "        - profile: 2g.20gb\n          count: 3\n        - profile: 1g.10gb+me\n",
                Ok(vec!["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb+me"]),
            ),
            (
                "        - profile: 1g.10gb\n          count: 8\n",
                Err("gpus[0].mig.devices: the MIG devices use more than the GPU's 7 GPU slices"),
            ),
            (
                "        - profile: 4g.40gb\n        - profile: 4g.40gb\n",
                Err("gpus[0].mig.devices: the MIG devices use more"),
            ),
            (
                "        - profile: 1g.10gb\n        - profile: large\n",
                Err("gpus[0].mig.devices[1].profile: `large` is not a MIG profile"),
            ),
            (
                "        - profile: 1g.10gb\n          count: 0\n",
                Err("gpus[0].mig.devices[0].count: must be at least 1"),
            ),
            (
                "        - profile: 1g.10gb\n          slots: 2\n",
                Err("gpus[0].mig.devices[0].slots: unknown field `slots`"),
            ),
        ];
        for (devices, want) in cases {
            let got = parse(Path::new("n.yaml"), &node(devices));
            match (got, want) {
                (Ok(inv), Ok(profiles)) => {
                    let got: Vec<&str> = inv.gpus[0]
                        .mig_devices
                        .iter()
                        .map(|m| m.profile.as_str())
                        .collect();
                    assert_eq!(&got, profiles, "{devices}");
                }
                (Err(e), Err(msg)) => {
                    let e = e.to_string();
                    assert!(e.contains(msg), "{devices}: {e}");
                }
                (got, _) => panic!("{devices}: {got:?}"),
            }
        }
        // `mig:` without devices: MIG on, no instances.
        let inv = parse(
            Path::new("n.yaml"),
            "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig: {}\n",
        )
        .unwrap();
        assert!(inv.gpus[0].mig_enabled && inv.gpus[0].mig_devices.is_empty());
    }

    #[test]
    fn discover_resolves_caps_under_the_proc_root() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.yaml");
        std::fs::write(&node, "gpus:\n  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n    count: 2\n    mig:\n      devices:\n        - profile: 3g.20gb\n          count: 2\n").unwrap();
        let caps_dir = dir.path().join("proc/driver/nvidia-caps");
        std::fs::create_dir_all(&caps_dir).unwrap();
        std::fs::write(caps_dir.join("mig-minors"), mig::standard_mig_minors(2)).unwrap();
        let inv = SimulatedSource::new(&node)
            .with_proc_root(dir.path())
            .discover()
            .unwrap();
        // GPU 1 (minor 1), MIG device 1: GI 2, CI 0 -> 3 + 135 + 2*9 = 156, 157.
        assert_eq!(
            inv.gpus[1].mig_devices[1].caps,
            Some(super::super::MigCaps {
                gi_access: 156,
                ci_access: 157
            })
        );
        // Without the file: no caps, discovery still works.
        let inv = SimulatedSource::new(&node)
            .with_proc_root(dir.path().join("nothing"))
            .discover()
            .unwrap();
        assert!(inv.gpus[0].mig_devices.iter().all(|m| m.caps.is_none()));
    }
}

#[cfg(test)]
mod hostile_tests;

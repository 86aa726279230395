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

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Gpu, GpuSource, Inventory, InventoryError, MigDevice, XidEvent};

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
}

impl SimulatedSource {
    /// A source reading `path` at every [`GpuSource::discover`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SimulatedSource {
            path: path.into(),
            seen_xids: Default::default(),
            events: Vec::new(),
        }
    }
}

impl GpuSource for SimulatedSource {
    fn discover(&mut self) -> Result<Inventory, InventoryError> {
        let text = std::fs::read_to_string(&self.path).map_err(|source| {
            InventoryError::SimulatedRead {
                path: self.path.clone(),
                source,
            }
        })?;
        let (inv, xids) = parse_with_xids(&self.path, &text)?;
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

/// Parses a simulated node file's text. `path` is only used in error messages.
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
                Some(u) if u.starts_with("GPU-") => u.clone(),
                Some(u) => {
                    return Err(invalid(
                        path,
                        &format!("{at}.uuid"),
                        format!("`{u}` does not start with GPU-"),
                    ))
                }
                None => derive_uuid("GPU", &format!("{}/{index}", entry.model)),
            };
            let mut mig_devices = Vec::new();
            if let Some(mig) = &entry.mig {
                for (j, d) in mig.devices.iter().enumerate() {
                    let mem = profile_memory_mib(&d.profile).ok_or_else(|| {
                        invalid(
                            path,
                            &format!("{at}.mig.devices[{j}].profile"),
                            format!("`{}` is not a MIG profile like 1g.10gb", d.profile),
                        )
                    })?;
                    for _ in 0..d.count.unwrap_or(1) {
                        let m = mig_devices.len() as u32;
                        mig_devices.push(MigDevice {
                            index: m,
                            uuid: derive_uuid("MIG", &format!("{uuid}/{m}")),
                            profile: d.profile.clone(),
                            memory_mib: mem,
                        });
                    }
                }
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
                healthy: entry.health != Some(HealthValue::Unhealthy),
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

/// Memory of a MIG profile such as `1g.10gb` or `1g.24gb+me`, in MiB (GB × 1024).
fn profile_memory_mib(profile: &str) -> Option<u64> {
    let base = profile.strip_suffix("+me").unwrap_or(profile);
    let (slices, mem) = base.split_once('.')?;
    slices.strip_suffix('g')?.parse::<u32>().ok()?;
    let gb: u64 = mem.strip_suffix("gb")?.parse().ok()?;
    Some(gb * 1024)
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
        assert_eq!(inv.gpus[0].mig_devices[6].memory_mib, 5 * 1024);
        assert_eq!(profile_memory_mib("1g.24gb+me"), Some(24 * 1024));
        assert_eq!(profile_memory_mib("big"), None);
    }
}

//! The prepared claims, kept in a JSON file so that a restarted daemon answers the kubelet's
//! repeated `NodePrepareResources` (it calls again after its own restart) and
//! `NodeUnprepareResources` as before, and keeps refusing devices another claim holds.
//!
//! The file (`<--dra-plugins-dir>/<driver>/checkpoint.json`) is written atomically: a
//! temporary file in the same directory, fsynced, then renamed over the old one (a crash
//! leaves the old or the new file, never half of one). It is read through
//! [`crate::policy::read_bounded`] (a regular file, at most [`MAX_CHECKPOINT_BYTES`]); a file
//! that cannot be used is an error naming it: one of another version (a rollback) or one that
//! cannot be read (permissions) keeps DRA down, retried, rather than forget what was prepared;
//! a corrupt one (not JSON, empty, not a regular file, too large) is set aside
//! ([`CheckpointError::is_corrupt`]) and the record is rebuilt from the API ([`rebuild`]):
//! the kubelet does not prepare its running claims again (its own state marks them prepared),
//! so without it the devices of running claims would look free.
//!
//! A restart without `--dra` never writes the file but still reads it: its holders keep their
//! devices off the device plugin ([`crate::plan::drain`]) until DRA unprepares them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::prepare::PreparedClaim;

/// The checkpoint file's version.
pub const VERSION: u32 = 1;
/// The checkpoint file's name inside the driver's plugin directory.
pub const FILE: &str = "checkpoint.json";
/// The largest checkpoint read, bytes (a claim takes about 1 KiB).
pub const MAX_CHECKPOINT_BYTES: u64 = 32 * 1024 * 1024;

/// The prepared claims by UID.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// [`VERSION`].
    pub version: u32,
    /// Prepared claims by UID.
    pub claims: BTreeMap<String, PreparedClaim>,
    /// The MIG devices slicelet creates, created or destroys for claims (dynamic MIG), in the
    /// order their claims were prepared. Left out of the file when empty, so a checkpoint
    /// without them stays what version 1 always was (no version bump: a slicelet that knows
    /// no dynamic MIG and finds records sets the file aside as corrupt and rebuilds the claims
    /// from the API, leaving the instances alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dynamic_mig: Vec<MigRecord>,
}

/// Where a claim's dynamic MIG device is in its life. Each state is saved before the step it
/// names, so a restart anywhere finds what to finish ([`super::plugin`]'s start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MigRecordState {
    /// The create is asked for (or about to be): the instance at the placement, if any, is
    /// this claim's.
    Creating,
    /// Created: [`MigRecord::instance`] names it.
    Created,
    /// Unprepare destroys it (asked for, or about to be).
    Destroying,
}

/// The instance a [`MigRecord`] created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    /// The GPU instance id.
    pub gi_id: u32,
    /// The compute instance id.
    pub ci_id: u32,
    /// The MIG device's `MIG-…` UUID (what the claim's container gets).
    pub uuid: String,
}

/// One dynamic MIG device a claim holds: the intent, then the instance created for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigRecord {
    /// The claim it is created for.
    pub claim: super::prepare::ClaimRef,
    /// The published device name (`gpu-<i>-mig-<profile>-<start>`).
    pub device: String,
    /// The parent GPU's `GPU-…` UUID.
    pub gpu_uuid: String,
    /// The profile as NVIDIA names it.
    pub profile: String,
    /// The placement's first memory slice (a GPU instance's placement is unique on its GPU:
    /// the driver refuses overlapping ones).
    pub start: u32,
    /// The placement's size, memory slices.
    pub size: u32,
    /// Where it is in its life.
    pub state: MigRecordState,
    /// The instance, once created (or adopted at start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<MigInstance>,
}

/// Reading or writing the checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file was refused or could not be read.
    #[error(transparent)]
    Read(#[from] crate::policy::ReadError),
    /// The file does not parse as a checkpoint.
    #[error("checkpoint {}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The file is a checkpoint of another version (a newer slicelet wrote it).
    #[error("checkpoint {} is version {found}; this slicelet reads version {VERSION}", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// The version it holds.
        found: u32,
    },
    /// Writing the new file failed.
    #[error("writing checkpoint {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl CheckpointError {
    /// Whether the file is corrupt (not JSON, empty, not a regular file, too large, not
    /// UTF-8): set aside, not kept. Another version and an unreadable file are not.
    pub fn is_corrupt(&self) -> bool {
        match self {
            CheckpointError::Invalid { .. } => true,
            CheckpointError::Read(e) => !matches!(e, crate::policy::ReadError::Io { .. }),
            CheckpointError::Version { .. } | CheckpointError::Write { .. } => false,
        }
    }
}

impl Checkpoint {
    /// An empty checkpoint.
    pub fn new() -> Self {
        Checkpoint {
            version: VERSION,
            claims: BTreeMap::new(),
            dynamic_mig: Vec::new(),
        }
    }

    /// Every placement a [`MigRecord`] names, as (GPU UUID, first memory slice): the daemon
    /// plans on an inventory without the MIG devices there ([`MigRecord`]'s instance is this
    /// claim's, never a static device), whatever the record's state.
    pub fn dynamic_mig_holds(&self) -> std::collections::BTreeSet<(String, u32)> {
        self.dynamic_mig
            .iter()
            .map(|r| (r.gpu_uuid.clone(), r.start))
            .collect()
    }

    /// What every claim but `except` (a UID) holds: device name → the claim
    /// (`namespace/name`) for whole devices and replicas, and each claim's share of a
    /// consumable-capacity device.
    pub fn held(&self, except: &str) -> crate::dra::prepare::Held {
        let mut out = crate::dra::prepare::Held::default();
        for (_, c) in self.claims.iter().filter(|(uid, _)| uid.as_str() != except) {
            let holder = format!("{}/{}", c.claim.namespace, c.claim.name);
            for d in &c.devices {
                match &d.share {
                    Some(s) => out
                        .shares
                        .entry(d.device.clone())
                        .or_default()
                        .push((holder.clone(), s.clone())),
                    None => {
                        out.exclusive.insert(d.device.clone(), holder.clone());
                    }
                }
            }
        }
        for r in self.dynamic_mig.iter().filter(|r| r.claim.uid != except) {
            let holder = format!("{}/{}", r.claim.namespace, r.claim.name);
            out.exclusive.insert(r.device.clone(), holder.clone());
            out.dynamic_mig.push(crate::dra::prepare::HeldMig {
                gpu_uuid: r.gpu_uuid.clone(),
                placement: crate::inventory::MigPlacement {
                    start: r.start,
                    size: r.size,
                },
                holder,
            });
        }
        out
    }
}

/// Reads the checkpoint at `path`; a missing file is an empty checkpoint.
///
/// # Errors
/// [`CheckpointError`] naming the file.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    if !path.exists() {
        return Ok(Checkpoint::new());
    }
    let limits = crate::policy::Limits {
        max_bytes: MAX_CHECKPOINT_BYTES,
        ..crate::policy::Limits::default()
    };
    let text = crate::policy::read_bounded(path, &limits)?;
    let invalid = |message: String| CheckpointError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let c: Checkpoint = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    if c.version != VERSION {
        return Err(CheckpointError::Version {
            path: path.to_path_buf(),
            found: c.version,
        });
    }
    Ok(c)
}

/// The holders the checkpoint records: each prepared device's published name → the claims
/// holding it, as [`crate::in_use::Holder`]s `<namespace>/claim:<name>` (no container: a claim
/// is held by its pod, which the checkpoint does not name).
pub fn holders(c: &Checkpoint) -> BTreeMap<String, Vec<crate::in_use::Holder>> {
    let mut out: BTreeMap<String, Vec<crate::in_use::Holder>> = BTreeMap::new();
    for p in c.claims.values() {
        let h = crate::in_use::Holder {
            namespace: p.claim.namespace.clone(),
            pod: format!("claim:{}", p.claim.name),
            container: String::new(),
        };
        for d in &p.devices {
            let list = out.entry(d.device.clone()).or_default();
            if !list.contains(&h) {
                list.push(h.clone());
                list.sort();
            }
        }
    }
    out
}

/// The prepared claims as GPU use attribution reads them ([`crate::usage::ClaimEntry`]): each
/// claim's namespace, the pods it was reserved for when prepared, and its devices, in UID
/// order.
pub fn claim_entries(c: &Checkpoint) -> Vec<crate::usage::ClaimEntry> {
    c.claims
        .values()
        .map(|p| crate::usage::ClaimEntry {
            namespace: p.claim.namespace.clone(),
            pods: p
                .pods
                .iter()
                .map(|r| crate::usage::ClaimPod {
                    name: r.name.clone(),
                    uid: r.uid.clone(),
                })
                .collect(),
            devices: p
                .devices
                .iter()
                .map(|d| crate::usage::ClaimDevice {
                    name: d.device.clone(),
                    resource: d.resource.clone(),
                    id: d.id.clone(),
                })
                .collect(),
        })
        .collect()
}

/// The record of what is prepared, rebuilt from the API when the checkpoint cannot be used:
/// every claim in `claims` reserved for a pod whose `status.allocation.devices.results` name
/// devices of `driver` in this node's pool `node`, each such device recorded under its
/// published name, its resource and ID read from the `slices` that publish it (the node's
/// ResourceSlices; empty strings where no slice has the device any more), its share from the
/// result's `shareID` and `consumedCapacity`. Each claim is marked
/// [`PreparedClaim::rebuilt`]: it holds its devices until unprepared, and a
/// `NodePrepareResources` for it prepares it afresh. Claims whose UID is not one slicelet
/// accepts ([`crate::dra::prepare::valid_uid`]) are left out.
pub fn rebuild(
    claims: &[k8s_openapi::api::resource::v1::ResourceClaim],
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
    driver: &str,
    node: &str,
) -> Checkpoint {
    let published = published_devices(slices, driver, node);
    let mut out = Checkpoint::new();
    for c in claims {
        if let Some((uid, claim)) = rebuilt_claim(c, &published, driver, node) {
            out.claims.insert(uid, claim);
        }
    }
    out
}

/// Each device the node's `slices` of `driver` publish, by name: (its resource, its ID, the
/// GPU UUID with `::<replica>` for a replica).
fn published_devices<'s>(
    slices: &'s [k8s_openapi::api::resource::v1::ResourceSlice],
    driver: &str,
    node: &str,
) -> BTreeMap<&'s str, (String, String)> {
    let mut published: BTreeMap<&str, (String, String)> = BTreeMap::new();
    for s in slices
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.pool.name == node)
    {
        for d in s.spec.devices.iter().flatten() {
            let attr = |k: &str| d.attributes.as_ref().and_then(|a| a.get(k));
            let resource = attr("resource")
                .and_then(|a| a.string.clone())
                .unwrap_or_default();
            let uuid = attr("uuid")
                .and_then(|a| a.string.clone())
                .unwrap_or_default();
            let id = match attr("replica").and_then(|a| a.int) {
                Some(n) if !uuid.is_empty() => format!("{uuid}::{n}"),
                _ => uuid,
            };
            published.insert(d.name.as_str(), (resource, id));
        }
    }
    published
}

/// Claim `c`'s rebuilt record and its UID; `None` when it lacks a UID, namespace or name, its
/// UID is not one slicelet accepts, it is reserved for no pod or it has no device of `driver`
/// in this node's pool.
fn rebuilt_claim(
    c: &k8s_openapi::api::resource::v1::ResourceClaim,
    published: &BTreeMap<&str, (String, String)>,
    driver: &str,
    node: &str,
) -> Option<(String, PreparedClaim)> {
    use crate::dra::prepare::{self, ClaimRef, PreparedDevice};
    let (Some(uid), Some(namespace), Some(name)) = (
        c.metadata.uid.as_deref(),
        c.metadata.namespace.as_deref(),
        c.metadata.name.as_deref(),
    ) else {
        return None;
    };
    let pods = prepare::reserved_pods(c);
    if !prepare::valid_uid(uid) || pods.is_empty() {
        return None;
    }
    let results = c
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let devices: Vec<PreparedDevice> = results
        .iter()
        .filter(|r| r.driver == driver && r.pool == node)
        .map(|r| {
            let (resource, id) = published
                .get(r.device.as_str())
                .cloned()
                .unwrap_or_default();
            PreparedDevice {
                requests: vec![r.request.clone()],
                pool: r.pool.clone(),
                device: r.device.clone(),
                cdi_ids: Vec::new(),
                resource,
                id,
                share: prepare::recorded_share(r),
            }
        })
        .collect();
    if devices.is_empty() {
        return None;
    }
    let claim = PreparedClaim {
        claim: ClaimRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        },
        pods,
        devices,
        spec_file: prepare::spec_file(driver, uid),
        spec: serde_json::Value::Null,
        rebuilt: true,
    };
    Some((uid.to_string(), claim))
}

/// Writes the checkpoint to `path` atomically.
///
/// # Errors
/// [`CheckpointError::Write`] naming the file.
pub fn save(path: &Path, c: &Checkpoint) -> Result<(), CheckpointError> {
    let text = serde_json::to_vec_pretty(c).map_err(|e| CheckpointError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    crate::files::write_atomic(path, &text).map_err(|source| CheckpointError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::prepare::{ClaimRef, PreparedDevice, ReservedPod};

    fn claim(uid: &str, device: &str) -> PreparedClaim {
        PreparedClaim {
            claim: ClaimRef {
                namespace: "ns".into(),
                name: format!("c-{uid}"),
                uid: uid.into(),
            },
            pods: vec![ReservedPod {
                name: format!("pod-{uid}"),
                uid: format!("pod-uid-{uid}"),
            }],
            devices: vec![PreparedDevice {
                requests: vec!["gpu".into()],
                pool: "node".into(),
                device: device.into(),
                cdi_ids: vec![format!("gpu.slicelet.io/claim={uid}")],
                resource: "nvidia.com/gpu".into(),
                id: "GPU-x".into(),
                share: None,
            }],
            spec_file: format!("gpu.slicelet.io-claim_{uid}.json"),
            spec: serde_json::json!({"kind": "gpu.slicelet.io/claim"}),
            rebuilt: false,
        }
    }

    #[test]
    fn round_trips_and_missing_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        assert_eq!(load(&path).unwrap(), Checkpoint::new());
        let mut c = Checkpoint::new();
        c.claims.insert("u1".into(), claim("u1", "gpu-a"));
        c.claims.insert("u2".into(), claim("u2", "gpu-b"));
        save(&path, &c).unwrap();
        assert_eq!(load(&path).unwrap(), c);
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE)]);
        assert_eq!(
            c.held("u1").exclusive,
            BTreeMap::from([("gpu-b".to_string(), "ns/c-u2".to_string())])
        );
        // A share is held as a share, not exclusively; a checkpoint written before shares
        // existed (no `share` key) reads as exclusive.
        let mut shared = claim("u3", "gpu-s");
        shared.devices[0].share = Some(crate::dra::prepare::Share {
            id: "s-1".into(),
            memory_mib: 20480,
            cores: 25,
        });
        c.claims.insert("u3".into(), shared.clone());
        save(&path, &c).unwrap();
        assert_eq!(load(&path).unwrap(), c);
        let held = c.held("u1");
        assert!(!held.exclusive.contains_key("gpu-s"));
        assert_eq!(
            held.shares["gpu-s"],
            [(
                "ns/c-u3".to_string(),
                shared.devices[0].share.clone().unwrap()
            )]
        );
        let old = r#"{"version":1,"claims":{"u9":{"claim":{"namespace":"ns","name":"c","uid":"u9"},"devices":[{"requests":["gpu"],"pool":"node","device":"gpu-a","cdi_ids":[],"resource":"nvidia.com/gpu","id":"GPU-x"}],"spec_file":"f.json","spec":{}}}}"#;
        std::fs::write(&path, old).unwrap();
        let loaded = load(&path).unwrap();
        assert_eq!(loaded.held("").exclusive["gpu-a"], "ns/c");
    }

    /// A checkpoint written before claims recorded their pods (no `pods` field) still loads,
    /// each claim with no pods; the pods of one written now come back for attribution.
    #[test]
    fn a_claim_without_pods_reads_as_reserved_for_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let mut old = serde_json::to_value(Checkpoint {
            version: VERSION,
            claims: BTreeMap::from([("u1".to_string(), claim("u1", "gpu-a"))]),
            dynamic_mig: Vec::new(),
        })
        .unwrap();
        old["claims"]["u1"]
            .as_object_mut()
            .unwrap()
            .remove("pods")
            .unwrap();
        std::fs::write(&path, old.to_string()).unwrap();
        let c = load(&path).unwrap();
        assert!(c.claims["u1"].pods.is_empty());
        assert_eq!(c.claims["u1"].devices, claim("u1", "gpu-a").devices);
        let mut now = Checkpoint::new();
        now.claims.insert("u2".into(), claim("u2", "gpu-b"));
        save(&path, &now).unwrap();
        let entries = claim_entries(&load(&path).unwrap());
        assert_eq!(
            entries,
            vec![crate::usage::ClaimEntry {
                namespace: "ns".into(),
                pods: vec![crate::usage::ClaimPod {
                    name: "pod-u2".into(),
                    uid: "pod-uid-u2".into(),
                }],
                devices: vec![crate::usage::ClaimDevice {
                    name: "gpu-b".into(),
                    resource: "nvidia.com/gpu".into(),
                    id: "GPU-x".into(),
                }],
            }]
        );
    }

    #[test]
    fn bad_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        for (text, want) in [
            ("{", "EOF"),
            (r#"{"version": 2, "claims": {}}"#, "version 2"),
            (
                r#"{"version": 1, "claims": {}, "extra": 1}"#,
                "unknown field",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = load(&path).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains(FILE), "{text}: {e}");
        }
    }

    /// A checkpoint of another version (a rollback) is kept, not set aside as corrupt: the
    /// claims it records must not be forgotten; a file that does not parse is corrupt.
    #[test]
    fn another_version_is_not_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        std::fs::write(&path, r#"{"version": 99, "claims": {}}"#).unwrap();
        let e = load(&path).unwrap_err();
        assert!(
            matches!(e, CheckpointError::Version { found: 99, .. }),
            "{e}"
        );
        assert!(!e.is_corrupt());
        std::fs::write(&path, "").unwrap();
        assert!(load(&path).unwrap_err().is_corrupt());
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(load(&path).unwrap_err().is_corrupt());
    }

    /// The record rebuilt from the API: claims reserved for a pod with results of this driver
    /// in this node's pool, each device under its published name with its resource and ID
    /// from the slices; other drivers', other pools' and unreserved claims are left out.
    #[test]
    fn the_record_is_rebuilt_from_allocated_claims_and_the_slices() {
        let claim = |uid: &str, results: serde_json::Value, reserved: bool| {
            let mut v = serde_json::json!({
                "metadata": {"namespace": "ns", "name": format!("c-{uid}"), "uid": uid},
                "spec": {},
                "status": {"allocation": {"devices": {"results": results}}},
            });
            if reserved {
                v["status"]["reservedFor"] =
                    serde_json::json!([{"resource": "pods", "name": "p", "uid": "pod-1"}]);
            }
            serde_json::from_value::<k8s_openapi::api::resource::v1::ResourceClaim>(v).unwrap()
        };
        let r = |driver: &str, pool: &str, device: &str| serde_json::json!({"request": "gpu", "driver": driver, "pool": pool, "device": device});
        let claims = [
            claim(
                "u1",
                serde_json::json!([
                    r("gpu.slicelet.io", "node", "gpu-aa-r1"),
                    r("other.example.com", "node", "x"),
                    r("gpu.slicelet.io", "node-2", "gpu-bb"),
                ]),
                true,
            ),
            claim(
                "u2",
                serde_json::json!([r("gpu.slicelet.io", "node", "gpu-cc")]),
                false,
            ),
            claim(
                "u3",
                serde_json::json!([{"request": "gpu", "driver": "gpu.slicelet.io", "pool": "node",
                    "device": "gpu-dd", "shareID": "s-1",
                    "consumedCapacity": {"memory": "20Gi", "cores": "25"}}]),
                true,
            ),
        ];
        let slice: k8s_openapi::api::resource::v1::ResourceSlice =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "node-gpu-slicelet-io-0"},
                "spec": {"driver": "gpu.slicelet.io", "nodeName": "node",
                    "pool": {"name": "node", "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-aa-r1", "attributes": {
                        "resource": {"string": "nvidia.com/gpu"},
                        "uuid": {"string": "GPU-AA"},
                        "replica": {"int": 1}}}]},
            }))
            .unwrap();
        let c = rebuild(&claims, &[slice], "gpu.slicelet.io", "node");
        assert_eq!(c.claims.keys().collect::<Vec<_>>(), ["u1", "u3"]);
        let u1 = &c.claims["u1"];
        assert!(u1.rebuilt);
        assert_eq!(u1.spec_file, "gpu.slicelet.io-claim_u1.json");
        assert_eq!(u1.pods[0].uid, "pod-1");
        assert_eq!(u1.devices.len(), 1);
        assert_eq!(
            (
                u1.devices[0].device.as_str(),
                u1.devices[0].resource.as_str(),
                u1.devices[0].id.as_str()
            ),
            ("gpu-aa-r1", "nvidia.com/gpu", "GPU-AA::1")
        );
        let held = c.held("");
        assert_eq!(held.exclusive["gpu-aa-r1"], "ns/c-u1");
        assert_eq!(
            held.shares["gpu-dd"][0].1,
            crate::dra::prepare::Share {
                id: "s-1".into(),
                memory_mib: 20480,
                cores: 25
            }
        );
        // Written and read back with its mark; an entry prepared as usual has none in the file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        save(&path, &c).unwrap();
        assert_eq!(load(&path).unwrap(), c);
        let mut plain = Checkpoint::new();
        plain.claims.insert("u9".into(), claim_of("u9"));
        save(&path, &plain).unwrap();
        assert!(!std::fs::read_to_string(&path).unwrap().contains("rebuilt"));
    }

    fn claim_of(uid: &str) -> PreparedClaim {
        claim(uid, "gpu-a")
    }
}

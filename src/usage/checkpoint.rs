//! The kubelet's device checkpoint: pod UID → container → device IDs.
//!
//! The kubelet's device manager writes `kubelet_internal_checkpoint` in the device-plugin
//! directory (`/var/lib/kubelet/device-plugins/`) after each allocation. It is an internal
//! format (Kubernetes `pkg/kubelet/cm/devicemanager/checkpoint`), JSON:
//!
//! ```json
//! {"Data": {"PodDeviceEntries": [{"PodUID": "…", "ContainerName": "cuda",
//!                                 "ResourceName": "nvidia.com/gpu",
//!                                 "DeviceIDs": {"0": ["GPU-…::0"], "1": ["GPU-…::5"]},
//!                                 "AllocResp": "<base64 ContainerAllocateResponse>"}],
//!           "RegisteredDevices": {"nvidia.com/gpu": ["GPU-…::0", "…"]}},
//!  "Checksum": 1234567890}
//! ```
//!
//! `DeviceIDs` is keyed by NUMA node since Kubernetes 1.20; older kubelets wrote a plain list,
//! which is accepted too. Unknown fields are ignored (`BootID` of newer kubelets, anything to
//! come); `PodDeviceEntries: null` (Go's empty slice) is no entries. The checksum is not
//! verified: it is a hash of Go's in-memory layout, and a wrong one only means the kubelet
//! itself will distrust the file. Anything else this parser does not understand (no `Data`,
//! an entry without `PodUID`, a device ID that is not a string) is a [`CheckpointError`],
//! which the sampler turns into [`crate::usage::Samples::checkpoint_error`]: metrics then
//! degrade to GPU level, nothing fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::CheckpointEntry;

/// Largest checkpoint [`read`] accepts: 4 MiB (one entry is about 200 bytes plus its
/// base64 `AllocResp`; a node with 500 containers writes well under 1 MiB).
pub const MAX_BYTES: u64 = 4 * 1024 * 1024;

/// The checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file is missing, unreadable, or refused (not a regular file, over [`MAX_BYTES`],
    /// not UTF-8).
    #[error("reading the kubelet's device checkpoint {}", path.display())]
    Read {
        /// The checkpoint file.
        path: PathBuf,
        /// Why.
        #[source]
        source: crate::policy::ReadError,
    },
    /// The file is not JSON of the shape described in the module documentation.
    #[error("parsing the kubelet's device checkpoint {}: {at}", path.display())]
    Parse {
        /// The checkpoint file.
        path: PathBuf,
        /// Where in the document (`Data.PodDeviceEntries[2].DeviceIDs`).
        at: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON has a shape this parser does not know (an array where an object belongs).
    #[error("parsing the kubelet's device checkpoint {}: {at}: {message}", path.display())]
    Shape {
        /// The checkpoint file.
        path: PathBuf,
        /// Where in the document.
        at: String,
        /// What is wrong.
        message: String,
    },
}

/// Checks that the document, its `Data` and each of its `PodDeviceEntries` are JSON objects:
/// `Err((where, what))` otherwise.
fn objects_only(v: &serde_json::Value) -> Result<(), (String, String)> {
    let object = |v: &serde_json::Value, at: &str| {
        if v.is_object() {
            Ok(())
        } else {
            Err((
                at.to_string(),
                format!("expected an object, found {v}")
                    .chars()
                    .take(120)
                    .collect(),
            ))
        }
    };
    object(v, ".")?;
    let Some(data) = v.get("Data") else {
        return Ok(()); // the typed pass names the missing field
    };
    object(data, "Data")?;
    if let Some(serde_json::Value::Array(entries)) = data.get("PodDeviceEntries") {
        for (i, e) in entries.iter().enumerate() {
            object(e, &format!("Data.PodDeviceEntries[{i}]"))?;
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<Entry>>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    #[serde(rename = "DeviceIDs", default)]
    device_ids: Option<DeviceIds>,
}

/// `DeviceIDs`: per NUMA node (Kubernetes ≥ 1.20) or a plain list (older).
#[derive(Deserialize)]
#[serde(untagged)]
enum DeviceIds {
    PerNuma(BTreeMap<String, Option<Vec<String>>>),
    List(Vec<String>),
}

/// Reads and [`parse`]s the checkpoint at `path` (at most [`MAX_BYTES`], a regular file; see
/// [`crate::policy::read_bounded`]).
///
/// # Errors
/// [`CheckpointError`] naming the file.
pub fn read(path: &Path) -> Result<Vec<CheckpointEntry>, CheckpointError> {
    let limits = crate::policy::Limits {
        max_bytes: MAX_BYTES,
        ..crate::policy::Limits::default()
    };
    let text =
        crate::policy::read_bounded(path, &limits).map_err(|source| CheckpointError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    parse(path, &text)
}

/// Parses a checkpoint's text into one [`CheckpointEntry`] per (pod, container, resource), in
/// file order, each with its device IDs deduplicated and sorted. `path` is only used in
/// errors.
///
/// # Errors
/// [`CheckpointError::Parse`] with the place in the document.
pub fn parse(path: &Path, text: &str) -> Result<Vec<CheckpointEntry>, CheckpointError> {
    let parse_err = |at: String, source| CheckpointError::Parse {
        path: path.to_path_buf(),
        at,
        source,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| parse_err(".".to_string(), e))?;
    // serde's derived structs also accept arrays (fields by position): a shape this parser
    // does not understand, refused before the typed pass.
    objects_only(&value).map_err(|(at, message)| CheckpointError::Shape {
        path: path.to_path_buf(),
        at,
        message,
    })?;
    let file: File = serde_path_to_error::deserialize(value)
        .map_err(|e| parse_err(e.path().to_string(), e.into_inner()))?;
    Ok(file
        .data
        .entries
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let mut ids: Vec<String> = match e.device_ids {
                None => Vec::new(),
                Some(DeviceIds::List(l)) => l,
                Some(DeviceIds::PerNuma(m)) => m.into_values().flatten().flatten().collect(),
            };
            ids.sort();
            ids.dedup();
            CheckpointEntry {
                pod_uid: e.pod_uid,
                container: e.container,
                resource: e.resource,
                device_ids: ids,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pod: &str, container: &str, ids: &[&str]) -> CheckpointEntry {
        CheckpointEntry {
            pod_uid: pod.into(),
            container: container.into(),
            resource: "nvidia.com/gpu".into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// A checkpoint as a kubelet 1.32 writes it (one line; shortened AllocResp).
    const CURRENT: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"0f5a3b2c-1d4e-4f60-8a7b-9c0d1e2f3a4b","ContainerName":"cuda","ResourceName":"nvidia.com/gpu","DeviceIDs":{"1":["GPU-b::1"],"0":["GPU-a::3","GPU-a::0","GPU-a::3"]},"AllocResp":"CiQKFk5WSURJQV9WSVNJQkxFX0RFVklDRVM="},{"PodUID":"11111111-2222-3333-4444-555555555555","ContainerName":"init","ResourceName":"nvidia.com/gpu.shared","DeviceIDs":{"-1":["GPU-c::2"]},"AllocResp":""}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-a::0","GPU-a::3","GPU-b::1"]}},"Checksum":3854436589,"BootID":"9f1e"}"#;

    #[test]
    fn current_and_old_formats() {
        let cases: Vec<(&str, Result<Vec<CheckpointEntry>, &str>)> = vec![
            (
                CURRENT,
                Ok(vec![
                    entry(
                        "0f5a3b2c-1d4e-4f60-8a7b-9c0d1e2f3a4b",
                        "cuda",
                        &["GPU-a::0", "GPU-a::3", "GPU-b::1"],
                    ),
                    CheckpointEntry {
                        resource: "nvidia.com/gpu.shared".into(),
                        ..entry(
                            "11111111-2222-3333-4444-555555555555",
                            "init",
                            &["GPU-c::2"],
                        )
                    },
                ]),
            ),
            // Before Kubernetes 1.20: a plain list.
            (
                r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":["b","a","b"],"AllocResp":"AA=="}],"RegisteredDevices":{}},"Checksum":1}"#,
                Ok(vec![entry("p", "c", &["a", "b"])]),
            ),
            // Go's nil slices and maps.
            (
                r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0}"#,
                Ok(vec![]),
            ),
            (
                r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":{"0":null},"AllocResp":null}]},"Checksum":0}"#,
                Ok(vec![CheckpointEntry {
                    resource: "r".into(),
                    ..entry("p", "c", &[])
                }]),
            ),
            ("{}", Err("Data")),
            (r#"{"Data":[]}"#, Err("Data: expected an object, found []")),
            (
                r#"{"Data":{"PodDeviceEntries":[["p","c","r"]]}}"#,
                Err("Data.PodDeviceEntries[0]: expected an object"),
            ),
            ("[]", Err(".: expected an object")),
            (
                r#"{"Data":{"PodDeviceEntries":[{"ContainerName":"c","ResourceName":"r"}]}}"#,
                Err("Data.PodDeviceEntries[0]: missing field `PodUID`"),
            ),
            (
                r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":{"0":[1]}}]}}"#,
                Err("Data.PodDeviceEntries[0].DeviceIDs"),
            ),
            (
                r#"{"Data":{"PodDeviceEntries":[]}} {"more":1}"#,
                Err("trailing characters"),
            ),
            ("not json", Err("expected")),
            ("", Err("EOF")),
        ];
        for (text, want) in cases {
            let got = parse(Path::new("cp"), text);
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(e), Err(msg)) => {
                    let e = crate::errors::chain(&e);
                    assert!(e.contains(msg), "{text}: {e}");
                }
                (got, want) => panic!("{text}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn read_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubelet_internal_checkpoint");
        std::fs::write(&p, CURRENT).unwrap();
        assert_eq!(read(&p).unwrap().len(), 2);
        let e = crate::errors::chain(&read(&dir.path().join("none")).unwrap_err());
        assert!(e.contains("reading the kubelet's device checkpoint"), "{e}");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_BYTES + 1).unwrap();
        let e = crate::errors::chain(&read(&p).unwrap_err());
        assert!(e.contains("larger than 4194304"), "{e}");
    }
}

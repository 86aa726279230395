//! What a GPU node holds on disk about its pods, written the way the kubelet and the container
//! runtime write it, for the tests, the demo and the benchmark (one copy for all three): the
//! kubelet's device checkpoint (`kubelet_internal_checkpoint` in the device-plugin directory)
//! and a process's `/proc/<pid>/cgroup` under a fake proc root.

use std::path::Path;

/// One checkpoint entry: a container's devices of one resource.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// The pod's UID (dashes, as in `metadata.uid`).
    pub pod_uid: &'a str,
    /// The container's name.
    pub container: &'a str,
    /// The extended resource.
    pub resource: &'a str,
    /// The device IDs it was given.
    pub device_ids: &'a [String],
}

/// Writes the kubelet's device checkpoint to `path` in the current kubelet's format (device
/// IDs keyed by NUMA node, `-1` when there is none; an empty `AllocResp`).
///
/// # Errors
/// I/O errors writing the file.
pub fn write_checkpoint(path: &Path, entries: &[Entry<'_>]) -> std::io::Result<()> {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "PodUID": e.pod_uid,
                "ContainerName": e.container,
                "ResourceName": e.resource,
                "DeviceIDs": {"-1": e.device_ids},
                "AllocResp": "",
            })
        })
        .collect();
    let doc = serde_json::json!({
        "Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}},
        "Checksum": 1,
    });
    std::fs::write(path, doc.to_string())
}

/// The kubelet's cgroup driver, which decides how a pod's cgroup is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid, - as _>.slice/cri-containerd-<id>.scope`.
    Systemd,
    /// `/kubepods/<qos>/pod<uid>/<id>`.
    Cgroupfs,
}

/// Writes `<proc_root>/proc/<pid>/cgroup` (cgroup v2) for container `container_id` (64 hex
/// digits) of pod `uid` in QoS class `qos` (`burstable`, `besteffort`; `None`: Guaranteed,
/// which has no QoS level), as containerd under `driver` places it.
///
/// # Errors
/// I/O errors creating the directory or writing the file.
pub fn write_cgroup(
    proc_root: &Path,
    pid: u32,
    driver: Driver,
    qos: Option<&str>,
    uid: &str,
    container_id: &str,
) -> std::io::Result<()> {
    let path = match (driver, qos) {
        (Driver::Systemd, Some(q)) => format!(
            "/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{}.slice/cri-containerd-{container_id}.scope",
            uid.replace('-', "_")
        ),
        (Driver::Systemd, None) => format!(
            "/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{container_id}.scope",
            uid.replace('-', "_")
        ),
        (Driver::Cgroupfs, Some(q)) => format!("/kubepods/{q}/pod{uid}/{container_id}"),
        (Driver::Cgroupfs, None) => format!("/kubepods/pod{uid}/{container_id}"),
    };
    let dir = proc_root.join(format!("proc/{pid}"));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("cgroup"), format!("0::{path}\n"))
}

//! Host PID → pod: the pod UID and container ID a process's cgroup names.
//!
//! NVML reports host PIDs. The kubelet puts every container in a cgroup below `kubepods`, named
//! after the pod's UID, and the container runtime names the container's own cgroup after its
//! ID, so `/proc/<pid>/cgroup` says which pod (and container) a process belongs to. The shapes,
//! by kubelet cgroup driver (`--cgroup-driver`) and runtime:
//!
//! ```text
//! systemd   /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, - as _>.slice/cri-containerd-<id>.scope
//!           /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/crio-<id>.scope
//!           /kubepods.slice/kubepods-pod<uid>.slice/cri-containerd-<id>.scope     (Guaranteed: no QoS level)
//! cgroupfs  /kubepods/burstable/pod<uid>/<id>
//!           /kubepods/besteffort/pod<uid>/crio-<id>
//!           /kubepods/pod<uid>/<id>                                               (Guaranteed)
//! ```
//!
//! `<id>` is the runtime's 64-hex-digit container ID. The systemd driver escapes the UID's `-`
//! as `_` (systemd unit names reserve `-` for the slice hierarchy); the cgroupfs driver keeps
//! the dashes. Pod cgroups may sit below a prefix (kind's `/kubelet.slice/kubelet-kubepods.slice`,
//! a `--cgroup-root`, which systemd also prefixes to the pod slice's name:
//! `kubelet-kubepods-besteffort-pod<uid>.slice`), so the pod component is searched for below
//! the first component that contains `kubepods`.
//!
//! Content is parsed line by line, `hierarchy-ID:controllers:path` (cgroup v1 lines
//! `4:memory:/…`, the v2 line `0::/…`); the first line naming a pod wins (on one host every
//! hierarchy names the same pod). A UID must have the form of a Kubernetes UID: 36 characters,
//! `8-4-4-4-12` hex digits after `_` is turned back into `-`. Static pods, whose UID is a
//! 32-digit hash without dashes, are not recognised (their processes count at GPU level only).
//!
//! [`parse`] is pure; [`read`] reads `<proc root>/proc/<pid>/cgroup`, at most [`MAX_BYTES`].

use std::path::{Path, PathBuf};

/// Largest `/proc/<pid>/cgroup` [`read`] accepts: 64 KiB (a real one is a few hundred bytes;
/// cgroup v1 with every controller stays under 2 KiB).
pub const MAX_BYTES: u64 = 64 * 1024;

/// The pod (and container) a process's cgroup names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    /// The pod's UID with dashes, as in `metadata.uid` (lower case).
    pub pod_uid: String,
    /// The runtime's container ID (64 lower-case hex digits), when the process sits in a
    /// container's cgroup (`cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`,
    /// or the bare `<id>` of the cgroupfs driver); `None` in the pod's own cgroup or an
    /// unknown runtime's.
    pub container_id: Option<String>,
}

/// Reading a process's cgroup file failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The file could not be read, or was refused (not a regular file, over [`MAX_BYTES`],
    /// not UTF-8). A process that exited meanwhile is an I/O error `NotFound`.
    #[error("reading the cgroup of PID {pid}")]
    Read {
        /// The PID.
        pid: u32,
        /// Why.
        #[source]
        source: crate::policy::ReadError,
    },
}

impl CgroupError {
    /// Whether the process (or its /proc entry) is gone: the common, harmless case between
    /// NVML listing a PID and reading its cgroup.
    pub fn is_not_found(&self) -> bool {
        match self {
            CgroupError::Read { source, .. } => source.is_not_found(),
        }
    }
}

/// `<proc_root>/proc/<pid>/cgroup`.
pub fn path(proc_root: &Path, pid: u32) -> PathBuf {
    proc_root.join("proc").join(pid.to_string()).join("cgroup")
}

/// What one `/proc/<pid>/cgroup` says: the pod ([`parse`]) and the cgroup v2 path
/// ([`unified_path`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcCgroup {
    /// The pod and container, when the process is in a pod.
    pub pod: Option<PodCgroup>,
    /// The `0::` line's path (`/kubepods.slice/…/cri-containerd-<id>.scope`), when present.
    pub unified: Option<String>,
}

/// Reads `<proc_root>/proc/<pid>/cgroup` (at most [`MAX_BYTES`], a regular file, opened
/// non-blocking: see [`crate::policy::read_bounded`]), then [`parse`]s it and takes its
/// [`unified_path`].
///
/// # Errors
/// [`CgroupError::Read`] when the file is missing, unreadable or refused.
pub fn read(proc_root: &Path, pid: u32) -> Result<ProcCgroup, CgroupError> {
    let limits = crate::policy::Limits {
        max_bytes: MAX_BYTES,
        // Nothing in a cgroup file nests; the defaults of the policy reader are ample.
        ..crate::policy::Limits::default()
    };
    let text = crate::policy::read_bounded(&path(proc_root, pid), &limits)
        .map_err(|source| CgroupError::Read { pid, source })?;
    Ok(ProcCgroup {
        pod: parse(&text),
        unified: unified_path(&text).map(str::to_string),
    })
}

/// The path of the cgroup v2 line (`0::<path>`): the directory below the unified hierarchy's
/// mount that the driver's per-cgroup memory limits are keyed by. `None` without such a line
/// (a host on cgroup v1 only), or for a path that is not absolute or has a `..` component.
pub fn unified_path(content: &str) -> Option<&str> {
    let path = content.lines().find_map(|l| l.strip_prefix("0::"))?;
    let ok = path.starts_with('/') && !path.split('/').any(|c| c == "..");
    ok.then_some(path)
}

/// The pod a `/proc/<pid>/cgroup` content names, or `None` for a process of no pod (a system
/// service, a shell on the host, a line this parser does not know).
pub fn parse(content: &str) -> Option<PodCgroup> {
    content.lines().find_map(|line| {
        // `hierarchy-ID:controllers:path`; the path may itself contain `:`.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        parse_path(path)
    })
}

/// The pod a cgroup path (`/kubepods.slice/…`) names.
fn parse_path(path: &str) -> Option<PodCgroup> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let first_kubepods = parts.iter().position(|p| p.contains("kubepods"))?;
    for (i, part) in parts.iter().enumerate().skip(first_kubepods) {
        let Some(pod_uid) = pod_uid(part) else {
            continue;
        };
        let container_id = parts.get(i + 1).and_then(|c| container_id(c));
        return Some(PodCgroup {
            pod_uid,
            container_id,
        });
    }
    None
}

/// The pod UID of a pod cgroup component: systemd `kubepods[-<qos>]-pod<uid with _>.slice`, or
/// cgroupfs `pod<uid>`.
fn pod_uid(part: &str) -> Option<String> {
    if let Some(unit) = part.strip_suffix(".slice") {
        // Below a `--cgroup-root` (kind: `/kubelet`) systemd prefixes the parent slices'
        // names: `kubelet-kubepods-besteffort-pod<uid>.slice`.
        let at = unit.find("kubepods-")?;
        if at > 0 && !unit[..at].ends_with('-') {
            return None;
        }
        let rest = &unit[at + "kubepods-".len()..];
        let rest = rest
            .strip_prefix("burstable-")
            .or_else(|| rest.strip_prefix("besteffort-"))
            .unwrap_or(rest);
        let escaped = rest.strip_prefix("pod")?;
        // The systemd driver escapes every `-` of the UID; a dash here is not a pod unit.
        if escaped.contains('-') {
            return None;
        }
        return valid_uid(&escaped.replace('_', "-"));
    }
    let uid = part.strip_prefix("pod")?;
    valid_uid(uid)
}

/// `uid` when it has the form of a Kubernetes UID (`8-4-4-4-12` hex digits), lower-cased.
fn valid_uid(uid: &str) -> Option<String> {
    let groups: Vec<&str> = uid.split('-').collect();
    let lengths = [8, 4, 4, 4, 12];
    let ok = uid.len() == 36
        && groups.len() == lengths.len()
        && groups
            .iter()
            .zip(lengths)
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| uid.to_ascii_lowercase())
}

/// The container ID of a container cgroup component: `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `docker-<id>.scope`, `crio-<id>` or the bare `<id>` (64 hex digits).
fn container_id(part: &str) -> Option<String> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    let id = ["cri-containerd-", "crio-", "docker-"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f5a3b2c-1d4e-4f60-8a7b-9c0d1e2f3a4b";
    const UID_: &str = "0f5a3b2c_1d4e_4f60_8a7b_9c0d1e2f3a4b";
    const ID: &str = "4f9c2a7e5b1d3c8f0a6e2b9d7c4f1a3e5b8d0c2f6a9e1b4d7c3f5a8e0b2d6c9f";

    #[test]
    fn the_unified_path_is_the_v2_line() {
        let v2 = "/kubepods.slice/kubepods-pod0f5a3b2c_1d4e_4f60_8a7b_9c0d1e2f3a4b.slice/cri-containerd-x.scope";
        let hybrid = format!("12:memory:/kubepods/x\n1:name=systemd:/y\n0::{v2}\n");
        assert_eq!(unified_path(&hybrid), Some(v2));
        assert_eq!(unified_path(&format!("0::{v2}")), Some(v2));
        assert_eq!(unified_path("12:memory:/kubepods/x\n"), None);
        assert_eq!(unified_path("10::/not-v2\n"), None);
        assert_eq!(unified_path("0::relative\n"), None);
        assert_eq!(unified_path("0::/kubepods/../../etc\n"), None);
    }

    fn pod(container: Option<&str>) -> Option<PodCgroup> {
        Some(PodCgroup {
            pod_uid: UID.to_string(),
            container_id: container.map(str::to_string),
        })
    }

    #[test]
    fn every_driver_runtime_and_qos_class() {
        let cases: Vec<(String, Option<PodCgroup>)> = vec![
            // systemd driver, cgroup v2, containerd, Burstable.
            (
                format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope\n"),
                pod(Some(ID)),
            ),
            // systemd driver, CRI-O, BestEffort.
            (
                format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope\n"),
                pod(Some(ID)),
            ),
            // systemd driver, Guaranteed: no QoS level.
            (
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope\n"),
                pod(Some(ID)),
            ),
            // cgroupfs driver, containerd, Burstable and Guaranteed.
            (
                format!("0::/kubepods/burstable/pod{UID}/{ID}\n"),
                pod(Some(ID)),
            ),
            (format!("0::/kubepods/pod{UID}/{ID}\n"), pod(Some(ID))),
            // cgroupfs driver, CRI-O, BestEffort.
            (
                format!("0::/kubepods/besteffort/pod{UID}/crio-{ID}\n"),
                pod(Some(ID)),
            ),
            // cgroup v1: many hierarchies, the same pod; the first naming one wins.
            (
                format!(
                    "12:pids:/kubepods/burstable/pod{UID}/{ID}\n11:memory:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
                ),
                pod(Some(ID)),
            ),
            (
                format!("3:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{ID}.scope\n"),
                pod(Some(ID)),
            ),
            // kind (`--cgroup-root=/kubelet`): systemd prefixes the parent slices' names.
            (
                format!("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope\n"),
                pod(Some(ID)),
            ),
            (
                format!("0::/kubepods.slice/xkubepods-pod{UID_}.slice/cri-containerd-{ID}.scope\n"),
                None,
            ),
            // The pod's own cgroup (no container), an unknown runtime's scope.
            (format!("0::/kubepods/pod{UID}\n"), pod(None)),
            (
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope\n"),
                pod(None),
            ),
            // Upper-case hex is normalised.
            (
                format!("0::/kubepods/pod{}/{}\n", UID.to_uppercase(), ID.to_uppercase()),
                pod(Some(ID)),
            ),
            // Not pods.
            ("0::/system.slice/containerd.service\n".into(), None),
            ("0::/user.slice/user-0.slice/session-3.scope\n".into(), None),
            ("0::/\n".into(), None),
            ("".into(), None),
            (format!("0::/pod{UID}/{ID}\n"), None), // no kubepods ancestor
            // Malformed UIDs and lines.
            (format!("0::/kubepods/pod{UID_}/{ID}\n"), None), // cgroupfs keeps dashes
            (format!("0::/kubepods.slice/kubepods-pod{UID}.slice\n"), None), // systemd escapes them
            ("0::/kubepods/pod0f5a3b2c-1d4e-4f60-8a7b-9c0d1e2f3a4/x\n".into(), None),
            ("0::/kubepods/podzf5a3b2c-1d4e-4f60-8a7b-9c0d1e2f3a4b/x\n".into(), None),
            ("0::/kubepods/pod0f5a3b2c1d4e-4f60-8a7b-9c0d1e2f3a4b-/x\n".into(), None),
            (format!("x::/kubepods/pod{UID}/{ID}\n"), None),
            (format!("/kubepods/pod{UID}/{ID}\n"), None),
            // A short container ID is no container ID.
            (format!("0::/kubepods/pod{UID}/abc123\n"), pod(None)),
        ];
        for (content, want) in cases {
            assert_eq!(parse(&content), want, "{content}");
        }
    }

    #[test]
    fn read_is_bounded_and_reports_missing_processes() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), 42);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("0::/kubepods/pod{UID}/{ID}\n")).unwrap();
        assert_eq!(
            read(dir.path(), 42).unwrap(),
            ProcCgroup {
                pod: pod(Some(ID)),
                unified: Some(format!("/kubepods/pod{UID}/{ID}")),
            }
        );
        let gone = read(dir.path(), 43).unwrap_err();
        assert!(gone.is_not_found(), "{gone}");
        std::fs::write(&p, "0::/".to_string() + &"a/".repeat(40_000)).unwrap();
        let big = read(dir.path(), 42).unwrap_err();
        assert!(!big.is_not_found());
        assert!(
            crate::errors::chain(&big).contains("larger than 65536"),
            "{}",
            crate::errors::chain(&big)
        );
    }
}
